"""Are a network's higher heads calibrated? Held-out regressions of the realised residual on the heads' moments.

The GMS sampler (https://arxiv.org/abs/2311.00941) fits its mixture to the heads' second and third moments of
the noise given x_t. A head may be unbiased for E[eps^k | x_t] on average and still carry mostly noise in the
central third moment, which is what the fit uses. :func:`calibrate_heads` measures this on held-out data: with
x_t = a_t x_0 + sigma_t eps for held-out x_0 and fresh eps, and the residual r = eps - e1,

    E[r^2 | x_t] = c2 + (E[eps|x_t] - e1)^2,     E[r^3 | x_t] = c3 + (terms in E[eps|x_t] - e1),

with c2 = e2 - e1^2 and c3 = e3 - 3 e1 e2 + 2 e1^3 the heads' central moments. For exact heads the least-squares
slopes of r^2 on c2 and of r^3 on c3 (through the origin) are 1. For heads whose c3 is the truth plus
independent noise, the slope of r^3 on c3 is the factor lambda that makes lambda * c3 the best linear predictor of
the true third moment: the shrinkage the GMS solver's ``skew_scale`` option applies per step
(:meth:`HeadCalibration.skew_scale`).

The regression can also be run on the moments the fit receives on a step once the moments of x_0 given x_t are
bounded for the data's range (``moments="clamped"``: the official code's clamps; ``"feasible"``: made jointly
feasible), to see what the bounds do to the calibration.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..core.moments import DataRange, central_third_moment, check_data_range, transition_moments
from ..core.schedule import DATA, Schedule, StepCoefficients, schedule_for, time_index, trajectory
from ..model_io import (adapt_model, all_finite, call_model, check_model_heads, check_model_signature,
                        check_positive_ints, check_state_tensor, check_time_input, split_heads)

# the heads' own moments, or those of a step whose x_0 moments were bounded for the data's range in one of the forms
# of gms_kernels.core.moments.MOMENT_FORMS (see calibrate_heads)
MOMENTS = ("heads", "clamped", "feasible")
# a central moment whose rms is at most this many units of rounding of the terms it is formed from is unresolved
UNRESOLVED_ULPS = 16


@dataclass(frozen=True)
class CalibrationRow:
    """The regressions at one time index t.

    ``slope2``: least-squares slope (through the origin) of r^2 on c2; ``slope3``: of r^3 on c3; each with its
    percentile bootstrap interval over the held-out images (``interval2``, ``interval3``). ``n``: the number of
    regression points (images x draws x elements per image). ``rms_c2``, ``rms_c3``: root mean squares of the
    heads' central moments. ``slope3`` and ``interval3`` are NaN where the heads carry no skew that their
    precision can resolve (:attr:`skew_defined`); ``slope2`` likewise for the variance."""

    t: int
    slope2: float
    interval2: tuple[float, float]
    slope3: float
    interval3: tuple[float, float]
    n: int
    images: int
    draws: int
    rms_c2: float
    rms_c3: float

    @property
    def skew_defined(self) -> bool:
        return not math.isnan(self.slope3)


@dataclass(frozen=True)
class HeadCalibration:
    """What :func:`calibrate_heads` returns: one :class:`CalibrationRow` per time index (in the order asked), the
    interval ``level``, and which moments were regressed (``moments``, and the ``data_range`` they were bounded
    for and the ``step`` length whose transition moments they are, both None for the heads' own)."""

    rows: tuple[CalibrationRow, ...]
    level: float
    moments: str
    data_range: DataRange
    step: int | None = None

    def row(self, t: int) -> CalibrationRow:
        for r in self.rows:
            if r.t == t:
                return r
        raise KeyError(f"no calibration row for t={t}; the rows are at t = {', '.join(str(r.t) for r in self.rows)}")

    def skew_scale(self, undefined: float = 0.0) -> dict[int, float]:
        """The per-step factors {t: lambda} for the GMS solver's ``skew_scale`` option (and a model's
        ``solver_defaults``): each t's ``slope3`` clipped to [0, 1], so the heads' skew is only ever shrunk
        (a slope above 1, heads that under-state the skew, keeps it as it is). A t whose heads carry no resolvable
        skew (NaN slope) gets ``undefined``: 0 fits a Gaussian there, 1 keeps whatever skew the heads give.
        The sampler needs a factor for every t it visits: calibrate at those t (:func:`trajectory`)."""
        if not (isinstance(undefined, numbers.Real) and 0.0 <= float(undefined) <= 1.0):
            raise ValueError(f"undefined must be a factor in [0, 1], got {undefined!r}")
        return {r.t: float(undefined) if not r.skew_defined else min(max(r.slope3, 0.0), 1.0) for r in self.rows}

    def markdown(self) -> str:
        """The rows as a Markdown table (slopes with their intervals)."""
        pct = f"{100 * self.level:g}%"

        def cell(slope: float, interval: tuple[float, float]) -> str:
            return "undefined" if math.isnan(slope) else f"{slope:.3g} [{interval[0]:.3g}, {interval[1]:.3g}]"

        lines = [f"| t | slope r^2 on c2 [{pct}] | slope r^3 on c3 [{pct}] | rms c2 | rms c3 | images x draws |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {r.t} | {cell(r.slope2, r.interval2)} | {cell(r.slope3, r.interval3)} | {r.rms_c2:.3g} | "
                  f"{r.rms_c3:.3g} | {r.images} x {r.draws} |" for r in self.rows]
        return "\n".join(lines)


def calibrate_heads(model: Any, x_heldout: torch.Tensor, schedule: Schedule | None = None,
                    timesteps: Sequence[int] | None = None, *, draws: int = 8, seed: int = 0,
                    level: float = 0.95, n_boot: int = 2000, batch_size: int = 256, time_input: str | None = None,
                    moments: str = "heads", data_range: DataRange = (-1.0, 1.0),
                    step: int | None = None) -> HeadCalibration:
    """Per time index, the slopes of the realised r^2 on the heads' c2 and of r^3 on c3, with intervals.

    ``model(x_t, t)`` returns the heads [e1, e2, e3] along dim 1, as for ``gk.sample`` (diffusers models are
    adapted as there; ``time_input``: the model's own by default; a network with dropout belongs in eval mode).
    ``x_heldout`` [N, C, ...] (N >= 2): data the model was not trained on, drawn from its training distribution.
    ``schedule``: the model's own by default.
    ``timesteps``: the indices to calibrate at; by default those ``gk.sample`` visits with its defaults
    (10 steps, even trajectory). Every image gets ``draws`` independent noise draws per t, from a CPU
    ``torch.Generator`` seeded by (``seed``, t), so a row does not depend on which other t are asked for.

    The residual r = eps - e1 uses the noise of the x_t the network actually received (x_t rounded to
    x_heldout's dtype), x_t = a_t x_0 + sigma_t eps as :meth:`Schedule.add_noise` forms it. Each slope is
    sum(x y) / sum(x^2) over all elements, draws and images.

    Intervals: a percentile bootstrap over the held-out images (``n_boot`` resamples of the images, with the
    draws and elements of each image kept together). The image is the unit that is independent: the elements
    of one image, and its draws, share one x_0, so treating them as independent would understate the error. The
    slope is a ratio of per-image sums, so a resample costs no network call; the percentile interval follows the
    skewed sampling distribution of that ratio (r^3 is heavy-tailed), which a normal interval around a sandwich
    standard error would not.

    ``moments`` picks the regressors. ``"heads"``: the heads' own e1, c2, c3. ``"clamped"`` and ``"feasible"``:
    the moments the GMS solver fits on the step t -> s = t - ``step`` (s = -1, the data, where that is below 0;
    ``step`` defaults to T // 10, the steps of ``gk.sample``'s default 10), as
    :func:`gms_kernels.core.moments.transition_moments` forms them with the x_0 moments bounded for
    ``data_range`` in that form: the official code's separate clamps (the GMS solver's default) or mean,
    variance and skew of x_0 made jointly feasible. They are mapped back to eps through
    q(x_s|x_t, x_0) = N(c1 x_t + c2 x_0, lam2) and eps = (x_t - a_t x_0) / sigma_t: e1 (so r) from the mean,
    c2 from (Var - lam2) / c2^2, c3 from the central third moment / c2^3. For the feasible moments (and the
    heads') that is the skew of x_0, whatever the step; the clamped ones add 3 (c1 / c2) x_t (E[x_0^2] - E1^2 -
    Var) to it, a term of the step that is non-zero where the clamps of E[x_0^2] and of the variance disagree.

    A t whose heads give c3 no larger than the rounding error of computing it from e1, e2, e3 (at the precision
    of the model's output) has no skew to calibrate: its ``slope3`` is NaN (so for c2). Returns a
    :class:`HeadCalibration`."""
    with torch.no_grad():
        model = adapt_model(model)
        check_model_signature(model)
        check_model_heads(model, 3, "gms")
        x0 = check_state_tensor(x_heldout, "x_heldout")
        if x0.shape[0] < 2:
            raise ValueError(f"x_heldout needs at least 2 images (the intervals resample them), got {x0.shape[0]}")
        if not all_finite(x0):
            raise ValueError("x_heldout has non-finite values (NaN or inf)")
        schedule = schedule_for(model, schedule)
        ts = _check_timesteps(schedule, timesteps)
        draws, batch_size, n_boot = check_positive_ints((draws, batch_size, n_boot), "draws, batch_size and n_boot")
        if n_boot < 100:
            raise ValueError(f"n_boot must be at least 100 (resamples for a percentile interval), got {n_boot}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if not (isinstance(level, numbers.Real) and 0.0 < float(level) < 1.0):
            raise ValueError(f"level must lie in (0, 1) (e.g. 0.95 for 95% intervals), got {level!r}")
        if moments not in MOMENTS:
            raise ValueError(f"moments must be one of {', '.join(map(repr, MOMENTS))}, got {moments!r}")
        data_range = check_data_range(data_range)
        if moments != "heads" and data_range is None:
            raise ValueError(f"moments={moments!r} needs the data's range: pass data_range=(low, high)")
        if step is None:
            step = max(schedule.T // 10, 1)
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 1:
            raise ValueError(f"step must be a positive number of time indices (the step t -> t - step), got {step!r}")
        step = int(step)
        time_input = check_time_input(time_input or getattr(model, "time_input", "index"))
        rows = tuple(_row(model, x0, schedule, t, draws, int(seed), float(level), n_boot, batch_size, time_input,
                          moments, data_range, schedule.coefficients(t, t - step if t >= step else DATA))
                     for t in ts)
        if moments == "heads":
            return HeadCalibration(rows, float(level), moments, None)
        return HeadCalibration(rows, float(level), moments, data_range, step)


def _check_timesteps(schedule: Schedule, timesteps: Sequence[int] | None) -> list[int]:
    if timesteps is None:
        return trajectory(schedule, 10)
    if torch.is_tensor(timesteps):
        timesteps = timesteps.reshape(-1).tolist()
    if isinstance(timesteps, (str, bytes)) or not hasattr(timesteps, "__iter__"):
        raise TypeError(f"timesteps must be a sequence of time indices, got {type(timesteps).__name__}")
    ts = [time_index(t, "every timestep") for t in timesteps]
    if not ts:
        raise ValueError("timesteps must name at least one time index")
    if any(not 0 <= t < schedule.T for t in ts):
        raise ValueError(f"timesteps must lie in [0, T - 1 = {schedule.T - 1}], got {ts}")
    if len(set(ts)) != len(ts):
        raise ValueError(f"timesteps must not repeat an index, got {ts}")
    return ts


def _row(model: Any, x0: torch.Tensor, schedule: Schedule, t: int, draws: int, seed: int, level: float,
         n_boot: int, batch_size: int, time_input: str, moments: str, data_range: DataRange,
         k: StepCoefficients) -> CalibrationRow:
    """One :class:`CalibrationRow`: per-image sums of x y and x^2 for both regressions, then the ratios."""
    a, sigma = schedule.alpha(t), schedule.sigma(t)
    # one stream per (seed, t): the noise draws, then the bootstrap's resamples
    generator = torch.Generator(device="cpu").manual_seed(seed * schedule.T + t)
    n_images = x0.shape[0]
    sums = torch.zeros(4, n_images, dtype=torch.float64)  # sum x2 y2, x2^2, x3 y3, x3^2 per image
    squares = [0.0] * 4  # sum c2^2, c3^2 and the squared rounding scales of c2, c3
    resolution = None
    for _ in range(draws):
        for start in range(0, n_images, batch_size):
            batch = x0[start:start + batch_size]
            clean = batch.to(torch.float64)
            eps = torch.randn(batch.shape, dtype=torch.float64, generator=generator).to(batch.device)
            x_t = schedule.add_noise(clean, eps, t).to(batch.dtype)
            out = call_model(model, x_t, t, schedule.T, time_input)
            if torch.is_tensor(out) and out.dim() >= 2 and out.shape[1] < 3 * x_t.shape[1]:
                raise ValueError(f"calibrate_heads needs the three heads [e1, e2, e3] ({3 * x_t.shape[1]} output "
                                 f"channels for {x_t.shape[1]}-channel data), but the model gave {out.shape[1]}")
            e1, e2, e3 = (h.to(torch.float64) for h in split_heads(out, x_t, 3, "gms", f"at t={t} "))
            if resolution is None:
                resolution = torch.finfo(out.dtype).eps
            x_t = x_t.to(torch.float64)
            eps = (x_t - a * clean) / sigma  # (the noise of the x_t the network saw)
            c2 = e2 - e1 * e1
            c3 = central_third_moment(e1, c2, e3)
            squares[2] += float((e2.abs() + e1 * e1).square().sum())
            squares[3] += float((e3.abs() + 3 * (e1 * e2).abs() + 2 * e1.abs() ** 3).square().sum())
            if moments != "heads":
                e1, c2, c3 = _step_eps_moments(x_t, e1, e2, e3, k, moments, data_range)
            squares[0] += float(c2.square().sum())
            squares[1] += float(c3.square().sum())
            r = eps - e1
            rows = slice(start, start + batch.shape[0])
            for i, (x, y) in enumerate(((c2, r * r), (c3, r**3))):
                sums[2 * i, rows] += (x * y).flatten(1).sum(1).cpu()
                sums[2 * i + 1, rows] += (x * x).flatten(1).sum(1).cpu()
    n = draws * x0.numel()
    # (c is unresolved when its rms is within a few roundings, at the output's precision, of the terms it is
    # formed from: e.g. heads whose e3 is 3 e1 e2 - 2 e1^3 up to rounding)
    defined = [squares[i] > (UNRESOLVED_ULPS * resolution) ** 2 * squares[i + 2] for i in (0, 1)]
    fits = [_slope(sums[2 * i], sums[2 * i + 1], defined[i], level, n_boot, generator) for i in (0, 1)]
    return CalibrationRow(t, fits[0][0], fits[0][1], fits[1][0], fits[1][1], n, n_images, draws,
                          math.sqrt(squares[0] / n), math.sqrt(squares[1] / n))


def _step_eps_moments(x_t: torch.Tensor, e1: torch.Tensor, e2: torch.Tensor, e3: torch.Tensor, k: StepCoefficients,
                      moments: str, data_range: DataRange) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, c2, c3) of eps given x_t that the moments of the step ``k`` (x_0 moments bounded in the form
    ``moments``) stand for. With x_s = c1 x_t + c2 x_0 + sqrt(lam2) z: x_0's mean is (M1 - c1 x_t) / c2, its
    variance (Var - lam2) / c2^2 and its third central moment kappa3 / c2^3; with x_0 = (x_t - sigma eps) / a,
    eps's mean is (x_t - a E[x_0]) / sigma, its variance (a / sigma)^2 Var[x_0], its third central moment
    -(a / sigma)^3 times x_0's."""
    fitted = transition_moments(x_t, e1, e2, e3, k, data_range, moments=moments)
    a, sigma = k.a_t, k.sigma_t
    mean = (fitted.m1 - k.c1 * x_t) / k.c2
    var = (fitted.var - k.lam2) / k.c2**2
    kappa3 = central_third_moment(fitted.m1, fitted.var, fitted.m3) / k.c2**3
    ratio = a / sigma
    return (x_t - a * mean) / sigma, ratio**2 * var, -ratio**3 * kappa3


def _slope(xy: torch.Tensor, xx: torch.Tensor, defined: bool, level: float, n_boot: int,
           generator: torch.Generator) -> tuple[float, tuple[float, float]]:
    """sum(xy) / sum(xx) from per-image sums, with the percentile bootstrap interval over the images."""
    nan = float("nan")
    if not defined:
        return nan, (nan, nan)
    n = xy.numel()
    ratios = []
    chunk = max(1, (1 << 22) // n)  # (resamples per block: at most ~4M indices at once)
    for start in range(0, n_boot, chunk):
        pick = torch.randint(n, (min(chunk, n_boot - start), n), generator=generator)
        ratios.append(xy[pick].sum(1) / xx[pick].sum(1))
    tail = (1.0 - level) / 2
    low, high = torch.nanquantile(torch.cat(ratios), torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    return float(xy.sum() / xx.sum()), (low, high)
