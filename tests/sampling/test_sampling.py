"""gk.sample, check_sample_args, estimate_gamma and the deferred finite check (gms_kernels/sampling.py):
the model's time input, the data range, the backend handed to each step, the multi-call loops' hand-off and
the errors a bad shape, x_T or device gets."""

import math

import pytest
import torch

import gms_kernels as gk


def test_check_sample_args_checks_the_schedule_range_and_backend():
    """check_sample_args refuses what sample() would: more steps than the given schedule's T, an empty data
    range, an unknown backend (and accepts the same call with good values)."""
    from gms_kernels.sampling import check_sample_args

    def model(x, t):
        return torch.zeros(x.shape[0], 3 * x.shape[1], *x.shape[2:])

    check_sample_args(model, steps=20, schedule=gk.Schedule.linear(20), data_range=(0.0, 1.0), backend="torch")
    with pytest.raises(ValueError, match=r"steps must be an integer in \[1, T = 20\], got 50"):
        check_sample_args(model, steps=50, schedule=gk.Schedule.linear(20))
    with pytest.raises(ValueError, match="data_range must satisfy low < high"):
        check_sample_args(model, data_range=(1.0, 0.0))
    with pytest.raises(ValueError, match="unknown backend 'bogus'"):
        check_sample_args(model, backend="bogus")


def test_the_deferred_finite_check_flag_is_one_int32_zero():
    """The NaN/inf flag a deferred check hands to the Triton kernel is what gk.step documents for
    nonfinite_flag: one int32 element, zero, on x_t's device; a set flag raises, naming the step."""
    from gms_kernels.sampling import DeferredFiniteCheck

    x = torch.zeros(2, 1, 2, 2)
    check = DeferredFiniteCheck(x, [torch.zeros_like(x)], "at step 3 ")
    assert check.flag.dtype == torch.int32 and check.flag.shape == (1,) and int(check.flag) == 0
    assert check.flag.device == x.device
    check.launched()
    check.raise_if_set()  # not set: nothing
    check.flag.fill_(1)
    with pytest.raises(ValueError, match="at step 3 has non-finite values"):
        check.raise_if_set()


class _ScaledTimeModel(torch.nn.Module):
    """A zero eps model that declares ``time_input = "scaled"`` and records the first time value of each call."""
    time_input = "scaled"

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x, t):
        self.seen.append(float(t[0]))
        return torch.zeros_like(x)


def test_sample_reads_the_models_time_input_and_keeps_an_explicit_oracle():
    """gk.sample calls the model with its own time_input convention ("scaled": t * 1000 / T), and the exact
    solver uses an oracle passed as an option rather than the model."""
    scaled = _ScaledTimeModel()
    sched = gk.Schedule.linear(100)
    gk.sample(scaled, shape=(2, 1, 2, 2), steps=2, solver="ddim", schedule=sched, generator=0, progress=False,
              trajectory=[99, 49])
    assert scaled.seen == [990.0, 490.0]

    mean = torch.full((1, 2, 2), 0.5, dtype=torch.float64)
    model = gk.GaussianMixtureOracle([1.0], mean[None] * 0 - 0.5, [0.01], schedule=sched)
    oracle = gk.GaussianMixtureOracle([1.0], mean[None], [0.01], schedule=sched)
    x = gk.sample(model, shape=(4, 1, 2, 2), steps=5, solver="exact", schedule=sched, generator=0, progress=False,
                  oracle=oracle, dtype=torch.float64)
    assert torch.allclose(x, torch.full_like(x, 0.5), atol=0.1)  # the oracle's data (0.5), not the model's (-0.5)


