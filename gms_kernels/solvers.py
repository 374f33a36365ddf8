"""One reverse step x_t -> x_s of every solver (step 5 of the pipeline).

Each solver is a small function of (x_t, heads, step coefficients, randomness, options) working in
float64, registered with the number of heads it reads and its options. :func:`solver_step` adds
the official code's last-step behaviour shared by all of them.
"""
from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .kernels.dispatch import fused_step
from .core.fit import (ADAN_MEANS, DEFAULT_WEIGHTS, LR_RANGE, PAPER_LR_TABLES, MixtureParams, check_fit_iters,
                  check_var_floor, check_weights, fit_adan, fit_closed)
from .kernels import MODE_ADAN, MODE_CLOSED, FusedStepConfig, NonFiniteInput, make_config
from .core.mixture import check_select, sample_mixture
from .model_io import check_inputs_finite
from .core.moments import (DataRange, TransitionMoments, central_third_moment, clamp_x0_moments, last_step_variance_cap,
                      scale_spread, transition_moments, x0_moments)
from .core.devices import as_tensor_on
from .core.random import STREAM_COMPONENT, STREAM_STEP_NOISE, SampleNoise
from .core.schedule import DATA, StepCoefficients

FITS = ("closed", "adan")
# the fused kernels' ADAN loop: None is the backends' default (float32, with out-of-range elements
# refitted in float64); the float64 torch reference ignores it
ADAN_PRECISIONS = (None, "float32", "float64")


class StepRandomness:
    """The random numbers of one step, drawn on first use (deterministic solvers draw none).

    Explicit ``noise`` (like x_t) and ``uniform`` ([N] or like x_t) override the Philox streams.
    """

    def __init__(self, source: SampleNoise | None, t: int, like: torch.Tensor,
                 noise: torch.Tensor | None = None, uniform: torch.Tensor | None = None):
        self.source, self.t, self.like = source, t, like
        self._noise, self._uniform = noise, uniform

    @property
    def shares_streams(self) -> bool:
        """True when all randomness comes from the Philox source (so a fused kernel can draw it)."""
        return self.source is not None and self._noise is None and self._uniform is None

    def _require_source(self, what: str) -> SampleNoise:
        if self.source is None:
            raise ValueError(f"this step needs {what}: pass a generator/seed or explicit {what}")
        return self.source

    def normal(self) -> torch.Tensor:
        if self._noise is None:
            src = self._require_source("noise")
            self._noise = src.normal(STREAM_STEP_NOISE, self.t, self.like.shape[1:], self.like.device)
        return self._noise.to(device=self.like.device, dtype=torch.float64)

    def uniform(self, per_element: bool) -> torch.Tensor:
        if self._uniform is None:
            src = self._require_source("uniform")
            shape = self.like.shape[1:] if per_element else ()
            self._uniform = src.uniform(STREAM_COMPONENT, self.t, shape, self.like.device)
        return self._uniform.to(device=self.like.device)


@dataclass(frozen=True)
class Solver:
    name: str
    heads: int  # how many of [e1, e2, e3] the solver reads
    step: Callable[..., tuple[torch.Tensor, dict]]
    options: dict[str, Any] = field(default_factory=dict)
    doc: str = ""
    # several network calls per step (EDM-SDE, SEEDS-2, GGF): no per-step form, gk.sample runs its own
    # loop (gms_kernels.sde); gk.step and GMSScheduler refuse it
    multi_call: bool = False


LAST_STEP_OPTIONS = {"gaussian_last_step": True, "denoise_final": True, "clip_pixel": 1.0}
# EDM (Karras et al. 2022) Table 5, the stochastic sampler's settings for VP models
EDM_SDE_DEFAULTS = {"s_churn": 30.0, "s_tmin": 0.01, "s_tmax": 1.0, "s_noise": 1.007}
# Gotta Go Fast (Jolicoeur-Martineau et al. 2021) Alg. 1 with its code's defaults: tolerances (eps_abs ~ 1/128 of
# a [-1, 1] range),
# first step h_init in u in [0, 1], the exponent r and the safety factor theta of the step-size update;
# max_attempts bounds the proposals per sample (the noise counter allows 65535)
# noise: "brownian" (one fixed Brownian path per sample, unbiased) or "redraw" (Alg. 1's fresh z per proposal,
# biased by the accept/reject decisions; see gms_kernels.sde.sample_ggf)
GGF_DEFAULTS = {"eps_abs": 0.0078, "eps_rel": 0.01, "h_init": 0.01, "exponent": 0.9, "safety": 0.9,
                "max_attempts": 2000, "noise": "brownian"}


