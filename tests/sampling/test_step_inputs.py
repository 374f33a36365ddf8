"""Bad input to gk.step and gk.sample: a clear error raised at the public entry, never a silent wrong result.

Every step here is checked on every backend the machine has (torch, cpp), with the same rule on each.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

import gms_kernels as gk
from gms_kernels.kernels.dispatch import backend_available
from gms_kernels.core.fit import MAX_FIT_ITERS
from gms_kernels.kernels import ADAN_FP32_MAX_ITERS
from gms_kernels.solvers import SOLVERS, fused_config, resolve_options

S = gk.Schedule.linear()
BACKENDS = ["torch"] + (["cpp"] if backend_available("cpp") else [])


def step_inputs(n: int = 2, c: int = 3, size: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, size, size, generator=g)
    e1 = 0.5 * torch.randn(n, c, size, size, generator=g)
    return x, torch.cat([e1, e1**2 + 0.3, e1**3 + 0.9 * e1], 1)


# -- silent wrong results ------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_an_option_tensor_edited_in_place_is_read_again(backend):
    """The fused config is memoised on the options' values: editing a weights tensor (or a gamma table) in
    place between two calls gives the new value's step, equal to the torch reference's."""
    x, out = step_inputs()
    w = torch.tensor([0.25, 0.75], dtype=torch.float64)
    gk.step(x, out, 500, 300, S, "gms", 7, backend=backend, weights=w)
    w[0], w[1] = 0.4, 0.6
    edited = gk.step(x, out, 500, 300, S, "gms", 7, backend=backend, weights=w)
    fresh = gk.step(x, out, 500, 300, S, "gms", 7, backend="torch", weights=(0.4, 0.6))
    assert (edited - fresh).abs().max() < 1e-5

    gamma = torch.full((S.T,), 0.5, dtype=torch.float64)
    gk.step(x, out, 500, 300, S, "analytic-dpm", 7, backend=backend, gamma=gamma)
    gamma.mul_(1.5)
    edited = gk.step(x, out, 500, 300, S, "analytic-dpm", 7, backend=backend, gamma=gamma)
    fresh = gk.step(x, out, 500, 300, S, "analytic-dpm", 7, backend="torch", gamma=torch.full((S.T,), 0.75))
    assert (edited - fresh).abs().max() < 1e-5


def test_a_numpy_weights_array_edited_in_place_is_read_again():
    x, out = step_inputs()
    w = np.array([0.25, 0.75])
    first = gk.step(x, out, 500, 300, S, "gms", 7, backend=BACKENDS[-1], weights=w)
    w[:] = (0.4, 0.6)
    second = gk.step(x, out, 500, 300, S, "gms", 7, backend=BACKENDS[-1], weights=w)
    assert not torch.equal(first, second)


def test_long_adan_loops_default_to_float64_in_the_fused_kernels():
    """Beyond ADAN_FP32_MAX_ITERS iterations the float32 loop drifts from the reference (up to 0.07 at 70),
    so adan_precision=None runs them in float64; an explicit precision is obeyed."""
    k = S.coefficients(500, 300)
    gms = SOLVERS["gms"]

    def fp64(**opts):
        return fused_config("gms", resolve_options(gms, dict(fit="adan", **opts)), k, (-1.0, 1.0), S.T, 2, 48).adan_fp64

    assert fp64(fit_iters=ADAN_FP32_MAX_ITERS) is None  # (the backend's default: float32)
    assert fp64(fit_iters=ADAN_FP32_MAX_ITERS + 1) is True
    assert fp64(fit_iters=70, adan_precision="float32") is False
    assert fused_config("gms", resolve_options(gms, {"preset": "official"}), k, (-1.0, 1.0), S.T, 2, 48).adan_fp64


@pytest.mark.skipif("cpp" not in BACKENDS, reason="needs the C++ extension (CI=true makes its absence a failure)")
def test_official_preset_on_cpp_follows_the_torch_reference_within_the_stated_bound():
    """preset='official' (70 ADAN iterations): cpp and torch agree within 1e-3 (measured: 1.1e-4 at most over a
    64 x 3 x 16 x 16 batch at three steps); the float32 loop differed by up to 7e-2."""
    x, out = step_inputs(n=8, size=8, seed=3)
    for t, s in [(900, 700), (500, 300), (300, 100)]:
        cpp = gk.step(x, out, t, s, S, "gms", 7, backend="cpp", preset="official")
        ref = gk.step(x, out, t, s, S, "gms", 7, backend="torch", preset="official")
        assert (cpp - ref).abs().max() < 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex_heads_are_refused_alike_on_every_backend(backend):
    x, out = step_inputs()
    with pytest.raises(TypeError, match="model output must be a real floating-point tensor"):
        gk.step(x, out.to(torch.complex64), 500, 300, S, "gms", 7, backend=backend)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_explicit_noise_is_refused(bad):
    x, out = step_inputs()
    noise = torch.zeros_like(x)
    noise[1, 2, 3, 0] = bad
    with pytest.raises(ValueError, match="noise has non-finite values"):
        gk.step(x, out, 500, 300, S, "gms", 7, noise=noise)


@pytest.mark.parametrize("value", [5.0, -1.0, 1.0, float("nan")])
def test_explicit_uniforms_outside_0_1_are_refused(value):
    x, out = step_inputs()
    with pytest.raises(ValueError, match=r"uniform must hold numbers in \[0, 1\)"):
        gk.step(x, out, 500, 300, S, "gms", 7, uniform=torch.full((2,), value))
    with pytest.raises(TypeError, match="uniform must be a real floating-point tensor"):
        gk.step(x, out, 500, 300, S, "gms", 7, uniform=torch.zeros(2, dtype=torch.int64))


@pytest.mark.parametrize("first_index", [1.5, "a", -1, True, None])
def test_a_first_index_that_is_not_a_non_negative_integer_is_refused(first_index):
    x, out = step_inputs()
    with pytest.raises(ValueError, match="first_index must be a non-negative integer"):
        gk.step(x, out, 500, 300, S, "gms", 7, first_index=first_index)
    with pytest.raises(ValueError, match="first_index must be a non-negative integer"):
        gk.sample(steps=2, first_index=first_index, progress=False)


def test_numpy_integer_first_index_is_the_int_one():
    x, out = step_inputs()
    a = gk.step(x, out, 500, 300, S, "gms", 7, first_index=np.int64(3))
    b = gk.step(x, out, 500, 300, S, "gms", 7, first_index=3)
    assert torch.equal(a, b)


@pytest.mark.parametrize("trajectory", [[999.5, 10.2], [999, 10.2], [float("nan")], ["a"]])
def test_fractional_explicit_trajectories_are_refused_not_truncated(trajectory):
    with pytest.raises(ValueError, match="every trajectory entry must be an integer time index"):
        gk.sample(steps=2, trajectory=trajectory, progress=False)


def test_integer_valued_trajectories_of_any_type_run_the_same_steps():
    ref = gk.sample(shape=(2, 1, 8, 8), trajectory=[999, 500, 10], generator=1, progress=False)
    for same in ([999.0, 500.0, 10.0], np.array([999, 500, 10]), torch.tensor([999, 500, 10])):
        assert torch.equal(gk.sample(shape=(2, 1, 8, 8), trajectory=same, generator=1, progress=False), ref)


def test_fit_iters_is_bounded_before_any_work():
    """fit_iters=10**7 ran for about half an hour on the torch reference; a bound far above any useful count
    refuses it at once on every backend (and 10**9 no longer builds a learning-rate list first)."""
    x, out = step_inputs()
    for backend in BACKENDS:
        for iters in (MAX_FIT_ITERS + 1, 10**7, 10**9):
            start = time.perf_counter()
            with pytest.raises(ValueError, match=rf"fit_iters must be an integer in \[0, {MAX_FIT_ITERS}\]"):
                gk.step(x, out, 500, 300, S, "gms", 7, backend=backend, fit="adan", fit_iters=iters)
            assert time.perf_counter() - start < 5.0  # refused, not run (a generous bound for a slow machine)
    assert gk.step(x, out, 500, 300, S, "gms", 7, fit="adan", fit_iters=MAX_FIT_ITERS).shape == x.shape


# -- errors that say what to fix -----------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", [None, "linear", torch.linspace(1e-4, 0.02, 1000), 1000])
def test_a_schedule_that_is_not_a_gk_schedule_is_named(schedule):
    x, out = step_inputs()
    with pytest.raises(TypeError, match=r"schedule must be a gk.Schedule.*gk.Schedule.linear\(T\)"):
        gk.step(x, out, 500, 300, schedule, "gms", 7)
    if schedule is not None:  # (gk.sample's None is the model's own schedule)
        with pytest.raises(TypeError, match="schedule must be a gk.Schedule"):
            gk.sample(steps=2, schedule=schedule, progress=False)


def test_schedule_from_something_that_is_not_betas():
    with pytest.raises(TypeError, match="a Schedule is built from betas"):
        gk.Schedule("abc")


def test_zero_channels_are_refused():
    with pytest.raises(ValueError, match="x_t must have at least one channel"):
        gk.step(torch.randn(2, 0, 4, 4), torch.randn(2, 0, 4, 4), 500, 300, S, "gms", 7)


@pytest.mark.parametrize("gamma, message", [
    (torch.rand(10), "gamma has 10 entries but the schedule has T = 1000"),
    (0.5, "gamma must be a 1-D table"),
    ("abc", "gamma must be a 1-D table"),
    (torch.rand(1000, 2), r"gamma must be a 1-D table .* shape \(1000, 2\)"),
])
def test_a_bad_analytic_dpm_gamma_table_is_named(gamma, message):
    x, out = step_inputs()
    for backend in BACKENDS:
        with pytest.raises(ValueError, match=message):
            gk.step(x, out, 500, 300, S, "analytic-dpm", 7, backend=backend, gamma=gamma)
    with pytest.raises(ValueError, match=message):
        gk.sample(steps=2, solver="analytic-dpm", gamma=gamma, progress=False)


@pytest.mark.parametrize("seeds, error, message", [
    ([0, "a"], TypeError, r"generator\[1\] must be an int seed"),
    ([0, 1.5], TypeError, r"generator\[1\] must be an int seed"),
    ([0, 2**64], ValueError, r"generator\[1\]: seeds must lie in \[0, 2\^63\)"),
    ([0, -1], ValueError, r"generator\[1\]: seeds must lie"),
    (1.5, TypeError, "generator must be an int seed"),
])
def test_bad_seeds_are_named(seeds, error, message):
    x, out = step_inputs()
    with pytest.raises(error, match=message):
        gk.step(x, out, 500, 300, S, "gms", seeds)


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (2, 1, 7, 7)])
def test_a_shape_the_model_cannot_take_says_so(shape):
    with pytest.raises(ValueError, match=rf"the model failed on x_t of shape {re_shape(shape)}.*channel count and image"):
        gk.sample(shape=shape, steps=2, progress=False)


def re_shape(shape: tuple[int, ...]) -> str:
    return r"\(" + ", ".join(map(str, shape)) + r"\)"


def test_numpy_integer_steps_are_accepted():
    a = gk.sample(shape=(2, 1, 8, 8), steps=np.int64(3), generator=0, progress=False)
    b = gk.sample(shape=(2, 1, 8, 8), steps=3, generator=0, progress=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("trajectory", [5, None, 2.5])
def test_a_trajectory_that_is_neither_a_kind_nor_a_list_is_named(trajectory):
    with pytest.raises(TypeError, match="trajectory must be a kind"):
        gk.sample(steps=2, trajectory=trajectory, progress=False)


def test_a_callback_that_cannot_be_called_is_refused_before_the_first_step():
    calls = []

    def model(x, t):
        calls.append(1)
        return torch.zeros_like(x)

    with pytest.raises(TypeError, match="callback must be a function"):
        gk.sample(model, shape=(1, 1, 2, 2), steps=2, solver="ddpm", callback=5, progress=False)
    assert not calls


def test_a_model_with_the_wrong_call_signature_is_named():
    with pytest.raises(TypeError, match=r"the model is called as model\(x_t, t\)"):
        gk.sample(lambda x: x, shape=(1, 1, 2, 2), steps=2, solver="ddpm", progress=False)

    class OneArgument(torch.nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(TypeError, match=r"the model is called as model\(x_t, t\)"):
        gk.sample(OneArgument(), shape=(1, 1, 2, 2), steps=2, solver="ddpm", progress=False)


@pytest.mark.parametrize("dtype", ["float32", torch.int32, torch.complex64, float])
def test_a_dtype_that_is_not_a_floating_torch_dtype_is_named(dtype):
    with pytest.raises(TypeError, match="dtype must be a floating-point torch dtype"):
        gk.sample(steps=2, dtype=dtype, progress=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("device, message", [
    ("cuda", "asks for a CUDA device, but CUDA is not available here; available here: 'cpu'"),
    (5, "asks for a CUDA device, but CUDA is not available here"),
    ("gpu", "is not a device torch knows"),
    ("meta", "meta tensors hold no values"),
])
def test_a_device_this_machine_cannot_use_is_named_before_any_work(device, message):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=f"device={device!r}.*{message}"):
        gk.sample(steps=2, device=device, progress=False)
    assert time.perf_counter() - start < 5.0


def test_every_one_step_solver_still_runs_on_good_input():
    """The checks refuse only bad input: every one-call solver steps on odd sizes and a non-contiguous x_t."""
    x, out = step_inputs(n=3, c=3, size=5)
    x = x.transpose(2, 3)
    out = out.transpose(2, 3)
    gamma = torch.full((S.T,), 0.5, dtype=torch.float64)
    for name, spec in SOLVERS.items():
        if not spec.per_step or name == "exact":
            continue
        options = {"gamma": gamma} if name == "analytic-dpm" else {}
        y = gk.step(x, out, 500, 300, S, name, 3, **options)
        assert y.shape == x.shape and math.isfinite(float(y.sum()))


def test_gk_step_takes_a_diffusers_scheduler_as_its_schedule():
    """gk.step converts schedule= as gk.sample does: a DDPMScheduler gives the steps of its betas."""
    from diffusers import DDPMScheduler

    x, out = step_inputs()
    ref = gk.step(x, out, 500, 300, S, "gms", 7)
    assert torch.equal(gk.step(x, out, 500, 300, DDPMScheduler(), "gms", 7), ref)


@pytest.mark.parametrize("s, solver, unread", [(-1, "gms", slice(3, 9)), (0, "gms", slice(6, 9)),
                                               (-1, "sn-ddpm", slice(3, 6))])
def test_a_nan_in_a_head_the_step_does_not_read_is_ignored_alike_on_every_backend(s, solver, unread):
    """Every backend checks the heads the step reads, no more: the step into data reads e1, GMS's Gaussian last
    step e1 and e2 (the fused kernels never see the others); a NaN in a read head is refused on each."""
    x, out = step_inputs()
    out = out[:, :SOLVERS[solver].heads * 3].clone()
    clean = gk.step(x, out, 100, s, S, solver, 0, backend="torch")
    out[:, unread] = float("nan")
    for backend in BACKENDS:
        torch.testing.assert_close(gk.step(x, out, 100, s, S, solver, 0, backend=backend), clean, rtol=1e-5, atol=1e-5)
    out[:, 0] = float("nan")
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="non-finite values"):
            gk.step(x, out, 100, s, S, solver, 0, backend=backend)


def test_explicit_randomness_of_the_wrong_kind_is_named():
    """gk.step refuses explicit noise / uniforms that are not tensors (naming their type) or are misshapen
    (naming their shape), with a ValueError."""
    sched = gk.Schedule.linear(20)
    x, heads = torch.zeros(2, 1, 2, 2), torch.zeros(2, 3, 2, 2)
    with pytest.raises(ValueError, match=r"^noise must be a tensor shaped like x_t \(2, 1, 2, 2\), got list$"):
        gk.step(x, heads, 10, 5, sched, "gms", noise=[0.0])
    with pytest.raises(ValueError, match=r"^uniform must be a tensor .* got list$"):
        gk.step(x, heads, 10, 5, sched, "gms", uniform=[0.0])
    with pytest.raises(ValueError, match=r"^uniform must be a tensor .* got \(3,\)$"):
        gk.step(x, heads, 10, 5, sched, "gms", uniform=torch.zeros(3))


def test_step_names_the_solver_that_lacks_heads():
    """gk.step with too few heads names the solver and the heads it needs."""
    x = torch.zeros(2, 1, 2, 2)
    with pytest.raises(ValueError, match=r"^solver 'gms' needs 3 head\(s\) \(e1 = E\[eps\]"):
        gk.step(x, torch.zeros(2, 2, 2, 2), 10, 5, gk.Schedule.linear(20), "gms", generator=0)


def _step_inputs(n=4):
    g = torch.Generator().manual_seed(31)
    x = torch.randn(n, 1, 4, 4, generator=g)
    heads = torch.cat([torch.randn(n, 1, 4, 4, generator=g) * 0.3, torch.rand(n, 1, 4, 4, generator=g) + 0.2,
                       torch.zeros(n, 1, 4, 4)], 1)
    return x, heads


def test_gk_step_noise_sources_first_index_explicit_uniforms_and_the_seed_memo():
    """gk.step's randomness: with a torch.Generator, first_index = 2 on the last two samples draws what the full
    batch draws for them; explicit uniforms alone still take the noise from the generator (a GMS step that selects
    mixture components per sample needs both); an int seed's per-sample noise source is built once and reused by
    the following calls with that seed and batch (the memo a gk.step loop relies on)."""
    from gms_kernels import sampling

    sched = gk.Schedule.linear(100)
    x, heads = _step_inputs()
    full = gk.step(x, heads, 50, 30, sched, "gms", torch.Generator().manual_seed(5))
    tail = gk.step(x[2:], heads[2:], 50, 30, sched, "gms", torch.Generator().manual_seed(5), first_index=2)
    assert torch.equal(full[2:], tail)
    u = torch.rand(4, generator=torch.Generator().manual_seed(6))
    with_u = gk.step(x, heads, 50, 30, sched, "gms", 5, uniform=u)
    assert with_u.shape == x.shape and torch.isfinite(with_u).all()
    assert torch.equal(with_u, gk.step(x, heads, 50, 30, sched, "gms", 5, uniform=u))
    sampling._seeded_noise.cache_clear()
    gk.step(x, heads, 50, 30, sched, "gms", 11)
    gk.step(x, heads, 30, 10, sched, "gms", 11)
    info = sampling._seeded_noise.cache_info()
    assert (info.misses, info.hits) == (1, 1)


def test_gk_step_takes_no_model_output_for_the_exact_solver():
    """The exact solver reads no network heads: gk.step accepts model_output=None for it (the oracle gives the
    moments)."""
    sched = gk.Schedule.linear(100)
    oracle = gk.GaussianMixtureOracle([1.0], torch.full((1, 1, 2, 2), 0.5, dtype=torch.float64), [0.01],
                                      schedule=sched)
    x = torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(2))
    out = gk.step(x, None, 50, 30, sched, "exact", 0, oracle=oracle)
    assert out.shape == x.shape and torch.isfinite(out).all()


def test_misshapen_explicit_noise_is_named_by_its_shape_and_sample_takes_10_steps_by_default():
    """Explicit noise of the wrong shape is refused naming its shape; gk.sample's default is steps=10 (the same
    network calls as steps=10 given explicitly, not those of 11)."""
    sched = gk.Schedule.linear(100)
    x, heads = torch.zeros(2, 1, 2, 2), torch.zeros(2, 3, 2, 2)
    with pytest.raises(ValueError, match=r"^noise must be a tensor shaped like x_t \(2, 1, 2, 2\), got \(3, 1, 2, 2\)"):
        gk.step(x, heads, 10, 5, sched, "gms", noise=torch.zeros(3, 1, 2, 2))

    def times(**kwargs):
        seen = []

        def model(x, t):
            seen.append(int(t[0]))
            return torch.zeros_like(x)

        gk.sample(model, shape=(1, 1, 2, 2), solver="ddim", schedule=sched, generator=0, progress=False, **kwargs)
        return seen

    assert times() == times(steps=10) != times(steps=11)
