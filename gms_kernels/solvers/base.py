"""What every solver shares: the :class:`Solver` base class, the registry, typed options, the step's randomness
and the official code's last step (step 5 of the pipeline of GMS, https://arxiv.org/abs/2311.00941).

A solver is one subclass of :class:`Solver` in one file. It names itself, the heads it reads and its options
(a frozen dataclass, checked once when it is built), and gives either its float64 per-step form
(:meth:`Solver.step`, used by ``gk.step``, ``GMSScheduler`` and ``gk.sample``'s loop) or a loop of its own
(:meth:`Solver.loop`, for solvers whose step needs more than one model output, ``gk.sample`` only). It may also give
the fused kernels' config of its step (:meth:`Solver.fused_config`) and named option sets (``presets``).
:func:`register` puts an instance in :data:`SOLVERS`, the one list of the library's solvers; every other list (the
command line's choices, the scheduler's solvers, the FID tables' rows) is read from it.

A solver of your own needs no registration: pass the instance where a name goes
(``gk.sample(model, shape, solver=MySolver())``, ``gk.step(..., solver=MySolver())``)::

    @dataclass(frozen=True)
    class HalfNoiseOptions(LastStepOptions):
        scale: float = 0.5

        def __post_init__(self):
            super().__post_init__()
            self._set("scale", real(self.scale, "scale", 0.0, 1.0, "the factor on the noise"))

    class HalfNoise(Solver):
        name, heads, Options = "half-noise", 1, HalfNoiseOptions

        def step(self, x_t, heads, k, rand, o, data_range, T):
            m1 = transition_moments(x_t, heads[0], None, None, k, data_range).m1
            return m1 + o.scale * math.sqrt(k.lam2) * rand.normal(), {"m1": m1}
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch

from ..core.moments import (DataRange, TransitionMoments, check_pixel_levels, clamped_x0_mean, last_step_variance_cap,
                            transition_moments)
from ..core.progress import progress_bar
from ..core.random import STREAM_COMPONENT, STREAM_STEP_NOISE, SampleNoise
from ..core.schedule import DATA, Schedule, StepCoefficients
from ..kernels import MODE_CLOSED, MODE_ADAN, MODE_DENOISE, FusedStepConfig, NonFiniteInput, config_fields
from ..kernels.dispatch import fused_step
from ..model_io import Conditioning, call_model, check_inputs_finite, nonfinite_output_error, split_heads


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


# -- options ------------------------------------------------------------------------------------------------------

def real(value: Any, name: str, low: float, high: float, what: str, open_low: bool = False) -> float:
    """``value`` as a float, refused unless it is a real number in [low, high] (or (low, high])."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (low < value if open_low else low <= value) or not value <= high:
        interval = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be a number in {interval} ({what}), got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SolverOptions:
    """A solver's options, checked once when built (the same rules for every backend; the fused kernels take the
    values as they are). Subclasses add fields and check them in ``__post_init__``."""

    # options the fused kernels do not implement, with the value that leaves a step as it is: a step that sets
    # another value (for a per-step mapping, at any step) runs the float64 torch reference
    torch_only: ClassVar[Mapping[str, Any]] = {}

    def __post_init__(self) -> None:
        pass

    def _set(self, name: str, value: Any) -> None:
        """Store the checked form of a field (the dataclass is frozen once built)."""
        object.__setattr__(self, name, value)

    def check_schedule(self, T: int) -> None:
        """Checks that need the schedule's length T (tables indexed by time)."""

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def sets_torch_only_option(self) -> bool:
        for name, off in self.torch_only.items():
            value = getattr(self, name)
            if any(v != off for v in (value.values() if isinstance(value, dict) else (value,))):
                return True
        return False


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