def _gaussian(m1: torch.Tensor, var: torch.Tensor | float, rand: StepRandomness) -> torch.Tensor:
    std = var.clamp_min(0.0).sqrt() if torch.is_tensor(var) else math.sqrt(max(var, 0.0))
    return m1 + std * rand.normal()


def _learned_gaussian(mom: TransitionMoments, k: StepCoefficients, rand: StepRandomness,
                      o: dict) -> tuple[torch.Tensor, dict]:
    """N(M1, Var); the step into s = 0 caps Var like the official code."""
    var = mom.var
    cap = last_step_variance_cap(o["data_range"], o["clip_pixel"]) if k.s == 0 else None
    if cap is not None:
        var = var.clamp(0.0, cap)
    return _gaussian(mom.m1, var, rand), {"m1": mom.m1, "var": var}


def ddpm_step(x_t, heads, k, rand, o):
    """DDPM with the posterior variance beta~ = lam2 ("fixed small"). ``variance_interp`` v in [0, 1]
    interpolates in log space towards beta_{t|s} ("fixed large"), lam2^(1 - v) beta_{t|s}^v: Improved
    DDPM's Eq. 15 (Nichol & Dhariwal 2021) with a constant v instead of a learned one (v = 1 is 'ddpm-large')."""
    m1 = transition_moments(x_t, heads[0], None, None, k, o["data_range"]).m1
    v = o["variance_interp"]
    var = k.lam2 if v == 0.0 else k.lam2 ** (1.0 - v) * k.beta_ts**v
    return _gaussian(m1, var, rand), {"m1": m1, "var": var}


def ddpm_large_step(x_t, heads, k, rand, o):
    """DDPM with variance beta_{t|s} ("fixed large")."""
    m1 = transition_moments(x_t, heads[0], None, None, k, o["data_range"]).m1
    return _gaussian(m1, k.beta_ts, rand), {"m1": m1}


def sn_ddpm_step(x_t, heads, k, rand, o):
    """SN-DDPM: N(M1, Var) with Var from the eps^2 head (paper appendix Eq. second); ``variance_scale`` c
    samples N(M1, c Var) instead (the variance-scaled control of issue 20)."""
    return sn_ddpm_from_moments(transition_moments(x_t, heads[0], heads[1], None, k, o["data_range"]), k, rand, o)


def sn_ddpm_from_moments(mom: TransitionMoments, k: StepCoefficients, rand: StepRandomness,
                         o: dict) -> tuple[torch.Tensor, dict]:
    """The SN-DDPM step from the transition moments as :func:`~gms_kernels.core.moments.transition_moments` forms
    them (a caller may change them first, as python/quality_benchmark.py's excess-variance rows do)."""
    return _learned_gaussian(scale_spread(mom, o["variance_scale"]), k, rand, o)


def check_gamma(gamma: Any, T: int | None = None) -> None:
    """analytic-dpm's ``gamma``: a 1-D table of Gamma_t, one real number per time index (NaN where not estimated),
    as :func:`gms_kernels.sampling.estimate_gamma` returns it; ``T`` (if known) is the length it must have."""
    fix = "estimate it with gk.estimate_gamma(model, x0, schedule)"
    try:
        table = as_tensor_on(gamma)
    except (TypeError, ValueError, RuntimeError):
        table = None
    if table is None or table.dim() != 1 or table.is_complex() or table.dtype == torch.bool:
        got = f"shape {tuple(table.shape)} {table.dtype}" if table is not None else f"{type(gamma).__name__} {gamma!r:.40}"
        raise ValueError(f"gamma must be a 1-D table of real numbers, one per time index (T entries), got {got}: {fix}")
    if T is not None and table.numel() != T:
        raise ValueError(f"gamma has {table.numel()} entries but the schedule has T = {T} time indices: {fix} "
                         "on this schedule")


