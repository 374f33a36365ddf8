"""k-diffusion-style entry points: a denoiser wrapper and ``sample_*(model, x, sigmas, ...)`` samplers.

k-diffusion (github.com/crowsonkb/k-diffusion) writes every sampler in the variance-exploding (VE) scale
x = x0 + sigma z, with a descending list of noise levels ``sigmas`` that ends in 0, and calls the network
through a denoiser D(x, sigma) ~ E[x0 | x]. A discrete VP model (the forward process of GMS, https://arxiv.org/abs/2311.00941:
x_t = a_t x0 + sigma_t eps) sits in that scale at sigma = sigma_t / a_t (:meth:`Schedule.ve_sigma`), with
x = x_t / a_t = x_t sqrt(1 + sigma^2); at sigma = 0 the two scales coincide.

Noise levels between the trained ones. The network only knows the T trained levels, and a GMS step
(Algorithm 2 of the paper) is defined between two of them, so every nonzero sigma is rounded to the nearest
trained level in log-sigma (ties to the lower level), as k-diffusion's ``DiscreteSchedule.sigma_to_t``
does with ``quantize=True``, and the samplers then step between those levels' exact sigmas:

* the start ``x`` (k-diffusion's ``z * sigmas[0]``) is rescaled to the first level's sigma,
  x -> x * sigma_hat / sigmas[0] (exact for pure noise), then converted to VP: x_t = x / sqrt(1 + sigma_hat^2);
* a step whose two sigmas round to the same level is skipped (no network call, no callback): the state
  already sits at that level; so ``len(sigmas) - 1`` is the most network calls, not always the number;
* the last step, into sigma = 0, goes from the last level to the data.

On sigmas that are trained levels the samplers equal :func:`gms_kernels.sample` with the explicit
trajectory of those levels, the same seed and x_T = x / sqrt(1 + sigmas[0]^2), up to float rounding.
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..kernels.dispatch import resolve_backend
from ..core.devices import as_tensor_on
from ..model_io import (adapt_model, call_model, check_inputs_finite, check_model_heads, check_model_signature,
                       check_state_tensor, check_time_input, split_heads, time_values)
from ..core.moments import DataRange, check_data_range
from ..core.progress import progress_bar
from ..core.random import GeneratorLike, SampleNoise, check_first_index, fixed_seeds
from ..sampling import step
from ..core.schedule import DATA, Schedule, schedule_for
from ..solvers import denoised_and_eps, get_solver, resolve_options, with_model_defaults

__all__ = ["GMSDenoiser", "get_sigmas_karras", "sample_gms", "sample_sn_ddpm", "sample_ddpm", "sample_ddpm_large",
           "sample_ddim", "sample_analytic_dpm", "sample_seeds_1"]

Callback = Callable[[dict], None]


class GMSDenoiser(nn.Module):
    """A gms_kernels network as a k-diffusion denoiser: ``denoiser(x, sigma, **extra_args)`` returns
    D(x, sigma) = x - sigma e1(x / sqrt(1 + sigma^2), t(sigma)), the estimate of x0 from x = x0 + sigma z,
    as k-diffusion's ``DiscreteEpsDDPMDenoiser`` with ``quantize=True`` computes it (t(sigma): the nearest
    trained level in log-sigma; no clamping to the data range). ``sigma`` is a number or one per sample [N].

    ``model(x_t, t)`` returns the heads [e1, e2, e3] along dim 1, as :func:`gms_kernels.sample` takes it;
    ``schedule`` defaults to the model's own (else the linear DDPM one), ``time_input`` to the model's
    ``time_input`` attribute (else ``"index"``). ``sigmas`` holds the T trained levels sigma_t / a_t
    (float64, ascending, index t at position t), ``sigma_min``/``sigma_max`` the ends, as k-diffusion's
    ``DiscreteSchedule`` has them.
    """

    def __init__(self, model: Callable[..., torch.Tensor], schedule: Schedule | None = None,
                 time_input: str | None = None):
        super().__init__()
        if isinstance(model, GMSDenoiser):
            raise TypeError("model is already a GMSDenoiser: pass it to the samplers as it is")
        model = adapt_model(model)
        check_model_signature(model)
        self.inner_model = model
        self.schedule = schedule_for(model, schedule)
        self.time_input = check_time_input(time_input or getattr(model, "time_input", "index"))
        # the levels the steps use, sigma_t / a_t as Schedule.ve_sigma forms them (float64, CPU)
        self._levels = torch.tensor([self.schedule.ve_sigma(t) for t in range(self.schedule.T)],
                                    dtype=torch.float64, device="cpu")
        self._log_levels = self._levels.log()

    @property
    def sigmas(self) -> torch.Tensor:
        return self._levels.clone()

    @property
    def sigma_min(self) -> torch.Tensor:
        return self._levels[0].clone()

    @property
    def sigma_max(self) -> torch.Tensor:
        return self._levels[-1].clone()

    def sigma_to_t(self, sigma: torch.Tensor | float, quantize: bool = True) -> torch.Tensor:
        """The time index of each noise level: the nearest trained level in log-sigma (long; ties go to the
        lower index; 0 for sigma = 0), or with ``quantize=False`` the fractional index interpolated linearly in
        log-sigma between the two neighbours (float64, clamped to [0, T-1]). Same device as ``sigma``."""
        sigma = as_tensor_on(sigma, torch.float64)
        log_sigma, grid = sigma.log().reshape(-1, 1), self._log_levels.to(sigma.device)
        if quantize:  # (argmin takes the first of equal distances: the lower level)
            return (log_sigma - grid).abs().argmin(dim=1).reshape(sigma.shape)
        if self.schedule.T == 1:
            return torch.zeros_like(sigma)
        hi = torch.searchsorted(grid, log_sigma.reshape(-1).contiguous()).clamp(1, self.schedule.T - 1)
        lo = hi - 1
        w = ((log_sigma.reshape(-1) - grid[lo]) / (grid[hi] - grid[lo])).clamp(0.0, 1.0)
        return (lo + w).reshape(sigma.shape)

    def t_to_sigma(self, t: torch.Tensor | float) -> torch.Tensor:
        """The noise level of (possibly fractional) time indices: exactly :meth:`Schedule.ve_sigma` at an integer,
        geometric (linear in log-sigma) between two levels (float64, same device as ``t``)."""
        t = as_tensor_on(t, torch.float64)
        if bool(((t < 0) | (t > self.schedule.T - 1)).any()):
            raise ValueError(f"t must lie in [0, T-1 = {self.schedule.T - 1}], got {t.tolist()}")
        levels = self._levels.to(t.device)
        lo = t.floor().long()
        hi = t.ceil().long()
        return levels[lo] * (levels[hi] / levels[lo]) ** (t - lo)  # (w = 0 gives the level itself, exactly)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor | float, **extra_args: Any) -> torch.Tensor:
        check_state_tensor(x, "x")
        sigma = as_tensor_on(sigma, torch.float64, x.device).reshape(-1)
        if sigma.numel() == 1:
            sigma = sigma.expand(x.shape[0])
        if sigma.numel() != x.shape[0]:
            raise ValueError(f"sigma must be one number or one per sample ({x.shape[0]}), got {sigma.numel()}")
        scale = (1.0 + sigma * sigma).rsqrt().reshape(-1, *([1] * (x.dim() - 1)))
        x_t = (x.to(torch.float64) * scale).to(x.dtype)  # the VP state x_t = a x
        t = time_values(self.sigma_to_t(sigma), self.schedule.T, self.time_input)
        out = self.inner_model(x_t, t, **extra_args)
        e1 = split_heads(out, x_t, 1, "k-diffusion denoiser")[0].to(torch.float64)
        return (x.to(torch.float64) - sigma.reshape(scale.shape) * e1).to(x.dtype)


def get_sigmas_karras(n: int, sigma_min: float | torch.Tensor, sigma_max: float | torch.Tensor, rho: float = 7.0,
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """EDM's noise levels (Karras et al. 2022, Eq. 5, arXiv 2206.00364): ``n`` levels from ``sigma_max`` to
    ``sigma_min`` evenly spaced in sigma^(1/rho), then 0 appended (float64), as k-diffusion's function of this
    name (which works in float32) makes them."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be a positive integer (the number of nonzero levels), got {n!r}")
    lo, hi = float(sigma_min), float(sigma_max)
    if not 0 < lo <= hi < math.inf:
        raise ValueError(f"need 0 < sigma_min <= sigma_max < inf, got sigma_min={lo}, sigma_max={hi}")
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or not 0 < rho < math.inf:
        raise ValueError(f"rho must be a positive number, got {rho!r}")
    ramp = torch.linspace(0.0, 1.0, int(n), dtype=torch.float64, device="cpu")
    top, bottom = hi ** (1.0 / rho), lo ** (1.0 / rho)
    levels = (top + ramp * (bottom - top)) ** rho
    return torch.cat([levels, levels.new_zeros(1)]).to(device)


