"""``GMSScheduler``: the GMS step (and the other solvers) as a drop-in diffusers scheduler.

A network with ``out_channels = 3C`` (the heads e1 = E[eps], e2 = E[eps^2], e3 = E[eps^3]
concatenated along dim 1) drives it inside any diffusers pipeline that calls
``set_timesteps`` / ``step`` (e.g. ``DDPMPipeline``); ``sn-ddpm`` reads 2C channels and
``ddpm``/``ddpm-large``/``ddim`` read the first C. Everything numeric is delegated to
:func:`gms_kernels.step`, which runs in float64 (torch) or in the fused kernels.

Conventions (those of diffusers' schedulers):

- ``timesteps`` are 0-based training indices in descending order, built by
  :func:`gms_kernels.trajectory`; ``set_timesteps(N)`` gives exactly N of them, so a pipeline makes
  N network calls, as with diffusers' schedulers (see :func:`inference_timesteps`).
- ``step`` looks the next timestep up in ``self.timesteps`` (never computes it); after the last
  one it steps to the data (``s = -1``), like ``gk.sample``.
- ``generator`` (None, a ``torch.Generator``, an int seed, or a list of one of those per sample) is
  used at every step: each generator gives one 62-bit seed per step, which keys the counter-based
  Philox streams of :mod:`gms_kernels.core.random`, so sample i depends only on generator i. A CUDA
  generator's seed is read back to the host at every step (a sync); an int seed or a CPU generator
  costs none.
- A NaN or inf in the sample or the model output raises a ValueError that names the timestep.
  With the Triton backend the kernel's flag for it is read at the next ``step`` (by then the
  network call queued in between runs after the kernel, so the read does not stall the device),
  and at once for the last step; ``set_timesteps`` reads a flag left by an unfinished loop.
- Bad input is refused at the public entry (constructor, ``set_timesteps``, ``step``, ``add_noise``) before
  any work, with an error that names the argument: a non-float sample or model output (or a diffusers
  ``UNet2DOutput`` instead of its ``.sample``), a timestep that is not an integer, noise of another shape,
  a device this machine lacks.
- A timestep that is an element of ``self.timesteps`` (as ``for t in scheduler.timesteps``
  gives) is located by its position, without reading its value from the device.
- fp16/bf16 samples are upcast (at least float32; the torch reference computes in float64) and
  the result is cast back, so half-precision pipelines do not produce NaN from scheduler maths.
- Conditional networks: the scheduler never sees the condition; the loop passes it to the network
  (``unet(x, t, class_labels=y).sample``, or ``encoder_hidden_states=``), and with the same trajectory and
  int seed the loop gives ``gk.sample(..., model_kwargs={"class_labels": y})`` exactly. For classifier-free
  guidance the user forms the heads before ``step``: run both branches in one batched call (the conditional
  rows, then the unconditional ones with the null condition), then
  ``heads = gms_kernels.model_io.guided_heads(out[:n], out[n:], w, n_heads)`` (``n_heads``: 3 for gms, 2 for
  sn-ddpm, 1 for ddpm/ddim) and ``scheduler.step(heads, t, x, ...)``: that is ``gk.sample(...,
  guidance_scale=w, null_kwargs=...)`` exactly (two separate calls agree up to float rounding). Only the mean
  is guided; the conditional branch's spread is kept (see :func:`~gms_kernels.model_io.guided_heads`).
- ``step(..., variance_noise=z)`` (as in DDIMScheduler) takes the step's standard normal noise instead of
  drawing it from ``generator``; it is ``gk.step``'s ``noise=``.
- The config is one diffusers' own schedulers read (``DDPMScheduler.from_config(s.config)``, or from the
  saved file): ``timestep_spacing`` holds the nearest diffusers spacing (``gms_timestep_spacing`` this
  scheduler's own), ``clip_sample`` / ``clip_sample_range`` the data range, ``beta_schedule`` diffusers'
  name; converted back, the keys diffusers kept restore everything (see :class:`GMSScheduler`). In a
  pipeline's ``model_index.json`` the class is ``["gms_kernels", "GMSScheduler"]``: ``import gms_kernels``
  is all a new process needs before ``from_pretrained``.

Against diffusers' own schedulers, measured on the embedded digits model (trailing spacing, 10 and 50
steps, the same x_t and network output at every step):

- ``solver="ddim"`` (eta 0) is ``DDIMScheduler`` with ``use_clipped_model_output=True`` (to 2e-6). With
  DDIMScheduler's default, False, its direction term keeps the unclipped eps while x0 is clipped, so the
  two differ wherever the x0 clamp acts: max |diff| per step 0.26 on 16 samples, 0.47 on 1000; 6.9 for
  an eps unrelated to x_t (x_t and eps standard normal, 3x16x16).
- ``solver="ddpm-large"`` is ``DDPMScheduler(variance_type="fixed_large")`` with the same noise
  (``variance_noise``) at every step (to 3e-6) but the one into the data: there DDPMScheduler adds noise of
  std sqrt(1 - abar_t) (it skips it only at t = 0; 0.32 at t = 99, the last of 10 trailing steps), which
  ddpm-large, like DDPM's own sampler, does not. The samples differ by that noise: max |diff| 1.00 on 16
  samples (1x8x8), 1.42 on 1000, mean 0.26.

This module imports diffusers (a dependency of gms_kernels, loaded on first use of gk.GMSScheduler).
"""
from __future__ import annotations

import copy
import inspect
import math
import numbers
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils import BaseOutput

