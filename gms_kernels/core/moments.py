"""Moments of the reverse transition q(x_s | x_t) from the noise heads (step 2 of the pipeline).

The heads give e1 = E[eps|x_t], e2 = E[eps^2|x_t], e3 = E[eps^3|x_t] per element. With
x_0 = (x_t - sigma_t eps)/a_t they give the moments of q(x_0|x_t) (Eq. (29) of the GMS paper,
https://arxiv.org/abs/2311.00941), and with q(x_s|x_t,x_0) = N(c1 x_t + c2 x_0, lam2) the moments of
q(x_s|x_t) (its Eqs. (26), (27) and (28)).

``data_range`` bounds the moments of q(x_0|x_t) in one of two forms (``moments``, :data:`MOMENT_FORMS`): "clamped",
the clamps of the official GMS code (https://github.com/Guohanzhong/GMS), applied to the moments of the data
normalised to [-1, 1] by that range, or "feasible", (mean, Var, kappa3) made jointly feasible for data in that range;
``None`` switches them all off.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from .schedule import StepCoefficients

DataRange = tuple[float, float] | None

# the forms of the moments of q(x_0|x_t) that transition_moments gives: the official code's separate clamps
# (clamp_x0_moments) or the jointly feasible moments (feasible_x0_moments)
MOMENT_FORMS = ("clamped", "feasible")


@dataclass
class X0Moments:
    """Moments of q(x_0 | x_t): mean, central variance and raw second/third moments."""

    mean: torch.Tensor
    var: torch.Tensor
    m2: torch.Tensor | None = None
    m3: torch.Tensor | None = None


@dataclass
class TransitionMoments:
    """Moments of q(x_s | x_t): mean M1, central variance Var and raw third moment M3."""

    m1: torch.Tensor
    var: torch.Tensor | None = None
    m3: torch.Tensor | None = None


def check_data_range(data_range: DataRange) -> DataRange:
    if data_range is None:
        return None
    try:
        lo, hi = (float(v) for v in data_range)
    except (TypeError, ValueError):
        raise ValueError(f"data_range must be None or a pair (low, high), got {data_range!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"data_range must satisfy low < high with finite ends, got {data_range!r}")
    return lo, hi


def check_moments(moments: str) -> str:
    """``moments``: one of :data:`MOMENT_FORMS`, else a ValueError naming them."""
    if not isinstance(moments, str) or moments not in MOMENT_FORMS:
        raise ValueError(f"moments must be one of {', '.join(map(repr, MOMENT_FORMS))} (the official code's "
                         f"separate clamps, or mean, variance and skew made jointly feasible for data_range), "
                         f"got {moments!r}")
    return moments


def check_pixel_levels(levels: int | None) -> int | None:
    """``pixel_levels``: the number of values a pixel takes in the data, an integer >= 2, or None (no cap)."""
    if levels is None:
        return None
    if isinstance(levels, bool) or not isinstance(levels, numbers.Integral) or levels < 2:
        raise ValueError(f"pixel_levels must be an integer >= 2 (the number of values a pixel takes in the data: "
                         f"256 for 8-bit images) or None (no cap on the last step's variance; null on the command "
                         f"line), got {levels!r}")
    return int(levels)


def _half_width(data_range: tuple[float, float]) -> float:
    return (data_range[1] - data_range[0]) / 2


def x0_moments(x_t: torch.Tensor, e1: torch.Tensor, e2: torch.Tensor | None, e3: torch.Tensor | None,
               a_t: float, sigma_t: float) -> X0Moments:
    """Moments of q(x_0|x_t) by expanding x_0 = (x_t - sigma_t eps)/a_t (Eq. (29)).

    E[x0]   = (x_t - sigma e1)/a
    Var[x0] = sigma^2/a^2 (e2 - e1^2)                      (written so, to avoid cancellation)
    E[x0^2] = (x_t^2 - 2 x_t sigma e1 + sigma^2 e2)/a^2
    E[x0^3] = (x_t^3 - 3 x_t^2 sigma e1 + 3 x_t sigma^2 e2 - sigma^3 e3)/a^3
    """
    r = sigma_t / a_t
    mean = (x_t - sigma_t * e1) / a_t
    var = m2 = m3 = None
    if e2 is not None:
        var = r * r * central_moments(e1, e2)[0]
        m2 = (x_t * x_t - 2 * sigma_t * x_t * e1 + sigma_t**2 * e2) / a_t**2
    if e3 is not None:
        m3 = (x_t**3 - 3 * sigma_t * x_t**2 * e1 + 3 * sigma_t**2 * x_t * e2 - sigma_t**3 * e3) / a_t**3
    return X0Moments(mean, var, m2, m3)


def clamp_x0_moments(m: X0Moments, data_range: DataRange) -> X0Moments:
    """The official code's clamps for data in [-1, 1], applied after normalising by ``data_range``.

    E[y] -> [-1, 1]; Var[y] -> [0, 1]; E[y^2] -> [0, 1]; E[y^3] replaced by E[y] where
    |E[y^3]| > |E[y]|, then -> [-1, 1]; with y = (x_0 - centre)/half_width.
    """
    if data_range is None:
        return m
    c, h = sum(data_range) / 2, _half_width(data_range)
    mean_y = ((m.mean - c) / h).clamp(-1.0, 1.0)
    mean = c + h * mean_y
    var = None if m.var is None else (m.var / h**2).clamp(0.0, 1.0) * h**2
    m2 = m3 = None
    if m.m2 is not None:
        # raw moments of y from raw moments of x_0 (binomial expansion), clamped, mapped back
        m2_y = ((m.m2 - 2 * c * m.mean + c * c) / h**2).clamp(0.0, 1.0)
        m2 = c * c + 2 * c * h * mean_y + h * h * m2_y
        if m.m3 is not None:
            m3_y = (m.m3 - 3 * c * m.m2 + 3 * c * c * m.mean - c**3) / h**3
            m3_y = torch.where(m3_y.abs() > mean_y.abs(), mean_y, m3_y).clamp(-1.0, 1.0)
            m3 = c**3 + 3 * c * c * h * mean_y + 3 * c * h * h * m2_y + h**3 * m3_y
    return X0Moments(mean, var, m2, m3)


def clamped_x0_mean(x_t: torch.Tensor, e1: torch.Tensor, a_t: float | torch.Tensor, sigma_t: float | torch.Tensor,
                    data_range: DataRange) -> torch.Tensor:
    """The clamped E[x0|x_t]: (x_t - sigma_t e1) / a_t (:func:`x0_moments`), clamped into ``data_range`` as the
    official code clamps it (:func:`clamp_x0_moments`; ``None``: not clamped). Every solver's x0 estimate."""
    return clamp_x0_moments(x0_moments(x_t, e1, None, None, a_t, sigma_t), data_range).mean