def analytic_x0_variance(o: dict, k: StepCoefficients) -> float:
    """Analytic-DPM's isotropic Var[x0|x_t] = sigma_t^2/a_t^2 (1 - Gamma_t), Gamma from the ``gamma`` table
    (also the C++ kernel's variance, gms_kernels.kernels.make_config)."""
    gamma = o["gamma"]
    if gamma is None:
        raise ValueError("solver 'analytic-dpm' needs gamma=<table>: estimate it with "
                         "gk.estimate_gamma(model, x0, schedule, timesteps)")
    g = float(as_tensor_on(gamma, torch.float64)[k.t])
    if not math.isfinite(g):
        raise ValueError(f"the gamma table has no value at t={k.t}: estimate it on this trajectory")
    return (k.sigma_t / k.a_t) ** 2 * (1.0 - g)


def analytic_dpm_step(x_t, heads, k, rand, o):
    """Analytic-DPM: Var[x0|x_t] = sigma_t^2/a_t^2 (1 - Gamma_t), isotropic, Gamma from a table."""
    x0_var = torch.full_like(x_t, analytic_x0_variance(o, k))
    mom = transition_moments(x_t, heads[0], None, None, k, o["data_range"], x0_var=x0_var)
    return _learned_gaussian(mom, k, rand, o)


def ddim_scales(k: StepCoefficients, eta: float) -> tuple[float, float]:
    """DDIM's (eps scale sqrt(sigma_s^2 - eta^2 lam2), noise variance eta^2 lam2) (also the C++ kernel's)."""
    eta2_lam2 = eta**2 * k.lam2
    return math.sqrt(max(k.sigma_s**2 - eta2_lam2, 0.0)), eta2_lam2


def ddim_step(x_t, heads, k, rand, o):
    """DDIM (Song et al. 2021, Eq. 12): a_s x0 + sqrt(sigma_s^2 - eta^2 lam2) eps + eta sqrt(lam2) z."""
    x0 = transition_moments(x_t, heads[0], None, None, denoise_coefficients(k), o["data_range"]).m1  # clamped E[x0|x_t]
    eps = (x_t - k.a_t * x0) / k.sigma_t
    eps_scale, eta2_lam2 = ddim_scales(k, o["eta"])
    x_s = k.a_s * x0 + eps_scale * eps
    if eta2_lam2 > 0:
        x_s = x_s + math.sqrt(eta2_lam2) * rand.normal()
    return x_s, {"x0": x0}


def gms_step(x_t, heads, k, rand, o):
    """GMS: fit w1 N(mu1, s2) + w2 N(mu2, s2) to (M1, Var, M3) and sample it (paper Alg. sampling).

    ``variance_scale`` c fits (M1, c Var, c^1.5 kappa3) instead: the same shape, c times the spread
    (:func:`~gms_kernels.core.moments.scale_spread`). ``skew_threshold`` tau > 0 is the paper's threshold (appendix,
    "optimizing only when the disparity between the reverse transition kernel and Gaussian exceeds it"): elements
    whose standardized skewness |kappa3| / Var^1.5 is at most tau draw from N(M1, Var) instead of the mixture.
    ``skew_scale`` lambda fits (M1, Var, lambda kappa3) instead: the heads' skew shrunk (lambda < 1) towards the
    Gaussian, mean and variance kept; a mapping {t: lambda} gives each step its own factor (issue 20's
    noise-aware fit: lambda(t) from regressing exact kappa3 on the heads'). The threshold reads the scaled skew."""
    return gms_from_moments(transition_moments(x_t, heads[0], heads[1], heads[2], k, o["data_range"]), k, rand, o)