def sample_gms(model: GMSDenoiser | Callable[..., torch.Tensor], x: torch.Tensor,
               sigmas: torch.Tensor | Sequence[float], extra_args: dict[str, Any] | None = None,
               callback: Callback | None = None, disable: bool | None = None, *, generator: GeneratorLike = None,
               first_index: int = 0, data_range: DataRange = (-1.0, 1.0), backend: str = "auto",
               **options: Any) -> torch.Tensor:
    """GMS (arXiv 2311.00941: each reverse transition a two-Gaussian mixture fitted to its first three moments) on
    k-diffusion's ``sigmas``, called as k-diffusion's samplers are.

    ``model``: a :class:`GMSDenoiser` or a bare gms_kernels network (wrapped with its defaults); ``x``: the
    start noise in k-diffusion's scale, ``z * sigmas[0]``; ``sigmas``: strictly descending, ending in 0 (as
    ``get_sigmas_karras`` gives them), each nonzero one rounded to a trained level (module docstring).
    ``extra_args`` go to the network: ``model(x_t, t, **extra_args)``. ``callback`` gets, before each step as
    in k-diffusion, {'x', 'i', 'sigma', 'sigma_hat', 'denoised', 't', 's'}: x in the VE scale at
    ``sigma_hat`` (the trained level the state sits at; ``sigma`` is the requested ``sigmas[i]``) and
    E[x0|x] clamped to ``data_range`` as the solver uses it. ``disable=True`` hides the progress bar.

    ``generator``: an int seed (or a torch.Generator or None, from which one seed is drawn once; or one per
    sample) keying the package's Philox streams, so that sample i depends only on (seed, ``first_index`` + i),
    as in :func:`gms_kernels.sample`. ``options`` are GMS's (fit, select, weights, ...) over the model's
    ``solver_defaults``; ``backend`` as in :func:`gms_kernels.step`. Returns the samples (sigma = 0) in x's dtype.
    """
    return _sample("gms", model, x, sigmas, extra_args, callback, disable, generator, first_index, data_range,
                   backend, options)


