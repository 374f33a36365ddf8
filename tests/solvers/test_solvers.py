"""Every solver through gk.sample / gk.step: shapes, dtypes, seeds, batch independence, errors."""
import math

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


LINEAR_BETAS = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64).tolist()


def _abar(t: int) -> float:
    """prod_{i<=t} (1 - beta_i) of the linear schedule, recomputed here (1 for the data, t = -1)."""
    return 1.0 if t < 0 else math.prod(1.0 - b for b in LINEAR_BETAS[: t + 1])


def _posterior(t: int, s: int) -> tuple[float, float, float]:
    """(coefficient of x_t, coefficient of x0, variance) of q(x_s | x_t, x0) for a jump t -> s (DDPM Eq. 7)."""
    ab_t, ab_s = _abar(t), _abar(s)
    alpha = ab_t / ab_s
    return (math.sqrt(alpha) * (1 - ab_s) / (1 - ab_t), math.sqrt(ab_s) * (1 - alpha) / (1 - ab_t),
            (1 - ab_s) / (1 - ab_t) * (1 - alpha))


def _inputs(seed: int, shape=(3, 2, 4, 4), scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) * scale for _ in range(3)]


def test_ddpm_large_and_ddim_report_their_step_quantities():
    """return_info (and sample's callback) hand out the step's own quantities under fixed keys: ddpm's and
    ddpm-large's "m1" is the posterior mean c_xt x_t + c_x0 x0 (and x_s - m1 is sqrt(lam2) z, sqrt(beta_{t|s}) z);
    ddim's "x0" is the
    clamped x0 estimate (x_t - sqrt(1 - abar_t) e1) / sqrt(abar_t)."""
    sched = gk.Schedule.linear()
    x, e1, z = _inputs(1)
    t, s = 700, 500
    c_xt, c_x0, _ = _posterior(t, s)
    x0 = ((x - math.sqrt(1 - _abar(t)) * e1) / math.sqrt(_abar(t))).clamp(-1, 1)
    for solver, var in [("ddpm", _posterior(t, s)[2]), ("ddpm-large", 1 - _abar(t) / _abar(s))]:
        x_s, info = gk.step(x, e1, t, s, sched, solver, noise=z, return_info=True, backend="torch")
        torch.testing.assert_close(info["m1"], c_xt * x + c_x0 * x0, rtol=0, atol=1e-12)
        torch.testing.assert_close(x_s - info["m1"], math.sqrt(var) * z, rtol=0, atol=1e-12)
    _, info = gk.step(x, e1, t, s, sched, "ddim", noise=z, return_info=True, backend="torch")
    assert 0 < int((x0.abs() == 1).sum()) < x0.numel()  # the clamp binds somewhere
    torch.testing.assert_close(info["x0"], x0, rtol=0, atol=1e-12)


def test_analytic_dpm_reads_a_list_table_in_float64():
    """A Gamma table given as a list of Python floats is read in float64 (not rounded to float32): the
    variance is Bao et al.'s lam2 + (sqrt(bbar_t / alpha_ts) - sqrt(bbar_s - lam2))^2 (1 - Gamma_t) to 1e-13."""
    sched = gk.Schedule.linear()
    t, s = 999, 899
    gamma = [0.1 + 0.7 * i / 999 for i in range(1000)]  # none of these is a float32 number
    g = gamma[t]
    assert float(torch.tensor(g, dtype=torch.float32)) != g
    x, e1, z = _inputs(2)
    _, info = gk.step(x, e1, t, s, sched, "analytic-dpm", noise=z, gamma=gamma, data_range=None,
                      return_info=True, backend="torch")
    ab_t, ab_s = _abar(t), _abar(s)
    lam2 = _posterior(t, s)[2]
    var = lam2 + (math.sqrt((1 - ab_t) / (ab_t / ab_s)) - math.sqrt(1 - ab_s - lam2)) ** 2 * (1 - g)
    torch.testing.assert_close(info["var"], torch.full_like(x, var), rtol=1e-13, atol=0)