from ..kernels.dispatch import BACKENDS, resolve_backend
from ..core.devices import as_tensor_on, check_device
from ..core.files import json_ready
from ..core.moments import check_data_range, clamped_x0_mean
from ..model_io import check_state_tensor, split_heads
from ..core.random import fixed_seeds
from ..sampling import DeferredFiniteCheck, step as gk_step
from ..core.schedule import DATA, TRAJECTORY_KINDS, Schedule, make_betas, time_index, trajectory
from ..core.user_warnings import warn_user
from ..solvers import SOLVERS, get_solver
from ..solvers.gms import ARGUMENT_OPTIONS, check_skew_scale

# the solvers with a one-step form (the others run only in gk.sample), but the oracle's exact one, which needs an
# oracle object
SCHEDULER_SOLVERS = tuple(name for name, spec in SOLVERS.items() if spec.per_step and "oracle" not in spec.requires)
# the options that are GMSScheduler arguments of their own, not solver_options entries
ARGUMENT_KEYS = ARGUMENT_OPTIONS + ("eta",)


@dataclass
class GMSSchedulerOutput(BaseOutput):
    """Output of :meth:`GMSScheduler.step`.

    prev_sample: x_s, the sample at the next (lower) timestep, in the dtype of the input sample.
    pred_original_sample: the clamped E[x0 | x_t] = (x_t - sigma_t e1) / a_t of this step.
    """

    prev_sample: torch.Tensor
    pred_original_sample: torch.Tensor | None = None


def inference_timesteps(T: int, num_inference_steps: int, kind: str) -> list[int]:
    """The ``num_inference_steps`` = N timesteps (N network calls) of trajectory ``kind``: the first N
    entries of ``gk.trajectory(T, N, kind)``, after which the sampler steps to the data.

    ``"leading"``, ``"trailing"`` and ``"linspace"`` (diffusers' spacings) have N entries. ``"even"``,
    ``"linear"`` and ``"quad"`` count N steps between N + 1 points that end at t = 0 (the official
    GMS / Analytic-DPM lists: ``gk.sample(steps=N)`` calls the network at t = 0 as well, N + 1 calls);
    here their last point, t = 0, is dropped, so the N calls keep the kind's spacing and the last
    step goes from the smallest remaining t straight to the data (the denoised mean), as diffusers'
    ``"trailing"`` does. On the embedded digits model this spends N calls better than the official
    list of N - 1 steps, which spends one of them at t = 0 (FD-digits of 1000 samples, seed 0, this
    choice against that one: "even" N = 5: DDPM 175 / 232, GMS-ADAN per pixel 175 / 207; "quad"
    N = 10: DDPM 38 / 62; "even" N = 10: about equal).
    """
    ts = trajectory(T, num_inference_steps, kind)[:num_inference_steps]
    if len(ts) != num_inference_steps:  # (cannot happen for the kinds above: a guard for new ones)
        raise ValueError(f"timestep_spacing {kind!r} gives {len(ts)} timesteps for num_inference_steps="
                         f"{num_inference_steps} (T = {T})")
    return ts


def time_indices(timesteps: object) -> list[int]:
    """``set_timesteps(timesteps=...)`` as a list of ints; a ValueError names any entry that is not one."""
    if torch.is_tensor(timesteps):
        values = timesteps.detach().flatten().tolist()
    elif hasattr(timesteps, "__array__") and hasattr(timesteps, "ravel"):  # a numpy array, flattened like a tensor
        values = timesteps.ravel().tolist()
    elif isinstance(timesteps, Iterable) and not isinstance(timesteps, (str, bytes, Mapping)):
        values = list(timesteps)
    else:
        raise ValueError(f"timesteps must be a sequence of integer time indices (a list, tuple, array or tensor, "
                         f"descending), got {type(timesteps).__name__} {timesteps!r}; for a number of steps pass "
                         "num_inference_steps instead")
    return [time_index(v, f"timesteps[{i}]") for i, v in enumerate(values)]


def _describe(value: object) -> str:
    """What a tensor argument was: its dtype and shape, or the type of a non-tensor."""
    if torch.is_tensor(value):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _spacing(timestep_spacing: str, gms_timestep_spacing: str | None) -> str:
    """The spacing a config asks for: ``gms_timestep_spacing`` while ``timestep_spacing`` is still its
    diffusers form, else ``timestep_spacing`` (set after it, e.g. by a diffusers scheduler in between)."""
    for name, value in (("timestep_spacing", timestep_spacing), ("gms_timestep_spacing", gms_timestep_spacing)):
        if value is not None and value not in TRAJECTORY_KINDS:
            raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(TRAJECTORY_KINDS)}")
    if gms_timestep_spacing is None or gms_timestep_spacing == timestep_spacing:
        return timestep_spacing
    if DIFFUSERS_SPACING[gms_timestep_spacing] == timestep_spacing:
        return gms_timestep_spacing
    warn_user(f"GMSScheduler: the config's gms_timestep_spacing={gms_timestep_spacing!r} stands for "
              f"timestep_spacing={DIFFUSERS_SPACING[gms_timestep_spacing]!r}, but it holds "
              f"timestep_spacing={timestep_spacing!r} (changed after it was written): using "
              f"{timestep_spacing!r}. Pass timestep_spacing= to choose another")
    return timestep_spacing


def _check_model_heads(model_heads: object, solver: str, needed: int) -> None:
    """``model_heads`` (None, or the 1 to 3 heads a network gives) must serve ``solver``."""
    if model_heads is None:
        return
    if isinstance(model_heads, bool) or not isinstance(model_heads, numbers.Integral) or not 1 <= model_heads <= 3:
        raise ValueError(f"model_heads must be None, 1, 2 or 3 (how many heads [e1, e2, e3] the network's output "
                         f"holds), got {model_heads!r}")
    if model_heads < needed:
        raise ValueError(f"model_heads={model_heads} but solver {solver!r} reads {needed} heads; pick a solver the "
                         "network serves (1 head: ddpm, ddpm-large, ddim; 2: sn-ddpm; 3: gms) or add heads "
                         "(gms-kernels train-heads)")


