"""SEEDS (Gonzalez et al. 2023), the exponential integrators of the reverse VP SDE in lambda = log(a / sigma):
``seeds-1`` (one network call per step, with a one-step form), ``seeds-2`` and ``seeds-3`` (two and three calls per
step, loops of their own: a step's later calls need the earlier calls' results at points between t and s).

The loops read only the e1 head, evaluate the network only at the schedule's integer time indices (a stage point off
the grid is rounded to the nearest index, and the stage's length in lambda is then the exact one), use the clamped
x0 estimate like every solver here (:func:`~gms_kernels.solvers.base.denoised_and_eps`) and draw their noise from the
Philox streams, so sample i depends only on (seed, its index). The last step into data is the denoised mean (one
call). Each callback dict carries ``nfe``: the network calls so far.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..core.moments import DataRange
from ..core.random import STREAM_SECOND_NOISE, STREAM_STEP_NOISE, STREAM_THIRD_NOISE, SampleNoise
from ..core.schedule import DATA, Schedule, StepCoefficients
from .base import EpsFn, Solver, SolverOptions, StepRandomness, denoised_and_eps, exponential_loop, real, register

PREDICTIONS = ("noise", "data")


@dataclass(frozen=True)
class SEEDSOptions(SolverOptions):
    """``prediction``: the SDE integrated in the noise prediction ("noise") or the data prediction ("data")."""

    prediction: str = "noise"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prediction not in PREDICTIONS:
            raise ValueError(f"prediction must be 'noise' or 'data' (which SEEDS form), got {self.prediction!r}")


@dataclass(frozen=True)
class SEEDS2Options(SEEDSOptions):
    """``r``: the intermediate point, a fraction of the step in lambda, in (0, 1)."""

    r: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("r", real(self.r, "r", 0.0, 1.0, "SEEDS-2's intermediate point, a fraction of the step in lambda",
                            open_low=True))
        if self.r == 1.0:
            raise ValueError("r must be a number in (0, 1) (SEEDS-2's intermediate point), got 1.0")


class SEEDS1(Solver):
    """SEEDS-1, the first-order exponential integrator of the VP reverse SDE in the noise prediction (also
    DPM-Solver++'s SDE-DPM-Solver-1). With lambda = log(a / sigma) and h = lambda_s - lambda_t > 0:

        x_s = (a_s / a_t) x_t - 2 sigma_s (e^h - 1) eps(x_t, t) + sigma_s sqrt(e^{2h} - 1) z,

    the noise term being the exact Ito integral of the linear part (variance sigma_s^2 (e^{2h} - 1)).
    ``prediction="data"`` integrates the same SDE written with the data prediction x0 instead (SEEDS' data
    prediction mode, DPM-Solver++'s SDE form):

        x_s = (sigma_s / sigma_t) e^{-h} x_t + a_s (1 - e^{-2h}) x0(x_t, t) + sigma_s sqrt(1 - e^{-2h}) z,

    which is exactly the DDPM posterior step (solver 'ddpm'). The step to data returns the denoised mean, as every
    solver here does."""

    name, heads, Options = "seeds-1", 1, SEEDSOptions

    def step(self, x_t: torch.Tensor, heads: list[torch.Tensor], k: StepCoefficients, rand: StepRandomness,
             o: SEEDSOptions, data_range: DataRange, T: int) -> tuple[torch.Tensor, dict]:
        x0, eps = denoised_and_eps(x_t, heads[0], k.a_t, k.sigma_t, data_range)
        if k.s == DATA:
            return x0, {"x0": x0}
        eh = (k.sigma_t / k.a_t) / (k.sigma_s / k.a_s)  # e^h = exp(lambda_s - lambda_t)
        if o.prediction == "data":
            x_s = (k.sigma_s / k.sigma_t) / eh * x_t + k.a_s * (1.0 - eh**-2) * x0
            return x_s + k.sigma_s * math.sqrt(1.0 - eh**-2) * rand.normal(), {"x0": x0}
        x_s = (k.a_s / k.a_t) * x_t - 2.0 * k.sigma_s * (eh - 1.0) * eps
        return x_s + k.sigma_s * math.sqrt(eh * eh - 1.0) * rand.normal(), {"x0": x0}


@torch.no_grad()
def sample_seeds_2(e1: EpsFn, x: torch.Tensor, ts: Sequence[int], schedule: Schedule, noise: SampleNoise,
                   data_range: DataRange, o: SEEDS2Options, callback: Callable[[dict], None] | None = None,
                   progress: bool = False) -> tuple[torch.Tensor, dict]:
    """SEEDS-2 (Gonzalez et al. 2023), the two-stage exponential SDE solver in the noise prediction.

    With lambda = log(a / sigma), a step t -> s of length h = lambda_s - lambda_t visits m at lambda_t + r h
    (rounded to the grid; h1 = lambda_m - lambda_t is then the exact length of that stage):

        u   = (a_m / a_t) x_t - 2 sigma_m (e^{h1} - 1) eps(x_t, t) + sigma_m sqrt(e^{2 h1} - 1) z1
        x_s = (a_s / a_t) x_t - 2 sigma_s (e^h - 1) eps(u, m)
              + sigma_s (sqrt(e^{2h} - e^{2(h - h1)}) z1 + sqrt(e^{2(h - h1)} - 1) z2)

    The noise terms are the exact Ito integrals of the linear part over [lambda_t, lambda_m] and
    [lambda_m, lambda_s]: z1 drives both stages (the first half-interval's Brownian increment, carried to s),
    z2 is the second's, and their variances add up to SEEDS-1's sigma_s^2 (e^{2h} - 1). ``prediction="data"``
    integrates the data-prediction form instead, with the same split of the noise:

        u   = (sigma_m / sigma_t) e^{-h1} x_t + a_m (1 - e^{-2 h1}) x0(x_t, t) + sigma_m sqrt(1 - e^{-2 h1}) z1
        x_s = (sigma_s / sigma_t) e^{-h} x_t + a_s (1 - e^{-2h}) x0(u, m)
              + sigma_s (sqrt(e^{-2(h - h1)} - e^{-2h}) z1 + sqrt(1 - e^{-2(h - h1)}) z2)

    The last step into data is the denoised mean (one call). z1: stream STREAM_STEP_NOISE at t; z2:
    STREAM_SECOND_NOISE at t.
    """
    shape = x.shape[1:]

    def advance(x: torch.Tensor, x0: torch.Tensor, eps: torch.Tensor, t: int, s: int) -> tuple[torch.Tensor, int]:
        a_t, sig_t = schedule.alpha(t), schedule.sigma(t)
        vs_t, vs_s = schedule.ve_sigma(t), schedule.ve_sigma(s)  # e^{-lambda}
        h = math.log(vs_t / vs_s)
        m = int(schedule.index_of_ve_sigma(vs_t * math.exp(-o.r * h)))
        h1 = math.log(vs_t / schedule.ve_sigma(m))
        a_m, sig_m, a_s, sig_s = schedule.alpha(m), schedule.sigma(m), schedule.alpha(s), schedule.sigma(s)
        z1 = noise.normal(STREAM_STEP_NOISE, t, shape, x.device).to(torch.float64)
        z2 = noise.normal(STREAM_SECOND_NOISE, t, shape, x.device).to(torch.float64)
        if o.prediction == "data":
            u = ((sig_m / sig_t) * math.exp(-h1) * x - a_m * math.expm1(-2 * h1) * x0
                 + sig_m * math.sqrt(-math.expm1(-2 * h1)) * z1)
            x0_m, _ = denoised_and_eps(u, e1(u, m), a_m, sig_m, data_range)
            tail = math.exp(-2 * (h - h1))
            return ((sig_s / sig_t) * math.exp(-h) * x - a_s * math.expm1(-2 * h) * x0_m
                    + sig_s * (math.sqrt(max(tail - math.exp(-2 * h), 0.0)) * z1
                               + math.sqrt(max(1.0 - tail, 0.0)) * z2)), 1
        u = (a_m / a_t) * x - 2.0 * sig_m * math.expm1(h1) * eps + sig_m * math.sqrt(math.expm1(2 * h1)) * z1
        _, eps_m = denoised_and_eps(u, e1(u, m), a_m, sig_m, data_range)
        tail = math.exp(2 * (h - h1))
        return ((a_s / a_t) * x - 2.0 * sig_s * math.expm1(h) * eps_m
                + sig_s * (math.sqrt(max(math.exp(2 * h) - tail, 0.0)) * z1 + math.sqrt(max(tail - 1.0, 0.0)) * z2)), 1

    return exponential_loop(e1, x, ts, schedule, data_range, advance, f"seeds-2 K={len(ts)}", callback, progress)


def _lambda_cut(schedule: Schedule, t: int, h: float, r: float) -> tuple[int, float]:
    """The grid index nearest to lambda_t + r h (a stage point of a multi-stage step t -> s of length h in
    lambda = log(a / sigma)), and its exact distance in lambda from t."""
    vs_t = schedule.ve_sigma(t)  # e^{-lambda_t}
    m = int(schedule.index_of_ve_sigma(vs_t * math.exp(-r * h)))
    return m, math.log(vs_t / schedule.ve_sigma(m))


def _exp_noise(p: float, cuts: Sequence[float], prediction: str) -> list[float]:
    """The weights, on independent N(0, 1) variables of the lambda intervals [0, c_1], [c_1, c_2], ..., of the
    exact Ito noise of the linear part at lambda_t + p (in units of sigma there; p >= every cut): the interval
    [a, b] adds sqrt(e^{2(p - a)} - e^{2(p - b)}) (noise prediction) or sqrt(e^{-2(p - b)} - e^{-2(p - a)}) (data
    prediction). Their squares add up to e^{2p} - 1 or 1 - e^{-2p}: SEEDS-1's variance over [0, p]."""
    sign = 1.0 if prediction == "noise" else -1.0
    out, a = [], 0.0
    for b in cuts:
        out.append(math.sqrt(max(sign * (math.exp(sign * 2 * (p - a)) - math.exp(sign * 2 * (p - b))), 0.0)))
        a = b
    return out


def _exp_drift(x: torch.Tensor, pred: torch.Tensor, slope: torch.Tensor | None, p: float, a_t: float, sig_t: float,
               a_p: float, sig_p: float, prediction: str) -> torch.Tensor:
    """The drift part of the exact solution of the linear SDE from lambda_t to lambda_t + p, with the model
    term taken as pred + (lambda - lambda_t) slope (a first-order Taylor model in lambda; slope None: constant).

    noise prediction: (a_p / a_t) x - 2 sigma_p [(e^p - 1) pred + (e^p - 1 - p) slope]
    data prediction:  (sigma_p / sigma_t) e^{-p} x + a_p [(1 - e^{-2p}) pred + (p - (1 - e^{-2p}) / 2) slope]
    (the integrals of the SDE's kernels 2 e^{p - l} and 2 e^{-2(p - l)} against 1 and l over [0, p])."""
    if prediction == "noise":
        out = (a_p / a_t) * x - 2.0 * sig_p * math.expm1(p) * pred
        return out if slope is None else out - 2.0 * sig_p * (math.expm1(p) - p) * slope
    out = (sig_p / sig_t) * math.exp(-p) * x - a_p * math.expm1(-2 * p) * pred
    return out if slope is None else out + a_p * (p + 0.5 * math.expm1(-2 * p)) * slope


@torch.no_grad()
def sample_seeds_3(e1: EpsFn, x: torch.Tensor, ts: Sequence[int], schedule: Schedule, noise: SampleNoise,
                   data_range: DataRange, o: SEEDSOptions, callback: Callable[[dict], None] | None = None,
                   progress: bool = False) -> tuple[torch.Tensor, dict]:
    """SEEDS-3 (Gonzalez et al. 2023), the three-stage exponential SDE solver, in our derivation (the stage
    points and the Taylor model are DPM-Solver-3's; the paper's own coefficient table was not at hand to compare).

    The reverse VP SDE in lambda = log(a / sigma) has the exact solution (variation of constants; noise
    prediction) x_s = (a_s / a_t) x_t - 2 sigma_s int_0^h e^{h - l} eps(lambda_t + l) dl + sigma_s int ... dW,
    the same form as DPM-Solver's ODE solution with the model term doubled, plus a Gaussian whose variance is
    known exactly. As DPM-Solver-3 (Lu et al. 2022, Alg. 3) does for the ODE, with the stage points
    r1 = 1/3, r2 = 2/3 of the step (rounded to the grid: h1, h2 are their exact lambda distances), eps taken
    linear in lambda through the stages (:func:`_exp_drift`), P = the prediction (eps or x0):

        u1  = drift(x_t; P_t, slope none, h1)                       + noise(h1)
        u2  = drift(x_t; P_t, slope (P(u1) - P_t) / h1, h2)        + noise(h2)
        x_s = drift(x_t; P_t, slope (P(u2) - P_t) / h2, h)         + noise(h)

    The noise terms are the exact Ito integrals of the linear part, built from three independent normals of
    the lambda intervals [0, h1], [h1, h2], [h2, h] (:func:`_exp_noise`), so u1, u2 and x_s see one Brownian
    path and each has SEEDS-1's variance over its own interval. ``prediction="data"`` integrates the
    data-prediction form with the same structure. The last step into data is the denoised mean (one call).
    Noise: STREAM_STEP_NOISE, STREAM_SECOND_NOISE and STREAM_THIRD_NOISE at t.
    """
    shape, form = x.shape[1:], o.prediction

    def advance(x: torch.Tensor, x0: torch.Tensor, eps: torch.Tensor, t: int, s: int) -> tuple[torch.Tensor, int]:
        a_t, sig_t = schedule.alpha(t), schedule.sigma(t)
        h = math.log(schedule.ve_sigma(t) / schedule.ve_sigma(s))
        (m1, h1), (m2, h2) = _lambda_cut(schedule, t, h, 1.0 / 3.0), _lambda_cut(schedule, t, h, 2.0 / 3.0)
        z = [noise.normal(stream, t, shape, x.device).to(torch.float64)
             for stream in (STREAM_STEP_NOISE, STREAM_SECOND_NOISE, STREAM_THIRD_NOISE)]
        cuts = (h1, h2, h)

        def point(p: float, m: int | None, pred: torch.Tensor, slope: torch.Tensor | None) -> torch.Tensor:
            a_p, sig_p = (schedule.alpha(m), schedule.sigma(m)) if m is not None else (schedule.alpha(s),
                                                                                         schedule.sigma(s))
            w = _exp_noise(p, [c for c in cuts if c <= p], form)
            return (_exp_drift(x, pred, slope, p, a_t, sig_t, a_p, sig_p, form)
                    + sig_p * sum(wi * zi for wi, zi in zip(w, z)))

        def model(u: torch.Tensor, m: int) -> torch.Tensor:
            mx0, meps = denoised_and_eps(u, e1(u, m), schedule.alpha(m), schedule.sigma(m), data_range)
            return meps if form == "noise" else mx0

        def slope(u: torch.Tensor, m: int, p: float) -> torch.Tensor | None:
            return (model(u, m) - pred) / p if p > 0 else None  # (a stage rounded onto t: no slope)

        pred = eps if form == "noise" else x0
        u1 = point(h1, m1, pred, None)
        u2 = point(h2, m2, pred, slope(u1, m1, h1))
        return point(h, None, pred, slope(u2, m2, h2)), 2

    return exponential_loop(e1, x, ts, schedule, data_range, advance, f"seeds-3 K={len(ts)}", callback, progress)


class SEEDS2(Solver):
    name, heads, Options = "seeds-2", 1, SEEDS2Options
    calls_per_step = 2

    def loop(self, e1, x, ts, schedule, noise, data_range, o, callback=None, progress=False):
        return sample_seeds_2(e1, x, ts, schedule, noise, data_range, o, callback, progress)


class SEEDS3(Solver):
    name, heads, Options = "seeds-3", 1, SEEDSOptions
    calls_per_step = 3

    def loop(self, e1, x, ts, schedule, noise, data_range, o, callback=None, progress=False):
        return sample_seeds_3(e1, x, ts, schedule, noise, data_range, o, callback, progress)


register(SEEDS1())
register(SEEDS2())
register(SEEDS3())
