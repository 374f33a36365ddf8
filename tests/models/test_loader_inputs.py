"""gk.models.load on inputs that are easy to get wrong: official GMS files out of order or repeated, an
improved-diffusion head count the weights cannot tell, a checkpoint loaded as the wrong kind, and files
that hold no network weights. Each one either loads right, warns, or raises a message that says what to fix.
Every checkpoint is built here from the package's own classes, at tiny sizes."""
import shutil
import warnings

import pytest
import torch

import gms_kernels.models as gm
from gms_kernels.models.official_heads import build_official_head

IDDPM_CFG = dict(in_channels=3, model_channels=32, out_channels=3, num_res_blocks=1, attention_resolutions=(2,),
                 dropout=0.0, channel_mult=(1, 2), use_scale_shift_norm=True)
DDIM_CFG = dict(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(4,), resolution=8)


def randomize(module, seed=0, scale=0.05):
    """Perturb every weight (zero-initialised output convs would make the outputs trivially zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return module.eval()


def backbone(family, **kw):
    torch.manual_seed(0)
    if family == "iddpm":
        return randomize(gm.IDDPMUNet(**{**IDDPM_CFG, "num_heads": 4, **kw}))
    return randomize(gm.DDIMModel(**{**DDIM_CFG, **kw}))


def head_state(family, net, bias, seed):
    """An official 'simple' head whose output is ``bias`` plus a small input-dependent part."""
    head = build_official_head(f"{'iddpm' if family == 'iddpm' else 'ddim'}-simple", net, 3, 0.0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        conv = head[2] if family == "iddpm" else head.conv_out2
        conv.weight.copy_(0.01 * torch.randn(conv.weight.shape, generator=g))
        conv.bias.fill_(bias)
    prefix = "out2." if family == "iddpm" else ""
    return {prefix + k: v for k, v in head.state_dict().items()}


def official_file(path, state):
    """As the official main.py saves: {'net_model', 'ema_model', 'optim', 'step'}."""
    torch.save({"net_model": state, "ema_model": state, "optim": {"state": {}, "param_groups": []}, "step": 10}, path)
    return path


def official_files(tmp_path, family):
    """[eps1, eps2, eps3]: the eps^2 head returns about 1 (above e1^2), the eps^3 head about -0.2."""
    net = backbone(family)
    state = net.state_dict()
    return [official_file(tmp_path / "eps1.pt", state),
            official_file(tmp_path / "eps2.pt", {**state, **head_state(family, net, 1.0, 2)}),
            official_file(tmp_path / "eps3.pt", {**state, **head_state(family, net, -0.2, 3)})]


def options(family):
    return {**IDDPM_CFG, "num_heads": 4} if family == "iddpm" else dict(DDIM_CFG)


def order_warnings(record):
    return [w for w in record if "[eps1, eps2, eps3]" in str(w.message)]


# -- official GMS files in the wrong order or repeated --------------------------------------------------
@pytest.mark.parametrize("family", ["iddpm", "ddim"])
def test_official_files_in_the_right_order_load_without_an_order_warning(family, tmp_path):
    paths = official_files(tmp_path, family)
    for shared in (True, False):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            net = gm.load(paths, kind="gms-official", shared_backbone=shared, **options(family))
        assert not order_warnings(record), [str(w.message) for w in record]
        assert (net.orders == (2, 3)) if shared else (net.output_heads == 3)


@pytest.mark.parametrize("family", ["iddpm", "ddim"])
@pytest.mark.parametrize("shared", [True, False])
def test_swapped_eps2_and_eps3_files_warn_naming_the_expected_order(family, shared, tmp_path):
    eps1, eps2, eps3 = official_files(tmp_path, family)
    with pytest.warns(UserWarning, match=r"(?s)eps3\.pt.*look swapped.*\[eps1, eps2, eps3\]") as record:
        gm.load([eps1, eps3, eps2], kind="gms-official", shared_backbone=shared, **options(family))
    assert len(order_warnings(record)) == 1
    assert order_warnings(record)[0].filename == __file__  # (it points at the load call)


def test_an_eps3_file_given_as_the_eps2_one_warns(tmp_path):
    """[eps, eps^3] for an SN-DDPM network: the second-order head fails E[eps^2] >= E[eps]^2."""
    eps1, _, eps3 = official_files(tmp_path, "iddpm")
    with pytest.warns(UserWarning, match=r"(?s)eps3\.pt.*E\[eps\^2\] >= E\[eps\]\^2.*\[eps1, eps2, eps3\]"):
        gm.load([eps1, eps3], kind="gms-official", **options("iddpm"))


@pytest.mark.parametrize("family", ["iddpm", "ddim"])
def test_a_repeated_eps2_file_is_refused_naming_the_files(family, tmp_path):
    eps1, eps2, _ = official_files(tmp_path, family)
    with pytest.raises(ValueError, match=r"(?s)eps2\.pt.*eps2\.pt.*identical head weights.*\[eps1, eps2, eps3\]"):
        gm.load([eps1, eps2, eps2], kind="gms-official", **options(family))
    copy = shutil.copy(eps2, tmp_path / "copy.pt")
    with pytest.raises(ValueError, match=r"(?s)eps2\.pt.*copy\.pt.*identical head weights"):
        gm.load([eps1, eps2, copy], kind="gms-official", shared_backbone=False, **options(family))


# -- an improved-diffusion head count the weights cannot tell ------------------------------------------
def head_count_warnings(record):
    return [w for w in record if "num_heads" in str(w.message) and "cannot be read" in str(w.message)]


def test_improved_diffusion_weights_without_num_heads_warn_once(tmp_path):
    torch.save(backbone("iddpm", num_heads=2).state_dict(), tmp_path / "model.pt")
    with pytest.warns(UserWarning, match=r"(?s)model\.pt.*num_heads=4 .*assumed.*num_heads=.*--load-option "
                                         r"num_heads=") as record:
        gm.load(tmp_path / "model.pt")
    assert len(head_count_warnings(record)) == 1 and head_count_warnings(record)[0].filename == __file__
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        gm.load(tmp_path / "model.pt", num_heads=2)
        gm.load(tmp_path / "model.pt", kind="improved-diffusion", num_heads=4)
    assert not head_count_warnings(record)


@pytest.mark.parametrize("shared", [True, False])
def test_official_improved_diffusion_files_without_num_heads_warn_once(shared, tmp_path):
    paths = official_files(tmp_path, "iddpm")
    cfg = {k: v for k, v in options("iddpm").items() if k != "num_heads"}
    with pytest.warns(UserWarning, match=r"eps1\.pt.*num_heads=4 .*assumed") as record:
        gm.load(paths, kind="gms-official", shared_backbone=shared, **cfg)
    assert len(head_count_warnings(record)) == 1 and head_count_warnings(record)[0].filename == __file__
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        gm.load(paths, kind="gms-official", shared_backbone=shared, **options("iddpm"))
        gm.load(official_files(tmp_path, "ddim"), kind="gms-official", shared_backbone=shared, **options("ddim"))
    assert not head_count_warnings(record)


# -- a checkpoint loaded as the wrong kind --------------------------------------------------------------
def tiny_state(kind):
    torch.manual_seed(0)
    if kind == "pytorch-ddpm":
        return gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).state_dict()
    if kind == "improved-diffusion":
        return gm.IDDPMUNet(**{**IDDPM_CFG, "num_heads": 4}).state_dict()
    return gm.DDIMModel(**DDIM_CFG).state_dict()


@pytest.mark.parametrize("saved,given", [("pytorch-ddpm", "improved-diffusion"), ("pytorch-ddpm", "ddim"),
                                         ("improved-diffusion", "pytorch-ddpm"), ("improved-diffusion", "ddim"),
                                         ("ddim", "improved-diffusion"), ("ddim", "pytorch-ddpm")])
def test_a_checkpoint_loaded_as_another_kind_names_the_kind_it_looks_like(saved, given, tmp_path):
    torch.save(tiny_state(saved), tmp_path / "model.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "model.pt", kind=given, **({"resolution": 8} if given == "ddim" else {}))
    msg = str(err.value)
    assert "model.pt" in msg and "positional argument" not in msg
    article = "an" if saved[0] in "aeiou" else "a"
    assert f"looks like {article} {saved} checkpoint" in msg and f"kind={saved!r}" in msg and "leave kind out" in msg
    assert "pytorch-ddpm, improved-diffusion, ddim, gms-official" in msg
    # and auto-detection loads it
    gm.load(tmp_path / "model.pt", **{"ddim": {"resolution": 8}, "improved-diffusion": {"num_heads": 4}}.get(saved, {}))


def test_unknown_keys_loaded_as_improved_diffusion_say_they_are_not_such_a_state_dict(tmp_path):
    torch.save({"encoder.weight": torch.zeros(4, 3)}, tmp_path / "other.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "other.pt", kind="improved-diffusion")
    msg = str(err.value)
    assert "other.pt" in msg and "positional argument" not in msg
    assert "do not look like an improved-diffusion IDDPMUNet state dict" in msg and "encoder.weight" in msg
    assert "pytorch-ddpm, improved-diffusion, ddim" in msg


# -- files that hold no network weights -----------------------------------------------------------------
@pytest.mark.parametrize("data,shown", [({"step": 5}, "'step': int"), ({"a": 1}, "'a': int"),
                                        ({"epoch": 3, "lr": 0.1, "name": "run"}, "'lr': float"),
                                        (5, "an int")])
@pytest.mark.parametrize("kind", ["auto", "pytorch-ddpm", "improved-diffusion", "ddim"])
def test_a_file_without_tensors_says_it_holds_no_network_weights(data, shown, kind, tmp_path):
    torch.save(data, tmp_path / "state.pt")
    with pytest.raises(ValueError) as err:
        gm.load(tmp_path / "state.pt", kind=kind, **({"resolution": 8} if kind == "ddim" else {}))
    msg = str(err.value)
    assert "state.pt" in msg and "no network weights" in msg and shown in msg, msg
    assert "state dict" in msg and "ema_model" in msg  # (what is accepted)
    assert "Pass kind=" not in msg  # (no kind reads it)


def test_an_official_file_without_tensors_says_it_holds_no_network_weights(tmp_path):
    eps1, _, _ = official_files(tmp_path, "iddpm")
    torch.save({"step": 5}, tmp_path / "step.pt")
    with pytest.raises(ValueError, match=r"step\.pt.*no network weights.*'step': int"):
        gm.load([eps1, tmp_path / "step.pt"], kind="gms-official", **options("iddpm"))


# -- every file is read weights-only --------------------------------------------------------------------
def test_every_loader_reads_with_weights_only(tmp_path, monkeypatch):
    seen = []
    real = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    for kind in ("pytorch-ddpm", "improved-diffusion", "ddim"):
        torch.save(tiny_state(kind), tmp_path / f"{kind}.pt")
    paths = official_files(tmp_path, "ddim")
    gm.MomentNet(backbone("ddim")).save(tmp_path / "net.pt")
    monkeypatch.setattr(torch, "load", spy)
    gm.load(tmp_path / "pytorch-ddpm.pt")
    gm.load(tmp_path / "improved-diffusion.pt", num_heads=4)
    gm.load(tmp_path / "ddim.pt", resolution=8)
    gm.load(paths, kind="gms-official", **options("ddim"))
    gm.load(tmp_path / "net.pt")
    assert len(seen) == 7 and all(w is True for w in seen), seen