def gms_from_moments(mom: TransitionMoments, k: StepCoefficients, rand: StepRandomness,
                     o: dict) -> tuple[torch.Tensor, dict]:
    """The GMS step (:func:`gms_step`, every option) from the transition moments (M1, Var, M3) as
    :func:`~gms_kernels.core.moments.transition_moments` forms them (a caller may change them first)."""
    mom = scale_spread(mom, o["variance_scale"])
    if k.s == 0 and o["gaussian_last_step"]:
        return _learned_gaussian(mom, k, rand, o)
    mom = scale_skew(mom, skew_scale_at(o["skew_scale"], k.t))
    if o["fit"] == "closed":
        p = fit_closed(mom, o["weights"], o["var_floor"])
    else:
        p = fit_adan(mom, o["weights"], o["fit_iters"], o["lr"], k.t, o["T"], o["adan_mean"])
    info = {"m1": mom.m1, "var": mom.var, "m3": mom.m3}
    if o["skew_threshold"] > 0.0:
        var = mom.var.clamp_min(0.0)
        skew = central_third_moment(mom.m1, var, mom.m3).abs()
        gaussian = skew <= o["skew_threshold"] * var**1.5
        p = MixtureParams(torch.where(gaussian, mom.m1, p.mu1), torch.where(gaussian, mom.m1, p.mu2),
                          torch.where(gaussian, var, p.s2))
        info["gaussian"] = gaussian
    x_s = sample_mixture(p, o["weights"], rand.normal(), rand.uniform(o["select"] == "pixel"))
    return x_s, dict(info, mu1=p.mu1, mu2=p.mu2, s2=p.s2)


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
            out[int(t)] = _real(v, f"skew_scale[{key}]", 0.0, 100.0, what)
        return out
    return _real(value, "skew_scale", 0.0, 100.0, what + " (or a mapping {t: factor})")


def exact_step(x_t, heads, k, rand, o):
    """The exact reverse kernel of Gaussian-mixture data (needs oracle=GaussianMixtureOracle)."""
    oracle = o["oracle"]
    if oracle is None or not hasattr(oracle, "exact_step"):
        raise ValueError("solver 'exact' needs oracle=<gk.GaussianMixtureOracle> (gk.sample passes the "
                         "model when it is one)")
    return oracle.exact_step(x_t, k, rand.uniform(False), rand.normal()), {}


def denoised_and_eps(x_t: torch.Tensor, e1: torch.Tensor, a_t: float | torch.Tensor, sigma_t: float | torch.Tensor,
                     data_range: DataRange) -> tuple[torch.Tensor, torch.Tensor]:
    """(E[x0|x_t] clamped to ``data_range``, the eps it implies): the denoiser D and the noise estimate the
    sigma-space samplers (SEEDS, EDM, GGF) use. With ``data_range=None`` eps is e1 itself; with a range, eps is
    recomputed from the clamped x0, as DDIM does here, so every solver sees the same clamped x0 estimate.
    ``a_t``/``sigma_t`` may be tensors broadcasting against x_t (per-sample times)."""
    x0 = clamp_x0_moments(x0_moments(x_t, e1, None, None, a_t, sigma_t), data_range).mean
    return x0, (e1 if data_range is None else (x_t - a_t * x0) / sigma_t)


def seeds_1_step(x_t, heads, k, rand, o):
    """SEEDS-1 (Gonzalez et al. 2023; the first-order exponential integrator of the VP reverse SDE in the noise
    prediction, also DPM-Solver++'s SDE-DPM-Solver-1). With lambda = log(a / sigma) and h = lambda_s - lambda_t > 0:

        x_s = (a_s / a_t) x_t - 2 sigma_s (e^h - 1) eps(x_t, t) + sigma_s sqrt(e^{2h} - 1) z,

    the noise term being the exact Ito integral of the linear part (variance sigma_s^2 (e^{2h} - 1)).
    ``prediction="data"`` integrates the same SDE written with the data prediction x0 instead (SEEDS' data
    prediction mode, DPM-Solver++'s SDE form):

        x_s = (sigma_s / sigma_t) e^{-h} x_t + a_s (1 - e^{-2h}) x0(x_t, t) + sigma_s sqrt(1 - e^{-2h}) z,

    which is exactly the DDPM posterior step (solver 'ddpm'). The step to data returns the denoised mean, as every
    solver here does."""
    x0, eps = denoised_and_eps(x_t, heads[0], k.a_t, k.sigma_t, o["data_range"])
    if k.s == DATA:
        return x0, {"x0": x0}
    eh = (k.sigma_t / k.a_t) / (k.sigma_s / k.a_s)  # e^h = exp(lambda_s - lambda_t)
    if o["prediction"] == "data":
        x_s = (k.sigma_s / k.sigma_t) / eh * x_t + k.a_s * (1.0 - eh**-2) * x0
        return x_s + k.sigma_s * math.sqrt(1.0 - eh**-2) * rand.normal(), {"x0": x0}
    x_s = (k.a_s / k.a_t) * x_t - 2.0 * k.sigma_s * (eh - 1.0) * eps
    return x_s + k.sigma_s * math.sqrt(eh * eh - 1.0) * rand.normal(), {"x0": x0}