def sample_sn_ddpm(model: GMSDenoiser | Callable[..., torch.Tensor], x: torch.Tensor,
                   sigmas: torch.Tensor | Sequence[float], extra_args: dict[str, Any] | None = None,
                   callback: Callback | None = None, disable: bool | None = None, *, generator: GeneratorLike = None,
                   first_index: int = 0, data_range: DataRange = (-1.0, 1.0), backend: str = "auto",
                   **options: Any) -> torch.Tensor:
    """SN-DDPM (the Gaussian with the e2 head's variance, the GMS paper's Eq. (27)) as :func:`sample_gms` runs GMS."""
    return _sample("sn-ddpm", model, x, sigmas, extra_args, callback, disable, generator, first_index, data_range,
                   backend, options)


def sample_ddpm(model: GMSDenoiser | Callable[..., torch.Tensor], x: torch.Tensor,
                sigmas: torch.Tensor | Sequence[float], extra_args: dict[str, Any] | None = None,
                callback: Callback | None = None, disable: bool | None = None, *, generator: GeneratorLike = None,
                first_index: int = 0, data_range: DataRange = (-1.0, 1.0), backend: str = "auto",
                **options: Any) -> torch.Tensor:
    """DDPM's ancestral step (posterior variance; ``variance_interp=1`` for beta) as :func:`sample_gms` runs GMS."""
    return _sample("ddpm", model, x, sigmas, extra_args, callback, disable, generator, first_index, data_range,
                   backend, options)


