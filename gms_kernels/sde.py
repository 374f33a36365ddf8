"""The SDE baselines that make several network calls per step: EDM's stochastic sampler, SEEDS-2, SEEDS-3
and Gotta Go Fast. One function per sampler (k-diffusion style); :func:`gms_kernels.sample` calls them for
``solver="edm-sde" | "seeds-2" | "seeds-3" | "ggf"``. (SEEDS-1 makes one call per step and is an ordinary solver step,
``gms_kernels.solvers.seeds_1_step``, so it also runs in ``gk.step`` and ``GMSScheduler``.)

They have no one-step form: a step's second network call needs the first call's result on a state that only
the sampler holds (EDM's Heun correction, SEEDS-2's intermediate point), and GGF's steps are not even on a fixed
grid. A diffusers scheduler sees one model output per step, so these run only through ``gk.sample``.

All of them read only the e1 head (eps prediction) of the package's models, evaluate the network only at the
schedule's integer time indices (an off-grid noise level is rounded to the nearest one, as EDM does for
discrete VP models: :meth:`Schedule.index_of_ve_sigma`), use the clamped x0 estimate like every solver here
(:func:`gms_kernels.solvers.denoised_and_eps`), and draw their noise from the Philox streams of
``gms_kernels.core.random``, so sample i depends only on (seed, its index), on every backend (they have no fused
kernel: the float64 torch code runs whatever ``backend`` says). Each callback dict also carries ``nfe``: the
network calls made so far (per sample for GGF, whose count varies from sample to sample).

The network is called through ``e1(x, t, rows=None)``: ``rows`` names the samples of the batch that x holds
(None: all of them), so that per-sample conditioning (:class:`EpsFunction`'s) follows a sampler that steps
samples apart (GGF).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from .model_io import Conditioning, call_model, nonfinite_output_error, split_heads
from .core.moments import DataRange
from .core.progress import progress_bar
from .core.random import (STREAM_ADAPTIVE, STREAM_BROWNIAN, STREAM_SECOND_NOISE, STREAM_STEP_NOISE, STREAM_THIRD_NOISE,
                     SampleNoise)
from .core.schedule import DATA, Schedule
from .solvers import denoised_and_eps

EpsFn = Callable[..., torch.Tensor]  # e1(x, t, rows=None): see the module's docstring


def network_calls(solver: str, points: int) -> int:
    """Network calls of a fixed-grid sampler visiting ``points`` time indices (then stepping to data):
    one per point for the one-call solvers, two per step for EDM-SDE and SEEDS-2 and three for SEEDS-3, except
    the last step into data, which is one call (the denoised mean). GGF's count is adaptive: read it from the
    callback's ``nfe``."""
    if solver == "ggf":
        raise ValueError("GGF's network calls are adaptive: read them from the callback's 'nfe'")
    if solver == "seeds-3":
        return 3 * points - 2
    return 2 * points - 1 if solver in ("edm-sde", "seeds-2") else points


