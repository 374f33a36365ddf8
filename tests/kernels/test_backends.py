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
