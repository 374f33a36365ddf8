"""The variance controls (sn-ddpm variance_scale, ddpm variance_interp), GMS's variance_scale, skew_threshold and
skew_scale, and the official preset, through gk.step, gk.sample, GMSScheduler and the command line. Every expected
value is computed here from the formulas in float64, not by calling the function under test."""
import math

import pytest
import torch

import gms_kernels as gk
from conftest import image_oracle
from gms_kernels.core.fit import SKEW_KNEE
from gms_kernels.core.moments import central_third_moment, scale_spread, transition_moments

T_, S_ = 600, 400


@pytest.fixture(scope="module")
def step_inputs():
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    g = torch.Generator().manual_seed(3)
    x_t = torch.randn(4, 3, 5, 7, generator=g, dtype=torch.float64)
    heads = oracle(x_t, T_)
    z = torch.randn(x_t.shape, generator=g, dtype=torch.float64)
    return sched, x_t, heads, z


def _moments(sched, x_t, heads):
    e1, e2, e3 = heads.chunk(3, dim=1)
    return transition_moments(x_t, e1, e2, e3, sched.coefficients(T_, S_), (-1.0, 1.0))


@pytest.mark.parametrize("c", [0.25, 0.7, 1.6])
def test_sn_ddpm_variance_scale_draws_c_times_the_variance(step_inputs, c):
    sched, x_t, heads, z = step_inputs
    mom = _moments(sched, x_t, heads)
    x_s = gk.step(x_t, heads, T_, S_, sched, solver="sn-ddpm", noise=z, variance_scale=c)
    torch.testing.assert_close(x_s, mom.m1 + (c * mom.var).sqrt() * z, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("v", [0.0, 0.3, 1.0])
def test_ddpm_variance_interp_is_the_log_space_mix(step_inputs, v):
    sched, x_t, heads, z = step_inputs
    k = sched.coefficients(T_, S_)
    ab_t, ab_s = float(sched.alphas_cumprod[T_]), float(sched.alphas_cumprod[S_])
    beta_ts = 1 - ab_t / ab_s
    beta_tilde = (1 - ab_s) / (1 - ab_t) * beta_ts  # the DDPM posterior variance
    var = math.exp((1 - v) * math.log(beta_tilde) + v * math.log(beta_ts))
    m1 = _moments(sched, x_t, heads).m1
    x_s = gk.step(x_t, heads, T_, S_, sched, solver="ddpm", noise=z, variance_interp=v)
    torch.testing.assert_close(x_s, m1 + math.sqrt(var) * z, rtol=1e-12, atol=1e-12)
    assert k.lam2 == pytest.approx(beta_tilde, rel=1e-12)
    if v == 1.0:  # the fixed-large end is 'ddpm-large'
        torch.testing.assert_close(x_s, gk.step(x_t, heads, T_, S_, sched, solver="ddpm-large", noise=z))


def test_scale_spread_keeps_mean_and_standardized_skew():
    g = torch.Generator().manual_seed(0)
    x = torch.distributions.Gamma(2.0, 3.0).sample((200000,)).double()  # a skewed sample
    m1, var = x.mean(), x.var(unbiased=False)
    mom = gk.TransitionMoments(m1.reshape(1), var.reshape(1), (x**3).mean().reshape(1))
    scaled = scale_spread(mom, 0.49)
    y = m1 + 0.7 * (x - m1)  # the same distribution with 0.49 times the variance
    torch.testing.assert_close(scaled.var, (0.49 * var).reshape(1))
    torch.testing.assert_close(scaled.m3, (y**3).mean().reshape(1), rtol=1e-9, atol=1e-12)
    assert scale_spread(mom, 1.0) is mom
    del g


def test_gms_variance_scale_fits_the_scaled_moments(step_inputs):
    sched, x_t, heads, z = step_inputs
    _, info = gk.step(x_t, heads, T_, S_, sched, solver="gms", noise=z, uniform=torch.full(x_t.shape, 0.5),
                      variance_scale=0.6, return_info=True, select="pixel")
    mom = _moments(sched, x_t, heads)
    torch.testing.assert_close(info["var"], 0.6 * mom.var)
    skew = central_third_moment(mom.m1, mom.var, mom.m3) / mom.var**1.5
    torch.testing.assert_close(central_third_moment(info["m1"], info["var"], info["m3"]) / info["var"]**1.5, skew)
    # the fitted mixture matches the scaled mean and variance exactly
    w1, w2 = 1 / 3, 2 / 3
    mean = w1 * info["mu1"] + w2 * info["mu2"]
    var = w1 * w2 * (info["mu1"] - info["mu2"]) ** 2 + info["s2"]
    torch.testing.assert_close(mean, mom.m1)
    torch.testing.assert_close(var, 0.6 * mom.var)


def test_skew_threshold_sends_low_skew_elements_to_the_gaussian(step_inputs):
    sched, x_t, heads, z = step_inputs
    u = torch.rand(x_t.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mom = _moments(sched, x_t, heads)
    skew = (central_third_moment(mom.m1, mom.var, mom.m3) / mom.var**1.5).abs()
    tau = float(skew.median())
    x_s, info = gk.step(x_t, heads, T_, S_, sched, solver="gms", noise=z, uniform=u, select="pixel",
                        skew_threshold=tau, return_info=True)
    full = gk.step(x_t, heads, T_, S_, sched, solver="gms", noise=z, uniform=u, select="pixel")
    gaussian = skew <= tau
    assert 0.3 < gaussian.double().mean() < 0.7
    torch.testing.assert_close(info["gaussian"], gaussian)
    torch.testing.assert_close(x_s[gaussian], (mom.m1 + mom.var.sqrt() * z)[gaussian])
    torch.testing.assert_close(x_s[~gaussian], full[~gaussian])
    # tau = 0 is the plain GMS step
    torch.testing.assert_close(gk.step(x_t, heads, T_, S_, sched, solver="gms", noise=z, uniform=u, select="pixel",
                                       skew_threshold=0.0), full)


@pytest.mark.parametrize("fit", ["closed", "adan"])
def test_skew_scale_fits_lambda_times_the_central_third_moment(step_inputs, fit):
    sched, x_t, _, z = step_inputs
    t, s = 200, 100  # (a step where the oracle's skew is well above the closed fit's knee in many elements)
    heads = image_oracle(sched)(x_t, t)
    e1, e2, e3 = heads.chunk(3, dim=1)
    mom = transition_moments(x_t, e1, e2, e3, sched.coefficients(t, s), (-1.0, 1.0))
    u = torch.full(x_t.shape, 0.5, dtype=torch.float64)
    kappa3 = mom.m3 - 3 * mom.m1 * mom.var - mom.m1**3
    lam = 0.4
    _, info = gk.step(x_t, heads, t, s, sched, solver="gms", noise=z, uniform=u, select="pixel", fit=fit,
                      skew_scale=lam, return_info=True)
    # the moments the fit saw: M1 and Var as they were, kappa3 times lambda
    torch.testing.assert_close(info["m1"], mom.m1, rtol=0, atol=0)
    torch.testing.assert_close(info["var"], mom.var, rtol=0, atol=0)
    torch.testing.assert_close(info["m3"] - 3 * info["m1"] * info["var"] - info["m1"] ** 3, lam * kappa3,
                               rtol=1e-9, atol=1e-12)
    if fit == "closed":  # the mixture matches them: mean and Var exactly, kappa3 where neither knee nor floor binds
        w1, w2 = 1 / 3, 2 / 3
        delta = info["mu1"] - info["mu2"]
        torch.testing.assert_close(w1 * info["mu1"] + w2 * info["mu2"], mom.m1)
        torch.testing.assert_close(w1 * w2 * delta**2 + info["s2"], mom.var)
        g = (lam * kappa3 / mom.var**1.5).abs()
        free = (g > 2 * SKEW_KNEE) & (info["s2"] > 0.1 * mom.var * (1 + 1e-9))
        assert free.double().mean() > 0.1
        torch.testing.assert_close((w1 * w2 * (w2 - w1) * delta**3)[free], (lam * kappa3)[free])
    # lambda = 1 is today's step, bit for bit; the fit's draw differs at lambda != 1
    plain = gk.step(x_t, heads, t, s, sched, solver="gms", noise=z, uniform=u, select="pixel", fit=fit)
    assert torch.equal(gk.step(x_t, heads, t, s, sched, solver="gms", noise=z, uniform=u, select="pixel", fit=fit,
                               skew_scale=1.0), plain)
    assert not torch.equal(gk.step(x_t, heads, t, s, sched, solver="gms", noise=z, uniform=u, select="pixel",
                                   fit=fit, skew_scale=lam), plain)


def test_skew_scale_per_step_mapping_is_looked_up_by_t():
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    ts = gk.trajectory(sched, 4)
    kw = dict(steps=4, solver="gms", generator=2, progress=False, backend="torch", select="pixel")
    constant = gk.sample(oracle, (3, 3, 5, 7), skew_scale=0.3, **kw)
    torch.testing.assert_close(gk.sample(oracle, (3, 3, 5, 7), skew_scale={t: 0.3 for t in ts}, **kw), constant,
                               rtol=0, atol=0)
    assert torch.equal(gk.sample(oracle, (3, 3, 5, 7), skew_scale={t: 1.0 for t in ts}, **kw),
                       gk.sample(oracle, (3, 3, 5, 7), **kw))
    # only the first step shrunk: the first step's state differs from the plain run's, and from the constant run's
    seen = {}
    for name, table in (("first", {t: (0.3 if t == ts[0] else 1.0) for t in ts}), ("plain", None),
                        ("constant", 0.3)):
        rec = []
        gk.sample(oracle, (3, 3, 5, 7), callback=rec.append, **kw, **({} if table is None else {"skew_scale": table}))
        seen[name] = [r["x"] for r in rec]
    assert torch.equal(seen["first"][0], seen["constant"][0]) and not torch.equal(seen["first"][0], seen["plain"][0])
    assert not torch.equal(seen["first"][1], seen["constant"][1])
    with pytest.raises(ValueError, match=f"t={ts[1]}"):
        gk.sample(oracle, (3, 3, 5, 7), skew_scale={ts[0]: 0.5}, **kw)


def test_skew_scale_never_reaches_a_fused_kernel(fused_kernel_calls):
    """A GMS call with a skew_scale other than 1 runs every step on the float64 torch step on the cpp and triton
    backends (no kernel implements it), its Gaussian last step included; skew_scale = 1 (a number or a mapping of
    ones) still takes the kernel."""
    import gms_kernels.solvers as solvers
    from gms_kernels.core.random import SampleNoise

    calls = fused_kernel_calls
    sched = gk.Schedule.linear(20)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1, 2, 2, generator=g, dtype=torch.float64)
    e1 = 0.5 * torch.randn(x.shape, generator=g, dtype=torch.float64)
    heads = [e1, e1 * e1 + 0.1, e1**3 + 0.2 * e1]

    def run(backend, options, t=10, s=5):
        rand = solvers.StepRandomness(SampleNoise.create(3, 2), t, x)
        return solvers.solver_step("gms", x, heads, sched.coefficients(t, s), rand, (-1.0, 1.0), sched.T,
                                   options, backend)[0]

    for backend in ("cpp", "triton"):
        calls.clear()
        for opts in ({"skew_scale": 0.5}, {"skew_scale": {10: 0.5}}, {"skew_scale": 0.5, "fit": "adan"},
                     {"skew_scale": {10: 1.0, 3: 0.5}}):
            assert torch.equal(run(backend, opts), run("torch", opts))
        run(backend, {"skew_scale": {10: 0.5}}, t=3, s=0)  # the Gaussian last step: no fit, no factor needed
        assert calls == []
        run(backend, {"skew_scale": 1.0})
        run(backend, {"skew_scale": {10: 1.0, 3: 1.0}})
        assert calls == [backend] * 2


@pytest.mark.parametrize("solver,opts", [("sn-ddpm", {"variance_scale": 0.5}), ("ddpm", {"variance_interp": 0.5}),
                                         ("gms", {"variance_scale": 0.8, "select": "pixel"}),
                                         ("gms", {"skew_threshold": 0.2, "select": "pixel"}),
                                         ("gms", {"skew_scale": 0.5}), ("gms", {"skew_scale": 2.0, "fit": "adan"})])
def test_new_options_give_the_same_samples_on_every_cpu_backend(solver, opts):
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    x = [gk.sample(oracle, (5, 3, 5, 7), steps=4, solver=solver, generator=2, progress=False, backend=b, **opts)
         for b in ("torch", "auto")]
    torch.testing.assert_close(x[0], x[1], rtol=0, atol=0)
    assert not torch.equal(x[0], gk.sample(oracle, (5, 3, 5, 7), steps=4, solver=solver, generator=2,
                                            progress=False, **{k: v for k, v in opts.items() if k == "select"}))


@pytest.mark.parametrize("solver,opts,match", [
    ("sn-ddpm", {"variance_scale": 0.0}, "variance_scale"), ("sn-ddpm", {"variance_scale": -1}, "variance_scale"),
    ("gms", {"variance_scale": float("nan")}, "variance_scale"), ("ddpm", {"variance_interp": 1.5}, "variance_interp"),
    ("gms", {"skew_threshold": -0.1}, "skew_threshold"), ("ddim", {"variance_scale": 0.5}, "unknown option"),
    ("ddpm", {"skew_threshold": 0.5}, "unknown option"), ("gms", {"skew_scale": -0.1}, "skew_scale"),
    ("gms", {"skew_scale": float("nan")}, "skew_scale"), ("gms", {"skew_scale": "half"}, "skew_scale"),
    ("gms", {"skew_scale": True}, "skew_scale"), ("gms", {"skew_scale": 101.0}, "skew_scale"),
    ("gms", {"skew_scale": {}}, "skew_scale"), ("gms", {"skew_scale": {999: -1.0}}, r"skew_scale\[999\]"),
    ("gms", {"skew_scale": {1.5: 0.5}}, "skew_scale's keys"), ("sn-ddpm", {"skew_scale": 0.5}, "unknown option")])
def test_bad_control_options_are_refused_before_sampling(solver, opts, match):
    calls = []

    def model(x, t):
        calls.append(t)
        return torch.zeros(x.shape[0], 3 * x.shape[1], *x.shape[2:])
    with pytest.raises(ValueError, match=match):
        gk.sample(model, (2, 1, 4, 4), steps=3, solver=solver, generator=0, progress=False, **opts)
    assert calls == []


OFFICIAL = {"fit": "adan", "fit_iters": 70, "lr": 0.06, "adan_mean": "batch", "select": "sample",
            "gaussian_last_step": True, "denoise_final": True, "clip_pixel": 1.0}


def test_official_preset_is_the_official_codes_options_and_named_options_win():
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    run = lambda **o: gk.sample(oracle, (3, 3, 5, 7), steps=3, generator=4, progress=False, **o)  # noqa: E731
    torch.testing.assert_close(run(preset="official"), run(**OFFICIAL), rtol=0, atol=0)
    torch.testing.assert_close(run(preset="official", fit_iters=5), run(**dict(OFFICIAL, fit_iters=5)), rtol=0, atol=0)
    assert not torch.equal(run(preset="official"), run())
    with pytest.raises(ValueError, match="unknown preset 'paper'.*official"):
        run(preset="paper")
    with pytest.raises(ValueError, match="unknown option"):
        gk.sample(oracle, (3, 3, 5, 7), steps=3, solver="ddpm", generator=4, progress=False, preset="official")


def test_scheduler_takes_the_preset_and_leaves_unnamed_options_to_the_library():
    gms = gk.solvers.get_solver("gms")
    assert gk.GMSScheduler(preset="official")._options == gms.resolve({"preset": "official"})
    assert gk.GMSScheduler()._options == gms.resolve({})
    assert gk.GMSScheduler(fit="adan")._options == gms.resolve({"fit": "adan"})
    with pytest.raises(ValueError, match="preset"):
        gk.GMSScheduler(solver="ddpm", preset="official")
    with pytest.raises(ValueError, match="unknown preset"):
        gk.GMSScheduler(preset="nope")


def test_cli_preset_reaches_the_sampler_and_the_manifest(tmp_path):
    import json

    from gms_kernels.cli import main

    out = tmp_path / "o"
    assert main(["sample", "--preset", "official", "--fit-iters", "3", "--num-samples", "2", "--steps", "2",
                 "--out", str(out), "--quiet"]) == 0
    resolved = json.loads((out / "manifest.json").read_text())["solver_options"]
    assert resolved["fit"] == "adan" and resolved["select"] == "sample" and resolved["adan_mean"] == "batch"
    assert resolved["fit_iters"] == 3  # a named option overrides the preset