def check_model_output(model_output: object) -> torch.Tensor:
    """``step``'s ``model_output`` must be the network's output tensor, not diffusers' wrapper of it."""
    if not torch.is_tensor(model_output):
        raise TypeError(f"model_output must be a tensor (the network's heads concatenated along dim 1), got "
                        f"{type(model_output).__name__}: pass unet(...).sample, the tensor a diffusers UNet2DOutput "
                        "holds (or unet(..., return_dict=False)[0])")
    if not model_output.is_floating_point():
        raise TypeError(f"model_output must be a floating-point tensor, got {model_output.dtype}")
    return model_output


# Keys of DDPMScheduler / DDIMScheduler configs that GMSScheduler has no argument for, and how
# from_config treats an explicitly set one (see GMSScheduler._translate_foreign_config).
_CLIP_KEYS = ("clip_sample", "clip_sample_range")  # -> data_range
_THRESHOLDING_KEYS = ("thresholding", "dynamic_thresholding_ratio", "sample_max_value")
_VARIANCE_HINT = {"fixed_small": "ddpm", "fixed_small_log": "ddpm", "fixed_large": "ddpm-large",
                  "fixed_large_log": "ddpm-large"}
# The config's timestep_spacing is one diffusers' own schedulers read; gms_timestep_spacing keeps this
# scheduler's. "even" and "linear" are at most one index from "trailing" (all start at T-1, the last step goes
# to the data); "quad" (denser near t = 0) has no diffusers equivalent: "leading" is the nearest in mean |t|.
DIFFUSERS_SPACING = {"even": "trailing", "linear": "trailing", "quad": "leading", "leading": "leading",
                     "trailing": "trailing", "linspace": "linspace"}
# config keys never marked as left at their defaults: diffusers' from_config drops such keys, so that a
# diffusers scheduler would take its own default ("leading" for DDPMScheduler) and, converted back, this one
# would lose its spacing and data range
_CARRIED_KEYS = ("timestep_spacing", "gms_timestep_spacing", "data_range")


def clip_keys(data_range: tuple[float, float] | None) -> dict[str, Any]:
    """diffusers' ``clip_sample`` / ``clip_sample_range`` for a data range: no clipping for None, else the
    smallest symmetric range [-r, r] that holds it (diffusers clips the predicted x0 to [-r, r])."""
    if data_range is None:
        return {"clip_sample": False, "clip_sample_range": 1.0}
    return {"clip_sample": True, "clip_sample_range": float(max(abs(data_range[0]), abs(data_range[1])))}


def _same_clipping(config: Mapping, data_range: tuple[float, float] | None) -> bool:
    """Whether the clip keys of ``config`` (diffusers' defaults where absent) are those of ``data_range``."""
    want = clip_keys(data_range)
    if bool(config.get("clip_sample", True)) != want["clip_sample"]:
        return False
    return not want["clip_sample"] or float(config.get("clip_sample_range", 1.0)) == want["clip_sample_range"]


