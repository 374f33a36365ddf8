"""Official GMS checkpoints -> one network (kind="gms-official"), and the DDIM repository's Model as a backbone.

Fixtures: ../shared/fixtures/official_gms/{iddpm,ddpm}/ hold eps1/eps2/eps3.pt in the official save format
({'net_model', 'ema_model', 'step'}), the constructor arguments (config.json) and the outputs of the three
official networks on x, t (expected.pt). Head modes the fixtures do not cover are checked on files built
here from the layout the official classes describe, against float64 references written from that
description. Full-size configurations are checked by key and shape on the meta device (no weights).
"""
import argparse
import json
import math
from pathlib import Path
import re

import pytest
import torch
import torch.nn.functional as F

import gms_kernels as gk
import gms_kernels.models as gm
from gms_kernels.models import ddim_model, official_gms
from gms_kernels.models.ddim_model import DDIMModel, timestep_embedding
from conftest import official_fixtures, tiny_ddim, tiny_diffusers_unet, tiny_iddpm

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "official_gms"
if not FIXTURES.is_dir():  # a checkout elsewhere: the shared folder next to the working tree
    FIXTURES = Path("/work/shared/fixtures/official_gms")
FAMILIES = ("iddpm", "ddpm")  # folder names: improved-diffusion UNetModel, DDIM-repository Model
REL_TOL = 1e-4


def files(family, n=3):
    return [FIXTURES / family / f"eps{i}.pt" for i in range(1, n + 1)]


def config(family):
    return json.loads((FIXTURES / family / "config.json").read_text())


def expected(family):
    return torch.load(FIXTURES / family / "expected.pt", weights_only=True)


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def first_layer(backbone):
    return backbone.conv_in if isinstance(backbone, DDIMModel) else backbone.input_blocks[0]


def count_passes(modules):
    """A list that grows by one each time any backbone in ``modules`` starts a pass."""
    calls = []
    hooks = [first_layer(m).register_forward_hook(lambda *a: calls.append(1)) for m in modules]
    return calls, hooks


def official_file(path, state):
    """Save ``state`` as the official main.py does: {'net_model', 'ema_model', 'optim', 'step'}."""
    optim = {"state": {}, "param_groups": [{"lr": 2e-4, "betas": (0.9, 0.92, 0.92), "params": [0, 1]}]}
    torch.save({"net_model": state, "ema_model": state, "optim": optim, "step": 100}, path)
    return path


# -- the visible fixtures -------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shared", [True, False])
def test_fixtures_match_the_official_networks(family, shared):
    ref = expected(family)
    net = gm.load(files(family), kind="gms-official", shared_backbone=shared, **config(family))
    backbones = [net.backbone] if shared else [net.eps_net] + [n.backbone for n in net.head_nets]
    calls, hooks = count_passes(backbones)
    with torch.no_grad():
        out = net(ref["x"], ref["t"])
    for h in hooks:
        h.remove()
    assert out.shape == (3, 9, 16, 16)
    for got, name in zip(out.split(3, dim=1), ("e1", "e2", "e3")):
        assert rel_err(got, ref[name]) < REL_TOL, name
    if shared:
        assert isinstance(net, gm.MomentNet) and len(calls) == 1, "one backbone pass for e1, e2 and e3"
        assert net.head == ("ddim-complex" if family == "ddpm" else "iddpm-complex")
        assert all(not p.requires_grad for p in net.backbone.parameters())
    else:
        assert isinstance(net, official_gms.SeparateNets) and len(calls) == 3  # as the official sampler
    assert torch.equal(net.schedule.betas, gk.Schedule.linear(1000, 1e-4, 0.02).betas)
    assert net.time_input == ("index" if family == "ddpm" else "scaled")
    assert not net.training


