"""Tests written for mutants of gms_kernels/models/*.py that survived a sampled mutation run (issue 25
item 7, benchmarks/results/mutation-models.md): each pins a default, a value, a file location or a
round trip that no other test did, against expected values computed here independently.
They are quick (a fraction of a second each, the tiny diffusers UNets included)."""
from __future__ import annotations

import json
import pickle
import re
import warnings

import numpy as np
import pytest
import torch

import gms_kernels as gk
import gms_kernels.models as gm
from gms_kernels.models import _common
from gms_kernels.models.diffusers_unet import scheduler_config_near
from gms_kernels.models.loading import _diffusers_schedule


# -- the lazy names of gms_kernels.models -----------------------------------------------------------
def test_lazy_export_names_resolve_on_the_package():
    """gm.export_diffusers and gm.GMSDiffusersModel are listed in __all__ and imported on first use."""
    from gms_kernels.models import diffusers_export

    assert gm.GMSDiffusersModel is diffusers_export.GMSDiffusersModel
    assert gm.export_diffusers is diffusers_export.export_diffusers
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        gm.no_such_name  # noqa: B018


# -- unreadable checkpoint files --------------------------------------------------------------------
def test_unreadable_message_names_the_error_type_and_the_inner_unpickler_error(tmp_path):
    """The ValueError for an unreadable file names the exception type and, for a weights-only unpickler
    error, only its inner reason (not torch's long preamble)."""
    path = tmp_path / "bad.pt"
    path.write_bytes(b"not a checkpoint at all")
    err = pickle.UnpicklingError("Weights only load failed. A long preamble about torch 2.6. "
                                 "WeightsUnpickler error: Unsupported operand 149\n\nCheck the file.")
    text = str(_common._unreadable(str(path), 23, err))
    assert "(23 bytes; UnpicklingError: Unsupported operand 149)" in text
    assert "preamble" not in text
    assert "Unsupported operand 149): it is truncated, corrupted or not a torch checkpoint. Download or save" in text
    # a real truncated torch zip file: torch's RuntimeError is named, with the truncation hint
    torch.save({"w": torch.ones(64)}, tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"bytes; RuntimeError: PytorchStreamReader.*looks truncated"):
        _common.read_torch_file(tmp_path / "cut.pt")


# -- a diffusers pipeline's scheduler config --------------------------------------------------------
def write_config(folder, cfg):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scheduler_config.json").write_text(json.dumps(cfg))


def schedule_of(tmp_path, cfg):
    """_diffusers_schedule for a pipeline directory tmp_path/pipe with unet/ and scheduler/ folders."""
    write_config(tmp_path / "pipe" / "scheduler", cfg)
    (tmp_path / "pipe" / "unet").mkdir(exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no warning for an eps-prediction config
        return _diffusers_schedule(str(tmp_path / "pipe"), "unet")


def test_diffusers_schedule_defaults_are_ddpm_linear_1000(tmp_path):
    """A scheduler config that names nothing is DDPMScheduler's default: linear, T = 1000, 1e-4 .. 0.02."""
    s = schedule_of(tmp_path, {"_class_name": "DDPMScheduler"})
    assert s.T == 1000
    np.testing.assert_allclose(s.betas.numpy(), np.linspace(1e-4, 0.02, 1000), rtol=1e-12, atol=0)
    s = schedule_of(tmp_path, {"num_train_timesteps": 20, "beta_end": 0.05})
    np.testing.assert_allclose(s.betas.numpy(), np.linspace(1e-4, 0.05, 20), rtol=1e-12, atol=0)


def test_diffusers_schedule_scaled_linear_cosine_and_trained_betas(tmp_path):
    """scaled_linear: betas = linspace(sqrt(b0), sqrt(b1), T)^2 in float64; squaredcos_cap_v2: the cosine
    schedule (checked against diffusers' own DDPMScheduler); trained_betas win over the named kind."""
    from diffusers import DDPMScheduler

    cfg = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012, "num_train_timesteps": 50}
    s = schedule_of(tmp_path, cfg)
    expected = np.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 50) ** 2
    np.testing.assert_allclose(s.betas.numpy(), expected, rtol=1e-12, atol=0)
    np.testing.assert_allclose(s.betas.numpy(), DDPMScheduler(**cfg).betas.numpy(), rtol=1e-6)
    cfg = {"beta_schedule": "squaredcos_cap_v2", "num_train_timesteps": 100}
    np.testing.assert_allclose(schedule_of(tmp_path, cfg).betas.numpy(), DDPMScheduler(**cfg).betas.numpy(),
                               rtol=1e-5)
    betas = [0.01 * (i + 1) for i in range(10)]
    s = schedule_of(tmp_path, {"beta_schedule": "linear", "trained_betas": betas, "num_train_timesteps": 10})
    assert s.betas.tolist() == pytest.approx(betas, rel=1e-15)
    assert schedule_of(tmp_path, {"beta_schedule": "laplace"}) is None


def test_diffusers_schedule_warns_only_for_a_non_eps_prediction(tmp_path):
    write_config(tmp_path / "pipe" / "scheduler", {"prediction_type": "v_prediction"})
    with pytest.warns(UserWarning, match="prediction_type='v_prediction'"):
        assert _diffusers_schedule(str(tmp_path / "pipe"), "unet").T == 1000
    # absent or "epsilon": no warning (schedule_of turns warnings into errors)
    assert schedule_of(tmp_path, {"prediction_type": "epsilon"}).T == 1000
    assert schedule_of(tmp_path, {}).T == 1000


def test_scheduler_config_is_also_read_from_the_model_folder_itself(tmp_path):
    """Without a sibling scheduler/ folder, a scheduler_config.json inside the UNet folder is read (both by
    the schedule and by the variance-type lookup); the sibling folder comes first when both exist."""
    unet_dir = tmp_path / "unet"
    write_config(unet_dir, {"num_train_timesteps": 30, "variance_type": "fixed_large"})
    assert scheduler_config_near(str(unet_dir), None)["variance_type"] == "fixed_large"
    assert _diffusers_schedule(str(unet_dir), None).T == 30
    write_config(tmp_path / "scheduler", {"num_train_timesteps": 40, "variance_type": "learned"})
    assert scheduler_config_near(str(unet_dir), None)["variance_type"] == "learned"
    assert _diffusers_schedule(str(unet_dir), None).T == 40


# -- diffusers backbones: export and MomentNet round trips --------------------------------------------
def tiny_unet(out_channels, seed=0):
    from diffusers import UNet2DModel

    torch.manual_seed(seed)
    unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=out_channels, layers_per_block=1,
                       block_out_channels=(8, 16), norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D"))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in unet.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return unet.eval()


def test_a_raw_unet2dmodel_is_described_as_a_diffusers_backbone():
    """network_spec / backbone_family wrap a bare UNet2DModel (no gk wrapper) as a DiffusersUNet, and the
    description rebuilds a DiffusersUNet of the same architecture that reads eps alone."""
    from gms_kernels.integrations.diffusers_export import backbone_family, build_network, network_spec

    unet = tiny_unet(6)
    spec = network_spec(unet, heads=1)  # (out_channels = 2C: eps alone, or two heads, is said explicitly)
    assert spec["type"] == "backbone" and spec["backbone"]["family"] == "diffusers"
    assert spec["backbone"]["config"]["block_out_channels"] == [8, 16] and backbone_family(unet) == "diffusers"
    assert "_use_default_values" in unet.config  # diffusers' private entries stay out of the description
    assert not [k for k in spec["backbone"]["config"] if k.startswith("_")]
    rebuilt = build_network(spec)
    assert isinstance(rebuilt, gm.DiffusersUNet) and rebuilt.eps_only is True
    assert rebuilt.state_dict()["unet.conv_out.weight"].shape == unet.conv_out.weight.shape


def test_moment_net_file_keeps_a_diffusers_backbones_eps_only(tmp_path):
    """MomentNet.save stores the DiffusersUNet's eps_only, and MomentNet.load restores it: a 9-channel UNet
    forced to eps_only=True stays so (the default for 9 channels would be False)."""
    backbone = gm.DiffusersUNet(tiny_unet(9), eps_only=True)
    gm.MomentNet(backbone).save(tmp_path / "net.pt")
    loaded = gm.load(tmp_path / "net.pt")
    assert loaded.backbone.eps_only is True
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        assert loaded.backbone(x, torch.tensor([3])).shape == (1, 3, 8, 8)


# -- checkpoint loaders --------------------------------------------------------------------------------
def tiny_ddpm_state():
    torch.manual_seed(0)
    return gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).state_dict()


def tiny_iddpm():
    torch.manual_seed(0)
    return gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=6, num_res_blocks=1, attention_resolutions=(2,),
                        dropout=0.0, channel_mult=(1, 2), num_heads=2, use_scale_shift_norm=True).eval()


def test_a_checkpoint_without_the_asked_weights_names_the_option_that_loads_the_other(tmp_path):
    sd = tiny_ddpm_state()
    torch.save({"net_model": sd}, tmp_path / "net_only.pt")
    with pytest.raises(ValueError, match=r"no 'ema_model' .*pass use_ema=False to load 'net_model'"):
        gm.load(tmp_path / "net_only.pt")
    torch.save({"ema_model": sd}, tmp_path / "ema_only.pt")
    with pytest.raises(ValueError, match=r"no 'net_model' .*pass use_ema=True to load 'ema_model'"):
        gm.load(tmp_path / "ema_only.pt", use_ema=False)


def test_a_wrong_rank_tensor_is_reported_as_a_wrong_shape(tmp_path):
    """A file whose head.weight is 1-D: the config is still read from the other entries and the error
    names the shape (an IndexError from reading axis 1 of a 1-D tensor would be a crash)."""
    sd = tiny_ddpm_state()
    torch.save({**sd, "head.weight": torch.zeros(32)}, tmp_path / "rank.pt")
    with pytest.raises(ValueError, match=r"head\.weight: expected \[32, 3, 3, 3\], found \[32\]"):
        gm.load(tmp_path / "rank.pt")


def test_improved_diffusion_loader_sets_the_given_schedule(tmp_path):
    torch.save(tiny_iddpm().state_dict(), tmp_path / "iddpm.pt")
    schedule = gk.Schedule.linear(50)
    loaded = gm.load(tmp_path / "iddpm.pt", num_heads=2, schedule=schedule)
    assert loaded.schedule is schedule
    with pytest.raises(ValueError, match="schedule must be a gk.Schedule, got str"):
        gm.load(tmp_path / "iddpm.pt", num_heads=2, schedule="linear")


def test_export_keeps_the_heads_dropout_the_backbones_eps_only_and_the_default_T(tmp_path):
    """The exported description rebuilds the MomentNet exactly: head dropout, and a diffusers backbone's
    forced eps_only; with no schedule anywhere the config says T = 1000, as the scheduler written with it."""
    backbone = gm.DiffusersUNet(tiny_unet(9), eps_only=True)
    assert backbone.schedule is None and not hasattr(backbone, "T")
    net = gm.MomentNet(backbone, head="res_conv", dropout=0.25).eval()
    gm.export_diffusers(net, tmp_path, solver="gms")
    config = json.loads((tmp_path / "unet" / "config.json").read_text())
    sched = json.loads((tmp_path / "scheduler" / "scheduler_config.json").read_text())
    assert config["num_train_timesteps"] == 1000 == sched["num_train_timesteps"]
    loaded = gm.load(tmp_path)
    assert loaded.dropout == 0.25 and loaded.heads["2"].res.dropout.p == 0.25
    assert loaded.backbone.eps_only is True