@pytest.mark.parametrize("prediction", ["noise", "data"])
def test_seeds_1_clamps_x0_to_the_data_range(prediction):
    """SEEDS-1 with a data range uses the clamped x0 (and, in the noise form, the eps it implies), as DDIM
    does: x_s = (a_s/a_t) x_t - 2 sigma_s (e^h - 1) eps~ + sigma_s sqrt(e^2h - 1) z with
    eps~ = (x_t - a_t clamp(x0)) / sigma_t; the data form is the DDPM posterior step on clamp(x0)."""
    sched = gk.Schedule.linear()
    x, e1, z = _inputs(3)
    t, s = 600, 350
    a_t, a_s = math.sqrt(_abar(t)), math.sqrt(_abar(s))
    sig_t, sig_s = math.sqrt(1 - _abar(t)), math.sqrt(1 - _abar(s))
    x0 = ((x - sig_t * e1) / a_t).clamp(-1, 1)
    assert 0 < int((x0.abs() == 1).sum()) < x0.numel()
    h = math.log(a_s / sig_s) - math.log(a_t / sig_t)
    if prediction == "noise":
        eps = (x - a_t * x0) / sig_t
        ref = a_s / a_t * x - 2 * sig_s * math.expm1(h) * eps + sig_s * math.sqrt(math.expm1(2 * h)) * z
    else:
        c_xt, c_x0, lam2 = _posterior(t, s)
        ref = c_xt * x + c_x0 * x0 + math.sqrt(lam2) * z
    got, info = gk.step(x, e1, t, s, sched, "seeds-1", noise=z, data_range=(-1.0, 1.0), prediction=prediction,
                        return_info=True)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(info["x0"], x0, rtol=0, atol=1e-12)
    # the step to data (SEEDS-1's own branch: it has no denoise_final option) returns clamp(x0)
    last, info = gk.step(x, e1, t, -1, sched, "seeds-1", noise=z, data_range=(-1.0, 1.0), prediction=prediction,
                         return_info=True)
    torch.testing.assert_close(last, x0, rtol=0, atol=1e-12)
    torch.testing.assert_close(info["x0"], x0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("v", [0.0, 0.5, 1.0])
def test_ddpm_reports_its_variance(v):
    """ddpm's info "var" is the variance it draws with: lam2 = (1 - abar_s)/(1 - abar_t) beta_{t|s} at
    variance_interp v = 0, lam2^(1 - v) beta_{t|s}^v otherwise (beta_{t|s} at v = 1), from the betas."""
    sched = gk.Schedule.linear()
    x, e1, z = _inputs(4)
    t, s = 300, 150
    lam2, beta_ts = _posterior(t, s)[2], 1 - _abar(t) / _abar(s)
    var = lam2 ** (1 - v) * beta_ts**v
    x_s, info = gk.step(x, e1, t, s, sched, "ddpm", noise=z, variance_interp=v, return_info=True, backend="torch")
    assert float(info["var"]) == pytest.approx(var, rel=1e-12)
    torch.testing.assert_close(x_s - info["m1"], math.sqrt(var) * z, rtol=0, atol=1e-12)


def test_explicit_float32_noise_enters_the_float64_step_exactly():
    """The torch backend is the float64 reference: explicit float32 noise z is widened before it is scaled, so
    ddpm's x_s - m1 is sqrt(lam2) * float64(z) to float64 rounding (scaling z in float32 first errs by ~1e-8)."""
    sched = gk.Schedule.linear()
    x, e1, _ = _inputs(5)
    z32 = torch.randn(x.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float32) * 3
    t, s = 400, 200
    lam2 = _posterior(t, s)[2]
    x_s, info = gk.step(x, e1, t, s, sched, "ddpm", noise=z32, return_info=True, backend="torch")
    assert x_s.dtype == torch.float64
    torch.testing.assert_close(x_s - info["m1"], math.sqrt(lam2) * z32.double(), rtol=0, atol=1e-14)


def test_a_step_without_a_randomness_source_names_what_it_needs():
    """StepRandomness without a Philox source refuses to draw, naming the missing noise or uniforms."""
    from gms_kernels.solvers import StepRandomness

    rand = StepRandomness(None, 5, torch.zeros(2, 1, 3))
    with pytest.raises(ValueError, match=r"needs noise: pass a generator/seed or explicit noise"):
        rand.normal()
    with pytest.raises(ValueError, match=r"needs uniform: pass a generator/seed or explicit uniform"):
        rand.uniform(False)


def test_an_open_interval_is_written_open_in_the_error():
    """_real's message names the option and what it is, and shows an open lower end as "(", a closed one as "["."""
    sched = gk.Schedule.linear(20)
    x, e1, _ = _inputs(7, shape=(2, 1, 2, 2))
    heads = torch.cat([e1, e1 * e1, e1**3], dim=1)
    with pytest.raises(ValueError, match=r"^variance_scale must be a number in \(0, 100\] \(the factor on Var\)"):
        gk.step(x, heads, 10, 5, sched, "gms", generator=0, variance_scale=0.0, backend="torch")
    with pytest.raises(ValueError, match=r"^eta must be a number in \[0, 1\] \(DDIM's eta\), got -0.5"):
        gk.step(x, e1, 10, 5, sched, "ddim", generator=0, eta=-0.5, backend="torch")


def test_the_fused_config_memo_keeps_option_types_apart():
    """The fused kernels' config memo keys each option by its type as well as its value: gaussian_last_step=1
    (== True, same hash) after a step with True must still be refused as not a bool, not served from the memo."""
    pytest.importorskip("gms_kernels._C")
    sched = gk.Schedule.linear(20)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(8))
    e1 = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(9))
    gk.step(x, e1, 10, 5, sched, "ddpm", generator=0, gaussian_last_step=True, backend="cpp")
    with pytest.raises(ValueError, match="gaussian_last_step must be True or False"):
        gk.step(x, e1, 10, 5, sched, "ddpm", generator=0, gaussian_last_step=1, backend="cpp")


