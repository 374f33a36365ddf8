"""The torch-only FID InceptionV3 (gms_kernels.eval.inception) against pytorch-fid and torch-fidelity.

The references cannot be imported here (torchvision): python/make_inception_fixture.py ran them on
deterministic random weights and stored their features in tests/data/inception_features.json, and
the weights file's key layout in tests/data/inception_weights_layout.txt.
"""
import json
from pathlib import Path

import pytest
import torch

from gms_kernels.eval import inception as gki
from gms_kernels.eval import metrics

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def state():
    return gki.random_state_dict(0)


@pytest.fixture(scope="module")
def weights_file(state, tmp_path_factory):
    path = tmp_path_factory.mktemp("inception") / gki.WEIGHTS_FILE
    torch.save(state, path)
    return path


def test_features_match_the_reference_packages(state):
    fixture = json.loads((DATA / "inception_features.json").read_text())
    assert fixture["weights_seed"] == 0 and fixture["feature_stride"] == 16
    images = torch.randint(0, 256, (2, 3, 32, 32),
                           generator=torch.Generator().manual_seed(fixture["image_seed"])).to(torch.uint8)
    net = gki.FIDInceptionV3()
    net.load_state_dict(state)
    net.double()
    prepared = []
    for mode in gki.PREPROCESSING:
        net.preprocess = mode
        prepared.append(net.prepare(images))
    feats = dict(zip(gki.PREPROCESSING, net.pool_features(torch.cat(prepared)).split(2)))  # one pass for both
    # torch-fidelity rounds its features to float32 and computes its float64 resize coordinates in
    # float64 (TF, and this module, in float32): ~3e-7 apart; pytorch-fid agrees to rounding
    for mode, tol in (("pytorch-fid", 1e-10), ("torch-fidelity", 2e-6)):
        ref, got = fixture["features"][mode], feats[mode]
        expected = torch.tensor(ref["every_16th"], dtype=torch.float64)
        scale = expected.abs().max()
        assert float((got[:, ::16] - expected).abs().max() / scale) < tol, mode
        assert torch.allclose(got.sum(1), torch.tensor(ref["sum"], dtype=torch.float64), rtol=tol, atol=0), mode
        assert torch.allclose(got.norm(dim=1), torch.tensor(ref["norm"], dtype=torch.float64), rtol=tol, atol=0), mode
    # the two preprocessings differ (by a few percent on 32x32 inputs)
    assert float((feats["pytorch-fid"] - feats["torch-fidelity"]).abs().max()) > 1e-3


def test_uint8_and_unit_float_inputs_agree():
    g = torch.Generator().manual_seed(3)
    u8 = torch.randint(0, 256, (2, 3, 9, 7), generator=g).to(torch.uint8)
    for mode in gki.PREPROCESSING:
        net = gki.FIDInceptionV3(mode).double()
        a, b = net.prepare(u8), net.prepare(u8.double() / 255)
        assert a.shape == (2, 3, 299, 299) and a.dtype == torch.float64
        assert torch.allclose(a, b, atol=1e-12) and a.min() >= -1 and a.max() <= 1
    with pytest.raises(ValueError, match="N, 3, H, W"):
        net.prepare(u8[:, :1])
    with pytest.raises(ValueError, match="preprocess must be one of"):
        gki.FIDInceptionV3("tf2")
    net.train()
    assert not net.training  # frozen: batch norm never switches to batch statistics


def test_layout_is_the_weights_files(state, tmp_path):
    lines = (DATA / "inception_weights_layout.txt").read_text().splitlines()
    layout = {k: tuple(int(n) for n in s.split("x")) for k, s in (line.split() for line in lines[1:])}
    assert len(layout) == 472 and layout["fc.weight"] == (1008, 2048)
    assert gki.weights_layout() == layout
    assert list(layout) == list(gki.weights_layout())  # same order too
    assert {k for k in state if not k.endswith("num_batches_tracked")} == set(layout)
    gki.check_state_dict(state)
    # older files have no batch-norm step counters: they load as well
    no_counters = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    gki.check_state_dict(no_counters)
    net = gki.FIDInceptionV3()
    net.load_state_dict(no_counters, strict=False)


