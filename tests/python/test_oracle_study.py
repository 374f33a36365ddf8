"""Small versions of the oracle benchmark's acceptance checks, and the CLI's default job."""
import torch

import gms_kernels as gk
from gms_kernels.eval import metrics
from gms_kernels.cli import main
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # the studies are not installed


def test_exact_sampler_and_solver_ranking_on_the_paper_mixture(paper_oracle):
    n = 8000
    fresh = paper_oracle.sample_data(n, torch.Generator().manual_seed(123))
    w1 = {}
    for label, solver, opts in [("exact", "exact", {}), ("ddpm", "ddpm", {}), ("sn-ddpm", "sn-ddpm", {}),
                                ("gms-closed", "gms", {"gaussian_last_step": False})]:
        x = gk.sample(paper_oracle, shape=(n, 1), steps=10, solver=solver, generator=0, progress=False,
                      data_range=None, dtype=torch.float64, **opts)
        w1[label] = metrics.wasserstein1(x, fresh)
    assert w1["exact"] < 0.015
    assert w1["gms-closed"] < w1["sn-ddpm"] < w1["ddpm"]


def test_shared_variance_route_equals_the_per_component_posterior():
    """A mixture whose components share one variance (an empirical data set with a blur) takes matrix products
    instead of [N, K, *shape] tensors: heads and exact steps must equal the general route's."""
    g = torch.Generator().manual_seed(0)
    means = torch.rand(7, 1, 3, 2, generator=g, dtype=torch.float64) * 2 - 1
    shared = gk.GaussianMixtureOracle(torch.rand(7, generator=g) + 0.1, means, torch.full((7,), 0.07, dtype=torch.float64))
    general = gk.GaussianMixtureOracle(shared.log_weights.exp(), means, torch.full((7,), 0.07, dtype=torch.float64))
    assert shared.shared_variance == 0.07**2
    general.shared_variance = None  # the per-component route, as for unequal variances
    x = torch.randn(5, 1, 3, 2, generator=g, dtype=torch.float64)
    for t in (0, 3, 100, 600, 999):
        torch.testing.assert_close(shared(x, t), general(x, t), rtol=1e-9, atol=1e-11)
    u, z = torch.rand(5, generator=g, dtype=torch.float64), torch.randn(5, 1, 3, 2, generator=g, dtype=torch.float64)
    for t, s in ((999, 899), (300, 200), (40, -1)):
        k = shared.schedule.coefficients(t, s)
        torch.testing.assert_close(shared.exact_step(x, k, u, z), general.exact_step(x, k, u, z), rtol=1e-10, atol=1e-12)
    # a per-sample time index takes the general route
    t = torch.tensor([5, 50, 500, 900, 999])
    torch.testing.assert_close(shared(x, t), general(x, t))
    assert not gk.GaussianMixtureOracle([1.0, 1.0], [[0.0], [1.0]], [0.1, 0.2]).shared_variance


def test_oracle_heads_in_two_dimensions_match_finite_differences():
    """E[eps|x_t] = -sigma_t * grad log q(x_t) (Tweedie): check against a numerical gradient."""
    from studies.oracle_study import eight_gaussians
    sched = gk.Schedule.linear()
    oracle = eight_gaussians(sched)
    t = 300
    a, s = sched.alpha(t), sched.sigma(t)
    x = torch.tensor([[0.3, -0.2]], dtype=torch.float64)

    def log_q(x):  # q(x_t) is a mixture of N(a m_k, a^2 s_k^2 + sigma^2)
        var = a * a * oracle.variances + s * s
        ll = -0.5 * (torch.log(2 * torch.pi * var) + (x[:, None] - a * oracle.means) ** 2 / var).sum(-1)
        return torch.logsumexp(oracle.log_weights + ll, 1)

    h = 1e-6
    grad = torch.stack([(log_q(x + h * e) - log_q(x - h * e)) / (2 * h) for e in torch.eye(2, dtype=torch.float64)], -1)
    torch.testing.assert_close(oracle(x, t)[:, :2], -s * grad, rtol=1e-6, atol=1e-8)


def test_cli_default_job_writes_table_and_figure(tmp_path, capsys):
    assert main(["oracle", "--samples", "400", "--steps", "2", "5", "--datasets", "1d", "--out", str(tmp_path),
                 "--quiet"]) == 0
    text = (tmp_path / "oracle.md").read_text()
    assert "| gms-closed |" in text and "## What it shows" in text and "K=5" in text
    assert (tmp_path / "oracle_fig1.png").stat().st_size > 10_000
    assert "W1 ranks" in capsys.readouterr().out


