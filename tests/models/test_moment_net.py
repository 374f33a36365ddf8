"""MomentNet and its heads (gms_kernels/models/moment_net.py): the head blocks, raw and central targets, and
the saved network and heads files: format versions, dropout, map_location and the errors of a mismatched file."""

import json

import numpy as np
import pytest
import torch
from torch import nn

import gms_kernels as gk
import gms_kernels.models as gm
from conftest import tiny_diffusers_unet


def test_moment_net_file_keeps_a_diffusers_backbones_eps_only(tmp_path):
    """MomentNet.save stores the DiffusersUNet's eps_only, and MomentNet.load restores it: a 9-channel UNet
    forced to eps_only=True stays so (the default for 9 channels would be False)."""
    backbone = gm.DiffusersUNet(tiny_diffusers_unet(9), eps_only=True)
    gm.MomentNet(backbone).save(tmp_path / "net.pt")
    loaded = gm.load(tmp_path / "net.pt")
    assert loaded.backbone.eps_only is True
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        assert loaded.backbone(x, torch.tensor([3])).shape == (1, 3, 8, 8)


def tiny_iddpm():
    torch.manual_seed(0)
    return gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=6, num_res_blocks=1, attention_resolutions=(2,),
                        dropout=0.0, channel_mult=(1, 2), num_heads=2, use_scale_shift_norm=True).eval()


def test_from_heads_names_the_file_it_expected(tmp_path):
    torch.save({"format": "something.else", "config": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"other\.pt: not a heads file \(MomentNet\.save_heads\): expected format tag "
                                         r"'gms_kernels\.moment_heads', found 'something\.else'"):
        gm.MomentNet.from_heads(None, tmp_path / "other.pt")
    torch.save([torch.zeros(1)], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"list\.pt: not a heads file .*found 'list'"):
        gm.MomentNet.from_heads(None, tmp_path / "list.pt")


def test_heads_files_keep_their_dropout_and_old_files_without_targets_are_raw(tmp_path):
    torch.manual_seed(0)
    backbone = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    gm.MomentNet(backbone, head="res_conv", dropout=0.3).save_heads(tmp_path / "heads.pt")
    net = gm.MomentNet.from_heads(backbone, tmp_path / "heads.pt")
    assert net.dropout == 0.3 and net.heads["3"].res.dropout.p == 0.3
    old = torch.load(tmp_path / "heads.pt", weights_only=True)
    del old["config"]["targets"]  # a heads file written before ``targets`` existed
    torch.save(old, tmp_path / "old.pt")
    assert gm.MomentNet(backbone, head="res_conv").load_heads(tmp_path / "old.pt").targets == "raw"
    assert gm.MomentNet.from_heads(backbone, tmp_path / "old.pt").targets == "raw"


def test_moment_net_file_keeps_the_dropout_and_names_the_network_on_a_mismatch(tmp_path):
    torch.manual_seed(0)
    backbone = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    backbone.schedule = gk.Schedule.linear(50, 1e-3, 0.05)
    gm.MomentNet(backbone, head="res_conv", dropout=0.2).save(tmp_path / "net.pt")
    loaded = gm.MomentNet.load(tmp_path / "net.pt")
    assert loaded.dropout == 0.2 and loaded.heads["2"].res.dropout.p == 0.2
    np.testing.assert_allclose(loaded.schedule.betas.numpy(), np.linspace(1e-3, 0.05, 50), rtol=1e-12, atol=0)
    data = torch.load(tmp_path / "net.pt", weights_only=True)
    del data["state_dict"]["heads.3.out.conv.bias"]
    torch.save(data, tmp_path / "cut.pt")
    with pytest.raises(ValueError, match=r"cut\.pt: the weights do not match MomentNet\[pytorch-ddpm\]\(orders=\[2, 3\], "
                                         r"head='res_conv'\):\n  missing keys \(1\): heads\.3\.out\.conv\.bias"):
        gm.MomentNet.load(tmp_path / "cut.pt")
    del data["heads"]["targets"]  # a file written before ``targets`` existed: raw heads
    data["state_dict"] = torch.load(tmp_path / "net.pt", weights_only=True)["state_dict"]
    torch.save(data, tmp_path / "old.pt")
    assert gm.MomentNet.load(tmp_path / "old.pt").targets == "raw"
    loaded.save_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match=r"heads\.pt: not a MomentNet file \(MomentNet\.save\): expected format tag "
                                         r"'gms_kernels\.moment_net', found 'gms_kernels\.moment_heads'"):
        gm.MomentNet.load(tmp_path / "heads.pt")


