"""DDIM (Song et al. 2021, Eq. 12): a_s x0 + sqrt(sigma_s^2 - eta^2 lam2) eps + eta sqrt(lam2) z, with x0 the clamped
E[x0|x_t] and eps the noise it implies."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core.moments import DataRange, clamped_x0_mean
from ..core.schedule import StepCoefficients
from ..kernels import MODE_DDIM, FusedStepConfig
from .base import LastStepOptions, Solver, StepRandomness, real, register


@dataclass(frozen=True)
class DDIMOptions(LastStepOptions):
    """``eta`` in [0, 1]: 0 is deterministic, 1 has DDPM's posterior variance."""

    eta: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("eta", real(self.eta, "eta", 0.0, 1.0, "DDIM's eta"))


def ddim_scales(k: StepCoefficients, eta: float) -> tuple[float, float]:
    """DDIM's (eps scale sqrt(sigma_s^2 - eta^2 lam2), noise variance eta^2 lam2)."""
    eta2_lam2 = eta**2 * k.lam2
    return math.sqrt(max(k.sigma_s**2 - eta2_lam2, 0.0)), eta2_lam2


class DDIM(Solver):
    name, heads, Options = "ddim", 1, DDIMOptions

    def step(self, x_t: torch.Tensor, heads: list[torch.Tensor], k: StepCoefficients, rand: StepRandomness,
             o: DDIMOptions, data_range: DataRange, T: int) -> tuple[torch.Tensor, dict]:
        x0 = clamped_x0_mean(x_t, heads[0], k.a_t, k.sigma_t, data_range)
        eps = (x_t - k.a_t * x0) / k.sigma_t
        eps_scale, eta2_lam2 = ddim_scales(k, o.eta)
        x_s = k.a_s * x0 + eps_scale * eps
        if eta2_lam2 > 0:
            x_s = x_s + math.sqrt(eta2_lam2) * rand.normal()
        return x_s, {"x0": x0}

    def fused_config(self, k, data_range, o, T, batch, per_sample, scalars) -> FusedStepConfig:
        eps_scale, noise_var = ddim_scales(k, o.eta)
        scalars = dict(scalars, c1=0.0, c2=1.0, lam2=0.0)  # (M1 = E[x0|x_t]: the moments of t -> data)
        return FusedStepConfig(mode=MODE_DDIM, fixed_var=noise_var, ddim_a_s=k.a_s, ddim_eps_scale=eps_scale, **scalars)


register(DDIM())