def test_export_refuses_weights_that_the_description_cannot_rebuild(tmp_path):
    """The exported weights are the network's own, key for key: an entry the rebuilt architecture lacks
    (here an extra buffer) is an error, not silently dropped."""
    torch.manual_seed(0)
    net = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    net.register_buffer("extra", torch.zeros(1))
    with pytest.raises(RuntimeError, match='Unexpected key.*"extra"'):
        gm.export_diffusers(net, tmp_path, sample_size=8, solver="ddpm")


@pytest.mark.parametrize("dropped, n_missing", [
    (("time_embedding.timembedding.0.weight", "time_embedding.timembedding.1.weight",
      "time_embedding.timembedding.3.weight"), 3),           # ch from head.weight, T the default
    (("head.weight", "tail.2.weight"), 2),                     # in_channels from tail.2.bias
])
def test_an_incomplete_pytorch_ddpm_file_is_compared_with_its_own_architecture(tmp_path, dropped, n_missing):
    """infer_config reads each argument from several entries, so a file with a few entries missing is
    compared with the architecture it came from: the error names just the missing keys, no wrong shapes."""
    sd = tiny_ddpm_state()
    torch.save({k: v for k, v in sd.items() if k not in dropped}, tmp_path / "part.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "part.pt")
    msg = str(err.value)
    assert f"missing keys ({n_missing})" in msg and "wrong shapes" not in msg and "unexpected keys" not in msg
    assert "resembles PytorchDDPMUNet(" in msg and "ch=32" in msg and "ch_mult=[1, 2]" in msg


@pytest.mark.parametrize("case", ["no down blocks", "a gap in the down blocks", "no in_channels entry"])
def test_a_state_dict_that_is_no_pytorch_ddpm_unet_is_reported_as_such(tmp_path, case):
    """When the architecture cannot be read from the file, the loader says so (compared with the default
    constructor), rather than failing inside the config reader."""
    sd = tiny_ddpm_state()
    if case == "no down blocks":
        sd = {k: v for k, v in sd.items() if not k.startswith("downblocks.")}
    elif case == "a gap in the down blocks":
        sd = {k: v for k, v in sd.items() if not k.startswith("downblocks.1.")}
    else:
        sd = {k: v for k, v in sd.items() if k not in ("head.weight", "tail.2.weight", "tail.2.bias")}
    assert gm.PytorchDDPMUNet.infer_config(sd) is None
    torch.save(sd, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match="do not look like a pytorch-ddpm PytorchDDPMUNet state dict"):
        gm.load(tmp_path / "odd.pt", kind="pytorch-ddpm")


def test_a_long_shape_list_is_cut_at_eight_with_the_rest_counted():
    shapes = [(f"k{i}", [i], [i + 1]) for i in range(11)]
    text = _common.mismatch_message("head:", [], [], shapes, "fix it")
    assert "wrong shapes (11): k0: expected [0], found [1]; " in text
    assert text.count("expected") == 8 and "k7: expected [7], found [8]; ... (3 more)" in text
    assert "more)" not in _common.mismatch_message("head:", [], [], shapes[:8], "fix it")


def tiny_ddim(seed):
    torch.manual_seed(seed)
    return gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(4,), resolution=8).eval()


def test_ddim_loader_reads_the_ema_weights_by_default_and_names_its_kind(tmp_path):
    ema, net = tiny_ddim(0), tiny_ddim(1)
    torch.save({"ema_model": ema.state_dict(), "net_model": net.state_dict()}, tmp_path / "ddim.pt")
    x, t = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3)), torch.tensor([17])
    with torch.no_grad():
        assert not torch.equal(ema(x, t), net(x, t))
        assert torch.equal(gm.load(tmp_path / "ddim.pt", resolution=8)(x, t), ema(x, t))
        assert torch.equal(gm.load(tmp_path / "ddim.pt", resolution=8, use_ema=False)(x, t), net(x, t))
    with pytest.raises(ValueError, match="unknown option\\(s\\) for kind 'ddim': colour"):
        gm.load(tmp_path / "ddim.pt", kind="ddim", colour=1)


def test_diffusers_folder_with_bin_weights_or_no_class_name_loads(tmp_path):
    """A UNet folder saved as .bin (safe_serialization=False) loads, and so does a config.json without
    _class_name (UNet2DModel is assumed)."""
    unet = tiny_unet(3)
    unet.save_pretrained(tmp_path / "bin", safe_serialization=False)
    assert sorted(p.name for p in (tmp_path / "bin").iterdir()) == ["config.json", "diffusion_pytorch_model.bin"]
    cfg = json.loads((tmp_path / "bin" / "config.json").read_text())
    del cfg["_class_name"]
    (tmp_path / "bin" / "config.json").write_text(json.dumps(cfg))
    x, t = torch.randn(1, 3, 8, 8), torch.tensor([9])
    with torch.no_grad():
        assert torch.equal(gm.load(tmp_path / "bin")(x, t), unet(x, t).sample)


@pytest.mark.parametrize("config, named", [({"_class_name": "VQModel"}, "'VQModel'"),
                                           ([1, 2], "'list'")])
def test_diffusers_folder_of_another_model_names_what_it_holds(tmp_path, config, named):
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=f"config.json describes {named}, not a UNet2DModel"):
        gm.load(folder)


@pytest.mark.parametrize("edit, listed", [("drop", "missing keys (1): conv_out.bias"),
                                          ("add", "unexpected keys (1): extra.weight")])
def test_diffusers_weights_with_one_missing_or_one_extra_key_are_refused(tmp_path, edit, listed):
    """diffusers itself only logs a missing or an unused key (and initialises the missing one at random);
    the loader refuses either, alone."""
    from safetensors.torch import load_file, save_file

    tiny_unet(3).save_pretrained(tmp_path)
    file = tmp_path / "diffusion_pytorch_model.safetensors"
    state = load_file(file)
    if edit == "drop":
        del state["conv_out.bias"]
    else:
        state["extra.weight"] = torch.zeros(2)
    save_file(state, file)
    with pytest.raises(ValueError, match=re.escape(f"the weights do not match config.json:\n  {listed}\n")):
        gm.load(tmp_path)


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


def test_a_network_description_without_heads_settings_gets_the_defaults():
    from gms_kernels.integrations.diffusers_export import build_network, network_spec

    torch.manual_seed(0)
    spec = network_spec(gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1))
    net = build_network({"type": "moment-net", "backbone": spec["backbone"], "heads": {}})
    assert isinstance(net, gm.MomentNet) and net.orders == (2, 3) and net.head == "conv"
    assert net.dropout == 0.0 and net.targets == "raw"


def test_ddim_time_embedding_of_an_odd_width_ends_in_one_zero():
    """The DDPM/DDIM sinusoids: sin(t w_k), cos(t w_k), w_k = 10000^(-k/(half-1)); an odd width gets one
    zero column at the end."""
    from gms_kernels.models.ddim_model import timestep_embedding

    t = torch.tensor([0.0, 3.0, 250.0])
    emb = timestep_embedding(t, 7)
    half = 3
    w = [10000.0 ** (-k / (half - 1)) for k in range(half)]
    expected = [[np.sin(s * wk) for wk in w] + [np.cos(s * wk) for wk in w] + [0.0] for s in t.tolist()]
    assert emb.shape == (3, 7)
    np.testing.assert_allclose(emb.numpy(), np.array(expected), rtol=0, atol=2e-5)


def test_ddim_resampling_without_convolutions_is_nearest_and_average_pooling():
    from gms_kernels.models.ddim_model import Downsample, Upsample

    x = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(1, 2, 4, 4)
    up = x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
    assert torch.equal(Upsample(2, with_conv=False)(x), up)
    down = x.reshape(1, 2, 2, 2, 2, 2).mean(dim=(3, 5))
    assert torch.equal(Downsample(2, with_conv=False)(x), down)
    torch.manual_seed(0)
    model = gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(4,), resolution=8,
                         resamp_with_conv=False).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 8, 8), torch.tensor([5])).shape == (1, 3, 8, 8)


def test_pytorch_ddpm_refuses_an_attention_level_past_the_last():
    with pytest.raises(ValueError, match=r"attn levels \[2\] are out of range for ch_mult=\(1, 2\) \(levels 0..1\)"):
        gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(2,), num_res_blocks=1)


def test_group_count_and_the_moment_heads_group_norm():
    """group_count: the largest divisor of the width that is <= 32; the conv head normalises over that
    many groups (checked against a hand-written GroupNorm -> SiLU -> conv)."""
    from gms_kernels.models._common import group_count

    assert [group_count(c) for c in (1, 7, 16, 32, 33, 48, 64, 96, 100)] == [1, 7, 16, 32, 11, 24, 32, 32, 25]
    head = gm.ConvHead(48, 3)
    assert head.norm.num_groups == 24
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    h = torch.randn(2, 48, 4, 4, generator=g, dtype=torch.float64)
    head = head.double()
    grouped = h.reshape(2, 24, -1)
    normed = ((grouped - grouped.mean(-1, keepdim=True)) / (grouped.var(-1, unbiased=False, keepdim=True)
                                                            + head.norm.eps).sqrt()).reshape(h.shape)
    normed = normed * head.norm.weight[:, None, None] + head.norm.bias[:, None, None]
    expected = torch.nn.functional.conv2d(normed * torch.sigmoid(normed), head.conv.weight, head.conv.bias, padding=1)
    with torch.no_grad():
        torch.testing.assert_close(head(h), expected, rtol=1e-10, atol=1e-12)


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


def test_iddpm_resampling_without_convolutions_is_nearest_and_average_pooling():
    from gms_kernels.models.iddpm import _Down, _Up

    x = torch.arange(2 * 4 * 4, dtype=torch.float32).reshape(1, 2, 4, 4)
    assert torch.equal(_Up(2, use_conv=False)(x), x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3))
    assert torch.equal(_Down(2, use_conv=False)(x), x.reshape(1, 2, 2, 2, 2, 2).mean(dim=(3, 5)))
    torch.manual_seed(0)
    net = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1, attention_resolutions=(2,),
                       channel_mult=(1, 2), num_heads=2, conv_resample=False).eval()
    with torch.no_grad():
        assert net(torch.randn(1, 3, 8, 8), torch.tensor([3.5])).shape == (1, 3, 8, 8)


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


def fake_state(*keys, prefix=""):
    return {prefix + k: torch.zeros(1) for k in keys + ("other.weight",)}


IDDPM_MARKS = ("time_embed.0.weight", "input_blocks.0.0.weight")
DDPM_MARKS = ("time_embedding.timembedding.0.weight", "downblocks.0.block1.0.weight")


