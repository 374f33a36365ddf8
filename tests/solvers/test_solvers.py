"""Every solver through gk.sample / gk.step: shapes, dtypes, seeds, batch independence, errors."""
import pytest
import torch

import gms_kernels as gk

from conftest import image_oracle

ALL_SOLVERS = ["ddpm", "ddpm-large", "sn-ddpm", "ddim", "analytic-dpm", "gms", "exact"]


@pytest.fixture(scope="module")
def setup():
    sched = gk.Schedule.linear(100, 1e-3, 0.2)
    oracle = image_oracle(sched)
    data = oracle.sample_data(64, torch.Generator().manual_seed(0))
    gamma = gk.estimate_gamma(oracle, data, sched, generator=torch.Generator().manual_seed(1))
    return sched, oracle, gamma


def _opts(solver, gamma):
    return {"gamma": gamma} if solver == "analytic-dpm" else {}


@pytest.mark.parametrize("solver", ALL_SOLVERS)
@pytest.mark.parametrize("kind", list(gk.TRAJECTORY_KINDS) + [[77, 31, 2]])
def test_every_solver_with_every_trajectory(setup, solver, kind):
    sched, oracle, gamma = setup
    x = gk.sample(oracle, shape=(3, 3, 5, 7), steps=4, solver=solver, trajectory=kind, generator=1,
                  progress=False, **_opts(solver, gamma))
    assert x.shape == (3, 3, 5, 7) and x.dtype == torch.float32 and torch.isfinite(x).all()