def test_the_denoised_last_step_reports_x0():
    """The step to data with denoise_final (the default) returns the clamped E[x0|x_t] and reports it as "x0"."""
    sched = gk.Schedule.linear()
    x, e1, z = _inputs(14)
    t = 300
    x0 = ((x - math.sqrt(1 - _abar(t)) * e1) / math.sqrt(_abar(t))).clamp(-1, 1)
    assert 0 < int((x0.abs() == 1).sum()) < x0.numel()
    got, info = gk.step(x, e1, t, -1, sched, "ddpm", noise=z, return_info=True, backend="torch")
    torch.testing.assert_close(got, x0, rtol=0, atol=1e-12)
    torch.testing.assert_close(info["x0"], x0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["cpp", "torch"])
@pytest.mark.parametrize("weights, message", [((0.5, 0.6), "sum to 1"), ((0.5, 0.5), "equal weights")])
def test_bad_mixture_weights_are_refused_on_every_backend(backend, weights, message):
    """resolve_options checks the weights for every backend: the fused C++ kernel (which reads w1 as given)
    must refuse weights that do not sum to 1, or equal weights, as the torch fit does."""
    if backend == "cpp":
        pytest.importorskip("gms_kernels._C")
    sched = gk.Schedule.linear(20)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(15))
    heads = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(16))
    with pytest.raises(ValueError, match=message):
        gk.step(x, heads, 10, 5, sched, "gms", generator=0, weights=weights, backend=backend)


@pytest.mark.parametrize("solver, key, value", [("ddim", "eta", 0.3), ("ddpm", "variance_interp", 0.3),
                                                ("ddpm", "clip_pixel", 1.5), ("gms", "variance_scale", 1.3),
                                                ("gms", "skew_threshold", 0.3), ("gms", "lr", 0.03),
                                                ("edm-sde", "s_churn", 0.3), ("edm-sde", "s_tmin", 0.3),
                                                ("edm-sde", "s_tmax", 5.3), ("edm-sde", "s_noise", 1.3),
                                                ("seeds-2", "r", 0.3), ("ggf", "eps_abs", 0.3), ("ggf", "eps_rel", 0.3),
                                                ("ggf", "h_init", 0.3), ("ggf", "exponent", 0.3),
                                                ("ggf", "safety", 0.3)])