@pytest.mark.parametrize("data, kind", [
    ({"format": "gms_kernels.moment_heads"}, "gms-heads"),
    ({"format": "gms_kernels.moment_net"}, "moment-net"),
    *[({"ema_model": fake_state(k)}, "gms-official") for k in IDDPM_MARKS],
    ({"net_model": fake_state(*IDDPM_MARKS, prefix="module.")}, "gms-official"),
    ({"ema_model": fake_state("temb.dense.0.weight")}, "ddim"),
    ({"ema_model": fake_state(*DDPM_MARKS)}, "pytorch-ddpm"),
    *[(fake_state(k), "pytorch-ddpm") for k in DDPM_MARKS],
    *[(fake_state(k), "improved-diffusion") for k in IDDPM_MARKS],
    (fake_state("temb.dense.0.weight"), "ddim"),
    ([fake_state("temb.dense.0.weight", prefix="module."), {"state": {}}, 3], "ddim"),
])
def test_auto_detection_reads_the_format_tag_or_either_marker_key(data, kind):
    """Each family is recognised by either of its marker keys (a file missing one is still named by kind)."""
    from gms_kernels.models.loading import _detect

    assert _detect("f.pt", data) == kind


def test_auto_detection_points_diffusers_weights_to_their_directory():
    from gms_kernels.models.loading import _detect

    with pytest.raises(ValueError, match=r"f\.pt: these are diffusers UNet2DModel weights; load the directory"):
        _detect("f.pt", fake_state("conv_in.weight", "time_embedding.linear_1.weight"))
    for partial in (fake_state("conv_in.weight"), fake_state("time_embedding.linear_1.weight")):
        with pytest.raises(ValueError, match="cannot tell which network this file holds"):
            _detect("f.pt", partial)


def test_a_ddim_repository_list_gives_its_last_entry_as_ema_and_its_first_as_the_model(tmp_path):
    """The DDIM repository saves [model, optimizer, epoch, step, ema]: use_ema (default) reads the last entry,
    use_ema=False the first; a list without an EMA entry gives the first either way."""
    model, ema = tiny_ddim(0), tiny_ddim(1)
    optimizer = {"state": {}, "param_groups": []}
    torch.save([model.state_dict(), optimizer, 3, 1000, ema.state_dict()], tmp_path / "with_ema.pth")
    torch.save([model.state_dict(), optimizer, 3, 1000], tmp_path / "no_ema.pth")
    x, t = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(4)), torch.tensor([11])
    with torch.no_grad():
        assert not torch.equal(model(x, t), ema(x, t))
        assert torch.equal(gm.load(tmp_path / "with_ema.pth", resolution=8)(x, t), ema(x, t))
        assert torch.equal(gm.load(tmp_path / "with_ema.pth", resolution=8, use_ema=False)(x, t), model(x, t))
        assert torch.equal(gm.load(tmp_path / "no_ema.pth", resolution=8)(x, t), model(x, t))


def official_fixtures(family):
    from pathlib import Path

    folder = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "official_gms" / family
    if not folder.is_dir():  # (as in test_official_gms.py: the shared folder next to the working tree)
        folder = Path("/work/shared/fixtures/official_gms") / family
    return [folder / f"eps{i}.pt" for i in (1, 2, 3)], json.loads((folder / "config.json").read_text())


def test_official_ddim_files_with_a_wrong_config_suggest_the_gms_official_call():
    paths, cfg = official_fixtures("ddpm")
    cfg = {**cfg, "ch_mult": [1, 2, 2]}
    with pytest.raises(ValueError, match=r"fix: the weights match DDIMModel\(.*\): load with gk\.models\.load\(path, "
                                         r"kind='gms-official', ch_mult="):
        gm.load(paths, kind="gms-official", **cfg)


def test_official_files_with_the_other_familys_options_name_the_first_file():
    (iddpm, cfg_i), (ddim, cfg_d) = official_fixtures("iddpm"), official_fixtures("ddpm")
    with pytest.raises(ValueError, match=r"iddpm/eps1\.pt \[ema_model\]: holds an improved-diffusion network, but the "
                                         r"option\(s\) ch, out_ch"):
        gm.load(iddpm, kind="gms-official", **cfg_d)
    with pytest.raises(ValueError, match=r"ddpm/eps1\.pt \[ema_model\]: holds a ddim network, but the option\(s\) "
                                         r"model_channels, out_channels"):
        gm.load(ddim, kind="gms-official", **cfg_i)


def test_official_head_of_no_known_mode_lists_its_first_ten_keys():
    from gms_kernels.models.official_gms import detect_mode

    head = {f"k{i:02d}.weight": torch.zeros(1) for i in range(12)}
    shown = ", ".join(f"out2.k{i:02d}.weight" for i in range(10))
    with pytest.raises(ValueError, match=re.escape(f"w: the head keys match no official improved-diffusion head mode "
                                                   f"(simple, complex, complex2); found 12: {shown}") + "$"):
        detect_mode("improved-diffusion", head, tiny_iddpm(), "w")


@pytest.mark.parametrize("name", ["diffusion_pytorch_model.safetensors", "config.json"])
def test_a_diffusers_weights_or_config_file_loads_its_folder(tmp_path, name):
    unet = tiny_unet(3)
    unet.save_pretrained(tmp_path / "unet")
    x, t = torch.randn(1, 3, 8, 8), torch.tensor([21])
    with torch.no_grad():
        # not bit-equal: the same weights read from a .safetensors file can differ from the in-memory ones in the
        # last bits of a convolution's output (seen with torch 2.13 on AMD EPYC: 8e-7 with plain from_pretrained too)
        torch.testing.assert_close(gm.load(tmp_path / "unet" / name)(x, t), unet(x, t).sample, rtol=0, atol=1e-5)


def test_loader_hints_for_an_edited_file_and_an_unbuildable_config(tmp_path):
    sd = tiny_ddpm_state()
    torch.save({**sd, "foo.weight": torch.zeros(3)}, tmp_path / "extra.pt")
    with pytest.raises(ValueError, match=r"(?s)unexpected keys \(1\): foo\.weight\n  fix: the file resembles "
                                         r"PytorchDDPMUNet\(.*ch=32.*\) but is incomplete or edited"):
        gm.load(tmp_path / "extra.pt")
    # a constructor error on a file whose architecture cannot be read: the error alone, no guessed config
    odd = {k: v for k, v in sd.items() if not k.startswith("downblocks.")}
    torch.save(odd, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match=r"odd\.pt: cannot build PytorchDDPMUNet\(attn=\[7\]\): attn levels \[7\] are "
                                         r"out of range .*\(levels 0\.\.3\)\.$"):
        gm.load(tmp_path / "odd.pt", kind="pytorch-ddpm", attn=[7])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_group_norm32_of_a_half_precision_module_normalises_in_float32(dtype):
    """A 16-bit GroupNorm32 (weights and input in 16 bits) computes in float32 and returns 16 bits: the
    result is the float32 normalisation of the 16-bit input, rounded once."""
    norm = _common.GroupNorm32(2, 4)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.5, -0.5, 2.0, 0.25]))
        norm.bias.copy_(torch.tensor([0.1, 0.2, -0.3, 0.0]))
    norm = norm.to(dtype)
    x = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(0)).to(dtype)
    g = x.float().reshape(2, 2, -1)
    ref = ((g - g.mean(-1, keepdim=True)) / (g.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()).reshape(x.shape)
    ref = ref * norm.weight.float()[:, None, None] + norm.bias.float()[:, None, None]
    out = norm(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.to(dtype).float(), rtol=0, atol=float(torch.finfo(dtype).eps) * 4)


@pytest.mark.parametrize("preset, attention, dropout, mult", [
    ("cifar10_cosine", [2, 4], 0.3, [1, 2, 2, 2]), ("imagenet64", [4, 8], 0.0, [1, 2, 3, 4])])
def test_improved_diffusion_presets_are_the_released_configs(preset, attention, dropout, mult):
    """improved-diffusion's released CIFAR10 / ImageNet-64 flags: 128 channels, 3 blocks, 4 heads (upsampling
    heads = num_heads, i.e. -1), scale-shift norm, learned sigma (6 outputs), the cosine schedule over 4000 steps."""
    with torch.device("meta"):
        net = getattr(gm.IDDPMUNet, preset)()
    assert net.config == {"in_channels": 3, "model_channels": 128, "out_channels": 6, "num_res_blocks": 3,
                          "attention_resolutions": attention, "dropout": dropout, "channel_mult": mult,
                          "conv_resample": True, "num_heads": 4, "num_heads_upsample": -1,
                          "use_scale_shift_norm": True}
    assert torch.equal(net.schedule.betas, gk.Schedule.cosine(4000).betas)


def test_pytorch_ddpm_and_improved_diffusion_loaders_take_their_options(tmp_path):
    torch.save({"ema_model": tiny_ddpm_state()}, tmp_path / "ddpm.pt")
    schedule = gk.Schedule.linear(50, 1e-3, 0.05)
    assert gm.load(tmp_path / "ddpm.pt", schedule=schedule).schedule is schedule
    torch.save(tiny_iddpm().state_dict(), tmp_path / "iddpm.pt")
    with pytest.raises(ValueError, match=r"unknown option\(s\) for kind 'improved-diffusion': colour; valid: "
                                         r"in_channels, .*, eps_only, schedule$"):
        gm.load(tmp_path / "iddpm.pt", colour=1)


def test_a_backbone_config_that_json_cannot_hold_is_named_in_the_export_error():
    from gms_kernels.integrations.diffusers_export import network_spec

    class Odd(torch.nn.Module):
        family = "pytorch-ddpm"
        config = {"T": object()}

    with pytest.raises(TypeError, match=r"the pytorch-ddpm backbone config\['T'\]"):
        network_spec(Odd())


def test_ddim_model_takes_a_scalar_time_for_the_whole_batch():
    model = tiny_ddim(0)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.equal(model(x, 5), model(x, torch.tensor([5, 5])))
        assert torch.equal(model(x, torch.tensor(5)), model(x, torch.tensor([5, 5])))


def test_heads_loader_options_and_central_targets(tmp_path):
    torch.manual_seed(0)
    backbone = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    gm.MomentNet(backbone, targets="central").save_heads(tmp_path / "heads.pt")
    assert gm.MomentNet.from_heads(backbone, tmp_path / "heads.pt").targets == "central"
    with pytest.raises(ValueError, match=r"unknown option\(s\) for kind 'gms-heads': colour; valid: backbone$"):
        gm.load(tmp_path / "heads.pt", backbone=backbone, colour=1)


def test_diffusers_variant_weights_are_read_when_asked(tmp_path):
    unet = tiny_unet(3)
    unet.save_pretrained(tmp_path, variant="ema")
    assert (tmp_path / "diffusion_pytorch_model.ema.safetensors").is_file()
    assert not (tmp_path / "diffusion_pytorch_model.safetensors").exists()
    x, t = torch.randn(1, 3, 8, 8), torch.tensor([13])
    with torch.no_grad():
        torch.testing.assert_close(gm.load(tmp_path, variant="ema")(x, t), unet(x, t).sample, rtol=0, atol=1e-5)


def test_pytorch_ddpm_sinusoid_table_is_frozen():
    """pytorch-ddpm's TimeEmbedding holds its sinusoid table in a frozen nn.Embedding (freeze=True): training
    the UNet never changes it."""
    net = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1)
    table = net.time_embedding.timembedding[0].weight
    assert not table.requires_grad
    assert all(p.requires_grad for n, p in net.named_parameters() if n != "time_embedding.timembedding.0.weight")