def test_format_versions_newer_than_known_are_refused_and_a_missing_version_is_the_current(tmp_path):
    torch.manual_seed(0)
    backbone = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    gm.MomentNet(backbone).save_heads(tmp_path / "heads.pt")
    data = torch.load(tmp_path / "heads.pt", weights_only=True)
    data["version"] = 2
    torch.save(data, tmp_path / "v2.pt")
    with pytest.raises(ValueError, match=r"v2\.pt: format version 2 is newer than this gms_kernels understands \(1\)"):
        gm.MomentNet.from_heads(backbone, tmp_path / "v2.pt")
    del data["version"]
    torch.save(data, tmp_path / "v0.pt")
    assert gm.MomentNet.from_heads(backbone, tmp_path / "v0.pt").orders == (2, 3)


def test_heads_loader_options_and_central_targets(tmp_path):
    torch.manual_seed(0)
    backbone = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    gm.MomentNet(backbone, targets="central").save_heads(tmp_path / "heads.pt")
    assert gm.MomentNet.from_heads(backbone, tmp_path / "heads.pt").targets == "central"
    with pytest.raises(ValueError, match=r"unknown option\(s\) for kind 'gms-heads': colour; valid: backbone$"):
        gm.load(tmp_path / "heads.pt", backbone=backbone, colour=1)


def test_a_heads_file_without_a_dropout_entry_loads_with_no_dropout(tmp_path):
    """Heads files written before ``dropout`` was stored carry none: the heads then have no dropout
    (a res_conv head builds nn.Dropout from it, which refuses None)."""
    backbone = tiny_iddpm()
    net = gm.MomentNet(backbone, head="res_conv", dropout=0.3)
    net.save_heads(tmp_path / "heads.pt")
    data = torch.load(tmp_path / "heads.pt", weights_only=True)
    assert data["config"].pop("dropout") == 0.3
    torch.save(data, tmp_path / "old.pt")
    loaded = gm.MomentNet.from_heads(backbone, tmp_path / "old.pt")
    assert [m.p for m in loaded.heads.modules() if isinstance(m, torch.nn.Dropout)] == [0.0, 0.0]


def test_error_texts_name_a_heads_file_and_an_unnamed_diffusers_unet(tmp_path):
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    net = gm.MomentNet(tiny_iddpm(), head="conv")
    with pytest.raises(ValueError, match=r"other\.pt: not a heads file \(MomentNet\.save_heads\): expected format tag"):
        net.load_heads(tmp_path / "other.pt")
    hint = gm.DiffusersUNet(tiny_diffusers_unet(3)).heads_hint  # (built in memory: no folder to name)
    assert hint.startswith("the diffusers UNet2DModel: it gives 1 head(s) (3 output channels). ")


def test_a_heads_file_for_another_configuration_lists_each_difference(tmp_path):
    gm.MomentNet(tiny_iddpm(), orders=(2,), head="res_conv").save_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match=r"heads\.pt: the heads were saved for another configuration \(orders: this "
                                         r"MomentNet has \[2, 3\], the file \[2\], head: this MomentNet has 'conv', "
                                         r"the file 'res_conv'\)"):
        gm.MomentNet(tiny_iddpm(), head="conv").load_heads(tmp_path / "heads.pt")
    # same configuration, other weights: the mismatch report names the heads it compared with
    data = torch.load(tmp_path / "heads.pt", weights_only=True)
    data["state_dict"].pop(next(iter(data["state_dict"])))
    torch.save(data, tmp_path / "cut.pt")
    with pytest.raises(ValueError, match=r"cut\.pt: the weights do not match the heads of MomentNet\(orders=\(2,\), "
                                         r"head='res_conv'\):\n  missing keys \(1\): 2\.res\.norm1\.weight"):
        gm.MomentNet(tiny_iddpm(), orders=(2,), head="res_conv").load_heads(tmp_path / "cut.pt")


def test_a_saved_moment_net_records_its_format_version(tmp_path):
    from gms_kernels.models.moment_net import FORMAT_VERSION, NET_FORMAT

    gm.MomentNet(tiny_iddpm(), head="conv").save(tmp_path / "net.pt")
    data = torch.load(tmp_path / "net.pt", weights_only=True)
    assert data["format"] == NET_FORMAT and data["version"] == FORMAT_VERSION == 1


