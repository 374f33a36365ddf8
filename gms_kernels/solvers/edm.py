"""EDM's stochastic sampler (Karras et al. 2022, Algorithm 2) on a discrete VP model: ``edm-sde``, two network calls
per step (a Heun correction at the step's end), so a loop of its own. The network sees only the schedule's integer
time indices (a churned noise level is rounded to the nearest one, as EDM does for discrete VP models:
:meth:`~gms_kernels.core.schedule.Schedule.index_of_ve_sigma`), and the noise comes from the Philox streams.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..core.moments import DataRange
from ..core.progress import progress_bar
from ..core.random import STREAM_STEP_NOISE, SampleNoise
from ..core.schedule import DATA, Schedule
from .base import EpsFn, Solver, SolverOptions, denoised_and_eps, real, register


@dataclass(frozen=True)
class EDMOptions(SolverOptions):
    """EDM's Table 5 settings for VP models as defaults: total churn ``s_churn``, churned levels between ``s_tmin``
    and ``s_tmax``, noise inflation ``s_noise``."""

    s_churn: float = 30.0
    s_tmin: float = 0.01
    s_tmax: float = 1.0
    s_noise: float = 1.007

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("s_churn", real(self.s_churn, "s_churn", 0.0, math.inf, "EDM's total churn S_churn"))
        self._set("s_tmin", real(self.s_tmin, "s_tmin", 0.0, math.inf, "EDM's lowest churned sigma S_tmin"))
        self._set("s_tmax", real(self.s_tmax, "s_tmax", self.s_tmin, math.inf, "EDM's highest churned sigma S_tmax, "
                                 ">= s_tmin"))
        self._set("s_noise", real(self.s_noise, "s_noise", 0.0, 2.0, "EDM's noise inflation S_noise"))


@torch.no_grad()
def sample_edm_sde(e1: EpsFn, x: torch.Tensor, ts: Sequence[int], schedule: Schedule, noise: SampleNoise,
                   data_range: DataRange, o: EDMOptions, callback: Callable[[dict], None] | None = None,
                   progress: bool = False) -> tuple[torch.Tensor, dict]:
    """EDM's stochastic sampler (Karras et al. 2022, Alg. 2) with its Heun correction, on the VP model.

    In the sigma view x^ = x / a_t = x0 + sigma eps (sigma = :meth:`Schedule.ve_sigma`), with sigma_i the
    trajectory's levels and sigma_N = 0: gamma_i = min(S_churn / N, sqrt(2) - 1) where S_tmin <= sigma_i <= S_tmax
    (else 0); sigma^ = sigma_i (1 + gamma_i) rounded to the grid (EDM's round_sigma for discrete models, so the
    network sees a level it was trained on); x^ += sqrt(sigma^^2 - sigma_i^2) S_noise z; then an Euler step
    d = (x^ - D(x^; sigma^)) / sigma^ to sigma_{i+1}, corrected by the average with the slope there (Heun) unless
    sigma_{i+1} = 0. N steps cost 2N - 1 calls. Noise z: stream STREAM_STEP_NOISE at index t_i.
    """
    shape, dtype = x.shape[1:], x.dtype
    sigmas = [schedule.ve_sigma(t) for t in ts] + [0.0]
    n, calls = len(ts), 0

    def slope(xh: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, sig = schedule.alpha(t), schedule.sigma(t)
        x0, _ = denoised_and_eps(a * xh, e1(a * xh, t), a, sig, data_range)
        return (xh - x0) / schedule.ve_sigma(t), x0

    xh = x.to(torch.float64) / schedule.alpha(ts[0])
    for i, t in enumerate(progress_bar(ts, progress, desc=f"edm-sde K={n}", leave=False)):
        s = ts[i + 1] if i + 1 < n else DATA
        churn = o.s_tmin <= sigmas[i] <= o.s_tmax
        gamma = min(o.s_churn / n, math.sqrt(2.0) - 1.0) if churn else 0.0
        t_hat = int(schedule.index_of_ve_sigma(sigmas[i] * (1.0 + gamma))) if gamma > 0 else t
        sig_hat = schedule.ve_sigma(t_hat)
        if sig_hat > sigmas[i]:
            z = noise.normal(STREAM_STEP_NOISE, t, shape, x.device).to(torch.float64)
            xh = xh + math.sqrt(sig_hat**2 - sigmas[i] ** 2) * o.s_noise * z
        d, x0 = slope(xh, t_hat)
        x_next = xh + (sigmas[i + 1] - sig_hat) * d
        calls += 1
        if s != DATA:
            d_next, _ = slope(x_next, s)
            x_next = xh + (sigmas[i + 1] - sig_hat) * 0.5 * (d + d_next)
            calls += 1
        xh = x_next
        if callback is not None:
            a_s = schedule.alpha(s)
            callback({"step": i, "i": i, "t": t, "s": s, "t_hat": t_hat, "sigma": sigmas[i],
                      "x": (a_s * xh).to(dtype), "denoised": x0.to(dtype), "nfe": calls})
    return xh.to(dtype), {"nfe": calls}


class EDMSDE(Solver):
    name, heads, Options = "edm-sde", 1, EDMOptions
    calls_per_step = 2

    def loop(self, e1, x, ts, schedule, noise, data_range, o, callback=None, progress=False):
        return sample_edm_sde(e1, x, ts, schedule, noise, data_range, o, callback, progress)


register(EDMSDE())