def test_pytorch_ddpm_initialisation_is_glorot_with_near_zero_branch_ends():
    """pytorch-ddpm's init: Glorot-uniform weights, zero biases; the convs closing a residual branch, the
    attention projection and the output conv get gain 1e-5 (the network starts near zero)."""
    torch.manual_seed(0)
    net = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1)

    def bound(w, gain):  # xavier_uniform_: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out))
        field = w[0][0].numel()
        return gain * (6.0 / (w.shape[1] * field + w.shape[0] * field)) ** 0.5

    tail = net.tail[-1].weight
    assert tail.abs().max() <= bound(tail, 1e-5) and tail.abs().max() > 0.5 * bound(tail, 1e-5)
    head = net.head.weight
    assert head.abs().max() <= bound(head, 1.0) and head.abs().max() > 0.5 * bound(head, 1.0)
    assert all((m.bias == 0).all() for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))


def test_an_unreadable_safetensors_file_reports_its_size(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError, match=r"bad\.safetensors: cannot read this file as a torch checkpoint \(10 bytes; "
                                         r"SafetensorError: Error while deserializing header"):  # (safetensors' reason)
        _common.read_weights_file(bad)


# -- survivors of the third (seed 2) sample, at HEAD ------------------------------------------------
def test_iddpm_infer_config_gives_integer_channel_mults_and_refuses_uneven_levels():
    """channel_mult comes back as ints (1.0 == 1 would pass an equality test, not a config round trip),
    and a state dict whose levels hold different numbers of res blocks is not an IDDPMUNet of any config."""
    net = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=2, attention_resolutions=(),
                       dropout=0.0, channel_mult=(1, 2), num_heads=1, use_scale_shift_norm=False)
    sd = net.state_dict()
    cfg = gm.IDDPMUNet.infer_config(sd)
    assert cfg["channel_mult"] == [1, 2] and all(type(m) is int for m in cfg["channel_mult"])
    assert cfg["num_res_blocks"] == 2
    # input blocks: 0 conv, 1-2 level 0, 3 downsample, 4-5 level 1; without block 5 level 1 has one block
    uneven = {k: v for k, v in sd.items() if not k.startswith("input_blocks.5.")}
    assert gm.IDDPMUNet.infer_config(uneven) is None


def test_first_difference_reports_a_key_only_the_other_file_has():
    from gms_kernels.models.official_gms import first_difference

    ref = {"a": torch.zeros(2), "b": torch.ones(3)}
    assert first_difference(ref, dict(ref), 0.0) is None
    assert first_difference(ref, {**ref, "c": torch.zeros(1)}, 0.0) == ("c", "not in the eps network")


def test_the_legacy_head_out_ch_option_is_checked_like_head_out_channels():
    """The official configs spell the heads' output width head_out_ch (older) or head_out_channels; both
    are read, and a width other than the data's channels is refused under either name."""
    from test_official_gms import config, files

    cfg = {k: v for k, v in config("iddpm").items() if k not in ("head_out_channels", "head_out_ch")}
    for name in ("head_out_channels", "head_out_ch"):
        with pytest.raises(ValueError, match=r"head_out_channels=7: the heads must return the 3 data channels"):
            gm.load(files("iddpm"), kind="gms-official", **cfg, **{name: 7})
    net = gm.load(files("iddpm"), kind="gms-official", **cfg, head_out_ch=3)
    assert isinstance(net, gm.MomentNet)


def test_a_config_that_does_not_fit_official_weights_names_the_kind_to_load_with():
    from test_official_gms import config, files

    with pytest.raises(ValueError, match=r"load with gk\.models\.load\(path, kind='gms-official', model_channels=32\)"):
        gm.load(files("iddpm"), kind="gms-official", **{**config("iddpm"), "model_channels": 64})


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


def test_an_exported_network_saved_as_a_variant_loads_by_that_variant(tmp_path):
    """load_exported hands ``variant`` to diffusers: the fp16-named weights file is the one read."""
    net = gm.MomentNet(tiny_iddpm(), head="conv")
    model = gm.GMSDiffusersModel.from_network(net, sample_size=8)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # (weights that differ from a fresh build)
    model.save_pretrained(tmp_path, variant="ema", safe_serialization=True)
    assert (tmp_path / "diffusion_pytorch_model.ema.safetensors").exists()
    from gms_kernels.integrations.diffusers_export import load_exported

    loaded = load_exported(tmp_path, variant="ema")
    for (name, a), (_, b) in zip(model.net.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_networks_take_one_timestep_for_the_whole_batch():
    """A Python int or 0-d tensor timestep means the same step for every sample (as diffusers' pipelines
    pass it): the output equals that of the timestep repeated per sample."""
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))  # (4 samples of 3 channels: N != C)
    every = torch.full((4,), 7)
    ddpm = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    iddpm = tiny_iddpm()
    exported = gm.GMSDiffusersModel.from_network(gm.MomentNet(iddpm, head="conv"), sample_size=8).eval()
    with torch.no_grad():
        assert torch.equal(ddpm(x, 7), ddpm(x, every))
        assert torch.equal(ddpm(x, torch.tensor(7)), ddpm(x, every))
        assert torch.equal(iddpm(x, torch.tensor(7)), iddpm(x, every))
        assert torch.equal(exported(x, torch.tensor(7)).sample, exported(x, every).sample)


def test_error_texts_name_a_heads_file_and_an_unnamed_diffusers_unet(tmp_path):
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    net = gm.MomentNet(tiny_iddpm(), head="conv")
    with pytest.raises(ValueError, match=r"other\.pt: not a heads file \(MomentNet\.save_heads\): expected format tag"):
        net.load_heads(tmp_path / "other.pt")
    hint = gm.DiffusersUNet(tiny_unet(3)).heads_hint  # (built in memory: no folder to name)
    assert hint.startswith("the diffusers UNet2DModel: it gives 1 head(s) (3 output channels). ")


def test_a_refusal_without_a_named_global_says_so(tmp_path, monkeypatch):
    """torch's weights-only refusals that name no global (e.g. an object it cannot build) are reported as
    "something other than plain data", not by reading a class name that is not there."""
    torch.save({"w": torch.zeros(1)}, tmp_path / "odd.pt")
    refusal = pickle.UnpicklingError("Weights only load failed. WeightsUnpickler error: Can only build Tensor, "
                                     "Parameter, OrderedDict or types allowlisted via add_safe_globals, but got X")

    def refuse(*args, **kwargs):
        raise refusal

    monkeypatch.setattr(_common.torch, "load", refuse)
    with pytest.raises(ValueError, match=r"odd\.pt: the checkpoint holds something other than plain data that "
                                         r"torch\.load\(weights_only=True\) refuses"):
        _common.read_torch_file(tmp_path / "odd.pt")


def test_improved_diffusion_load_errors_name_the_file_and_the_class_the_weights_fit(tmp_path):
    sd = tiny_iddpm().state_dict()
    torch.save(sd, tmp_path / "iddpm.pt")
    # a config the constructor refuses: the hint names the architecture the weights describe
    with pytest.raises(ValueError, match=r"iddpm\.pt: cannot build IDDPMUNet\(.*model_channels=16.*\)\: .*"
                                         r"The weights look like IDDPMUNet\(.*model_channels=32"):
        gm.load(tmp_path / "iddpm.pt", kind="improved-diffusion", model_channels=16)
    # a config that builds but does not fit: the file is named first
    with pytest.raises(ValueError, match=r"^\S*iddpm\.pt.*do not match IDDPMUNet\(.*num_res_blocks=2"):
        gm.load(tmp_path / "iddpm.pt", kind="improved-diffusion", num_res_blocks=2)


def test_a_trainer_checkpoint_whose_weights_entry_is_not_a_state_dict_gets_a_clear_error(tmp_path):
    """{"ema_model": None} is detected as a pytorch-ddpm trainer file (its keys say so) and refused by
    that loader with what it found, not with a TypeError from reading its keys."""
    torch.save({"ema_model": None, "step": 1}, tmp_path / "broken.pt")
    with pytest.raises(ValueError, match=r"broken\.pt \[ema_model\]: expected a pytorch-ddpm checkpoint .* found NoneType"):
        gm.load(tmp_path / "broken.pt")


def test_gk_load_hands_the_variant_to_an_exported_network(tmp_path):
    net = gm.MomentNet(tiny_iddpm(), head="conv")
    model = gm.GMSDiffusersModel.from_network(net, sample_size=8)
    model.save_pretrained(tmp_path, variant="ema", safe_serialization=True)
    loaded = gm.load(tmp_path, variant="ema")
    assert all(torch.equal(a, b) for a, b in zip(model.net.state_dict().values(), loaded.state_dict().values()))


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


def test_the_official_loader_keeps_eps_of_its_backbone():
    """The official GMS code reads eps from its UNet (UNetModel3OutChannels drops a learned sigma): the
    loaded backbone is marked eps_only, whatever its output width."""
    from test_official_gms import config, files

    net = gm.load(files("iddpm"), kind="gms-official", **config("iddpm"))
    assert net.backbone.eps_only is True


def test_the_prediction_type_warning_points_at_the_users_load_call(tmp_path):
    write_config(tmp_path / "pipe" / "scheduler", {"prediction_type": "v_prediction"})
    tiny_unet(3).save_pretrained(tmp_path / "pipe" / "unet")
    with pytest.warns(UserWarning, match="prediction_type='v_prediction'") as caught:
        gm.load(tmp_path / "pipe", subfolder="unet")
    assert [w.filename for w in caught if "prediction_type" in str(w.message)] == [__file__]


def test_official_family_detection_tells_a_ddim_model_from_a_diffusers_unet():
    """family_of reads the backbone's keys: the DDIM repository's Model (temb.dense, or conv_in with
    mid.block_1), improved-diffusion, or neither. A diffusers UNet2DModel also has conv_in but no mid.block_1."""
    from gms_kernels.models.official_gms import family_of

    assert family_of(tiny_iddpm().state_dict()) == "improved-diffusion"
    assert family_of(tiny_unet(3).state_dict()) is None
    for key in ("time_embed.0.weight", "input_blocks.0.0.weight"):  # (either key alone says improved-diffusion)
        assert family_of({key: torch.zeros(1)}) == "improved-diffusion"
    ddim_like = {"conv_in.weight": torch.zeros(1), "mid.block_1.conv1.weight": torch.zeros(1)}
    assert family_of(ddim_like) == "ddim" and family_of({"temb.dense.0.weight": torch.zeros(1)}) == "ddim"


def test_a_saved_moment_net_records_its_format_version(tmp_path):
    from gms_kernels.models.moment_net import FORMAT_VERSION, NET_FORMAT

    gm.MomentNet(tiny_iddpm(), head="conv").save(tmp_path / "net.pt")
    data = torch.load(tmp_path / "net.pt", weights_only=True)
    assert data["format"] == NET_FORMAT and data["version"] == FORMAT_VERSION == 1


