"""The C++ kernels compiled for every CPU target (csrc/step_target.cpp; x86-64: avx512, avx2, sse2)
against the float64 torch reference, each target forced in turn on this machine.

One build holds all targets and picks the best at import; ``gk.kernels.set_cpu_target`` (or the
environment variable GMS_KERNELS_CPU_TARGET) runs a lower one, so the default test run covers the
AVX2 and SSE2 code on an AVX-512 machine without a second build. The whole backend suite on a lower
target: test_portable_build.py.
"""
from pathlib import Path

import numpy as np
import pytest
import torch

import gms_kernels as gk
from gms_kernels.core import random as rng
from gms_kernels.kernels import cpp, cpu_info, set_cpu_target
from gms_kernels.core.random import SampleNoise
from gms_kernels.solvers import fused_config, get_solver, resolve_options

if not cpp.available():
    pytest.fail(f"the C++ extension is not available ({cpp.import_error()})", pytrace=False)

TARGETS = cpu_info()["supported"]
SCHED = gk.Schedule.linear(1000)
GAMMA = torch.linspace(0.0, 0.6, 1000, dtype=torch.float64)
# solver, heads read, options
SOLVERS = [("ddpm", 1, {}), ("ddpm-large", 1, {}), ("ddim", 1, {}), ("ddim", 1, {"eta": 0.7}),
           ("analytic-dpm", 1, {"gamma": GAMMA}), ("sn-ddpm", 2, {}), ("gms", 3, {}),
           ("gms", 3, {"fit": "adan", "fit_iters": 5}), ("gms", 3, {"select": "pixel"})]
STEPS = [(500, 400), (30, 0), (10, -1)]  # an inner step, the step to 0 (capped variances), to data


@pytest.fixture
def target(request):
    """Runs the test with the kernels of target request.param, then restores the best one."""
    set_cpu_target(request.param)
    try:
        yield request.param
    finally:
        set_cpu_target(None)


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every output buffer of the launcher starts as NaN: an element left unwritten shows."""
    monkeypatch.setattr(cpp, "_new_buffer", lambda shape: torch.full(shape, float("nan"), dtype=torch.float32))


def heads(x: torch.Tensor, count: int, seed: int = 0) -> torch.Tensor:
    """count heads [e1, e2, e3] of plausible moments (e2 >= e1^2, skewed e3), stacked along dim 1."""
    g = torch.Generator().manual_seed(seed)
    e1 = 0.5 * torch.randn(x.shape, generator=g)
    var = 0.05 + 0.5 * torch.rand(x.shape, generator=g)
    e3 = e1**3 + 3 * e1 * var + 0.1 * torch.randn(x.shape, generator=g)
    return torch.cat([e1, e1**2 + var, e3][:count], dim=1)


def step(x, out, solver, t, s, backend, opts, seed=7, **kw):
    return gk.step(x, out, t, s, SCHED, solver, generator=seed, backend=backend, **opts, **kw)


def close_to_reference(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """The kernel rounds once to float32 (then to dtype); its normals agree with torch's to ~2.4e-7."""
    assert got.dtype == dtype and got.shape == ref.shape
    got, ref = got.double(), ref.double()
    assert torch.isfinite(got).all()
    ulp = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    err = ((got - ref).abs() / (1.0 + ref.abs())).max().item()
    assert err <= ulp, err


def test_cpu_info_names_the_best_target_and_set_cpu_target_switches():
    info = cpu_info()
    assert info["target"] == info["best"] == info["supported"][0]
    assert info["supported"] == [t for t in info["compiled"] if t in info["supported"]]
    assert info["vector_bits"] in (128, 256, 512) and isinstance(info["fma"], bool)
    lowest = info["supported"][-1]
    try:
        assert set_cpu_target(lowest) == lowest and cpu_info()["target"] == lowest
    finally:
        assert set_cpu_target(None) == info["best"]
    with pytest.raises(ValueError, match="unknown CPU target 'neon'; this build has"):
        set_cpu_target("neon")
    unsupported = [t for t in info["compiled"] if t not in info["supported"]]
    for name in unsupported:
        with pytest.raises(ValueError, match="this CPU cannot run"):
            set_cpu_target(name)


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":")[0].strip() == "flags":
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(cpu_info()["compiled"] != ["avx512", "avx2", "sse2"] or not Path("/proc/cpuinfo").exists(),
                    reason="an x86-64 Linux build with the three targets")