def _multi_call_step(x_t, heads, k, rand, o):
    raise ValueError("this solver makes several network calls per step and has no one-step form: "
                     "use gk.sample(..., solver=...)")


def denoise_coefficients(k: StepCoefficients) -> StepCoefficients:
    """Coefficients of t -> data (from step t -> s), whose M1 is E[x0|x_t]."""
    return StepCoefficients(t=k.t, s=DATA, a_t=k.a_t, sigma_t=k.sigma_t, a_s=1.0, sigma_s=0.0,
                            a_ts=k.a_t, beta_ts=k.sigma_t**2, c1=0.0, c2=1.0, lam2=0.0)


SOLVERS: dict[str, Solver] = {
    s.name: s for s in [
        Solver("ddpm", 1, ddpm_step, dict(LAST_STEP_OPTIONS, variance_interp=0.0)),
        Solver("ddpm-large", 1, ddpm_large_step, dict(LAST_STEP_OPTIONS)),
        Solver("sn-ddpm", 2, sn_ddpm_step, dict(LAST_STEP_OPTIONS, variance_scale=1.0)),
        Solver("ddim", 1, ddim_step, dict(LAST_STEP_OPTIONS, eta=0.0)),
        Solver("analytic-dpm", 1, analytic_dpm_step, dict(LAST_STEP_OPTIONS, gamma=None)),
        Solver("gms", 3, gms_step, dict(LAST_STEP_OPTIONS, fit="closed", select="sample",
                                         weights=DEFAULT_WEIGHTS, fit_iters=25, lr=0.06,
                                         var_floor=0.1, adan_mean="sample", adan_precision=None,
                                         variance_scale=1.0, skew_threshold=0.0, skew_scale=1.0,
                                         preset=None)),
        Solver("exact", 0, exact_step, {"oracle": None}),
        Solver("seeds-1", 1, seeds_1_step, {"prediction": "noise"}),
        # sample()-only solvers; their loops are in gms_kernels.sde (the recommended settings as defaults)
        Solver("edm-sde", 1, _multi_call_step, EDM_SDE_DEFAULTS, multi_call=True),
        Solver("seeds-2", 1, _multi_call_step, {"r": 0.5, "prediction": "noise"}, multi_call=True),
        Solver("seeds-3", 1, _multi_call_step, {"prediction": "noise"}, multi_call=True),
        Solver("ggf", 1, _multi_call_step, GGF_DEFAULTS, multi_call=True),
    ]
}


# Named option sets under the caller's own options. "official": what the official GMS code runs (reference-notes
# 2): 70 ADAN iterations at a constant lr 0.06, the loss's mean over the whole batch, one component per image,
# the Gaussian last step with the pixel-level variance cap.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "gms": {"official": {"fit": "adan", "fit_iters": 70, "lr": 0.06, "adan_mean": "batch", "select": "sample",
                         "variance_scale": 1.0, "skew_threshold": 0.0, "skew_scale": 1.0, **LAST_STEP_OPTIONS}},
}


def get_solver(name: str) -> Solver:
    if name not in SOLVERS:
        raise ValueError(f"unknown solver {name!r}; valid solvers: {', '.join(SOLVERS)}")
    return SOLVERS[name]


