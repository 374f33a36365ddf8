import warnings

import pytest
import torch

import gms_kernels as gk
from gms_kernels.kernels import dispatch as backends


@pytest.fixture
def no_fast_backends(monkeypatch):
    monkeypatch.setattr(backends, "backend_available", lambda name: False)
    monkeypatch.setattr(backends, "_warned", set())
    monkeypatch.delenv(backends.ENV_VAR, raising=False)


def test_unknown_backend_lists_valid_ones(monkeypatch):
    monkeypatch.delenv(backends.ENV_VAR, raising=False)
    with pytest.raises(ValueError, match="valid: auto, triton, cpp, torch"):
        backends.resolve_backend("cuda", "cpu")
    monkeypatch.setenv(backends.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="environment variable GMS_KERNELS_BACKEND"):
        backends.resolve_backend("auto", "cpu")


def test_environment_variable_forces_a_backend(monkeypatch):
    monkeypatch.setenv(backends.ENV_VAR, "torch")
    assert backends.resolve_backend("cpp", "cpu") == "torch"
    assert backends.resolve_backend("auto", "cpu") == "torch"


def test_auto_falls_back_to_torch_with_one_warning_naming_the_fix(no_fast_backends):
    with pytest.warns(RuntimeWarning, match="cpp backend is not available.*Fix: reinstall"):
        assert backends.resolve_backend("auto", "cpu") == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backends.resolve_backend("auto", "cpu") == "torch"  # only once


def test_explicit_missing_backend_is_an_error(no_fast_backends):
    with pytest.raises(ValueError, match="backend 'cpp' is not available. Fix"):
        backends.resolve_backend("cpp", "cpu")
    with pytest.raises(ValueError, match="backend 'triton' is not available. Fix: pip install triton"):
        backends.resolve_backend("triton", "cpu")


def test_sampling_works_through_the_torch_fallback(no_fast_backends, paper_oracle):
    with pytest.warns(RuntimeWarning):
        x = gk.sample(paper_oracle, shape=(5, 1), steps=3, generator=0, progress=False)
    ref = gk.sample(paper_oracle, shape=(5, 1), steps=3, generator=0, progress=False, backend="torch")
    torch.testing.assert_close(x, ref, rtol=0, atol=0)


def test_auto_keeps_float64_samples_on_the_float64_reference():
    """The fused kernels compute in float32: under ``auto`` a float64 sample takes the float64 torch step (the
    same numbers as backend="torch"), while a named backend still runs its kernel."""
    assert backends.resolve_backend("auto", "cpu", torch.float64) == "torch"
    assert backends.resolve_backend("torch", "cpu", torch.float32) == "torch"
    sched = gk.Schedule.linear()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1, 4, 4, generator=g, dtype=torch.float64)
    e = torch.randn(2, 1, 4, 4, generator=g, dtype=torch.float64)
    auto = gk.step(x, e, 500, 400, sched, "ddim")
    assert auto.dtype == torch.float64
    assert torch.equal(auto, gk.step(x, e, 500, 400, sched, "ddim", backend="torch"))
    if backends.backend_available("cpp"):
        assert backends.resolve_backend("auto", "cpu", torch.float32) == "cpp"
        fused = gk.step(x, e, 500, 400, sched, "ddim", backend="cpp")
        assert 0 < (fused - auto).abs().max() < 1e-5  # (float32 arithmetic)


def _inputs(seed: int, shape=(3, 2, 4, 4), scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) * scale for _ in range(3)]


def test_the_fused_backends_run_every_fusable_solver_and_leave_the_rest_to_the_float64_step(fused_kernel_calls):
    """solver_step hands ddpm, ddim and gms to the fused kernel of the backend asked for (Triton has every mode
    the C++ kernel has), and a step whose option no kernel implements (gms with variance_scale) to the float64
    torch step, with no kernel call."""
    import gms_kernels.solvers.base as solvers
    from gms_kernels.core.random import SampleNoise

    calls = fused_kernel_calls
    sched = gk.Schedule.linear(20)
    k = sched.coefficients(10, 5)
    x, e1, _ = _inputs(18, shape=(2, 1, 2, 2))
    gms_heads = [e1, e1 * e1 + 0.1, e1**3]

    def run(solver, heads, backend, options=None):
        rand = solvers.StepRandomness(SampleNoise.create(3, 2), 10, x)
        return solvers.solver_step(solver, x, heads, k, rand, (-1.0, 1.0), sched.T, options or {}, backend)[0]

    for backend in ("triton", "cpp"):
        calls.clear()
        run("ddpm", [e1], backend)
        run("ddim", [e1], backend, {"eta": 0.5})
        run("gms", gms_heads, backend)
        assert calls == [backend] * 3
    calls.clear()
    got = run("gms", gms_heads, "triton", {"variance_scale": 1.5})
    assert calls == [] and torch.equal(got, run("gms", gms_heads, "torch", {"variance_scale": 1.5}))


def test_a_fused_step_on_another_device_gets_the_seeds_there_after_the_counter_check(monkeypatch):
    """When x_t is not on the Philox seeds' device, solver_step checks the counter range on the host (elements
    per sample = C*H*W) and hands the fused kernel the seeds and indices moved to x_t's device. The meta device
    stands in for a GPU: with 4 x 8 x 8 = 256 elements per sample, the sample indices must stay below
    2^40 / 256 = 2^32, so indices 2^32 - 2 and 2^32 - 1 pass and 2^32 - 1, 2^32 are refused."""
    import gms_kernels.solvers.base as solvers
    from gms_kernels.core.random import SampleNoise

    seen = []

    def fake_fused_step(backend, x_t, e1, e2, e3, seeds, indices, *args):
        seen.append((seeds.device.type, indices.device.type, indices.tolist() if indices.device.type == "cpu"
                     else None))
        return x_t, None

    monkeypatch.setattr(solvers, "fused_step", fake_fused_step)
    sched = gk.Schedule.linear(20)
    k = sched.coefficients(10, 5)
    x = torch.zeros(2, 4, 8, 8, device="meta")
    heads = [torch.zeros(2, 4, 8, 8, device="meta") for _ in range(3)]

    def run(first_index):
        rand = solvers.StepRandomness(SampleNoise.create(0, 2, first_index), 10, x)
        return solvers.solver_step("gms", x, heads, k, rand, (-1.0, 1.0), sched.T, {}, "cpp")

    run(2**32 - 2)
    assert seen == [("meta", "meta", None)]
    with pytest.raises(ValueError, match="sample indices must lie in"):
        run(2**32 - 1)
    assert len(seen) == 1
