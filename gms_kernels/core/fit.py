"""Fitting the two-component mixture p(x_s|x_t) = w1 N(mu1, s2) + w2 N(mu2, s2) to (M1, Var, M3)
(step 3 of the pipeline; Eq. (9) of the GMS paper, https://arxiv.org/abs/2311.00941, with the objective
of its Eq. (31)).

Two fits:
- :func:`fit_closed`: the exact moment match (not in the paper or its code), with a variance floor.
- :func:`fit_adan`: the paper's optimiser as the official code (https://github.com/Guohanzhong/GMS) runs it,
  in its parameterisation
  (mu1, mu2, beta) with s2 = beta * Var, init (M1, M1 - 1e-3, 0.998), beta clamped to
  [0.1, 1.2], ADAN betas (0.9, 0.92, 0.92), eps 1e-8; the gradient is written out per element.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

import torch

from .moments import TransitionMoments, central_third_moment

DEFAULT_WEIGHTS = (1.0 / 3.0, 2.0 / 3.0)
# fit_closed: below this standardized skewness |kappa3| / Var^1.5 the component gap delta is linear
# in kappa3 instead of its cube root (see fit_closed). csrc/gms_step.cpp (kSkewKnee) holds the same
# number; the Triton kernel reads knee_delta2 from its scalar table.
SKEW_KNEE = 1e-2
ADAN_BETAS = (0.9, 0.92, 0.92)
ADAN_EPS = 1e-8
ADAN_INIT_BETA = 0.998
ADAN_INIT_GAP = 1e-3
ADAN_BETA_BOUNDS = (0.1, 1.2)
# what the loss's mean runs over: each sample's elements (batch-independent) or the whole batch (official)
ADAN_MEANS = ("sample", "batch")
# The learning rates accepted, by every backend alike: far beyond the paper's 0.04-0.16 either way,
# and within what the float32 fit of the fused kernels follows (it is far off at lr 1e4, NaN at 1e10)
LR_RANGE = (1e-10, 100.0)
# the paper's Table 7: (lr high, lr low, min lr, warm-up iterations)
PAPER_LR_TABLES = {"paper": (0.16, 0.12, 0.1, 18), "paper-imagenet64": (0.1, 0.06, 0.04, 18)}


@dataclass
class MixtureParams:
    """Per-element parameters of the fitted kernel: component means and shared variance."""

    mu1: torch.Tensor
    mu2: torch.Tensor
    s2: torch.Tensor


def check_weights(weights: Sequence[float]) -> tuple[float, float]:
    try:
        w1, w2 = (float(w) for w in weights)
    except (TypeError, ValueError):
        raise ValueError(f"weights must be a pair (w1, w2), got {weights!r}") from None
    if not (w1 > 0 and w2 > 0 and abs(w1 + w2 - 1) < 1e-9):
        raise ValueError(f"weights must be positive and sum to 1, got {weights!r}")
    if w1 == w2:
        raise ValueError("equal weights cannot match a third moment: use unequal weights such as (1/3, 2/3)")
    return w1, w2


def check_var_floor(var_floor: float) -> float:
    """The closed fit's variance floor, a real number in [0, 1] (a fraction of Var)."""
    if isinstance(var_floor, bool) or not isinstance(var_floor, numbers.Real) or not 0.0 <= var_floor <= 1.0:
        raise ValueError(f"var_floor must be a number in [0, 1] (a fraction of Var), got {var_floor!r}")
    return float(var_floor)


# far above any useful count (the paper runs 25-70 iterations), and low enough that a mistyped count fails at
# once instead of running for hours on the torch reference
MAX_FIT_ITERS = 10_000


def check_fit_iters(iters: int) -> int:
    """ADAN's iteration count, an integer in [0, MAX_FIT_ITERS]."""
    if isinstance(iters, bool) or not isinstance(iters, numbers.Integral) or not 0 <= iters <= MAX_FIT_ITERS:
        raise ValueError(f"fit_iters must be an integer in [0, {MAX_FIT_ITERS}] (ADAN's iterations; the paper "
                         f"uses 25-70), got {iters!r}")
    return int(iters)


def mixture_raw_moments(p: MixtureParams, weights: Sequence[float]) -> tuple[torch.Tensor, ...]:
    """First three raw moments of w1 N(mu1, s2) + w2 N(mu2, s2) (the model side of Eq. (31))."""
    w1, w2 = weights
    g1 = w1 * p.mu1 + w2 * p.mu2
    g2 = w1 * p.mu1**2 + w2 * p.mu2**2 + p.s2
    g3 = w1 * (p.mu1**3 + 3 * p.mu1 * p.s2) + w2 * (p.mu2**3 + 3 * p.mu2 * p.s2)
    return g1, g2, g3