@dataclass(frozen=True)
class LastStepOptions(SolverOptions):
    """The official code's last steps: the step into data returns the denoised mean (``denoise_final``), the step into
    s = 0 draws a Gaussian (``gaussian_last_step``, GMS) whose std is capped at ``clip_pixel`` pixel levels times
    sqrt(pi/2), a pixel level being the step between two of the ``pixel_levels`` values a pixel takes in the data
    (256 for 8-bit images; None: no cap)."""

    gaussian_last_step: bool = True
    denoise_final: bool = True
    clip_pixel: float = 1.0
    pixel_levels: int | None = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        _flag(self.gaussian_last_step, "gaussian_last_step")
        _flag(self.denoise_final, "denoise_final")
        self._set("clip_pixel", real(self.clip_pixel, "clip_pixel", 0.0, math.inf,
                                     "the last step's std cap in pixel levels", open_low=True))
        self._set("pixel_levels", check_pixel_levels(self.pixel_levels))


# -- solvers and the registry ---------------------------------------------------------------------------------------

class Solver:
    """One solver: its name, the heads [e1, e2, e3] it reads, its options, and either :meth:`step` or :meth:`loop`.

    ``presets``: named option sets, applied under the options the caller names. ``candidates``: the option sets
    :func:`gms_kernels.eval.tuning.choose_options` compares by default. ``requires``: the options the caller
    must give (no default serves). ``label``: its name in tables (default: the name in capitals); ``in_paper``: one of
    the rows of the GMS paper's FID tables.
    ``calls_per_step``: network calls per step (None: adaptive); the last step, into data, makes one.
    """

    name: ClassVar[str] = ""
    heads: ClassVar[int] = 1
    Options: ClassVar[type[SolverOptions]] = SolverOptions
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    candidates: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    requires: ClassVar[tuple[str, ...]] = ()
    label: ClassVar[str] = ""
    in_paper: ClassVar[bool] = False
    calls_per_step: ClassVar[int | None] = 1

    def __repr__(self) -> str:
        return f"<solver {self.name!r}>"

    # what a solver gives
    def step(self, x_t: torch.Tensor, heads: list[torch.Tensor], k: StepCoefficients, rand: StepRandomness,
             o: SolverOptions, data_range: DataRange, T: int) -> tuple[torch.Tensor, dict]:
        """The float64 step t -> s (s > data or, without ``denoise_final``, also into data); returns (x_s, info)."""
        raise ValueError(f"solver {self.name!r} has no one-step form (its step needs the model at other points "
                         f"than x_t, or the previous step's output): use gk.sample(..., solver={self.name!r})")

    def loop(self, e1: Callable[..., torch.Tensor], x: torch.Tensor, ts: Sequence[int], schedule: Schedule,
             noise: SampleNoise, data_range: DataRange, o: SolverOptions,
             callback: Callable[[dict], None] | None = None, progress: bool = False) -> tuple[torch.Tensor, dict]:
        """The whole reverse process from x at ts[0] through ``ts`` to data, with the eps head ``e1(x, t, rows=None)``
        (:class:`EpsFunction`); returns (x0, info with ``nfe``)."""
        raise NotImplementedError

    def fused_config(self, k: StepCoefficients, data_range: DataRange, o: SolverOptions, T: int, batch: int,
                     per_sample: int, scalars: dict[str, Any]) -> FusedStepConfig | None:
        """The fused kernels' config of the step t -> s (``scalars``: :func:`gms_kernels.kernels.config_fields`);
        None where the kernels do not do it."""
        return None

    # what follows from it
    @property
    def table_label(self) -> str:
        """Its row's name in a table."""
        return self.label or self.name.upper()

    @property
    def per_step(self) -> bool:
        """Whether the solver has a one-step form (``gk.step``, ``GMSScheduler``)."""
        return type(self).step is not Solver.step

    @property
    def fusable(self) -> bool:
        """Whether the fused kernels run (some of) its steps."""
        return type(self).fused_config is not Solver.fused_config

    @property
    def options(self) -> dict[str, Any]:
        """Its options and their defaults."""
        return {f.name: f.default for f in dataclasses.fields(self.Options)}

    def network_calls(self, points: int) -> int:
        """Network calls of a run visiting ``points`` time indices (then stepping into data in one call)."""
        if self.calls_per_step is None:
            raise ValueError(f"{self.name}'s network calls are adaptive: read them from the callback's 'nfe'")
        return self.calls_per_step * points - (self.calls_per_step - 1)

    def resolve(self, options: Mapping[str, Any] | SolverOptions | None = None, T: int | None = None) -> SolverOptions:
        """The caller's options over a named preset over the defaults, checked; an options object passes as it is.
        ``T``, the schedule's length where the caller knows it, also checks tables indexed by time."""
        if isinstance(options, self.Options):
            if T is not None:
                options.check_schedule(T)
            return options
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise TypeError(f"solver options must be a dict {{name: value}}, got {type(options).__name__}")
        valid = self.options
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)} for solver {self.name!r}; "
                             f"valid: {', '.join(valid) or 'none'}")
        values = {}
        preset = options.get("preset")
        if preset is not None:
            if preset not in self.presets:
                raise ValueError(f"unknown preset {preset!r} for solver {self.name!r}; valid: "
                                 f"{', '.join(self.presets) or 'none'}")
            values.update(self.presets[preset])  # under the options the caller names
        values.update(options)
        o = self.Options(**values)
        if T is not None:
            o.check_schedule(T)
        return o

    def heads_read(self, k: StepCoefficients, o: SolverOptions) -> int:
        """How many of the heads [e1, e2, e3] the step t -> s reads: the step into data with ``denoise_final`` reads
        e1 alone. A NaN or inf is refused in exactly these, on every backend (the fused kernels check what they
        read)."""
        if k.s == DATA and getattr(o, "denoise_final", False):
            return min(self.heads, 1)
        return self.heads


