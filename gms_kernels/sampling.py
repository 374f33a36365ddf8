"""The sampling loop, the drop-in single step, and Analytic-DPM's Gamma estimator (step 6)."""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Sequence

import torch

from .model_io import (Conditioning, adapt_model, call_model, check_inputs_finite, check_model_heads,
                       check_model_signature, check_positive_ints, check_state_tensor, check_time_input,
                       make_conditioning, split_heads)
from .core.moments import DataRange, check_data_range, clamped_x0_mean
from .core.progress import progress_bar
from .core.random import STREAM_INITIAL, GeneratorLike, SampleNoise, check_first_index
from .core.schedule import DATA, Schedule, StepCoefficients, check_schedule, schedule_for, trajectory as make_trajectory
from .kernels.dispatch import resolve_backend
from .core.devices import check_device, generator_device, module_device
from .solvers import (EpsFunction, Solver, SolverOptions, StepRandomness, get_solver,
                      solver_step, with_model_defaults)

Model = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# gk.sample's network for model=None and its samples' shape (C, ...), installed by the package (the embedded digits
# model); this module imports no model of its own
_default_model: Callable[[], tuple[Model, tuple[int, ...]]] | None = None


def set_default_model(load: Callable[[], tuple[Model, tuple[int, ...]]]) -> None:
    """Install the network :func:`sample` runs for ``model=None``: ``load()`` returns it and its samples' shape."""
    global _default_model
    _default_model = load


def _load_default_model() -> tuple[Model, tuple[int, ...]]:
    if _default_model is None:
        raise ValueError("no default model is installed: pass model=")
    return _default_model()


def step(x_t: torch.Tensor, model_output: torch.Tensor | None, t: int, s: int, schedule: Schedule,
         solver: str | Solver = "gms", generator: GeneratorLike = None, *, data_range: DataRange = (-1.0, 1.0),
         noise: torch.Tensor | None = None, uniform: torch.Tensor | None = None, first_index: int = 0,
         return_info: bool = False, backend: str = "auto", nonfinite_flag: torch.Tensor | None = None,
         options: SolverOptions | None = None, **solver_options: Any) -> torch.Tensor | tuple[torch.Tensor, dict]:
    """One transition x_t -> x_s (s < t; s = -1 means data) for use inside any sampling loop.

    ``solver``: a name of :data:`gms_kernels.solvers.SOLVERS` or a :class:`~gms_kernels.solvers.Solver` of your own.
    Its options go in ``solver_options``, or, resolved once for a whole loop, in ``options``
    (``get_solver(name).resolve({...}, schedule.T)``).

    ``model_output`` holds the heads [e1, e2, e3] concatenated along dim 1. Randomness comes from
    ``generator`` (int seed, torch.Generator, or one per sample) or from explicit ``noise``/``uniform``.
    ``backend``: ``"auto"`` (Triton on CUDA, C++ on CPU, else torch), ``"triton"``, ``"cpp"`` or
    ``"torch"`` (the float64 reference); ``GMS_KERNELS_BACKEND`` overrides it.
    A NaN or inf in x_t or the heads raises a ValueError. The Triton kernel reports one through a
    flag on the device, which costs a host sync to read; pass ``nonfinite_flag`` (an int32 tensor
    of one element on x_t's device, zero) to have the kernel set it to 1 instead, and read it
    yourself before trusting x_s (e.g. once the next network call is queued, as :func:`sample`
    and :class:`gms_kernels.GMSScheduler` do). The other backends raise at once and ignore it.
    With classifier-free guidance pass :func:`gms_kernels.model_io.guided_heads` of the two branches'
    outputs, the rule :func:`sample` uses.
    Returns x_s in the dtype of x_t (and the fitted quantities if ``return_info``).
    """
    spec = get_solver(solver)
    if not spec.per_step:
        raise ValueError(f"solver {spec.name!r} has no one-step form (its step needs the model at other points than "
                         f"x_t, or the previous step's output): use gk.sample(..., solver={spec.name!r})")
    if options is not None and solver_options:
        raise ValueError(f"pass the solver's options either resolved (options=) or by name "
                         f"({', '.join(solver_options)}), not both")
    data_range = check_data_range(data_range)
    check_state_tensor(x_t)
    schedule = check_schedule(schedule)  # (a diffusers scheduler or its config becomes a gk.Schedule)
    first_index = check_first_index(first_index)
    _check_explicit_randomness(x_t, noise, uniform)
    k = schedule.coefficients(t, s)
    where = f"at t={k.t} "
    heads = [] if spec.heads == 0 else split_heads(model_output, x_t, spec.heads, spec.name, where, check_finite=False)
    source = None
    if noise is None or uniform is None:
        source = _step_noise(generator, x_t.shape[0], first_index)
    rand = StepRandomness(source, t, x_t, noise, uniform)
    o = spec.resolve(solver_options if options is None else options, schedule.T)
    x_s, info = solver_step(spec, x_t, heads, k, rand, data_range, schedule.T, o,
                            resolve_backend(backend, x_t.device, x_t.dtype), return_info, where, nonfinite_flag)
    if x_s.dtype != x_t.dtype:
        x_s = x_s.to(x_t.dtype)
    return (x_s, info) if return_info else x_s