class _Recorder:
    """Stand-ins for the CUDA objects of DeferredFiniteCheck's device branch, recording every call in ``log``."""

    def __init__(self):
        self.log = []
        rec = self

        class Flag:  # the kernel's flag "on the GPU": only its value and is_cuda; a synchronous read is refused
            is_cuda = True

            def __init__(self, value):
                self.value = torch.tensor([value], dtype=torch.int32)

            def item(self):
                raise AssertionError("the flag of a CUDA step was read with .item(), which waits for the whole queue")

        class Host:  # the pinned host buffer: starts as garbage, gets the flag's value only through copy_
            def __init__(self, size, dtype):
                self.data = torch.full(size, 77, dtype=dtype)

            def copy_(self, src, non_blocking=False):
                rec.log.append(("copy", src, non_blocking))
                self.data.copy_(src.value)
                return self

            def __getitem__(self, i):
                rec.log.append(("read", i))
                return self.data[i]

        class Event:
            def __init__(self, *args, **kwargs):
                rec.log.append(("event", args, kwargs))

            def record(self, *args, **kwargs):
                rec.log.append(("record", args, kwargs))

            def synchronize(self):
                rec.log.append(("synchronize",))

        def empty(*size, **kwargs):
            rec.log.append(("empty", size, kwargs))
            return Host(size, kwargs.get("dtype"))

        class Torch:  # the sampling module's torch, with torch.empty and torch.cuda.Event replaced
            def __getattr__(self, name):
                return getattr(torch, name)

        self.Flag = Flag
        self.torch = Torch()
        self.torch.empty = empty
        self.torch.cuda = type("cuda", (), {"Event": Event})


@pytest.mark.parametrize("value", [0, 1])
def test_the_deferred_finite_check_on_cuda_reads_the_flag_from_pinned_memory_after_its_event(value, monkeypatch):
    """The CUDA branch of DeferredFiniteCheck, pinned on the CPU with recording fakes (a flag whose is_cuda is
    True, torch.empty and torch.cuda.Event replaced in the sampling module): launched() allocates one pinned
    int32 host element, copies the flag into it with non_blocking=True and records an event after the copy;
    raise_if_set() waits on that event (not on the flag: .item() would wait for the whole queue), then reads
    element 0 of the host copy, and raises for a set flag only. (This checks the order and arguments of the
    calls, not what a GPU does with them.)"""
    from gms_kernels import sampling

    rec = _Recorder()
    x = torch.zeros(2, 1, 2, 2)
    check = sampling.DeferredFiniteCheck(x, [torch.zeros_like(x)], "at step 3 ")
    check.flag = flag = rec.Flag(value)  # as if the kernel had written it on the device
    monkeypatch.setattr(sampling, "torch", rec.torch)
    check.launched()
    assert rec.log == [("empty", (1,), {"dtype": torch.int32, "device": "cpu", "pin_memory": True}),
                       ("copy", flag, True), ("event", (), {}), ("record", (), {})]
    assert rec.log[1][1] is flag
    del rec.log[:]
    if value:
        with pytest.raises(ValueError, match="^x_t or the model output at step 3 has non-finite values"):
            check.raise_if_set()
    else:
        check.raise_if_set()
    assert rec.log == [("synchronize",), ("read", 0)]


def test_the_callbacks_denoised_is_clamped_to_the_sampling_data_range():
    """The callback's "denoised" is E[x0 | x_t] = (x_t - sigma_t e1) / a_t clamped to sample()'s data_range (here
    (0, 1), not the default (-1, 1)); without a range it is left unclamped. With e1 = 0 at t = 999 it is
    x_T / a_t, about 150 x_T, far outside either range."""
    def zero_eps(x, t):
        return torch.zeros_like(x)

    sched = gk.Schedule.linear(1000)
    x_T = torch.linspace(-1.0, 1.0, 8, dtype=torch.float64).reshape(2, 1, 2, 2)
    a_t = math.sqrt(float(sched.alphas_cumprod[999]))
    for data_range, expected in (((0.0, 1.0), (x_T / a_t).clamp(0.0, 1.0)), (None, x_T / a_t)):
        seen = []
        gk.sample(zero_eps, x_T=x_T, steps=2, solver="ddim", schedule=sched, trajectory=[999, 499], progress=False,
                  data_range=data_range, callback=seen.append, generator=0)
        assert seen[0]["t"] == 999
        torch.testing.assert_close(seen[0]["denoised"], expected, rtol=1e-12, atol=0)
    seen = []  # a float32 run hands out a float32 denoised, like its x
    gk.sample(zero_eps, x_T=x_T.float(), steps=2, solver="ddim", schedule=sched, trajectory=[999, 499], progress=False,
              callback=seen.append, generator=0)
    assert seen[0]["x"].dtype == seen[0]["denoised"].dtype == torch.float32