def moment_residuals(p: MixtureParams, mom: TransitionMoments, weights: Sequence[float]) -> tuple[torch.Tensor, ...]:
    """Raw-moment errors (g1 - M1, g2 - (M1^2 + Var), g3 - M3) of Eq. (31) with W = I."""
    g1, g2, g3 = mixture_raw_moments(p, weights)
    return g1 - mom.m1, g2 - (mom.m1**2 + mom.var), g3 - mom.m3


def fit_closed(mom: TransitionMoments, weights: Sequence[float] = DEFAULT_WEIGHTS,
               var_floor: float = 0.1) -> MixtureParams:
    """Exact moment match of (M1, Var, M3) in closed form, Lipschitz in the moments near zero skew.

    With delta = mu1 - mu2 and kappa3 = M3 - 3 M1 Var - M1^3 (central third moment):
    kappa3 = w1 w2 (w2 - w1) delta^3, Var = s2 + w1 w2 delta^2, M1 = w1 mu1 + w2 mu2.
    Where s2 would fall below ``var_floor * Var`` it is held there and |delta| shrinks so that
    M1 and Var still match exactly (the skew is then matched as far as the floor allows).

    The knee: the exact delta = cbrt(kappa3 / (w1 w2 (w2 - w1))) has an infinite slope at kappa3 =
    0, so a skew that is noise (the float32 rounding of the heads, a network's last-bit differences
    between batch sizes, thread counts or backends) moved every pixel of a sample by O(cbrt(noise))
    sd, and with ``select="sample"`` those moves grew through the following steps. Where the
    standardized skewness g = kappa3 / Var^1.5 is below ``SKEW_KNEE`` (1e-2) in size, delta is
    instead the straight line through 0 that meets the cube root at |g| = SKEW_KNEE: delta = kappa3
    / (u knee_delta2 Var) with u = w1 w2 (w2 - w1) and knee_delta2 = (SKEW_KNEE / |u|)^(2/3) (0.263
    at the default weights: the knee's delta is 0.513 sd). delta / sd is then a continuous function
    of g with slope at most 1 / (|u| knee_delta2) (51.3 at the default weights; the cube root's
    slope is a third of that at the knee and falls above it), and of all odd functions so bounded it
    stays closest to the cube root. M1 and Var are still matched exactly; below the knee the
    mixture's standardized third moment is g^3 / SKEW_KNEE^2 instead of g, off by at most 2 / (3
    sqrt 3) SKEW_KNEE = 3.85e-3 (at |g| = SKEW_KNEE / sqrt 3), which puts the kernel within 5.3e-4
    in total variation of the exact fit's. Skews that small are below what the heads resolve
    reproducibly: on the embedded digits model (K = 50) a one-ulp change of x_t, or batch 1 instead
    of 64, moves g by up to 1.6e-3 (99th percentile 2.7e-5).
    """
    w1, w2 = check_weights(weights)
    var_floor = check_var_floor(var_floor)
    m1, var = mom.m1, mom.var.clamp_min(0.0)
    kappa3 = central_third_moment(m1, var, mom.m3)
    q = kappa3 / (w1 * w2 * (w2 - w1))
    delta = _cbrt(q)
    # below the knee (|delta| < knee_delta, i.e. |g| < SKEW_KNEE): the straight line (q / knee_delta^2)
    knee2 = knee_delta2(w1) * var
    below = delta * delta < knee2  # (False for Var = 0 and for NaN)
    delta = torch.where(below, q / torch.where(below, knee2, 1.0), delta)
    s2 = var - w1 * w2 * delta**2
    floor = var_floor * var
    too_skewed = s2 < floor
    s2 = torch.where(too_skewed, floor, s2)
    max_delta = ((var - floor).clamp_min(0.0) / (w1 * w2)).sqrt()
    delta = torch.where(too_skewed, torch.sign(delta) * max_delta, delta)
    return MixtureParams(m1 + w2 * delta, m1 - w1 * delta, s2)


def knee_delta2(w1: float) -> float:
    """(delta / sd)^2 at the knee of fit_closed: (SKEW_KNEE / (w1 w2 (w2 - w1)))^(2/3), w2 = 1 - w1."""
    w2 = 1.0 - w1
    skew_unit = abs(w1 * w2 * (w2 - w1))
    if skew_unit == 0.0:
        return 0.0
    return (SKEW_KNEE / skew_unit) ** (2.0 / 3.0)