def _check_explicit_randomness(x_t: torch.Tensor, noise: torch.Tensor | None, uniform: torch.Tensor | None) -> None:
    if noise is not None:
        if not torch.is_tensor(noise) or noise.shape != x_t.shape:
            got = tuple(noise.shape) if torch.is_tensor(noise) else type(noise).__name__
            raise ValueError(f"noise must be a tensor shaped like x_t {tuple(x_t.shape)}, got {got}")
        if not noise.is_floating_point():
            raise TypeError(f"noise must be a real floating-point tensor, got {noise.dtype}")
        check_inputs_finite(noise, [], x_name="noise")
    if uniform is not None:
        if not torch.is_tensor(uniform) or uniform.shape not in (x_t.shape[:1], x_t.shape):
            got = tuple(uniform.shape) if torch.is_tensor(uniform) else type(uniform).__name__
            raise ValueError(f"uniform must be a tensor [N] = {tuple(x_t.shape[:1])} (one per sample) or shaped "
                             f"like x_t {tuple(x_t.shape)} (one per element), got {got}")
        if not uniform.is_floating_point():
            raise TypeError(f"uniform must be a real floating-point tensor, got {uniform.dtype}")
        if uniform.numel() and not bool(((uniform >= 0) & (uniform < 1)).all()):  # (NaN fails both)
            raise ValueError("uniform must hold numbers in [0, 1) (they choose each mixture component), got "
                             f"values from {float(uniform.min())} to {float(uniform.max())}")


def _step_noise(generator: GeneratorLike, batch: int, first_index: int) -> SampleNoise:
    """gk.step's SampleNoise: for an int seed the same (read-only) one for every call with that batch,
    so that a loop of gk.step calls builds it, and copies it to the device, once."""
    if isinstance(generator, int) and not isinstance(generator, bool):
        return _seeded_noise(generator, batch, first_index)
    return SampleNoise.create(generator, batch, first_index)


@functools.lru_cache(maxsize=16)
def _seeded_noise(seed: int, batch: int, first_index: int) -> SampleNoise:
    return SampleNoise.create(seed, batch, first_index)