SOLVERS: dict[str, Solver] = {}
"""The library's solvers by name, filled as their modules register them (``gms_kernels.solvers`` imports them all)."""


def register(solver: Solver) -> Solver:
    """Add ``solver`` to :data:`SOLVERS` under its name."""
    if not solver.name or solver.name in SOLVERS:
        raise ValueError(f"a solver needs a name of its own, got {solver.name!r}")
    SOLVERS[solver.name] = solver
    return solver


def get_solver(solver: str | Solver) -> Solver:
    """The registered solver of that name; a :class:`Solver` instance passes as it is."""
    if isinstance(solver, Solver):
        return solver
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; valid solvers: {', '.join(SOLVERS)}")
    return SOLVERS[solver]


def resolve_options(solver: str | Solver, options: Mapping[str, Any] | SolverOptions | None = None,
                    T: int | None = None) -> SolverOptions:
    """``solver``'s options from the caller's (see :meth:`Solver.resolve`)."""
    return get_solver(solver).resolve(options, T)


def with_model_defaults(solver: Solver, options: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """The caller's ``options`` over the options ``model`` recommends for ``solver``.

    A model may carry ``solver_defaults``, a mapping {solver name: {option: value}} (the shipped models carry the
    settings chosen on their own validation split). They take the place of the library's defaults, and give way to
    every option the caller names, a preset included: a preset the caller names sets its options over the model's,
    as it does over the library's. ValueError for a malformed or invalid table."""
    table = getattr(model, "solver_defaults", None)
    if table is None:
        return dict(options)
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise ValueError(f"the model's solver_defaults must map solver names to option dicts, got {table!r}")
    recommended = dict(table.get(solver.name, {}))
    try:
        solver.resolve(recommended)
    except ValueError as err:
        raise ValueError(f"the model's solver_defaults for {solver.name!r}: {err}") from None
    preset = options.get("preset")  # (the model's own preset, if any, is replaced below as every named option is)
    if preset is not None:
        for key in solver.presets.get(preset, {}):  # (an unknown preset is refused by resolve)
            recommended.pop(key, None)
    return {**recommended, **options}


# -- shared pieces of the steps --------------------------------------------------------------------------------------

def gaussian(m1: torch.Tensor, var: torch.Tensor | float, rand: StepRandomness) -> torch.Tensor:
    """A draw of N(m1, var) (var clamped at 0)."""
    std = var.clamp_min(0.0).sqrt() if torch.is_tensor(var) else math.sqrt(max(var, 0.0))
    return m1 + std * rand.normal()


def learned_gaussian(mom: TransitionMoments, k: StepCoefficients, rand: StepRandomness, o: LastStepOptions,
                     data_range: DataRange) -> tuple[torch.Tensor, dict]:
    """N(M1, Var); the step into s = 0 caps Var like the official code."""
    var = mom.var
    cap = last_step_variance_cap(data_range, o.clip_pixel, o.pixel_levels) if k.s == 0 else None
    if cap is not None:
        var = var.clamp(0.0, cap)
    return gaussian(mom.m1, var, rand), {"m1": mom.m1, "var": var}


def denoise_coefficients(k: StepCoefficients) -> StepCoefficients:
    """Coefficients of t -> data (from step t -> s), whose M1 is E[x0|x_t]."""
    return StepCoefficients(t=k.t, s=DATA, a_t=k.a_t, sigma_t=k.sigma_t, a_s=1.0, sigma_s=0.0,
                            a_ts=k.a_t, beta_ts=k.sigma_t**2, c1=0.0, c2=1.0, lam2=0.0)


def denoised_and_eps(x_t: torch.Tensor, e1: torch.Tensor, a_t: float | torch.Tensor, sigma_t: float | torch.Tensor,
                     data_range: DataRange) -> tuple[torch.Tensor, torch.Tensor]:
    """(E[x0|x_t] clamped to ``data_range``, the eps it implies): the denoiser D and the noise estimate the
    sigma-space samplers (SEEDS, EDM, GGF) use. With ``data_range=None`` eps is e1 itself; with a range, eps is
    recomputed from the clamped x0, as DDIM does here, so every solver sees the same clamped x0 estimate.
    ``a_t``/``sigma_t`` may be tensors broadcasting against x_t (per-sample times)."""
    x0 = clamped_x0_mean(x_t, e1, a_t, sigma_t, data_range)
    return x0, (e1 if data_range is None else (x_t - a_t * x0) / sigma_t)


def exponential_loop(e1: EpsFn, x: torch.Tensor, ts: Sequence[int], schedule: Schedule, data_range: DataRange,
                     advance: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int], tuple[torch.Tensor, int]],
                     desc: str, callback: Callable[[dict], None] | None = None,
                     progress: bool = False) -> tuple[torch.Tensor, dict]:
    """The loop the exponential integrators in lambda share (SEEDS-2, SEEDS-3, DPM-Solver++(2M) SDE): per step
    t -> s, one network call at x_t gives the clamped x0 and its eps (:func:`denoised_and_eps`); the step into data
    returns that x0, any other step ``advance(x_t, x0, eps, t, s)``, which returns (x_s, the further network calls
    it made). Runs in float64, returns (x0 in x's dtype, {"nfe": calls}); each callback dict carries the step, t, s,
    sigma (the VE sigma of t), x, the denoised x0 and ``nfe``, the calls so far."""
    dtype = x.dtype
    x, calls = x.to(torch.float64), 0
    for i, t in enumerate(progress_bar(ts, progress, desc=desc, leave=False)):
        s = ts[i + 1] if i + 1 < len(ts) else DATA
        x0, eps = denoised_and_eps(x, e1(x, t), schedule.alpha(t), schedule.sigma(t), data_range)
        calls += 1
        if s == DATA:
            x = x0
        else:
            x, more = advance(x, x0, eps, t, s)
            calls += more
        if callback is not None:
            callback({"step": i, "i": i, "t": t, "s": s, "sigma": schedule.ve_sigma(t), "x": x.to(dtype, copy=True),
                      "denoised": x0.to(dtype), "nfe": calls})
    return x.to(dtype), {"nfe": calls}