def test_a_safetensors_file_read_with_no_map_location_lands_on_the_cpu(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.arange(3.0)}, str(tmp_path / "w.safetensors"))
    data = _common.read_weights_file(tmp_path / "w.safetensors", map_location=None)
    assert data["w"].device.type == "cpu" and data["w"].tolist() == [0.0, 1.0, 2.0]


def test_one_official_file_given_alone_is_an_eps_network():
    """kind='gms-official' takes one path as well as a list of one (the eps network, no heads)."""
    from test_official_gms import config, files

    single = gm.load(files("iddpm")[0], kind="gms-official", **config("iddpm"))
    listed = gm.load(files("iddpm")[:1], kind="gms-official", **config("iddpm"))
    assert type(single) is type(listed)
    assert all(torch.equal(a, b) for a, b in zip(single.state_dict().values(), listed.state_dict().values()))


def test_a_unet_folder_with_its_own_config_wins_over_a_unet_subfolder(tmp_path):
    """A directory holding a UNet (config.json at its top) is that UNet, even beside a unet/ subfolder;
    only a folder without a top-level config.json is read as a pipeline."""
    tiny_unet(3).save_pretrained(tmp_path)
    tiny_unet(6).save_pretrained(tmp_path / "unet")
    assert gm.load(tmp_path).unet.config.out_channels == 3
    assert gm.load(tmp_path / "unet").unet.config.out_channels == 6


def test_a_weight_that_is_not_a_tensor_is_named_with_what_it_is(tmp_path):
    net = gm.MomentNet(tiny_iddpm(), head="conv")
    net.save_heads(tmp_path / "heads.pt")
    data = torch.load(tmp_path / "heads.pt", weights_only=True)
    key = next(iter(data["state_dict"]))
    data["state_dict"][key] = [1.0, 2.0]
    torch.save(data, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match=rf"{re.escape(key)}: expected \[[0-9, ]+\], found list"):
        net.load_heads(tmp_path / "odd.pt")


def test_a_ddim_model_loads_with_the_schedule_it_is_given():
    from test_official_gms import files

    schedule = gk.Schedule.linear(40)
    model = gm.load(files("ddpm")[0], kind="ddim", resolution=16, schedule=schedule)
    assert model.schedule is schedule


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


def test_a_mismatch_report_shows_eight_wrong_shapes_and_counts_the_rest():
    shapes = [(f"k{i}", [i], [i + 1]) for i in range(9)]
    text = _common.mismatch_message("head:", [], [], shapes, "do this")
    assert "  wrong shapes (9): k0: expected [0], found [1]; " in text and text.endswith("; ... (1 more)\n  fix: do this")
    assert "more" not in _common.mismatch_message("head:", [], [], shapes[:8], "do this")


def test_the_ddim_time_embedding_is_made_where_t_is():
    from gms_kernels.models.ddim_model import timestep_embedding

    emb = timestep_embedding(torch.arange(4, device="meta"), 32)  # (meta: a device other than the CPU, no data)
    assert emb.device.type == "meta" and emb.shape == (4, 32)


def test_ddim_load_errors_name_the_file():
    from test_official_gms import files

    with pytest.raises(ValueError, match=r"^\S*eps1\.pt \[ema_model\]: the weights do not match DDIMModel\(.*ch_mult=\[1, 2, 2\]"):
        gm.load(files("ddpm")[0], kind="ddim", resolution=16, ch_mult=[1, 2, 2])


def test_a_moment_net_file_without_weights_is_refused_by_name(tmp_path):
    gm.MomentNet(tiny_iddpm(), head="conv").save(tmp_path / "net.pt")
    data = torch.load(tmp_path / "net.pt", weights_only=True)
    data["state_dict"] = None
    torch.save(data, tmp_path / "empty.pt")
    with pytest.raises(ValueError, match=r"empty\.pt: the MomentNet file lacks a valid 'backbone' .* or 'state_dict'"):
        gm.load(tmp_path / "empty.pt")


def test_an_official_file_without_the_asked_weights_names_the_other_entry(tmp_path):
    from test_official_gms import config, files

    data = torch.load(files("iddpm")[0], weights_only=True)
    torch.save({"net_model": data["ema_model"]}, tmp_path / "net_only.pt")
    with pytest.raises(ValueError, match=r"net_only\.pt: the checkpoint has no 'ema_model' .* pass use_ema=False to "
                                         r"load 'net_model'"):
        gm.load([tmp_path / "net_only.pt"], kind="gms-official", **config("iddpm"))


def test_pytorch_ddpm_takes_integral_float_times_and_refuses_fractional_ones():
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    net = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    with torch.no_grad():
        assert torch.equal(net(x, torch.tensor([3.0, 4.0])), net(x, torch.tensor([3, 4])))
        with pytest.raises(ValueError, match="got fractional values"):
            net(x, torch.tensor([3.5, 4.0]))


def test_diffusers_load_failures_list_the_wrong_shapes_and_quote_diffusers(tmp_path):
    """A config.json that does not describe its weights lists each wrong shape; a weights file diffusers
    cannot read is reported with diffusers' own first line."""
    tiny_unet(3).save_pretrained(tmp_path / "edited")
    cfg = json.loads((tmp_path / "edited" / "config.json").read_text())
    (tmp_path / "edited" / "config.json").write_text(json.dumps({**cfg, "out_channels": 6}))
    with pytest.raises(ValueError, match=r"edited: config\.json does not describe the weights: wrong shapes \(2\): "
                                         r"conv_out\.weight: expected \[6, 8, 3, 3\] \(from config\.json\), found "
                                         r"\[3, 8, 3, 3\] \(weights file\); conv_out\.bias: expected \[6\]"):
        gm.load(tmp_path / "edited")
    tiny_unet(3).save_pretrained(tmp_path / "cut")
    weights = tmp_path / "cut" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cut: diffusers could not load the UNet2DModel \(OSError: Unable to load "
                                         r"weights from checkpoint file"):
        gm.load(tmp_path / "cut")


# -- eighth session: survivors of a full run at HEAD (benchmarks/results/mutation-models.md) -------------
def test_read_weights_file_passes_map_location_to_torch_load(tmp_path):
    """A torch file is read with the caller's map_location (here a function, which torch.load calls once
    per storage), not with the default."""
    torch.save({"w": torch.ones(3)}, tmp_path / "w.pt")
    seen = []

    def where(storage, location):
        seen.append(location)
        return storage

    assert torch.equal(_common.read_weights_file(tmp_path / "w.pt", map_location=where)["w"], torch.ones(3))
    assert seen == ["cpu"]


def test_a_state_dict_mismatch_counts_the_keys_it_leaves_out():
    """Past the first 8, the report says how many more keys are missing: 11 - 8 = 3."""
    net = torch.nn.Sequential(*[torch.nn.Linear(1, 1, bias=False) for _ in range(11)])
    text = str(_common.mismatch_message("net:", *_common.mismatch_report(net, {}), "fix it"))
    assert "missing keys (11): 0.weight, 1.weight, 2.weight, 3.weight, 4.weight, 5.weight, 6.weight, 7.weight, " \
           "... (3 more)" in text


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


@pytest.mark.parametrize("kind", ["ddim-complex", "iddpm-complex"])
def test_official_heads_take_the_dropout_they_are_given(kind):
    backbone = tiny_ddim(0) if kind.startswith("ddim") else tiny_iddpm()
    head = gm.official_heads.build_official_head(kind, backbone, 3, 0.375)
    assert sorted({m.p for m in head.modules() if isinstance(m, torch.nn.Dropout)}) == [0.375]


def test_read_weights_file_reads_safetensors_with_safetensors(tmp_path, monkeypatch):
    """A .safetensors file goes to safetensors' reader, never to torch.load: torch.load reads that format only
    since torch 2.13 (where it hands the file to safetensors itself), and the package supports torch >= 2.1."""
    from safetensors.torch import save_file

    save_file({"w": torch.arange(3.0)}, str(tmp_path / "w.safetensors"))

    def no_torch_load(*args, **kwargs):
        raise AssertionError("torch.load was called on a .safetensors file")

    monkeypatch.setattr(torch, "load", no_torch_load)
    assert torch.equal(_common.read_weights_file(tmp_path / "w.safetensors")["w"], torch.arange(3.0))


def test_an_unreadable_file_whose_error_has_no_text_is_named_by_the_error_type(tmp_path):
    path = tmp_path / "x.pt"
    path.write_bytes(b"\x00" * 10)
    assert "(10 bytes; EOFError)" in str(_common._unreadable(str(path), 10, EOFError()))


@pytest.mark.parametrize("kind, expected", [("pytorch-ddpm", "expected a pytorch-ddpm checkpoint"),
                                            ("improved-diffusion", "expected an improved-diffusion raw state dict")])
def test_an_empty_state_dict_is_no_state_dict(tmp_path, kind, expected):
    """An empty dict holds no weights: refused as not a state dict, not built into a network and then
    reported key by key."""
    torch.save({}, tmp_path / "empty.pt")
    with pytest.raises(ValueError, match=expected):
        gm.load(tmp_path / "empty.pt", kind=kind)


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


def test_an_empty_checkpoint_file_is_called_empty(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.pt: .*\(0 bytes; .*\): it is empty"):
        _common.read_torch_file(tmp_path / "empty.pt")


def test_a_raw_ddim_state_dict_with_a_missing_key_is_reported_under_its_path(tmp_path):
    state = tiny_ddim(0).state_dict()
    del state["conv_out.bias"]
    torch.save(state, tmp_path / "raw.pt")
    with pytest.raises(ValueError, match=r"^\S*raw\.pt: the weights do not match DDIMModel\(.*\):\n  missing keys \(1\): "
                                         r"conv_out\.bias"):
        gm.load(tmp_path / "raw.pt", kind="ddim", resolution=8)


# -- survivors of the fifth run (seed-3 shuffle, chunks 03 on, ninth session) ------------------------------
def test_a_heads_file_loads_on_the_backbone_of_a_moment_net_passed_as_backbone(tmp_path):
    """gm.load(heads file, backbone=<a MomentNet>) puts the heads on that MomentNet's backbone (not on the
    MomentNet itself, and not on nothing)."""
    backbone = tiny_iddpm()
    gm.MomentNet(backbone).save_heads(tmp_path / "heads.pt")
    loaded = gm.load(tmp_path / "heads.pt", backbone=gm.MomentNet(backbone, head="res_conv"))
    assert isinstance(loaded, gm.MomentNet) and loaded.backbone is backbone and loaded.head == "conv"


def test_an_exported_model_takes_a_whole_number_float_timestep():
    """A float timestep with whole values (7.0) is the integer index 7, not refused; 7.5 is refused."""
    exported = gm.GMSDiffusersModel.from_network(gm.MomentNet(tiny_iddpm(), head="conv"), sample_size=8).eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(exported(x, torch.tensor([7.0, 7.0])).sample, exported(x, torch.tensor([7, 7])).sample)
        with pytest.raises(ValueError, match="integer training index"):
            exported(x, torch.tensor([7.5, 7.0]))


def test_read_torch_file_silences_only_the_pickle_protocol_note(tmp_path, monkeypatch):
    """The one UserWarning read_torch_file hides is torch's 'Detected pickle protocol' note; any other warning
    torch.load gives reaches the caller."""
    torch.save({"w": torch.ones(2)}, tmp_path / "w.pt")
    real_load = torch.load

    def noisy_load(*args, **kwargs):
        warnings.warn("Detected pickle protocol 2 in the checkpoint", UserWarning)
        warnings.warn("another note from torch.load", UserWarning)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", noisy_load)
    with pytest.warns(UserWarning, match="another note from torch.load") as seen:
        assert torch.equal(_common.read_torch_file(tmp_path / "w.pt")["w"], torch.ones(2))
    assert [str(w.message) for w in seen] == ["another note from torch.load"]


def test_ddim_model_defaults_are_the_ddim_repositorys():
    """DDIMModel(ch, out_ch) alone: ch_mult (1, 2, 4, 8), two res blocks per level, attention at 16, no dropout,
    conv resampling, 3 input channels, 32 x 32 (built on the meta device: no memory)."""
    with torch.device("meta"):
        model = gm.DDIMModel(ch=32, out_ch=3)
    assert model.config == {"ch": 32, "out_ch": 3, "ch_mult": [1, 2, 4, 8], "num_res_blocks": 2,
                            "attn_resolutions": [16], "dropout": 0.0, "resamp_with_conv": True, "in_channels": 3,
                            "resolution": 32}
    assert len(model.down[0].block) == 2 and len(model.up[0].block) == 3


def test_a_two_entry_list_of_state_dicts_reads_its_second_as_ema(tmp_path):
    """[model, ema] (two entries, both state dicts): the EMA is the last entry, as in the five-entry list."""
    model, ema = tiny_ddim(0), tiny_ddim(1)
    torch.save([model.state_dict(), ema.state_dict()], tmp_path / "pair.pth")
    x, t = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(4)), torch.tensor([11])
    with torch.no_grad():
        assert torch.equal(gm.load(tmp_path / "pair.pth", resolution=8)(x, t), ema(x, t))
        assert torch.equal(gm.load(tmp_path / "pair.pth", resolution=8, use_ema=False)(x, t), model(x, t))


