"""The equal-tuning protocol's bookkeeping (choices on validation seeds only, paired differences on test seeds),
the disjointness of the patches reference positions, the smooth density's fast exact heads and the marginal
metrics. Expected values are computed here from their definitions."""
import sys
from pathlib import Path

import pytest
import torch

import gms_kernels as gk

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # the studies are not installed
from studies import protocol as P  # noqa: E402
from studies.smooth_density import DiagonalMixtureHeads  # noqa: E402

PROTOCOL = P.Protocol(default="gms closed/pixel c=1", validation_seeds=(100, 101), n_samples=10, primary="fd",
                      steps=(5, 10))


def fake_results(validation: dict[str, float], test: dict[str, list[float]]) -> P.Results:
    """Cells of every label at K = 5 and 10: ``validation[label]`` (default 50) on validation seeds (seed 101 a
    little higher than 100), ``test[label]`` (default 40 + seed) on the test seeds; the test cells' scores against
    the validation reference are adversarial (they would reverse any choice made from them)."""
    out = {}
    labels = PROTOCOL.validation_labels()
    for k in PROTOCOL.steps:
        for i, label in enumerate(labels):
            v = validation.get(label, 50.0)
            for j, s in enumerate(PROTOCOL.validation_seeds):
                out[(label, k, s)] = {"validation/fd": v + j, "test/fd": -1.0}
            for j, s in enumerate(PROTOCOL.test_seeds):
                t = test.get(label, [40.0 + s for s in PROTOCOL.test_seeds])[j]
                out[(label, k, s)] = {"validation/fd": -100.0 * (v - 50.0) - i, "test/fd": t}
    return out


def test_choices_use_the_validation_seeds_only():
    validation = {"sn-ddpm c=1.5": 40.0, "gms closed/pixel c=2": 45.0, "ddpm": 42.0, "ddim": 30.0,
                  "control-rank1 c=1.25": 44.0}
    choices = P.choose(fake_results(validation, {}), PROTOCOL)
    for k in PROTOCOL.steps:
        c = choices[k]
        assert c.c == {"sn-ddpm": 1.5, "gms closed/pixel": 2.0, "gms closed/sample": 1.0, "control-rank1": 1.25}
        assert c.gaussian == "sn-ddpm c=1.5" and c.baseline == "ddim"
        assert c.validation_means["sn-ddpm c=1.5"] == pytest.approx(40.5)
    # the choice reads no test-seed cell: it is the same with every test cell removed
    only_validation = {key: v for key, v in fake_results(validation, {}).items() if key[2] in (100, 101)}
    assert P.choose(only_validation, PROTOCOL) == choices
    # ties go to the first c of the grid; ddpm wins the Gaussian choice when its validation mean is lower
    tied = P.choose(fake_results({"ddpm": 10.0}, {}), PROTOCOL)[5]
    assert tied.c["sn-ddpm"] == 1.0 and tied.gaussian == "ddpm" and tied.baseline == "ddpm"


def test_the_test_summary_pairs_every_row_with_the_best_validated_gaussian_and_the_default():
    test = {"sn-ddpm c=1.5": [10.0, 12.0, 11.0, 13.0, 12.0], "gms closed/pixel c=1": [9.0, 12.5, 10.0, 12.0, 13.0],
            "ddim": [20.0, 21.0, 25.0, 22.0, 20.0]}
    results = fake_results({"sn-ddpm c=1.5": 40.0}, test)
    choices = P.choose(results, PROTOCOL)
    summary = P.test_summary(results, PROTOCOL, choices, "fd")
    row = summary[("ddim", 10)]
    diffs = torch.tensor(test["ddim"]) - torch.tensor(test["sn-ddpm c=1.5"])
    half = 2.776445105 * float(diffs.std()) / 5**0.5  # t_{0.975, 4}
    assert row.minus_gaussian[0].mean == pytest.approx(float(diffs.mean()))
    assert row.minus_gaussian[0].high - row.minus_gaussian[0].mean == pytest.approx(half, rel=1e-6)
    assert row.minus_gaussian[1]  # 10.4 +- 2.6: significant
    default_minus = torch.tensor(test["gms closed/pixel c=1"]) - torch.tensor(test["ddim"])
    assert row.default_minus[0].mean == pytest.approx(float(default_minus.mean()))
    assert summary[("sn-ddpm", 5)].minus_gaussian is None  # the best validated Gaussian itself
    assert summary[(P.DEFAULT, 5)].default_minus is None and summary[(P.DEFAULT, 5)].label == "gms closed/pixel c=1"
    # the default's family chose c = 1: the two rows are the same cell, sampled once
    assert summary[("gms closed/pixel", 5)].label == PROTOCOL.default
    assert summary[("gms closed/pixel", 5)].default_minus is None
    assert P.verdict(summary[(P.DEFAULT, 5)].minus_gaussian) == "ties"
    assert P.verdict(row.minus_gaussian) == "worse"


