"""Small versions of the oracle benchmark's acceptance checks, and the CLI's default job."""
import torch

import gms_kernels as gk
from gms_kernels import metrics
from gms_kernels.cli import main


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


def test_oracle_heads_in_two_dimensions_match_finite_differences():
    """E[eps|x_t] = -sigma_t * grad log q(x_t) (Tweedie): check against a numerical gradient."""
    from gms_kernels.experiments.oracle_study import eight_gaussians
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
