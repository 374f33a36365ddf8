"""Property-based bad input: every call either raises a ValueError/TypeError from inside gms_kernels whose message
names the argument at fault, or returns what the float64 torch reference returns, within the stated tolerance.

Each example draws a valid call (shape, dtype, backend, solver, option values, seed, times, model output) and
then, most of the time, corrupts exactly one argument. The default profile tries 2,000 steps and 400 sampling
runs (about 35 s on 2 cores); ``GMS_HYPOTHESIS_PROFILE=long`` tries 20,000 and 4,000.
"""
from __future__ import annotations

import math
import os
import re
import traceback
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import gms_kernels as gk  # noqa: E402
from gms_kernels.kernels.dispatch import backend_available  # noqa: E402
from gms_kernels.core.fit import MAX_FIT_ITERS  # noqa: E402
from gms_kernels.solvers import SOLVERS  # noqa: E402

settings.register_profile("default", max_examples=2000, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", max_examples=20000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILE = os.environ.get("GMS_HYPOTHESIS_PROFILE", "default")

SCHEDULE = gk.Schedule.linear()
T = SCHEDULE.T
BACKENDS = ["torch"] + (["cpp"] if backend_available("cpp") else [])
ONE_CALL = [name for name, spec in SOLVERS.items() if spec.per_step and name != "exact"]
MULTI_CALL = [name for name, spec in SOLVERS.items() if not spec.per_step]
# the largest difference from the float64 reference, relative to 1 + |reference|, per output dtype: float32 and
# below round the result; a float32 ADAN loop (up to 40 iterations, then the default is float64) adds a little
TOLERANCE = {torch.float64: 1e-9, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
ADAN_FP32_TOLERANCE = 1e-3


@dataclass
class Call:
    """One gk.step call, and the argument a corruption made bad (None: every argument is valid)."""

    x_t: Any
    model_output: Any
    t: Any
    s: Any
    solver: str
    generator: Any
    kwargs: dict = field(default_factory=dict)
    schedule: Any = SCHEDULE
    bad: str | None = None  # a regex that the error message must match


def good_options(solver: str, t: int) -> st.SearchStrategy[dict]:
    """Valid option values of ``solver`` (a subset of its options, each drawn from its accepted range)."""
    last = {"gaussian_last_step": st.booleans(), "denoise_final": st.booleans(),
            "clip_pixel": st.floats(0.1, 4.0)}
    per_solver = {
        "ddpm": dict(last, variance_interp=st.floats(0.0, 1.0)),
        "ddpm-large": dict(last),
        "sn-ddpm": dict(last, variance_scale=st.floats(0.25, 4.0)),
        "ddim": dict(last, eta=st.floats(0.0, 1.0)),
        "analytic-dpm": dict(last),
        "seeds-1": {"prediction": st.sampled_from(["noise", "data"])},
        "euler-ancestral": {"eta": st.floats(0.0, 1.0)},
        "gms": dict(last, fit=st.sampled_from(["closed", "adan"]), select=st.sampled_from(["sample", "pixel"]),
                    weights=st.sampled_from([(1 / 3, 2 / 3), (0.25, 0.75), (0.6, 0.4)]),
                    fit_iters=st.integers(0, 40), lr=st.sampled_from([0.06, 0.01, "paper"]),
                    var_floor=st.floats(0.0, 1.0), adan_mean=st.sampled_from(["sample", "batch"]),
                    adan_precision=st.sampled_from([None, "float32", "float64"]),
                    variance_scale=st.floats(0.5, 2.0), skew_threshold=st.floats(0.0, 2.0),
                    skew_scale=st.one_of(st.floats(0.0, 2.0), st.builds(lambda v: {t: v}, st.floats(0.0, 2.0)))),
    }[solver]
    names = sorted(per_solver)
    chosen = st.lists(st.sampled_from(names), unique=True, max_size=len(names)) if names else st.just([])
    options = chosen.flatmap(lambda keys: st.fixed_dictionaries({k: per_solver[k] for k in keys}))
    if solver == "analytic-dpm":  # its gamma table is required
        options = options.map(lambda o: dict(o, gamma=torch.linspace(0.2, 0.9, T, dtype=torch.float64)))
    return options


# bad values of each option, and of the other arguments
BAD_OPTION_VALUES = {
    "variance_interp": [-0.5, 2.0, math.nan, "a", True], "variance_scale": [0.0, -1.0, 1e9, math.inf, "x"],
    "eta": [-0.1, 1.5, math.nan, None], "clip_pixel": [0.0, -1.0, math.inf, "1"],
    "gaussian_last_step": [1, "yes", None], "denoise_final": [0, "no"], "prediction": ["eps", 1],
    "fit": ["newton", 1, None], "select": ["image", 0], "weights": [(0.5, 0.5), (0.2, 0.2), (1.2, -0.2), "ab", 3],
    "fit_iters": [-1, 2.5, MAX_FIT_ITERS + 1, 10**9, "25", True], "lr": [0.0, -0.06, "fast", math.nan, 1e9],
    "var_floor": [-0.1, 1.5, math.nan, "0.1"], "adan_mean": ["pixel", None], "adan_precision": ["fp16", 32],
    "skew_threshold": [-1.0, math.nan, "0"], "skew_scale": [-0.5, 1e6, {-1: 1.0}, {"a": 1.0}, {}, math.nan],
    "preset": ["paper", 1], "gamma": [torch.rand(10), 0.5, "abc", torch.rand(T, 2)],
}
BAD_SCHEDULES = [None, "linear", 1000, torch.linspace(1e-4, 0.02, T)]


@st.composite
def calls(draw) -> Call:
    solver = draw(st.sampled_from(ONE_CALL))
    heads = SOLVERS[solver].heads
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    spatial = draw(st.lists(st.integers(1, 5), min_size=0, max_size=2))
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    t = draw(st.integers(1, T - 1))
    s = draw(st.one_of(st.just(-1), st.integers(0, t - 1)))
    seed = draw(st.integers(0, 2**20))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, *spatial, generator=g, dtype=torch.float64)
    e1 = 0.8 * torch.randn(x.shape, generator=g, dtype=torch.float64)
    var = 0.05 + 0.3 * torch.rand(x.shape, generator=g, dtype=torch.float64)
    skew = 0.3 * torch.randn(x.shape, generator=g, dtype=torch.float64) * var**1.5
    out = torch.cat([e1, var + e1**2, e1**3 + 3 * e1 * var + skew][:max(heads, 1)], 1)
    if draw(st.booleans()):  # a non-contiguous layout of the same values
        x, out = x.transpose(0, 1).contiguous().transpose(0, 1), out.transpose(0, 1).contiguous().transpose(0, 1)
    generator = draw(st.one_of(st.integers(0, 2**63 - 1), st.lists(st.integers(0, 2**63 - 1), min_size=n, max_size=n)))
    kwargs = {"backend": draw(st.sampled_from(BACKENDS)), **draw(good_options(solver, t))}
    if isinstance(generator, int) and draw(st.booleans()):
        kwargs["first_index"] = draw(st.integers(0, 1000))
    call = Call(x.to(dtype), out.to(dtype), t, s, solver, generator, kwargs)
    if draw(st.integers(0, 4)) == 0:
        return call  # every argument valid
    corrupt(draw, call, heads)
    return call


def corrupt(draw, call: Call, heads: int) -> None:
    """Make exactly one argument of ``call`` bad, and record what its error must name."""
    options = sorted(o for o in SOLVERS[call.solver].options if o in BAD_OPTION_VALUES)
    kinds = ["x_t", "output", "nonfinite", "time", "generator", "first_index", "unknown_option", "schedule",
             "backend", "noise", "uniform", "data_range", "solver"] + (["option"] * 4 if options else [])
    kind = draw(st.sampled_from(kinds))
    x, out = call.x_t, call.model_output
    if kind == "x_t":
        call.x_t = draw(st.sampled_from([x.to(torch.int32), x.to(torch.complex64), x > 0, x.tolist(), x.reshape(-1)]))
        call.bad = r"x_t"
    elif kind == "output":
        c = x.shape[1]
        bad = draw(st.sampled_from(["few", "odd", "many", "int", "batch", "list"]))
        need = max(heads, 1) * c
        call.model_output = {"few": out[:, :need - 1] if need > 1 else out[:, :0], "odd": torch.cat([out, out[:, :1]], 1),
                             "many": torch.cat([out] * 4, 1), "int": out.to(torch.int64),
                             "batch": torch.cat([out, out]), "list": out.tolist()}[bad]
        if bad == "odd" and c == 1:  # (one more channel of 1-channel data is one more head: still valid if <= 3)
            call.model_output = torch.cat([out] * 4, 1)
        call.bad = r"model (output|returned)|head|channels"
    elif kind == "nonfinite":
        target = draw(st.sampled_from(["x", "out"]))
        bad_value = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        original = x if target == "x" else out[:, :heads_read(call, heads) * x.shape[1]]
        flat = original.reshape(-1).clone()
        flat[draw(st.integers(0, flat.numel() - 1))] = bad_value
        tensor = flat.reshape(original.shape)
        if target == "out":  # (the bad value in a head the step reads; the others pass unread)
            tensor = torch.cat([tensor, out[:, tensor.shape[1]:]], 1)
        if target == "x":
            call.x_t, call.bad = tensor, r"x_t .*non-finite"
        else:
            call.model_output, call.bad = tensor, r"model output .*non-finite"
    elif kind == "time":
        which = draw(st.sampled_from(["t", "s"]))
        value = draw(st.sampled_from([call.t + 0.5, T, T + 5, -2, "a", None, math.nan]))
        if which == "t":
            call.t = value
        else:
            call.s = draw(st.sampled_from([value, call.t, call.t + 1]))
        call.bad = r"\bt\b|\bs\b|time index|s < t|T\)"
    elif kind == "generator":
        n = x.shape[0]
        call.generator = draw(st.sampled_from([-1, 2**63, 1.5, "seed", [0] * (n + 1), [0] * (n - 1) + ["a"],
                                               [0] * (n - 1) + [2**64]]))
        call.kwargs.pop("first_index", None)
        call.bad = r"generator|seed"
    elif kind == "first_index":
        call.generator = 0
        call.kwargs["first_index"] = draw(st.sampled_from([-1, 1.5, "a", None, True]))
        call.bad = r"first_index"
    elif kind == "unknown_option":
        call.kwargs["not_an_option"] = 1
        call.bad = r"unknown option.*not_an_option"
    elif kind == "schedule":
        call.schedule = draw(st.sampled_from(BAD_SCHEDULES))
        call.bad = r"schedule"
    elif kind == "backend":
        call.kwargs["backend"] = draw(st.sampled_from(["gpu", "CPP", "", 3]))
        call.bad = r"backend"
    elif kind == "noise":
        call.kwargs["noise"] = draw(st.sampled_from([torch.full_like(x, math.nan), torch.zeros(x.shape[0] + 1, *x.shape[1:]),
                                                    x.to(torch.int32) if x.numel() else "z", "z"]))
        call.bad = r"noise"
    elif kind == "uniform":
        call.kwargs["uniform"] = draw(st.sampled_from([torch.full((x.shape[0],), 1.5), torch.full((x.shape[0],), -0.1),
                                                      torch.zeros(x.shape[0] + 1), torch.zeros(x.shape[0], dtype=torch.int64)]))
        call.bad = r"uniform"
    elif kind == "data_range":
        call.kwargs["data_range"] = draw(st.sampled_from([(1.0, -1.0), (0.0, 0.0), (0.0, math.inf), "ab", 3]))
        call.bad = r"data_range"
    elif kind == "solver":
        call.solver = draw(st.sampled_from(["GMS", "dpm", "", 3]))
        call.bad = r"solver"
    else:
        name = draw(st.sampled_from(options))
        call.kwargs[name] = draw(st.sampled_from(BAD_OPTION_VALUES[name]))
        call.bad = re.escape(name)


def heads_read(call: Call, heads: int) -> int:
    """The heads a step reads: e1 alone into data (denoise_final, the default), e1 and e2 for GMS's Gaussian
    last step (gaussian_last_step, the default), else all the solver's."""
    if call.s == -1 and call.kwargs.get("denoise_final", True):
        return 1
    if call.solver == "gms" and call.s == 0 and call.kwargs.get("gaussian_last_step", True):
        return 2
    return max(heads, 1)


def run(call: Call) -> torch.Tensor:
    return gk.step(call.x_t, call.model_output, call.t, call.s, call.schedule, call.solver, call.generator,
                   **call.kwargs)


def raised_inside_the_package(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and f"{os.sep}gms_kernels{os.sep}" in frames[-1].filename


def check(call: Call) -> None:
    try:
        x_s = run(call)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        assert call.bad is not None, f"a valid call was refused: {type(exc).__name__}: {message}"
        assert raised_inside_the_package(exc), f"raised outside gms_kernels: {type(exc).__name__}: {message}"
        assert re.search(call.bad, message), f"the error does not name the argument ({call.bad!r}): {message}"
        return
    assert call.bad is None, f"a bad argument ({call.bad!r}) was accepted"
    reference = gk.step(
        call.x_t.to(torch.float64), call.model_output.to(torch.float64), call.t, call.s, call.schedule, call.solver,
        call.generator, **dict(call.kwargs, backend="torch"))
    assert x_s.dtype == call.x_t.dtype and x_s.shape == call.x_t.shape
    tolerance = TOLERANCE[x_s.dtype]
    if call.kwargs["backend"] != "torch":  # (the fused kernels compute in float32, float64 samples too)
        tolerance = max(tolerance, TOLERANCE[torch.float32])
    if call.kwargs.get("fit") == "adan" and call.kwargs.get("adan_precision") != "float64" and call.kwargs["backend"] != "torch":
        tolerance = max(tolerance, ADAN_FP32_TOLERANCE)
    error = ((x_s.to(torch.float64) - reference).abs() / (1.0 + reference.abs())).max() if x_s.numel() else 0.0
    assert error <= tolerance, f"differs from the float64 reference by {float(error):.3g} (tolerance {tolerance:g})"


@settings(settings.get_profile(PROFILE))
@given(calls())
def test_a_step_either_names_the_bad_argument_or_matches_the_float64_reference(call):
    check(call)


# -- gk.sample ----------------------------------------------------------------------------------------------

def analytic_model(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Heads of a smooth made-up posterior: e1 = x/2, Var = 0.3, a small skew (enough for every solver)."""
    e1 = 0.5 * x
    return torch.cat([e1, e1**2 + 0.3, e1**3 + 0.9 * e1 + 0.01], 1)


@st.composite
def sample_calls(draw) -> tuple[dict, str | None]:
    solver = draw(st.sampled_from(ONE_CALL + MULTI_CALL))
    kwargs: dict[str, Any] = {"solver": solver, "shape": (draw(st.integers(1, 3)), draw(st.integers(1, 2)), 3, 3),
                              "steps": draw(st.integers(1, 4)), "generator": draw(st.integers(0, 2**40)),
                              "backend": draw(st.sampled_from(BACKENDS)), "progress": False}
    if solver == "analytic-dpm":
        kwargs["gamma"] = torch.linspace(0.2, 0.9, T, dtype=torch.float64)
    if draw(st.booleans()):
        kwargs["trajectory"] = sorted(draw(st.sets(st.integers(0, T - 1), min_size=1, max_size=4)), reverse=True)
    if draw(st.integers(0, 3)) == 0:
        return kwargs, None
    kind = draw(st.sampled_from(["trajectory", "steps", "dtype", "device", "callback", "shape", "first_index",
                                 "model"]))
    bad = {"trajectory": (st.sampled_from([5, None, [float("nan")], [999.5, 10.2], [10, 999], [T], []]),
                          r"trajectory|time index"),
           "steps": (st.sampled_from([0, -1, 2.5, "3", T + 1]), r"steps"),
           "dtype": (st.sampled_from(["float32", torch.int32, torch.complex64, float]), r"dtype"),
           "device": (st.sampled_from(["gpu", "meta", "cuda:7", 3.5]), r"device"),
           "callback": (st.sampled_from([5, "print"]), r"callback"),
           "shape": (st.sampled_from([(0, 1, 3, 3), (2,), (2, -1, 3), (2, 1.5, 3)]), r"shape"),
           "first_index": (st.sampled_from([-1, 1.5, "a"]), r"first_index"),
           "model": (st.sampled_from([lambda x: x, 5]), r"model")}[kind]
    value = draw(bad[0])
    if kind == "steps":
        kwargs.pop("trajectory", None)
    if kind == "device" and torch.cuda.is_available() and value == "cuda:7" and torch.cuda.device_count() > 7:
        return kwargs, None
    if kind == "model":
        return dict(kwargs, model=value), bad[1]
    return dict(kwargs, **{kind: value}), bad[1]


@settings(settings.get_profile(PROFILE), max_examples=max(settings.get_profile(PROFILE).max_examples // 5, 20))
@given(sample_calls())
def test_a_sampling_run_either_names_the_bad_argument_or_matches_the_torch_backend(drawn):
    kwargs, bad = drawn
    model = kwargs.pop("model", analytic_model)
    try:
        x = gk.sample(model, **kwargs)
    except (TypeError, ValueError) as exc:
        assert bad is not None, f"a valid call was refused: {type(exc).__name__}: {exc}"
        assert raised_inside_the_package(exc), f"raised outside gms_kernels: {type(exc).__name__}: {exc}"
        assert re.search(bad, str(exc)), f"the error does not name the argument ({bad!r}): {exc}"
        return
    assert bad is None, f"a bad argument ({bad!r}) was accepted"
    reference = gk.sample(model, **dict(kwargs, backend="torch"))  # (the same dtype: GGF's step decisions would
    # turn float32-vs-float64 rounding into other step sequences)
    assert x.shape == reference.shape and torch.isfinite(x).all()
    assert ((x.double() - reference).abs() / (1.0 + reference.abs())).max() <= 1e-4
