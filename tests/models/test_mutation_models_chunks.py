"""Tests written for mutants of gms_kernels/models/*.py that survived the ninth session's run of chunks 43-50
of the seed-3 shuffle (issue 25 item 7, benchmarks/results/mutation-models.md): a saved MomentNet keeps
its head targets and loads with map_location=None, an unrecognised checkpoint names its keys, two
defaults (the official improved-diffusion head's dropout, an affine-free GroupNorm32), the DDIM encoder's
downsample input and bfloat16 time embedding, a one-channel improved-diffusion config and an exported
description of an unknown type."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import gms_kernels.models as gm
from gms_kernels.models._common import GroupNorm32
from gms_kernels.models.official_heads import IDDPMHead


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


def test_an_unrecognised_checkpoint_names_its_top_level_keys(tmp_path):
    torch.save({"alpha": torch.zeros(1), "beta": torch.zeros(2)}, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match=r"top-level keys: \['alpha', 'beta'\]"):
        gm.load(tmp_path / "odd.pt")


def test_the_official_improved_diffusion_head_defaults_to_no_dropout():
    head = IDDPMHead("complex", 32, 128, 3)
    dropouts = [m for m in head.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(m.p == 0.0 for m in dropouts)


def test_an_affine_free_group_norm32_normalises_without_weights():
    """GroupNorm32 without affine parameters: plain group normalisation, computed in float32."""
    norm = GroupNorm32(2, 4, affine=False)
    x = torch.randn(3, 4, 5, 5, dtype=torch.float16)
    y = norm(x)
    expected = nn.functional.group_norm(x.float(), 2, eps=norm.eps).to(torch.float16)
    assert y.dtype == torch.float16 and torch.equal(y, expected)


def test_a_ddim_level_downsamples_its_last_block_output():
    """With two res blocks per level the skip list holds three entries before the downsample: it must take
    the last one (the level's output), as the DDIM repository's Model does."""
    torch.manual_seed(0)
    model = gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=2, attn_resolutions=(), resolution=8).eval()
    seen = {}
    model.down[0].block[-1].register_forward_hook(lambda m, args, out: seen.setdefault("last_block", out))
    model.down[0].downsample.register_forward_pre_hook(lambda m, args: seen.setdefault("downsampled", args[0]))
    with torch.no_grad():
        model(torch.randn(2, 3, 8, 8), torch.tensor([5, 17]))
    assert seen["downsampled"] is seen["last_block"]


def test_a_bfloat16_ddim_model_embeds_time_in_its_own_dtype():
    torch.manual_seed(0)
    model = gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(), resolution=8)
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 8, 8, dtype=torch.bfloat16), torch.tensor([9]))
    assert out.dtype == torch.bfloat16 and out.shape == (1, 3, 8, 8)


def test_iddpm_infer_config_reads_the_input_channels_of_a_one_channel_model():
    """(the input conv's weight is [model_channels, in_channels, 3, 3]: for RGB its kernel size is 3 too)"""
    state = gm.IDDPMUNet(in_channels=1, model_channels=32, out_channels=2, num_res_blocks=1, attention_resolutions=(),
                         channel_mult=(1, 2), num_heads=1).state_dict()
    assert gm.IDDPMUNet.infer_config(state)["in_channels"] == 1


def test_an_exported_network_description_of_an_unknown_type_is_refused():
    from gms_kernels.integrations.diffusers_export import build_network, network_spec

    spec = network_spec(gm.MomentNet(tiny_ddpm()))
    assert build_network(spec) is not None
    with pytest.raises(ValueError, match="not a gms_kernels network description"):
        build_network({**spec, "type": "something-else"})


# -- survivors of chunks 29-42 of the seed-3 shuffle (tenth session, helper B) ----------------------------------
def test_ddim_infer_config_reads_resampling_without_convolutions():
    """resamp_with_conv is read from the first downsample's conv: a two-level model built without it
    (average-pool down, nearest up) must be rebuilt the same way, else its state dict does not fit."""
    from gms_kernels.models.ddim_model import DDIMModel

    for conv in (False, True):
        state = DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(),
                          resamp_with_conv=conv, resolution=8).state_dict()
        assert DDIMModel.infer_config(state)["resamp_with_conv"] is conv
    one_level = DDIMModel(ch=32, out_ch=3, ch_mult=(1,), num_res_blocks=1, attn_resolutions=(), resolution=8)
    assert DDIMModel.infer_config(one_level.state_dict())["resamp_with_conv"] is True  # (nothing to resample)


def test_the_exported_diffusers_model_puts_an_integer_timestep_on_the_samples_device():
    """GMSDiffusersModel(sample, 17): the timestep tensor is made where the sample is, whatever torch's
    default device (under a meta default a forgotten device makes a meta tensor, which fails)."""
    from gms_kernels.integrations.diffusers_export import GMSDiffusersModel

    model = GMSDiffusersModel.from_network(gm.MomentNet(tiny_ddpm()), sample_size=8).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x, 17).sample
        with torch.device("meta"):
            got = model(x, 17).sample
    assert got.device.type == "cpu" and torch.equal(got, expected)