def resolve_options(solver: Solver, options: dict[str, Any], T: int | None = None) -> dict[str, Any]:
    """Defaults merged with the user's options, each checked: the one validation every backend
    relies on (the fused kernels take the resolved values as they are). ``T``, the schedule's length where
    the caller knows it, also checks tables indexed by time (analytic-dpm's ``gamma``)."""
    if not isinstance(options, dict):
        raise TypeError(f"solver options must be a dict {{name: value}}, got {type(options).__name__}")
    unknown = sorted(set(options) - set(solver.options))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for solver {solver.name!r}; "
                         f"valid: {', '.join(solver.options) or 'none'}")
    o = dict(solver.options)
    if options.get("preset") is not None:
        presets = PRESETS.get(solver.name, {})
        if options["preset"] not in presets:
            raise ValueError(f"unknown preset {options['preset']!r} for solver {solver.name!r}; valid: "
                             f"{', '.join(presets) or 'none'}")
        o.update(presets[options["preset"]])  # under the options the caller names
    o.update(options)
    for name in ("gaussian_last_step", "denoise_final"):
        if name in o and not isinstance(o[name], bool):
            raise ValueError(f"{name} must be True or False, got {o[name]!r}")
    if "clip_pixel" in o:
        o["clip_pixel"] = _real(o["clip_pixel"], "clip_pixel", 0.0, math.inf, "the last step's std cap in pixel levels",
                                open_low=True)
    if "fit" in o and o["fit"] not in FITS:
        raise ValueError(f"unknown fit {o['fit']!r}; valid: {', '.join(FITS)}")
    if o.get("adan_precision") not in ADAN_PRECISIONS:
        raise ValueError(f"unknown adan_precision {o['adan_precision']!r}; valid: "
                         f"{', '.join(map(repr, ADAN_PRECISIONS))} (None: the backend's default)")
    if "select" in o:
        check_select(o["select"])
    if "weights" in o:
        o["weights"] = check_weights(o["weights"])
    if "var_floor" in o:
        o["var_floor"] = check_var_floor(o["var_floor"])
    if "fit_iters" in o:
        o["fit_iters"] = check_fit_iters(o["fit_iters"])
    if "lr" in o:
        if isinstance(o["lr"], str):
            if o["lr"] not in PAPER_LR_TABLES:
                raise ValueError(f"unknown lr {o['lr']!r}; use a number or one of {', '.join(PAPER_LR_TABLES)}")
        else:
            o["lr"] = _real(o["lr"], "lr", *LR_RANGE, "ADAN's learning rate")
    if "adan_mean" in o and o["adan_mean"] not in ADAN_MEANS:
        raise ValueError(f"adan_mean must be one of {', '.join(ADAN_MEANS)}, got {o['adan_mean']!r}")
    if "eta" in o:
        o["eta"] = _real(o["eta"], "eta", 0.0, 1.0, "DDIM's eta")
    if "variance_interp" in o:
        o["variance_interp"] = _real(o["variance_interp"], "variance_interp", 0.0, 1.0,
                                     "the log-space weight of beta_{t|s} in DDPM's variance")
    if "variance_scale" in o:
        o["variance_scale"] = _real(o["variance_scale"], "variance_scale", 0.0, 100.0, "the factor on Var",
                                    open_low=True)
    if "skew_threshold" in o:
        o["skew_threshold"] = _real(o["skew_threshold"], "skew_threshold", 0.0, math.inf,
                                    "the standardized skewness at or below which GMS draws a Gaussian")
    if "skew_scale" in o:
        o["skew_scale"] = check_skew_scale(o["skew_scale"])
    if o.get("gamma") is not None:
        check_gamma(o["gamma"], T)
    if solver.name == "edm-sde":
        o["s_churn"] = _real(o["s_churn"], "s_churn", 0.0, math.inf, "EDM's total churn S_churn")
        o["s_tmin"] = _real(o["s_tmin"], "s_tmin", 0.0, math.inf, "EDM's lowest churned sigma S_tmin")
        o["s_tmax"] = _real(o["s_tmax"], "s_tmax", o["s_tmin"], math.inf, "EDM's highest churned sigma S_tmax, "
                            ">= s_tmin")
        o["s_noise"] = _real(o["s_noise"], "s_noise", 0.0, 2.0, "EDM's noise inflation S_noise")
    if "prediction" in o and o["prediction"] not in ("noise", "data"):
        raise ValueError(f"prediction must be 'noise' or 'data' (which SEEDS form), got {o['prediction']!r}")
    if solver.name == "seeds-2":
        o["r"] = _real(o["r"], "r", 0.0, 1.0, "SEEDS-2's intermediate point, a fraction of the step in lambda",
                       open_low=True)
        if o["r"] == 1.0:
            raise ValueError("r must be a number in (0, 1) (SEEDS-2's intermediate point), got 1.0")
    if solver.name == "ggf":
        o["eps_abs"] = _real(o["eps_abs"], "eps_abs", 0.0, math.inf, "GGF's absolute tolerance", open_low=True)
        o["eps_rel"] = _real(o["eps_rel"], "eps_rel", 0.0, math.inf, "GGF's relative tolerance")
        o["h_init"] = _real(o["h_init"], "h_init", 0.0, 1.0, "GGF's first step in u in [0, 1]", open_low=True)
        o["exponent"] = _real(o["exponent"], "exponent", 0.0, 1.0, "GGF's step-size exponent r", open_low=True)
        o["safety"] = _real(o["safety"], "safety", 0.0, 1.0, "GGF's safety factor theta", open_low=True)
        m = o["max_attempts"]
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or not 1 <= m <= 65535:
            raise ValueError(f"max_attempts must be an integer in [1, 65535] (GGF's proposals per sample), got {m!r}")
        o["max_attempts"] = int(m)
        if o["noise"] not in ("brownian", "redraw"):
            raise ValueError(f"noise must be 'brownian' or 'redraw' (GGF's Brownian increments), got {o['noise']!r}")
    return o