def test_the_targets_this_cpu_runs_are_those_its_flags_allow():
    """The extension's own CPUID reading agrees with the kernel's /proc/cpuinfo flags (which, like it,
    count AVX and AVX-512 only where the OS saves their registers): the best target is picked."""
    flags = _cpu_flags()
    avx2 = {"avx2", "fma", "bmi2"} <= flags
    avx512 = avx2 and {"avx512f", "avx512dq", "avx512vl", "avx512bw"} <= flags
    expected = ["avx512"] * avx512 + ["avx2"] * avx2 + ["sse2"]
    assert cpu_info()["supported"] == expected and cpu_info()["best"] == expected[0]


def test_environment_variable_forces_a_target(monkeypatch):
    """GMS_KERNELS_CPU_TARGET is applied when the launcher first loads the extension."""
    try:
        monkeypatch.setenv(cpp.CPU_TARGET_ENV, TARGETS[-1])
        monkeypatch.setattr(cpp, "_ext", None)
        assert cpp.available() and cpu_info()["target"] == TARGETS[-1] and cpu_info()["forced"] == TARGETS[-1]
        monkeypatch.setenv(cpp.CPU_TARGET_ENV, "no-such-isa")
        monkeypatch.setattr(cpp, "_ext", None)
        with pytest.raises(ValueError, match="GMS_KERNELS_CPU_TARGET='no-such-isa': unknown CPU target"):
            cpp.available()
    finally:
        monkeypatch.undo()
        set_cpu_target(None)


@pytest.mark.parametrize("target", TARGETS, indirect=True)
@pytest.mark.parametrize("solver,count,opts", SOLVERS, ids=lambda v: v if isinstance(v, str) else None)
def test_every_fused_solver_matches_the_reference(target, solver, count, opts):
    x = torch.randn(3, 3, 7, 5, generator=torch.Generator().manual_seed(1))  # (105 elements per sample: odd)
    out = heads(x, count)
    for t, s in STEPS:
        ref = step(x, out, solver, t, s, "torch", opts)
        close_to_reference(step(x, out, solver, t, s, "cpp", opts), ref, torch.float32)


@pytest.mark.parametrize("target", TARGETS, indirect=True)
def test_adan_fit_at_every_block_edge(target):
    """The float32 ADAN loop is software-pipelined over vectors of 4, 8 or 16 lanes (three stages, with
    a prologue for blocks of one or two vectors): every count of elements around those edges, and around
    the 256-element block, matches the reference."""
    g = torch.Generator().manual_seed(5)
    for n in [1, 3, 4, 5, 8, 9, 12, 16, 17, 20, 24, 31, 32, 33, 40, 48, 49, 63, 255, 256, 257, 300]:
        x = torch.randn(1, n, generator=g)
        out = heads(x, 3, seed=n)
        ref = step(x, out, "gms", 500, 400, "torch", {"fit": "adan", "fit_iters": 4})
        close_to_reference(step(x, out, "gms", 500, 400, "cpp", {"fit": "adan", "fit_iters": 4}), ref, torch.float32)