def _gamma_run(x0, sched, seed, **kwargs):
    """estimate_gamma with the identity "network" (e1 = x_t), recording every call's (x_t, time input)."""
    calls = []

    def identity(x, t):
        calls.append((x.clone(), t.clone()))
        return x.clone()

    model = kwargs.pop("model_class", None)
    if model is not None:
        model = model(identity)
    table = gk.estimate_gamma(model or identity, x0, sched, generator=torch.Generator().manual_seed(seed), **kwargs)
    return table, calls


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_estimate_gamma_draws_from_the_generator_in_batches_and_averages_in_float64(dtype):
    """Gamma_t = sum ||e1||^2 / (number of elements), summed in float64 over the batches of x0 (default 256),
    with x_t = a_t x0 + sigma_t eps and eps drawn from the given generator batch by batch in x0's dtype; every
    t of the schedule by default (T = 6 here), NaN at the t not asked for."""
    sched = gk.Schedule.linear(6)
    x0 = torch.randn(300, 1, 2, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    table, calls = _gamma_run(x0, sched, 7)
    assert table.dtype == torch.float64 and table.shape == (6,)
    assert len(calls) == 12  # 6 timesteps x 2 batches (256 + 44)
    g = torch.Generator().manual_seed(7)
    for t in range(6):
        total = 0.0
        for j, batch in enumerate(x0.split(256)):
            x_t, tin = calls[2 * t + j]
            assert tin.dtype == torch.long and tin.tolist() == [t] * batch.shape[0]  # the 0-based index by default
            eps = torch.randn(batch.shape, generator=g, dtype=dtype)
            assert x_t.dtype == dtype
            torch.testing.assert_close(x_t, sched.alpha(t) * batch + sched.sigma(t) * eps, rtol=1e-6, atol=1e-6)
            total += float(x_t.to(torch.float64).pow(2).sum())
        assert table[t].item() == total / x0.numel()  # exactly: float64 sums of the float64 squares
    table, calls = _gamma_run(x0, sched, 7, timesteps=[4, 1], batch_size=100)
    assert len(calls) == 6 and [int(c[1][0]) for c in calls] == [4, 4, 4, 1, 1, 1]
    assert table[[0, 2, 3, 5]].isnan().all() and not table[[1, 4]].isnan().any()


def test_estimate_gamma_calls_the_model_with_its_time_input():
    """estimate_gamma passes t as the model's ``time_input`` says ("scaled": t * 1000 / T as float) unless the
    caller names one; a model output with too few channels is refused naming the solver that needs it."""
    sched = gk.Schedule.linear(20)
    x0 = torch.zeros(2, 1, 2, 2)

    def scaled(fn):
        class Scaled(torch.nn.Module):
            time_input = "scaled"

            def forward(self, x, t):
                return fn(x, t)

        return Scaled()

    _, calls = _gamma_run(x0, sched, 0, model_class=scaled, timesteps=[5])
    assert calls[0][1].dtype == torch.float32 and calls[0][1].tolist() == [250.0, 250.0]
    _, calls = _gamma_run(x0, sched, 0, model_class=scaled, timesteps=[5], time_input="index+1")
    assert calls[0][1].tolist() == [6, 6]
    with pytest.raises(ValueError, match="unknown time_input 'bogus'"):
        _gamma_run(x0, sched, 0, timesteps=[5], time_input="bogus")
    with pytest.raises(ValueError, match=r"^solver 'analytic-dpm' needs 1 head"):
        gk.estimate_gamma(lambda x, t: torch.zeros(2, 0, 2, 2), x0, sched, timesteps=[5])


def test_check_sample_args_uses_samples_default_steps_and_the_given_time_input():
    """check_sample_args has sample()'s defaults (10 steps: accepted for a T = 10 schedule) and refuses a
    time_input that sample() would refuse."""
    from gms_kernels.sampling import check_sample_args

    def model(x, t):
        return torch.zeros(x.shape[0], 3 * x.shape[1], *x.shape[2:])

    check_sample_args(model, schedule=gk.Schedule.linear(10))
    check_sample_args(model, time_input="scaled")
    with pytest.raises(ValueError, match="unknown time_input 'bogus'"):
        check_sample_args(model, time_input="bogus")


def test_the_deferred_finite_check_flag_lives_on_x_ts_device():
    """The flag is made on x_t's device (the meta device here, so that a CPU run can tell it from the default)."""
    from gms_kernels.sampling import DeferredFiniteCheck

    x = torch.zeros(2, 1, 2, 2, device="meta")
    check = DeferredFiniteCheck(x, [], "at step 0 ")
    assert check.flag.device.type == "meta" and check.flag.dtype == torch.int32 and check.flag.shape == (1,)


def test_a_set_deferred_flag_names_the_non_finite_input():
    """A set flag with a NaN in x_t names x_t itself (the inputs kept for that); with a NaN in a head, the head."""
    from gms_kernels.sampling import DeferredFiniteCheck

    x = torch.zeros(2, 1, 2, 2)
    x[1, 0, 0, 0] = float("nan")
    check = DeferredFiniteCheck(x, [torch.zeros_like(x)], "at step 3 ")
    check.flag.fill_(1)
    with pytest.raises(ValueError, match=r"^x_t at step 3 has non-finite values"):
        check.raise_if_set()
    e1 = torch.zeros(2, 1, 2, 2)
    e1[0, 0, 1, 1] = float("inf")
    check = DeferredFiniteCheck(torch.zeros_like(x), [e1], "at step 3 ")
    check.flag.fill_(1)
    with pytest.raises(ValueError, match=r"^model output at step 3 has non-finite values \(NaN or inf\) in head e1"):
        check.raise_if_set()


def test_sample_without_a_model_draws_16_digits_with_a_progress_bar_by_default(monkeypatch):
    """gk.sample() with no model and no shape samples 16 images of the embedded digits model (shape (16, 1, 8, 8)),
    and gk.sample shows its progress bar unless told not to, labelled with the solver and K, not left on screen."""
    from gms_kernels import sampling
    from gms_kernels.models.embedded import DIGITS_SHAPE

    enabled = []
    real_bar = sampling.progress_bar

    def bar(iterable, progress, **kwargs):
        enabled.append((progress, kwargs))
        return real_bar(iterable, False, **kwargs)

    monkeypatch.setattr(sampling, "progress_bar", bar)
    x = gk.sample(steps=1, generator=0)
    assert x.shape == (16, *DIGITS_SHAPE) and tuple(DIGITS_SHAPE) == (1, 8, 8) and torch.isfinite(x).all()
    assert enabled == [(True, {"desc": "gms K=1", "leave": False})]  # labelled, and cleared when done


def test_sample_names_a_bad_shape():
    """A shape with a zero or a negative entry is refused naming the argument: "shape (N, C, ...)"."""
    def model(x, t):
        return torch.zeros_like(x)

    for shape in ((0, 1, 2, 2), (2, -1, 2)):
        with pytest.raises(ValueError, match=r"^shape \(N, C, \.\.\.\) must hold positive integers, got "):
            gk.sample(model, shape=shape, steps=2, solver="ddim", schedule=gk.Schedule.linear(20), progress=False)


def test_sample_draws_x_T_at_time_zero_of_the_initial_stream_and_names_a_bad_x_T():
    """gk.sample(shape=..., generator=seed) starts from the seed's initial-noise stream at time field 0: the same
    samples as gk.sample(x_T=SampleNoise.create(seed, N).normal(STREAM_INITIAL, 0, shape[1:])); an x_T without
    a channel dimension is refused naming x_T."""
    from gms_kernels.core.random import STREAM_INITIAL, SampleNoise

    def model(x, t):
        return 0.1 * x

    sched = gk.Schedule.linear(50)
    kwargs = dict(steps=3, solver="ddpm", schedule=sched, progress=False)
    x_T = SampleNoise.create(4, 3).normal(STREAM_INITIAL, 0, (1, 2, 2), "cpu")
    assert torch.equal(gk.sample(model, shape=(3, 1, 2, 2), generator=4, **kwargs),
                       gk.sample(model, x_T=x_T, generator=4, **kwargs))
    assert not torch.equal(x_T, SampleNoise.create(4, 3).normal(STREAM_INITIAL, 1, (1, 2, 2), "cpu"))
    with pytest.raises(ValueError, match=r"^x_T must be \[N, C, \.\.\.\]"):
        gk.sample(model, x_T=torch.zeros(4), **kwargs)


def test_sample_checks_a_shape_given_with_x_T():
    """A shape passed together with x_T must be x_T's shape: the same shape is accepted (same samples as without
    it), another is refused naming both."""
    def model(x, t):
        return 0.1 * x

    kwargs = dict(steps=2, solver="ddim", schedule=gk.Schedule.linear(20), progress=False, generator=0)
    x_T = torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(8))
    assert torch.equal(gk.sample(model, shape=(3, 1, 2, 2), x_T=x_T, **kwargs), gk.sample(model, x_T=x_T, **kwargs))
    with pytest.raises(ValueError, match=r"^shape \(2, 1, 2, 2\) does not match x_T's shape \(3, 1, 2, 2\)"):
        gk.sample(model, shape=[2, 1, 2, 2], x_T=x_T, **kwargs)