def test_real_options_are_resolved_to_python_floats(solver, key, value):
    """A real-valued option given as a NumPy float32 comes back from resolve_options as the Python float of
    the same value (under NumPy 2 a float32 would otherwise pull the float64 reference's arithmetic down to
    float32); e.g. DDIM with eta = float32(0.3) takes the same step as with eta = float(float32(0.3))."""
    import numpy as np

    from gms_kernels.solvers import SOLVERS, resolve_options

    v32 = np.float32(value)
    got = resolve_options(SOLVERS[solver], {key: v32}).as_dict()[key]
    assert type(got) is float and got == float(v32)
    if key == "eta":
        sched = gk.Schedule.linear()
        x, e1, z = _inputs(17)
        a = gk.step(x, e1, 500, 300, sched, "ddim", noise=z, eta=v32, backend="torch")
        b = gk.step(x, e1, 500, 300, sched, "ddim", noise=z, eta=float(v32), backend="torch")
        assert torch.equal(a, b)


def test_edm_sde_churn_bounds():
    """EDM's S_churn is any real number >= 0 (0 turns the churn off; Karras et al. use values like 0.5 to 80):
    0 and 0.5 are accepted as given, a negative one is refused with the option described."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    for churn in (0.0, 0.5, 80.0):
        assert resolve_options(SOLVERS["edm-sde"], {"s_churn": churn}).as_dict()["s_churn"] == churn
    with pytest.raises(ValueError, match=r"^s_churn must be a number in \[0, inf\] \(EDM's total churn S_churn\)"):
        resolve_options(SOLVERS["edm-sde"], {"s_churn": -0.1})
    with pytest.raises(ValueError, match=r"^s_tmin must be a number in \[0, inf\] \(EDM's lowest churned sigma S_tmin\)"):
        resolve_options(SOLVERS["edm-sde"], {"s_tmin": -0.1})
    with pytest.raises(ValueError, match=r"^s_tmax must be a number in \[2, inf\] \(EDM's highest churned sigma S_tmax, "
                                         r">= s_tmin\)"):
        resolve_options(SOLVERS["edm-sde"], {"s_tmin": 2.0, "s_tmax": 1.0})
    with pytest.raises(ValueError, match=r"^s_noise must be a number in \[0, 2\] \(EDM's noise inflation S_noise\)"):
        resolve_options(SOLVERS["edm-sde"], {"s_noise": 2.5})


def test_seeds_2_intermediate_point_lies_inside_the_step():
    """SEEDS-2's r is a fraction of the step in lambda, in (0, 1): 0.5 and 0.999 are accepted; 0, 1 and 1.5
    (a point beyond the step) are refused, with the option described."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    for r in (0.5, 0.999):
        assert resolve_options(SOLVERS["seeds-2"], {"r": r}).as_dict()["r"] == r
    for r in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"^r must be a number in \(0, 1\] \(SEEDS-2's intermediate point, a "
                                             r"fraction of the step in lambda\)"):
            resolve_options(SOLVERS["seeds-2"], {"r": r})
    with pytest.raises(ValueError, match=r"r must be a number in \(0, 1\)"):
        resolve_options(SOLVERS["seeds-2"], {"r": 1.0})