# -- one step on any backend -----------------------------------------------------------------------------------------

def fused_config(solver: str | Solver, options: Mapping[str, Any] | SolverOptions, k: StepCoefficients,
                 data_range: DataRange, T: int, batch: int, per_sample: int) -> FusedStepConfig | None:
    """The fused kernels' config of one step of ``solver`` with ``options``; None when the step is not one they do.
    Memoised: a sampling loop makes the same steps again and again, and building the config costs more than a small
    step. The memo is keyed on the options' values, never on an object's identity, so that a tensor the caller edits
    in place between two calls (a gamma table) gives a new config."""
    spec = get_solver(solver)
    o = spec.resolve(options, T)
    key = (spec, tuple((f.name, _value_key(getattr(o, f.name))) for f in dataclasses.fields(o)), k, data_range, T,
           batch, per_sample)
    return _memo_fused_config(key, _Unhashed(o))


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
    """The resolved options beside the memo key: equal to every other, so that the key alone decides a hit."""

    def __init__(self, options: SolverOptions):
        self.options = options

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Unhashed)

    def __hash__(self) -> int:
        return 0


@functools.lru_cache(maxsize=256)
def _memo_fused_config(key: tuple, options: _Unhashed) -> FusedStepConfig | None:
    spec, _, k, data_range, T, batch, per_sample = key
    o = options.options
    if not spec.fusable or o.sets_torch_only_option():
        return None
    scalars = config_fields(k, data_range)
    if k.s == DATA and getattr(o, "denoise_final", False):
        return FusedStepConfig(mode=MODE_DENOISE, **scalars)
    return spec.fused_config(k, data_range, o, T, batch, per_sample, scalars)


