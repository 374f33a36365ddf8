"""gk.models.load (gms_kernels/models/loading.py): format detection, each kind's loader options and error
texts, EMA entries, diffusers folders and their schedules, and map_location."""

import json
import re
import warnings

import numpy as np
import pytest
import torch

import gms_kernels as gk
import gms_kernels.models as gm
from gms_kernels.models.loading import _diffusers_schedule
from conftest import tiny_ddim, tiny_ddpm_state, tiny_diffusers_unet


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
    unet = tiny_diffusers_unet(3)
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

    tiny_diffusers_unet(3).save_pretrained(tmp_path)
    file = tmp_path / "diffusion_pytorch_model.safetensors"
    state = load_file(file)
    if edit == "drop":
        del state["conv_out.bias"]
    else:
        state["extra.weight"] = torch.zeros(2)
    save_file(state, file)
    with pytest.raises(ValueError, match=re.escape(f"the weights do not match config.json:\n  {listed}\n")):
        gm.load(tmp_path)


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


@pytest.mark.parametrize("name", ["diffusion_pytorch_model.safetensors", "config.json"])
def test_a_diffusers_weights_or_config_file_loads_its_folder(tmp_path, name):
    unet = tiny_diffusers_unet(3)
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


def test_pytorch_ddpm_and_improved_diffusion_loaders_take_their_options(tmp_path):
    torch.save({"ema_model": tiny_ddpm_state()}, tmp_path / "ddpm.pt")
    schedule = gk.Schedule.linear(50, 1e-3, 0.05)
    assert gm.load(tmp_path / "ddpm.pt", schedule=schedule).schedule is schedule
    torch.save(tiny_iddpm().state_dict(), tmp_path / "iddpm.pt")
    with pytest.raises(ValueError, match=r"unknown option\(s\) for kind 'improved-diffusion': colour; valid: "
                                         r"in_channels, .*, eps_only, schedule$"):
        gm.load(tmp_path / "iddpm.pt", colour=1)


def test_diffusers_variant_weights_are_read_when_asked(tmp_path):
    unet = tiny_diffusers_unet(3)
    unet.save_pretrained(tmp_path, variant="ema")
    assert (tmp_path / "diffusion_pytorch_model.ema.safetensors").is_file()
    assert not (tmp_path / "diffusion_pytorch_model.safetensors").exists()
    x, t = torch.randn(1, 3, 8, 8), torch.tensor([13])
    with torch.no_grad():
        torch.testing.assert_close(gm.load(tmp_path, variant="ema")(x, t), unet(x, t).sample, rtol=0, atol=1e-5)


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


def test_the_prediction_type_warning_points_at_the_users_load_call(tmp_path):
    write_config(tmp_path / "pipe" / "scheduler", {"prediction_type": "v_prediction"})
    tiny_diffusers_unet(3).save_pretrained(tmp_path / "pipe" / "unet")
    with pytest.warns(UserWarning, match="prediction_type='v_prediction'") as caught:
        gm.load(tmp_path / "pipe", subfolder="unet")
    assert [w.filename for w in caught if "prediction_type" in str(w.message)] == [__file__]


def test_a_unet_folder_with_its_own_config_wins_over_a_unet_subfolder(tmp_path):
    """A directory holding a UNet (config.json at its top) is that UNet, even beside a unet/ subfolder;
    only a folder without a top-level config.json is read as a pipeline."""
    tiny_diffusers_unet(3).save_pretrained(tmp_path)
    tiny_diffusers_unet(6).save_pretrained(tmp_path / "unet")
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


def test_ddim_load_errors_name_the_file():
    from test_official_gms import files

    with pytest.raises(ValueError, match=r"^\S*eps1\.pt \[ema_model\]: the weights do not match DDIMModel\(.*ch_mult=\[1, 2, 2\]"):
        gm.load(files("ddpm")[0], kind="ddim", resolution=16, ch_mult=[1, 2, 2])