def test_seed_summary_intervals_and_significance_against_the_best_baseline():
    from studies.oracle_study import interval_cell, seed_summary
    values = {"a": [1.0, 1.1, 0.9, 1.0, 1.05], "b": [2.0, 2.2, 1.9, 2.1, 2.0], "c": [1.0, 1.12, 0.91, 1.01, 1.04],
              "new": [0.5, 0.6, 0.45, 0.5, 0.55]}
    low = seed_summary(values, ("a", "b", "c"))
    assert low["new"]["best"] == "a" and low["a"]["diff"] is None
    assert low["new"]["interval"] == metrics.seed_interval(values["new"])
    diff, sig = metrics.paired_difference(values["new"], values["a"])
    assert low["new"]["diff"] == diff and sig and low["new"]["significant"]
    assert not low["c"]["significant"]  # c differs from a by noise only
    high = seed_summary(values, ("a", "b"), higher_is_better=True)
    assert high["new"]["best"] == "b" and high["new"]["diff"].mean < 0
    cell = interval_cell(low["new"])
    assert cell.startswith(f"{low['new']['mean']:.4f} ± ") and cell.endswith("*]")
    assert interval_cell(low["a"]).endswith("(best baseline)")
    single = seed_summary({"a": [1.0], "new": [0.5]}, ("a",))
    assert interval_cell(single["new"]) == "0.5000" and single["new"]["interval"] is None


def test_study_over_seeds_reports_intervals_convergence_and_ggf():
    from studies import oracle_study as study
    res = study.run_study(200, (5,), ("1d",), seeds=(0, 1), progress=False,
                          ggf_grid=(("brownian", 0.5, 0.0078), ("redraw", 0.5, 0.0078)))
    row = res.results["1d"]["seeds-3"][5]
    assert len(row["per_seed"]["w1"]) == 2 and row["w1"] == sum(row["per_seed"]["w1"]) / 2
    oracle = study.paper_1d(gk.Schedule.linear(1000))  # seed 1 alone gives the same run
    x = gk.sample(oracle, shape=(200, 1), steps=5, solver="seeds-3", generator=1, progress=False, data_range=None,
                  dtype=torch.float64, backend="torch")
    assert study.score_samples(x, study.fresh_data(oracle, 200, 1))["w1"] == row["per_seed"]["w1"][1]
    text = study.report(res, "pytest")
    assert "| seeds-3 (data) | " in text and " ± " in text and "(best baseline)" in text
    assert "## Convergence to the exact sampler (issue 23)" in text and "| (a) | redraw | 0.5 | 0.0078 |" in text
    assert "2 seeds (0, 1" in text and "200 samples per seed" in text


def test_the_oracles_own_defaults_are_chosen_on_validation_seeds_and_tested_on_the_test_seeds():
    """python/oracle_defaults.py in small: the choice samples the validation seeds only, against fresh data of
    the first of them; the test's chosen-default row is the oracle sampled with its solver_defaults in force, and
    its table pairs every other row against it."""
    from studies import oracle_study as study
    from gms_kernels.solvers import get_solver
    GMS_CANDIDATES = get_solver("gms").candidates

    n, steps = 64, (2,)
    oracle, choice = study.choose_oracle_defaults("8gauss", n, steps)
    assert set(choice.candidates) == set(GMS_CANDIDATES) and choice.best in GMS_CANDIDATES
    reference = study.fresh_data(oracle, n, study.VALIDATION_SEEDS[0])
    name = "closed, per pixel, GMS on the last step"
    want = [metrics.sliced_wasserstein1(gk.sample(oracle, shape=(n, 2), steps=2, generator=seed, progress=False,
                                                  data_range=None, dtype=torch.float64, backend="torch",
                                                  **GMS_CANDIDATES[name]), reference)
            for seed in study.VALIDATION_SEEDS]
    assert choice.values[(name, 2)] == want
    oracle.solver_defaults = {"gms": choice.options}
    values = study.measure_oracle_defaults(oracle, n, steps, seeds=(0, 1))
    fresh = study.fresh_data(oracle, n, 1)
    chosen = gk.sample(oracle, shape=(n, 2), steps=2, generator=1, progress=False, data_range=None,
                       dtype=torch.float64, backend="torch", **choice.options)
    assert values[("gms (the oracle's chosen default)", 2)][1] == metrics.sliced_wasserstein1(chosen, fresh)
    table = study.defaults_test_table(values, steps).splitlines()
    assert len(table) == 2 + len(study.DEFAULTS_TEST_ROWS) and "[" not in table[2] and all("[" in r for r in table[3:])
