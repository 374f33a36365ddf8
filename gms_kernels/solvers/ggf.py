"""Gotta Go Fast (Jolicoeur-Martineau et al. 2021, Algorithm 1): ``ggf``, the reverse VP SDE with adaptive steps, each
sample stepping on its own (a loop of its own; its network calls vary from sample to sample: read the callback's
``nfe``). The network sees the grid index nearest to a sample's noise level, and the noise comes from the Philox
streams (a Brownian path per sample, :class:`BrownianTree`, or a fresh normal per proposal).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..core.moments import DataRange
from ..core.random import STREAM_ADAPTIVE, STREAM_BROWNIAN, SampleNoise
from ..core.schedule import DATA, Schedule
from .base import EpsFn, Solver, SolverOptions, denoised_and_eps, real, register


@dataclass(frozen=True)
class GGFOptions(SolverOptions):
    """Algorithm 1 with its code's defaults: tolerances ``eps_abs`` (about 1/128 of a [-1, 1] range) and ``eps_rel``,
    the first step ``h_init`` in u in [0, 1], the exponent r (``exponent``) and the safety factor theta (``safety``)
    of the step-size update; ``max_attempts`` bounds the proposals per sample (the noise counter allows 65535);
    ``noise``: "brownian" (one fixed Brownian path per sample, unbiased) or "redraw" (Algorithm 1's fresh z per
    proposal, biased by the accept/reject decisions; see :func:`sample_ggf`)."""

    eps_abs: float = 0.0078
    eps_rel: float = 0.01
    h_init: float = 0.01
    exponent: float = 0.9
    safety: float = 0.9
    max_attempts: int = 2000
    noise: str = "brownian"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("eps_abs", real(self.eps_abs, "eps_abs", 0.0, math.inf, "GGF's absolute tolerance", open_low=True))
        self._set("eps_rel", real(self.eps_rel, "eps_rel", 0.0, math.inf, "GGF's relative tolerance"))
        self._set("h_init", real(self.h_init, "h_init", 0.0, 1.0, "GGF's first step in u in [0, 1]", open_low=True))
        self._set("exponent", real(self.exponent, "exponent", 0.0, 1.0, "GGF's step-size exponent r", open_low=True))
        self._set("safety", real(self.safety, "safety", 0.0, 1.0, "GGF's safety factor theta", open_low=True))
        m = self.max_attempts
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or not 1 <= m <= 65535:
            raise ValueError(f"max_attempts must be an integer in [1, 65535] (GGF's proposals per sample), got {m!r}")
        self._set("max_attempts", int(m))
        if self.noise not in ("brownian", "redraw"):
            raise ValueError(f"noise must be 'brownian' or 'redraw' (GGF's Brownian increments), got {self.noise!r}")


def _view(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-sample [N] tensor shaped to broadcast against x [N, ...]."""
    return v.reshape(-1, *([1] * (x.dim() - 1))).to(x.device)


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


@torch.no_grad()
def sample_ggf(e1: EpsFn, x: torch.Tensor, ts: Sequence[int], schedule: Schedule, noise: SampleNoise,
               data_range: DataRange, o: GGFOptions, callback: Callable[[dict], None] | None = None,
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
    h = torch.full((N,), o.h_init, dtype=torch.float64, device="cpu")
    x_prev = x.clone()  # x' of the last accepted proposal
    score = torch.zeros_like(x)
    fresh = torch.zeros(N, dtype=torch.bool, device="cpu")  # score holds the score at (x, u)
    attempts = torch.zeros(N, dtype=torch.int64, device="cpu")
    nfe = torch.zeros(N, dtype=torch.int64, device="cpu")
    path = BrownianTree(noise, shape, x.device) if o.noise == "brownian" else None
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
        if int(attempts[active].max()) >= o.max_attempts:
            raise ValueError(f"GGF needed more than max_attempts={o.max_attempts} proposals for a sample: "
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
        delta = torch.maximum(torch.full_like(x1, o.eps_abs), o.eps_rel * torch.maximum(x1.abs(), x_prev[active].abs()))
        err = ((x1 - x2) / delta).pow(2).reshape(len(active), -1).mean(1).sqrt().cpu()  # (decisions on the host)
        ok = err <= 1.0
        acc = active[ok]
        x[acc], x_prev[acc], u[acc] = x2[ok], x1[ok], ua[ok] - ha[ok]
        if path is not None:
            w_now[acc] = w_next[ok]
        fresh[acc] = False
        factor = o.safety * err.clamp_min(1e-12).pow(-o.exponent)
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


class GGF(Solver):
    name, heads, Options = "ggf", 1, GGFOptions
    calls_per_step = None

    def loop(self, e1, x, ts, schedule, noise, data_range, o, callback=None, progress=False):
        return sample_ggf(e1, x, ts, schedule, noise, data_range, o, callback, progress)


register(GGF())