def sample(model: Model | None = None, shape: Sequence[int] | None = None, x_T: torch.Tensor | None = None,
           steps: int = 10, solver: str | Solver = "gms", schedule: Schedule | None = None,
           trajectory: str | Sequence[int] = "even", generator: GeneratorLike = None, progress: bool = True,
           callback: Callable[[dict], None] | None = None, data_range: DataRange = (-1.0, 1.0), *,
           time_input: str | None = None, first_index: int = 0, dtype: torch.dtype = torch.float32,
           device: torch.device | str | None = None, backend: str = "auto",
           model_kwargs: dict[str, Any] | None = None, guidance_scale: float | None = None,
           null_kwargs: dict[str, Any] | None = None, **solver_options: Any) -> torch.Tensor:
    """Draw samples by solving the reverse process with ``solver`` in ``steps`` steps.

    ``trajectory`` is a kind of :func:`gms_kernels.core.schedule.trajectory` (the time indices visited for ``steps``)
    or an explicit descending list of indices, which then fixes the steps by itself (``steps`` is not used).

    ``solver``: a name of :data:`gms_kernels.solvers.SOLVERS` or a :class:`~gms_kernels.solvers.Solver` of your own.
    Without a model, the embedded digits model is used (16 samples of 1x8x8 unless ``shape`` says).

    ``model(x_t, t)`` returns the heads [e1, e2, e3] concatenated along dim 1 in one forward pass
    (e1 alone suffices for ddpm/ddim, e1 and e2 for sn-ddpm). ``time_input`` is ``"index"``
    (integer t), ``"index+1"`` or ``"scaled"`` (t*1000/T); by default the model's ``time_input``
    attribute, else ``"index"``. Sample i is a function of (seed, ``first_index`` + i) only, so it
    does not depend on the batch it is drawn in (up to the network's rounding between batch sizes,
    which ``ggf``'s step decisions can amplify: :func:`gms_kernels.solvers.ggf.sample_ggf`). ``callback``
    receives, after every step, a dict with the keys of :func:`callback_info` (step, t, s, sigma, x,
    denoised: the same for every solver) and the step's fitted quantities. Solver options (e.g. fit,
    select, fit_iters, eta) go in ``solver_options``; those not named there come from the model's
    ``solver_defaults`` where it has them (:func:`gms_kernels.solvers.with_model_defaults`: the embedded
    digits model samples GMS with ``select="pixel"``, chosen on its validation split), else from the
    library's defaults. ``backend`` picks the fused GMS step as in :func:`step`. The samples are made
    on ``device``: by default x_T's device, else the device of the model's weights, else the CPU.

    Conditional networks: every network call is ``model(x_t, t, **model_kwargs)`` (class labels,
    ``encoder_hidden_states``, ...). A tensor in model_kwargs whose first dimension is the batch N holds one
    row per sample and follows its sample wherever the batch is split (GGF steps samples apart); one of 1 row
    (or 0-dim) is shared by all samples; any other value is passed as it is. The tensors are moved to the
    samples' device. ``guidance_scale=w`` with ``null_kwargs`` (the unconditional branch's arguments, e.g. the
    null class label; they override model_kwargs) is classifier-free guidance for every solver: each call
    runs both branches in one batch and forms the heads by :func:`gms_kernels.model_io.guided_heads` (the mean
    guided, the spread the conditional branch's). w = 1 calls the conditional branch alone. The exact solver
    passes model_kwargs to its oracle's ``exact_step``.
    """
    with torch.no_grad():
        _check_run_args(dtype, device, callback)
        if model is None:
            model, default_shape = _load_default_model()
            if shape is None and x_T is None:
                shape = (16, *default_shape)
        model = sampled_model(model)
        plan = _plan(model, steps, solver, schedule, trajectory, data_range, time_input, solver_options,
                     model_kwargs, guidance_scale, null_kwargs)
        spec, o, data_range, schedule, time_input, ts = plan

        if x_T is None:
            if shape is None:
                raise ValueError("pass shape=(N, C, ...) or an initial x_T")
            shape = check_positive_ints(shape, "shape (N, C, ...)")
            if len(shape) < 2:
                raise ValueError(f"shape must be (N, C, ...) with a channel dimension, got {shape}")
            noise = SampleNoise.create(generator, shape[0], first_index)
            device = _sample_device(model, device)
            x = noise.normal(STREAM_INITIAL, 0, shape[1:], device).to(dtype)  # (drawn where it is used)
        else:
            check_state_tensor(x_T, "x_T")
            if device is not None and not _same_device(device, x_T.device):
                raise ValueError(f"device={str(device)!r} but x_T is on {x_T.device}: the samples are made where x_T "
                                 "is; move x_T or leave device out")
            if shape is not None and tuple(shape) != tuple(x_T.shape):
                raise ValueError(f"shape {tuple(shape)} does not match x_T's shape {tuple(x_T.shape)}")
            check_inputs_finite(x_T, [], x_name="x_T")
            x = x_T
            noise = SampleNoise.create(generator, x.shape[0], first_index)
        cond = make_conditioning(model_kwargs, guidance_scale, null_kwargs, heads=spec.heads, batch=x.shape[0],
                                 device=x.device)
        if cond is not None and hasattr(getattr(o, "oracle", None), "exact_step"):  # (the exact solver)
            o = dataclasses.replace(o, oracle=ConditionedOracle(o.oracle, cond))

        backend = resolve_backend(backend, x.device, x.dtype)
        if not spec.per_step:  # a loop of its own (float64 torch on every backend)
            e1 = EpsFunction(model, schedule.T, time_input, spec.name, x.dtype,
                             defer=_multi_call_defers_finite_check(x.device, callback, spec), conditioning=cond)
            x = spec.loop(e1, x, ts, schedule, noise, data_range, o, callback, progress)[0]
            e1.raise_if_nonfinite()
            return x
        defer_check = backend == "triton" and callback is None  # a callback sees x at once: check at once
        pending = None
        k_label = steps if isinstance(trajectory, str) else len(ts)  # (an explicit trajectory fixes the steps)
        for i, t in enumerate(progress_bar(ts, progress, desc=f"{spec.name} K={k_label}", leave=False)):
            s = ts[i + 1] if i + 1 < len(ts) else DATA
            k = schedule.coefficients(t, s)
            heads, where = [], f"at step {i} (t={t}) "
            if spec.heads:
                out = call_model(model, x, t, schedule.T, time_input, cond)
                heads = split_heads(out, x, spec.heads, spec.name, where, check_finite=False)
            if pending is not None:
                pending.raise_if_set()
            pending = DeferredFiniteCheck(x, heads, where) if defer_check else None
            rand = StepRandomness(noise, t, x)
            x_new, info = solver_step(spec, x, heads, k, rand, data_range, schedule.T, o,
                                      backend, callback is not None, where, None if pending is None else pending.flag)
            if pending is not None:
                pending.launched()
            x_prev, x = x, x_new.to(x.dtype)
            if callback is not None:
                e1 = heads[0] if heads else split_heads(call_model(model, x_prev, t, schedule.T, time_input, cond),
                                                          x_prev, 1, spec.name, where)[0]
                callback({**info, **callback_info(i, k, x, x_prev, e1, data_range)})
        if pending is not None:
            pending.raise_if_set()
        return x