@pytest.mark.parametrize("family", FAMILIES)
def test_two_files_for_sn_ddpm_and_one_for_eps(family):
    ref = expected(family)
    sn = gm.load(files(family, 2), kind="gms-official", **config(family))
    eps = gm.load(files(family, 1), kind="gms-official", **config(family))
    assert sn.orders == (2,) and sn.head == ("ddim-complex" if family == "ddpm" else "iddpm-complex")
    with torch.no_grad():
        e1, e2 = sn(ref["x"], ref["t"]).split(3, dim=1)
        only = eps(ref["x"], ref["t"])
    assert rel_err(e1, ref["e1"]) < REL_TOL and rel_err(e2, ref["e2"]) < REL_TOL
    assert only.shape == (3, 3, 16, 16) and rel_err(only, ref["e1"]) < REL_TOL
    assert eps.schedule.T == 1000
    shifted = gm.load(files(family, 2), kind="gms-official", time_input="index+1", **config(family))
    assert shifted.time_input == "index+1"  # (for checkpoints trained on t+1)
    # the sn-ddpm and ddpm solvers run on them; gms needs the third head and says so
    assert torch.isfinite(gk.sample(sn, shape=(2, 3, 16, 16), steps=3, solver="sn-ddpm", generator=0,
                                    progress=False)).all()
    assert torch.isfinite(gk.sample(eps, shape=(2, 3, 16, 16), steps=3, solver="ddim", generator=0,
                                    progress=False)).all()
    with pytest.raises(ValueError, match="needs 3 head"):
        gk.sample(sn, shape=(2, 3, 16, 16), steps=3, solver="gms", generator=0, progress=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_gms_sampling_with_merged_and_separate_networks(family):
    merged = gm.load(files(family), kind="gms-official", **config(family))
    separate = gm.load(files(family), kind="gms-official", shared_backbone=False, **config(family))
    kw = dict(shape=(2, 3, 16, 16), steps=3, solver="gms", generator=0, progress=False, backend="torch")
    a, b = gk.sample(merged, **kw), gk.sample(separate, **kw)
    assert a.shape == (2, 3, 16, 16) and torch.isfinite(a).all()
    # the fixtures' backbones are bit-identical, so one pass or three give the same samples
    assert torch.allclose(a, b, atol=1e-5)


def test_auto_detection(tmp_path):
    ref = expected("iddpm")
    with torch.no_grad():  # a list is read as official GMS files, an official iddpm file alone as the eps network
        assert rel_err(gm.load(files("iddpm"), **config("iddpm"))(ref["x"], ref["t"])[:, 6:], ref["e3"]) < REL_TOL
        eps = gm.load(files("iddpm")[0])
    assert isinstance(eps, gm.IDDPMUNet) and eps.schedule.T == 1000
    with torch.no_grad():
        assert rel_err(eps(ref["x"], ref["t"]), ref["e1"]) < REL_TOL
    # a DDIM Model file: {'ema_model', ...}, a raw state dict, or the DDIM repository's list with module. prefixes
    state = torch.load(files("ddpm")[0], weights_only=True)["ema_model"]
    torch.save(state, tmp_path / "raw.pt")
    prefixed = {"module." + k: v for k, v in state.items()}
    torch.save([prefixed, {"state": {}, "param_groups": []}, 3, 1000, prefixed], tmp_path / "ddim_repo.pth")
    ddpm_ref = expected("ddpm")
    for path in (files("ddpm")[0], tmp_path / "raw.pt", tmp_path / "ddim_repo.pth"):
        model = gm.load(path, resolution=16)
        assert isinstance(model, DDIMModel) and model.config["attn_resolutions"] == [8]
        with torch.no_grad():
            assert rel_err(model(ddpm_ref["x"], ddpm_ref["t"]), ddpm_ref["e1"]) < REL_TOL
    # the image size also follows from the attention sizes
    assert gm.load(tmp_path / "raw.pt", kind="ddim", attn_resolutions=[8]).resolution == 16


def test_raw_state_dicts_and_net_model(tmp_path):
    """sample.py falls back to a raw state dict; use_ema=False reads net_model instead of ema_model."""
    raw, net_only = [], []
    for i, path in enumerate(files("iddpm"), start=1):
        state = torch.load(path, weights_only=True)["net_model"]
        torch.save(state, tmp_path / f"raw{i}.pt")
        torch.save({"net_model": state, "step": 5}, tmp_path / f"net{i}.pt")
        raw.append(tmp_path / f"raw{i}.pt")
        net_only.append(tmp_path / f"net{i}.pt")
    ref = expected("iddpm")
    for paths, options in ((raw, {}), (net_only, {"use_ema": False})):
        net = gm.load(paths, kind="gms-official", **options, **config("iddpm"))
        with torch.no_grad():
            assert rel_err(net(ref["x"], ref["t"])[:, 6:], ref["e3"]) < REL_TOL
    with pytest.raises(ValueError, match=r"net1\.pt: the checkpoint has no 'ema_model' .* use_ema=False"):
        gm.load(net_only, kind="gms-official", **config("iddpm"))


# -- head modes the fixtures do not cover ---------------------------------------------------------
def iddpm_res_layout(C, E, scale_shift):
    return {"in_layers.0.weight": (C,), "in_layers.0.bias": (C,), "in_layers.2.weight": (C, C, 3, 3),
            "in_layers.2.bias": (C,), "emb_layers.1.weight": ((2 if scale_shift else 1) * C, E),
            "emb_layers.1.bias": ((2 if scale_shift else 1) * C,), "out_layers.0.weight": (C,),
            "out_layers.0.bias": (C,), "out_layers.3.weight": (C, C, 3, 3), "out_layers.3.bias": (C,)}


def iddpm_head_layout(mode, C, E, out, scale_shift):
    """out2.* of UNetModel4Pretrained: Sequential indices as the official constructor numbers them."""
    norm = lambda i: {f"out2.{i}.weight": (C,), f"out2.{i}.bias": (C,)}  # noqa: E731
    conv = lambda i: {f"out2.{i}.weight": (out, C, 3, 3), f"out2.{i}.bias": (out,)}  # noqa: E731
    res = lambda i: {f"out2.{i}.{k}": s for k, s in iddpm_res_layout(C, E, scale_shift).items()}  # noqa: E731
    return {"simple": {**norm(0), **conv(2)},                                      # GN, SiLU, conv
            "complex": {**res(0), **norm(1), **conv(3)},                           # Res, GN, SiLU, conv
            "complex2": {**res(0), **norm(1), **res(3), **conv(5)}}[mode]          # Res, GN, SiLU, Res, SiLU, conv


def ddim_res_layout(prefix, cin, cout, E):
    out = {f"{prefix}norm1.weight": (cin,), f"{prefix}norm1.bias": (cin,), f"{prefix}conv1.weight": (cout, cin, 3, 3),
           f"{prefix}conv1.bias": (cout,), f"{prefix}temb_proj.weight": (cout, E), f"{prefix}temb_proj.bias": (cout,),
           f"{prefix}norm2.weight": (cout,), f"{prefix}norm2.bias": (cout,),
           f"{prefix}conv2.weight": (cout, cout, 3, 3), f"{prefix}conv2.bias": (cout,)}
    if cin != cout:
        out.update({f"{prefix}nin_shortcut.weight": (cout, cin, 1, 1), f"{prefix}nin_shortcut.bias": (cout,)})
    return out


def ddim_head_layout(mode, C, E, out):
    layout = {"norm_out2.weight": (C,), "norm_out2.bias": (C,), "conv_out2.weight": (out, C, 3, 3),
              "conv_out2.bias": (out,)}
    return {**(ddim_res_layout("before_out.", C, C, E) if mode == "complex" else {}), **layout}


def random_weights(layout, seed):
    """GroupNorm scales (the only 1-D weights) near 1, everything else small."""
    g = torch.Generator().manual_seed(seed)
    return {k: (1.0 + 0.1 * torch.randn(s, generator=g)) if k.endswith("weight") and len(s) == 1
            else 0.05 * torch.randn(s, generator=g) for k, s in layout.items()}


def gn(x, w, b, eps):
    return F.group_norm(x, 32, w, b, eps)


def ref_iddpm_head(mode, w, h, emb, scale_shift):
    """float64 reference of out2 from its description (improved-diffusion ResBlock, GroupNorm eps 1e-5)."""
    w = {k[len("out2."):]: v.double() for k, v in w.items()}

    def res(p, x):
        r = F.conv2d(F.silu(gn(x, w[p + "in_layers.0.weight"], w[p + "in_layers.0.bias"], 1e-5)),
                     w[p + "in_layers.2.weight"], w[p + "in_layers.2.bias"], padding=1)
        e = F.linear(F.silu(emb), w[p + "emb_layers.1.weight"], w[p + "emb_layers.1.bias"])[:, :, None, None]
        n = lambda y: gn(y, w[p + "out_layers.0.weight"], w[p + "out_layers.0.bias"], 1e-5)  # noqa: E731
        if scale_shift:
            scale, shift = e.chunk(2, dim=1)
            r = F.silu(n(r) * (1 + scale) + shift)
        else:
            r = F.silu(n(r + e))
        return x + F.conv2d(r, w[p + "out_layers.3.weight"], w[p + "out_layers.3.bias"], padding=1)

    def conv(i, x):
        return F.conv2d(x, w[f"{i}.weight"], w[f"{i}.bias"], padding=1)

    def norm_silu(i, x):
        return F.silu(gn(x, w[f"{i}.weight"], w[f"{i}.bias"], 1e-5))

    if mode == "simple":
        return conv(2, norm_silu(0, h))
    if mode == "complex":
        return conv(3, norm_silu(1, res("0.", h)))
    return conv(5, F.silu(res("3.", norm_silu(1, res("0.", h)))))


def ref_ddim_head(mode, w, h, temb):
    """float64 reference of Model4Pretrained's head (ResnetBlock, GroupNorm eps 1e-6)."""
    w = {k: v.double() for k, v in w.items()}
    if mode == "complex":
        p = "before_out."
        r = F.conv2d(F.silu(gn(h, w[p + "norm1.weight"], w[p + "norm1.bias"], 1e-6)), w[p + "conv1.weight"],
                     w[p + "conv1.bias"], padding=1)
        r = r + F.linear(F.silu(temb), w[p + "temb_proj.weight"], w[p + "temb_proj.bias"])[:, :, None, None]
        r = F.conv2d(F.silu(gn(r, w[p + "norm2.weight"], w[p + "norm2.bias"], 1e-6)), w[p + "conv2.weight"],
                     w[p + "conv2.bias"], padding=1)
        h = h + r
    return F.conv2d(F.silu(gn(h, w["norm_out2.weight"], w["norm_out2.bias"], 1e-6)), w["conv_out2.weight"],
                    w["conv_out2.bias"], padding=1)


MODES = [("iddpm", m, ss) for m in ("simple", "complex", "complex2") for ss in (True, False)] \
    + [("ddpm", m, None) for m in ("simple", "complex")]  # (the DDIM Model has no scale-shift option)


@pytest.mark.parametrize("family,mode,scale_shift", MODES)
def test_every_head_mode(family, mode, scale_shift, tmp_path):
    cfg = config(family)
    backbone = torch.load(files(family)[0], weights_only=True)["ema_model"]
    if family == "iddpm" and not scale_shift:  # an eps network without scale-shift: emb_layers half as wide
        backbone = {k: (v[: v.shape[0] // 2] if "emb_layers.1" in k else v) for k, v in backbone.items()}
        cfg = {**cfg, "use_scale_shift_norm": False}
    C, E, out = 32, 128, 3
    paths = [official_file(tmp_path / "eps1.pt", backbone)]
    heads = []
    for n in (2, 3):
        layout = iddpm_head_layout(mode, C, E, out, scale_shift) if family == "iddpm" else ddim_head_layout(mode, C, E, out)
        heads.append(random_weights(layout, seed=n))
        paths.append(official_file(tmp_path / f"eps{n}.pt", {**backbone, **heads[-1]}))
    net = gm.load(paths, kind="gms-official", **cfg)
    assert net.head == f"{'iddpm' if family == 'iddpm' else 'ddim'}-{mode}"
    ref = expected(family)
    with torch.no_grad():
        out_ = net(ref["x"], ref["t"])
        h, emb, _ = net.backbone.forward_features(ref["x"], ref["t"])
    if family == "ddpm" or scale_shift:  # (the fixture's own backbone)
        assert rel_err(out_[:, :3], ref["e1"]) < REL_TOL
    for n, w in zip((2, 3), heads):
        want = (ref_iddpm_head(mode, w, h.double(), emb.double(), scale_shift) if family == "iddpm"
                else ref_ddim_head(mode, w, h.double(), emb.double()))
        assert rel_err(out_[:, 3 * (n - 1):3 * n], want) < 1e-5, (mode, n)
    # the same files, run separately, agree; mode= may be passed when it is the right one
    sep = gm.load(paths, kind="gms-official", shared_backbone=False, mode=mode, **cfg)
    with torch.no_grad():
        assert torch.allclose(sep(ref["x"], ref["t"]), out_, atol=1e-6)
    # and the network saves and reloads as a MomentNet file
    net.save(tmp_path / "net.pt")
    with torch.no_grad():
        assert torch.equal(gm.load(tmp_path / "net.pt")(ref["x"], ref["t"]), out_)


def test_mixed_head_modes_per_order(tmp_path):
    backbone = torch.load(files("iddpm")[0], weights_only=True)["ema_model"]
    e2 = random_weights(iddpm_head_layout("simple", 32, 128, 3, True), seed=2)
    e3 = random_weights(iddpm_head_layout("complex2", 32, 128, 3, True), seed=3)
    paths = [official_file(tmp_path / "a.pt", backbone), official_file(tmp_path / "b.pt", {**backbone, **e2}),
             official_file(tmp_path / "c.pt", {**backbone, **e3})]
    net = gm.load(paths, kind="gms-official", **config("iddpm"))
    assert net.head == ["iddpm-simple", "iddpm-complex2"]
    ref = expected("iddpm")
    with torch.no_grad():
        out = net(ref["x"], ref["t"])
        h, emb, _ = net.backbone.forward_features(ref["x"], ref["t"])
    assert rel_err(out[:, 3:6], ref_iddpm_head("simple", e2, h.double(), emb.double(), True)) < 1e-5
    assert rel_err(out[:, 6:], ref_iddpm_head("complex2", e3, h.double(), emb.double(), True)) < 1e-5


# -- backbones that differ ------------------------------------------------------------------------
@pytest.mark.parametrize("family,key", [("iddpm", "input_blocks.1.0.in_layers.2.weight"), ("ddpm", "down.0.block.0.conv1.weight")])
def test_different_backbones_are_refused_naming_the_key(family, key, tmp_path):
    data = torch.load(files(family)[2], weights_only=True)
    state = dict(data["ema_model"])
    state[key] = state[key] + 0.1
    changed = official_file(tmp_path / "eps3.pt", state)
    paths = files(family, 2) + [changed]
    with pytest.raises(ValueError, match=rf"eps3\.pt \[ema_model\]: its backbone differs .* at '{key}'.*shared_backbone=False"):
        gm.load(paths, kind="gms-official", **config(family))
    # opting in runs each network on its own backbone: e1, e2 still match, e3 comes from the changed network
    net = gm.load(paths, kind="gms-official", shared_backbone=False, **config(family))
    ref = expected(family)
    with torch.no_grad():
        out = net(ref["x"], ref["t"])
    assert rel_err(out[:, :3], ref["e1"]) < REL_TOL and rel_err(out[:, 3:6], ref["e2"]) < REL_TOL
    assert rel_err(out[:, 6:], ref["e3"]) > 1e-3


def test_rounding_level_backbone_drift_is_accepted_unless_exact(tmp_path):
    """An EMA of frozen weights may move them by rounding; 1e-7 relative passes, backbone_rtol=0 refuses it."""
    data = torch.load(files("ddpm")[1], weights_only=True)
    state = dict(data["ema_model"])
    key = "up.1.block.0.conv1.weight"
    state[key] = state[key] * (1 + 1e-7)
    paths = [files("ddpm")[0], official_file(tmp_path / "eps2.pt", state)]
    gm.load(paths, kind="gms-official", **config("ddpm"))
    with pytest.raises(ValueError, match=f"at '{key}': max \\|difference\\|"):
        gm.load(paths, kind="gms-official", backbone_rtol=0, **config("ddpm"))


# -- safety and errors ----------------------------------------------------------------------------
def test_files_are_read_weights_only(tmp_path, monkeypatch):
    seen = []
    real = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    gm.load(files("ddpm"), kind="gms-official", **config("ddpm"))
    assert seen == [True, True, True]
    monkeypatch.undo()
    state = torch.load(files("ddpm")[0], weights_only=True)["ema_model"]
    torch.save({"ema_model": state, "net_model": state, "args": argparse.Namespace(lr=1)}, tmp_path / "pickled.pt")
    with pytest.raises(ValueError, match=r"pickled\.pt: the checkpoint holds a Python object .*weights_only=True"):
        gm.load([tmp_path / "pickled.pt"] + files("ddpm")[1:], kind="gms-official", **config("ddpm"))


def test_clear_errors(tmp_path):
    cfg_i, cfg_d = config("iddpm"), config("ddpm")
    cases = [
        (dict(paths=files("iddpm"), **{**cfg_i, "model_channels": 64}), r"(?s)eps1\.pt \[ema_model\]: the weights do not "
         r"match IDDPMUNet\(.*model_channels=64.*fix: the weights match IDDPMUNet\(.*model_channels=32"),
        (dict(paths=files("ddpm"), **{**cfg_d, "ch_mult": [1, 2, 2]}), r"do not match DDIMModel\(.*ch_mult=\[1, 2, 2\]"),
        (dict(paths=files("ddpm"), **{**cfg_d, "resolution": 32}), r"do not match DDIMModel\(.*resolution=32"),
        (dict(paths=files("ddpm"), **{k: v for k, v in cfg_d.items() if k not in ("resolution", "attn_resolutions")}),
         r"image size is not stored .* pass resolution="),
        (dict(paths=files("iddpm"), **{**cfg_i, "dims": 3}), r"dims=3: only 2-D"),
        (dict(paths=files("iddpm"), **{**cfg_i, "num_classes": 10}), r"num_classes=10: class-conditional"),
        (dict(paths=files("iddpm"), **{**cfg_i, "mode": "simple"}), r"mode='simple' was passed, but .* mode 'complex'"),
        (dict(paths=files("iddpm"), **cfg_i, nonsense=1), r"unknown option\(s\) for kind 'gms-official': nonsense"),
        (dict(paths=files("iddpm")[::-1], **cfg_i), r"eps3\.pt \[ema_model\]: the first file must be the eps network"),
        (dict(paths=[files("iddpm")[0]] * 2, **cfg_i), r"file 2 should be the eps\^2 network, but it has no head"),
        (dict(paths=[files("iddpm")[0], files("ddpm")[1]], **cfg_i), r"holds a ddim network, but .* improved-diffusion"),
        (dict(paths=files("iddpm") + files("iddpm")[:1], **cfg_i), r"takes 1 to 3 files"),
        (dict(paths=files("iddpm"), **cfg_i, backbone_rtol=-1), r"backbone_rtol must be a number >= 0"),
        (dict(paths=files("iddpm"), **cfg_d), r"holds an improved-diffusion network, but the option\(s\) ch, out_ch, "
         r"ch_mult, attn_resolutions, resamp_with_conv, resolution are the DDIM Model's"),
        (dict(paths=[tmp_path / "missing.pt"], **cfg_i), r"missing\.pt: no such file"),
    ]
    for kwargs, message in cases:
        paths = kwargs.pop("paths")
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            gm.load(paths, kind="gms-official", **kwargs)
    with pytest.raises(ValueError, match="a list of files is read by kind='gms-official'"):
        gm.load(files("ddpm"), kind="ddim")
    # a head whose keys fit no official mode is named with its keys
    state = torch.load(files("iddpm")[1], weights_only=True)["ema_model"]
    del state["out2.1.weight"]
    with pytest.raises(ValueError, match=r"head keys match no official improved-diffusion head mode .*out2\.0\."):
        gm.load([files("iddpm")[0], official_file(tmp_path / "e2.pt", state)], kind="gms-official", **cfg_i)
    # a DDIM eps^n file alone is pointed to the official loader
    with pytest.raises(ValueError, match="official GMS head .* kind='gms-official'"):
        gm.load(files("ddpm")[1], kind="ddim", resolution=16)


# -- full-size configurations, by key and shape (meta device, no weights) -------------------------
def ddim_layout(ch, ch_mult, num_res_blocks, attn_resolutions, resolution, in_ch=3, out_ch=3):
    """Key -> shape of the DDIM repository's Model, from its description (encoder levels with
    num_res_blocks ResnetBlocks and attention where the size is in attn_resolutions, a stride-2 conv
    between levels; middle block/attention/block; decoder levels with one more block each, whose input
    is the running width plus the matching encoder output; nearest-neighbour upsample + conv)."""
    E = 4 * ch
    out = {"temb.dense.0.weight": (E, ch), "temb.dense.0.bias": (E,), "temb.dense.1.weight": (E, E),
           "temb.dense.1.bias": (E,), "conv_in.weight": (ch, in_ch, 3, 3), "conv_in.bias": (ch,)}

    def attn(prefix, c):
        return {f"{prefix}{n}.{p}": ((c,) if n == "norm" or p == "bias" else (c, c, 1, 1))
                for n in ("norm", "q", "k", "v", "proj_out") for p in ("weight", "bias")}

    def conv3(prefix, c):
        return {prefix + "weight": (c, c, 3, 3), prefix + "bias": (c,)}

    skips, c, size = [ch], ch, resolution
    for L, m in enumerate(ch_mult):
        for b in range(num_res_blocks):
            out.update(ddim_res_layout(f"down.{L}.block.{b}.", c, ch * m, E))
            c = ch * m
            if size in attn_resolutions:
                out.update(attn(f"down.{L}.attn.{b}.", c))
            skips.append(c)
        if L < len(ch_mult) - 1:
            out.update(conv3(f"down.{L}.downsample.conv.", c))
            skips.append(c)
            size //= 2
    out.update({**ddim_res_layout("mid.block_1.", c, c, E), **attn("mid.attn_1.", c),
                **ddim_res_layout("mid.block_2.", c, c, E)})
    for L in reversed(range(len(ch_mult))):
        for b in range(num_res_blocks + 1):
            out.update(ddim_res_layout(f"up.{L}.block.{b}.", c + skips.pop(), ch * ch_mult[L], E))
            c = ch * ch_mult[L]
            if size in attn_resolutions:
                out.update(attn(f"up.{L}.attn.{b}.", c))
        if L > 0:
            out.update(conv3(f"up.{L}.upsample.conv.", c))
            size *= 2
    out.update({"norm_out.weight": (c,), "norm_out.bias": (c,), "conv_out.weight": (out_ch, c, 3, 3),
                "conv_out.bias": (out_ch,)})
    return out


def shapes(module):
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


DDIM_CONFIGS = {  # name: (Model arguments, published parameter count in millions or None)
    "cifar10": (dict(ch=128, ch_mult=(1, 2, 2, 2), num_res_blocks=2, attn_resolutions=(16,), resolution=32), 35.7),
    "celeba": (dict(ch=128, ch_mult=(1, 2, 2, 2, 4), num_res_blocks=2, attn_resolutions=(16,), resolution=64), None),
    "lsun": (dict(ch=128, ch_mult=(1, 1, 2, 2, 4, 4), num_res_blocks=2, attn_resolutions=(16,), resolution=256), 114),
}


@pytest.mark.parametrize("name", DDIM_CONFIGS)
def test_full_size_ddim_models_by_key_and_shape(name):
    cfg, millions = DDIM_CONFIGS[name]
    with torch.device("meta"):
        model = DDIMModel(out_ch=3, in_channels=3, **cfg)
        preset = DDIMModel.preset(name)
    assert shapes(model) == ddim_layout(**cfg) == shapes(preset)
    n = sum(p.numel() for p in model.parameters())
    if millions is not None:  # DDPM paper: 35.7M (CIFAR10), 114M (LSUN 256)
        assert round(n / 1e6, 1 if millions < 100 else 0) == millions
    # the weights tell everything but the image size, which the attention size gives back
    state = model.state_dict()
    inferred = DDIMModel.infer_config(state)
    assert inferred["ch_mult"] == list(cfg["ch_mult"]) and inferred["num_res_blocks"] == 2
    assert ddim_model.resolve_resolution(inferred["attn_levels"], None, [16])["resolution"] == cfg["resolution"]
    # the official head (complex mode) on the full-size backbone
    with torch.device("meta"):
        net = gm.MomentNet(model, head="ddim-complex")
    head = {k[len("heads.2."):]: s for k, s in shapes(net).items() if k.startswith("heads.2.")}
    assert head == ddim_head_layout("complex", 128, 512, 3)
    fake = {k: torch.empty(s, device="meta") for k, s in head.items()}
    assert official_gms.detect_mode("ddim", fake, model, "x") == "ddim-complex"


def test_ddpm_cifar10_is_pytorch_ddpms_network_without_the_table():
    """The DDIM Model for CIFAR10 and pytorch-ddpm's UNet hold the same tensors (pytorch-ddpm adds its
    fixed 1000x128 sinusoid table): 35,874,307 - 128,000 numbers, shape for shape."""
    with torch.device("meta"):
        ddim = DDIMModel.preset("cifar10")
        ddpm = gm.PytorchDDPMUNet()
    theirs = sorted(s for k, s in shapes(ddpm).items() if k != "time_embedding.timembedding.0.weight")
    assert sorted(shapes(ddim).values()) == theirs
    assert sum(p.numel() for p in ddim.parameters()) == 35_874_307 - 1000 * 128


@pytest.mark.parametrize("mode", ["simple", "complex", "complex2"])
def test_full_size_iddpm_official_heads(mode):
    """The official CIFAR10 GMS network (an improved-diffusion UNetModel): its out2 head in every mode, by key and shape."""
    with torch.device("meta"):
        backbone = gm.IDDPMUNet(in_channels=3, model_channels=128, out_channels=3, num_res_blocks=3,
                                attention_resolutions=(2, 4), dropout=0.3, channel_mult=(1, 2, 2, 2), num_heads=4,
                                use_scale_shift_norm=True)
        net = gm.MomentNet(backbone, head=f"iddpm-{mode}")
    # improved-diffusion's CIFAR10 network has 52,546,438 numbers with 6 outputs; GMS keeps 3 (eps only)
    assert sum(p.numel() for p in backbone.parameters()) == 52_546_438 - 3 * (128 * 3 * 3 + 1)
    head = {"out2." + k[len("heads.3."):]: s for k, s in shapes(net).items() if k.startswith("heads.3.")}
    assert head == iddpm_head_layout(mode, 128, 512, 3, True)
    fake = {k[len("out2."):]: torch.empty(s, device="meta") for k, s in head.items()}
    assert official_gms.detect_mode("improved-diffusion", fake, backbone, "x") == f"iddpm-{mode}"


# -- the DDIM Model as a backbone -----------------------------------------------------------------
def test_ddim_time_embedding_formula():
    t = torch.tensor([0.0, 3.0, 999.0])
    emb = timestep_embedding(t, 10).double()
    k = torch.arange(5, dtype=torch.float64)
    angles = t.double()[:, None] * torch.exp(-k * math.log(10000) / 4)[None, :]
    assert torch.allclose(emb, torch.cat([angles.sin(), angles.cos()], dim=1), atol=1e-6)
    assert timestep_embedding(t, 9)[:, -1].eq(0).all()


def test_ddim_model_in_train_heads(tmp_path):
    torch.manual_seed(0)
    backbone = DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(8,), dropout=0.1,
                         resolution=16)
    frozen = {k: v.clone() for k, v in backbone.state_dict().items()}
    for head in ("conv", "ddim-complex"):
        net = gm.MomentNet(backbone, head=head)
        before = {k: v.clone() for k, v in net.heads.state_dict().items()}
        data = torch.rand(8, 3, 16, 16) * 2 - 1
        result = gk.train_heads(net, data, steps=2, batch_size=4, progress=False, ema_decay=0.0)
        assert result.steps == 2 and {"mse_e2", "mse_e3"} <= set(result.history[-1])
        assert any(not torch.equal(before[k], v) for k, v in net.heads.state_dict().items()), head
        assert all(torch.equal(frozen[k], v) for k, v in net.backbone.state_dict().items()), head
    with pytest.raises(ValueError, match=r"takes \[N, 3, 16, 16\] inputs"):
        backbone(torch.zeros(1, 3, 8, 8), torch.zeros(1))


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


def test_first_difference_reports_a_key_only_the_other_file_has():
    from gms_kernels.models.official_gms import first_difference

    ref = {"a": torch.zeros(2), "b": torch.ones(3)}
    assert first_difference(ref, dict(ref), 0.0) is None
    assert first_difference(ref, {**ref, "c": torch.zeros(1)}, 0.0) == ("c", "not in the eps network")


def test_a_config_that_does_not_fit_official_weights_names_the_kind_to_load_with():
    from test_official_gms import config, files

    with pytest.raises(ValueError, match=r"load with gk\.models\.load\(path, kind='gms-official', model_channels=32\)"):
        gm.load(files("iddpm"), kind="gms-official", **{**config("iddpm"), "model_channels": 64})


def test_the_official_loader_keeps_eps_of_its_backbone():
    """The official GMS code reads eps from its UNet (UNetModel3OutChannels drops a learned sigma): the
    loaded backbone is marked eps_only, whatever its output width."""
    from test_official_gms import config, files

    net = gm.load(files("iddpm"), kind="gms-official", **config("iddpm"))
    assert net.backbone.eps_only is True


def test_official_family_detection_tells_a_ddim_model_from_a_diffusers_unet():
    """family_of reads the backbone's keys: the DDIM repository's Model (temb.dense, or conv_in with
    mid.block_1), improved-diffusion, or neither. A diffusers UNet2DModel also has conv_in but no mid.block_1."""
    from gms_kernels.models.official_gms import family_of

    assert family_of(tiny_iddpm().state_dict()) == "improved-diffusion"
    assert family_of(tiny_diffusers_unet(3).state_dict()) is None
    for key in ("time_embed.0.weight", "input_blocks.0.0.weight"):  # (either key alone says improved-diffusion)
        assert family_of({key: torch.zeros(1)}) == "improved-diffusion"
    ddim_like = {"conv_in.weight": torch.zeros(1), "mid.block_1.conv1.weight": torch.zeros(1)}
    assert family_of(ddim_like) == "ddim" and family_of({"temb.dense.0.weight": torch.zeros(1)}) == "ddim"


def test_one_official_file_given_alone_is_an_eps_network():
    """kind='gms-official' takes one path as well as a list of one (the eps network, no heads)."""
    from test_official_gms import config, files

    single = gm.load(files("iddpm")[0], kind="gms-official", **config("iddpm"))
    listed = gm.load(files("iddpm")[:1], kind="gms-official", **config("iddpm"))
    assert type(single) is type(listed)
    assert all(torch.equal(a, b) for a, b in zip(single.state_dict().values(), listed.state_dict().values()))


def test_an_official_file_without_the_asked_weights_names_the_other_entry(tmp_path):
    from test_official_gms import config, files

    data = torch.load(files("iddpm")[0], weights_only=True)
    torch.save({"net_model": data["ema_model"]}, tmp_path / "net_only.pt")
    with pytest.raises(ValueError, match=r"net_only\.pt: the checkpoint has no 'ema_model' .* pass use_ema=False to "
                                         r"load 'net_model'"):
        gm.load([tmp_path / "net_only.pt"], kind="gms-official", **config("iddpm"))


def test_first_difference_reports_a_shape_difference_as_the_two_shapes():
    from gms_kernels.models.official_gms import first_difference

    assert first_difference({"w": torch.zeros(2, 3)}, {"w": torch.zeros(3, 2)}, 0.0) == ("w", "shape [3, 2] vs [2, 3]")


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


def test_load_official_called_directly_reads_to_the_cpu():
    from gms_kernels.models.official_gms import load_official

    paths, cfg = official_fixtures("ddpm")
    net = load_official(paths[:1], **cfg)
    assert {p.device.type for p in net.parameters()} == {"cpu"}


def test_official_ddim_head_keys_that_match_no_mode_are_listed_without_a_prefix():
    from gms_kernels.models.official_gms import detect_mode

    head = {f"k{i:02d}.weight": torch.zeros(1) for i in range(12)}
    shown = ", ".join(f"k{i:02d}.weight" for i in range(10))
    with pytest.raises(ValueError, match=re.escape(f"w: the head keys match no official ddim head mode "
                                                   f"(simple, complex); found 12: {shown}") + "$"):
        detect_mode("ddim", head, tiny_ddim(0), "w")


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


def test_official_networks_keep_the_dropout_of_their_config():
    """load_official builds the official heads (and the MomentNet) with the eps network's dropout (0.1 in the
    fixtures' config), so heads trained further drop out as the official ones did."""
    paths, cfg = official_fixtures("ddpm")
    assert cfg["dropout"] == 0.1
    net = gm.load(paths, kind="gms-official", **cfg)
    drops = [m.p for m in net.heads.modules() if isinstance(m, torch.nn.Dropout)]
    assert net.dropout == 0.1 and net.head_config["dropout"] == 0.1 and drops and set(drops) == {0.1}


def test_an_official_eps_file_detected_by_content_takes_the_options_given():
    """gk.models.load(one official GMS file) with kind left to detection passes the options on to
    load_official: the dropout is the one given, and an unknown option is refused."""
    paths, cfg = official_fixtures("iddpm")
    net = gm.load(paths[0], **{**cfg, "dropout": 0.2, "num_heads": 2})
    assert isinstance(net, gm.IDDPMUNet) and net.dropout == 0.2 and net.num_heads == 2
    with pytest.raises(ValueError, match="unknown option\\(s\\) for kind 'gms-official': colour"):
        gm.load(paths[0], colour=1)


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


def test_read_state_reads_the_ema_weights_by_default():
    """official_gms.read_state(path): the file's ema_model entry unless use_ema=False."""
    from gms_kernels.models.official_gms import read_state

    paths, _ = official_fixtures("ddpm")
    data = torch.load(paths[0], weights_only=True)
    state, where = read_state(paths[0])
    assert where.endswith("eps1.pt [ema_model]") and state.keys() == data["ema_model"].keys()
    assert all(torch.equal(state[k], data["ema_model"][k]) for k in state)
    assert read_state(paths[0], use_ema=False)[1].endswith("[net_model]")


def test_an_ema_only_official_file_read_without_ema_names_the_entry_that_loads(tmp_path):
    """read_state(use_ema=False) on a file holding only ema_model advises use_ema=True to load 'ema_model'."""
    from gms_kernels.models.official_gms import read_state

    paths, _ = official_fixtures("ddpm")
    data = torch.load(paths[0], weights_only=True)
    torch.save({"ema_model": data["ema_model"]}, tmp_path / "ema_only.pt")
    with pytest.raises(ValueError, match=r"ema_only\.pt: the checkpoint has no 'net_model' .*; pass use_ema=True to "
                                         r"load 'ema_model'$"):
        read_state(tmp_path / "ema_only.pt", use_ema=False)


def test_official_read_state_honours_map_location(tmp_path):
    from gms_kernels.models.official_gms import read_state

    torch.save({"ema_model": {"w": torch.ones(2)}, "net_model": {"w": torch.zeros(2)}}, tmp_path / "o.pt")
    state, where = read_state(tmp_path / "o.pt", map_location="meta")
    assert state["w"].device.type == "meta" and where.endswith("[ema_model]")
    state, _ = read_state(tmp_path / "o.pt", use_ema=False)
    assert state["w"].device.type == "cpu" and torch.equal(state["w"], torch.zeros(2))


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


def test_an_official_checkpoint_without_the_asked_entry_names_the_other_one():
    """use_ema=False on a file that holds only 'ema_model' points at use_ema=True and 'ema_model' (and the
    other way round)."""
    from gms_kernels.models.official_gms import read_state

    state = {"w": torch.zeros(2)}
    with pytest.raises(ValueError, match=r"has no 'net_model' .*; pass use_ema=True to load 'ema_model'$"):
        read_state("f.pt", {"ema_model": state}, use_ema=False)
    with pytest.raises(ValueError, match=r"has no 'ema_model' .*; pass use_ema=False to load 'net_model'$"):
        read_state("f.pt", {"net_model": state}, use_ema=True)


def test_one_official_file_found_by_detection_loads_onto_map_location():
    """An official GMS eps file passed alone with kind="auto" is detected and handed to the official loader
    with the map_location it was given (here "meta": shapes only)."""
    import json

    folder = _official_folder("iddpm")
    config = json.loads((folder / "config.json").read_text())
    for device in ("meta", torch.device("meta")):
        eps = gm.load(folder / "eps1.pt", map_location=device, **config)
        assert isinstance(eps, gm.IDDPMUNet) and {p.device.type for p in eps.parameters()} == {"meta"}