def test_sample_resolves_the_backend_it_is_given_and_tells_multi_call_solvers_T(monkeypatch):
    """gk.sample passes the named backend to every step (torch stays torch; auto picks the float64 torch step for
    a float64 sample and the C++ one for float32 on a CPU), and a multi-call solver (SEEDS-2) calls a "scaled"
    model with t * 1000 / T of the schedule."""
    from gms_kernels import sampling

    used = []
    real = sampling.solver_step

    def spy(solver, x, heads, k, rand, data_range, T, options, backend, *args):
        used.append(backend)
        return real(solver, x, heads, k, rand, data_range, T, options, backend, *args)

    monkeypatch.setattr(sampling, "solver_step", spy)

    def model(x, t):
        return torch.zeros_like(x)

    from gms_kernels.kernels import cpp

    sched = gk.Schedule.linear(20)
    for backend, dtype, expected in (("torch", torch.float32, "torch"), ("auto", torch.float64, "torch"),
                                     ("auto", torch.float32, "cpp" if cpp.available() else "torch")):
        used.clear()
        gk.sample(model, shape=(2, 1, 2, 2), steps=2, solver="ddim", schedule=sched, generator=0, progress=False,
                  backend=backend, dtype=dtype)
        assert used and set(used) == {expected}, (backend, dtype, used)
    scaled = _ScaledTimeModel()
    gk.sample(scaled, shape=(2, 1, 2, 2), steps=2, solver="seeds-2", schedule=gk.Schedule.linear(100), generator=0,
              progress=False, trajectory=[99, 49])
    assert scaled.seen[0] == 990.0 and all(0.0 <= v <= 990.0 for v in scaled.seen)


