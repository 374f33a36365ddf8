"""SN-DDPM (Bao et al. 2022): the Gaussian N(M1, Var) with M1 and the diagonal Var from the e1 and e2 heads, Eqs. (26)
and (27) of the GMS paper (https://arxiv.org/abs/2311.00941), its Gaussian baseline."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch

from ..core.moments import (DataRange, TransitionMoments, check_moments, last_step_variance_cap, scale_spread,
                            transition_moments)
from ..core.schedule import StepCoefficients
from ..kernels import MODE_GAUSSIAN, FusedStepConfig
from .base import LastStepOptions, Solver, StepRandomness, learned_gaussian, real, register


@dataclass(frozen=True)
class SNDDPMOptions(LastStepOptions):
    """``variance_scale`` c samples N(M1, c Var) instead (a variance-scaled control). ``moments``: the form of the
    moments of x_0 bounded by the data range (:data:`~gms_kernels.core.moments.MOMENT_FORMS`; "clamped", the
    official code's clamps, or "feasible")."""

    variance_scale: float = 1.0
    moments: str = "clamped"
    torch_only: ClassVar[Mapping[str, Any]] = {"variance_scale": 1.0, "moments": "clamped"}

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("variance_scale", real(self.variance_scale, "variance_scale", 0.0, 100.0, "the factor on Var",
                                         open_low=True))
        check_moments(self.moments)


def sn_ddpm_from_moments(mom: TransitionMoments, k: StepCoefficients, rand: StepRandomness, o: SNDDPMOptions,
                         data_range: DataRange) -> tuple[torch.Tensor, dict]:
    """The SN-DDPM step from the transition moments as :func:`~gms_kernels.core.moments.transition_moments` forms
    them (a caller may change them first)."""
    return learned_gaussian(scale_spread(mom, o.variance_scale), k, rand, o, data_range)


class SNDDPM(Solver):
    name, heads, Options = "sn-ddpm", 2, SNDDPMOptions
    label, in_paper = "SN-DDPM", True

    def step(self, x_t: torch.Tensor, heads: list[torch.Tensor], k: StepCoefficients, rand: StepRandomness,
             o: SNDDPMOptions, data_range: DataRange, T: int) -> tuple[torch.Tensor, dict]:
        return sn_ddpm_from_moments(transition_moments(x_t, heads[0], heads[1], None, k, data_range,
                                                       moments=o.moments), k, rand, o, data_range)

    def fused_config(self, k, data_range, o, T, batch, per_sample, scalars) -> FusedStepConfig:
        return gaussian_config(k, data_range, o, scalars)


def gaussian_config(k: StepCoefficients, data_range: DataRange, o: LastStepOptions, scalars: dict) -> FusedStepConfig:
    """The fused config of N(M1, Var) from e1 and e2, Var capped on the step into s = 0 (SN-DDPM's step, GMS's last)."""
    cap = last_step_variance_cap(data_range, o.clip_pixel, o.pixel_levels) if k.s == 0 else None
    return FusedStepConfig(mode=MODE_GAUSSIAN, var_cap=math.inf if cap is None else cap, **scalars)


register(SNDDPM())