@pytest.mark.parametrize("solver", ALL_SOLVERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtype_is_kept(setup, solver, dtype):
    sched, oracle, gamma = setup
    x_T = torch.randn(2, 3, 5, 7).to(dtype)
    x = gk.sample(oracle, x_T=x_T, steps=3, solver=solver, generator=3, progress=False, **_opts(solver, gamma))
    assert x.dtype == dtype and x.shape == x_T.shape and torch.isfinite(x.float()).all()


@pytest.mark.parametrize("solver,opts", [
    ("ddpm", {}), ("sn-ddpm", {}), ("ddim", {"eta": 1.0}), ("exact", {}),
    ("gms", {}), ("gms", {"select": "pixel"}), ("gms", {"fit": "adan", "fit_iters": 5}),
    ("gms", {"gaussian_last_step": False, "denoise_final": False}),
])
def test_seeds_reproduce_independently_of_batch_size(setup, solver, opts):
    sched, oracle, _ = setup
    run = lambda n, first, seed=7: gk.sample(oracle, shape=(n, 3, 5, 7), steps=5, solver=solver, generator=seed,
                                            first_index=first, progress=False, **opts)
    full = run(6, 0)
    torch.testing.assert_close(run(6, 0), full, rtol=0, atol=0)
    parts = torch.cat([run(4, 0), run(1, 4), run(1, 5)])
    torch.testing.assert_close(parts, full, rtol=0, atol=0)
    assert not torch.equal(run(6, 0, seed=8), full)


def test_torch_generator_and_per_sample_generators(setup):
    sched, oracle, _ = setup
    a = gk.sample(oracle, shape=(3, 3, 5, 7), steps=3, generator=torch.Generator().manual_seed(5), progress=False)
    b = gk.sample(oracle, shape=(3, 3, 5, 7), steps=3, generator=torch.Generator().manual_seed(5), progress=False)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    c = gk.sample(oracle, shape=(3, 3, 5, 7), steps=3, generator=gens, progress=False)
    d = gk.sample(oracle, shape=(1, 3, 5, 7), steps=3, generator=[torch.Generator().manual_seed(2)], progress=False)
    torch.testing.assert_close(c[2:], d, rtol=0, atol=0)  # sample 2 depends only on its own generator


def test_step_drives_an_outside_loop_like_sample(setup):
    sched, oracle, _ = setup
    ts = gk.trajectory(sched, 6)
    x_T = torch.randn(4, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    ref = gk.sample(oracle, x_T=x_T, steps=6, generator=11, progress=False)
    x = x_T
    for i, t in enumerate(ts):
        s = ts[i + 1] if i + 1 < len(ts) else gk.DATA
        out = oracle(x, torch.full((4,), t))
        x = gk.step(x, out, t, s, sched, solver="gms", generator=11)
    torch.testing.assert_close(x, ref, rtol=0, atol=0)


def test_step_with_explicit_noise_is_the_mixture_draw(setup):
    sched, oracle, _ = setup
    x_t = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    out = oracle(x_t, 60)
    z = torch.randn_like(x_t)
    u = torch.tensor([0.1, 0.9])  # sample 0 takes component 1 (u < 1/3), sample 1 component 2
    x_s, info = gk.step(x_t, out, 60, 30, sched, noise=z, uniform=u, return_info=True, data_range=None)
    expected = torch.stack([info["mu1"][0], info["mu2"][1]]) + info["s2"].sqrt() * z
    torch.testing.assert_close(x_s, expected)


def test_callback_and_time_input(setup):
    sched, oracle, _ = setup
    seen, times, shift = [], [], [0]

    def model(x, t):
        times.append(t.clone())
        return oracle(x, t - shift[0] if t.dtype == torch.long else (t * sched.T / 1000).round().long())

    gk.sample(model, shape=(2, 3, 5, 7), steps=3, schedule=sched, generator=0, progress=False,
              callback=seen.append, time_input="scaled")
    assert [c["t"] for c in seen] == gk.trajectory(sched, 3)
    assert {"step", "t", "s", "x", "mu1", "mu2", "s2"} <= set(seen[0])
    assert times[0].dtype == torch.float32 and float(times[0][0]) == pytest.approx(99 * 1000 / 100)
    times.clear()
    shift[0] = 1
    gk.sample(model, shape=(2, 3, 5, 7), steps=3, schedule=sched, generator=0, progress=False, time_input="index+1")
    assert int(times[0][0]) == 100 and times[0].dtype == torch.long


# ---------------------------------------------------------------------------- bad input
def _const_model(channels, value=0.0, bad_head=None, bad_at_call=0):
    calls = [0]

    def model(x, t):
        out = torch.full((x.shape[0], channels, *x.shape[2:]), value)
        out[:, 1 * x.shape[1]:] = 1.0  # e2 ~ 1
        if bad_head is not None and calls[0] == bad_at_call:
            out[:, bad_head * x.shape[1]] = float("nan")
        calls[0] += 1
        return out
    return model


def test_non_finite_model_output_names_step_and_head():
    with pytest.raises(ValueError, match=r"at step 2 \(t=\d+\) .*non-finite.*head e2 = E\[eps\^2\]"):
        gk.sample(_const_model(9, bad_head=1, bad_at_call=2), shape=(2, 3, 4, 4), steps=5, generator=0, progress=False)


@pytest.mark.parametrize("backend, checks_per_step", [("torch", 1), ("cpp", 0)])
def test_the_sampling_loop_checks_each_step_for_nan_once(backend, checks_per_step, monkeypatch):
    """The torch step checks x_t and the heads it reads once per step (x_t and e1..e3: 4 reads; the Gaussian
    step to t = 0 reads x_t, e1, e2: 3; the step into data x_t and e1: 2); the fused C++ step checks them while
    it reads them, so Python checks nothing.
    The loop's own split_heads must not check again: on the Triton path that would be a host sync per step,
    which the deferred flag exists to avoid."""
    import gms_kernels.model_io as model_io

    reads = []
    original = model_io.all_finite
    monkeypatch.setattr(model_io, "all_finite", lambda t: reads.append(t.shape) or original(t))
    model, calls = _const_model(9), []
    gk.sample(lambda x, t: calls.append(t) or model(x, t), shape=(2, 3, 4, 4), steps=4, generator=0,
              progress=False, backend=backend)
    assert len(calls) == 5  # (K + 1 calls: 999 -> 749 -> 499 -> 249 -> 0 -> data)
    assert len(reads) == checks_per_step * (4 * 3 + 3 + 2)


def test_too_few_channels_say_which_heads():
    with pytest.raises(ValueError, match=r"'gms' needs 3 head\(s\) \(e1 = E\[eps\], e2 = E\[eps\^2\], e3 = E\[eps\^3\]\), "
                                         r"i.e. 9 output channels.*gave 6"):
        gk.sample(_const_model(6), shape=(2, 3, 4, 4), steps=3, generator=0, progress=False)
    with pytest.raises(ValueError, match=r"'sn-ddpm' needs 2 head"):
        gk.sample(_const_model(3), shape=(2, 3, 4, 4), steps=3, solver="sn-ddpm", generator=0, progress=False)
    # e1 alone is enough for ddpm / ddim
    gk.sample(_const_model(3), shape=(2, 3, 4, 4), steps=3, solver="ddim", generator=0, progress=False)


def test_unknown_names_list_the_valid_ones():
    m = _const_model(9)
    with pytest.raises(ValueError, match="valid solvers: ddpm, ddpm-large, sn-ddpm, ddim, analytic-dpm, gms, exact"):
        gk.sample(m, shape=(1, 3, 2, 2), solver="dpm-solver", progress=False)
    with pytest.raises(ValueError, match="valid kinds: even, linear"):
        gk.sample(m, shape=(1, 3, 2, 2), trajectory="karras", progress=False)
    with pytest.raises(ValueError, match="valid: closed, adan"):
        gk.sample(m, shape=(1, 3, 2, 2), fit="newton", progress=False)
    with pytest.raises(ValueError, match="unknown option.*fit_iter .*valid: .*fit_iters"):
        gk.sample(m, shape=(1, 3, 2, 2), fit_iter=3, progress=False)
    with pytest.raises(ValueError, match="valid: sample, pixel"):
        gk.sample(m, shape=(1, 3, 2, 2), select="image", progress=False)
    with pytest.raises(ValueError, match="adan_precision 'fp16'; valid: None, 'float32', 'float64'"):
        gk.sample(m, shape=(1, 3, 2, 2), fit="adan", adan_precision="fp16", progress=False)
    with pytest.raises(ValueError, match="valid: index, index\\+1, scaled"):
        gk.sample(m, shape=(1, 3, 2, 2), time_input="seconds", progress=False)


def test_steps_and_times_out_of_range():
    m, sched = _const_model(9), gk.Schedule.linear()
    for steps in (0, 1001):
        with pytest.raises(ValueError, match=r"steps must be an integer in \[1, T = 1000\]"):
            gk.sample(m, shape=(1, 3, 2, 2), steps=steps, progress=False)
    x = torch.zeros(1, 3, 2, 2)
    with pytest.raises(ValueError, match="s < t"):
        gk.step(x, m(x, None), 10, 10, sched)
    with pytest.raises(ValueError, match="s < t"):
        gk.step(x, m(x, None), 10, 20, sched)
    with pytest.raises(ValueError, match="out of range"):
        gk.step(x, m(x, None), 1000, 5, sched)


def test_other_bad_inputs():
    m = _const_model(9)
    with pytest.raises(ValueError, match="x_T has non-finite"):
        gk.sample(m, x_T=torch.full((1, 3, 2, 2), float("inf")), progress=False)
    with pytest.raises(ValueError, match="analytic-dpm' needs gamma"):
        gk.sample(m, shape=(1, 3, 2, 2), solver="analytic-dpm", progress=False)
    with pytest.raises(ValueError, match="solver 'exact' needs oracle"):
        gk.sample(m, shape=(1, 3, 2, 2), solver="exact", progress=False)
    with pytest.raises(ValueError, match="data_range"):
        gk.sample(m, shape=(1, 3, 2, 2), data_range=(1.0, -1.0), progress=False)


def test_all_finite_fast_path_is_exact():
    from gms_kernels.model_io import all_finite

    big = torch.full((1000,), 3e38)  # finite, but its float32 sum overflows: the exact check decides
    assert all_finite(big)
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.randn(1000)
        x[17] = bad
        assert not all_finite(x)
    x = torch.zeros(4)
    x[0], x[1] = float("inf"), -float("inf")  # would cancel to NaN, never to a finite number
    assert not all_finite(x)


def test_fused_config_is_memoised_and_still_checks_options():
    from gms_kernels.solvers import fused_config

    sched = gk.Schedule.linear()
    k = sched.coefficients(500, 400)
    args = (k, (-1.0, 1.0), sched.T, 2, 48)
    a = fused_config("gms", {"fit": "adan", "fit_iters": 25}, *args)
    assert fused_config("gms", {"fit": "adan", "fit_iters": 25}, *args) is a  # the same step: built once
    assert len(a.lrs) == 25 and len(fused_config("gms", {"fit": "adan", "fit_iters": 70}, *args).lrs) == 70
    assert fused_config("gms", {"fit": "adan", "fit_iters": 25}, sched.coefficients(500, 300), *args[1:]) != a
    # an option that cannot be hashed skips the memo and gives the same config as its hashable twin
    assert fused_config("gms", {"weights": [1 / 3, 2 / 3]}, *args) == fused_config("gms", {"weights": (1 / 3, 2 / 3)}, *args)
    assert fused_config("seeds-1", {}, *args) is None  # not a fused step
    for _ in range(2):  # errors are not memoised: every call checks again
        with pytest.raises(ValueError, match="unknown option"):
            fused_config("gms", {"fit_iter": 3}, *args)
        with pytest.raises(ValueError, match="valid solvers"):
            fused_config("dpm-solver", {}, *args)


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_the_callback_carries_mixture_parameters_only_for_a_mixture_step(backend):
    """A fused ddpm / sn-ddpm step fits no mixture: its callback has no mu1 / mu2 / s2 keys (the C++ kernel's
    buffers hold nothing meaningful there); a GMS step's callback has them on every backend."""
    keys = {}
    for solver in ("ddpm", "sn-ddpm", "gms"):
        seen = []
        gk.sample(_const_model(9), shape=(2, 3, 4, 4), steps=3, solver=solver, generator=0, progress=False,
                  backend=backend, callback=lambda info: seen.append(set(info)))
        keys[solver] = seen[0]  # (the first step: not the step into data, which denoises)
    assert not {"mu1", "mu2", "s2"} & (keys["ddpm"] | keys["sn-ddpm"])
    assert {"mu1", "mu2", "s2"} <= keys["gms"]
