"""Analytic-DPM (Bao et al. 2022): the Gaussian step with an isotropic Var[x0|x_t] = sigma_t^2 / a_t^2 (1 - Gamma_t),
Gamma_t = E ||eps_theta(x_t, t)||^2 / d estimated on data (:func:`gms_kernels.sampling.estimate_gamma`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..core.devices import as_tensor_on
from ..core.moments import DataRange, last_step_variance_cap, transition_moments
from ..core.schedule import StepCoefficients
from ..kernels import MODE_FIXED, FusedStepConfig
from .base import LastStepOptions, Solver, StepRandomness, learned_gaussian, register


def check_gamma(gamma: Any, T: int | None = None) -> None:
    """``gamma``: a 1-D table of Gamma_t, one real number per time index (NaN where not estimated),
    as :func:`gms_kernels.sampling.estimate_gamma` returns it; ``T`` (if known) is the length it must have."""
    fix = "estimate it with gk.estimate_gamma(model, x0, schedule)"
    try:
        table = as_tensor_on(gamma)
    except (TypeError, ValueError, RuntimeError):
        table = None
    if table is None or table.dim() != 1 or table.is_complex() or table.dtype == torch.bool:
        got = f"shape {tuple(table.shape)} {table.dtype}" if table is not None else f"{type(gamma).__name__} {gamma!r:.40}"
        raise ValueError(f"gamma must be a 1-D table of real numbers, one per time index (T entries), got {got}: {fix}")
    if T is not None and table.numel() != T:
        raise ValueError(f"gamma has {table.numel()} entries but the schedule has T = {T} time indices: {fix} "
                         "on this schedule")


@dataclass(frozen=True)
class AnalyticDPMOptions(LastStepOptions):
    """``gamma``: the table of Gamma_t (required; None until given)."""

    gamma: Any = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gamma is not None:
            check_gamma(self.gamma)

    def check_schedule(self, T: int) -> None:
        if self.gamma is not None:
            check_gamma(self.gamma, T)


def analytic_x0_variance(o: AnalyticDPMOptions, k: StepCoefficients) -> float:
    """Var[x0|x_t] = sigma_t^2/a_t^2 (1 - Gamma_t), Gamma from the ``gamma`` table."""
    if o.gamma is None:
        raise ValueError("solver 'analytic-dpm' needs gamma=<table>: estimate it with "
                         "gk.estimate_gamma(model, x0, schedule, timesteps)")
    g = float(as_tensor_on(o.gamma, torch.float64)[k.t])
    if not math.isfinite(g):
        raise ValueError(f"the gamma table has no value at t={k.t}: estimate it on this trajectory")
    return (k.sigma_t / k.a_t) ** 2 * (1.0 - g)


class AnalyticDPM(Solver):
    name, heads, Options = "analytic-dpm", 1, AnalyticDPMOptions
    label, requires = "Analytic-DPM", ("gamma",)

    def step(self, x_t: torch.Tensor, heads: list[torch.Tensor], k: StepCoefficients, rand: StepRandomness,
             o: AnalyticDPMOptions, data_range: DataRange, T: int) -> tuple[torch.Tensor, dict]:
        x0_var = torch.full_like(x_t, analytic_x0_variance(o, k))
        mom = transition_moments(x_t, heads[0], None, None, k, data_range, x0_var=x0_var)
        return learned_gaussian(mom, k, rand, o, data_range)

    def fused_config(self, k, data_range, o, T, batch, per_sample, scalars) -> FusedStepConfig:
        # the step's Var, which is the same for every element, from the torch step's own definitions
        one = torch.zeros(1, dtype=torch.float64, device="cpu")
        x0_var = torch.full_like(one, analytic_x0_variance(o, k))
        var = transition_moments(one, one, None, None, k, data_range, x0_var=x0_var).var
        cap = last_step_variance_cap(data_range, o.clip_pixel, o.pixel_levels) if k.s == 0 else None
        var = float(var.clamp(0.0, cap) if cap is not None else var.clamp_min(0.0))
        return FusedStepConfig(mode=MODE_FIXED, fixed_var=var, **scalars)


register(AnalyticDPM())