def test_sample_hands_multi_call_solvers_its_data_range_progress_flag_and_solver_name(monkeypatch):
    """For a multi-call solver (SEEDS-2) gk.sample passes on its data_range (the final denoised sample lies in
    (0, 1), unlike without a range), its progress flag (True by default, False when asked), and the solver's
    name for the heads check."""
    from gms_kernels.solvers import base as loop  # (SEEDS' steps run in the shared exponential_loop)

    flags = []
    real_bar = loop.progress_bar

    def bar(iterable, progress, **kwargs):
        flags.append(progress)
        return real_bar(iterable, False, **kwargs)

    monkeypatch.setattr(loop, "progress_bar", bar)

    def model(x, t):
        return -0.5 * torch.ones_like(x)  # E[x0 | x_t] well above 1 at the last step

    kwargs = dict(shape=(2, 1, 2, 2), steps=2, solver="seeds-2", schedule=gk.Schedule.linear(50), generator=0)
    x = gk.sample(model, data_range=(0.0, 1.0), **kwargs)
    assert flags == [True] and x.min() >= 0.0 and x.max() <= 1.0
    free = gk.sample(model, data_range=None, progress=False, **kwargs)
    assert flags == [True, False] and free.max() > 1.0
    with pytest.raises(ValueError, match=r"^solver 'seeds-2' needs 1 head"):
        gk.sample(lambda x, t: torch.zeros(x.shape[0], 0, *x.shape[2:]), progress=False, **kwargs)