def test_diffusers_load_failures_list_the_wrong_shapes_and_quote_diffusers(tmp_path):
    """A config.json that does not describe its weights lists each wrong shape; a weights file diffusers
    cannot read is reported with diffusers' own first line."""
    tiny_diffusers_unet(3).save_pretrained(tmp_path / "edited")
    cfg = json.loads((tmp_path / "edited" / "config.json").read_text())
    (tmp_path / "edited" / "config.json").write_text(json.dumps({**cfg, "out_channels": 6}))
    with pytest.raises(ValueError, match=r"edited: config\.json does not describe the weights: wrong shapes \(2\): "
                                         r"conv_out\.weight: expected \[6, 8, 3, 3\] \(from config\.json\), found "
                                         r"\[3, 8, 3, 3\] \(weights file\); conv_out\.bias: expected \[6\]"):
        gm.load(tmp_path / "edited")
    tiny_diffusers_unet(3).save_pretrained(tmp_path / "cut")
    weights = tmp_path / "cut" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cut: diffusers could not load the UNet2DModel \(OSError: Unable to load "
                                         r"weights from checkpoint file"):
        gm.load(tmp_path / "cut")


@pytest.mark.parametrize("kind, expected", [("pytorch-ddpm", "expected a pytorch-ddpm checkpoint"),
                                            ("improved-diffusion", "expected an improved-diffusion raw state dict")])
def test_an_empty_state_dict_is_no_state_dict(tmp_path, kind, expected):
    """An empty dict holds no weights: refused as not a state dict, not built into a network and then
    reported key by key."""
    torch.save({}, tmp_path / "empty.pt")
    with pytest.raises(ValueError, match=expected):
        gm.load(tmp_path / "empty.pt", kind=kind)


def test_a_raw_ddim_state_dict_with_a_missing_key_is_reported_under_its_path(tmp_path):
    state = tiny_ddim(0).state_dict()
    del state["conv_out.bias"]
    torch.save(state, tmp_path / "raw.pt")
    with pytest.raises(ValueError, match=r"^\S*raw\.pt: the weights do not match DDIMModel\(.*\):\n  missing keys \(1\): "
                                         r"conv_out\.bias"):
        gm.load(tmp_path / "raw.pt", kind="ddim", resolution=8)


def test_a_two_entry_list_of_state_dicts_reads_its_second_as_ema(tmp_path):
    """[model, ema] (two entries, both state dicts): the EMA is the last entry, as in the five-entry list."""
    model, ema = tiny_ddim(0), tiny_ddim(1)
    torch.save([model.state_dict(), ema.state_dict()], tmp_path / "pair.pth")
    x, t = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(4)), torch.tensor([11])
    with torch.no_grad():
        assert torch.equal(gm.load(tmp_path / "pair.pth", resolution=8)(x, t), ema(x, t))
        assert torch.equal(gm.load(tmp_path / "pair.pth", resolution=8, use_ema=False)(x, t), model(x, t))


def test_a_ddim_file_loaded_with_a_wrong_width_is_told_the_ddim_kind_and_width_that_fit(tmp_path):
    """The hint for DDIM weights loaded with a wrong option names kind='ddim' and the width the weights have."""
    torch.save(tiny_ddim(0).state_dict(), tmp_path / "raw.pt")
    with pytest.raises(ValueError, match=re.escape("load with gk.models.load(path, kind='ddim', ch=32) or leave")):
        gm.load(tmp_path / "raw.pt", kind="ddim", resolution=8, ch=64)


def test_a_diffusers_folder_loads_with_kind_diffusers_named(tmp_path):
    unet = tiny_diffusers_unet(3)
    unet.save_pretrained(tmp_path / "unet")
    loaded = gm.load(tmp_path / "unet", kind="diffusers")
    assert isinstance(loaded, gm.DiffusersUNet)
    x, t = torch.randn(1, 3, 8, 8), torch.tensor([21])
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, t), unet(x, t).sample, rtol=0, atol=1e-5)


def test_a_state_dict_of_one_tensor_is_a_state_dict():
    from gms_kernels.models._checkpoints import is_state_dict

    assert is_state_dict({"w": torch.zeros(2)})
    assert not is_state_dict({}) and not is_state_dict({"w": 1.0})


def test_kind_diffusers_for_a_file_says_it_needs_the_folder(tmp_path):
    torch.save(tiny_ddpm_state(), tmp_path / "ddpm.pt")
    with pytest.raises(ValueError, match=r"ddpm\.pt is a file; kind='diffusers' needs the model directory"):
        gm.load(tmp_path / "ddpm.pt", kind="diffusers")