def test_a_protocol_refuses_overlapping_seeds_and_a_default_off_the_grid():
    with pytest.raises(ValueError, match="overlap"):
        P.Protocol("gms closed/pixel c=1", (4, 100), 10, "fd")
    with pytest.raises(ValueError, match="no cell of the grid"):
        P.Protocol("gms adan/pixel c=1", (100, 101), 10, "fd")


def test_the_default_label_is_the_models_own_gms_options():
    assert P.default_label(gk.models.embedded.default_model()) == "gms closed/pixel c=1"
    assert P.default_label(gk.models.embedded.patches_model()) == "gms closed/pixel c=1.25"
    assert P.default_label(torch.nn.Identity()) == "gms closed/pixel c=1"  # the library's defaults


def test_patches_reference_positions_are_held_out_and_disjoint():
    from gms_kernels.core.data import patch_photos, patches

    names = patch_photos("train")
    # the reconstructed training positions are those gk.data.patches("train") cut
    train = torch.cat([P.cut_patches(n, P.train_positions(n)) for n in names])
    assert torch.equal(train, patches("train"))
    for name in names:
        h, w = gk.data.photo_grey(name).shape
        cols = w - P.PATCH + 1
        sets = {"train": P.train_positions(name), **P.heldout_positions(name)}
        index = {s: set((p[:, 0] * cols + p[:, 1]).tolist()) for s, p in sets.items()}
        assert len(index["validation"]) == len(index["test"]) == P.HELDOUT_PER_PHOTO  # distinct positions
        assert not index["validation"] & index["test"]
        assert not (index["validation"] | index["test"]) & index["train"]
        assert all(int(p[:, 0].max()) <= h - P.PATCH and int(p[:, 1].max()) < cols for p in sets.values())


def test_marginal_w1_metrics():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 1, 4, 4, generator=g, dtype=torch.float64)
    shifted = x + torch.linspace(0, 1.5, 16, dtype=torch.float64).reshape(1, 1, 4, 4)
    # a shift of each pixel by d moves its marginal by W1 = |d|
    assert P.pixel_w1(shifted, x) == pytest.approx(0.75, rel=1e-9)
    # the DCT coefficients of x + b are those of x plus those of b
    coef = (gk.metrics.dct_matrix(4) @ (shifted - x)[0, 0] @ gk.metrics.dct_matrix(4).T).abs().mean()
    assert P.dct_w1(shifted, x) == pytest.approx(float(coef), rel=1e-9)
    assert P.pixel_w1(x, x) == 0.0 and P.dct_w1(x[:100], x[:100]) == 0.0


def test_fast_diagonal_mixture_heads_equal_the_oracles():
    g = torch.Generator().manual_seed(1)
    w = torch.rand(7, generator=g, dtype=torch.float64) + 0.1
    m = torch.randn(7, 1, 3, 3, generator=g, dtype=torch.float64)
    s = torch.rand(7, 1, 3, 3, generator=g, dtype=torch.float64) * 0.5 + 0.05
    fast, exact = DiagonalMixtureHeads(w, m, s), gk.GaussianMixtureOracle(w, m, s)
    x = torch.randn(50, 1, 3, 3, generator=g, dtype=torch.float64) * 1.5
    for t in (0, 10, 300, 999):
        torch.testing.assert_close(fast.noise_moments(x, t), exact.noise_moments(x, t), rtol=1e-9, atol=1e-10)