def with_model_defaults(solver: Solver, options: dict[str, Any], model: Any) -> dict[str, Any]:
    """The caller's ``options`` over the options ``model`` recommends for ``solver``.

    A model may carry ``solver_defaults``, a mapping {solver name: {option: value}} (the shipped models carry the
    settings chosen on their own validation split, ``gms_kernels.models.embedded``). They take the place of the library's
    defaults, and give way to every option the caller names, a preset included: a preset the caller names sets its
    options over the model's, as it does over the library's. ValueError for a malformed or invalid table."""
    table = getattr(model, "solver_defaults", None)
    if table is None:
        return dict(options)
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise ValueError(f"the model's solver_defaults must map solver names to option dicts, got {table!r}")
    recommended = dict(table.get(solver.name, {}))
    try:
        resolve_options(solver, recommended)
    except ValueError as err:
        raise ValueError(f"the model's solver_defaults for {solver.name!r}: {err}") from None
    preset = options.get("preset")  # (the model's own preset, if any, is replaced below as every named option is)
    if preset is not None:
        for key in PRESETS.get(solver.name, {}).get(preset, {}):  # (an unknown preset is refused by resolve_options)
            recommended.pop(key, None)
    return {**recommended, **options}


def _real(value: Any, name: str, low: float, high: float, what: str, open_low: bool = False) -> float:
    """``value`` as a float, refused unless it is a real number in [low, high] (or (low, high])."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (low < value if open_low else low <= value) or not value <= high:
        interval = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be a number in {interval} ({what}), got {value!r}")
    return float(value)


def fused_config(name: str, options: dict[str, Any], k: StepCoefficients, data_range: DataRange, T: int,
                 batch: int, per_sample: int) -> FusedStepConfig | None:
    """The fused kernels' config of one step of solver ``name`` with the user's ``options`` (checked
    and merged with the defaults); None when the step is not one they do. Memoised: a sampling loop
    makes the same steps again and again, and building the config costs more than a small step.
    The memo is keyed on the options' values, never on an object's identity, so that a tensor the caller
    edits in place between two calls (weights, a gamma table) gives a new config."""
    key = (name, tuple((o, _value_key(v)) for o, v in options.items()), k, data_range, T, batch, per_sample)
    return _memo_fused_config(key, _Unhashed(options))


def _value_key(value: Any) -> Any:
    """A hashable stand-in that equals another only for an equal value (tensors and lists by their contents)."""
    if torch.is_tensor(value):
        return ("tensor", value.dtype, tuple(value.shape), tuple(value.detach().reshape(-1).cpu().tolist()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_value_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), _value_key(v)) for k, v in value.items())))
    if hasattr(value, "__array__") and hasattr(value, "tolist"):  # numpy arrays and scalars
        return ("array", repr(getattr(value, "dtype", None)), _value_key(value.tolist()))
    try:
        hash(value)
    except TypeError:
        return ("object", id(value))  # (an unhashable object: compared by identity, as it is all we know)
    return (type(value).__name__, value)


class _Unhashed:
    """The caller's options beside the memo key: equal to every other, so that the key alone decides a hit."""

    def __init__(self, options: dict[str, Any]):
        self.options = options

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Unhashed)

    def __hash__(self) -> int:
        return 0


