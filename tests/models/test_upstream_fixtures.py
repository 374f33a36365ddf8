"""gms_kernels' UNets against outputs computed by the original code (pytorch-ddpm, improved-diffusion,
and the official GMS code's eps network).

The fixtures in the shared folder (``fixtures/upstream/*.pt``: {config, state_dict, x, t, y}, and
``fixtures/official_gms/iddpm``) are 3-7 MB each, too big for the repository, and CI's fresh clone
does not have that folder. Their weights, however, are random numbers that a seed reproduces
exactly: every tensor of the state dict, in its order, is ``torch.randn(shape, generator=g) * 0.05``
with one CPU generator seeded 5 (pytorch-ddpm), 6 (improved-diffusion) or 11 (official GMS). So
``tests/data/upstream/*.pt`` (about 100 KB together) keeps the config, the key names and shapes, the
seed, a SHA-256 of the weights, and the original x, t and y; the tests rebuild the weights and
check the hash before comparing outputs. python/make_upstream_fixtures.py wrote them from the shared
files, after checking bit for bit that the seeds rebuild their weights.

Tolerance: rel. error < 1e-5. The networks run in float32 (2^-24 = 6e-8 per operation) through ~40
layers whose sums have up to ~600 terms, and reproduce the originals to ~5e-7; 1e-5 leaves room for
other CPUs' summation orders. It must stay tight: with these small random weights, changing t moves
the pytorch-ddpm output by only ~2e-4 (relative), so a loose 1e-4 would hardly see the time input.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
import torch

import gms_kernels as gk
from gms_kernels.models import IDDPMUNet, PytorchDDPMUNet

DATA = Path(__file__).resolve().parents[1] / "data" / "upstream"
IDDPM_ARGS = ("in_channels", "model_channels", "out_channels", "num_res_blocks", "attention_resolutions", "dropout",
              "channel_mult", "conv_resample", "num_heads", "num_heads_upsample", "use_scale_shift_norm")
REL_TOL = 1e-5


def weights_digest(state: dict) -> str:
    h = hashlib.sha256()
    for key, value in state.items():
        h.update(key.encode())
        h.update(value.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def load_fixture(name: str) -> dict:
    """The stored record with its state dict rebuilt from the seed (and checked against the hash)."""
    rec = torch.load(DATA / f"{name}.pt", weights_only=True)
    g = torch.Generator().manual_seed(rec["seed"])
    rec["state_dict"] = {k: torch.randn(shape, generator=g) * rec["std"] for k, shape in zip(rec["keys"], rec["shapes"])}
    assert weights_digest(rec["state_dict"]) == rec["sha256"], (
        f"{name}: the weights rebuilt from seed {rec['seed']} differ from the original ones (torch's CPU randn changed?)")
    return rec


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def build(name: str, rec: dict) -> torch.nn.Module:
    cfg = rec["config"]
    if name == "pytorch_ddpm_visible":
        model = PytorchDDPMUNet(**cfg)  # the config's names are pytorch-ddpm's UNet arguments
    else:
        model = IDDPMUNet(**{k: v for k, v in cfg.items() if k in IDDPM_ARGS})
    model.load_state_dict(rec["state_dict"], strict=True)
    return model.eval()


NAMES = ["pytorch_ddpm_visible", "iddpm_visible", "official_gms_iddpm_eps1"]


@pytest.mark.parametrize("name", NAMES)
def test_unet_reproduces_the_original_output(name):
    rec = load_fixture(name)
    model = build(name, rec)
    with torch.no_grad():
        y = model(rec["x"], rec["t"])
    assert y.shape == rec["y"].shape
    assert rel_error(y, rec["y"]) < REL_TOL
    for i in range(y.shape[0]):  # each sample, each with its own t, on its own
        assert rel_error(y[i], rec["y"][i]) < REL_TOL


@pytest.mark.parametrize("name", NAMES)
def test_time_input_matters(name):
    """The outputs for the fixture's t differ from those for other times by far more than the
    tolerance, so a network that ignored or zeroed its time embedding could not pass the test above."""
    rec = load_fixture(name)
    model = build(name, rec)
    t = rec["t"]
    other = (t.max() - t) if t.dtype == torch.int64 else (t.max() - t + 0.5)
    with torch.no_grad():
        y_other = model(rec["x"], other)
    for i in range(t.numel()):
        assert rel_error(y_other[i], rec["y"][i]) > 10 * REL_TOL


@pytest.mark.parametrize("name, kind", [("pytorch_ddpm_visible", "pytorch-ddpm"), ("iddpm_visible", "improved-diffusion"),
                                        ("official_gms_iddpm_eps1", "improved-diffusion")])
def test_models_load_reproduces_the_original_output(name, kind, tmp_path):
    """gk.models.load of the state dict saved to a file (format detected, architecture read from the
    weights; improved-diffusion's num_heads leaves no trace in them and is passed)."""
    rec = load_fixture(name)
    path = tmp_path / "weights.pt"
    if kind == "pytorch-ddpm":
        torch.save({"ema_model": rec["state_dict"], "net_model": rec["state_dict"], "step": 0}, path)
        options = {}
    else:
        torch.save(rec["state_dict"], path)
        options = dict(num_heads=rec["config"]["num_heads"], eps_only=False)
    model = gk.models.load(path, **options)
    assert type(model) is (PytorchDDPMUNet if kind == "pytorch-ddpm" else IDDPMUNet)
    with torch.no_grad():
        y = model(rec["x"], rec["t"])
    assert rel_error(y, rec["y"]) < REL_TOL
    if kind == "improved-diffusion" and rec["y"].shape[1] == 2 * rec["x"].shape[1]:
        eps_model = gk.models.load(path, num_heads=rec["config"]["num_heads"])  # eps_only by default
        with torch.no_grad():
            eps = eps_model(rec["x"], rec["t"])
        assert rel_error(eps, rec["y"][:, : rec["x"].shape[1]]) < REL_TOL


def test_pytorch_ddpm_fresh_time_table_is_the_sinusoid():
    """A checkpoint carries pytorch-ddpm's fixed time table (the fixture's is random), so this checks
    the freshly built one against the formula: row t = (sin(t w_0), cos(t w_0), sin(t w_1), ...),
    w_k = 10000^(-2k/d), as used when training from scratch."""
    model = PytorchDDPMUNet(T=50, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1)
    table = model.time_embedding.timembedding[0].weight
    d = 32
    for t in (0, 1, 17, 49):
        for k in (0, 3, 15):
            w = 10000 ** (-2 * k / d)
            assert table[t, 2 * k].item() == pytest.approx(math.sin(t * w), abs=1e-5)
            assert table[t, 2 * k + 1].item() == pytest.approx(math.cos(t * w), abs=1e-5)