def sample_ddim(model: GMSDenoiser | Callable[..., torch.Tensor], x: torch.Tensor,
                sigmas: torch.Tensor | Sequence[float], extra_args: dict[str, Any] | None = None,
                callback: Callback | None = None, disable: bool | None = None, *, generator: GeneratorLike = None,
                first_index: int = 0, data_range: DataRange = (-1.0, 1.0), backend: str = "auto",
                **options: Any) -> torch.Tensor:
    """DDIM (``eta=0``: deterministic; ``eta=1``: DDPM's variance) as :func:`sample_gms` runs GMS."""
    return _sample("ddim", model, x, sigmas, extra_args, callback, disable, generator, first_index, data_range,
                   backend, options)


def sample_ddpm_large(model: GMSDenoiser | Callable[..., torch.Tensor], x: torch.Tensor,
                      sigmas: torch.Tensor | Sequence[float], extra_args: dict[str, Any] | None = None,
                      callback: Callback | None = None, disable: bool | None = None, *,
                      generator: GeneratorLike = None, first_index: int = 0, data_range: DataRange = (-1.0, 1.0),
                      backend: str = "auto", **options: Any) -> torch.Tensor:
    """DDPM with the variance beta_{t|s} ("fixed large") as :func:`sample_gms` runs GMS."""
    return _sample("ddpm-large", model, x, sigmas, extra_args, callback, disable, generator, first_index, data_range,
                   backend, options)


def sample_analytic_dpm(model: GMSDenoiser | Callable[..., torch.Tensor], x: torch.Tensor,
                        sigmas: torch.Tensor | Sequence[float], extra_args: dict[str, Any] | None = None,
                        callback: Callback | None = None, disable: bool | None = None, *,
                        generator: GeneratorLike = None, first_index: int = 0,
                        data_range: DataRange = (-1.0, 1.0), backend: str = "auto", **options: Any) -> torch.Tensor:
    """Analytic-DPM (``gamma=gk.estimate_gamma(...)``, one entry per trained level) as :func:`sample_gms` runs GMS."""
    return _sample("analytic-dpm", model, x, sigmas, extra_args, callback, disable, generator, first_index,
                   data_range, backend, options)


def sample_seeds_1(model: GMSDenoiser | Callable[..., torch.Tensor], x: torch.Tensor,
                   sigmas: torch.Tensor | Sequence[float], extra_args: dict[str, Any] | None = None,
                   callback: Callback | None = None, disable: bool | None = None, *, generator: GeneratorLike = None,
                   first_index: int = 0, data_range: DataRange = (-1.0, 1.0), backend: str = "auto",
                   **options: Any) -> torch.Tensor:
    """SEEDS-1 (``prediction="noise"|"data"``), the first-order exponential SDE integrator, as
    :func:`sample_gms` runs GMS."""
    return _sample("seeds-1", model, x, sigmas, extra_args, callback, disable, generator, first_index, data_range,
                   backend, options)