@functools.lru_cache(maxsize=256)
def _memo_fused_config(key: tuple, options: _Unhashed) -> FusedStepConfig | None:
    name, _, k, data_range, T, batch, per_sample = key
    o = resolve_options(get_solver(name), options.options, T)
    return make_config(name, k, data_range, o, T, batch, per_sample)


def heads_read(solver: Solver, k: StepCoefficients, o: dict[str, Any]) -> int:
    """How many of the heads [e1, e2, e3] the step t -> s reads with the resolved options ``o``: the step into
    data with ``denoise_final`` reads e1 alone, GMS's Gaussian last step e1 and e2. A NaN or inf is refused in
    exactly these, on every backend (the fused kernels check what they read)."""
    if k.s == DATA and o.get("denoise_final", False):
        return min(solver.heads, 1)
    if solver.name == "gms" and k.s == 0 and o["gaussian_last_step"]:
        return 2
    return solver.heads


def solver_step(name: str, x_t: torch.Tensor, heads: list[torch.Tensor], k: StepCoefficients,
                rand: StepRandomness, data_range: DataRange, T: int, options: dict[str, Any],
                backend: str = "torch", want_info: bool = True, where: str = "",
                nonfinite_flag: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """One step t -> s of solver ``name``; t -> data returns the denoised mean by default.

    ``backend`` 'cpp' and 'triton' run the gms, sn-ddpm, ddpm, ddpm-large, ddim and analytic-dpm steps in
    one fused kernel that draws the same Philox streams (it needs a generator, not explicit noise);
    everything else, and the 'torch' backend, runs the float64 reference below. A NaN or inf in x_t
    or the heads raises a ValueError that names it (``where`` says which step); the fused kernels check while they read.
    With ``nonfinite_flag`` the Triton kernel only sets that flag, for the caller to read later.
    """
    if backend != "torch" and rand.shares_streams:
        cfg = fused_config(name, options, k, data_range, T, x_t.shape[0], math.prod(x_t.shape[1:]))
        if cfg is not None:
            e2, e3 = (heads + [None, None])[1:3]
            src = rand.source
            seeds, indices = src.seeds, src.indices
            if x_t.device != seeds.device:  # (the launcher checks the counter range only on host tensors)
                src.check_capacity(math.prod(x_t.shape[1:]))
                seeds, indices = src.on(x_t.device)
            try:
                x_s, p = fused_step(backend, x_t, heads[0], e2, e3, seeds, indices, cfg, want_info, nonfinite_flag)
            except NonFiniteInput:
                check_inputs_finite(x_t, heads, where)  # names the culprit
                raise
            fitted = p is not None and cfg.mode in (MODE_CLOSED, MODE_ADAN)  # (other modes fit no mixture)
            return x_s, ({"mu1": p.mu1, "mu2": p.mu2, "s2": p.s2} if fitted else {})
    solver = get_solver(name)
    o = resolve_options(solver, options, T)
    check_inputs_finite(x_t, heads[:heads_read(solver, k, o)], where)  # (what the step reads, as the kernels check)
    o.update(data_range=data_range, T=T)
    x_t = x_t.to(torch.float64)
    heads = [h.to(torch.float64) for h in heads]
    if k.s == DATA and o.get("denoise_final", False):
        x0 = transition_moments(x_t, heads[0], None, None, k, data_range).m1
        return x0, {"x0": x0}
    return solver.step(x_t, heads, k, rand, o)
