"""The learned-heads toy study on a tiny configuration: training works, the cache round-trips, the
report has every table with finite numbers, and the figure is written."""
import math
import re
import sys
from pathlib import Path

import pytest
import torch

import gms_kernels as gk

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # the studies are not installed
from studies import toy_learned as toy  # noqa: E402

TINY = toy.ToyConfig(hidden=48, blocks=1, emb_dim=16, head_hidden=32, n_train=4000, backbone_steps=250,
                     heads_steps=150, batch_size=256, lr=3e-3, heads_lr=3e-3, ema_decay=0.99)


@pytest.fixture(scope="module")
def trained_1d(tmp_path_factory):
    cache = tmp_path_factory.mktemp("toy_cache")
    return toy.train_toy("1d", TINY, gk.Schedule.linear(1000), cache, progress=False, log=lambda *_: None), cache


def test_moment_net_shapes_dtype_and_frozen_backbone():
    sched = gk.Schedule.linear(1000)
    net = toy.add_heads(toy.build_backbone(2, TINY, sched), TINY)
    assert not any(p.requires_grad for p in net.backbone.parameters())
    assert all(p.requires_grad for p in net.heads.parameters())
    net.train()
    assert not net.backbone.training
    x = torch.randn(7, 2, dtype=torch.float64)
    out = net(x, torch.full((7,), 500))
    assert out.shape == (7, 6) and out.dtype == torch.float64
    # untrained heads start at N(0, 1) noise: e2 = 1, e3 = 0
    torch.testing.assert_close(out[:, 2:4], torch.ones(7, 2, dtype=torch.float64))
    torch.testing.assert_close(out[:, 4:], torch.zeros(7, 2, dtype=torch.float64))


def test_short_training_learns_heads_close_to_the_oracle(trained_1d):
    trained, _ = trained_1d
    oracle = toy.job.paper_1d(gk.Schedule.linear(1000))
    err = toy.heads_error(trained.net, oracle, times=(399, 999), n=2000)
    untrained = toy.heads_error(toy.add_heads(toy.build_backbone(1, TINY, oracle.schedule), TINY), oracle,
                                times=(399, 999), n=2000)
    for t in (399, 999):
        # the untrained net is off by about each head's std (~0.9, ~1.3, ~3.6 here)
        assert err[t]["rmse"][0] < 0.1 < 0.8 < untrained[t]["rmse"][0]
        assert err[t]["rmse"][1] < 0.3 * untrained[t]["rmse"][1]
        assert err[t]["rmse"][2] < 0.5 * untrained[t]["rmse"][2]
    assert trained.info["loss_e1"] < 0.5 and not trained.info["cached"]


def test_cache_round_trip_and_skip_training(trained_1d, tmp_path):
    trained, cache = trained_1d
    again = toy.train_toy("1d", TINY, gk.Schedule.linear(1000), cache, skip_training=True, progress=False,
                          log=lambda *_: None)
    assert again.info["cached"]
    x = torch.linspace(-1, 1, 11)[:, None]
    torch.testing.assert_close(again.net(x, torch.full((11,), 300)), trained.net(x, torch.full((11,), 300)))
    with pytest.raises(FileNotFoundError):
        toy.train_toy("1d", TINY, cache_dir=tmp_path, skip_training=True, progress=False, log=lambda *_: None)


def test_report_has_every_table_with_finite_numbers(trained_1d, tmp_path):
    trained, _ = trained_1d
    res = toy.ToyResult(TINY, n_samples=600, steps=(5, 10))
    res.training["1d"] = trained.info
    oracle = toy.job.paper_1d(trained.net.schedule)
    res.heads["1d"] = toy.heads_error(trained.net, oracle, times=(99, 999), n=500)
    toy.evaluate("1d", trained.net, res, progress=False)
    text = toy.report(res, "pytest")
    rows = {}
    for line in text.splitlines():
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 4 and cells[1] in ("learned", "oracle", "-"):
            rows.setdefault((cells[0], cells[1]), []).append([float(c) for c in cells[2:]])
    expected = {("exact sampler (ceiling)", "-")} | {(lab, h) for lab in toy.LABELS["1d"] for h in ("learned", "oracle")}
    assert set(rows) == expected
    for tables in rows.values():
        assert len(tables) == 2  # KDE and W1
        assert all(math.isfinite(v) for table in tables for v in table)
    assert "| K=5 | K=10 |" in text and "RMSE e3" in text and "## Reading" in text
    assert re.search(r"\| 999 \| [0-9.]+ \|", text)
    # same seed, same random numbers: the exact sampler is the ceiling with the oracle's W1 noise level
    exact_w1 = res.scores["1d"][("exact", "-")][10]["w1"]
    assert exact_w1 < res.scores["1d"][("ddpm", "learned")][10]["w1"]
    png = toy.plot_fig1(res, tmp_path / "fig.png")
    assert png.stat().st_size > 10_000


def test_seeds_give_intervals_paired_against_the_best_baseline(trained_1d):
    trained, _ = trained_1d
    res = toy.ToyResult(TINY, n_samples=300, steps=(5,), seeds=(0, 1, 2))
    toy.evaluate("1d", trained.net, res, progress=False)
    alone = toy.ToyResult(TINY, n_samples=300, steps=(5,))
    toy.evaluate("1d", trained.net, alone, seed=2, progress=False)
    row = res.scores["1d"][("gms-closed", "learned")][5]
    assert row["per_seed"]["kde"][2] == alone.scores["1d"][("gms-closed", "learned")][5]["kde"]
    assert row["kde"] == pytest.approx(sum(row["per_seed"]["kde"]) / 3)
    table = toy.score_table(res, "1d", "kde")
    assert table.count("(best baseline)") == 2  # one per heads kind (learned, oracle)
    assert re.search(r"\| gms-closed \| learned \| \**-?[0-9.]+ ± [0-9.]+ \[[+-][0-9.]+\*?\]", table)
