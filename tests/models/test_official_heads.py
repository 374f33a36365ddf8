"""The official GMS heads (gms_kernels/models/official_heads.py): their defaults, modes, dropout and device."""
import pytest
import torch
from torch import nn

import gms_kernels.models as gm
from gms_kernels.models.official_heads import IDDPMHead
from conftest import official_fixtures, tiny_ddim, tiny_iddpm


@pytest.mark.parametrize("kind", ["ddim-complex", "iddpm-complex"])
def test_official_heads_take_the_dropout_they_are_given(kind):
    backbone = tiny_ddim(0) if kind.startswith("ddim") else tiny_iddpm()
    head = gm.official_heads.build_official_head(kind, backbone, 3, 0.375)
    assert sorted({m.p for m in head.modules() if isinstance(m, torch.nn.Dropout)}) == [0.375]


def test_official_heads_are_materialised_on_their_backbones_device():
    """load_head puts each official head where its backbone is: with map_location='meta' (shapes only, no data)
    every parameter of the separate networks, heads included, is on the meta device."""
    paths, cfg = official_fixtures("ddpm")
    net = gm.load(paths[:2], kind="gms-official", shared_backbone=False, map_location="meta", **cfg)
    assert {p.device.type for p in net.head_nets[0].heads.parameters()} == {"meta"}
    assert {p.device.type for p in net.parameters()} == {"meta"}


def test_improved_diffusion_heads_on_another_backbone_use_no_scale_shift():
    """An official improved-diffusion head on a backbone without use_scale_shift_norm (a pytorch-ddpm UNet)
    is built without scale-shift: its ResBlock's time projection gives one shift per channel."""
    torch.manual_seed(0)
    backbone = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    net = gm.MomentNet(backbone, orders=(2,), head="iddpm-complex")
    res = net.heads["2"][0]
    assert res.scale_shift is False and res.emb_layers[1].out_features == backbone.feature_channels == 32


def test_improved_diffusion_heads_record_their_mode():
    """IDDPMHead keeps the mode it was built in (as DDIMHead does), for every official mode."""
    from gms_kernels.models.official_heads import IDDPMHead

    for mode in ("simple", "complex", "complex2"):
        assert IDDPMHead(mode, 32, 64, 3).mode == mode


def test_the_official_improved_diffusion_head_defaults_to_no_dropout():
    head = IDDPMHead("complex", 32, 128, 3)
    dropouts = [m for m in head.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(m.p == 0.0 for m in dropouts)


@pytest.mark.parametrize("family", ["iddpm", "ddpm"])
def test_official_heads_take_the_backbones_dropout(family):
    """The official heads (UNetModel4Pretrained.out2 / Model4Pretrained's before_out) are built with the
    network's dropout (0.1 in the fixtures' config), as the official classes do: it matters when training."""
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "official_gms" / family
    if not folder.is_dir():
        folder = Path("/work/shared/fixtures/official_gms") / family
    config = json.loads((folder / "config.json").read_text())
    assert config["dropout"] == 0.1
    net = gm.load([folder / f"eps{i}.pt" for i in (1, 2, 3)], kind="gms-official", **config)
    rates = [m.p for m in net.heads.modules() if isinstance(m, nn.Dropout)]
    assert len(rates) == 2 and all(p == 0.1 for p in rates)


def test_the_official_improved_diffusion_head_defaults_to_no_scale_shift():
    """improved-diffusion's UNetModel defaults to use_scale_shift_norm=False: the head's res block then
    projects the embedding to `channels` numbers, not 2 * channels."""
    default = IDDPMHead("complex", 32, 128, 3)
    plain = IDDPMHead("complex", 32, 128, 3, use_scale_shift_norm=False)
    assert {k: v.shape for k, v in default.state_dict().items()} == {k: v.shape for k, v in plain.state_dict().items()}
    assert default[0].emb_layers[1].out_features == 32


def test_the_official_ddim_head_defaults_to_no_dropout():
    from gms_kernels.models.official_heads import DDIMHead

    head = DDIMHead("complex", 32, 128, 3)
    dropouts = [m for m in head.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(m.p == 0.0 for m in dropouts)