def test_iddpm_timestep_embedding_ignores_the_default_device_and_dtype(default_dtype):
    """Its frequencies are made on t's device and in float32 (improved-diffusion's th.arange(..., float32)),
    whatever torch's default device or dtype."""
    from gms_kernels.models.iddpm import timestep_embedding

    t = torch.tensor([0, 7, 999])
    expected = timestep_embedding(t, 9)
    assert expected.dtype == torch.float32
    with torch.device("meta"):
        got = timestep_embedding(t, 9)
    assert got.device.type == "cpu" and torch.equal(got, expected)
    with default_dtype(torch.float64):
        got = timestep_embedding(t, 9)
    assert got.dtype == torch.float32 and torch.equal(got, expected)


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


def test_official_read_state_honours_map_location(tmp_path):
    from gms_kernels.models.official_gms import read_state

    torch.save({"ema_model": {"w": torch.ones(2)}, "net_model": {"w": torch.zeros(2)}}, tmp_path / "o.pt")
    state, where = read_state(tmp_path / "o.pt", map_location="meta")
    assert state["w"].device.type == "meta" and where.endswith("[ema_model]")
    state, _ = read_state(tmp_path / "o.pt", use_ema=False)
    assert state["w"].device.type == "cpu" and torch.equal(state["w"], torch.zeros(2))


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