def test_the_res_conv_head_block_adds_its_branch_to_its_input():
    """h + conv2(drop(SiLU(GN2(conv1(SiLU(GN1(h))) + W SiLU(temb))))), with a trained (non-zero) conv2: at
    initialisation conv2 is zero and the block is the identity, which hides the sign of the sum."""
    import torch.nn.functional as F
    from gms_kernels.models.moment_net import HeadResBlock

    torch.manual_seed(0)
    block = HeadResBlock(32, 16).eval()
    with torch.no_grad():
        block.conv2.weight.normal_(0.0, 0.05)
        block.conv2.bias.normal_(0.0, 0.05)
        h, temb = torch.randn(2, 32, 4, 4), torch.randn(2, 16)
        r = block.conv1(F.silu(F.group_norm(h, 32, block.norm1.weight, block.norm1.bias, 1e-5)))
        r = r + (F.silu(temb) @ block.temb_proj.weight.T + block.temb_proj.bias)[:, :, None, None]
        r = block.conv2(F.silu(F.group_norm(r, 32, block.norm2.weight, block.norm2.bias, 1e-5)))
        torch.testing.assert_close(block(h, temb), h + r, rtol=1e-5, atol=1e-5)


def test_a_moment_net_file_without_weights_is_refused_by_name(tmp_path):
    gm.MomentNet(tiny_iddpm(), head="conv").save(tmp_path / "net.pt")
    data = torch.load(tmp_path / "net.pt", weights_only=True)
    data["state_dict"] = None
    torch.save(data, tmp_path / "empty.pt")
    with pytest.raises(ValueError, match=r"empty\.pt: the MomentNet file lacks a valid 'backbone' .* or 'state_dict'"):
        gm.load(tmp_path / "empty.pt")


def test_a_heads_file_for_other_data_channels_is_refused_by_its_config(tmp_path):
    """Heads saved for 1-channel data on a backbone of the same widths are refused as another configuration
    (the data channels are compared), before their weights are."""
    def iddpm(channels):
        return gm.IDDPMUNet(in_channels=channels, model_channels=32, out_channels=channels, num_res_blocks=1,
                            attention_resolutions=(), dropout=0.0, channel_mult=(1, 2), num_heads=2)

    one, three = gm.MomentNet(iddpm(1)), gm.MomentNet(iddpm(3))
    assert one.head_config["feature_channels"] == three.head_config["feature_channels"]
    one.save_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match=r"another configuration \(channels: this MomentNet has 3, the file 1\)"):
        three.load_heads(tmp_path / "heads.pt")


def test_save_refuses_a_backbone_without_a_family(tmp_path):
    """A backbone class of the user's own (no ``family`` attribute) gets save()'s ValueError, which says to
    save the heads alone, not an AttributeError."""
    class Plain(torch.nn.Module):  # (the documented protocol of a backbone MomentNet reads features from)
        feature_channels, temb_channels, eps_channels = 8, 16, 1

        def forward_features(self, x, t):
            return x.repeat(1, 8, 1, 1), torch.zeros(x.shape[0], 16), x

    net = gm.MomentNet(Plain())
    with pytest.raises(ValueError, match="save\\(\\) knows the backbone families .* not Plain: save the heads"):
        net.save(tmp_path / "net.pt")


def test_a_moment_net_file_without_a_dropout_entry_loads_without_dropout(tmp_path):
    """A file whose heads config has no 'dropout' (written before it was stored) loads with dropout 0."""
    gm.MomentNet(tiny_iddpm(), head="res_conv").save(tmp_path / "net.pt")
    data = torch.load(tmp_path / "net.pt", weights_only=True)
    del data["heads"]["dropout"]
    torch.save(data, tmp_path / "old.pt")
    net = gm.MomentNet.load(tmp_path / "old.pt")
    assert net.dropout == 0.0 and net.heads["2"].res.dropout.p == 0.0