def first_moment(x_t: torch.Tensor, x0_mean: torch.Tensor, k: StepCoefficients) -> torch.Tensor:
    """M1 = E[x_s|x_t] = c1 x_t + c2 E[x0|x_t] (Eq. (26))."""
    return k.c1 * x_t + k.c2 * x0_mean


def second_central_moment(x0_var: torch.Tensor, k: StepCoefficients) -> torch.Tensor:
    """Var = lam2 + c2^2 Var[x0|x_t], the SN-DDPM variance (Eq. (27))."""
    return k.lam2 + k.c2**2 * x0_var


def third_raw_moment(x_t: torch.Tensor, x0: X0Moments, m1: torch.Tensor, k: StepCoefficients) -> torch.Tensor:
    """M3 = E[x_s^3|x_t] = E[(c1 x_t + c2 x0)^3] + 3 lam2 M1 (Eq. (28))."""
    c1x = k.c1 * x_t
    cube = c1x**3 + 3 * c1x**2 * k.c2 * x0.mean + 3 * c1x * k.c2**2 * x0.m2 + k.c2**3 * x0.m3
    return cube + 3 * k.lam2 * m1


def transition_moments(x_t: torch.Tensor, e1: torch.Tensor, e2: torch.Tensor | None, e3: torch.Tensor | None,
                       k: StepCoefficients, data_range: DataRange = (-1.0, 1.0),
                       x0_var: torch.Tensor | None = None, moments: str = "clamped") -> TransitionMoments:
    """(M1, Var, M3) of q(x_s|x_t) from as many heads as are given, the moments of q(x_0|x_t) bounded by
    ``data_range`` in the form ``moments`` names.

    ``moments="clamped"`` (the official code's): the separate clamps of :func:`clamp_x0_moments`. With
    ``data_range``, Var[x0|x_t] is clamped to [0, half_width^2], so Var lies in [lam2, lam2 + c2^2 half_width^2].
    (The official code also clamps Var itself to [0, 1]; for data in [-1, 1] that never binds, since
    lam2 + c2^2 <= 1. Scaled to half_width^2 it would cut the unit-scale posterior noise lam2 of narrower
    ranges, so it is not applied.)
    ``moments="feasible"``: :func:`feasible_x0_moments`, the mean, Var and kappa3 of x_0 made jointly feasible for
    data in ``data_range`` (moments that are feasible already pass unchanged, bit for bit); it needs the e2 head.
    With ``data_range=None`` both forms leave the moments as the heads give them.

    ``x0_var`` overrides Var[x0|x_t] (Analytic-DPM's isotropic estimate needs only e1).
    """
    check_moments(moments)
    m = x0_moments(x_t, e1, e2, e3, k.a_t, k.sigma_t)
    if x0_var is not None:
        m.var = x0_var
    if moments == "clamped":
        m = clamp_x0_moments(m, data_range)
    elif data_range is not None:
        m = feasible_x0_moments(m, data_range)
    m1 = first_moment(x_t, m.mean, k)
    var = m3 = None
    if m.var is not None:
        var = second_central_moment(m.var, k)
    if m.m3 is not None:
        m3 = third_raw_moment(x_t, m, m1, k)
    return TransitionMoments(m1, var, m3)


