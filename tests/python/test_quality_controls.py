"""The quality study's bookkeeping (row labels, summaries, testbeds, diagnostics, the skew shrinkage) and its
rank-one control. Every expected value is computed here from the formulas in float64, not by calling the function
under test."""
import math
import sys
from pathlib import Path

import pytest
import torch

import gms_kernels as gk
from conftest import image_oracle
from gms_kernels.core.moments import transition_moments

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # the studies are not installed
from studies import controls  # noqa: E402
from studies import quality_study as q  # noqa: E402

T_, S_ = 600, 400


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
    solver, opts = q.row_options("control-rank1")
    assert solver is controls.RANK_ONE_CONTROL and "control-rank1" not in gk.SOLVERS  # (the studies' own registry)
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
        ts = gk.trajectory(sched, K)
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
