"""Euler ancestral (the ancestral sampler in the sigma form of Karras et al. 2022, https://arxiv.org/abs/2206.00364,
as k-diffusion's ``sample_euler_ancestral`` runs it): ``euler-ancestral``, on the discrete VP trajectory.

In the variance-exploding view of the state, x~ = x / a at the level sigma~ = sigma / a, with D the clamped
E[x0|x_t] (:func:`~gms_kernels.solvers.base.denoised_and_eps`), a step t -> s splits the level sigma~_s into a
deterministic part and fresh noise:

    sigma_up   = min(sigma~_s, eta sqrt(sigma~_s^2 (sigma~_t^2 - sigma~_s^2) / sigma~_t^2)),
    sigma_down = sqrt(sigma~_s^2 - sigma_up^2),
    x~_s       = x~_t + (sigma_down - sigma~_t) (x~_t - D) / sigma~_t + sigma_up z,    x_s = a_s x~_s,

an Euler step of the probability-flow ODE down to sigma_down, then noise back up to sigma~_s. With eta = 1 it is the
DDPM posterior step, with eta = 0 DDIM's. The step into data returns D. One network call per step; z: stream
STREAM_STEP_NOISE at t.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core.moments import DataRange
from ..core.schedule import DATA, StepCoefficients
from .base import Solver, SolverOptions, StepRandomness, denoised_and_eps, real, register


@dataclass(frozen=True)
class EulerAncestralOptions(SolverOptions):
    """``eta`` in [0, 1]: the share of the step taken as fresh noise."""

    eta: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("eta", real(self.eta, "eta", 0.0, 1.0, "Euler ancestral's noise share"))


class EulerAncestral(Solver):
    name, heads, Options = "euler-ancestral", 1, EulerAncestralOptions
    label = "Euler ancestral"

    def step(self, x_t: torch.Tensor, heads: list[torch.Tensor], k: StepCoefficients, rand: StepRandomness,
             o: EulerAncestralOptions, data_range: DataRange, T: int) -> tuple[torch.Tensor, dict]:
        x0, _ = denoised_and_eps(x_t, heads[0], k.a_t, k.sigma_t, data_range)
        if k.s == DATA:
            return x0, {"x0": x0}
        level_t, level_s = k.sigma_t / k.a_t, k.sigma_s / k.a_s
        up = min(level_s, o.eta * math.sqrt(level_s**2 * (level_t**2 - level_s**2) / level_t**2))
        down = math.sqrt(level_s**2 - up**2)
        x = x_t / k.a_t
        x = x + (down - level_t) * (x - x0) / level_t
        if up > 0.0:
            x = x + up * rand.normal()
        return k.a_s * x, {"x0": x0}


register(EulerAncestral())