def central_third_moment(m1: torch.Tensor, var: torch.Tensor, m3: torch.Tensor) -> torch.Tensor:
    """kappa3 = E[(x - M1)^3] = M3 - 3 M1 Var - M1^3 from the raw third moment M3."""
    return m3 - 3 * m1 * var - m1**3


def central_moments(m1: torch.Tensor, m2: torch.Tensor,
                    m3: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(Var, kappa3) from the raw moments E[x], E[x^2], E[x^3]: Var = M2 - M1^2 and
    kappa3 = :func:`central_third_moment` (None without M3). The inverse of :func:`raw_moments`."""
    var = m2 - m1 * m1
    return var, None if m3 is None else central_third_moment(m1, var, m3)


def raw_moments(m1: torch.Tensor, var: torch.Tensor,
                kappa3: torch.Tensor | float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(E[x^2], E[x^3]) from the mean M1, the variance and the central third moment kappa3 (the binomial
    expansion of (M1 + r)^n with E[r] = 0): M2 = M1^2 + Var, M3 = M1^3 + 3 M1 Var + kappa3 (None without
    kappa3). The inverse of :func:`central_moments`."""
    m2 = m1 * m1 + var
    return m2, None if kappa3 is None else m1**3 + 3 * m1 * var + kappa3


def scale_spread(mom: TransitionMoments, scale: float) -> TransitionMoments:
    """(M1, scale * Var, M3') with the central third moment scaled by scale^1.5: the same mean and shape
    (standardized skewness kappa3 / Var^1.5), ``scale`` times the variance. SN-DDPM's ``variance_scale``
    (Var * c) and GMS with the same scaling use it; scale = 1 returns ``mom``."""
    if scale == 1.0 or mom.var is None:
        return mom
    var = scale * mom.var
    kappa3 = None if mom.m3 is None else scale**1.5 * central_third_moment(mom.m1, mom.var, mom.m3)
    return TransitionMoments(mom.m1, var, raw_moments(mom.m1, var, kappa3)[1])


def last_step_variance_cap(data_range: DataRange, clip_pixel: float = 1.0, levels: int | None = 256) -> float | None:
    """Upper bound of the variance of the step into s = 0 in the official code:
    (clip_pixel * one pixel level * sqrt(pi/2))^2, a pixel level being (high - low) / (levels - 1), the step between
    two of the ``levels`` values a pixel takes in the data (256, the official code's, for 8-bit images; 17 for
    scikit-learn's digits). None (no cap) for ``data_range=None`` or ``levels=None``."""
    levels = check_pixel_levels(levels)
    if data_range is None or levels is None:
        return None
    level = (data_range[1] - data_range[0]) / (levels - 1)
    return (clip_pixel * level * math.sqrt(math.pi / 2)) ** 2


def third_moment_bounds(mean: torch.Tensor, var: torch.Tensor,
                        data_range: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """The least and the greatest third central moment of a distribution on [lo, hi] = ``data_range`` with mean
    ``mean`` and variance ``var`` (elementwise; for a feasible pair lo <= mean <= hi, 0 <= var <= a b, with
    a = mean - lo and b = hi - mean the room below and above the mean).

    Why these bounds are sharp: write y = x - mean, so y lies in [-a, b], E[y] = 0 and E[y^2] = var. With
    d = var / b, the cubic g(y) = (y - b)(y + d)^2 is a square times a factor that is <= 0 on the whole range,
    so E[g(y)] <= 0. Expanding, E[g(y)] = E[y^3] + (2d - b) var - b d^2 = E[y^3] - var (b - var / b), hence
    E[y^3] <= var (b - var / b). Equality needs all the mass on the roots of g: the two-point law on
    {mean - d, hi} with weight d / (b + d) at hi, which has the right mean and variance and lies in the range
    exactly when d <= a, i.e. var <= a b. Mirrored (y -> -y), the least value is -var (a - var / a), attained
    by the two-point law on {lo, mean + var / a}. Where a or b is 0 the variance must be 0 and both bounds are 0.
    """
    lo, hi = data_range
    a, b = mean - lo, hi - mean
    return -var * (a - _safe_ratio(var, a)), var * (b - _safe_ratio(var, b))


def _safe_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den where den > 0, else 0 (the bounds' var / a and var / b, whose numerator is then 0 too)."""
    positive = den > 0
    return torch.where(positive, num / torch.where(positive, den, torch.ones_like(den)), torch.zeros_like(num))


def feasible_moments(mean: torch.Tensor, var: torch.Tensor, kappa3: torch.Tensor | None,
                     data_range: DataRange) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(mean, var, kappa3) made jointly feasible for data in ``data_range`` = (lo, hi), elementwise: moments that
    some distribution on [lo, hi] has. In turn: the mean is clipped into [lo, hi]; the variance into
    [0, (mean - lo)(hi - mean)] (the Bhatia-Davis bound, for the clipped mean); the third central moment kappa3
    into :func:`third_moment_bounds` for that mean and variance. Every bound is attained, so each clip moves a
    value only as far as the range forces it, and feasible inputs come back unchanged, bit for bit. For
    ``data_range=None`` (unbounded data) only the variance is clipped at 0, and kappa3 set to 0 where it is 0.

    Used on the moments of q(x_0|x_t) (see :func:`feasible_x0_moments`), in place of the official code's
    separate clamps of the mean, variance and raw moments (:func:`clamp_x0_moments`), which can give a skew
    that no head produced. ``kappa3=None`` (two heads) returns None for it. The inputs must be finite
    floating-point tensors of broadcastable shapes (a NaN stays NaN)."""
    for name, value in (("mean", mean), ("var", var), ("kappa3", kappa3)):
        if value is not None and not (torch.is_tensor(value) and value.is_floating_point()):
            raise TypeError(f"feasible_moments: {name} must be a floating-point tensor, got "
                            f"{getattr(value, 'dtype', type(value).__name__)}")
    data_range = check_data_range(data_range)
    if data_range is None:
        var = var.clamp_min(0.0)
        return mean, var, None if kappa3 is None else torch.where(var > 0, kappa3, torch.zeros_like(kappa3))
    lo, hi = data_range
    mean = mean.clamp(lo, hi)
    var = torch.minimum(var.clamp_min(0.0), (mean - lo) * (hi - mean))
    if kappa3 is None:
        return mean, var, None
    least, greatest = third_moment_bounds(mean, var, data_range)
    return mean, var, torch.maximum(torch.minimum(kappa3, greatest), least)


def feasible_x0_moments(m: X0Moments, data_range: DataRange) -> X0Moments:
    """:func:`feasible_moments` applied to the moments of q(x_0|x_t) (mean, var and the central third moment
    of m.m3). Where it moved a value, the raw moments are rebuilt from the result (m2 = var + mean^2,
    m3 = kappa3 + 3 mean var + mean^3), so that the transition's moments (:func:`third_raw_moment`) carry
    exactly that skew; elsewhere m.m2 and m.m3 are kept as they are, so feasible moments change nothing."""
    if m.var is None or m.m2 is None:
        raise ValueError("feasible_x0_moments needs the variance of x_0 (the e2 head)")
    kappa3 = None if m.m3 is None else central_third_moment(m.mean, m.var, m.m3)
    mean, var, feasible3 = feasible_moments(m.mean, m.var, kappa3, data_range)
    moved = (mean != m.mean) | (var != m.var)
    raw2, raw3 = raw_moments(mean, var, feasible3)
    m2 = torch.where(moved, raw2, m.m2)
    m3 = None
    if feasible3 is not None:
        m3 = torch.where(moved | (feasible3 != kappa3), raw3, m.m3)
    return X0Moments(mean, var, m2, m3)