def test_pytorch_ddpm_infer_config_falls_back_to_the_time_embedding_width_for_ch(tmp_path):
    """With the sinusoid table, the first time-embedding linear and the input conv all gone, ch is read as a
    quarter of the time-embedding width (an int), so the damaged file is still compared with its own
    architecture and its missing keys named."""
    net = gm.PytorchDDPMUNet(T=1000, ch=32, ch_mult=(1, 2, 2), attn=(1,), num_res_blocks=2)
    state = net.state_dict()
    removed = ["time_embedding.timembedding.0.weight", "time_embedding.timembedding.1.weight", "head.weight",
               "head.bias"]
    for key in removed:
        del state[key]
    found = gm.PytorchDDPMUNet.infer_config(state)
    assert found == {"ch": 32, "in_channels": 3, "ch_mult": [1, 2, 2], "attn": [1], "num_res_blocks": 2}
    assert type(found["ch"]) is int and all(type(m) is int for m in found["ch_mult"])
    torch.save(state, tmp_path / "partial.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "partial.pt")
    text = str(err.value)
    assert "missing keys (4)" in text and all(k in text for k in removed)
    assert "PytorchDDPMUNet(ch=32, in_channels=3, ch_mult=[1, 2, 2]" in text


def test_a_scheduler_config_that_is_not_a_json_object_is_not_returned(tmp_path):
    """scheduler_config_near gives a dict or None: a scheduler_config.json holding a list is not a config
    (its caller would call .get on it)."""
    from gms_kernels.models.diffusers_unet import scheduler_config_near

    unet_dir = tmp_path / "unet"
    unet_dir.mkdir()
    (unet_dir / "scheduler_config.json").write_text("[1000, \"linear\"]")
    assert scheduler_config_near(str(unet_dir), None) is None
    (unet_dir / "scheduler_config.json").write_text('{"variance_type": "fixed_small"}')
    assert scheduler_config_near(str(unet_dir), None) == {"variance_type": "fixed_small"}


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


def test_a_damaged_official_head_is_named_by_its_file(tmp_path):
    """A head whose keys fit a mode but whose shapes do not: the error names the file (and entry) it came from."""
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "official_gms" / "iddpm"
    if not folder.is_dir():
        folder = Path("/work/shared/fixtures/official_gms/iddpm")
    config = json.loads((folder / "config.json").read_text())
    state = torch.load(folder / "eps2.pt", weights_only=True)["ema_model"]
    state["out2.3.weight"] = torch.zeros(3, 32, 1, 1)
    torch.save({"ema_model": state, "net_model": state, "step": 1}, tmp_path / "e2.pt")
    with pytest.raises(ValueError, match=r"e2\.pt \[ema_model\]: the weights do not match the official head"):
        gm.load([folder / "eps1.pt", tmp_path / "e2.pt"], kind="gms-official", **config)


def test_an_unreadable_files_detail_is_the_first_sentence_of_the_error():
    from gms_kernels.models._common import _unreadable

    err = RuntimeError("PytorchStreamReader failed reading zip archive. failed finding central directory")
    text = str(_unreadable("x.pt", 10, err))
    assert "(10 bytes; RuntimeError: PytorchStreamReader failed reading zip archive):" in text
    assert "central directory" not in text


def test_iddpm_infer_config_reads_resampling_without_convolutions():
    """conv_resample is True only when every downsample holds a strided conv: a model built with average
    pooling must be read back as conv_resample=False (else its rebuilt network expects conv weights)."""
    for conv in (False, True):
        state = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                             attention_resolutions=(), channel_mult=(1, 2, 2), conv_resample=conv).state_dict()
        assert gm.IDDPMUNet.infer_config(state)["conv_resample"] is conv


def _official_folder(family):
    from pathlib import Path

    folder = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "official_gms" / family
    return folder if folder.is_dir() else Path("/work/shared/fixtures/official_gms") / family


def test_separately_run_official_networks_all_take_the_time_input(tmp_path):
    """shared_backbone=False with time_input="index+1": the eps network and every head network's own
    backbone are fed index + 1 (as the merged network's one backbone)."""
    import json

    folder = _official_folder("iddpm")
    config = json.loads((folder / "config.json").read_text())
    paths = [folder / f"eps{i}.pt" for i in (1, 2, 3)]
    separate = gm.load(paths, kind="gms-official", shared_backbone=False, time_input="index+1", **config)
    assert [m.time_input for m in [separate.eps_net, *(h.backbone for h in separate.head_nets)]] == ["index+1"] * 3


def test_an_official_head_of_no_known_mode_is_named_by_its_file(tmp_path):
    import json

    folder = _official_folder("iddpm")
    config = json.loads((folder / "config.json").read_text())
    state = torch.load(folder / "eps2.pt", weights_only=True)["ema_model"]
    del state["out2.1.weight"]
    torch.save({"ema_model": state, "net_model": state, "step": 1}, tmp_path / "e2.pt")
    with pytest.raises(ValueError, match=r"e2\.pt \[ema_model\]: the head keys match no official"):
        gm.load([folder / "eps1.pt", tmp_path / "e2.pt"], kind="gms-official", **config)


def test_the_exported_models_sample_size_is_a_list_of_ints():
    """A (height, width) given as a tuple of numpy ints is stored as a JSON-ready list of Python ints, the
    form config.json gives back after a save."""
    import numpy as np
    from gms_kernels.integrations.diffusers_export import GMSDiffusersModel

    model = GMSDiffusersModel.from_network(gm.MomentNet(tiny_ddpm()), sample_size=(np.int64(8), np.int64(12)))
    size = model.config.sample_size
    assert size == [8, 12] and all(type(s) is int for s in size)
    assert GMSDiffusersModel.from_network(gm.MomentNet(tiny_ddpm()), sample_size=16).config.sample_size == 16