def test_ddim_time_embedding_of_width_4_is_the_smallest_allowed():
    """Width 4 (two rates, 1 and 1e-4) is allowed and gives [sin t, sin t/1e4, cos t, cos t/1e4]; 3 is refused."""
    from gms_kernels.models.ddim_model import timestep_embedding

    t = torch.tensor([0.0, 3.0, 250.0])
    expected = torch.stack([t.sin(), (t * 1e-4).sin(), t.cos(), (t * 1e-4).cos()], dim=1)
    torch.testing.assert_close(timestep_embedding(t, 4), expected, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="at least 4"):
        timestep_embedding(t, 3)


def test_a_moment_net_file_refuses_loader_options(tmp_path):
    """A MomentNet file takes no options: one given is a ValueError that names it."""
    gm.MomentNet(tiny_iddpm(), head="conv").save(tmp_path / "net.pt")
    with pytest.raises(ValueError, match=r"unknown option\(s\) for kind 'moment-net': colour; valid: none$"):
        gm.load(tmp_path / "net.pt", colour=1)


def test_a_ddim_file_loaded_with_a_wrong_width_is_told_the_ddim_kind_and_width_that_fit(tmp_path):
    """The hint for DDIM weights loaded with a wrong option names kind='ddim' and the width the weights have."""
    torch.save(tiny_ddim(0).state_dict(), tmp_path / "raw.pt")
    with pytest.raises(ValueError, match=re.escape("load with gk.models.load(path, kind='ddim', ch=32) or leave")):
        gm.load(tmp_path / "raw.pt", kind="ddim", resolution=8, ch=64)


def test_a_heads_file_with_other_targets_is_refused(tmp_path):
    """Heads trained for central moments do not load into a MomentNet that reads them as raw moments."""
    backbone = tiny_iddpm()
    gm.MomentNet(backbone, targets="central").save_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match=r"targets: this MomentNet has 'raw', the file 'central'"):
        gm.MomentNet(backbone).load_heads(tmp_path / "heads.pt")


def test_first_difference_reports_a_shape_difference_as_the_two_shapes():
    from gms_kernels.models.official_gms import first_difference

    assert first_difference({"w": torch.zeros(2, 3)}, {"w": torch.zeros(3, 2)}, 0.0) == ("w", "shape [3, 2] vs [2, 3]")


@pytest.mark.parametrize("options", [{"ch_mult": ()}, {"num_res_blocks": 0}], ids=["no-levels", "no-blocks"])
def test_ddim_model_refuses_no_levels_or_no_blocks_each_alone(options):
    with pytest.raises(ValueError, match=r"ch_mult must be non-empty and num_res_blocks >= 1"):
        gm.DDIMModel(ch=32, out_ch=3, **{"ch_mult": (1, 2), "num_res_blocks": 1, "resolution": 8, **options})


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


def test_a_diffusers_folder_loads_with_kind_diffusers_named(tmp_path):
    unet = tiny_unet(3)
    unet.save_pretrained(tmp_path / "unet")
    loaded = gm.load(tmp_path / "unet", kind="diffusers")
    assert isinstance(loaded, gm.DiffusersUNet)
    x, t = torch.randn(1, 3, 8, 8), torch.tensor([21])
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, t), unet(x, t).sample, rtol=0, atol=1e-5)


def test_a_state_dict_of_one_tensor_is_a_state_dict():
    from gms_kernels.models.loading import _is_state_dict

    assert _is_state_dict({"w": torch.zeros(2)})
    assert not _is_state_dict({}) and not _is_state_dict({"w": 1.0})


def test_official_ddim_files_without_an_image_size_name_the_eps_file():
    """build_backbone hands the file's name to build_ddim: the error for a missing resolution starts with it."""
    paths, cfg = official_fixtures("ddpm")
    cfg = {k: v for k, v in cfg.items() if k not in ("resolution", "attn_resolutions")}
    with pytest.raises(ValueError, match=r"^\S*ddpm/eps1\.pt \[ema_model\]: "):
        gm.load(paths, kind="gms-official", **cfg)


def test_separate_official_networks_all_carry_the_schedule_given():
    """shared_backbone=False: the eps network and every head network's backbone carry the schedule= passed."""
    paths, cfg = official_fixtures("ddpm")
    schedule = gk.Schedule.linear(T=500, beta_end=0.03)
    net = gm.load(paths, kind="gms-official", shared_backbone=False, schedule=schedule, **cfg)
    assert [m.schedule is schedule for m in [net.eps_net, *(h.backbone for h in net.head_nets)]] == [True] * 3


def test_a_pytorch_ddpm_unet_built_under_a_default_device_has_its_time_table_there():
    """The frozen sinusoid table is made on the CPU, then moved to the ambient default device with the rest."""
    with torch.device("meta"):
        net = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1)
    assert net.time_embedding.timembedding[0].weight.device.type == "meta"
    assert {p.device.type for p in net.parameters()} == {"meta"}


def test_load_official_called_directly_reads_to_the_cpu():
    from gms_kernels.models.official_gms import load_official

    paths, cfg = official_fixtures("ddpm")
    net = load_official(paths[:1], **cfg)
    assert {p.device.type for p in net.parameters()} == {"cpu"}


def test_kind_diffusers_for_a_file_says_it_needs_the_folder(tmp_path):
    torch.save(tiny_ddpm_state(), tmp_path / "ddpm.pt")
    with pytest.raises(ValueError, match=r"ddpm\.pt is a file; kind='diffusers' needs the model directory"):
        gm.load(tmp_path / "ddpm.pt", kind="diffusers")


def test_a_saved_moment_net_on_a_diffusers_backbone_keeps_no_private_config_entries(tmp_path):
    """MomentNet.save writes the UNet2DModel config without its private entries (the folder it was read from,
    diffusers' bookkeeping), _class_name excepted."""
    tiny_unet(3).save_pretrained(tmp_path / "unet")
    gm.MomentNet(gm.load(tmp_path / "unet"), head="conv").save(tmp_path / "net.pt")
    config = json.loads(torch.load(tmp_path / "net.pt", weights_only=True)["backbone"]["config"])
    assert config["_class_name"] == "UNet2DModel" and config["block_out_channels"] == [8, 16]
    assert [k for k in config if k.startswith("_")] == ["_class_name"]


def test_a_ddim_file_loaded_with_a_wrong_ch_mult_is_told_the_integer_multipliers(tmp_path):
    torch.save(tiny_ddim(0).state_dict(), tmp_path / "raw.pt")
    with pytest.raises(ValueError, match=r"load with gk\.models\.load\(path, kind='ddim', ch_mult=[\[(]1, 2[\])]\) or leave"):
        gm.load(tmp_path / "raw.pt", kind="ddim", resolution=8, ch_mult=[1, 2, 2])


def test_resolve_resolution_pairs_the_largest_attention_size_with_the_first_level():
    """Attention at encoder levels 1 and 2 of a 32 x 32 network works at 16 and 8: given (8, 16) in any order,
    the image size is 32."""
    from gms_kernels.models.ddim_model import resolve_resolution

    assert resolve_resolution([1, 2], None, [8, 16]) == {"resolution": 32, "attn_resolutions": [8, 16]}
    assert resolve_resolution([1, 2], None, [16, 8]) == {"resolution": 32, "attn_resolutions": [8, 16]}