def test_bad_weights_are_named(state, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"pt_inception-2015-12-05-6726825d\.pth from https://github"):
        gki.load_fid_inception(tmp_path / "absent.pth")
    with pytest.raises(ValueError, match="needs InceptionV3 weights"):
        metrics.fid(torch.zeros(2, 3, 8, 8), torch.zeros(2, 3, 8, 8))

    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="cannot read FID Inception weights"):
        gki.load_fid_inception(tmp_path / "junk.pth")
    torch.save([torch.zeros(1)], tmp_path / "list.pth")
    with pytest.raises(ValueError, match="not a state dict of tensors"):
        gki.load_fid_inception(tmp_path / "list.pth")
    torch.save({"Conv2d_1a_3x3.conv.weight": torch.zeros(32, 3, 3, 3), "head.weight": torch.zeros(1)},
               tmp_path / "few.pth")
    with pytest.raises(ValueError, match=r"missing key 'Conv2d_1a_3x3\.bn\.weight' \(and 470 more\); "
                                         r"unexpected key 'head\.weight'"):
        gki.load_fid_inception(tmp_path / "few.pth")

    # torchvision's ImageNet InceptionV3 file: aux head, 1000 classes
    imagenet = dict(state, **{"AuxLogits.fc.weight": torch.zeros(1000, 768), "fc.weight": torch.zeros(1000, 2048)})
    with pytest.raises(ValueError, match=r"unexpected key 'AuxLogits\.fc\.weight'; 'fc\.weight' has shape "
                                         r"\(1000, 2048\), expected \(1008, 2048\)"):
        gki.check_state_dict(imagenet)
    missing = {k: v for k, v in state.items() if k != "Mixed_7c.branch_pool.bn.running_var"}
    with pytest.raises(ValueError, match=r"missing key 'Mixed_7c\.branch_pool\.bn\.running_var'$"):
        gki.check_state_dict(missing)


def test_fid_through_the_public_function(weights_file, tmp_path):
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 3, 16, 16, generator=g) * 2 - 1
    net = gki.load_fid_inception(weights_file)
    metrics.save_stats(tmp_path / "a.npz", *metrics.gaussian_stats(gki.inception_features(a, net)))
    same = metrics.fid(a, tmp_path / "a.npz", weights_path=weights_file)
    shifted = metrics.fid((a + 0.5).clamp(-1, 1), str(tmp_path / "a.npz"), inception=net)
    assert shifted > 1.0 and abs(same) < 1e-4 * shifted
    # statistics computed once and passed as (mu, sigma): the same distance as from the .npz
    given = metrics.fid((a + 0.5).clamp(-1, 1), metrics.fid_statistics(a, net), inception=net)
    assert given == pytest.approx(shifted, rel=1e-9)
    # reference images: their statistics are made with the same network
    images = metrics.fid((a + 0.5).clamp(-1, 1), a, inception=net)
    assert images == pytest.approx(shifted, rel=1e-9)
    # preprocess= reaches the network loaded from weights_path: torch-fidelity's resize gives other features
    other = metrics.fid(a, tmp_path / "a.npz", weights_path=weights_file, preprocess="torch-fidelity")
    assert other > 1e3 * abs(same)
    with pytest.raises(ValueError, match="reference must be images"):
        metrics.fid(a, None, inception=net)


def test_inception_features_quantises_and_repeats_grey():
    class Probe(torch.nn.Module):  # what the network is given: dtype and per-channel means
        def forward(self, x):
            assert x.dtype == torch.uint8 and x.shape[1] == 3
            return x.double().mean((2, 3))

    grey = torch.tensor([-1.0, 0.0, 0.3, 1.0]).reshape(1, 1, 2, 2).repeat(3, 1, 1, 1)
    f = gki.inception_features(grey, Probe(), batch_size=2)
    # (x + 1) / 2 * 255 rounded: 0, 128 (127.5 rounds to even), 166, 255
    assert f.dtype == torch.float64
    assert torch.equal(f, torch.full((3, 3), (0 + 128 + 166 + 255) / 4, dtype=torch.float64))
    u = gki.inception_features(grey * 0.5 + 0.5, Probe(), data_range=(0, 1))
    assert torch.equal(u, f)


def test_torchmetrics_takes_the_module(state):
    from torchmetrics.image import fid as fid_metric  # (in the [test] extra; it needs no torchvision)

    net = gki.FIDInceptionV3()
    net.load_state_dict(state)
    m = fid_metric.FrechetInceptionDistance(feature=net)  # uint8 images, as with its own network
    g = torch.Generator().manual_seed(0)
    real = torch.randint(0, 256, (2, 3, 16, 16), generator=g).to(torch.uint8)
    m.update(real, real=True)
    m.update(real, real=False)
    assert abs(float(m.compute())) < 1e-2


def test_cli_choose_options_scores_fid_against_reference_statistics_made_once(weights_file, tmp_path, capsys,
                                                                            monkeypatch):
    from conftest import small_central_moment_net
    from gms_kernels.cli import main
    from gms_kernels.solvers import get_solver
    GMS_CANDIDATES = get_solver("gms").candidates

    small_central_moment_net(3).save(tmp_path / "net.pt")
    torch.save(torch.rand(6, 1, 8, 8) * 1.6 - 0.8, tmp_path / "val.pt")
    seen = []
    real = gki.inception_features
    monkeypatch.setattr(gki, "inception_features", lambda images, *a, **k: seen.append(images.shape[0]) or
                        real(images, *a, **k))
    assert main(["choose-options", "--model", str(tmp_path / "net.pt"), "--reference", str(tmp_path / "val.pt"),
                 "--metric", "fid", "--inception", str(weights_file), "--steps", "2", "--seeds", "1", "--samples", "3",
                 "--quiet", "--backend", "torch"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fid against") and "chosen: " in out
    # the reference's features once, then the samples' of each run (every candidate x 1 K x 1 seed)
    assert seen == [6] + [3] * len(GMS_CANDIDATES)