class GMSScheduler(SchedulerMixin, ConfigMixin):
    """Gaussian Mixture Solver as a diffusers scheduler (``SchedulerMixin`` + ``ConfigMixin``).

    Args:
        num_train_timesteps: T of the training schedule.
        beta_start, beta_end, beta_schedule, trained_betas: the training betas (see :func:`make_betas`).
        timestep_spacing: ``"even"`` (official GMS, default), ``"linear"``, ``"quad"``, ``"leading"``,
            ``"trailing"`` or ``"linspace"`` (see :func:`gms_kernels.trajectory`). ``set_timesteps(N)``
            always gives N timesteps, i.e. N network calls, as diffusers' schedulers do: the first N
            entries of ``gk.trajectory(T, N, kind)``; ``"even"``, ``"linear"`` and ``"quad"`` drop the
            extra t = 0 of the official lists, so ``gk.sample(steps=N)`` makes one call more (see
            :func:`inference_timesteps`). The config stores the spacing in ``gms_timestep_spacing`` and,
            in ``timestep_spacing``, the diffusers spacing nearest to it (:data:`DIFFUSERS_SPACING`:
            ``"even"`` and ``"linear"`` become ``"trailing"``, at most one index apart; ``"quad"`` becomes
            ``"leading"``, with a warning), so that ``DDPMScheduler`` / ``DDIMScheduler`` read the config.
        gms_timestep_spacing: set by the scheduler itself (None when constructing): the spacing above, kept
            next to the diffusers one. A config whose ``timestep_spacing`` is no longer the diffusers form of
            it (changed by a diffusers scheduler in between) uses ``timestep_spacing``, with a warning.
        steps_offset: added to the ``"leading"`` timesteps, as diffusers' DDPMScheduler does.
        solver: one of :data:`SCHEDULER_SOLVERS`, the solvers with a one-step form (``"gms"`` reads 3 heads,
            ``"sn-ddpm"`` 2, the others 1; ``"analytic-dpm"`` needs ``solver_options={"gamma": table}``). A solver
            whose step needs the model at other points than x_t, or the previous step's output, has no scheduler
            form: use ``gk.sample``.
        fit, select, fit_iters: GMS options (ignored by the other solvers; None: ``gk.step``'s defaults, for the
            scheduler does not see the model: ``gk.models.export_diffusers`` writes a model's own options, its
            ``solver_defaults``, here); eta: the noise share of the solvers that have one (DDIM's eta, 0 by
            default; None: the solver's default).
        preset: GMS: a named option set under the options above, e.g. ``"official"`` (what the official GMS
            code runs; see ``gms_kernels.solvers.gms.GMS.presets``).
        data_range: range of the data for the official clamps (like ``clip_sample``); ``None`` = off. The
            config also holds diffusers' ``clip_sample`` / ``clip_sample_range`` for it (:func:`clip_keys`:
            the smallest symmetric range that holds it), which diffusers' schedulers read.
        backend: ``"auto"``, ``"torch"``, ``"cpp"`` or ``"triton"`` (see :func:`gms_kernels.step`).
        solver_options: further options of the solver (e.g. ``weights``, ``var_floor``, ``lr``,
            ``gaussian_last_step``, ``denoise_final``, ``gamma``), checked at construction. Tensors,
            numpy arrays and tuples (also in ``trained_betas`` and ``data_range``) are stored as lists
            in the config, so that ``save_pretrained`` writes plain JSON; ``gamma`` is turned back into
            a float64 tensor for the steps, ``weights`` into a tuple.
        prediction_type: only ``"epsilon"`` (the heads are moments of the noise).
        rescale_betas_zero_snr: only ``False`` (a zero terminal SNR has a_T = 0, where E[x0|x_T]
            is undefined).
        model_heads: how many heads [e1, e2, e3] the network's output holds, when known
            (``gk.models.export_diffusers`` writes it). None: an output of exactly 2C channels is taken for
            diffusers' learned-variance layout [eps, variance], and ``sn-ddpm`` (which would read the variance
            as E[eps^2]) refuses it, as ``gk.sample`` refuses such a UNet; pass ``model_heads=2`` for a network
            trained to give [E[eps], E[eps^2]].

    ``GMSScheduler.from_config(ddpm_or_ddim_scheduler.config)`` takes the shared keys (betas,
    ``timestep_spacing``, ``steps_offset``, ...) and translates or reports the others, when the
    source config set them explicitly. A shared key the source left at its default takes the source
    class's default (a default DDPMScheduler config, in memory or saved, gives ``"leading"``):

    - ``clip_sample=False`` gives ``data_range=None``; ``clip_sample=True`` with ``clip_sample_range=r``
      gives ``data_range=(-r, r)`` (DDPM clips the predicted x0; GMS applies the official clamps to
      the moments of x0, scaled to the data range). A ``data_range`` passed to ``from_config`` wins.
    - ``thresholding=True`` (dynamic thresholding) has no equivalent: a warning says so and the
      clamps of ``data_range`` are used.
    - ``variance_type`` does not choose the solver: the solver is GMSScheduler's own argument (default
      ``"gms"``, which takes its variance from the network's heads), and mapping DDPMScheduler's default
      ``"fixed_small"`` to ``solver="ddpm"`` would silently replace GMS by plain DDPM in every converted
      pipeline. A warning names the equivalent solver instead (``fixed_small`` -> ``solver="ddpm"``,
      ``fixed_large`` -> ``solver="ddpm-large"``); pass it to ``from_config`` to get DDPM's sampler.
      ``"learned"`` / ``"learned_range"`` with ``solver="sn-ddpm"`` or ``"gms"`` is refused: that pipeline's
      UNet outputs [eps, variance], and the variance channels are not the E[eps^2] head those solvers read.
    - ``set_alpha_to_one=True`` (DDIM) is what GMSScheduler does (its last step goes to the data); any
      other key is dropped with a warning that lists it. diffusers keeps the dropped keys in the new
      config, so that converting back restores them; loading a GMSScheduler config ignores them.

    Pipelines: ``DDPMPipeline`` works with this scheduler (use a ``UNet2DModel`` with ``out_channels =
    3C`` for ``gms``). diffusers' ``DDIMPipeline`` does not: its constructor replaces whatever scheduler
    it is given by ``DDIMScheduler.from_config(scheduler.config)``, so it would sample with plain DDIM.
    Use ``DDPMPipeline`` or your own loop (``set_timesteps``, then ``step`` for each of ``timesteps``),
    or ``solver="ddim"`` here for DDIM's update.
    """

    _compatibles = ["DDPMScheduler", "DDIMScheduler"]
    order = 1

    @register_to_config
    def __init__(
        self,
        num_train_timesteps: int = 1000,
        beta_start: float = 0.0001,
        beta_end: float = 0.02,
        beta_schedule: str = "linear",
        trained_betas: Sequence[float] | None = None,
        timestep_spacing: str = "even",
        steps_offset: int = 0,
        solver: str = "gms",
        fit: str | None = None,
        select: str | None = None,
        fit_iters: int | None = None,
        eta: float | None = None,
        data_range: Sequence[float] | None = (-1.0, 1.0),
        backend: str = "auto",
        solver_options: dict | None = None,
        preset: str | None = None,
        prediction_type: str = "epsilon",
        rescale_betas_zero_snr: bool = False,
        gms_timestep_spacing: str | None = None,
        model_heads: int | None = None,
    ):
        # register_to_config has stored every argument in self.config before this body runs; the scheduler is
        # built from the config alone, so that what a saved pipeline reloads is exactly what was validated here
        self._build_from_config()
        # A pipeline records a component as [its object's __module__, class name] unless the top-level package
        # is one diffusers knows; "gms_kernels" (where gk.GMSScheduler is found) loads after `import gms_kernels`
        # alone, "gms_kernels.integrations.scheduler" only once that module is imported. (Set on the object, not the class,
        # whose module stays this one for pickle and inspect.)
        self.__module__ = "gms_kernels"

    def _build_from_config(self) -> None:
        c = self.config
        if c.prediction_type != "epsilon":
            raise ValueError(f"GMSScheduler needs noise heads (prediction_type='epsilon'), got {c.prediction_type!r}")
        if c.rescale_betas_zero_snr:
            raise ValueError("GMSScheduler does not support rescale_betas_zero_snr=True: with zero terminal SNR "
                             "(a_T = 0) the moments of x0 given x_T are undefined")
        spacing = _spacing(c.timestep_spacing, c.gms_timestep_spacing)
        if c.solver not in SCHEDULER_SOLVERS:
            raise ValueError(f"unknown solver {c.solver!r} for GMSScheduler; valid: {', '.join(SCHEDULER_SOLVERS)}")
        if c.backend not in BACKENDS:
            raise ValueError(f"unknown backend {c.backend!r}; valid: {', '.join(BACKENDS)}")
        T = c.num_train_timesteps
        if isinstance(T, bool) or not isinstance(T, numbers.Integral):
            raise TypeError(f"num_train_timesteps must be a positive integer (T of the training schedule, e.g. 1000), "
                            f"got {T!r} ({type(T).__name__})")
        if T < 1:
            raise ValueError(f"num_train_timesteps must be a positive integer (T of the training schedule, e.g. 1000), "
                             f"got {T!r}")
        T = int(T)  # (a numpy integer would not be saved as JSON)
        solver_options = c.solver_options
        if solver_options is not None:
            if not isinstance(solver_options, Mapping):
                raise TypeError(f"solver_options must be a dict {{option name: value}} or None, got "
                                f"{type(solver_options).__name__} {solver_options!r}; e.g. "
                                "solver_options={'var_floor': 1e-4}")
            solver_options = dict(solver_options)
            bad = [k for k in solver_options if not isinstance(k, str)]
            if bad:
                names = ", ".join(k for k in SOLVERS[c.solver].options if k not in ARGUMENT_KEYS)
                raise TypeError(f"solver_options' keys must be option names (strings), got {bad[0]!r}; solver "
                                f"{c.solver!r} takes: {names or 'none'}")
            if isinstance(solver_options.get("skew_scale"), Mapping):  # (checked before JSON makes its keys strings,
                check_skew_scale(dict(solver_options["skew_scale"]))  # which the steps read back as time indices)
        # the config is saved as JSON: keep tensors / arrays / tuples there as lists
        trained_betas = json_ready(c.trained_betas, "trained_betas")
        data_range = json_ready(c.data_range, "data_range")
        solver_options = None if solver_options is None else json_ready(solver_options, "solver_options")
        self.register_to_config(num_train_timesteps=T, trained_betas=trained_betas, data_range=data_range,
                                solver_options=solver_options)
        if trained_betas is not None and len(trained_betas) != T:
            raise ValueError(f"trained_betas has {len(trained_betas)} entries but num_train_timesteps is {T}")
        self._data_range = check_data_range(data_range)
        self._spec = get_solver(c.solver)
        _check_model_heads(c.model_heads, c.solver, self._spec.heads)
        self._spacing = spacing
        # the keys diffusers' own schedulers read, in their terms (beta_schedule "cosine" is diffusers'
        # "squaredcos_cap_v2", the same betas)
        beta_schedule = "squaredcos_cap_v2" if c.beta_schedule == "cosine" else c.beta_schedule
        defaults = [k for k in c.get("_use_default_values", ()) if k not in _CARRIED_KEYS]
        self.register_to_config(timestep_spacing=DIFFUSERS_SPACING[spacing], gms_timestep_spacing=spacing,
                                beta_schedule=beta_schedule, **clip_keys(self._data_range),
                                **({"_use_default_values": defaults} if "_use_default_values" in c else {}))
        if spacing == "quad":
            warn_user("GMSScheduler: timestep_spacing 'quad' has no diffusers equivalent; its config gives "
                      "diffusers' schedulers (DDPMScheduler.from_config(...)) the nearest one, 'leading', and "
                      "keeps 'quad' in gms_timestep_spacing for GMSScheduler")
        options = self._solver_options(c.solver, c.fit, c.select, c.fit_iters, c.eta, solver_options, c.preset)
        self._options = self._spec.resolve(options, T)  # once, and so failing now, not at the first step

        self.schedule = Schedule(make_betas(T, c.beta_start, c.beta_end, c.beta_schedule, trained_betas))
        # float32 views for pipelines that read them (img2img-style code uses alphas_cumprod)
        self.betas = self.schedule.betas.to(torch.float32)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = self.schedule.alphas_cumprod.to(torch.float32)
        self.init_noise_sigma = 1.0

        self.num_inference_steps: int | None = None
        self.custom_timesteps = False
        self._pending: DeferredFiniteCheck | None = None  # the last Triton step's NaN/inf flag, not yet read
        self._set(list(range(T - 1, -1, -1)), None)

    # -- configuration -----------------------------------------------------------------------------
    @property
    def spacing(self) -> str:
        """The timestep spacing ``set_timesteps`` uses (``config.gms_timestep_spacing``)."""
        return self._spacing

    def with_model_heads(self, heads: int) -> "GMSScheduler":
        """A copy whose config says that the network gives ``heads`` heads (see ``model_heads``)."""
        _check_model_heads(heads, self.config.solver, self._spec.heads)
        out = copy.deepcopy(self)
        defaults = [k for k in self.config.get("_use_default_values", ()) if k != "model_heads"]
        out.register_to_config(model_heads=int(heads),
                               **({"_use_default_values": defaults} if "_use_default_values" in self.config else {}))
        return out

    @staticmethod
    def _solver_options(solver: str, fit: str | None, select: str | None, fit_iters: int | None, eta: float | None,
                        extra: dict | None, preset: str | None) -> dict[str, Any]:
        valid = SOLVERS[solver].options
        options = {}
        if "fit" in valid:  # GMS: only what the caller names; gk.step's defaults fill in the rest
            named = {"preset": preset, "fit": fit, "select": select, "fit_iters": fit_iters}
            options.update({k: v for k, v in named.items() if v is not None})
        elif preset is not None:
            raise ValueError(f"preset applies to solver 'gms', not {solver!r}")
        if "eta" in valid and eta is not None:
            options["eta"] = float(eta)
        for key, value in dict(extra or {}).items():
            if key in ARGUMENT_KEYS:
                raise ValueError(f"pass {key!r} as a GMSScheduler argument, not in solver_options")
            if key == "weights":
                value = tuple(value)
            elif key == "gamma" and value is not None:  # (a list in the config) the table the steps index
                value = as_tensor_on(value, torch.float64)
            options[key] = value
        return options

    @classmethod
    def from_config(cls, config: dict[str, Any] | None = None, return_unused_kwargs: bool = False, **kwargs):
        """``ConfigMixin.from_config``, after translating the keys of a DDPMScheduler / DDIMScheduler
        config that have an equivalent here and warning about the ones that are dropped (see the
        class docstring). diffusers itself drops the keys of its compatible schedulers silently.
        A ``timestep_spacing`` passed here replaces the config's ``gms_timestep_spacing`` too."""
        if "timestep_spacing" in kwargs:
            kwargs.setdefault("gms_timestep_spacing", None)
        if isinstance(config, dict):
            config = cls._translate_foreign_config(config, kwargs)
        return super().from_config(config, return_unused_kwargs=return_unused_kwargs, **kwargs)

    @classmethod
    def _source_class(cls, config: Mapping[str, Any]) -> type | None:
        """The diffusers scheduler class a foreign config belongs to: its ``_class_name`` (a saved config),
        else (an in-memory config has none) the compatible class whose arguments are all among its keys."""
        import diffusers

        name = config.get("_class_name")
        keys = {k for k in config if not k.startswith("_")}
        for candidate in ([name] if isinstance(name, str) else cls._compatibles):
            source = getattr(diffusers, candidate, None)
            if not (isinstance(source, type) and issubclass(source, SchedulerMixin)) or source is cls:
                continue
            if isinstance(name, str) or set(inspect.signature(source.__init__).parameters) - {"self"} <= keys:
                return source
        return None

    @classmethod
    def _source_defaults(cls, config: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """``config`` with the shared keys its class left at their defaults (or did not write) set to that
        class's default where it differs from this one's, as the source scheduler would read them."""
        source = cls._source_class(config)
        if source is None:
            return config
        defaults = set(config.get("_use_default_values", ()))
        theirs = inspect.signature(source.__init__).parameters
        ours = inspect.signature(cls.__init__).parameters
        changed = {}
        for key, param in theirs.items():
            if key in ours and key not in kwargs and (key in defaults or key not in config) \
                    and param.default is not inspect.Parameter.empty and param.default != ours[key].default:
                changed[key] = param.default
        if not changed:
            return config
        config = {**config, **changed}
        if "_use_default_values" in config:
            config["_use_default_values"] = [k for k in config["_use_default_values"] if k not in changed]
        return config

    @classmethod
    def _translate_foreign_config(cls, config: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        if config.get("_class_name") == cls.__name__:
            return config  # our own config: extra keys are those an earlier conversion kept (and reported)
        config = cls._source_defaults(config, kwargs)
        own = set(inspect.signature(cls.__init__).parameters) - {"self"}
        defaults = set(config.get("_use_default_values", ()))  # keys the source left at its defaults
        foreign = {k: v for k, v in config.items() if not k.startswith("_") and k not in own and k not in defaults}
        if not foreign:
            return config
        config = dict(config)
        source = config.get("_class_name", "the source config")
        dropped = []
        if any(k in foreign for k in _CLIP_KEYS) and "data_range" not in kwargs:
            r = float(config.get("clip_sample_range", 1.0))
            implied = (-r, r) if config.get("clip_sample", True) else None
            if "data_range" not in config:
                config["data_range"] = implied
            elif not _same_clipping(config, check_data_range(config["data_range"])):
                # (a GMSScheduler config converted and back, its clip keys changed in between: its range wins)
                warn_user(f"GMSScheduler.from_config: {source} clips to {implied!r} (clip_sample="
                          f"{config.get('clip_sample', True)!r}, clip_sample_range={r!r}) but keeps "
                          f"data_range={config['data_range']!r}, which is used. Pass data_range= to choose")
        for key in _CLIP_KEYS:
            foreign.pop(key, None)
        if foreign.get("thresholding"):
            extra = ", ".join(f"{k}={config[k]!r}" for k in _THRESHOLDING_KEYS[1:] if k in config)
            data_range = kwargs.get("data_range", config.get("data_range", (-1.0, 1.0)))
            warn_user(f"GMSScheduler.from_config: {source} sets thresholding=True ({extra}); dynamic "
                      "thresholding has no equivalent in GMSScheduler and is not applied. Its steps clamp "
                      f"to data_range={data_range!r} instead.")
        for key in _THRESHOLDING_KEYS:
            foreign.pop(key, None)
        if foreign.get("set_alpha_to_one", True):  # True: GMSScheduler's last step goes to the data, a = 1
            foreign.pop("set_alpha_to_one", None)
        if "variance_type" in foreign:
            variance_type = foreign.pop("variance_type")
            solver = kwargs.get("solver", config.get("solver", "gms"))
            if variance_type in ("learned", "learned_range") and getattr(SOLVERS.get(solver), "heads", 0) > 1:
                # the UNet of such a pipeline outputs [eps, variance]: never read the variance as E[eps^2]
                raise ValueError(f"{source} has variance_type={variance_type!r}: its UNet's channels after eps are a "
                                 f"learned variance, not the E[eps^2] (and E[eps^3]) heads that solver={solver!r} "
                                 "reads. Add heads (gms-kernels train-heads --model PIPELINE_DIR, then "
                                 "gk.models.export_diffusers), or convert with solver='ddpm', 'ddpm-large' or 'ddim'")
            hint = _VARIANCE_HINT.get(variance_type)
            dropped.append(f"variance_type={variance_type!r} (the solver sets the variance, here solver={solver!r}"
                           + (f"; DDPM's {variance_type!r} is solver={hint!r}" if hint else "") + ")")
        dropped += [f"{k}={v!r}" for k, v in foreign.items()]
        if dropped:
            warn_user(f"GMSScheduler.from_config ignores these settings of {source}: {'; '.join(dropped)}")
        return config

    # -- timesteps ---------------------------------------------------------------------------------
    def _set(self, ts: list[int], device: torch.device | str | None) -> None:
        self._check_pending()  # (a loop left before its last step)
        self._ts = ts
        self._position = {t: i for i, t in enumerate(ts)}
        self.timesteps = torch.tensor(ts, dtype=torch.long, device=device)

    def set_timesteps(self, num_inference_steps: int | None = None, device: torch.device | str | None = None,
                      timesteps: Sequence[int] | None = None) -> None:
        """Choose the timesteps: ``num_inference_steps`` = N of them (N network calls) with the
        configured ``timestep_spacing`` (:func:`inference_timesteps`), or an explicit strictly
        descending list ``timesteps`` of integer indices in [0, T-1] (see :func:`time_indices`)."""
        T = self.config.num_train_timesteps
        if (num_inference_steps is None) == (timesteps is None):
            raise ValueError("pass exactly one of num_inference_steps or timesteps")
        device = None if device is None else check_device(device, allow_meta=True)
        if timesteps is not None:
            ts = trajectory(T, 0, time_indices(timesteps))
            self.custom_timesteps = True
            self.num_inference_steps = len(ts)
        else:
            n = num_inference_steps
            try:
                n = None if isinstance(n, bool) else operator.index(n)  # numpy/torch integers too
            except TypeError:
                n = None
            if n is None or not 1 <= n <= T:
                raise ValueError(f"num_inference_steps must be an integer in [1, {T}] (the number of network calls), "
                                 f"got {num_inference_steps!r}")
            num_inference_steps = n
            ts = inference_timesteps(T, num_inference_steps, self._spacing)
            if self._spacing == "leading" and self.config.steps_offset:
                ts = [t + int(self.config.steps_offset) for t in ts]
                if ts[0] >= T:
                    raise ValueError(f"steps_offset={self.config.steps_offset} moves the first timestep to "
                                     f"{ts[0]} >= T = {T}")
            self.custom_timesteps = False
            self.num_inference_steps = num_inference_steps
        self._set(ts, device)

    def previous_timestep(self, timestep: int | torch.Tensor) -> int:
        """The timestep after ``timestep`` in ``self.timesteps`` (-1 = data after the last one)."""
        return self._after(self._index(timestep))

    def _after(self, i: int) -> int:
        """The timestep after entry i of ``self.timesteps`` (-1 = data after the last one)."""
        return self._ts[i + 1] if i + 1 < len(self._ts) else DATA

    def _index(self, timestep: int | torch.Tensor) -> int:
        given = timestep
        if torch.is_tensor(timestep):
            i = self._position_in_timesteps(timestep)
            if i is not None:
                return i
            values = timestep.flatten().unique()
            if values.numel() != 1:
                raise ValueError(f"step() takes one timestep for the whole batch, got {timestep.tolist()}")
            timestep = values.item()
        if isinstance(timestep, bool) or not isinstance(timestep, numbers.Real) or not math.isfinite(timestep):
            raise ValueError(f"timestep must be an integer time index, one of scheduler.timesteps (an int or a "
                             f"one-element tensor, as `for t in scheduler.timesteps` gives), got {given!r} "
                             f"({type(given).__name__})")
        t = int(timestep) if float(timestep).is_integer() else None
        if t is None or t not in self._position:
            raise ValueError(f"timestep {timestep} is not one of scheduler.timesteps ({len(self._ts)} entries, "
                             f"{self._ts[0]} ... {self._ts[-1]}); call set_timesteps and step through "
                             "scheduler.timesteps")
        return self._position[t]

    def _position_in_timesteps(self, timestep: torch.Tensor) -> int | None:
        """Where ``timestep`` sits in ``self.timesteps`` when it is one of its elements (``for t in
        scheduler.timesteps`` yields such views), found from its memory, not its value: reading a
        device tensor's value waits for the device's queue. None for any other tensor."""
        own = self.timesteps
        if (timestep.numel() != 1 or timestep.dtype != own.dtype or timestep.device != own.device
                or timestep.untyped_storage().data_ptr() != own.untyped_storage().data_ptr()):
            return None
        i = timestep.storage_offset() - own.storage_offset()
        return i if 0 <= i < len(self._ts) else None

    def _check_pending(self) -> None:
        """Read the NaN/inf flag of the last Triton step, if one is still unread."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.raise_if_set()

    # -- diffusers interface -----------------------------------------------------------------------
    def scale_model_input(self, sample: torch.Tensor, timestep: int | torch.Tensor | None = None) -> torch.Tensor:
        return sample

    def step(self, model_output: torch.Tensor, timestep: int | torch.Tensor, sample: torch.Tensor,
             generator: Any = None, return_dict: bool = True,
             variance_noise: torch.Tensor | None = None) -> GMSSchedulerOutput | tuple:
        """One reverse step from ``timestep`` to the next entry of ``self.timesteps`` (or to data).

        ``model_output`` is the network's output tensor (``unet(...).sample``), the heads concatenated
        along dim 1 (3C for gms, 2C for sn-ddpm, C for ddpm/ddim); ``sample`` a floating-point
        [N, C, ...] tensor. ``variance_noise`` (as in DDIMScheduler.step): the standard normal noise of
        this step, shaped like ``sample``, instead of one drawn from ``generator`` (which GMS still uses
        to choose each mixture component). Returns ``GMSSchedulerOutput(prev_sample,
        pred_original_sample)`` or, with ``return_dict=False``, the tuple ``(prev_sample, pred_original_sample)``.
        """
        check_state_tensor(sample, "sample")  # (an integer sample would come back truncated)
        check_model_output(model_output)
        if variance_noise is not None and (not torch.is_tensor(variance_noise) or not variance_noise.is_floating_point()
                                           or variance_noise.shape != sample.shape):
            raise ValueError(f"variance_noise must be a tensor shaped like sample {tuple(sample.shape)} (standard "
                             f"normal noise for this step), got {_describe(variance_noise)}; e.g. "
                             "torch.randn_like(sample), or leave it out to draw it from generator")
        self._check_not_learned_variance(model_output, sample)
        i = self._index(timestep)
        t, s = self._ts[i], self._after(i)
        work = sample.dtype if sample.dtype in (torch.float32, torch.float64) else torch.float32
        x_t = sample.to(work)
        out = model_output.to(device=sample.device, dtype=work)
        noise = None if variance_noise is None else variance_noise.to(device=sample.device, dtype=work)
        # The previous step's flag: the network call queued since then runs after that step's kernel,
        # so this read does not wait for it. This step's flag is read at the next step, or at once
        # for the last step (to the data), so that a loop never ends on an unread flag.
        self._check_pending()
        pending = None
        if s != DATA and resolve_backend(self.config.backend, sample.device, work) == "triton":
            heads = split_heads(out, x_t, self._spec.heads, self.config.solver, check_finite=False)
            pending = DeferredFiniteCheck(x_t, heads, f"at timestep {t} ")
        prev = gk_step(x_t, out, t, s, self.schedule, self.config.solver, fixed_seeds(generator),
                       data_range=self._data_range, noise=noise, backend=self.config.backend,
                       nonfinite_flag=None if pending is None else pending.flag, options=self._options)
        if pending is not None:
            pending.launched()
            self._pending = pending
        x0 = self._pred_original(x_t, out, t)
        prev, x0 = prev.to(sample.dtype), x0.to(sample.dtype)
        if not return_dict:
            return prev, x0
        return GMSSchedulerOutput(prev_sample=prev, pred_original_sample=x0)

    def _check_not_learned_variance(self, model_output: torch.Tensor, sample: torch.Tensor) -> None:
        """Refuse an output of 2C channels under sn-ddpm, which reads it as [E[eps], E[eps^2]], unless the config
        says the network gives heads: 2C is diffusers' learned-variance layout [eps, variance] (gk.sample refuses
        such a UNet too)."""
        c, needed = sample.shape[1], self._spec.heads
        # (gms reads 3C: a 2C output is too short for it, which split_heads reports)
        if needed != 2 or self.config.model_heads is not None or model_output.dim() < 2 \
                or model_output.shape[1] != 2 * c:
            return
        from ..model_io import HEAD_NAMES, add_heads_hint, learned_variance_note

        raise ValueError(f"solver {self.config.solver!r} needs {needed} heads ({', '.join(HEAD_NAMES[:needed])}) but "
                         f"model_output has {2 * c} channels for {c}-channel samples: {learned_variance_note(c)}. "
                         f"{add_heads_hint(None)}. If the network's channels are the heads [E[eps], E[eps^2]], say "
                         "so with GMSScheduler(..., model_heads=2) (gk.models.export_diffusers writes it)")

    def _pred_original(self, x_t: torch.Tensor, model_output: torch.Tensor, t: int) -> torch.Tensor:
        """The clamped E[x0|x_t] from the e1 head (what the solvers use as the x0 estimate)."""
        c = x_t.shape[1]
        e1 = model_output[:, :c].to(torch.float64)
        return clamped_x0_mean(x_t.to(torch.float64), e1, self.schedule.alpha(t), self.schedule.sigma(t), self._data_range)

    def add_noise(self, original_samples: torch.Tensor, noise: torch.Tensor,
                  timesteps: int | torch.Tensor) -> torch.Tensor:
        """x_t = a_t x0 + sigma_t eps with one timestep per sample (or one for all); fp16 is upcast to float32.

        ``noise`` must have the shape of ``original_samples`` (no broadcasting over the batch)."""
        if not torch.is_tensor(original_samples) or not original_samples.is_floating_point():
            raise TypeError(f"original_samples must be a floating-point tensor [N, ...], got "
                            f"{_describe(original_samples)}")
        if not torch.is_tensor(noise) or not noise.is_floating_point() or noise.shape != original_samples.shape:
            raise ValueError(f"noise must be a floating-point tensor shaped like original_samples "
                             f"{tuple(original_samples.shape)}, got {_describe(noise)}; e.g. "
                             "torch.randn_like(original_samples)")
        given = as_tensor_on(timesteps).flatten().cpu()
        if given.dtype == torch.bool or (given.is_floating_point() and not (given == given.round()).all()):
            raise ValueError(f"timesteps must be integer time indices, got {given.tolist()}")
        t = given.to(torch.long)
        T = self.config.num_train_timesteps
        if ((t < 0) | (t >= T)).any():
            raise ValueError(f"timesteps must lie in [0, {T - 1}], got {t.tolist()}")
        if t.numel() not in (1, original_samples.shape[0]):
            raise ValueError(f"got {t.numel()} timesteps for a batch of {original_samples.shape[0]}")
        dtype = original_samples.dtype
        work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        abar = self.schedule.alphas_cumprod[t]  # float64
        shape = (-1,) + (1,) * (original_samples.dim() - 1)
        a = abar.sqrt().reshape(shape).to(original_samples.device, work)
        sigma = (1.0 - abar).sqrt().reshape(shape).to(original_samples.device, work)
        x = a * original_samples.to(work) + sigma * noise.to(original_samples.device, work)
        return x.to(dtype)

    def __len__(self) -> int:
        return self.config.num_train_timesteps