def test_official_backbone_comparison_with_rtol_1():
    """first_difference: rtol = 0 asks for bit-equal entries; any other rtol, 1 included, accepts an entry
    within rtol times its largest |value|."""
    from gms_kernels.models.official_gms import first_difference

    ref, near = {"w": torch.tensor([1.0, -2.0])}, {"w": torch.tensor([1.5, -2.0])}
    assert first_difference(ref, near, 1.0) is None
    assert first_difference(ref, near, 0.25) is None
    assert first_difference(ref, near, 0.2)[0] == "w"
    assert first_difference(ref, near, 0.0)[0] == "w"


def test_loading_one_official_file_by_kind_reads_it_once(monkeypatch):
    """kind="gms-official" with one path goes straight to the official loader, which reads the file once
    (the generic path would read it first to detect its kind, then the official loader again)."""
    import json

    folder = _official_folder("iddpm")
    config = json.loads((folder / "config.json").read_text())
    reads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: reads.append(a[0]) or real_load(*a, **k))
    eps = gm.load(folder / "eps1.pt", kind="gms-official", **config)
    assert isinstance(eps, gm.IDDPMUNet) and len(reads) == 1


def test_an_unreadable_files_detail_is_cut_at_200_characters():
    from gms_kernels.models._common import _unreadable

    text = str(_unreadable("x.pt", 10, RuntimeError("y" * 300)))
    assert f"(10 bytes; RuntimeError: {'y' * 200}):" in text


def test_ddim_model_refuses_a_resolution_it_cannot_halve_once_per_level():
    """Three levels halve twice: 6 is even but not divisible by 4."""
    with pytest.raises(ValueError, match="resolution 6 cannot be halved 2 times"):
        gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2, 2), num_res_blocks=1, attn_resolutions=(), resolution=6)
    gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2, 2), num_res_blocks=1, attn_resolutions=(), resolution=12)


def test_iddpm_unet_defaults_to_one_attention_head():
    """improved-diffusion's UNetModel defaults to num_heads=1 (and num_heads_upsample=-1: the same)."""
    from gms_kernels.models.iddpm import _Attention

    model = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                         attention_resolutions=(2,), channel_mult=(1, 2))
    heads = [m.num_heads for m in model.modules() if isinstance(m, _Attention)]
    assert model.num_heads == 1 and heads and all(h == 1 for h in heads)


@pytest.mark.parametrize("backbone", ["not a dict", {"family": "no-such-family", "config": {}}])
def test_a_moment_net_file_with_an_invalid_backbone_entry_is_refused_plainly(tmp_path, backbone):
    net = gm.MomentNet(tiny_ddpm())
    net.save(tmp_path / "net.pt")
    data = torch.load(tmp_path / "net.pt", weights_only=True)
    data["backbone"] = backbone
    torch.save(data, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="lacks a valid 'backbone'"):
        gm.MomentNet.load(tmp_path / "bad.pt")


def test_a_wrong_config_is_answered_with_a_call_that_fixes_it(tmp_path):
    """Two options that contradict the weights: the suggested gk.models.load call lists both corrections,
    comma-separated, ready to paste."""
    torch.save(tiny_ddpm().state_dict(), tmp_path / "d.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "d.pt", kind="pytorch-ddpm", ch=64, ch_mult=[1, 2, 2])
    assert "load with gk.models.load(path, kind='pytorch-ddpm', ch=32, ch_mult=[1, 2]) or leave these options out" \
        in str(err.value)


# -- survivors of chunks 29-35 of the seed-3 shuffle (eleventh session, helper B) ---------------------------------
def test_loading_a_ddim_file_reads_it_once(tmp_path, monkeypatch):
    """gk.models.load detects a DDIM file from the data it read and hands that data to the DDIM loader: the
    file is not read a second time (with the kind detected or given)."""
    torch.manual_seed(0)
    model = gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(), resolution=8)
    torch.save(model.state_dict(), tmp_path / "ddim.pt")
    reads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: reads.append(a[0]) or real_load(*a, **k))
    for kind in ("auto", "ddim"):
        reads.clear()
        loaded = gm.load(tmp_path / "ddim.pt", kind=kind, resolution=8)
        assert isinstance(loaded, gm.DDIMModel) and len(reads) == 1


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


