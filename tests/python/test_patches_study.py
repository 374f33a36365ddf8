"""The natural-image patches study on the shipped patches model: its held-out losses, its samples, and the study's
measuring and summaries (python/patches_benchmark.py in small)."""
import sys
from pathlib import Path

import pytest
import torch

from gms_kernels.core import data
from gms_kernels.models.embedded import PATCHES_MODEL, PATCHES_SHAPE, patches_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # the studies are not installed
from studies import patches_study as study  # noqa: E402


@pytest.fixture(scope="module")
def model():
    assert PATCHES_MODEL.stat().st_size < 5e6
    return patches_model()


def test_patches_model_predicts_noise_and_its_heads_agree(model):
    test = data.patches("test", per_photo=300)
    losses = study.eps_losses(model, test, seed=0)
    assert losses["mse_e1"] < 0.1 * losses["trivial_e1"]
    assert losses["mse_e2"] < 0.5 * losses["trivial_e2"]
    # heads consistent with e1: on noised test patches, the mean predicted variance E[e2 - e1^2] is
    # close to the Monte-Carlo one, the mean of (eps - e1)^2 (per element the e2 head is noisy and
    # often below e1^2, as on digits)
    for t, r in study.head_variance(model, test, ts=(100, 300)).items():
        assert 0.5 < r["mean_var"] / r["mc_var"] < 2.0, (t, r)
        assert r["negative"] < 0.6


def test_patches_model_samples(model):
    x = study.draw(model, "gms (defaults)", 3, 6, seed=0, batch_size=4)
    assert x.shape == (6, *PATCHES_SHAPE) and torch.isfinite(x).all()
    torch.testing.assert_close(x, study.draw(model, "gms (defaults)", 3, 6, seed=0, batch_size=6), rtol=1e-5, atol=1e-5)


def test_summarise_marks_the_best_baseline_and_significant_differences():
    labels, seeds = ["ddpm", "ddim", "gms (defaults)", "gms-closed / pixel"], range(5)
    base = {s: 1.0 + 0.1 * s for s in seeds}  # what the seeds share
    shift = {"ddpm": 0.5, "ddim": 0.0, "gms (defaults)": -0.2, "gms-closed / pixel": 0.0}
    noise = [0.01, -0.02, 0.015, -0.005, 0.0]
    results = {(lb, 5, s): {"swd": base[s] + shift[lb] + (noise[s] if lb == "gms-closed / pixel" else 0.0)}
               for lb in labels for s in seeds}
    out = study.summarise(results, "swd", labels, [5], seeds)
    assert out[("ddim", 5)]["best_baseline"] == "ddim" and not out[("ddim", 5)]["significant"]
    assert out[("gms (defaults)", 5)]["significant"] and out[("gms (defaults)", 5)]["diff"].mean == pytest.approx(-0.2)
    assert out[("ddpm", 5)]["significant"] and out[("ddpm", 5)]["diff"].mean == pytest.approx(0.5)
    assert not out[("gms-closed / pixel", 5)]["significant"]
    assert out[("ddpm", 5)]["interval"].n == 5


def test_measure_scores_every_reference_and_resumes_from_the_cache(tmp_path, model):
    refs = {"test": data.patches("test", per_photo=100), "train": data.patches("train", per_photo=30, seed=1000)}
    cache = study.ResultCache(tmp_path / "cells.json")
    res = study.measure(model, refs, ["ddim", "gms (defaults)"], [2], range(2), 16, cache, log=None)
    assert set(res) == {(lb, 2, s) for lb in ("ddim", "gms (defaults)") for s in range(2)}
    r = res[("ddim", 2, 0)]
    assert {"test/swd", "test/fd_dct", "train/swd", "train/fd_dct"} <= set(r) and r["options"]["eta"] == 0.0
    cache = study.ResultCache(tmp_path / "cells.json")
    again = study.measure(model, refs, ["ddim"], [2], range(2), 16, cache, log=None)
    assert again[("ddim", 2, 1)] == res[("ddim", 2, 1)]
    floors = study.data_rows(refs, range(2), 16)
    assert set(floors) == {(f"data: {sp} photos, other patches", s) for sp in ("test", "train") for s in range(2)}
