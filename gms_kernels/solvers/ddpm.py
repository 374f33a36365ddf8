"""DDPM (Ho et al. 2020) with a fixed variance: ``ddpm`` (beta~, "fixed small") and ``ddpm-large`` (beta_{t|s},
"fixed large"), the baselines of the GMS paper's tables (https://arxiv.org/abs/2311.00941)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch

from ..core.moments import DataRange, transition_moments
from ..core.schedule import StepCoefficients
from ..kernels import MODE_FIXED, FusedStepConfig
from .base import LastStepOptions, Solver, StepRandomness, gaussian, real, register


@dataclass(frozen=True)
class DDPMOptions(LastStepOptions):
    """``variance_interp`` v in [0, 1] interpolates the variance in log space from beta~ = lam2 towards beta_{t|s}:
    lam2^(1 - v) beta_{t|s}^v, Improved DDPM's Eq. 15 (Nichol & Dhariwal 2021) with a constant v instead of a
    learned one (v = 1 is ``ddpm-large``)."""

    variance_interp: float = 0.0
    torch_only: ClassVar[Mapping[str, Any]] = {"variance_interp": 0.0}

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("variance_interp", real(self.variance_interp, "variance_interp", 0.0, 1.0,
                                          "the log-space weight of beta_{t|s} in DDPM's variance"))


class DDPM(Solver):
    """x_s ~ N(M1, beta~) with M1 the posterior mean from e1."""

    name, heads, Options = "ddpm", 1, DDPMOptions
    label, in_paper = "DDPM, β̃_t", True

    def variance(self, k: StepCoefficients, o: DDPMOptions) -> float:
        v = o.variance_interp
        return k.lam2 if v == 0.0 else k.lam2 ** (1.0 - v) * k.beta_ts**v

    def step(self, x_t: torch.Tensor, heads: list[torch.Tensor], k: StepCoefficients, rand: StepRandomness,
             o: DDPMOptions, data_range: DataRange, T: int) -> tuple[torch.Tensor, dict]:
        m1 = transition_moments(x_t, heads[0], None, None, k, data_range).m1
        var = self.variance(k, o)
        return gaussian(m1, var, rand), {"m1": m1, "var": var}

    def fused_config(self, k, data_range, o, T, batch, per_sample, scalars) -> FusedStepConfig:
        return FusedStepConfig(mode=MODE_FIXED, fixed_var=max(self.variance(k, o), 0.0), **scalars)


@dataclass(frozen=True)
class DDPMLargeOptions(LastStepOptions):
    pass


class DDPMLarge(DDPM):
    """x_s ~ N(M1, beta_{t|s})."""

    name, Options = "ddpm-large", DDPMLargeOptions
    label = "DDPM, β_t"

    def variance(self, k: StepCoefficients, o: DDPMLargeOptions) -> float:
        return k.beta_ts

    def step(self, x_t, heads, k, rand, o, data_range, T):
        m1 = transition_moments(x_t, heads[0], None, None, k, data_range).m1
        return gaussian(m1, k.beta_ts, rand), {"m1": m1}


register(DDPM())
register(DDPMLarge())