def test_sample_triton_loop_defers_the_finite_check_unless_a_callback_watches(monkeypatch):
    """gk.sample's Triton loop, run on the CPU with resolve_backend answering "triton" and each step done by the
    torch backend (recording the flag it is handed): without a callback every step gets an int32 zero flag, read
    once the next step's network call is made (a flag set at step 0 raises after the model's second call, naming
    step 0); with a callback, or on another backend, no flag is handed (the check is immediate)."""
    from gms_kernels import sampling

    handed, calls = [], []
    real = sampling.solver_step

    def torch_step(solver, x, heads, k, rand, data_range, T, options, backend, want_info, where, flag):
        handed.append(flag)
        out = real(solver, x, heads, k, rand, data_range, T, options, "torch", want_info, where, None)
        if flag is not None and set_at == len(handed) - 1:
            flag.fill_(1)  # as if the kernel had met a NaN here
        return out

    def model(x, t):
        calls.append(int(t[0]))
        return torch.zeros_like(x)

    monkeypatch.setattr(sampling, "solver_step", torch_step)
    kwargs = dict(shape=(2, 1, 2, 2), steps=3, solver="ddim", schedule=gk.Schedule.linear(30), generator=0,
                  progress=False, trajectory=[29, 19, 9])
    set_at = None
    monkeypatch.setattr(sampling, "resolve_backend", lambda *args, **kwargs: "triton")
    gk.sample(model, **kwargs)
    assert len(handed) == 3 and all(f is not None and f.dtype == torch.int32 and f.shape == (1,) for f in handed)
    handed.clear()
    gk.sample(model, callback=lambda info: None, **kwargs)
    assert handed == [None, None, None]
    handed.clear()
    calls.clear()
    set_at = 0
    with pytest.raises(ValueError, match=r"^x_t or the model output at step 0 \(t=29\) has non-finite values"):
        gk.sample(model, **kwargs)
    assert calls == [29, 19] and len(handed) == 1  # read after the second network call, before the second step
    monkeypatch.setattr(sampling, "resolve_backend", lambda *args, **kwargs: "cpp")
    handed.clear()
    set_at = None
    gk.sample(model, **kwargs)
    assert handed == [None, None, None]


def test_a_callback_on_a_headless_solver_calls_the_model_with_its_time_input():
    """With the exact solver (no network heads) a callback's denoised needs e1, so gk.sample calls the model once
    per step for it, with the model's time_input ("scaled": t * 1000 / T); a model output without channels is
    refused naming the solver."""
    sched = gk.Schedule.linear(100)
    oracle = gk.GaussianMixtureOracle([1.0], torch.full((1, 1, 2, 2), 0.5, dtype=torch.float64), [0.01],
                                      schedule=sched)
    seen, infos = [], []

    class Scaled(torch.nn.Module):
        time_input = "scaled"

        def __init__(self, channels):
            super().__init__()
            self.channels = channels

        def forward(self, x, t):
            seen.append(float(t[0]))
            return torch.zeros(x.shape[0], self.channels, *x.shape[2:])

    kwargs = dict(shape=(2, 1, 2, 2), steps=2, solver="exact", schedule=sched, generator=0, progress=False,
                  trajectory=[99, 49], oracle=oracle, callback=infos.append)
    gk.sample(Scaled(1), **kwargs)
    assert seen == [990.0, 490.0] and len(infos) == 2
    with pytest.raises(ValueError, match=r"^solver 'exact' needs 1 head"):
        gk.sample(Scaled(0), **kwargs)