def test_last_step_rows_pair_each_cap_with_the_librarys_at_the_validated_c():
    from studies.quality_study import row_options

    choice = P.choose(fake_results({"sn-ddpm c=1.25": 40.0, "gms closed/pixel c=1.5": 41.0}, {}), PROTOCOL)[5]
    rows = P.last_step_rows(choice)
    assert rows["sn-ddpm, cap at 256 levels"] == ("sn-ddpm c=1.25", "sn-ddpm c=1.25")
    assert rows["sn-ddpm, cap at 17 levels"] == ("sn-ddpm c=1.25 levels=17", "sn-ddpm c=1.25")
    assert rows["gms closed/pixel, cap none"] == ("gms closed/pixel c=1.5 levels=none", "gms closed/pixel c=1.5")
    assert rows["gms closed/pixel, mixture last step"] == ("gms closed/pixel c=1.5 glast=0",
                                                           "gms closed/pixel c=1.5 levels=none")
    assert row_options("sn-ddpm c=1.25 levels=17") == ("sn-ddpm", {"variance_scale": 1.25, "pixel_levels": 17})
    assert row_options("sn-ddpm levels=none")[1] == {"pixel_levels": None}


def small_bed(name: str = "tiny") -> P.ProtocolBed:
    """A testbed of exact heads (a 2x2 Gaussian mixture inside [-1, 1]) with a validation reference of its draws."""
    oracle = gk.GaussianMixtureOracle([0.3, 0.7], [[[[-0.5, 0.2], [0.1, 0.4]]], [[[0.3, -0.2], [0.0, -0.4]]]],
                                      [0.15, 0.1])
    data = oracle.sample_data(24, torch.Generator().manual_seed(0)).float().clamp(-1, 1)
    bed = P.Testbed(name, lambda: oracle, "tag", (1, 2, 2), lambda: {"validation": data, "test": data},
                    {"score": lambda x, ref: 0.0}, "score")
    return P.ProtocolBed(bed, (-1.0, 1.0), (100, 101), 4, "a test bed")


def test_calibrated_skew_tables_give_every_fitted_step_a_factor_in_0_1():
    tables = P.calibrated_skew_tables(small_bed(), (2, 5), draws=2)
    schedule = gk.Schedule.linear()
    for k in (2, 5):
        assert list(tables[k]) == gk.trajectory(schedule, k)[:-1]  # (not t = 0, the step to the data)
        assert all(0.0 <= v <= 1.0 for v in tables[k].values())
    # the solver takes them: a sampling run at K = 5 finds a factor at every step it fits
    x = gk.sample(small_bed().bed.model(), (3, 1, 2, 2), steps=5, generator=0, progress=False,
                  skew_scale=tables[5], backend="torch")
    assert torch.isfinite(x).all()


def test_the_skew_family_is_tuned_on_validation_seeds_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (the cells' cache lives under gms_out/)
    pbed = small_bed()
    protocol = P.Protocol(default="gms closed/pixel c=1", validation_seeds=(100, 101), n_samples=4, primary="score",
                          steps=(5,))
    validation = {1.0: 30.0, 1.25: 20.0, 1.5: 10.0, 2.0: 40.0}  # c = 1.5 best on validation
    cells = {}
    for c, v in validation.items():
        label = P.family_label(P.SKEW_FAMILY, c)
        for s in protocol.validation_seeds:
            cells[f"tiny|tag|{label}|5|{s}|4"] = {"validation/score": v, "test/score": 0.0}
        for s in protocol.test_seeds:  # adversarial: on the test seeds c = 2 would win
            cells[f"tiny|tag|{label}|5|{s}|4"] = {"validation/score": -v, "test/score": 1.0 if c == 2.0 else 5.0}
    P.cache_path(pbed).parent.mkdir()
    P.cache_path(pbed).write_text(__import__("json").dumps(cells))
    chosen, results = P.run_skew_shrinkage(pbed, protocol, {5: {}}, log=None)
    assert chosen == {5: 1.5}
    tested = {label for label, k, s in results if s in protocol.test_seeds}
    assert tested == {P.family_label(P.SKEW_FAMILY, 1.5)}