def test_a_ddim_file_loaded_with_a_wrong_ch_mult_is_told_the_integer_multipliers(tmp_path):
    torch.save(tiny_ddim(0).state_dict(), tmp_path / "raw.pt")
    with pytest.raises(ValueError, match=r"load with gk\.models\.load\(path, kind='ddim', ch_mult=[\[(]1, 2[\])]\) or leave"):
        gm.load(tmp_path / "raw.pt", kind="ddim", resolution=8, ch_mult=[1, 2, 2])


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


def test_a_ddim_file_with_only_ema_weights_loads_them(tmp_path):
    """read_state takes a {'ema_model': ...} checkpoint without 'net_model' as the EMA weights (not a raw state)."""
    ema = tiny_ddim(0)
    torch.save({"ema_model": ema.state_dict(), "step": 3}, tmp_path / "ema.pt")
    loaded = gm.load(tmp_path / "ema.pt", kind="ddim", resolution=8)
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(x, 17), ema(x, 17))


def test_a_scaled_linear_diffusers_schedule_is_made_on_the_cpu_whatever_the_default_device(tmp_path):
    """_diffusers_schedule builds scaled_linear betas on the CPU also under another default device."""
    write_config(tmp_path / "pipe" / "scheduler", {"beta_schedule": "scaled_linear", "beta_start": 0.00085,
                                                   "beta_end": 0.012, "num_train_timesteps": 50})
    with torch.device("meta"):
        s = _diffusers_schedule(str(tmp_path / "pipe"), "unet")
    assert s.betas.device.type == "cpu"
    np.testing.assert_allclose(s.betas.numpy(), np.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 50) ** 2, rtol=1e-12, atol=0)


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
    tiny_diffusers_unet(3).save_pretrained(tmp_path / "pipe" / "unet")
    (tmp_path / "pipe" / "notes").write_text("x")
    for sub in ("vae", "notes"):
        with pytest.raises(ValueError, match=rf"pipe.{sub}: not a diffusers model directory: .*found \[\]"):
            gm.load(tmp_path / "pipe", subfolder=sub)


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


def test_a_pytorch_ddpm_file_with_an_unknown_option_names_its_kind(tmp_path):
    torch.save(tiny_ddpm_state(), tmp_path / "ddpm.pt")
    with pytest.raises(ValueError, match=r"unknown option\(s\) for kind 'pytorch-ddpm': colour; valid: T, ch, "):
        gm.load(tmp_path / "ddpm.pt", colour=1)


def tiny_ddpm():
    torch.manual_seed(0)
    return gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()


def test_an_unrecognised_checkpoint_names_its_top_level_keys(tmp_path):
    torch.save({"alpha": torch.zeros(1), "beta": torch.zeros(2)}, tmp_path / "odd.pt")
    with pytest.raises(ValueError, match=r"top-level keys: \['alpha', 'beta'\]"):
        gm.load(tmp_path / "odd.pt")


def test_a_wrong_config_is_answered_with_a_call_that_fixes_it(tmp_path):
    """Two options that contradict the weights: the suggested gk.models.load call lists both corrections,
    comma-separated, ready to paste."""
    torch.save(tiny_ddpm().state_dict(), tmp_path / "d.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "d.pt", kind="pytorch-ddpm", ch=64, ch_mult=[1, 2, 2])
    assert "load with gk.models.load(path, kind='pytorch-ddpm', ch=32, ch_mult=[1, 2]) or leave these options out" \
        in str(err.value)


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


def test_an_improved_diffusion_file_with_a_wrong_option_is_answered_with_its_kind(tmp_path):
    """The suggested call names kind='improved-diffusion' (a pasteable gk.models.load call)."""
    model = gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1,
                         attention_resolutions=(2,), channel_mult=(1, 2))
    torch.save(model.state_dict(), tmp_path / "i.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "i.pt", model_channels=64)
    assert "load with gk.models.load(path, kind='improved-diffusion', model_channels=32) or leave these options out" \
        in str(err.value)


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