def test_an_iddpm_unet_in_float64_casts_its_time_embedding():
    """The sinusoidal embedding (float32) is cast to the time MLP's dtype: a float64 network runs."""
    net = tiny_iddpm().double()
    x = torch.randn(1, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert net(x, torch.tensor([5])).dtype == torch.float64


def test_an_undetectable_list_file_is_described_by_its_type(tmp_path):
    torch.save([1, 2, 3], tmp_path / "numbers.pt")
    with pytest.raises(ValueError, match=r"numbers\.pt: cannot tell which network this file holds \(top-level keys: "
                                         r"list\)"):
        gm.load(tmp_path / "numbers.pt")


def test_a_safetensors_ddim_file_is_never_handed_to_torch_load(tmp_path, monkeypatch):
    """kind='ddim' reads a .safetensors file once, with safetensors (torch.load reads that format only since
    torch 2.13): the data read is passed on, not read again with torch.load."""
    from safetensors.torch import save_file

    model = tiny_ddim(0)
    save_file(model.state_dict(), str(tmp_path / "ddim.safetensors"))

    def no_torch_load(*args, **kwargs):
        raise AssertionError("torch.load was called on a .safetensors file")

    monkeypatch.setattr(torch, "load", no_torch_load)
    loaded = gm.load(tmp_path / "ddim.safetensors", kind="ddim", resolution=8)
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(loaded(x, torch.tensor([9])), model(x, torch.tensor([9])))


def test_an_exported_model_returns_a_tuple_when_asked():
    exported = gm.GMSDiffusersModel.from_network(gm.MomentNet(tiny_iddpm(), head="conv"), sample_size=8).eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = exported(x, 7, return_dict=False)
        assert isinstance(out, tuple) and len(out) == 1 and torch.equal(out[0], exported(x, 7).sample)


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


def test_a_ddim_model_takes_an_int_timestep_whatever_the_default_device():
    """DDIMModel.forward(x, 17) makes the timestep tensor where x is, not on torch's default device."""
    model = tiny_ddim(0)
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(x, 17)
        with torch.device("meta"):
            got = model(x, 17)
    assert got.device.type == "cpu" and torch.equal(got, expected)


def test_official_ddim_head_keys_that_match_no_mode_are_listed_without_a_prefix():
    from gms_kernels.models.official_gms import detect_mode

    head = {f"k{i:02d}.weight": torch.zeros(1) for i in range(12)}
    shown = ", ".join(f"k{i:02d}.weight" for i in range(10))
    with pytest.raises(ValueError, match=re.escape(f"w: the head keys match no official ddim head mode "
                                                   f"(simple, complex); found 12: {shown}") + "$"):
        detect_mode("ddim", head, tiny_ddim(0), "w")


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


# -- survivors of chunks 14-28 of the seed-3 shuffle (tenth session, helper A) ----------------------------
def test_pytorch_ddpm_width_is_read_from_the_time_embedding_when_every_other_width_entry_is_gone(tmp_path):
    """infer_config's last source of ch is the time embedding's width (4 ch): a file without the sinusoid
    table, the first time-embedding linear and the head conv is still compared with its own architecture;
    without that entry too, the architecture is unreadable and the loader says so (no TypeError)."""
    sd = tiny_ddpm_state()
    gone = ["time_embedding.timembedding.0.weight", "time_embedding.timembedding.1.weight", "head.weight", "head.bias"]
    part = {k: v for k, v in sd.items() if k not in gone}
    assert gm.PytorchDDPMUNet.infer_config(part)["ch"] == 32
    torch.save(part, tmp_path / "part.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "part.pt")
    msg = str(err.value)
    assert "missing keys (4)" in msg and "resembles PytorchDDPMUNet(" in msg and "ch=32" in msg
    del part["time_embedding.timembedding.3.weight"]
    assert gm.PytorchDDPMUNet.infer_config(part) is None
    torch.save(part, tmp_path / "less.pt")
    with pytest.raises(ValueError, match="do not look like a pytorch-ddpm PytorchDDPMUNet state dict"):
        gm.load(tmp_path / "less.pt", kind="pytorch-ddpm")


def test_first_difference_accepts_a_difference_of_exactly_rtol_times_the_largest_value():
    """first_difference: entries differ when |difference| exceeds rtol * max|reference entry| (not at equality),
    the tolerance scaling with the reference's largest value (4 here, not 1)."""
    from gms_kernels.models.official_gms import first_difference

    ref = {"w": torch.tensor([4.0, 1.0])}
    assert first_difference(ref, {"w": torch.tensor([4.0, 1.5])}, 0.125) is None      # 0.5 = 0.125 * 4
    assert first_difference(ref, {"w": torch.tensor([4.0, 1.375])}, 0.1) is None       # 0.375 < 0.1 * 4
    key, what = first_difference(ref, {"w": torch.tensor([4.0, 1.625])}, 0.125)        # 0.625 > 0.5
    assert key == "w" and what.startswith("max |difference| 0.625")


def test_separate_official_networks_are_frozen_and_a_bad_second_file_is_named(tmp_path):
    """shared_backbone=False: SeparateNets holds no trainable parameter; a damaged backbone in the second
    file is reported under that file's name."""
    paths, cfg = official_fixtures("ddpm")
    net = gm.load(paths[:2], kind="gms-official", shared_backbone=False, **cfg)
    assert sum(1 for _ in net.parameters()) > 0 and not any(p.requires_grad for p in net.parameters())
    data = torch.load(paths[1], weights_only=True)
    data = {**data, "ema_model": {k: v for k, v in data["ema_model"].items() if k != "conv_in.bias"}}
    torch.save(data, tmp_path / "eps2.pt")
    with pytest.raises(ValueError, match=r"^\S*eps2\.pt \[ema_model\]: the weights do not match DDIMModel\("):
        gm.load([paths[0], tmp_path / "eps2.pt"], kind="gms-official", shared_backbone=False, **cfg)


@pytest.mark.parametrize("gone", [("head.weight", "tail.2.bias"), ("tail.2.weight", "tail.2.bias")])
def test_pytorch_ddpm_input_channels_are_read_from_whichever_conv_is_left(tmp_path, gone):
    """in_channels: from head.weight (axis 1), else tail.2.weight, else tail.2.bias; with any one of them left,
    the file is still compared with its own architecture."""
    sd = tiny_ddpm_state()
    part = {k: v for k, v in sd.items() if k not in gone}
    assert gm.PytorchDDPMUNet.infer_config(part)["in_channels"] == 3
    torch.save(part, tmp_path / "part.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "part.pt")
    msg = str(err.value)
    assert "missing keys (2)" in msg and "resembles PytorchDDPMUNet(" in msg and "in_channels=3" in msg


def test_official_heads_are_materialised_on_their_backbones_device():
    """load_head puts each official head where its backbone is: with map_location='meta' (shapes only, no data)
    every parameter of the separate networks, heads included, is on the meta device."""
    paths, cfg = official_fixtures("ddpm")
    net = gm.load(paths[:2], kind="gms-official", shared_backbone=False, map_location="meta", **cfg)
    assert {p.device.type for p in net.head_nets[0].heads.parameters()} == {"meta"}
    assert {p.device.type for p in net.parameters()} == {"meta"}


def test_iddpm_time_embedding_of_odd_width_is_padded_with_one_zero_column():
    """improved-diffusion's timestep_embedding for an odd width: cos and sin halves, then one zero column."""
    from gms_kernels.models.iddpm import timestep_embedding

    t = torch.tensor([0.0, 3.0])
    odd, even = timestep_embedding(t, 7), timestep_embedding(t, 6)
    assert odd.shape == (2, 7) and torch.equal(odd[:, :6], even) and torch.equal(odd[:, 6], torch.zeros(2))


def test_a_ddim_file_with_only_ema_weights_loads_them(tmp_path):
    """read_state takes a {'ema_model': ...} checkpoint without 'net_model' as the EMA weights (not a raw state)."""
    ema = tiny_ddim(0)
    torch.save({"ema_model": ema.state_dict(), "step": 3}, tmp_path / "ema.pt")
    loaded = gm.load(tmp_path / "ema.pt", kind="ddim", resolution=8)
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(x, 17), ema(x, 17))


def test_official_networks_keep_the_dropout_of_their_config():
    """load_official builds the official heads (and the MomentNet) with the eps network's dropout (0.1 in the
    fixtures' config), so heads trained further drop out as the official ones did."""
    paths, cfg = official_fixtures("ddpm")
    assert cfg["dropout"] == 0.1
    net = gm.load(paths, kind="gms-official", **cfg)
    drops = [m.p for m in net.heads.modules() if isinstance(m, torch.nn.Dropout)]
    assert net.dropout == 0.1 and net.head_config["dropout"] == 0.1 and drops and set(drops) == {0.1}


def test_a_saved_heads_file_records_its_format_version(tmp_path):
    """save_heads writes {format, version, config, state_dict}: the version is stored (a reader of a later
    format must not take a version-1 file for its own)."""
    from gms_kernels.models.moment_net import FORMAT_VERSION, HEADS_FORMAT

    gm.MomentNet(tiny_iddpm(), head="conv").save_heads(tmp_path / "heads.pt")
    data = torch.load(tmp_path / "heads.pt", weights_only=True)
    assert sorted(data) == ["config", "format", "state_dict", "version"]
    assert data["format"] == HEADS_FORMAT and data["version"] == FORMAT_VERSION == 1


def test_a_scaled_linear_diffusers_schedule_is_made_on_the_cpu_whatever_the_default_device(tmp_path):
    """_diffusers_schedule builds scaled_linear betas on the CPU also under another default device."""
    write_config(tmp_path / "pipe" / "scheduler", {"beta_schedule": "scaled_linear", "beta_start": 0.00085,
                                                   "beta_end": 0.012, "num_train_timesteps": 50})
    with torch.device("meta"):
        s = _diffusers_schedule(str(tmp_path / "pipe"), "unet")
    assert s.betas.device.type == "cpu"
    np.testing.assert_allclose(s.betas.numpy(), np.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 50) ** 2, rtol=1e-12, atol=0)


def test_an_official_eps_file_detected_by_content_takes_the_options_given():
    """gk.models.load(one official GMS file) with kind left to detection passes the options on to
    load_official: the dropout is the one given, and an unknown option is refused."""
    paths, cfg = official_fixtures("iddpm")
    net = gm.load(paths[0], **{**cfg, "dropout": 0.2, "num_heads": 2})
    assert isinstance(net, gm.IDDPMUNet) and net.dropout == 0.2 and net.num_heads == 2
    with pytest.raises(ValueError, match="unknown option\\(s\\) for kind 'gms-official': colour"):
        gm.load(paths[0], colour=1)


def test_improved_diffusion_heads_on_another_backbone_use_no_scale_shift():
    """An official improved-diffusion head on a backbone without use_scale_shift_norm (a pytorch-ddpm UNet)
    is built without scale-shift: its ResBlock's time projection gives one shift per channel."""
    torch.manual_seed(0)
    backbone = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    net = gm.MomentNet(backbone, orders=(2,), head="iddpm-complex")
    res = net.heads["2"][0]
    assert res.scale_shift is False and res.emb_layers[1].out_features == backbone.feature_channels == 32


# -- eleventh session, helper A: chunks 19-21 of the seed-3 shuffle -----------------------------------
def test_an_empty_file_is_reported_with_the_error_torch_load_raised(tmp_path):
    """read_torch_file's last branch (errors other than unpickling and RuntimeError: an empty file's
    EOFError) names the exception torch.load raised, not a placeholder."""
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ValueError) as err:
        _common.read_torch_file(tmp_path / "empty.pt")
    msg = str(err.value)
    assert re.search(r"\(0 bytes; EOFError[:)]", msg) and "NoneType" not in msg, msg


def test_improved_diffusion_heads_record_their_mode():
    """IDDPMHead keeps the mode it was built in (as DDIMHead does), for every official mode."""
    from gms_kernels.models.official_heads import IDDPMHead

    for mode in ("simple", "complex", "complex2"):
        assert IDDPMHead(mode, 32, 64, 3).mode == mode


def test_the_ddim_time_embedding_is_float32_whatever_the_default_dtype(default_dtype):
    """The DDIM Model's frequencies are float32 (as the DDIM repository's), also under a float64 default dtype:
    the same embedding, in float32."""
    from gms_kernels.models.ddim_model import timestep_embedding

    t = torch.tensor([0, 7, 999])
    expected = timestep_embedding(t, 10)
    with default_dtype(torch.float64):
        got = timestep_embedding(t, 10)
    assert expected.dtype == got.dtype == torch.float32 and torch.equal(got, expected)


def test_an_improved_diffusion_file_loaded_with_a_wrong_width_is_told_the_kind_and_width_that_fit(tmp_path):
    """The fix suggested for an improved-diffusion file loaded with a wrong option names kind='improved-diffusion'
    (the call it advises works)."""
    torch.save(tiny_iddpm().state_dict(), tmp_path / "iddpm.pt")
    with pytest.raises(ValueError, match=r"load with gk\.models\.load\(path, kind='improved-diffusion', "
                                         r"model_channels=32\) or leave these options out"):
        gm.load(tmp_path / "iddpm.pt", num_heads=2, model_channels=64)


