"""The command line's jobs: ``gms-kernels`` (= ``gms-kernels digits``) and ``gms-kernels oracle``, on tiny settings."""
import math

import torch

import gms_kernels as gk
from gms_kernels.cli import main
from gms_kernels.eval import digits_job, metrics, oracle_job
from gms_kernels.models.embedded import default_model


def _table_rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of a Markdown table's body rows (after the header whose first cell is ``first_cell``)."""
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(f"| {first_cell} |"))) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("| "):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_digits_job_reports_every_row_with_intervals_and_writes_the_grid(tmp_path, capsys):
    assert main(["digits", "--samples", "12", "--seeds", "2", "--steps", "2", "--out", str(tmp_path), "--quiet"]) == 0
    text = (tmp_path / "digits_K2.md").read_text()
    assert text.strip() in capsys.readouterr().out
    rows = _table_rows(text, "solver")
    assert [r[0] for r in rows] == [label for label, _, _ in digits_job.ROWS]
    for r in rows:
        mean, half = (float(v) for v in r[1].split(" ± "))
        assert math.isfinite(mean) and mean > 0 and half > 0
    assert rows[0][2] == "(this row)" and all(r[2].startswith(("+", "-")) and "[" in r[2] for r in rows[1:])
    assert "seeds 0..1" in text and "359 held-out test digits" in text
    assert (tmp_path / "digits_K2.png").stat().st_size > 1000


def test_digits_job_rows_are_the_samples_gk_sample_draws_and_seeds_are_independent_of_the_batch():
    """Each row samples what gk.sample with that row's options samples; the job's batches draw the same noise (the
    network's float32 rounding may differ with the batch size)."""
    model = default_model()
    x = digits_job.draw(model, "sn-ddpm", {}, 2, 5, seed=3)
    assert torch.equal(x, gk.sample(model, shape=(5, 1, 8, 8), steps=2, solver="sn-ddpm", generator=3,
                                    progress=False))
    old, digits_job.BATCH = digits_job.BATCH, 2
    try:
        torch.testing.assert_close(digits_job.draw(model, "sn-ddpm", {}, 2, 5, seed=3), x, rtol=0, atol=1e-4)
    finally:
        digits_job.BATCH = old


def test_no_command_runs_the_digits_job(tmp_path, monkeypatch):
    seen = {}

    def fake_job(out, **kwargs):
        seen.update(out=out, **kwargs)
        return "report"

    monkeypatch.setattr(digits_job, "run_digits_job", fake_job)
    monkeypatch.chdir(tmp_path)
    assert main([]) == 0
    assert seen == {"out": "gms_out", "steps": 10, "n_samples": 1000, "seeds": 5, "first_seed": 0, "log": print}
    assert (tmp_path / "gms_out" / "digits_K10.md").read_text() == "report\n"


def test_oracle_job_writes_tables_with_every_row_and_the_figure(tmp_path, capsys):
    assert main(["oracle", "--samples", "400", "--steps", "2", "5", "--datasets", "1d", "--out", str(tmp_path),
                 "--quiet"]) == 0
    text = (tmp_path / "oracle.md").read_text()
    assert text.strip() in capsys.readouterr().out
    rows = _table_rows(text, "solver")  # the first metric's table: W1
    assert [r[0] for r in rows] == [label for label, _, _ in oracle_job.SOLVER_ROWS]
    assert all(len(r) == 3 for r in rows)
    assert "(a) K=5: W1 ranks" in text and "| (a) | redraw | 0.1 | 0.0078 |" in text
    assert "Command: `gms-kernels oracle --samples 400" in text and "Machine: " in text
    assert (tmp_path / "oracle_fig1.png").stat().st_size > 10_000


def test_oracle_job_over_seeds_scores_each_seed_as_a_run_of_its_own():
    res = oracle_job.run_oracle_job(200, (5,), ("1d",), seeds=(0, 1), ggf_settings=(("brownian", 0.5, 0.0078),),
                                    log=None)
    row = res.results["1d"]["seeds-3"][5]
    assert len(row["per_seed"]["w1"]) == 2 and row["w1"] == sum(row["per_seed"]["w1"]) / 2
    oracle = oracle_job.paper_1d(gk.Schedule.linear(1000))  # seed 1 alone gives the same run
    x = gk.sample(oracle, shape=(200, 1), steps=5, solver="seeds-3", generator=1, progress=False, data_range=None,
                  dtype=torch.float64, backend="torch")
    assert oracle_job.score_samples(x, oracle_job.fresh_data(oracle, 200, 1))["w1"] == row["per_seed"]["w1"][1]
    text = oracle_job.report(res, "pytest")
    assert "| seeds-3 (data) | " in text and " ± " in text and "(best baseline)" in text
    assert "2 seeds (0, 1" in text and "200 samples per seed" in text


def test_seed_summary_intervals_and_significance_against_the_best_baseline():
    values = {"a": [1.0, 1.1, 0.9, 1.0, 1.05], "b": [2.0, 2.2, 1.9, 2.1, 2.0], "c": [1.0, 1.12, 0.91, 1.01, 1.04],
              "new": [0.5, 0.6, 0.45, 0.5, 0.55]}
    low = oracle_job.seed_summary(values, ("a", "b", "c"))
    assert low["new"]["best"] == "a" and low["a"]["diff"] is None
    assert low["new"]["interval"] == metrics.seed_interval(values["new"])
    diff, sig = metrics.paired_difference(values["new"], values["a"])
    assert low["new"]["diff"] == diff and sig and low["new"]["significant"]
    assert not low["c"]["significant"]  # c differs from a by noise only
    high = oracle_job.seed_summary(values, ("a", "b"), higher_is_better=True)
    assert high["new"]["best"] == "b" and high["new"]["diff"].mean < 0
    cell = oracle_job.interval_cell(low["new"])
    assert cell.startswith(f"{low['new']['mean']:.4f} ± ") and cell.endswith("*]")
    assert oracle_job.interval_cell(low["a"]).endswith("(best baseline)")
    single = oracle_job.seed_summary({"a": [1.0], "new": [0.5]}, ("a",))
    assert oracle_job.interval_cell(single["new"]) == "0.5000" and single["new"]["interval"] is None


def test_eight_gaussians_heads_match_finite_differences():
    """E[eps|x_t] = -sigma_t * grad log q(x_t) (Tweedie): check against a numerical gradient."""
    sched = gk.Schedule.linear()
    oracle = oracle_job.eight_gaussians(sched)
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