@pytest.mark.parametrize("target", TARGETS, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_non_contiguous_inputs_of_any_dtype(target, dtype):
    base = torch.randn(4, 5, 9, 3, generator=torch.Generator().manual_seed(2))
    x = base.transpose(2, 3).to(dtype)  # (not contiguous)
    for solver, count, opts in SOLVERS:
        out = heads(base, count).transpose(2, 3).to(dtype)
        ref = step(x, out, solver, 500, 400, "torch", opts)
        close_to_reference(step(x, out, solver, 500, 400, "cpp", opts), ref, dtype)


def fused(x, out, solver, count, opts, noise):
    o = resolve_options(get_solver(solver), opts)
    cfg = fused_config(solver, o, SCHED.coefficients(500, 400), (-1.0, 1.0), SCHED.T, x.shape[0], x[0].numel())
    c = x.shape[1]
    hs = [out[:, i * c:(i + 1) * c] for i in range(count)] + [None, None]
    return cpp.fused_step(x, hs[0], hs[1], hs[2], noise.seeds, noise.indices, cfg)[0]


@pytest.mark.parametrize("target", TARGETS, indirect=True)
def test_a_sample_does_not_depend_on_its_batch(target):
    """Same seed, same samples: samples 3 and 4 of a batch of 5 equal the same samples drawn alone
    (their own sample indices)."""
    x = torch.randn(5, 3, 11, 13, generator=torch.Generator().manual_seed(3))
    for solver, count, opts in SOLVERS:
        out = heads(x, count)
        whole = fused(x, out, solver, count, opts, SampleNoise.create(7, 5))
        part = fused(x[3:], out[3:], solver, count, opts, SampleNoise.create(7, 2, first_index=3))
        assert torch.equal(part, whole[3:]), solver


def _exact_box_muller(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """The normals of gms_kernels.core.random.normal with log, cos and sin in float64 (from the same
    float32 u1 and theta): what a correctly rounded float32 Box-Muller would return."""
    words = rng.randint4x(torch.full_like(offsets, seed), rng.normal_group(offsets))
    second_pair = ((offsets >> 1) & 1).bool()
    u1 = rng.uint_to_uniform(torch.where(second_pair, words[2], words[0])).clamp_min(1e-7)
    theta = (rng.uint_to_uniform(torch.where(second_pair, words[3], words[1])) * 6.283185307179586).double()
    radius = torch.sqrt(-2.0 * torch.log(u1.double()))
    return radius * torch.where((offsets & 1).bool(), torch.sin(theta), torch.cos(theta))


@pytest.mark.parametrize("target", TARGETS, indirect=True)
def test_normals_are_within_a_few_ulps_of_the_exact_box_muller(target):
    """The kernels' float32 log, cos and sin (csrc/vector_random.h): at most 4 float32 ulps of the
    exact value from the same u1 and theta, 0.6 on average; consecutive counters of one key sweep
    u2 over the whole circle and reach the clamped tail of u1. Targets with FMA agree bit for bit."""
    import gms_kernels._C as C

    offsets = torch.cat([torch.arange(400_000, dtype=torch.int64),
                         torch.randint(0, 2**62, (100_000,), generator=torch.Generator().manual_seed(3))])
    z = torch.from_numpy(C.normal(np.int64(7), offsets.numpy())).double()
    exact = _exact_box_muller(7, offsets)
    ulps = (z - exact).abs() / torch.from_numpy(np.spacing(exact.abs().float().numpy())).double()
    assert ulps.max() <= 4.0 and ulps.mean() <= 0.6, (ulps.max().item(), ulps.mean().item())
    if cpu_info()["fma"]:
        set_cpu_target(TARGETS[0])
        assert torch.equal(torch.from_numpy(C.normal(np.int64(7), offsets.numpy())).double(), z)


def test_targets_agree_with_each_other():
    """The targets run one source: equal up to float32 rounding of last bits (FMA or not, the
    reciprocal and square-root estimates of AVX-512)."""
    x = torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    results = {}
    for target in TARGETS:
        set_cpu_target(target)
        try:
            results[target] = [step(x, heads(x, count), solver, 500, 400, "cpp", opts) for solver, count, opts in SOLVERS]
        finally:
            set_cpu_target(None)
    for target in TARGETS[1:]:
        for (solver, _, _), a, b in zip(SOLVERS, results[TARGETS[0]], results[target]):
            assert ((a - b).abs() / (1 + a.abs())).max() <= 4e-6, (target, solver)