def test_gk_load_puts_a_moment_net_where_map_location_says(tmp_path):
    """gm.load hands map_location on to MomentNet.load (the meta device stands in for a GPU here)."""
    gm.MomentNet(tiny_iddpm(), head="conv").save(tmp_path / "net.pt")
    assert {p.device.type for p in gm.load(tmp_path / "net.pt", map_location="meta").parameters()} == {"meta"}
    assert {p.device.type for p in gm.load(tmp_path / "net.pt").parameters()} == {"cpu"}


def test_a_heads_file_loads_on_the_backbone_of_a_moment_net_passed_as_backbone(tmp_path):
    """gm.load(heads file, backbone=<a MomentNet>) puts the heads on that MomentNet's backbone (not on the
    MomentNet itself, and not on nothing)."""
    backbone = tiny_iddpm()
    gm.MomentNet(backbone).save_heads(tmp_path / "heads.pt")
    loaded = gm.load(tmp_path / "heads.pt", backbone=gm.MomentNet(backbone, head="res_conv"))
    assert isinstance(loaded, gm.MomentNet) and loaded.backbone is backbone and loaded.head == "conv"


def test_a_moment_net_file_refuses_loader_options(tmp_path):
    """A MomentNet file takes no options: one given is a ValueError that names it."""
    gm.MomentNet(tiny_iddpm(), head="conv").save(tmp_path / "net.pt")
    with pytest.raises(ValueError, match=r"unknown option\(s\) for kind 'moment-net': colour; valid: none$"):
        gm.load(tmp_path / "net.pt", colour=1)


def test_a_heads_file_with_other_targets_is_refused(tmp_path):
    """Heads trained for central moments do not load into a MomentNet that reads them as raw moments."""
    backbone = tiny_iddpm()
    gm.MomentNet(backbone, targets="central").save_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match=r"targets: this MomentNet has 'raw', the file 'central'"):
        gm.MomentNet(backbone).load_heads(tmp_path / "heads.pt")


def test_head_res_block_adds_the_projected_time_embedding():
    """HeadResBlock = h + conv2(drop(SiLU(GN2(conv1(SiLU(GN1(h))) + W SiLU(temb))))), with a non-zero conv2
    (a trained head) so that the residual shows."""
    from gms_kernels.models.moment_net import HeadResBlock

    torch.manual_seed(0)
    block = HeadResBlock(64, 5).eval()  # (32 groups of 2 channels: with one channel a group, GroupNorm would erase
    torch.nn.init.normal_(block.conv2.weight, std=0.1)  # the per-channel time shift)
    h, temb = torch.randn(2, 64, 4, 4), torch.randn(2, 5)
    F = torch.nn.functional
    with torch.no_grad():
        r = block.conv1(F.silu(block.norm1(h))) + block.temb_proj(F.silu(temb))[:, :, None, None]
        expected = h + block.conv2(F.silu(block.norm2(r)))
        torch.testing.assert_close(block(h, temb), expected, rtol=1e-5, atol=1e-6)


def test_a_saved_moment_net_on_a_diffusers_backbone_keeps_no_private_config_entries(tmp_path):
    """MomentNet.save writes the UNet2DModel config without its private entries (the folder it was read from,
    diffusers' bookkeeping), _class_name excepted."""
    tiny_diffusers_unet(3).save_pretrained(tmp_path / "unet")
    gm.MomentNet(gm.load(tmp_path / "unet"), head="conv").save(tmp_path / "net.pt")
    config = json.loads(torch.load(tmp_path / "net.pt", weights_only=True)["backbone"]["config"])
    assert config["_class_name"] == "UNet2DModel" and config["block_out_channels"] == [8, 16]
    assert [k for k in config if k.startswith("_")] == ["_class_name"]


def test_a_heads_file_for_a_backbone_of_other_feature_channels_names_them(tmp_path):
    narrow = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    wide = gm.PytorchDDPMUNet(T=50, ch=64, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    gm.MomentNet(narrow).save_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match=rf"feature_channels: this MomentNet has {wide.feature_channels}, the file "
                                         rf"{narrow.feature_channels}"):
        gm.MomentNet(wide).load_heads(tmp_path / "heads.pt")


def test_a_saved_moment_net_keeps_its_orders(tmp_path):
    """A MomentNet with orders (2,) (SN-DDPM) saved whole loads back with orders (2,)."""
    net = gm.MomentNet(tiny_iddpm(), orders=(2,), head="conv")
    net.save(tmp_path / "net.pt")
    assert gm.MomentNet.load(tmp_path / "net.pt").orders == (2,)


