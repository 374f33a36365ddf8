"""DPM-Solver++(2M) SDE (Lu et al. 2022, "DPM-Solver++", https://arxiv.org/abs/2211.01095): ``dpmpp-2m-sde``, the
second-order multistep solver of the reverse VP SDE in the data prediction, with the midpoint correction that
k-diffusion's ``sample_dpmpp_2m_sde`` uses, here on the discrete VP schedule.

With lambda = log(a / sigma) at the visited time indices, D_t the clamped E[x0|x_t]
(:func:`~gms_kernels.solvers.base.denoised_and_eps`) and a step t -> s of length h = lambda_s - lambda_t:

    x_s = (sigma_s / sigma_t) e^{-eta h} x_t + a_s (1 - e^{-(1 + eta) h}) D + sigma_s sqrt(1 - e^{-2 eta h}) z,
    D   = D_t + (D_t - D_prev) / (2 r),   r = h_prev / h,

D_prev and h_prev being the previous step's estimate and length (the first step takes D = D_t: with eta = 1 it is
the DDPM posterior step). The correction needs the previous step's output, which a one-step form does not see, so
the solver runs its own loop (one network call per time index visited). The step into data returns D_t. z: stream
STREAM_STEP_NOISE at t, so sample i depends only on (seed, its index).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..core.moments import DataRange
from ..core.random import STREAM_STEP_NOISE, SampleNoise
from ..core.schedule import Schedule
from .base import EpsFn, Solver, SolverOptions, exponential_loop, real, register


@dataclass(frozen=True)
class DPMPP2MSDEOptions(SolverOptions):
    """``eta`` in [0, 1]: the share of the step taken as noise (1: the SDE solver, 0: the ODE solver DPM-Solver++(2M))."""

    eta: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("eta", real(self.eta, "eta", 0.0, 1.0, "DPM-Solver++(2M) SDE's noise share"))


class DPMPP2MSDE(Solver):
    name, heads, Options = "dpmpp-2m-sde", 1, DPMPP2MSDEOptions
    label = "DPM++(2M) SDE"

    @torch.no_grad()
    def loop(self, e1: EpsFn, x: torch.Tensor, ts: Sequence[int], schedule: Schedule, noise: SampleNoise,
             data_range: DataRange, o: DPMPP2MSDEOptions, callback: Callable[[dict], None] | None = None,
             progress: bool = False) -> tuple[torch.Tensor, dict]:
        shape, previous = x.shape[1:], []  # previous: the last step's (x0, h)

        def advance(x: torch.Tensor, x0: torch.Tensor, eps: torch.Tensor, t: int, s: int) -> tuple[torch.Tensor, int]:
            sig_t, a_s, sig_s = schedule.sigma(t), schedule.alpha(s), schedule.sigma(s)
            h = math.log(schedule.ve_sigma(t) / schedule.ve_sigma(s))
            d = x0 if not previous else x0 + (x0 - previous[0]) * (h / (2.0 * previous[1]))
            x = (sig_s / sig_t) * math.exp(-o.eta * h) * x - a_s * math.expm1(-(1.0 + o.eta) * h) * d
            if o.eta > 0.0:
                z = noise.normal(STREAM_STEP_NOISE, t, shape, x.device).to(torch.float64)
                x = x + sig_s * math.sqrt(-math.expm1(-2.0 * o.eta * h)) * z
            previous[:] = [x0, h]
            return x, 0

        return exponential_loop(e1, x, ts, schedule, data_range, advance, f"{self.name} K={len(ts)}", callback,
                                progress)


register(DPMPP2MSDE())