def callback_info(i: int, k: StepCoefficients, x: torch.Tensor, x_t: torch.Tensor, e1: torch.Tensor,
                  data_range: DataRange) -> dict[str, Any]:
    """The keys every solver's callback gets, as in k-diffusion: step (also ``i``), t, s, ``sigma``
    (the step's noise level sigma_t / a_t in k-diffusion's variance-exploding scale), x (the new
    state x_s), and ``denoised``: E[x0|x_t] from e1, clamped to ``data_range`` as the solvers use it."""
    denoised = clamped_x0_mean(x_t.to(torch.float64), e1.to(torch.float64), k.a_t, k.sigma_t, data_range)
    return {"step": i, "i": i, "t": k.t, "s": k.s, "sigma": k.sigma_t / k.a_t, "x": x, "denoised": denoised.to(x.dtype)}


def _plan(model: Model, steps: int, solver: str | Solver, schedule: Schedule | None, trajectory: str | Sequence[int],
          data_range: DataRange, time_input: str | None, solver_options: dict[str, Any],
          model_kwargs: object = None, guidance_scale: object = None, null_kwargs: object = None) -> tuple:
    """:func:`sample`'s arguments checked (before any network call) and completed with the model's
    defaults: (solver, its resolved options, data range, schedule, time input, trajectory). (model_kwargs' rows
    are checked once the batch is known.)"""
    spec = get_solver(solver)
    cond = make_conditioning(model_kwargs, guidance_scale, null_kwargs, heads=spec.heads)
    if cond is not None and cond.guided and not spec.heads:
        raise ValueError(f"solver {spec.name!r} draws from its oracle's exact reverse kernel and never calls a "
                         "network, so guidance_scale has nothing to guide")
    if spec.heads:  # (the exact solver never calls its oracle as a network)
        check_model_signature(model, list(cond.kwargs) if cond is not None else ())
    check_model_heads(model, spec.heads, spec.name)
    if "oracle" in spec.requires and "oracle" not in solver_options:  # (the model is the oracle)
        solver_options = dict(solver_options, oracle=model)
    solver_options = with_model_defaults(spec, solver_options, model)
    data_range = check_data_range(data_range)
    schedule = schedule_for(model, schedule)
    o = spec.resolve(solver_options, schedule.T)
    time_input = check_time_input(time_input or getattr(model, "time_input", "index"))
    ts = make_trajectory(schedule, steps, trajectory)
    return spec, o, data_range, schedule, time_input, ts