def test_sample_refuses_an_unknown_option_of_the_exact_solver():
    """The exact solver's options are checked as given (the model is only added as its default oracle): an unknown
    option is refused, not dropped."""
    sched = gk.Schedule.linear(20)
    oracle = gk.GaussianMixtureOracle([1.0], torch.zeros(1, 1, 2, 2, dtype=torch.float64), [0.01], schedule=sched)
    with pytest.raises(ValueError, match=r"unknown option\(s\) bogus for solver 'exact'"):
        gk.sample(oracle, shape=(2, 1, 2, 2), steps=2, solver="exact", schedule=sched, progress=False, bogus=1)


class _CountingOracle(torch.nn.Module):
    """An exact-heads Gaussian-mixture model that counts its calls and can return NaN."""

    def __init__(self, schedule, nan=False):
        super().__init__()
        self.oracle = gk.GaussianMixtureOracle([0.5, 0.5], torch.tensor([[[[-0.5]]], [[[0.5]]]], dtype=torch.float64),
                                               [0.02, 0.02], schedule=schedule)
        self.calls, self.nan = 0, nan

    def forward(self, x, t):
        self.calls += 1
        out = self.oracle(x, t)
        return torch.full_like(out, float("nan")) if self.nan else out


def test_sample_passes_T_to_the_fused_step_with_the_papers_learning_rates():
    """gk.sample hands the schedule's T to the fused step: ADAN with lr="paper" needs it for its rate table, and
    the C++ step then follows the float64 torch step."""
    from gms_kernels.kernels import cpp

    if not cpp.available():
        pytest.fail("the C++ extension is missing (CI builds it)")
    sched = gk.Schedule.linear(50)
    runs = [gk.sample(_CountingOracle(sched), shape=(3, 1, 1, 1), steps=3, solver="gms", schedule=sched, generator=0,
                      progress=False, fit="adan", lr="paper", backend=backend) for backend in ("cpp", "torch")]
    assert torch.allclose(runs[0], runs[1], atol=1e-3)


def test_sample_with_a_callback_reuses_the_step_heads_and_names_the_step_of_a_bad_recomputed_e1():
    """With a callback, gk.sample makes no extra network call for a solver that has heads (e1 is heads[0]); for
    the exact solver (no heads) it calls the model once more per step for e1, and a NaN there is reported with
    the step it happened at."""
    sched = gk.Schedule.linear(50)
    model = _CountingOracle(sched)
    gk.sample(model, shape=(2, 1, 1, 1), steps=4, solver="sn-ddpm", schedule=sched, generator=0, progress=False,
              callback=lambda info: None)
    assert model.calls == len(gk.trajectory(sched, 4, "even"))
    bad = _CountingOracle(sched, nan=True)
    with pytest.raises(ValueError, match=r"at step 0 \(t=49\) has non-finite values"):
        gk.sample(bad, shape=(2, 1, 1, 1), steps=4, solver="exact", schedule=sched, generator=0, progress=False,
                  oracle=model.oracle, callback=lambda info: None)


@pytest.mark.parametrize("a, b, same", [
    ("cpu", "cpu", True), ("cpu:0", "cpu", True), ("cuda", "cuda:1", True), ("cuda:1", "cuda:1", True),
    ("cuda:0", "cuda:1", False), ("cpu", "cuda", False), ("cpu", "meta", False),
])
def test_a_device_named_without_an_index_matches_any_index_of_its_type(a, b, same):
    """gk.sample refuses a device= that contradicts x_T's device through this comparison: "cuda" names
    whichever CUDA device x_T is on, "cuda:0" and "cuda:1" are different devices (checked both ways round;
    torch.device needs no GPU to name one)."""
    from gms_kernels.sampling import _same_device

    assert _same_device(a, b) is same
    assert _same_device(b, a) is same


def test_check_sample_args_resolves_the_backend_where_the_samples_will_be_made():
    """check_sample_args refuses what gk.sample would: the C++ backend for samples made off the CPU, where the
    model's weights put them without device= (a model on the meta device stands for one on a GPU); device= wins
    over the model's device, and device='meta' itself is refused (its samples would hold no values)."""
    import copy

    from gms_kernels.models.embedded import default_model
    from gms_kernels.sampling import check_sample_args

    model = default_model()
    on_meta = copy.deepcopy(model).to("meta")
    check_sample_args(model, backend="cpp")
    check_sample_args(on_meta, backend="cpp", device="cpu")
    with pytest.raises(ValueError, match="device='meta': meta tensors hold no values"):
        check_sample_args(model, backend="cpp", device="meta")
    with pytest.raises(ValueError, match="runs on CPU tensors"):
        check_sample_args(on_meta, backend="cpp")


