"""Issue 20: the variance controls (sn-ddpm variance_scale, ddpm variance_interp), GMS's variance_scale and
skew_threshold, central-moment heads, the digits splits and the quality study's bookkeeping. Every expected value
is computed here from the formulas in float64, not by calling the function under test."""
import math

import pytest
import torch

import gms_kernels as gk
from conftest import image_oracle, small_central_moment_net
from studies import quality_study as q
from gms_kernels.models.moment_net import raw_from_central
from gms_kernels.core.moments import central_third_moment, scale_spread, transition_moments
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # the studies are not installed

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
    mom = gk.moments.TransitionMoments(m1.reshape(1), var.reshape(1), (x**3).mean().reshape(1))
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
        free = (g > 2 * gk.fit.SKEW_KNEE) & (info["s2"] > 0.1 * mom.var * (1 + 1e-9))
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
    ts = gk.schedule.trajectory(sched, 4)
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


# -- central-moment heads ------------------------------------------------------------------------------------------
def test_raw_from_central_is_the_binomial_expansion():
    g = torch.Generator().manual_seed(0)
    r = torch.distributions.Gamma(2.0, 2.0).sample((400000,)).double()
    r = r - r.mean()  # a zero-mean, skewed residual
    e1 = torch.tensor([-0.7, 0.0, 1.3], dtype=torch.float64)
    c2, c3 = (r**2).mean().expand(3), (r**3).mean().expand(3)
    e2, e3 = raw_from_central(e1, [c2, c3])
    x = e1[:, None] + r[None, :]
    torch.testing.assert_close(e2, (x**2).mean(1), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(e3, (x**3).mean(1), rtol=1e-9, atol=1e-9)
    del g


def _tiny_backbone():
    return gk.models.PytorchDDPMUNet(T=1000, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1, dropout=0.0,
                                     in_channels=1)


def test_central_momentnet_returns_raw_moments_and_round_trips(tmp_path):
    net = small_central_moment_net()
    x, t = torch.randn(3, 1, 8, 8), torch.tensor([10, 500, 990])
    with torch.no_grad():
        out, heads = net(x, t), net(x, t, head_outputs=True)
    e1, c2, c3 = heads.chunk(3, dim=1)
    torch.testing.assert_close(out, torch.cat([e1, e1**2 + c2, e1**3 + 3 * e1 * c2 + c3], dim=1))
    net.save(tmp_path / "net.pt")
    again = gk.models.MomentNet.load(tmp_path / "net.pt")
    assert again.targets == "central"
    with torch.no_grad():
        torch.testing.assert_close(again(x, t), out)
    net.save_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match="targets"):
        gk.models.MomentNet(_tiny_backbone()).load_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match="targets"):
        gk.models.MomentNet(_tiny_backbone(), targets="centred")


def test_train_heads_fits_central_heads_to_the_residual():
    """With zero-initialised heads the first logged loss is the mean of the target squared: E[r^4] for the
    central e2 head (r = eps - e1 of the backbone) against E[eps^4] = 3 for the raw one; on a backbone whose e1
    is eps itself (an identity stand-in) r = 0 and the central loss must vanish."""
    torch.manual_seed(0)
    data = torch.rand(64, 1, 8, 8) * 2 - 1

    class Oracle(torch.nn.Module):  # e1 = the exact noise of x_t for this fixed data point
        eps_channels, feature_channels, temb_channels = 1, 4, 4

        def forward_features(self, x, t):
            sched = gk.Schedule.linear()
            ab = sched.alphas_cumprod[t].float().reshape(-1, 1, 1, 1)
            eps = (x - ab.sqrt() * data[:1]) / (1 - ab).sqrt()
            return torch.zeros(x.shape[0], 4, 8, 8), torch.zeros(x.shape[0], 4), eps

    losses = {}
    for targets in ("raw", "central"):
        net = gk.models.MomentNet(Oracle(), targets=targets)
        seen = []
        gk.train_heads(net, data[:1].expand(64, -1, -1, -1).clone(), steps=1, batch_size=16,
                                progress=False, log=seen.append)
        losses[targets] = seen[0]["mse_e2"]
    assert losses["raw"] == pytest.approx(3.0, rel=0.4)  # E[eps^4] = 3 (4096 draws: sd of the mean ~0.15)
    assert losses["central"] < 1e-8


