"""SDEdit with any solver, stroke guides, and the ``sdedit`` CLI."""
import numpy as np
import pytest
import torch
from torch import nn

import gms_kernels as gk
from gms_kernels.cli import main
from gms_kernels.core.random import SampleNoise
from gms_kernels.sdedit import (STREAM_SDEDIT, SDEditResult, noise_guide, resolve_t0, sdedit,
                                sdedit_trajectory, stroke_guide)

from conftest import image_oracle

SHAPE = (3, 4, 4)




@pytest.fixture(scope="module")
def setup():
    schedule = gk.Schedule.linear(1000)
    oracle = image_oracle(schedule, shape=SHAPE)
    data = oracle.sample_data(12, torch.Generator().manual_seed(1)).float()
    guide = stroke_guide(data, block=2, colors=3)
    return schedule, oracle, data, guide


def test_resolve_t0():
    assert resolve_t0(400, 1000) == 400 and resolve_t0(0, 1000) == 0
    assert resolve_t0(0.5, 1000) == 499 and resolve_t0(1.0, 1000) == 999 and resolve_t0(0.3, 100) == 29
    assert resolve_t0(1e-6, 1000) == 0
    for bad in (1000, -1, 0.0, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError):
            resolve_t0(bad, 1000)


@pytest.mark.parametrize("kind", gk.TRAJECTORY_KINDS)
def test_trajectory_starts_at_t0(kind):
    for t0, steps in [(499, 10), (300, 50), (7, 8), (5, 1)]:
        ts = sdedit_trajectory(1000, t0, steps, kind)
        assert ts[0] == t0 and ts[-1] >= 0 and all(a > b for a, b in zip(ts, ts[1:]))
        assert steps <= len(ts) <= steps + 1
    assert sdedit_trajectory(1000, 0.5, 5, "even") == [499, 399, 299, 199, 99, 0]
    assert sdedit_trajectory(1000, 99, 4, "linear") == gk.trajectory(100, 4, "linear")


def test_trajectory_errors():
    assert sdedit_trajectory(1000, 300, 0, [300, 100, 5]) == [300, 100, 5]
    with pytest.raises(ValueError, match="start at t0"):
        sdedit_trajectory(1000, 300, 0, [299, 100])
    with pytest.raises(ValueError, match="steps"):
        sdedit_trajectory(1000, 9, 11, "even")


def test_guide_noised_at_t0(setup):
    schedule = setup[0]
    g = torch.Generator().manual_seed(0)
    guide = torch.rand(64, 3, 8, 8, generator=g) * 2 - 1  # 12288 numbers: sd of the mean 0.009
    x = noise_guide(guide, 300, schedule, generator=5)
    a, sig = schedule.alpha(300), schedule.sigma(300)
    eps = (x.double() - a * guide.double()) / sig
    assert abs(eps.mean().item()) < 0.036 and abs(eps.std().item() - 1) < 0.036
    assert abs((eps.flatten(1) * guide.double().flatten(1)).mean().item()) < 0.036  # independent of the guide
    want = SampleNoise.create(5, 64).normal(STREAM_SDEDIT, 300, guide.shape[1:])
    torch.testing.assert_close(eps, want.double(), atol=1e-5, rtol=1e-5)
    assert torch.equal(noise_guide(guide, 0.301, schedule, generator=5), x)  # 0.301 * 1000 levels -> index 300
    assert not torch.equal(noise_guide(guide, 300, schedule, generator=6), x)


def test_small_t0_stays_close_large_t0_reaches_data(setup):
    schedule, oracle, data, guide = setup
    small = sdedit(oracle, guide, 2, 3, solver="exact", generator=0, progress=False)
    large = sdedit(oracle, guide, 1.0, 3, solver="exact", generator=0, progress=False)
    assert isinstance(small, SDEditResult) and small.t0 == 2 and large.t0 == 999
    assert small.l2.shape == (12,) and small.l2.dtype == torch.float64
    torch.testing.assert_close(small.l2, (small.images.double() - guide.double()).flatten(1).norm(dim=1))
    assert small.l2.mean() < 0.15 * large.l2.mean()
    lp_guide, lp_data = oracle.log_prob(guide).mean(), oracle.log_prob(data).mean()
    assert lp_guide < lp_data - 200  # the strokes are far from the data manifold ...
    assert oracle.log_prob(large.images).mean() > lp_data - 10  # ... and t0 = T brings them back to it
    assert oracle.log_prob(small.images).mean() < lp_data - 100


@pytest.mark.parametrize("solver, options", [
    ("gms", {}), ("gms", dict(fit="adan", fit_iters=3, select="pixel")), ("sn-ddpm", {}), ("ddpm", {}),
    ("ddpm-large", {}), ("ddim", {}), ("ddim", dict(eta=1.0)), ("exact", {}), ("analytic-dpm", None),
])
def test_every_solver_runs(setup, solver, options):
    schedule, oracle, data, guide = setup
    if options is None:
        ts = sdedit_trajectory(schedule, 400, 4)
        options = dict(gamma=gk.estimate_gamma(oracle, data.double(), schedule, ts,
                                               generator=torch.Generator().manual_seed(0)))
    res = sdedit(oracle, guide[:4], 400, 4, solver=solver, generator=3, progress=False, backend="torch", **options)
    assert res.images.shape == (4, *SHAPE) and res.images.dtype == guide.dtype
    assert torch.isfinite(res.images).all() and torch.isfinite(res.l2).all()
    assert res.trajectory == sdedit_trajectory(schedule, 400, 4) == [400, 299, 199, 99, 0]