@pytest.mark.parametrize("solver", ["edm-sde", "seeds-2"])
def test_a_multi_call_cpu_run_stops_at_the_first_nonfinite_network_output(solver):
    """On the CPU gk.sample checks each network call of the multi-call loops at once (a deferred check,
    made only off the CPU, would run every remaining call before raising)."""
    calls = []

    def model(x, t):
        calls.append(t)
        return torch.full_like(x, float("nan")) if len(calls) == 3 else 0.1 * x

    with pytest.raises(ValueError, match=r"network call 2 \(t=799\) has non-finite values"):
        gk.sample(model, steps=5, solver=solver, shape=(2, 1, 4, 4), schedule=gk.Schedule.linear(1000),
                  generator=0, progress=False)
    assert len(calls) == 3


def test_the_progress_bar_of_an_explicit_trajectory_counts_its_steps(monkeypatch):
    """An explicit trajectory fixes K (its length, whatever ``steps`` says), and the bar's label says so."""
    from gms_kernels import sampling

    labels = []
    real_bar = sampling.progress_bar

    def bar(iterable, progress, **kwargs):
        labels.append(kwargs["desc"])
        return real_bar(iterable, False, **kwargs)

    monkeypatch.setattr(sampling, "progress_bar", bar)
    model = lambda x, t: torch.zeros_like(x)  # noqa: E731
    gk.sample(model, shape=(1, 1, 2, 2), solver="ddim", schedule=gk.Schedule.linear(100), trajectory=[99, 50, 10],
              generator=0)
    assert labels == ["ddim K=3"]


@pytest.mark.parametrize("device, with_callback, solver, defers", [
    ("cuda", False, "edm-sde", True), ("cuda:1", False, "seeds-3", True), ("meta", False, "seeds-2", True),
    ("cpu", False, "edm-sde", False), ("cpu", False, "seeds-2", False),
    ("cuda", True, "edm-sde", False),   # a callback sees x at once
    ("cuda", False, "ggf", False),      # GGF's step-size decisions read the device anyway
])
def test_which_multi_call_runs_defer_their_finite_check(device, with_callback, solver, defers):
    from gms_kernels.sampling import _multi_call_defers_finite_check

    callback = (lambda info: None) if with_callback else None
    assert _multi_call_defers_finite_check(torch.device(device), callback, solver) is defers


def test_gk_sample_hands_the_deferral_decision_to_the_multi_call_loop(monkeypatch):
    """The decision is made from x's device, the callback and the solver, and a deferring loop runs every call
    before it reports the first non-finite one (here forced on the CPU)."""
    from gms_kernels import sampling

    asked, calls = [], []
    monkeypatch.setattr(sampling, "_multi_call_defers_finite_check", lambda *args: asked.append(args) or True)

    def model(x, t):
        calls.append(t)
        return torch.full_like(x, float("nan")) if len(calls) == 3 else 0.1 * x

    with pytest.raises(ValueError, match=r"network call 2 \(t=799\) has non-finite values"):
        gk.sample(model, steps=5, solver="edm-sde", shape=(2, 1, 4, 4), schedule=gk.Schedule.linear(1000),
                  generator=0, progress=False)
    assert asked == [(torch.device("cpu"), None, gk.solvers.get_solver("edm-sde"))]
    from gms_kernels.solvers import get_solver  # the loop ran to its end before it reported the bad call
    assert len(calls) == get_solver("edm-sde").network_calls(len(gk.trajectory(gk.Schedule.linear(1000), 5, "even")))

    asked.clear()
    callback = lambda info: None  # noqa: E731
    gk.sample(lambda x, t: 0.1 * x, steps=3, solver="seeds-2", shape=(1, 1, 2, 2), generator=0, progress=False,
              callback=callback)
    assert asked == [(torch.device("cpu"), callback, gk.solvers.get_solver("seeds-2"))]