def test_ggf_option_errors_describe_the_option():
    """GGF's option errors name the option, its interval and what it is."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    cases = [({"eps_abs": 0.0}, r"^eps_abs must be a number in \(0, inf\] \(GGF's absolute tolerance\)"),
             ({"eps_rel": -1.0}, r"^eps_rel must be a number in \[0, inf\] \(GGF's relative tolerance\)"),
             ({"h_init": 0.0}, r"^h_init must be a number in \(0, 1\] \(GGF's first step in u in \[0, 1\]\)"),
             ({"exponent": 1.5}, r"^exponent must be a number in \(0, 1\] \(GGF's step-size exponent r\)"),
             ({"exponent": 0.0}, r"^exponent must be a number in \(0, 1\]"),
             ({"safety": 0.0}, r"^safety must be a number in \(0, 1\] \(GGF's safety factor theta\)")]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            resolve_options(SOLVERS["ggf"], options)


def test_ggf_max_attempts_bounds():
    """GGF's max_attempts is an integer in [1, 65535] (the per-sample noise counter holds 16 bits)."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    for m in (1, 65535):
        assert resolve_options(SOLVERS["ggf"], {"max_attempts": m}).as_dict()["max_attempts"] == m
    for m in (0, 65536, 2.0, True):
        with pytest.raises(ValueError, match=r"max_attempts must be an integer in \[1, 65535\]"):
            resolve_options(SOLVERS["ggf"], {"max_attempts": m})


def test_resolved_weights_are_a_pair_of_python_floats():
    """resolve_options hands the fit its weights as the checked pair of Python floats, whatever sequence the
    caller gave: a list of NumPy float32 values comes back as the tuple (0.25, 0.75)."""
    import numpy as np

    from gms_kernels.solvers import SOLVERS, resolve_options

    got = resolve_options(SOLVERS["gms"], {"weights": [np.float32(0.25), np.float32(0.75)]}).as_dict()["weights"]
    assert type(got) is tuple and [type(w) for w in got] == [float, float] and got == (0.25, 0.75)


@pytest.mark.parametrize("solver, options, message", [
    ("ddpm", {"clip_pixel": 0.0},
     r"^clip_pixel must be a number in \(0, inf\] \(the last step's std cap in pixel levels\), got 0.0$"),
    ("gms", {"lr": 200.0}, r"^lr must be a number in \[1e-10, 100\] \(ADAN's learning rate\), got 200.0$"),
    ("ddpm", {"variance_interp": 1.5},
     r"^variance_interp must be a number in \[0, 1\] \(the log-space weight of beta_\{t\|s\} in DDPM's variance\), "
     r"got 1.5$"),
    ("gms", {"skew_threshold": -1.0},
     r"^skew_threshold must be a number in \[0, inf\] \(the standardized skewness at or below which GMS draws a "
     r"Gaussian\), got -1.0$")])