def _cbrt(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * x.abs().pow(1.0 / 3.0)


def adan_learning_rates(iters: int, lr: float | str = 0.06, t: int | None = None,
                        T: int | None = None) -> list[float]:
    """Learning rate of each ADAN iteration.

    A number in ``LR_RANGE`` is used as a constant (the official code: 0.06). ``"paper"`` / ``"paper-imagenet64"``
    give the paper's Table 7: base = max(high - iota_t*high, low) with
    iota_t = ((T - t)/T)^2, a linear warm-up over 18 iterations, then cosine decay to min lr.
    """
    if isinstance(lr, str):
        if lr not in PAPER_LR_TABLES:
            raise ValueError(f"unknown lr {lr!r}; use a number or one of {', '.join(PAPER_LR_TABLES)}")
        if t is None or T is None:
            raise ValueError("the paper's learning-rate table needs the time index t and T")
        high, low, min_lr, warmup = PAPER_LR_TABLES[lr]
        iota = ((T - t) / T) ** 2
        base = max(high - iota * high, low)
        rates = []
        for k in range(1, iters + 1):
            if k <= warmup:
                rates.append(k / warmup * base)
            else:
                cos = 0.5 * (1 + math.cos(math.pi * (k - warmup) / max(iters - warmup, 1)))
                rates.append(max(cos * base, min_lr))
        return rates
    lr = float(lr)
    if not LR_RANGE[0] <= lr <= LR_RANGE[1]:
        raise ValueError(f"lr must be a number in [{LR_RANGE[0]:g}, {LR_RANGE[1]:g}], got {lr}")
    return [lr] * iters


def fit_adan(mom: TransitionMoments, weights: Sequence[float] = DEFAULT_WEIGHTS, iters: int = 25,
             lr: float | str = 0.06, t: int | None = None, T: int | None = None,
             mean_over: str = "sample") -> MixtureParams:
    """The paper's ADAN fit of Eq. (31), as the official code runs it.

    The official loss is the mean of the squared raw-moment errors over the whole batch, so the
    gradient of each element is scaled by 1/(N*D); through ADAN's eps that makes the fit depend on
    the batch size. ``mean_over="sample"`` (default) scales by 1/D instead, which keeps each sample
    independent of its batch; ``"batch"`` is the official behaviour.
    """
    w1, w2 = check_weights(weights)
    iters = check_fit_iters(iters)
    if mean_over not in ADAN_MEANS:
        raise ValueError(f"mean_over must be one of {', '.join(ADAN_MEANS)}, got {mean_over!r}")
    rates = adan_learning_rates(iters, lr, t, T)
    m1, var, m3 = mom.m1, mom.var, mom.m3
    target2 = m1**2 + var
    count = m1.numel() if mean_over == "batch" else m1[0].numel()
    scale = 2.0 / max(count, 1)

    mu1, mu2 = m1.clone(), m1 - ADAN_INIT_GAP
    beta = torch.full_like(m1, ADAN_INIT_BETA)
    params = [mu1, mu2, beta]
    b1, b2, b3 = ADAN_BETAS
    m = [torch.zeros_like(m1) for _ in params]
    v = [torch.zeros_like(m1) for _ in params]
    n = [torch.zeros_like(m1) for _ in params]
    prev = None
    for k, lr_k in enumerate(rates, start=1):
        s2 = beta * var
        g1 = w1 * mu1 + w2 * mu2
        r1 = g1 - m1
        r2 = w1 * mu1**2 + w2 * mu2**2 + s2 - target2
        r3 = w1 * (mu1**3 + 3 * mu1 * s2) + w2 * (mu2**3 + 3 * mu2 * s2) - m3
        grads = [
            scale * w1 * (r1 + 2 * mu1 * r2 + 3 * (mu1**2 + s2) * r3),
            scale * w2 * (r1 + 2 * mu2 * r2 + 3 * (mu2**2 + s2) * r3),
            scale * var * (r2 + 3 * g1 * r3),
        ]
        for i, (p, g) in enumerate(zip(params, grads)):
            d = torch.zeros_like(g) if prev is None else g - prev[i]
            m[i].mul_(b1).add_(g, alpha=1 - b1)
            v[i].mul_(b2).add_(d, alpha=1 - b2)
            n[i].mul_(b3).add_((g + b2 * d) ** 2, alpha=1 - b3)
            denom = n[i].sqrt() / math.sqrt(1 - b3**k) + ADAN_EPS
            p.sub_(lr_k / (1 - b1**k) * m[i] / denom + lr_k * b2 / (1 - b2**k) * v[i] / denom)
        beta.clamp_(*ADAN_BETA_BOUNDS)
        prev = grads
    return MixtureParams(mu1, mu2, beta * var)