@pytest.mark.parametrize("solver", ["gms", "exact"])
def test_reproducible_and_batch_independent(setup, solver):
    schedule, oracle, data, guide = setup
    kw = dict(solver=solver, progress=False, backend="torch")
    a = sdedit(oracle, guide[:5], 300, 5, generator=11, **kw)
    b = sdedit(oracle, guide[:5], 300, 5, generator=11, **kw)
    assert torch.equal(a.images, b.images)
    assert not torch.equal(a.images, sdedit(oracle, guide[:5], 300, 5, generator=12, **kw).images)
    part = sdedit(oracle, guide[2:4], 300, 5, generator=11, first_index=2, **kw)
    torch.testing.assert_close(part.images, a.images[2:4], atol=1e-6, rtol=0)
    gens = sdedit(oracle, guide[:3], 300, 5, generator=[torch.Generator().manual_seed(i) for i in range(3)], **kw)
    alone = sdedit(oracle, guide[1:2], 300, 5, generator=torch.Generator().manual_seed(1), **kw)
    torch.testing.assert_close(gens.images[1:2], alone.images, atol=1e-6, rtol=0)


def test_bad_guide(setup):
    oracle = setup[1]
    with pytest.raises(ValueError, match="floating-point"):
        sdedit(oracle, torch.zeros(2, *SHAPE, dtype=torch.uint8), 10, 2, progress=False)
    with pytest.raises(ValueError, match="non-finite"):
        sdedit(oracle, torch.full((2, *SHAPE), float("nan")), 10, 2, progress=False)


# -- stroke guides -------------------------------------------------------------------------------
def test_stroke_guide():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(2, 3, 10, 13, generator=g) * 2 - 1
    s = stroke_guide(images, block=4, colors=6)
    assert s.shape == images.shape and s.dtype == images.dtype
    assert s.min() >= -1 and s.max() <= 1
    levels = torch.linspace(-1, 1, 6)
    assert torch.isclose(s.reshape(-1, 1), levels.reshape(1, -1), atol=1e-6).any(1).all()
    for c in range(3):
        assert len(torch.unique(s[:, c])) <= 6
    assert torch.equal(s[:, :, :4, :4], s[:, :, :1, :1].expand(-1, -1, 4, 4))  # constant blocks
    assert torch.equal(s[:, :, 8:, 12:], s[:, :, 8:9, 12:13].expand(-1, -1, 2, 1))  # ragged edge block
    # a block's colour is its quantised average
    avg = images[0, 0, :4, :4].mean()
    assert abs(s[0, 0, 0, 0] - (torch.round((avg + 1) / 2 * 5) / 5 * 2 - 1)) < 1e-6
    assert len(torch.unique(stroke_guide(images, block=1, colors=2))) <= 2
    assert stroke_guide(images * 0.5 + 0.5, 2, 4, data_range=(0, 1)).min() >= 0
    for bad in (dict(block=0), dict(colors=1), dict(block=2.0)):
        with pytest.raises(ValueError):
            stroke_guide(images, **bad)
    with pytest.raises(ValueError):
        stroke_guide(images[0])


# -- CLI -----------------------------------------------------------------------------------------
class TinyHeads(nn.Module):
    """A small noise network with three heads, saved as TorchScript for the CLI."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 9, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = 0.1 * torch.tanh(self.conv(x)) * (t.float().reshape(-1, 1, 1, 1) / 1000.0)
        e1 = h[:, :3]
        return torch.cat([e1, e1 * e1 + 0.5 + h[:, 3:6].abs(), e1 * e1 * e1 + h[:, 6:]], dim=1)


@pytest.fixture
def tiny_model(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "tiny.pt"
    torch.jit.save(torch.jit.script(TinyHeads()), str(path))
    return path


@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")
def test_cli_sdedit(tmp_path, tiny_model, capsys):
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    arr = (torch.rand(2, 8, 8, 3, generator=g) * 255).to(torch.uint8).numpy()
    np.save(tmp_path / "in.npy", arr)
    Image.fromarray(arr[0]).save(tmp_path / "one.png")
    out = tmp_path / "out"
    rc = main(["sdedit", "--model", str(tiny_model), "--kind", "torchscript", "--input", str(tmp_path / "in.npy"),
               str(tmp_path / "one.png"), "--t0", "0.3", "--steps", "4", "--solver", "gms", "--stroke", "2",
               "--colors", "4", "--backend", "torch", "--out", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "t0 index 299" in text and "mean L2 to guide" in text and text.count("image ") >= 3
    grid = Image.open(out / "sdedit_grid.png")
    assert grid.size == (3 * 8 + 4 * 2, 3 * 8 + 4 * 2) and grid.mode == "RGB"  # input | guide | edited, 3 rows; 2-px gaps
    edited = np.load(out / "sdedit_images.npy")
    assert edited.shape == (3, 3, 8, 8) and np.isfinite(edited).all()
    # --kind auto recognises the TorchScript archive; a PNG on its own
    rc = main(["sdedit", "--model", str(tiny_model), "--input", str(tmp_path / "one.png"),
               "--t0", "100", "--steps", "3", "--solver", "ddim", "--out", str(out), "--quiet"])
    assert rc == 0 and Image.open(out / "sdedit_grid.png").size == (2 * 8 + 3 * 2, 8 + 2 * 2)
    assert "t0 index 100" in capsys.readouterr().out


def test_cli_t0_parsing():
    from gms_kernels.cli import build_parser

    p = build_parser()
    base = ["sdedit", "--model", "m", "--input", "x.png"]
    assert p.parse_args(base + ["--t0", "400"]).t0 == 400
    assert p.parse_args(base + ["--t0", "0.4"]).t0 == 0.4
    assert p.parse_args(base).t0 == 0.5
    with pytest.raises(SystemExit):
        p.parse_args(base + ["--t0", "half"])