def test_the_remaining_real_option_errors_describe_the_option(solver, options, message):
    """Each real-valued option's error names the option, its interval (open ends as "(") and what it is: the
    last step's pixel cap, ADAN's learning rate, DDPM's variance interpolation and GMS's skewness threshold."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    with pytest.raises(ValueError, match=message):
        resolve_options(SOLVERS[solver], options)


@pytest.mark.parametrize("solver, key, low, high, open_low, interval", [
    ("ddpm", "clip_pixel", 0.0, None, True, "(0, inf]"),
    ("gms", "lr", 1e-10, 100.0, False, "[1e-10, 100]"),
    ("ddim", "eta", 0.0, 1.0, False, "[0, 1]"),
    ("ddpm", "variance_interp", 0.0, 1.0, False, "[0, 1]"),
    ("gms", "variance_scale", 0.0, 100.0, True, "(0, 100]"),
    ("gms", "skew_threshold", 0.0, None, False, "[0, inf]"),
    ("edm-sde", "s_churn", 0.0, None, False, "[0, inf]"),
    ("edm-sde", "s_noise", 0.0, 2.0, False, "[0, 2]"),
    ("ggf", "eps_abs", 0.0, None, True, "(0, inf]"),
    ("ggf", "eps_rel", 0.0, None, False, "[0, inf]"),
    ("ggf", "h_init", 0.0, 1.0, True, "(0, 1]"),
    ("ggf", "exponent", 0.0, 1.0, True, "(0, 1]"),
    ("ggf", "safety", 0.0, 1.0, True, "(0, 1]")])
def test_every_real_option_takes_the_ends_of_its_interval_and_refuses_just_past_them(solver, key, low, high,
                                                                                      open_low, interval):
    """Each real-valued option accepts the closed ends of its documented interval (returned as given) and the
    first float inside an open end, and refuses the open end itself and the first float past a closed one,
    naming the option and the interval. An unbounded option takes 1e300 (inf itself is refused as not finite)."""
    import re

    from gms_kernels.solvers import SOLVERS, resolve_options

    def ok(value):
        assert resolve_options(SOLVERS[solver], {key: value}).as_dict()[key] == value

    def refused(value):
        with pytest.raises(ValueError, match="^" + re.escape(f"{key} must be a number in {interval} (")):
            resolve_options(SOLVERS[solver], {key: value})

    if open_low:
        refused(low)
        ok(math.nextafter(low, math.inf))
    else:
        ok(low)
        refused(math.nextafter(low, -math.inf))
    if high is None:
        ok(1e300)
        refused(math.inf)
    else:
        ok(high)
        refused(math.nextafter(high, math.inf))


def test_edm_sde_s_tmin_and_s_tmax_ends():
    """S_tmin is any real >= 0 and S_tmax any real >= S_tmin (equal ends allowed): [0, 0] and [2, 2] are accepted;
    S_tmin just below 0 and S_tmax just below S_tmin are refused, S_tmax's interval written from S_tmin."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    edm = SOLVERS["edm-sde"]
    for tmin in (0.0, 2.0):
        o = resolve_options(edm, {"s_tmin": tmin, "s_tmax": tmin})
        assert (o.s_tmin, o.s_tmax) == (tmin, tmin)
    with pytest.raises(ValueError, match=r"^s_tmin must be a number in \[0, inf\]"):
        resolve_options(edm, {"s_tmin": math.nextafter(0.0, -1.0), "s_tmax": 1.0})
    with pytest.raises(ValueError, match=r"^s_tmax must be a number in \[2, inf\]"):
        resolve_options(edm, {"s_tmin": 2.0, "s_tmax": math.nextafter(2.0, 0.0)})


@pytest.mark.parametrize("solver, key, value, kind", [("gms", "fit_iters", "int64", int),
                                                      ("ggf", "max_attempts", "int64", int),
                                                      ("gms", "var_floor", "float32", float)])
def test_integer_and_var_floor_options_are_resolved_to_python_numbers(solver, key, value, kind):
    """fit_iters and max_attempts given as a NumPy int64, and var_floor as a NumPy float32, come back from
    resolve_options as the Python int or float of the same value (as the other real options do)."""
    import numpy as np

    from gms_kernels.solvers import SOLVERS, resolve_options

    given = getattr(np, value)(7 if kind is int else 0.25)
    got = resolve_options(SOLVERS[solver], {key: given}).as_dict()[key]
    assert type(got) is kind and got == (7 if kind is int else 0.25)


def test_solver_step_runs_the_float64_torch_step_unless_a_backend_is_named():
    """solver_step's backend defaults to the float64 torch reference, even with a Philox source that a fused
    kernel could draw from: a float32 x_t gives a float64 x_s, the same as with backend='torch'."""
    from gms_kernels.core.random import SampleNoise
    from gms_kernels.solvers import StepRandomness, solver_step

    sched = gk.Schedule.linear(20)
    k = sched.coefficients(10, 5)
    x = torch.randn(2, 1, 2, 2, generator=torch.Generator().manual_seed(19))
    e1 = torch.randn(2, 1, 2, 2, generator=torch.Generator().manual_seed(20))

    def run(*backend):
        rand = StepRandomness(SampleNoise.create(4, 2), 10, x)
        return solver_step("ddpm", x, [e1], k, rand, (-1.0, 1.0), sched.T, {}, *backend)[0]

    got = run()
    assert got.dtype == torch.float64
    assert torch.equal(got, run("torch"))