def test_ddim_model_refuses_a_base_width_that_is_not_a_multiple_of_32():
    """ch itself is a width (conv_in's output, the first block's GroupNorm), even when no level keeps it."""
    with pytest.raises(ValueError, match=r"must be a multiple of 32 \(GroupNorm\(32\)\); got \[48, 96\]"):
        gm.DDIMModel(ch=48, out_ch=3, ch_mult=(2,), num_res_blocks=1, attn_resolutions=(), resolution=8)


def test_an_official_checkpoint_without_the_asked_entry_names_the_other_one():
    """use_ema=False on a file that holds only 'ema_model' points at use_ema=True and 'ema_model' (and the
    other way round)."""
    from gms_kernels.models.official_gms import read_state

    state = {"w": torch.zeros(2)}
    with pytest.raises(ValueError, match=r"has no 'net_model' .*; pass use_ema=True to load 'ema_model'$"):
        read_state("f.pt", {"ema_model": state}, use_ema=False)
    with pytest.raises(ValueError, match=r"has no 'ema_model' .*; pass use_ema=False to load 'net_model'$"):
        read_state("f.pt", {"net_model": state}, use_ema=True)


def test_a_checkpoint_saved_on_a_gpu_loads_onto_map_location(tmp_path):
    """gk.models.load reads the file with the map_location it is given (default "cpu"): a state dict saved
    from CUDA tensors (storage location tag "cuda:0", written here without a GPU) loads on this machine."""
    from unittest import mock

    import torch.serialization

    model = tiny_ddpm()
    with mock.patch.object(torch.serialization, "location_tag", lambda storage: "cuda:0"):
        torch.save(model.state_dict(), tmp_path / "from_gpu.pt")
    for kwargs in ({}, {"map_location": torch.device("cpu")}):
        loaded = gm.load(tmp_path / "from_gpu.pt", **kwargs)
        assert isinstance(loaded, gm.PytorchDDPMUNet)
        assert all(p.device.type == "cpu" for p in loaded.parameters())
        assert torch.equal(loaded.state_dict()["head.weight"], model.state_dict()["head.weight"])


def test_one_official_file_found_by_detection_loads_onto_map_location():
    """An official GMS eps file passed alone with kind="auto" is detected and handed to the official loader
    with the map_location it was given (here "meta": shapes only)."""
    import json

    folder = _official_folder("iddpm")
    config = json.loads((folder / "config.json").read_text())
    for device in ("meta", torch.device("meta")):
        eps = gm.load(folder / "eps1.pt", map_location=device, **config)
        assert isinstance(eps, gm.IDDPMUNet) and {p.device.type for p in eps.parameters()} == {"meta"}


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


def test_an_improved_diffusion_file_with_a_wrong_option_is_answered_with_its_kind(tmp_path):
    """The suggested call names kind='improved-diffusion' (a pasteable gk.models.load call)."""
    model = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                         attention_resolutions=(2,), channel_mult=(1, 2))
    torch.save(model.state_dict(), tmp_path / "i.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "i.pt", model_channels=64)
    assert "load with gk.models.load(path, kind='improved-diffusion', model_channels=32) or leave these options out" \
        in str(err.value)


def test_iddpm_unet_defaults_to_no_scale_shift_norm():
    """improved-diffusion's UNetModel defaults to use_scale_shift_norm=False: each res block's embedding
    projection gives out_ch values (a shift), not 2 * out_ch (scale and shift)."""
    from gms_kernels.models.iddpm import _ResBlock

    model = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                         attention_resolutions=(), channel_mult=(1, 2))
    blocks = [m for m in model.modules() if isinstance(m, _ResBlock)]
    assert model.use_scale_shift_norm is False and model.config["use_scale_shift_norm"] is False
    assert blocks and all(b.emb_layers[1].out_features == b.out_layers[-1].out_channels for b in blocks)