# -- digits splits and the study's bookkeeping -----------------------------------------------------------------------
def test_digits_splits_are_disjoint_and_keep_the_old_test_split():
    x, _ = gk.data.digits("all")
    parts = {s: gk.data.digits(s)[0] for s in ("train", "validation", "test")}
    assert [p.shape[0] for p in parts.values()] == [1079, 359, 359]
    flat = {s: {tuple(r.tolist()) for r in p.flatten(1)} for s, p in parts.items()}
    assert not (flat["train"] & flat["test"]) or len(flat["train"] & flat["test"]) < 5  # (digits has duplicates)
    perm = torch.randperm(1797, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(parts["test"], x[perm[:359]])  # the split the FD classifier never saw
    torch.testing.assert_close(torch.cat([parts["validation"], parts["train"]]), x[perm[359:]])
    with pytest.raises(ValueError, match="split"):
        gk.data.digits("val")


def test_row_labels_read_into_options():
    assert q.row_options("sn-ddpm c=0.5") == ("sn-ddpm", {"variance_scale": 0.5})
    assert q.row_options("ddpm v=0.25") == ("ddpm", {"variance_interp": 0.25})
    assert q.row_options("gms adan/pixel iters=70 c=0.8") == (
        "gms", {"fit": "adan", "select": "pixel", "fit_iters": 70, "variance_scale": 0.8})
    assert q.row_options("gms closed/pixel glast=0") == (
        "gms", {"fit": "closed", "select": "pixel", "gaussian_last_step": False})
    assert q.row_options("gms") == ("gms", {})
    assert q.row_options("gms preset=official") == ("gms", {"preset": "official"})
    assert q.row_options("seeds-2 pred=data") == ("seeds-2", {"prediction": "data"})
    assert q.is_baseline("sn-ddpm c=0.5") and q.is_baseline("ddim") and not q.is_baseline("gms closed/pixel")
    with pytest.raises(ValueError, match="modifier"):
        q.row_options("sn-ddpm k=2")


def test_row_label_lr_takes_a_number_or_a_paper_table():
    assert q.row_options("gms adan/pixel lr=paper") == ("gms", {"fit": "adan", "select": "pixel", "lr": "paper"})
    assert q.row_options("gms adan/pixel iters=70 lr=paper-imagenet64") == (
        "gms", {"fit": "adan", "select": "pixel", "fit_iters": 70, "lr": "paper-imagenet64"})
    assert q.row_options("gms adan/sample lr=0.1") == ("gms", {"fit": "adan", "select": "sample", "lr": 0.1})
    with pytest.raises(ValueError, match="paper"):
        q.row_options("gms adan/pixel lr=papr")
    # the table reaches the fit: the first rows' samples differ from the constant-rate ones and match a
    # direct call with lr="paper"
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    x = q.draw(oracle, (3, 5, 7), "gms adan/pixel lr=paper", 3, 4, seed=1)
    direct = gk.sample(oracle, (4, 3, 5, 7), steps=3, solver="gms", fit="adan", select="pixel", lr="paper",
                       generator=1, progress=False)
    torch.testing.assert_close(x, direct, rtol=0, atol=0)
    assert not torch.equal(x, q.draw(oracle, (3, 5, 7), "gms adan/pixel", 3, 4, seed=1))


def test_summarise_names_the_best_baseline_and_significance():
    res = {}
    for s in range(5):
        res[("ddpm", 10, s)] = {"v/fd": 10.0 + s}
        res[("sn-ddpm c=0.5", 10, s)] = {"v/fd": 8.0 + s + 0.1 * (s % 2)}
        res[("gms closed/pixel", 10, s)] = {"v/fd": 6.0 + s}
        res[("gms adan/pixel", 10, s)] = {"v/fd": 8.0 + s + 0.1 * ((s + 1) % 2)}
    out = q.summarise(res, "v/fd", ["ddpm", "sn-ddpm c=0.5", "gms closed/pixel", "gms adan/pixel"], [10], range(5))
    assert out[("gms closed/pixel", 10)]["best_baseline"] == "sn-ddpm c=0.5"
    assert out[("gms closed/pixel", 10)]["significant"] and out[("gms closed/pixel", 10)]["diff"].mean < 0
    assert not out[("gms adan/pixel", 10)]["significant"]
    assert "diff" not in out[("sn-ddpm c=0.5", 10)]


# -- presets ---------------------------------------------------------------------------------------------------------
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
    sched = gk.GMSScheduler(preset="official")
    assert sched._options == {"preset": "official"}
    assert gk.GMSScheduler()._options == {}
    assert gk.GMSScheduler(fit="adan")._options == {"fit": "adan"}
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


def test_head_diagnostics_of_exact_heads_match_monte_carlo():
    """With exact heads (the Gaussian-mixture oracle) e1 is E[eps|x_t], so the Monte-Carlo mean of (eps - e1)^2
    estimates the heads' mean Var[eps|x_t] and the mean of (eps - e1)^3 their mean kappa3."""
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    data = oracle.sample_data(3000, generator=torch.Generator().manual_seed(0))
    out = q.head_diagnostics(oracle, data, [100, 500], seed=1, schedule=sched)
    for t, r in out.items():
        assert r["var_mc"] == pytest.approx(r["var_head"], rel=0.05), t
        assert abs(r["kappa3_mc"] - r["kappa3_head"]) < 0.1 * r["var_head"] ** 1.5 + 1e-4, t
        assert r["negative"] == 0.0  # exact moments: e2 - e1^2 is a variance


def test_fit_diagnostics_report_the_fitted_mixtures():
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    rows = q.fit_diagnostics(oracle, (3, 5, 7), "gms closed/pixel tau=0.05", steps=4, n=16, schedule=sched)
    assert [r["t"] for r in rows] == gk.trajectory(sched, 4)[:len(rows)]
    for r in rows:
        assert 0.1 - 1e-9 <= r["s2_var"] <= 1.0 + 1e-9 and 0.0 <= r["at_floor"] <= 1.0 and 0.0 <= r["gaussian"] <= 1.0
        # the closed fit matches Var per element, w1 w2 gap^2 + s2 = Var, so (Jensen) mean s2 / Var <= 1 - (2/9) mean(gap / sd)^2
        assert r["s2_var"] + (2 / 9) * r["gap_sd"] ** 2 <= 1.0 + 1e-9
    with pytest.raises(ValueError, match="GMS row"):
        q.fit_diagnostics(oracle, (3, 5, 7), "sn-ddpm", steps=4, n=4, schedule=sched)


def test_digits_oracle_testbed_has_exact_heads_for_the_blurred_train_digits():
    bed = q.testbed("digits-oracle")
    assert bed.tag == q.testbed("digits-oracle").tag and bed.tag.startswith(f"blur{q.ORACLE_BLUR}-")
    train = bed.references()["train"]
    assert train.shape == gk.data.digits("train")[0].shape
    oracle = bed.model()
    assert oracle.shared_variance == pytest.approx(q.ORACLE_BLUR**2, rel=1e-15)
    # near t = 0 the posterior sits on the digit that made x_t: x_t = a (x0 + blur) + sigma eps, and the exact
    # E[eps | x_t] is the shrinkage of (x_t - a x0) / sigma by sigma^2 / (a^2 blur^2 + sigma^2)
    sched, t = gk.Schedule.linear(), 5
    a, sig = sched.alpha(t), sched.sigma(t)
    g = torch.Generator().manual_seed(0)
    x0 = train[:6].double()
    x_t = a * (x0 + q.ORACLE_BLUR * torch.randn(x0.shape, generator=g, dtype=torch.float64)) \
        + sig * torch.randn(x0.shape, generator=g, dtype=torch.float64)
    expected = (x_t - a * x0) / sig * (sig**2 / (a * a * q.ORACLE_BLUR**2 + sig**2))
    torch.testing.assert_close(oracle(x_t, t)[:, :1], expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="exact heads, not a model file"):
        q.testbed("digits-oracle", "some.pt")
    patches = q.testbed("patches-oracle")
    assert patches.references()["train"].shape == (q.ORACLE_PATCHES, 1, 8, 8) and patches.primary == "fd_dct"
    assert set(patches.metrics) == {"fd_dct", "swd"} and patches.tag != bed.tag


def test_rank_one_control_has_the_mean_and_covariance_of_the_per_image_mixture_draw():
    """control-rank1 draws M1 + sqrt(w1 w2) delta xi + s z: over many images of one x_t its mean is M1, its
    covariance diag(s2) + w1 w2 delta delta^T, which is also what GMS's per-image draw gives."""
    sched = gk.Schedule.linear()
    g = torch.Generator().manual_seed(5)
    means = torch.rand(3, 1, 2, 2, generator=g, dtype=torch.float64) * 2 - 1
    oracle = gk.GaussianMixtureOracle([0.2, 0.3, 0.5], means, [0.1, 0.2, 0.05], sched)
    x_one = torch.randn(1, *oracle.data_shape, generator=g, dtype=torch.float64)
    n = 40000
    x_t = x_one.expand(n, -1, -1, -1).contiguous()
    heads = oracle(x_one, T_).expand(n, -1, -1, -1).contiguous()
    solver, opts = q.row_options(q.RANK_ONE_CONTROL)
    for unsupported in ({"skew_threshold": 0.1}, {"skew_scale": 0.5}):  # (refused, not silently ignored)
        with pytest.raises(ValueError, match="unknown option"):
            gk.step(x_one, oracle(x_one, T_), T_, S_, sched, solver, generator=0, backend="torch", **unsupported)
    x, info = gk.step(x_t, heads, T_, S_, sched, solver, generator=0, backend="torch", return_info=True, **opts)
    x_gms = gk.step(x_t, heads, T_, S_, sched, "gms", generator=0, backend="torch", select="sample")
    m1, delta, s2 = info["m1"][0].flatten(), (info["mu1"] - info["mu2"])[0].flatten(), info["s2"][0].flatten()
    assert delta.abs().max() > 0.05  # (a skewed step: the rank-one part matters)
    cov = torch.diag(s2) + (2 / 9) * torch.outer(delta, delta)
    for draws in (x.flatten(1), x_gms.flatten(1)):
        mean = draws.mean(0)
        emp = torch.cov(draws.T)
        se = cov.diagonal().sqrt()
        assert ((mean - m1).abs() <= 5 * se / math.sqrt(n)).all()
        # entries of a sample covariance have standard error about sqrt((S_ii S_jj + S_ij^2) / n)
        tol = 5 * ((torch.outer(cov.diagonal(), cov.diagonal()) + cov**2) / n).sqrt()
        assert ((emp - cov).abs() <= tol).all()


def test_skew_shrinkage_regresses_the_exact_kappa3_on_the_heads_per_step(tmp_path, monkeypatch):
    """skew_shrinkage: every GMS step of each K's trajectory, lambda = E[k3_exact k3_head] / E[k3_head^2] over
    the elements of x_t = a x0 + sigma eps (one eps per image from the seed); exact heads give lambda = 1."""
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    data = oracle.sample_data(40, torch.Generator().manual_seed(0)).clamp(-1, 1)

    def noisy(x, t):  # the exact heads with a deterministic error in e3
        out = oracle(x.double(), t)
        C = x.shape[1]
        return torch.cat([out[:, :2 * C], out[:, 2 * C:] + 0.3 * torch.sin(7 * x.double())], dim=1).to(x.dtype)

    rows = q.skew_shrinkage(noisy, oracle, data, steps=(3, 5), seed=4, batch=16)
    assert set(rows) == {3, 5}
    for K, rs in rows.items():
        ts = gk.schedule.trajectory(sched, K)
        assert [(r["t"], r["s"]) for r in rs] == list(zip(ts[:-1], ts[1:]))  # (no row for the denoising step)
    r = rows[5][1]
    eps = torch.randn(data.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    abar = float(sched.alphas_cumprod[r["t"]])
    x_t = abar**0.5 * data + (1 - abar) ** 0.5 * eps
    k = sched.coefficients(r["t"], r["s"])

    def kappa3(heads):
        m = transition_moments(x_t, *heads.chunk(3, dim=1), k, (-1.0, 1.0))
        return m.m3 - 3 * m.m1 * m.var.clamp_min(0) - m.m1**3
    k3_h, k3_e = kappa3(noisy(x_t.float(), r["t"]).double()), kappa3(oracle(x_t, r["t"]))
    assert r["lam"] == pytest.approx(float((k3_e * k3_h).mean() / (k3_h**2).mean()), rel=1e-9)
    assert r["rms_exact"] == pytest.approx(float((k3_e**2).mean().sqrt()), rel=1e-9)
    assert abs(r["lam"] - 1) > 0.05 and abs(r["lam_var"] - 1) < 1e-4  # (the error is in e3 only)
    # heads that are exact in float64 give lambda = 1 (rounded to float32 they do not at t = 999, where kappa3 is
    # ~5e-5 and the cancellation in e3 - 3 e1 e2 + 2 e1^3 leaves mostly rounding)
    exact = q.skew_shrinkage(lambda x, t: oracle(x.double(), t), oracle, data, steps=(3,), seed=4)
    assert all(abs(r["lam"] - 1) < 1e-6 and abs(r["lam_var"] - 1) < 1e-6 for r in exact[3])
    # a row 'skew=lam' samples with the table's factors for its K
    tables = {"lam": {3: {r["t"]: 0.25 * (i + 1) for i, r in enumerate(exact[3])}}}
    x = q.draw(oracle, (3, 5, 7), "gms closed/pixel skew=lam", 3, 4, seed=1, skew_tables=tables)
    direct = gk.sample(oracle, (4, 3, 5, 7), steps=3, solver="gms", fit="closed", select="pixel", generator=1,
                       progress=False, skew_scale=tables["lam"][3])
    torch.testing.assert_close(x, direct, rtol=0, atol=0)
    with pytest.raises(ValueError, match="skew table"):
        q.draw(oracle, (3, 5, 7), "gms closed/pixel skew=lam", 5, 4, seed=1, skew_tables=tables)
    with pytest.raises(ValueError, match="neither a number"):
        q.row_options("gms closed/pixel skew=wiener")
    assert q.row_options("gms closed/sample skew=0.5") == ("gms", {"fit": "closed", "select": "sample",
                                                                     "skew_scale": 0.5})
    assert q.row_options("gms closed/pixel skew=lamval")[1]["skew_scale"] == "lamval"
    # the tables' file: {name: {K: {t: factor}}} with integer keys after a JSON round trip
    import json
    bed = q.Testbed("toy", lambda: oracle, "abc123", (3, 5, 7), dict, {}, "fd")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="shrinkage"):
        q.load_skew_tables(bed)
    q.skew_table_path(bed).parent.mkdir(parents=True)
    q.skew_table_path(bed).write_text(json.dumps({"tables": tables}))
    assert q.load_skew_tables(bed) == tables


def test_aliased_baselines_are_baselines_but_not_the_main_models():
    """paired's --versus pool takes a baseline of other weights (``s1: sn-ddpm``) like any other (it used to drop
    it silently); a report's bold best baseline stays the report's own model's."""
    for label in ("s1: sn-ddpm", "central: ddpm v=0.5", "raw: ddim"):
        assert q.is_baseline(label) and not q.is_main_baseline(label), label
    assert q.is_main_baseline("sn-ddpm c=1.25") and q.is_main_baseline("ddim")
    for label in ("s1: gms closed/sample", "gms closed/pixel", "control-rank1"):
        assert not q.is_baseline(label) and not q.is_main_baseline(label), label
    res = {(lb, 10, s): {"v/fd": v + s} for lb, v in (("ddpm", 5.0), ("s1: ddim", 1.0), ("gms closed/pixel", 3.0))
           for s in range(3)}
    out = q.summarise(res, "v/fd", ["ddpm", "s1: ddim", "gms closed/pixel"], [10], range(3),
                      baseline=q.is_main_baseline)
    assert out[("gms closed/pixel", 10)]["best_baseline"] == "ddpm"
    assert q.summarise(res, "v/fd", ["ddpm", "s1: ddim", "gms closed/pixel"], [10],
                       range(3))[("gms closed/pixel", 10)]["best_baseline"] == "s1: ddim"


def test_variance_scaled_rows_are_the_baselines_with_a_scale_or_interpolation():
    """The rows the acceptance's 'best variance-scaled Gaussian' is chosen from (report and paired)."""
    for label in ("sn-ddpm c=1.25", "ddpm v=0.5", "central: sn-ddpm c=0.75"):
        assert q.is_variance_scaled(label), label
    for label in ("sn-ddpm", "ddpm", "gms closed/sample c=1.25", "central: gms closed/pixel c=0.8", "ddim"):
        assert not q.is_variance_scaled(label), label