def test_float32_inputs_enter_the_float64_step_exactly():
    """solver_step's torch path is the float64 reference: it widens a float32 x_t before it scales it, so
    ddpm's x_s (noise 0) is c_xt x_t + c_x0 x0 (DDPM Eq. 7, x0 the clamped estimate) in float64 arithmetic to
    1e-13 (c_xt x_t taken in float32 errs by ~1e-8)."""
    from gms_kernels.solvers import StepRandomness, solver_step

    sched = gk.Schedule.linear()
    x, e1, _ = (v.float() for v in _inputs(22))
    t, s = 700, 500
    c_xt, c_x0, _ = _posterior(t, s)
    x64, e64 = x.double(), e1.double()
    x0 = ((x64 - math.sqrt(1 - _abar(t)) * e64) / math.sqrt(_abar(t))).clamp(-1, 1)
    rand = StepRandomness(None, t, x, noise=torch.zeros_like(x64))
    x_s, _ = solver_step("ddpm", x, [e1], sched.coefficients(t, s), rand, (-1.0, 1.0), sched.T, {})
    assert x_s.dtype == torch.float64
    torch.testing.assert_close(x_s, c_xt * x64 + c_x0 * x0, rtol=0, atol=1e-13)


def test_step_randomness_lives_on_x_ts_device():
    """StepRandomness asks its Philox source for noise and uniforms on x_t's device and hands explicit host
    noise and uniforms back on that device (the meta device stands in for a GPU; a recording source stands
    in for SampleNoise)."""
    from gms_kernels.solvers import StepRandomness

    like = torch.zeros(2, 1, 3, device="meta")
    asked = []

    class RecordingSource:
        def normal(self, stream, t, shape, device):
            asked.append(("normal", tuple(shape), device))
            return torch.zeros(2, *shape, device=device)

        def uniform(self, stream, t, shape, device):
            asked.append(("uniform", tuple(shape), device))
            return torch.zeros(2, *shape, device=device)

    rand = StepRandomness(RecordingSource(), 5, like)
    assert rand.normal().device.type == "meta" and rand.uniform(True).device.type == "meta"
    assert asked == [("normal", (1, 3), like.device), ("uniform", (1, 3), like.device)]
    explicit = StepRandomness(None, 5, like, noise=torch.zeros(2, 1, 3), uniform=torch.zeros(2))
    noise, uniform = explicit.normal(), explicit.uniform(False)
    assert (noise.device.type, noise.dtype) == ("meta", torch.float64) and uniform.device.type == "meta"


@pytest.mark.parametrize("solver", ["ddpm", "gms"])
@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_denoise_final_must_be_a_bool(solver, value):
    """denoise_final (return the denoised mean at the step into the data) is a switch like gaussian_last_step:
    1, 0, "yes" or None is refused with a message that names the option and the value given."""
    import re

    from gms_kernels.solvers import SOLVERS, resolve_options

    with pytest.raises(ValueError, match="^" + re.escape(f"denoise_final must be True or False, got {value!r}") + "$"):
        resolve_options(SOLVERS[solver], {"denoise_final": value})
    assert resolve_options(SOLVERS[solver], {"denoise_final": False}).as_dict()["denoise_final"] is False


def test_a_direct_solver_step_names_a_non_finite_x_t_without_a_step_label():
    """Called without ``where``, solver_step's NaN check names the culprit and nothing else: "x_t has
    non-finite values (NaN or inf)", with no step label in between."""
    from gms_kernels.solvers import StepRandomness, solver_step

    sched = gk.Schedule.linear(20)
    x, e1, _ = _inputs(23, shape=(2, 1, 2, 2))
    x[0, 0, 0, 0] = float("nan")
    rand = StepRandomness(None, 10, x, noise=torch.zeros_like(x))
    with pytest.raises(ValueError, match=r"^x_t has non-finite values \(NaN or inf\)$"):
        solver_step("ddpm", x, [e1], sched.coefficients(10, 5), rand, (-1.0, 1.0), sched.T, {})