class EpsFunction:
    """e1(x, t, rows=None): the model's eps head in float64 at index t (an int, or one index per sample), the
    model fed ``dtype`` and called with ``conditioning`` (its keyword arguments of the samples ``rows`` of the
    batch, and guidance; None: plain ``model(x, t)``); :attr:`calls` counts the network calls.

    Every output is checked for NaN/inf. With ``defer=True`` the check's verdicts stay on the device (one
    reduction per call, as the immediate check makes) until :meth:`raise_if_nonfinite` reads them all at once: an
    immediate check reads the device once per network call, which on a GPU stalls the host until the queue has
    run."""

    def __init__(self, model: Callable, T: int, time_input: str, solver: str, dtype: torch.dtype,
                 defer: bool = False, conditioning: Conditioning | None = None):
        self.model, self.T, self.time_input, self.solver, self.dtype = model, T, time_input, solver, dtype
        self.defer, self.calls, self.conditioning = defer, 0, conditioning
        self._finite: list[torch.Tensor] = []  # (deferred) per call, on the device: all of e1 finite
        self._where: list[str] = []  # per call, to name the bad one

    def __call__(self, x: torch.Tensor, t: int | torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        x_in = x.to(self.dtype)
        cond = self.conditioning
        if cond is not None and rows is not None:
            cond = cond.rows(rows)
        out = call_model(self.model, x_in, t, self.T, self.time_input, cond)
        where = f"at network call {self.calls} (t={t if isinstance(t, int) else 'per sample'}) "
        self.calls += 1
        e1 = split_heads(out, x_in, 1, self.solver, where, check_finite=not self.defer)[0]
        if self.defer:
            self._finite.append(torch.isfinite(e1).all())
            self._where.append(where)
        return e1.to(torch.float64)

    def raise_if_nonfinite(self) -> None:
        """Raise the deferred check's error, naming the first network call whose output was not finite."""
        if self._finite:
            finite = torch.stack(self._finite).tolist()  # (the one host read)
            if not all(finite):
                raise nonfinite_output_error(self._where[finite.index(False)], 0)


def _view(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-sample [N] tensor shaped to broadcast against x [N, ...]."""
    return v.reshape(-1, *([1] * (x.dim() - 1))).to(x.device)


@torch.no_grad()
def sample_edm_sde(e1: EpsFn, x: torch.Tensor, ts: Sequence[int], schedule: Schedule, noise: SampleNoise,
                   data_range: DataRange, o: dict[str, Any], callback: Callable[[dict], None] | None = None,
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
        churn = o["s_tmin"] <= sigmas[i] <= o["s_tmax"]
        gamma = min(o["s_churn"] / n, math.sqrt(2.0) - 1.0) if churn else 0.0
        t_hat = int(schedule.index_of_ve_sigma(sigmas[i] * (1.0 + gamma))) if gamma > 0 else t
        sig_hat = schedule.ve_sigma(t_hat)
        if sig_hat > sigmas[i]:
            z = noise.normal(STREAM_STEP_NOISE, t, shape, x.device).to(torch.float64)
            xh = xh + math.sqrt(sig_hat**2 - sigmas[i] ** 2) * o["s_noise"] * z
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


@torch.no_grad()
def sample_seeds_2(e1: EpsFn, x: torch.Tensor, ts: Sequence[int], schedule: Schedule, noise: SampleNoise,
                   data_range: DataRange, o: dict[str, Any], callback: Callable[[dict], None] | None = None,
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
    shape, dtype = x.shape[1:], x.dtype
    x, calls = x.to(torch.float64), 0
    for i, t in enumerate(progress_bar(ts, progress, desc=f"seeds-2 K={len(ts)}", leave=False)):
        s = ts[i + 1] if i + 1 < len(ts) else DATA
        a_t, sig_t = schedule.alpha(t), schedule.sigma(t)
        x0, eps = denoised_and_eps(x, e1(x, t), a_t, sig_t, data_range)
        calls += 1
        if s == DATA:
            x = x0
        else:
            vs_t, vs_s = schedule.ve_sigma(t), schedule.ve_sigma(s)  # e^{-lambda}
            h = math.log(vs_t / vs_s)
            m = int(schedule.index_of_ve_sigma(vs_t * math.exp(-o["r"] * h)))
            h1 = math.log(vs_t / schedule.ve_sigma(m))
            a_m, sig_m, a_s, sig_s = schedule.alpha(m), schedule.sigma(m), schedule.alpha(s), schedule.sigma(s)
            z1 = noise.normal(STREAM_STEP_NOISE, t, shape, x.device).to(torch.float64)
            z2 = noise.normal(STREAM_SECOND_NOISE, t, shape, x.device).to(torch.float64)
            if o["prediction"] == "data":
                u = ((sig_m / sig_t) * math.exp(-h1) * x - a_m * math.expm1(-2 * h1) * x0
                     + sig_m * math.sqrt(-math.expm1(-2 * h1)) * z1)
                x0_m, _ = denoised_and_eps(u, e1(u, m), a_m, sig_m, data_range)
                tail = math.exp(-2 * (h - h1))
                x = ((sig_s / sig_t) * math.exp(-h) * x - a_s * math.expm1(-2 * h) * x0_m
                     + sig_s * (math.sqrt(max(tail - math.exp(-2 * h), 0.0)) * z1 + math.sqrt(max(1.0 - tail, 0.0)) * z2))
            else:
                u = (a_m / a_t) * x - 2.0 * sig_m * math.expm1(h1) * eps + sig_m * math.sqrt(math.expm1(2 * h1)) * z1
                _, eps_m = denoised_and_eps(u, e1(u, m), a_m, sig_m, data_range)
                tail = math.exp(2 * (h - h1))
                x = ((a_s / a_t) * x - 2.0 * sig_s * math.expm1(h) * eps_m
                     + sig_s * (math.sqrt(max(math.exp(2 * h) - tail, 0.0)) * z1 + math.sqrt(max(tail - 1.0, 0.0)) * z2))
            calls += 1
        if callback is not None:
            callback({"step": i, "i": i, "t": t, "s": s, "sigma": schedule.ve_sigma(t), "x": x.to(dtype, copy=True),
                      "denoised": x0.to(dtype), "nfe": calls})
    return x.to(dtype), {"nfe": calls}


class BrownianTree:
    """One standard Brownian path W(u), u in [0, 1], per sample and element, fixed by (seed, sample index):
    any W(u) can be asked for, in any order, and always gives the same value (a "virtual Brownian tree").

    W(0) = 0 and W(1) ~ N(0, 1) (node 0); then, halving the interval [l, r] around u DEPTH times, the midpoint
    m gets the Brownian bridge's value W(m) = (W(l) + W(r)) / 2 + sqrt((r - l) / 4) z_k, z_k the normal of
    heap node k (the root interval is node 1, the halves of node k are 2k and 2k + 1). Below the last level
    (width 2^-DEPTH, 6e-8) W is linear. So increments over disjoint intervals are independent N(0, length)
    up to that width, whatever the sampler asks first. Normals: stream STREAM_BROWNIAN at the node
    (:meth:`SampleNoise.normal_at_nodes`); cost DEPTH normals per element per query.
    """

    DEPTH = 24

    def __init__(self, noise: SampleNoise, shape: Sequence[int], device: torch.device):
        self.noise, self.shape, self.device = noise, tuple(shape), device

    def __call__(self, u: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """W(u[j]) of sample rows[j] (host tensors [M]), float64 [M, *shape] on the device."""
        D, M = self.DEPTH, len(rows)
        # the binary digits of u pick the path: at level d the interval is node 2^d + (q >> (D - d)), q = the
        # leaf's index floor(u 2^D) (exact in float64; u = 1 is the last leaf), and u lies in its right half
        # iff digit d + 1 of q is 1. So all the path's nodes are known up front: one draw for all levels.
        q = (u.to(torch.float64).cpu() * (1 << D)).floor().long().clamp(0, (1 << D) - 1)
        levels = torch.arange(D, dtype=torch.int64, device="cpu")
        nodes = torch.cat([torch.zeros(M, 1, dtype=torch.int64, device="cpu"), (1 << levels) + (q[:, None] >> (D - levels))], 1)
        right = ((q[:, None] >> (D - 1 - levels)) & 1).bool()
        sub = SampleNoise(self.noise.seeds[rows].repeat_interleave(D + 1),
                          self.noise.indices[rows].repeat_interleave(D + 1))
        z = sub.normal_at_nodes(STREAM_BROWNIAN, nodes.flatten(), self.shape, self.device)
        z = z.reshape(M, D + 1, *self.shape)
        w_lo, w_hi = torch.zeros_like(z[:, 0]), z[:, 0]  # W(0), W(1)
        for d in range(D):
            w_mid = 0.5 * (w_lo + w_hi) + math.sqrt(0.25 * 2.0 ** -d) * z[:, d + 1]
            r = _view(right[:, d], w_mid)
            w_lo, w_hi = torch.where(r, w_mid, w_lo), torch.where(r, w_hi, w_mid)
        frac = u.to(torch.float64).cpu() * (1 << D) - q  # position inside the leaf, in [0, 1]
        return w_lo + _view(frac, w_lo) * (w_hi - w_lo)


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
                   data_range: DataRange, o: dict[str, Any], callback: Callable[[dict], None] | None = None,
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
    shape, dtype, form = x.shape[1:], x.dtype, o["prediction"]
    x, calls = x.to(torch.float64), 0
    for i, t in enumerate(progress_bar(ts, progress, desc=f"seeds-3 K={len(ts)}", leave=False)):
        s = ts[i + 1] if i + 1 < len(ts) else DATA
        a_t, sig_t = schedule.alpha(t), schedule.sigma(t)
        x0, eps = denoised_and_eps(x, e1(x, t), a_t, sig_t, data_range)
        calls += 1
        if s == DATA:
            x = x0
        else:
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
            x = point(h, None, pred, slope(u2, m2, h2))
            calls += 2
        if callback is not None:
            callback({"step": i, "i": i, "t": t, "s": s, "sigma": schedule.ve_sigma(t), "x": x.to(dtype, copy=True),
                      "denoised": x0.to(dtype), "nfe": calls})
    return x.to(dtype), {"nfe": calls}


@torch.no_grad()
def sample_ggf(e1: EpsFn, x: torch.Tensor, ts: Sequence[int], schedule: Schedule, noise: SampleNoise,
               data_range: DataRange, o: dict[str, Any], callback: Callable[[dict], None] | None = None,
               progress: bool = False) -> tuple[torch.Tensor, dict]:
    """Gotta Go Fast (Jolicoeur-Martineau et al. 2021, Alg. 1): the reverse VP SDE with adaptive steps.

    Continuous time u in [0, 1] (:meth:`Schedule.log_alpha_bar_at`; index t sits at (t + 1) / T), drift
    F(x, u) = beta(u) (x / 2 + score) with score = -eps / sigma, diffusion sqrt(beta(u)). From u = ts[0]'s
    time down to index 0's, each proposal of size h (same z for both stages):

        x'  = x + h F(x, u) + sqrt(h beta(u)) z                         (Euler-Maruyama)
        x~  = x' + h F(x', u - h) + sqrt(h beta(u - h)) z,  x'' = (x + x~) / 2   (improved Euler)
        delta = max(eps_abs, eps_rel max(|x'|, |x'_prev|)),  E = ||(x' - x'') / delta||_2 / sqrt(n)

    accepted when E <= 1 (x <- x'', u <- u - h, x'_prev <- x'), and in either case h <- min(u - u_end,
    safety h E^-exponent). Every sample has its own u, h and accept decisions, so it does not depend on the
    batch for a network whose outputs do not; but the decisions are thresholds on the network's output, so
    the last-bit differences a real network shows between batch sizes or devices can flip one and send the
    sample down another step sequence (the embedded digits model: up to 0.67 apart between batch 16 and 3 on
    the CPU, up to 0.17 between an H200 and the CPU, tests/test_cuda.py). After a rejection the first call
    is reused. Then one call for the denoised mean at index 0.
    The network sees the grid index nearest to u's noise level (:meth:`Schedule.index_at`).

    The noise sqrt(h) z is a Brownian increment. ``noise="redraw"`` draws a fresh z for every proposal, as Alg. 1
    does (stream STREAM_ADAPTIVE at that sample's attempt count). That biases the samples: whether a proposal
    is accepted depends on its z (a large |z| makes E large), so the accepted increments are too small, and the
    more so the tighter the tolerance (on the oracle's 1-D mixture W1 grows from 0.03 to 0.10 when eps_abs
    falls from 0.0078 to 1e-4). ``noise="brownian"`` (default) fixes one Brownian path W(u) per sample
    before any decision (:class:`BrownianTree`) and uses W(u) - W(u - h), so a rejection changes the step and
    never the path; the samples then converge to the SDE's as the tolerance tightens (the rejection-sampling
    bias Rackauckas & Nie 2017 describe, removed here with a Brownian tree rather than their memory stack).
    Returns info ``nfe`` (calls per sample).
    """
    shape, dtype, N = x.shape[1:], x.dtype, x.shape[0]
    x = x.to(torch.float64, copy=True)  # (updated in place below)
    # (the per-sample step control lives on the CPU: u, h and the counters; x and the score where x is)
    u = torch.full((N,), (ts[0] + 1) / schedule.T, dtype=torch.float64, device="cpu")
    u_end = 1.0 / schedule.T
    h = torch.full((N,), o["h_init"], dtype=torch.float64, device="cpu")
    x_prev = x.clone()  # x' of the last accepted proposal
    score = torch.zeros_like(x)
    fresh = torch.zeros(N, dtype=torch.bool, device="cpu")  # score holds the score at (x, u)
    attempts = torch.zeros(N, dtype=torch.int64, device="cpu")
    nfe = torch.zeros(N, dtype=torch.int64, device="cpu")
    path = BrownianTree(noise, shape, x.device) if o["noise"] == "brownian" else None
    w_now = path(u, torch.arange(N, device="cpu")) if path is not None else None  # W(u) of each sample's current u

    def score_at(xs: torch.Tensor, us: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        idx = schedule.index_at(us)
        abar = schedule.alphas_cumprod[idx]
        a, sig = _view(abar.sqrt(), xs), _view((1.0 - abar).sqrt(), xs)
        _, eps = denoised_and_eps(xs, e1(xs, idx, rows=rows), a, sig, data_range)
        return -eps / sig

    step = 0
    while True:
        active = (u - u_end > 1e-9).nonzero().flatten()
        if active.numel() == 0:
            break
        if int(attempts[active].max()) >= o["max_attempts"]:
            raise ValueError(f"GGF needed more than max_attempts={o['max_attempts']} proposals for a sample: "
                             "loosen eps_abs/eps_rel or raise max_attempts")
        stale = active[~fresh[active]]
        if stale.numel():
            score[stale] = score_at(x[stale], u[stale], stale)
            nfe[stale] += 1
            fresh[stale] = True
        xa, ua, sa = x[active], u[active], score[active]
        ha = torch.minimum(h[active], ua - u_end)
        if path is not None:
            w_next = path(ua - ha, active)
            dw = w_now[active] - w_next  # W(u) - W(u - h): the path's increment over the step (reverse time)
        else:
            sub = SampleNoise(noise.seeds[active], noise.indices[active])
            dw = _view(ha, xa).sqrt() * sub.normal_per_sample(STREAM_ADAPTIVE, attempts[active], shape,
                                                              x.device).to(torch.float64)
        b1, b2 = _view(schedule.beta_at(ua), xa), _view(schedule.beta_at(ua - ha), xa)
        hv = _view(ha, xa)
        x1 = xa + hv * b1 * (0.5 * xa + sa) + b1.sqrt() * dw
        s2 = score_at(x1, ua - ha, active)
        nfe[active] += 1
        x_tilde = x1 + hv * b2 * (0.5 * x1 + s2) + b2.sqrt() * dw
        x2 = 0.5 * (xa + x_tilde)
        delta = torch.maximum(torch.full_like(x1, o["eps_abs"]), o["eps_rel"] * torch.maximum(x1.abs(), x_prev[active].abs()))
        err = ((x1 - x2) / delta).pow(2).reshape(len(active), -1).mean(1).sqrt().cpu()  # (decisions on the host)
        ok = err <= 1.0
        acc = active[ok]
        x[acc], x_prev[acc], u[acc] = x2[ok], x1[ok], ua[ok] - ha[ok]
        if path is not None:
            w_now[acc] = w_next[ok]
        fresh[acc] = False
        factor = o["safety"] * err.clamp_min(1e-12).pow(-o["exponent"])
        h[active] = torch.minimum(ha * factor, (u[active] - u_end).clamp_min(1e-9))
        attempts[active] += 1
        if callback is not None:
            accepted = torch.zeros(N, dtype=torch.bool, device="cpu")
            accepted[acc] = True
            callback({"step": step, "i": step, "t": schedule.index_at(u), "u": u.clone(), "x": x.to(dtype, copy=True),
                      "accepted": accepted, "error": err, "nfe": nfe.clone()})
        step += 1
    a0, sig0 = schedule.alpha(0), schedule.sigma(0)
    x0, _ = denoised_and_eps(x, e1(x, 0), a0, sig0, data_range)
    nfe += 1
    if callback is not None:
        callback({"step": step, "i": step, "t": 0, "s": DATA, "x": x0.to(dtype), "denoised": x0.to(dtype),
                  "nfe": nfe.clone()})
    return x0.to(dtype), {"nfe": nfe}


SAMPLERS = {"edm-sde": sample_edm_sde, "seeds-2": sample_seeds_2, "seeds-3": sample_seeds_3, "ggf": sample_ggf}
