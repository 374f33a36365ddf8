"""GMS, the Gaussian mixture solver (Guo et al., NeurIPS 2023, https://arxiv.org/abs/2311.00941): fit the mixture of two
Gaussians w1 N(mu1, s2) + w2 N(mu2, s2) of Eq. (9) to the first three moments of the reverse transition (Eqs. (26)-(28))
by the generalized method of moments (Eq. (8); the fitted objective is Eq. (31)) and sample it (Algorithm 2)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch

from ..core.fit import (ADAN_MEANS, DEFAULT_WEIGHTS, LR_RANGE, PAPER_LR_TABLES, MixtureParams, adan_learning_rates,
                        check_fit_iters, check_var_floor, check_weights, fit_adan, fit_closed)
from ..core.mixture import check_select, sample_mixture
from ..core.moments import (DataRange, TransitionMoments, central_third_moment, check_moments, scale_spread,
                            transition_moments)
from ..core.schedule import StepCoefficients
from ..kernels import ADAN_FP32_MAX_ITERS, MODE_ADAN, MODE_CLOSED, FusedStepConfig
from .base import LastStepOptions, Solver, StepRandomness, learned_gaussian, real, register
from .sn_ddpm import gaussian_config

FITS = ("closed", "adan")
# the fused kernels' ADAN loop: None is the backends' default (float32, with out-of-range elements
# refitted in float64); the float64 torch reference ignores it
ADAN_PRECISIONS = (None, "float32", "float64")
# the options GMSScheduler and the command line take as arguments of their own (the rest go in solver_options /
# --option KEY=VALUE)
ARGUMENT_OPTIONS = ("preset", "fit", "select", "fit_iters")


def check_skew_scale(value: Any) -> float | dict[int, float]:
    """``skew_scale``: a number in [0, 100], or a mapping from time indices (non-negative integers) to such
    numbers (one factor per step, looked up by the step's t)."""
    what = "the factor on the fit's central third moment kappa3"
    if isinstance(value, dict):
        if not value:
            raise ValueError("skew_scale as a mapping needs at least one entry {t: factor}")
        out = {}
        for key, v in value.items():
            t = int(key) if isinstance(key, str) and key.strip().isdigit() else key  # (JSON keys are strings)
            if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
                raise ValueError(f"skew_scale's keys must be time indices (non-negative integers, or their digits "
                                 f"as a string), got {key!r}")
            if int(t) in out:
                raise ValueError(f"skew_scale has two factors for t={int(t)}: give one per time index")
            out[int(t)] = real(v, f"skew_scale[{key}]", 0.0, 100.0, what)
        return out
    return real(value, "skew_scale", 0.0, 100.0, what + " (or a mapping {t: factor})")


@dataclass(frozen=True)
class GMSOptions(LastStepOptions):
    """The fit: ``fit`` "closed" (the moment equations solved, :func:`~gms_kernels.core.fit.fit_closed`) or "adan"
    (Eq. (31) minimised by ADAN for ``fit_iters`` iterations at learning rate ``lr``, a number or one of the paper's
    schedules of Eq. (44) and Table 7; the
    loss's mean over each sample or the whole batch, ``adan_mean``); the mixture's ``weights`` (w1, w2) and the floor
    on s2 relative to lam2, ``var_floor``; ``select`` "pixel" draws one component per element (the default: the
    equal-tuning protocol's choice among the options the fused kernels run), "sample" one per sample (the official
    code); ``adan_precision`` picks the fused kernels' ADAN loop (None: their default).

    ``variance_scale`` c fits (M1, c Var, c^1.5 kappa3): the same shape, c times the spread. ``skew_threshold``
    tau > 0 is the paper's threshold (its appendix: optimize only where the transition kernel is far from Gaussian):
    elements whose standardized skewness |kappa3| / Var^1.5 is at most tau draw from N(M1, Var). ``skew_scale``
    lambda fits (M1, Var, lambda kappa3): the skew shrunk towards the Gaussian, mean and variance kept; a mapping
    {t: lambda} gives each step its own factor. The threshold reads the scaled skew. ``moments``: the form of the
    moments of x_0 bounded by the data range (:data:`~gms_kernels.core.moments.MOMENT_FORMS`): "clamped", the
    official code's separate clamps, or "feasible", mean, variance and kappa3 made jointly feasible, so that the fit
    receives no more skew than data in the range can have. ``preset``: a named option set (:attr:`GMS.presets`)."""

    fit: str = "closed"
    select: str = "pixel"
    weights: tuple[float, float] = DEFAULT_WEIGHTS
    fit_iters: int = 25
    lr: float | str = 0.06
    var_floor: float = 0.1
    adan_mean: str = "sample"
    adan_precision: str | None = None
    variance_scale: float = 1.0
    skew_threshold: float = 0.0
    skew_scale: float | dict[int, float] = 1.0
    moments: str = "clamped"
    preset: str | None = None
    torch_only: ClassVar[Mapping[str, Any]] = {"variance_scale": 1.0, "skew_threshold": 0.0, "skew_scale": 1.0,
                                               "moments": "clamped"}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fit not in FITS:
            raise ValueError(f"unknown fit {self.fit!r}; valid: {', '.join(FITS)}")
        if self.adan_precision not in ADAN_PRECISIONS:
            raise ValueError(f"unknown adan_precision {self.adan_precision!r}; valid: "
                             f"{', '.join(map(repr, ADAN_PRECISIONS))} (None: the backend's default)")
        check_select(self.select)
        self._set("weights", check_weights(self.weights))
        self._set("var_floor", check_var_floor(self.var_floor))
        self._set("fit_iters", check_fit_iters(self.fit_iters))
        if isinstance(self.lr, str):
            if self.lr not in PAPER_LR_TABLES:
                raise ValueError(f"unknown lr {self.lr!r}; use a number or one of {', '.join(PAPER_LR_TABLES)}")
        else:
            self._set("lr", real(self.lr, "lr", *LR_RANGE, "ADAN's learning rate"))
        if self.adan_mean not in ADAN_MEANS:
            raise ValueError(f"adan_mean must be one of {', '.join(ADAN_MEANS)}, got {self.adan_mean!r}")
        self._set("variance_scale", real(self.variance_scale, "variance_scale", 0.0, 100.0, "the factor on Var",
                                         open_low=True))
        self._set("skew_threshold", real(self.skew_threshold, "skew_threshold", 0.0, math.inf,
                                         "the standardized skewness at or below which GMS draws a Gaussian"))
        self._set("skew_scale", check_skew_scale(self.skew_scale))
        check_moments(self.moments)
        if self.preset is not None and self.preset not in GMS.presets:
            raise ValueError(f"unknown preset {self.preset!r} for solver 'gms'; valid: {', '.join(GMS.presets)}")


def skew_scale_at(skew_scale: float | dict[int, float], t: int) -> float:
    """The factor on kappa3 of the step from t: ``skew_scale`` itself, or its entry for t (a mapping)."""
    if not isinstance(skew_scale, dict):
        return skew_scale
    if t not in skew_scale:
        raise ValueError(f"skew_scale has no factor for the step from t={t} (it has t = "
                         f"{', '.join(map(str, sorted(skew_scale)))}): give one for every t the sampler visits")
    return skew_scale[t]


def scale_skew(mom: TransitionMoments, scale: float) -> TransitionMoments:
    """(M1, Var, M3') whose central third moment, taken with Var clamped at 0 as the fits take it, is ``scale``
    times the original one; scale = 1 returns ``mom``."""
    if scale == 1.0:
        return mom
    kappa3 = central_third_moment(mom.m1, mom.var.clamp_min(0.0), mom.m3)
    return TransitionMoments(mom.m1, mom.var, mom.m3 + (scale - 1.0) * kappa3)


def gms_from_moments(mom: TransitionMoments, k: StepCoefficients, rand: StepRandomness, o: GMSOptions,
                     data_range: DataRange, T: int) -> tuple[torch.Tensor, dict]:
    """The GMS step (every option) from the transition moments (M1, Var, M3) as
    :func:`~gms_kernels.core.moments.transition_moments` forms them (a caller may change them first)."""
    mom = scale_spread(mom, o.variance_scale)
    if k.s == 0 and o.gaussian_last_step:
        return learned_gaussian(mom, k, rand, o, data_range)
    mom = scale_skew(mom, skew_scale_at(o.skew_scale, k.t))
    if o.fit == "closed":
        p = fit_closed(mom, o.weights, o.var_floor)
    else:
        p = fit_adan(mom, o.weights, o.fit_iters, o.lr, k.t, T, o.adan_mean)
    info = {"m1": mom.m1, "var": mom.var, "m3": mom.m3}
    if o.skew_threshold > 0.0:
        var = mom.var.clamp_min(0.0)
        skew = central_third_moment(mom.m1, var, mom.m3).abs()
        gaussian = skew <= o.skew_threshold * var**1.5
        p = MixtureParams(torch.where(gaussian, mom.m1, p.mu1), torch.where(gaussian, mom.m1, p.mu2),
                          torch.where(gaussian, var, p.s2))
        info["gaussian"] = gaussian
    x_s = sample_mixture(p, o.weights, rand.normal(), rand.uniform(o.select == "pixel"))
    return x_s, dict(info, mu1=p.mu1, mu2=p.mu2, s2=p.s2)


class GMS(Solver):
    name, heads, Options = "gms", 3, GMSOptions
    label, in_paper = "GMS", True
    # "official": what the official GMS code runs: 70 ADAN iterations at a constant lr 0.06, the loss's mean over the
    # whole batch, one component per image, its separate clamps of the moments, the Gaussian last step with the
    # variance cap of one 8-bit pixel level
    presets = {"official": {"fit": "adan", "fit_iters": 70, "lr": 0.06, "adan_mean": "batch", "select": "sample",
                            "variance_scale": 1.0, "skew_threshold": 0.0, "skew_scale": 1.0, "moments": "clamped",
                            "gaussian_last_step": True, "denoise_final": True, "clip_pixel": 1.0,
                            "pixel_levels": 256}}
    # the variants a model's own choice is made among: the closed fit per image and per pixel, each with a mixture
    # on the last step too, the paper's skew threshold, a long ADAN fit per pixel, and the official preset
    candidates = {
        "closed, per image": {"fit": "closed", "select": "sample"},
        "closed, per pixel": {"fit": "closed", "select": "pixel"},
        "closed, per image, GMS on the last step": {"fit": "closed", "select": "sample", "gaussian_last_step": False},
        "closed, per image, skew threshold 0.05": {"fit": "closed", "select": "sample", "skew_threshold": 0.05},
        "closed, per pixel, GMS on the last step": {"fit": "closed", "select": "pixel", "gaussian_last_step": False},
        "adan-70, per pixel": {"fit": "adan", "select": "pixel", "fit_iters": 70},
        "official": {"preset": "official"},
    }

    def step(self, x_t: torch.Tensor, heads: list[torch.Tensor], k: StepCoefficients, rand: StepRandomness,
             o: GMSOptions, data_range: DataRange, T: int) -> tuple[torch.Tensor, dict]:
        return gms_from_moments(transition_moments(x_t, heads[0], heads[1], heads[2], k, data_range,
                                                   moments=o.moments), k, rand, o, data_range, T)

    def heads_read(self, k: StepCoefficients, o: GMSOptions) -> int:
        """The Gaussian last step reads e1 and e2."""
        if k.s == 0 and o.gaussian_last_step:
            return 2
        return super().heads_read(k, o)

    def fused_config(self, k, data_range, o, T, batch, per_sample, scalars) -> FusedStepConfig:
        if k.s == 0 and o.gaussian_last_step:
            return gaussian_config(k, data_range, o, scalars)
        w1 = float(o.weights[0])
        per_pixel = o.select == "pixel"
        if o.fit == "closed":
            return FusedStepConfig(mode=MODE_CLOSED, w1=w1, var_floor=float(o.var_floor), per_pixel=per_pixel,
                                   **scalars)
        count = per_sample * (batch if o.adan_mean == "batch" else 1)
        if o.adan_precision is None:  # the backend's default, which is float32, for loops float32 follows closely
            adan_fp64 = True if o.fit_iters > ADAN_FP32_MAX_ITERS else None
        else:
            adan_fp64 = o.adan_precision == "float64"
        return FusedStepConfig(mode=MODE_ADAN, w1=w1, per_pixel=per_pixel,
                               lrs=tuple(adan_learning_rates(o.fit_iters, o.lr, k.t, T)),
                               grad_scale=2.0 / max(count, 1), adan_fp64=adan_fp64, **scalars)


register(GMS())