def test_a_central_moment_net_returns_raw_moments_unless_asked_for_its_head_outputs():
    """targets='central': forward() turns the heads' central moments into raw ones (raw_from_central);
    head_outputs=True (not the default) returns the heads' own outputs. Weights perturbed (a trained net)."""
    from gms_kernels.models.moment_net import raw_from_central

    torch.manual_seed(0)
    net = gm.MomentNet(tiny_iddpm(), targets="central").eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for p in net.parameters():  # (improved-diffusion zero-inits its output conv: eps would be 0)
            p.add_(torch.randn(p.shape) * 0.05)
        out, heads = net(x, 5), net(x, 5, head_outputs=True)
        eps = heads[:, :3]
        expected = torch.cat([eps, *raw_from_central(eps, [heads[:, 3:6], heads[:, 6:9]])], dim=1)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-7)
    assert (out[:, 3:] - heads[:, 3:]).abs().max() > 1e-3


def test_a_saved_heads_file_records_its_format_version(tmp_path):
    """save_heads writes {format, version, config, state_dict}: the version is stored (a reader of a later
    format must not take a version-1 file for its own)."""
    from gms_kernels.models.moment_net import FORMAT_VERSION, HEADS_FORMAT

    gm.MomentNet(tiny_iddpm(), head="conv").save_heads(tmp_path / "heads.pt")
    data = torch.load(tmp_path / "heads.pt", weights_only=True)
    assert sorted(data) == ["config", "format", "state_dict", "version"]
    assert data["format"] == HEADS_FORMAT and data["version"] == FORMAT_VERSION == 1


def test_raw_from_central_of_one_central_moment_gives_e2_alone():
    """raw_from_central(e1, [c2]) (a MomentNet of orders (2,)) is [e1^2 + c2]; a central MomentNet of order 2
    runs and returns [e1, e2]."""
    from gms_kernels.models.moment_net import raw_from_central

    e1, c2 = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.25])
    (e2,) = raw_from_central(e1, [c2])
    assert torch.equal(e2, torch.tensor([1.5, 4.25]))
    torch.manual_seed(0)
    net = gm.MomentNet(gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval(),
                       orders=(2,), targets="central").eval()
    with torch.no_grad():
        assert net(torch.randn(2, 3, 8, 8), torch.tensor([3, 4])).shape == (2, 6, 8, 8)


def test_a_res_conv_head_has_no_dropout_by_default():
    """gm.ResConvHead(channels, temb_channels, out_channels) drops nothing unless a dropout is given."""
    drops = [m.p for m in gm.ResConvHead(32, 64, 3).modules() if isinstance(m, torch.nn.Dropout)]
    assert drops == [0.0]
    assert [m.p for m in gm.ResConvHead(32, 64, 3, 0.25).modules() if isinstance(m, torch.nn.Dropout)] == [0.25]


def test_the_heads_hint_of_a_diffusers_unet_names_the_folder_it_came_from():
    """A DiffusersUNet with a source (the folder gk.models.load read) names it in heads_hint, first as the model
    and then in the train-heads command."""
    hint = gm.DiffusersUNet(tiny_diffusers_unet(3), source="/data/unet-dir").heads_hint
    assert hint.startswith("the diffusers UNet2DModel at /data/unet-dir: it gives 1 head(s) (3 output channels). ")
    assert "--model /data/unet-dir" in hint


def tiny_ddpm():
    torch.manual_seed(0)
    return gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()


def test_a_saved_moment_net_keeps_central_targets(tmp_path):
    """MomentNet.load rebuilds the heads' targets from the file: a central MomentNet read back as raw
    would return e2 = c2 instead of e1^2 + c2 (the heads start at zero, so e2 would be 0 here)."""
    net = gm.MomentNet(tiny_ddpm(), targets="central").eval()
    net.save(tmp_path / "net.pt")
    loaded = gm.MomentNet.load(tmp_path / "net.pt")
    assert loaded.targets == "central"
    x, t = torch.randn(2, 3, 8, 8), torch.tensor([3, 40])
    with torch.no_grad():
        out, expected = loaded(x, t), net(x, t)
    assert torch.equal(out, expected)
    e1, e2 = out[:, :3], out[:, 3:6]
    assert torch.allclose(e2, e1 * e1) and e2.abs().max() > 0  # zero-initialised central heads: c2 = 0