def check_sigmas(sigmas: object) -> list[float]:
    """k-diffusion's ``sigmas`` as floats: at least two, finite, strictly descending, the last 0 (the data)."""
    if torch.is_tensor(sigmas):
        if sigmas.is_complex() or sigmas.dtype == torch.bool:
            raise TypeError(f"sigmas must hold real numbers, got a {sigmas.dtype} tensor")
        values = sigmas.detach().reshape(-1).to("cpu", torch.float64).tolist()
    elif isinstance(sigmas, (str, bytes)) or not hasattr(sigmas, "__iter__"):
        raise TypeError(f"sigmas must be a 1-D tensor or sequence of noise levels, got {type(sigmas).__name__}")
    else:
        values = list(sigmas)
        if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
            raise TypeError(f"sigmas must hold real numbers, got {values!r:.80}")
        values = [float(v) for v in values]
    if len(values) < 2:
        raise ValueError(f"sigmas must hold at least two noise levels (the start and the final 0), got {values}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"sigmas must be finite, got {values}")
    if values[-1] != 0.0:
        raise ValueError(f"sigmas must end in 0 (the data), as k-diffusion's get_sigmas_* make them; got last "
                         f"{values[-1]}")
    if any(a <= b for a, b in zip(values, values[1:])):
        raise ValueError(f"sigmas must be strictly descending, got {values}")
    return values


def _sample(solver: str, model: Any, x: torch.Tensor, sigmas: object, extra_args: dict[str, Any] | None,
            callback: Callback | None, disable: bool | None, generator: GeneratorLike, first_index: int,
            data_range: DataRange, backend: str, options: dict[str, Any]) -> torch.Tensor:
    """The one loop of every ``sample_*``: arguments checked before any network call, then gk.step between
    the trained levels that ``sigmas`` round to."""
    with torch.no_grad():
        denoiser = model if isinstance(model, GMSDenoiser) else GMSDenoiser(model)
        check_state_tensor(x, "x")
        check_inputs_finite(x, [], x_name="x")
        levels = check_sigmas(sigmas)
        if extra_args is None:
            extra_args = {}
        if not isinstance(extra_args, dict):
            raise TypeError(f"extra_args must be a dict of keyword arguments for the network (or None), got "
                            f"{type(extra_args).__name__}")
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be a function of one dict (called before every step), got "
                            f"{type(callback).__name__}")
        spec, schedule = get_solver(solver), denoiser.schedule
        net = denoiser.inner_model
        check_model_heads(net, spec.heads, spec.name)
        resolved = resolve_options(spec, with_model_defaults(spec, options, net), schedule.T)
        data_range = check_data_range(data_range)
        first_index = check_first_index(first_index)
        resolve_backend(backend, x.device, x.dtype)
        seed = fixed_seeds(generator, draw_global=True)  # one key for every step, as gk.sample keeps one
        SampleNoise.create(seed, x.shape[0], first_index)  # (refuses a bad seed or list before any work)
        if extra_args:
            net = functools.partial(net, **extra_args)

        ts = denoiser.sigma_to_t(torch.tensor(levels[:-1], dtype=torch.float64, device="cpu")).tolist() + [DATA]
        # x is read as noise at sigmas[0]: rescaled to the first level's sigma, sigma_hat, then made the VP state
        # x_t = x / sqrt(1 + sigma_hat^2); together x * sigma_t / sigmas[0] with sigma_t the level's VP sigma
        x_t = (x.to(torch.float64) * (schedule.sigma(ts[0]) / levels[0])).to(x.dtype)
        for i in progress_bar(range(len(levels) - 1), disable is not True, desc=f"{solver} k-diffusion",
                              leave=False):
            t, s = ts[i], ts[i + 1]
            if s == t:  # both round to the same level, where the state already is
                continue
            out = call_model(net, x_t, t, schedule.T, denoiser.time_input)
            if callback is not None:
                callback(_callback_info(i, levels[i], t, s, x_t, out, solver, schedule, data_range))
            x_t = step(x_t, out, t, s, schedule, solver, seed, data_range=data_range, first_index=first_index,
                       backend=backend, options=resolved)
        return x_t  # (at sigma = 0, a = 1: the VP and VE scales coincide)


def _callback_info(i: int, sigma: float, t: int, s: int, x_t: torch.Tensor, out: torch.Tensor, solver: str,
                   schedule: Schedule, data_range: DataRange) -> dict[str, Any]:
    """k-diffusion's callback keys for the state x_t at level t, before the step t -> s."""
    a, sig = schedule.alpha(t), schedule.sigma(t)
    e1 = split_heads(out, x_t, 1, solver, f"at step {i} (t={t}) ")[0]
    denoised = denoised_and_eps(x_t.to(torch.float64), e1.to(torch.float64), a, sig, data_range)[0]
    scalar = functools.partial(torch.tensor, dtype=torch.float64, device="cpu")
    return {"x": (x_t.to(torch.float64) / a).to(x_t.dtype), "i": i, "sigma": scalar(sigma),
            "sigma_hat": scalar(schedule.ve_sigma(t)), "denoised": denoised.to(x_t.dtype), "t": t, "s": s}