# -- survivors of chunks 28-32 of the seed-3 shuffle (twelfth session) ---------------------------------------------
def test_group_norm32_applies_float32_affine_parameters_to_a_16_bit_input_unrounded():
    """A half/bfloat16 input is normalised in float32 with the float32 weight and bias as they are (rounded
    once, at the end): rounding the weight and bias to the input's dtype first gives other values."""
    torch.manual_seed(0)
    norm = GroupNorm32(2, 8)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8) * 1.37 + 0.1234567)
        norm.bias.copy_(torch.randn(8) * 0.77 + 0.0123457)
    for dtype in (torch.float16, torch.bfloat16):
        x = (torch.randn(2, 8, 6, 6) * 3).to(dtype)
        expected = nn.functional.group_norm(x.float(), 2, norm.weight, norm.bias, norm.eps).to(dtype)
        y = norm(x)
        assert y.dtype == dtype and torch.equal(y, expected), dtype


def test_a_ddim_model_built_directly_has_the_ddpm_linear_schedule():
    """Without a schedule set, DDIMModel.schedule is DDPM's linear one (T=1000, betas 1e-4 to 0.02), as the
    DDIM repository's CIFAR-10 and CelebA models were trained with."""
    import gms_kernels as gk

    model = gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(), resolution=8)
    assert isinstance(model.schedule, gk.Schedule) and model.schedule.T == 1000
    assert torch.equal(model.schedule.betas, gk.Schedule.linear(1000, 1e-4, 0.02).betas)


def test_the_official_ddim_head_defaults_to_no_dropout():
    from gms_kernels.models.official_heads import DDIMHead

    head = DDIMHead("complex", 32, 128, 3)
    dropouts = [m for m in head.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(m.p == 0.0 for m in dropouts)


def test_pytorch_ddpm_block_width_is_read_from_its_second_conv_when_the_norms_and_time_projection_are_gone():
    """A down block's width comes from block2.3.weight (the second conv) when block1.2.weight/bias,
    temb_proj.1.weight and block2.0.weight (the second GroupNorm) are all missing."""
    sd = tiny_ddpm().state_dict()
    gone = [f"downblocks.0.{k}" for k in ("block1.2.weight", "block1.2.bias", "temb_proj.1.weight", "block2.0.weight")]
    part = {k: v for k, v in sd.items() if k not in gone}
    config = gm.PytorchDDPMUNet.infer_config(part)
    assert config is not None and config == gm.PytorchDDPMUNet.infer_config(sd)


def test_iddpm_unet_decoder_attention_takes_num_heads_upsample():
    """num_heads_upsample (when not -1) sets the heads of the decoder's attention blocks only; the encoder and
    middle blocks keep num_heads. The weights are the same, the outputs are not."""
    from gms_kernels.models.iddpm import _Attention

    def unet(num_heads_upsample):
        torch.manual_seed(0)
        return gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                            attention_resolutions=(2,), channel_mult=(1, 2), num_heads=1,
                            num_heads_upsample=num_heads_upsample).eval()

    model, same_heads = unet(4), unet(-1)
    heads = lambda blocks: [m.num_heads for m in blocks.modules() if isinstance(m, _Attention)]
    assert heads(model.output_blocks) and set(heads(model.output_blocks)) == {4}
    assert set(heads(model.input_blocks)) == set(heads(model.middle_block)) == {1}
    assert set(heads(same_heads.output_blocks)) == {1}
    with torch.no_grad():  # (improved-diffusion zero-initialises each attention's output projection)
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.1)
    same_heads.load_state_dict(model.state_dict())
    x, t = torch.randn(2, 3, 8, 8), torch.tensor([3, 40])
    with torch.no_grad():
        assert not torch.allclose(model(x, t), same_heads(x, t))


