"""Small versions of the oracle study's checks (python/oracle_benchmark.py, python/oracle_defaults.py)."""
import sys
from pathlib import Path

import torch

import gms_kernels as gk
from gms_kernels.eval import metrics
from gms_kernels.eval import oracle_job as job

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # the studies are not installed
from studies import oracle_study as study  # noqa: E402
from studies.candidates import SHIPPED_MODEL_CANDIDATES  # noqa: E402


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


def test_study_report_adds_its_statements_convergence_and_the_full_ggf_grid():
    res = job.run_oracle_job(200, (5, 10), ("1d",), seeds=(0, 1), ggf_settings=study.GGF_GRID[:1] + study.GGF_GRID[3:4],
                             log=None)
    text = study.report(res, "pytest")
    assert "## What it shows" in text and "## Convergence to the exact sampler" in text
    assert "(a) seeds-3 (data): W1 over K = 5, 10: " in text and "(a) K=10: gms-closed " in text
    assert "| (a) | redraw | 0.1 | 0.0078 |" in text and "| (a) | brownian | 0.1 | 0.0078 |" in text
    assert job.markdown_tables(res) in text and "2 seeds (0, 1" in text


def test_the_oracles_own_defaults_are_chosen_on_validation_seeds_and_tested_on_the_test_seeds():
    """python/oracle_defaults.py in small: the choice samples the validation seeds only, against fresh data of
    the first of them; the test's chosen-default row is the oracle sampled with its solver_defaults in force, and
    its table pairs every other row against it."""
    n, steps = 64, (2,)
    oracle, choice = study.choose_oracle_defaults("8gauss", n, steps)
    assert set(choice.candidates) == set(SHIPPED_MODEL_CANDIDATES) and choice.best in SHIPPED_MODEL_CANDIDATES
    reference = job.fresh_data(oracle, n, study.VALIDATION_SEEDS[0])
    name = "closed, per pixel, GMS on the last step"
    want = [metrics.sliced_wasserstein1(gk.sample(oracle, shape=(n, 2), steps=2, generator=seed, progress=False,
                                                  data_range=None, dtype=torch.float64, backend="torch",
                                                  **SHIPPED_MODEL_CANDIDATES[name]), reference)
            for seed in study.VALIDATION_SEEDS]
    assert choice.values[(name, 2)] == want
    oracle.solver_defaults = {"gms": choice.options}
    values = study.measure_oracle_defaults(oracle, n, steps, seeds=(0, 1))
    fresh = job.fresh_data(oracle, n, 1)
    chosen = gk.sample(oracle, shape=(n, 2), steps=2, generator=1, progress=False, data_range=None,
                       dtype=torch.float64, backend="torch", **choice.options)
    assert values[("gms (the oracle's chosen default)", 2)][1] == metrics.sliced_wasserstein1(chosen, fresh)
    table = study.defaults_test_table(values, steps).splitlines()
    assert len(table) == 2 + len(study.DEFAULTS_TEST_ROWS) and "[" not in table[2] and all("[" in r for r in table[3:])