def test_a_diffusers_folder_with_a_missing_subfolder_is_not_a_model_directory(tmp_path):
    """subfolder= naming a folder that does not exist (or a file) gives the "not a diffusers model directory"
    ValueError, not an OSError from listing it."""
    tiny_unet(3).save_pretrained(tmp_path / "pipe" / "unet")
    (tmp_path / "pipe" / "notes").write_text("x")
    for sub in ("vae", "notes"):
        with pytest.raises(ValueError, match=rf"pipe.{sub}: not a diffusers model directory: .*found \[\]"):
            gm.load(tmp_path / "pipe", subfolder=sub)


def test_a_reshaped_official_head_is_reported_under_its_files_name(tmp_path):
    """An official eps^2 file whose head has the keys of a known mode but a reshaped weight: the shared-backbone
    loader names that file (and its entry) in the error."""
    paths, cfg = official_fixtures("ddpm")
    data = torch.load(paths[1], weights_only=True)
    data = {**data, "ema_model": {**data["ema_model"], "conv_out2.bias": torch.zeros(4)}}
    torch.save(data, tmp_path / "eps2.pt")
    with pytest.raises(ValueError, match=r"^\S*eps2\.pt \[ema_model\]: the weights do not match the official "
                                         r"head 'ddim-complex'"):
        gm.load([paths[0], tmp_path / "eps2.pt"], kind="gms-official", **cfg)


# -- chunk22 ------------------------------------------------------------------------------------------
def test_read_weights_file_hands_map_location_to_safetensors(tmp_path, monkeypatch):
    """A .safetensors file is read onto the device map_location names (here 'cuda:1', recorded by a stand-in for
    safetensors' load_file, with CUDA reported available), not always onto the CPU."""
    import safetensors.torch
    from safetensors.torch import save_file

    save_file({"w": torch.arange(3.0)}, str(tmp_path / "w.safetensors"))
    seen = []
    real = safetensors.torch.load_file

    def recording_load_file(path, device="cpu"):
        seen.append(str(device))
        return real(path, device="cpu")

    monkeypatch.setattr(safetensors.torch, "load_file", recording_load_file)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _common.read_weights_file(tmp_path / "w.safetensors", map_location="cuda:1")
    _common.read_weights_file(tmp_path / "w.safetensors", map_location=torch.device("cuda", 1))
    assert seen == ["cuda:1", "cuda:1"]


def test_an_exported_network_loads_with_the_schedule_it_is_given(tmp_path):
    """load_exported(dir, schedule=s) (and gk.models.load) puts s on the network, replacing the stored betas."""
    from gms_kernels.integrations.diffusers_export import load_exported

    gm.GMSDiffusersModel.from_network(gm.MomentNet(tiny_iddpm(), head="conv"), sample_size=8).save_pretrained(tmp_path)
    schedule = gk.Schedule.cosine(20)
    assert load_exported(tmp_path, schedule=schedule).schedule is schedule
    assert gm.load(tmp_path, schedule=schedule).schedule is schedule


def test_a_folder_with_a_config_and_other_safetensors_is_not_a_diffusers_model_directory(tmp_path):
    """config.json beside a weights file not named diffusion_pytorch_model.* is refused by the loader's own check
    (which lists what the folder holds), not handed to diffusers."""
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text('{"_class_name": "UNet2DModel"}')
    save_file({"w": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "diffusion_pytorch_model.txt").write_text("notes")
    with pytest.raises(ValueError, match=r"not a diffusers model directory: expected config\.json and .*found "
                                         r"\['config\.json', 'diffusion_pytorch_model\.txt', 'model\.safetensors'\]"):
        gm.load(tmp_path)


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


# -- chunk23 ------------------------------------------------------------------------------------------
def test_a_truncated_file_is_reported_with_its_size(tmp_path):
    """The RuntimeError branch of read_torch_file (a truncated torch zip) states the file's size in bytes."""
    torch.save({"w": torch.ones(64)}, tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"cut\.pt: cannot read this file as a torch checkpoint \({len(data) // 2} "
                                         r"bytes; RuntimeError: "):
        _common.read_torch_file(tmp_path / "cut.pt")


def test_an_exported_central_moment_net_keeps_its_targets(tmp_path):
    """The exported description records targets='central', and the network loaded back has it."""
    from gms_kernels.integrations.diffusers_export import build_network, network_spec

    net = gm.MomentNet(tiny_iddpm(), head="conv", targets="central")
    spec = network_spec(net)
    assert spec["heads"]["targets"] == "central"
    assert build_network(spec).targets == "central"


# -- chunk24 ------------------------------------------------------------------------------------------
def _convs_to(net, dtype):
    for m in net.modules():
        if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d)):
            m.to(dtype)
    return net


def test_networks_with_low_precision_convolutions_and_float32_time_layers_run():
    """improved-diffusion's convert_to_fp16 casts the convolutions alone; the time embedding's linear layers stay
    float32, so each residual block casts its projected embedding to the feature's dtype. An IDDPMUNet and a
    DDIMModel so converted (bfloat16 here) run and return bfloat16."""
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    t = torch.tensor([3, 4])
    iddpm = _convs_to(tiny_iddpm(), torch.bfloat16)
    torch.manual_seed(0)
    ddim = _convs_to(gm.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(4,),
                                  resolution=8).eval(), torch.bfloat16)
    with torch.no_grad():
        assert iddpm(x, t).dtype == torch.bfloat16
        out = ddim(x, t)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 3, 8, 8) and torch.isfinite(out.float()).all()


def test_a_res_conv_head_has_no_dropout_by_default():
    """gm.ResConvHead(channels, temb_channels, out_channels) drops nothing unless a dropout is given."""
    drops = [m.p for m in gm.ResConvHead(32, 64, 3).modules() if isinstance(m, torch.nn.Dropout)]
    assert drops == [0.0]
    assert [m.p for m in gm.ResConvHead(32, 64, 3, 0.25).modules() if isinstance(m, torch.nn.Dropout)] == [0.25]


def test_read_state_reads_the_ema_weights_by_default():
    """official_gms.read_state(path): the file's ema_model entry unless use_ema=False."""
    from gms_kernels.models.official_gms import read_state

    paths, _ = official_fixtures("ddpm")
    data = torch.load(paths[0], weights_only=True)
    state, where = read_state(paths[0])
    assert where.endswith("eps1.pt [ema_model]") and state.keys() == data["ema_model"].keys()
    assert all(torch.equal(state[k], data["ema_model"][k]) for k in state)
    assert read_state(paths[0], use_ema=False)[1].endswith("[net_model]")


def test_pytorch_ddpm_block_width_is_read_from_its_second_norm_when_the_other_entries_are_gone(tmp_path):
    """A down block's width: from block1.2.weight, block1.2.bias, temb_proj.1.weight, block2.3.weight, else
    block2.0.weight (the second GroupNorm): a file without the first four still gets its architecture."""
    sd = tiny_ddpm_state()
    gone = [f"downblocks.0.{k}" for k in ("block1.2.weight", "block1.2.bias", "temb_proj.1.weight", "block2.3.weight")]
    part = {k: v for k, v in sd.items() if k not in gone}
    assert gm.PytorchDDPMUNet.infer_config(part) == gm.PytorchDDPMUNet.infer_config(sd)
    torch.save(part, tmp_path / "part.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "part.pt")
    assert "missing keys (4)" in str(err.value) and "resembles PytorchDDPMUNet(" in str(err.value)


def test_an_ema_only_official_file_read_without_ema_names_the_entry_that_loads(tmp_path):
    """read_state(use_ema=False) on a file holding only ema_model advises use_ema=True to load 'ema_model'."""
    from gms_kernels.models.official_gms import read_state

    paths, _ = official_fixtures("ddpm")
    data = torch.load(paths[0], weights_only=True)
    torch.save({"ema_model": data["ema_model"]}, tmp_path / "ema_only.pt")
    with pytest.raises(ValueError, match=r"ema_only\.pt: the checkpoint has no 'net_model' .*; pass use_ema=True to "
                                         r"load 'ema_model'$"):
        read_state(tmp_path / "ema_only.pt", use_ema=False)


def test_a_pytorch_ddpm_file_with_an_unknown_option_names_its_kind(tmp_path):
    torch.save(tiny_ddpm_state(), tmp_path / "ddpm.pt")
    with pytest.raises(ValueError, match=r"unknown option\(s\) for kind 'pytorch-ddpm': colour; valid: T, ch, "):
        gm.load(tmp_path / "ddpm.pt", colour=1)


# -- chunk25 ------------------------------------------------------------------------------------------
def test_the_heads_hint_of_a_diffusers_unet_names_the_folder_it_came_from():
    """A DiffusersUNet with a source (the folder gk.models.load read) names it in heads_hint, first as the model
    and then in the train-heads command."""
    hint = gm.DiffusersUNet(tiny_unet(3), source="/data/unet-dir").heads_hint
    assert hint.startswith("the diffusers UNet2DModel at /data/unet-dir: it gives 1 head(s) (3 output channels). ")
    assert "--model /data/unet-dir" in hint


def test_pytorch_ddpm_width_is_read_from_the_sinusoid_table_when_the_time_layers_and_head_are_gone(tmp_path):
    """ch from the sinusoid table (time_embedding.timembedding.0.weight, [T, ch]) alone: without the time MLP's
    weights and the input conv the file is still compared with its own architecture."""
    sd = tiny_ddpm_state()
    gone = ("time_embedding.timembedding.1.weight", "time_embedding.timembedding.3.weight", "head.weight", "head.bias")
    part = {k: v for k, v in sd.items() if k not in gone}
    assert gm.PytorchDDPMUNet.infer_config(part)["ch"] == 32
    torch.save(part, tmp_path / "part.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "part.pt")
    assert "missing keys (4)" in str(err.value) and "resembles PytorchDDPMUNet(" in str(err.value)


# -- chunk26 ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backbone", [{"family": "no-such-family"}, None, ["pytorch-ddpm"]])
def test_a_network_description_with_an_unknown_or_malformed_backbone_is_refused(backbone):
    """build_network refuses a description whose backbone is not a dict of a known family with its ValueError
    (not a KeyError or AttributeError from reading it)."""
    from gms_kernels.integrations.diffusers_export import build_network

    with pytest.raises(ValueError, match="not a gms_kernels network description: .*export it again"):
        build_network({"type": "backbone", "backbone": backbone})


# -- chunk27 ------------------------------------------------------------------------------------------
def test_an_iddpm_unet_built_with_eps_only_returns_eps_alone():
    """IDDPMUNet(..., eps_only=True) with a learned sigma (out_channels = 2 C) returns the C eps channels."""
    torch.manual_seed(0)
    kw = dict(in_channels=3, model_channels=32, out_channels=6, num_res_blocks=1, attention_resolutions=(2,),
              channel_mult=(1, 2), num_heads=2)
    net = gm.IDDPMUNet(**kw, eps_only=True).eval()
    assert net.eps_only is True and gm.IDDPMUNet(**kw).eps_only is False
    with torch.no_grad():
        assert net(torch.randn(1, 3, 8, 8), torch.tensor([3])).shape == (1, 3, 8, 8)