def test_a_diffusers_error_without_a_message_is_still_reported_as_a_value_error(tmp_path, monkeypatch):
    """gk.models.load turns whatever UNet2DModel.from_pretrained raises into one ValueError naming the folder
    and the exception type, also when the exception has no message."""
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "UpBlock2D")).save_pretrained(tmp_path / "unet")

    def fail(cls, *args, **kwargs):
        raise RuntimeError()

    monkeypatch.setattr(UNet2DModel, "from_pretrained", classmethod(fail))
    with pytest.raises(ValueError, match=r"unet: diffusers could not load the UNet2DModel \(RuntimeError: \)\. Check"):
        gm.load(tmp_path / "unet")


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


def test_a_state_dict_mismatch_of_exactly_eight_keys_lists_them_all_with_no_more():
    """Up to 8 keys are listed in full; "... (N more)" appears only past the eighth."""
    from gms_kernels.models import _common

    net = nn.Sequential(*[nn.Linear(1, 1, bias=False) for _ in range(8)])
    text = _common.mismatch_message("net:", *_common.mismatch_report(net, {}), "fix it")
    assert "  missing keys (8): " + ", ".join(f"{i}.weight" for i in range(8)) + "\n" in text
    assert "more)" not in text


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


# -- survivors of the rerun of 8c2c5ed's changed loader functions (read_location, materialize, gk.models.load,
# -- MomentNet.load; twelfth session) --------------------------------------------------------------------------------
def _checkpoints_of_each_kind(folder):
    """A small file of each kind gk.models.load builds on the meta device, with the options it needs."""
    torch.manual_seed(0)
    ddpm = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1)
    torch.save({"ema_model": ddpm.state_dict()}, folder / "ddpm.pt")
    torch.save(gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                            attention_resolutions=(), channel_mult=(1, 2)).state_dict(), folder / "iddpm.pt")
    torch.save(gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(),
                            resolution=8).state_dict(), folder / "ddim.pt")
    gm.MomentNet(ddpm).save_heads(folder / "heads.pt")
    return {"pytorch-ddpm": (folder / "ddpm.pt", {}), "improved-diffusion": (folder / "iddpm.pt", {}),
            "ddim": (folder / "ddim.pt", {"resolution": 8}),
            "gms-heads": (folder / "heads.pt", {"backbone": folder / "ddpm.pt"})}


@pytest.mark.parametrize("kind", ["pytorch-ddpm", "improved-diffusion", "ddim", "gms-heads"])
def test_gk_models_load_hands_map_location_meta_to_each_kinds_loader(tmp_path, kind):
    """gk.models.load reads the file onto the CPU for map_location='meta' but builds the model on meta: the
    loader of each kind gets map_location itself (with None in its place the model came back on the CPU,
    as map_location=None now means), and a heads file's backbone goes to meta with its heads."""
    path, options = _checkpoints_of_each_kind(tmp_path)[kind]
    for device in ("meta", torch.device("meta")):
        model = gm.load(path, map_location=device, **options)
        assert {t.device.type for t in model.state_dict().values()} == {"meta"}, (kind, device)


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


# -- survivors of the rerun of b89527d's changed loader functions (read_location, materialize, no_cuda, _placed,
# -- gk.models.load; twelfth session) --------------------------------------------------------------------------------
def test_a_diffusers_directory_onto_a_missing_cuda_device_names_the_directory(tmp_path, monkeypatch):
    """gk.models.load(directory, map_location='cuda') without CUDA (reported missing here, so that the check does
    not depend on the machine) gives the package's message starting with the directory it was asked to load,
    as for a file (with None in the path's place the message began 'None: map_location=...')."""
    import re

    from diffusers import UNet2DModel

    torch.manual_seed(0)
    UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "UpBlock2D")).save_pretrained(tmp_path / "unet")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="^" + re.escape(f"{tmp_path / 'unet'}: map_location='cuda' asks for a "
                                                         "CUDA device, but this machine has none")):
        gm.load(tmp_path / "unet", map_location="cuda")