def solver_step(solver: str | Solver, x_t: torch.Tensor, heads: list[torch.Tensor], k: StepCoefficients,
                rand: StepRandomness, data_range: DataRange, T: int, options: Mapping[str, Any] | SolverOptions,
                backend: str = "torch", want_info: bool = True, where: str = "",
                nonfinite_flag: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """One step t -> s of ``solver``; t -> data returns the denoised mean by default (``denoise_final``).

    ``options``: the solver's options object (a dict is resolved first). ``backend`` 'cpp' and 'triton' run the steps
    of the fusable solvers (:attr:`Solver.fusable`) in one fused kernel that draws the same Philox streams (it needs a
    generator, not explicit noise); everything else, and the 'torch' backend, runs the solver's float64 step. A NaN or
    inf in x_t or the heads raises a ValueError that names it (``where`` says which step); the fused kernels check
    while they read. With ``nonfinite_flag`` the Triton kernel only sets that flag, for the caller to read later.
    """
    spec = get_solver(solver)
    o = spec.resolve(options, T)
    if backend != "torch" and rand.shares_streams:
        cfg = fused_config(spec, o, k, data_range, T, x_t.shape[0], math.prod(x_t.shape[1:]))
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
    check_inputs_finite(x_t, heads[:spec.heads_read(k, o)], where)  # (what the step reads, as the kernels check)
    x_t = x_t.to(torch.float64)
    heads = [h.to(torch.float64) for h in heads]
    if k.s == DATA and getattr(o, "denoise_final", False):
        x0 = transition_moments(x_t, heads[0], None, None, k, data_range).m1
        return x0, {"x0": x0}
    return spec.step(x_t, heads, k, rand, o, data_range, T)


# -- the network as the loops of multi-point solvers call it -----------------------------------------------------------

EpsFn = Callable[..., torch.Tensor]  # e1(x, t, rows=None): see EpsFunction


class EpsFunction:
    """e1(x, t, rows=None): the model's eps head in float64 at index t (an int, or one index per sample), the
    model fed ``dtype`` and called with ``conditioning`` (its keyword arguments of the samples ``rows`` of the
    batch, and guidance; None: plain ``model(x, t)``); :attr:`calls` counts the network calls. ``rows`` names the
    samples of the batch that x holds (None: all of them), so that per-sample conditioning follows a loop that steps
    samples apart (GGF).

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