def check_sample_args(model: Model | None = None, steps: int = 10, solver: str | Solver = "gms",
                      schedule: Schedule | None = None, trajectory: str | Sequence[int] = "even",
                      data_range: DataRange = (-1.0, 1.0), *, time_input: str | None = None,
                      dtype: torch.dtype = torch.float32, backend: str = "auto",
                      device: torch.device | str | None = None, callback: Callable[[dict], None] | None = None,
                      model_kwargs: dict[str, Any] | None = None, guidance_scale: float | None = None,
                      null_kwargs: dict[str, Any] | None = None, **solver_options: Any) -> None:
    """Raise the error :func:`sample` would raise on these arguments, without sampling (so that a
    caller can refuse a bad request before it writes anything). (``dtype`` and ``callback`` are
    accepted so that :func:`sample`'s keyword arguments pass through; a dtype the model cannot take
    shows only when it is called; model_kwargs' rows are checked by whoever knows the batch.)"""
    _check_run_args(dtype, device, callback)
    model = sampled_model(model)
    _plan(model, steps, solver, schedule, trajectory, data_range, time_input, solver_options, model_kwargs,
          guidance_scale, null_kwargs)
    resolve_backend(backend, _sample_device(model, device))


class ConditionedOracle:
    """An oracle for the exact solver, its ``exact_step`` given the run's keyword arguments (the solver calls
    ``exact_step(x_t, k, uniform, noise)``; a class-conditional oracle also needs the samples' labels)."""

    def __init__(self, oracle: Any, conditioning: Conditioning):
        step_fn = getattr(oracle, "exact_step", None)
        if callable(step_fn):
            try:
                inspect.signature(step_fn).bind(None, None, None, None, **conditioning.kwargs)
            except TypeError as exc:
                raise TypeError(f"model_kwargs: the exact solver passes them to the oracle's exact_step, which "
                                f"cannot take them ({exc})") from None
            except ValueError:  # (no signature to read)
                pass
        self.oracle, self.kwargs = oracle, conditioning.kwargs

    def exact_step(self, x_t: torch.Tensor, k: StepCoefficients, uniform: torch.Tensor,
                   noise: torch.Tensor) -> torch.Tensor:
        return self.oracle.exact_step(x_t, k, uniform, noise, **self.kwargs)