def test_a_moment_net_file_loads_with_map_location_none(tmp_path):
    """map_location=None means the CPU (the backbone is built on the meta device, then materialised)."""
    net = gm.MomentNet(tiny_ddpm()).eval()
    net.save(tmp_path / "net.pt")
    loaded = gm.MomentNet.load(tmp_path / "net.pt", map_location=None)
    assert all(p.device.type == "cpu" for p in loaded.parameters())
    x, t = torch.randn(1, 3, 8, 8), torch.tensor([7])
    with torch.no_grad():
        assert torch.equal(loaded(x, t), net(x, t))


def test_moment_net_from_heads_uses_the_data_it_is_given(tmp_path):
    """from_heads(backbone, path, data): the heads file already read is not read again (path only names it
    in messages), so it works with the file gone."""
    net = gm.MomentNet(tiny_ddpm(), targets="central")
    with torch.no_grad():
        for p in net.heads.parameters():
            p.normal_(0, 0.1)
    net.save_heads(tmp_path / "heads.pt")
    data = torch.load(tmp_path / "heads.pt", weights_only=True)
    (tmp_path / "heads.pt").unlink()
    loaded = gm.MomentNet.from_heads(tiny_ddpm(), tmp_path / "heads.pt", data)
    assert loaded.targets == "central"
    for k, v in net.heads.state_dict().items():
        assert torch.equal(loaded.heads.state_dict()[k], v), k


def test_a_moment_net_runs_on_images_smaller_than_its_channel_count():
    """The check on the backbone's output counts channels (dim 1), not rows: 2x2 RGB images are fine."""
    torch.manual_seed(0)
    backbone = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1).eval()
    net = gm.MomentNet(backbone).eval()
    x, t = torch.randn(2, 3, 2, 2), torch.tensor([3, 40])
    with torch.no_grad():
        out = net(x, t)
        assert out.shape == (2, 9, 2, 2) and torch.equal(out[:, :3], backbone(x, t))


def test_loading_a_heads_file_reads_it_once(tmp_path, monkeypatch):
    """gk.models.load detects the kind from the data it read and hands that data on: the heads file is
    not read a second time."""
    net = gm.MomentNet(tiny_ddpm())
    net.save_heads(tmp_path / "heads.pt")
    reads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: reads.append(a[0]) or real_load(*a, **k))
    loaded = gm.load(tmp_path / "heads.pt", backbone=tiny_ddpm())
    assert isinstance(loaded, gm.MomentNet) and len(reads) == 1


@pytest.mark.parametrize("backbone", ["not a dict", {"family": "no-such-family", "config": {}}])
def test_a_moment_net_file_with_an_invalid_backbone_entry_is_refused_plainly(tmp_path, backbone):
    net = gm.MomentNet(tiny_ddpm())
    net.save(tmp_path / "net.pt")
    data = torch.load(tmp_path / "net.pt", weights_only=True)
    data["backbone"] = backbone
    torch.save(data, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="lacks a valid 'backbone'"):
        gm.MomentNet.load(tmp_path / "bad.pt")


def test_loading_a_moment_net_file_draws_no_random_numbers(tmp_path):
    """MomentNet.load builds the heads with the backbone on the meta device (no initialisation, every weight
    comes from the file): loading does not advance torch's random stream, so a seed set before the load
    gives the same samples as without it."""
    net = gm.MomentNet(tiny_ddpm(), head="res_conv")
    net.save(tmp_path / "net.pt")
    torch.manual_seed(123)
    before = torch.get_rng_state()
    loaded = gm.MomentNet.load(tmp_path / "net.pt")
    assert torch.equal(torch.get_rng_state(), before)
    assert all(p.device.type == "cpu" for p in loaded.parameters())


def test_a_heads_file_from_before_targets_is_read_as_raw(tmp_path):
    """A heads file whose config has no 'targets' (written before targets existed) holds raw-moment heads:
    a raw MomentNet loads it, a central one refuses it and names the difference."""
    raw = gm.MomentNet(tiny_ddpm())
    raw.save_heads(tmp_path / "heads.pt")
    data = torch.load(tmp_path / "heads.pt", weights_only=True)
    del data["config"]["targets"]
    torch.save(data, tmp_path / "old.pt")
    gm.MomentNet(tiny_ddpm()).load_heads(tmp_path / "old.pt")
    with pytest.raises(ValueError, match=r"targets: this MomentNet has 'central', the file 'raw'.*targets='raw'"):
        gm.MomentNet(tiny_ddpm(), targets="central").load_heads(tmp_path / "old.pt")


