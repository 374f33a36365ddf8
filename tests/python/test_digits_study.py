"""The digits reproductions' building blocks, on tiny settings (the full runs are python/digits_benchmark.py)."""
import math
import sys
from pathlib import Path

import pytest
import torch

from gms_kernels.core.data import digits
from gms_kernels.models.embedded import default_model
from gms_kernels.core.schedule import trajectory

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # the studies are not installed
from studies import digits_study as study  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return default_model()


def test_fd_vs_steps_measures_every_cell_once_and_resumes_from_the_cache(tmp_path, model):
    reference = digits("all")[0][:200]
    cache = study.ResultCache(tmp_path / "cache.json")
    labels = ["ddim", "gms-closed / pixel"]
    res = study.fd_vs_steps(model, reference, labels, [2, 3], n_samples=12, batch_size=5, cache=cache, log=None)
    assert set(res) == {(label, k) for label in labels for k in (2, 3)}
    assert all(math.isfinite(r["fd"]) and r["fd"] > 0 and r["seconds"] > 0 for r in res.values())
    again = study.ResultCache(tmp_path / "cache.json")  # a rerun reads the file instead of sampling
    again.get_or_compute = lambda key, compute: again.data[key]
    assert study.fd_vs_steps(model, reference, labels, [2, 3], n_samples=12, batch_size=5, cache=again,
                             log=None) == res


def test_batches_do_not_change_the_samples(model):
    """Seven samples drawn as one batch and in batches of 3, 3, 1: each sample's noise streams follow its
    index, so only the network's last bits differ between batch sizes (its convolutions sum in another
    order). Measured: 1.0e-5 apart at most (2 threads), 1.2e-5 (1 thread, AMD Zen 4), while a sample drawn
    with another seed's streams is 0.69 or more away (another index's: 0.90); the bound sits between the two."""
    a = study._sample(model, "gms-adan / sample", 2, 7, 3, 7)
    b = study._sample(model, "gms-adan / sample", 2, 7, 3, 3)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-3)
    # what the bound tells apart: streams of another index (a batch that restarted at index 0) are far away
    assert float((a[3:6] - a[0:3]).abs().flatten(1).max(1).values.min()) > 0.1


def test_step_costs_time_every_solver(model):
    costs = study.step_costs(model, ["ddpm", "gms-adan / pixel"], n=4, steps=1, rounds=2)
    assert set(costs) == {"ddpm", "gms-adan / pixel"} and all(0 < c < 60 for c in costs.values())


def test_equal_time_steps_matches_the_budget():
    ks = study.equal_time_steps({"gms": 1.2, "ddpm": 1.0, "ddim": 0.5}, "gms", 10)
    assert ks == {"gms": 10, "ddpm": 12, "ddim": 24}


def test_discrepancy_vs_steps_covers_every_step_and_shrinks_with_smaller_steps(model):
    data = digits("all")[0][:32]
    res = study.discrepancy_vs_steps(model, data, steps=(2, 50))
    assert all(len(res[k]["per_step"]) == len(res[k]["t"]) == len(trajectory(1000, k, "even")) for k in (2, 50))
    assert all(v >= 0 and math.isfinite(v) for r in res.values() for v in r["per_step"])
    assert res[50]["mean"] < res[2]["mean"]  # small steps: q(x_s|x_t) is close to Gaussian (paper Fig. 2)


def test_sdedit_grid_reports_faithfulness_and_realism(model):
    test = digits("test")[0][:6]
    guides = study.strokes(test)
    assert guides.shape == test.shape and guides.unique().numel() <= 4
    res, edits = study.sdedit_grid(model, guides, digits("all")[0][:100], labels=["ddim"], t0s=(0.2, 0.5),
                                   steps=(2,), log=None)
    assert set(res) == {("ddim", 0.2, 2), ("ddim", 0.5, 2)}
    # a later start strays further from the guide (L2 levels off from t0 ~ 0.5 on these digits:
    # 0.3 against 0.5 is within the noise of 6 images, 0.2 against 0.5 about 0.7-1.5 apart over seeds)
    assert res[("ddim", 0.2, 2)]["l2"] < res[("ddim", 0.5, 2)]["l2"]
    assert edits[("ddim", 0.2)].shape == (6, 1, 8, 8)