def _check_run_args(dtype: object, device: object, callback: object) -> None:
    """:func:`sample`'s ``dtype``, ``device`` and ``callback``, checked before any work."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch dtype (torch.float32, torch.float64, torch.float16, "
                        f"torch.bfloat16), got {dtype!r}")
    if device is not None:
        check_device(device)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be a function of one dict (called after every step), got "
                        f"{type(callback).__name__}")


def sampled_model(model: Model | None) -> Model:
    """The network :func:`sample` runs for ``model``: the embedded digits model for None, a raw diffusers
    ``UNet2DModel`` / ``GMSDiffusersModel`` made a gms_kernels model, anything else as it is."""
    if model is None:
        model = _load_default_model()[0]
    return adapt_model(model)


def _same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether two devices can be the same one (a device named without an index, e.g. "cuda", matches any index)."""
    a, b = torch.device(a), torch.device(b)
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _sample_device(model: Model, device: torch.device | str | None) -> torch.device:
    """Where :func:`sample` draws x_T: ``device`` if given, else where the model's weights are, else the CPU."""
    if device is not None:
        return torch.device(device)
    return module_device(model) or torch.device("cpu")


def _multi_call_defers_finite_check(device: torch.device, callback: Callable | None, solver: str | Solver) -> bool:
    """Whether a solver's own loop reads its per-call NaN/inf verdicts once, at the end. Off the CPU a read per
    network call would stall the host per call; not with a callback, which sees x at once, nor for an adaptive
    solver (GGF), whose step-size decisions read the device anyway."""
    return device.type != "cpu" and callback is None and get_solver(solver).calls_per_step is not None


class DeferredFiniteCheck:
    """The Triton kernel's NaN/inf flag for one step of a sampling loop (:func:`sample`, the
    scheduler), read only once the next network call is queued: the read then finds the step's
    kernel done, and the device never idles while the host catches up (an immediate read costs a
    sync per step). On CUDA the flag travels to pinned host memory behind the kernel and an event
    marks its arrival, since ``.item()`` would wait for the whole queue, the next network call
    included. The step's inputs are kept to name the culprit."""

    def __init__(self, x_t: torch.Tensor, heads: list[torch.Tensor], where: str):
        self.flag = torch.zeros(1, dtype=torch.int32, device=x_t.device)
        self.x_t, self.heads, self.where = x_t, heads, where
        self._host: torch.Tensor | None = None
        self._arrived = None

    def launched(self) -> None:
        """Call right after the step's kernel is queued."""
        if self.flag.is_cuda:
            self._host = torch.empty(1, dtype=torch.int32, device="cpu", pin_memory=True)
            self._host.copy_(self.flag, non_blocking=True)
            self._arrived = torch.cuda.Event()
            self._arrived.record()

    def raise_if_set(self) -> None:
        if self._arrived is not None:
            self._arrived.synchronize()  # this step's kernel and the copy, not what was queued after
            value = int(self._host[0])
        else:
            value = int(self.flag.item())
        if value:
            check_inputs_finite(self.x_t, self.heads, self.where)  # names it, unless the model reused its buffer
            raise ValueError(f"x_t or the model output {self.where}has non-finite values (NaN or inf)")


def estimate_gamma(model: Model, x0: torch.Tensor, schedule: Schedule, timesteps: Sequence[int] | None = None,
                   time_input: str | None = None, batch_size: int = 256,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Analytic-DPM's Gamma_t = E_q(x_t) ||eps_theta(x_t, t)||^2 / d, estimated on data ``x0``.

    Returns a float64 table of length T, NaN where t was not estimated (default: all t).
    """
    with torch.no_grad():
        model = adapt_model(model)
        time_input = check_time_input(time_input or getattr(model, "time_input", "index"))
        steps = range(schedule.T) if timesteps is None else [int(t) for t in timesteps]
        table = torch.full((schedule.T,), float("nan"), dtype=torch.float64, device="cpu")
        for t in steps:
            total, count = 0.0, 0
            for batch in x0.split(batch_size):
                eps = torch.randn(batch.shape, generator=generator, dtype=batch.dtype,
                                  device=generator_device(generator)).to(batch.device)  # (then where the data are)
                x_t = schedule.add_noise(batch, eps, t).to(batch.dtype)
                e1 = split_heads(call_model(model, x_t, t, schedule.T, time_input), x_t, 1, "analytic-dpm")[0]
                total += float(e1.to(torch.float64).pow(2).sum())
                count += e1.numel()
            table[t] = total / count
        return table