def test_moment_net_load_uses_the_data_it_is_given(tmp_path, monkeypatch):
    """MomentNet.load(path, data): the file already read is not read again (path only names it in messages),
    so gk.models.load reads a MomentNet file once and MomentNet.load works with the file gone."""
    net = gm.MomentNet(tiny_ddpm(), targets="central")
    net.save(tmp_path / "net.pt")
    reads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: reads.append(a[0]) or real_load(*a, **k))
    assert isinstance(gm.load(tmp_path / "net.pt"), gm.MomentNet) and len(reads) == 1
    data = real_load(tmp_path / "net.pt", weights_only=True)
    (tmp_path / "net.pt").unlink()
    loaded = gm.MomentNet.load(tmp_path / "net.pt", data)
    assert loaded.targets == "central"
    for k, v in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_a_res_conv_head_with_low_precision_convolutions_and_a_float32_time_layer_runs():
    """As for the backbones (improved-diffusion's convert_to_fp16 casts the convolutions alone): a head whose
    convolutions are bfloat16 while its time projection stays float32 casts the projected embedding to the
    feature's dtype, and returns bfloat16."""
    torch.manual_seed(0)
    head = gm.ResConvHead(32, 64, 3).eval()
    for m in head.modules():
        if isinstance(m, nn.Conv2d):
            m.to(torch.bfloat16)
    assert head.res.temb_proj.weight.dtype == torch.float32
    h, temb = torch.randn(2, 32, 8, 8).to(torch.bfloat16), torch.randn(2, 64)
    with torch.no_grad():
        out = head(h, temb)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 3, 8, 8) and torch.isfinite(out.float()).all()


def test_a_moment_net_file_holding_gpu_tensors_loads_onto_the_cpu_by_default(tmp_path):
    """MomentNet.load reads the file with its map_location (default "cpu"): a MomentNet file whose tensors
    are tagged "cuda:0" (written here without a GPU) loads on this machine. (MomentNet.save itself writes
    CPU tensors; the file below is written by torch.save of the same dict.)"""
    from unittest import mock

    import torch.serialization

    net = gm.MomentNet(tiny_ddpm()).eval()
    net.save(tmp_path / "net.pt")
    data = torch.load(tmp_path / "net.pt", weights_only=True)
    with mock.patch.object(torch.serialization, "location_tag", lambda storage: "cuda:0"):
        torch.save(data, tmp_path / "from_gpu.pt")
    loaded = gm.MomentNet.load(tmp_path / "from_gpu.pt")
    assert {p.device.type for p in loaded.parameters()} == {"cpu"}
    for k, v in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def _tiny_diffusers_moment_net():
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                       norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D"))
    return gm.MomentNet(gm.DiffusersUNet(unet)).eval()


def test_a_moment_net_with_a_diffusers_backbone_loads_onto_meta(tmp_path):
    """A diffusers backbone is rebuilt with real storage (not on meta) and filled from the file, which is read
    onto the CPU for a meta target: MomentNet.load must then move the network to map_location, or it stays
    on the CPU."""
    net = _tiny_diffusers_moment_net()
    net.save(tmp_path / "net.pt")
    for device in ("meta", torch.device("meta")):
        loaded = gm.MomentNet.load(tmp_path / "net.pt", map_location=device)
        assert {t.device.type for t in loaded.state_dict().values()} == {"meta"}, device
    loaded = gm.MomentNet.load(tmp_path / "net.pt")
    for name, tensor in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_moment_net_load_onto_a_missing_cuda_device_says_so_with_the_file_name(tmp_path, monkeypatch):
    """MomentNet.load reads its file with read_location(map_location): map_location='cuda' on a machine
    without CUDA (CUDA reported missing here, so that the check does not depend on the machine) gives the
    package's message naming the file and map_location, from the read, not an error from torch further on."""
    import re

    gm.MomentNet(tiny_ddpm()).save(tmp_path / "net.pt")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'net.pt'}: map_location='cuda' asks for a CUDA "
                                                   "device, but this machine has none")):
        gm.MomentNet.load(tmp_path / "net.pt", map_location="cuda")
