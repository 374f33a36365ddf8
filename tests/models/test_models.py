"""gk.models: backbone architectures (key layout, counts, block math), diffusers adapter, MomentNet, loaders."""
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

import gms_kernels as gk
import gms_kernels.models as gm
from gms_kernels.models import iddpm as iddpm_mod
from gms_kernels.models import pytorch_ddpm as ddpm_mod
from gms_kernels.models._common import GroupNorm32





def randomize(module, seed=0, scale=0.05):
    """Perturb every trainable weight (zero-initialised convs would make outputs trivially zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "timembedding.0" not in name:
                p.add_(torch.randn(p.shape, generator=g) * scale)
    return module


def tiny_ddpm():
    torch.manual_seed(0)
    return randomize(gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1, dropout=0.1)).eval()


def tiny_iddpm(out_channels=6, **kw):
    torch.manual_seed(0)
    cfg = dict(in_channels=3, model_channels=32, out_channels=out_channels, num_res_blocks=1,
               attention_resolutions=(2,), dropout=0.0, channel_mult=(1, 2), num_heads=2, use_scale_shift_norm=True)
    return randomize(gm.IDDPMUNet(**{**cfg, **kw}), seed=1).eval()


@pytest.fixture(scope="module")
def diffusers_dir(tmp_path_factory):
    import diffusers

    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(sample_size=8, in_channels=3, out_channels=3, block_out_channels=(16, 32),
                                 layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                 up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8,
                                 attention_head_dim=8)
    randomize(unet, seed=2)
    path = tmp_path_factory.mktemp("pipe") / "unet"
    unet.save_pretrained(path)
    return path


def tiny_diffusers(diffusers_dir):
    from diffusers import UNet2DModel

    return UNet2DModel.from_pretrained(diffusers_dir, local_files_only=True, low_cpu_mem_usage=False).eval()


X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(5))


def times(family):
    return torch.tensor([3.5, 700.25]) if family == "improved-diffusion" else torch.tensor([3, 41])


def n_numbers(model):
    return sum(v.numel() for v in model.state_dict().values())


# -- pytorch-ddpm -----------------------------------------------------------------------------------
def test_pytorch_ddpm_default_layout_and_count():
    with torch.device("meta"):
        net = gm.PytorchDDPMUNet()
    sd = net.state_dict()
    assert len(sd) == 329 and n_numbers(net) == 35_874_307
    assert {k.split(".")[0] for k in sd} == {"time_embedding", "head", "downblocks", "middleblocks", "upblocks", "tail"}
    for key, shape in [("time_embedding.timembedding.0.weight", (1000, 128)),
                       ("time_embedding.timembedding.1.weight", (512, 128)),
                       ("time_embedding.timembedding.3.weight", (512, 512)), ("head.weight", (128, 3, 3, 3)),
                       ("downblocks.0.block1.0.weight", (128,)), ("downblocks.0.temb_proj.1.weight", (128, 512)),
                       ("downblocks.0.block2.3.weight", (128, 128, 3, 3)), ("downblocks.2.main.weight", (128, 128, 3, 3)),
                       ("downblocks.3.shortcut.weight", (256, 128, 1, 1)), ("downblocks.3.attn.proj_q.weight", (256, 256, 1, 1)),
                       ("middleblocks.0.attn.group_norm.weight", (256,)), ("upblocks.0.block1.0.weight", (512,)),
                       ("upblocks.3.main.weight", (256, 256, 3, 3)), ("tail.0.weight", (128,)), ("tail.2.weight", (3, 128, 3, 3))]:
        assert tuple(sd[key].shape) == shape, key
    assert "middleblocks.1.attn.proj_q.weight" not in sd and len([k for k in sd if k.startswith("downblocks.")]) == 108
    assert net.time_input == "index" and net.schedule.T == 1000
    assert abs(net.schedule.betas[0].item() - 1e-4) < 1e-12 and abs(net.schedule.betas[-1].item() - 0.02) < 1e-12
    assert gm.PytorchDDPMUNet.infer_config(sd) == {"T": 1000, "ch": 128, "ch_mult": [1, 2, 2, 2], "attn": [1],
                                                   "num_res_blocks": 2, "in_channels": 3}


def test_pytorch_ddpm_time_table_and_attention_math():
    table = ddpm_mod.sinusoid_table(20, 8).double()
    t, k = torch.arange(20.0, dtype=torch.float64)[:, None], torch.arange(4, dtype=torch.float64)[None]
    w = 10000.0 ** (-2 * k / 8)
    assert torch.allclose(table[:, 0::2], torch.sin(t * w), atol=1e-5)
    assert torch.allclose(table[:, 1::2], torch.cos(t * w), atol=1e-5)

    attn = randomize(ddpm_mod._Attention(32), seed=3).double()
    x = torch.randn(2, 32, 3, 4, dtype=torch.float64)
    n = F.group_norm(x, 32, attn.group_norm.weight, attn.group_norm.bias, 1e-5)
    q, k, v = (F.conv2d(n, p.weight, p.bias).reshape(2, 32, 12) for p in (attn.proj_q, attn.proj_k, attn.proj_v))
    out = torch.empty_like(q)
    for b in range(2):
        for i in range(12):  # position i attends over all positions j
            wts = torch.softmax(torch.stack([q[b, :, i] @ k[b, :, j] for j in range(12)]) / math.sqrt(32), 0)
            out[b, :, i] = (v[b] * wts).sum(1)
    ref = x + F.conv2d(out.reshape(2, 32, 3, 4), attn.proj.weight, attn.proj.bias)
    assert torch.allclose(attn(x), ref, atol=1e-12)


def test_pytorch_ddpm_forward_and_ckpt_roundtrip(tmp_path):
    ema, net = tiny_ddpm(), randomize(tiny_ddpm(), seed=9)
    with torch.no_grad():
        y = ema(X, times("pytorch-ddpm"))
    assert y.shape == X.shape and torch.isfinite(y).all()
    optim = torch.optim.Adam(net.parameters(), lr=2e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda step: min(step, 5000) / 5000)
    path = tmp_path / "ckpt.pt"
    torch.save({"net_model": net.state_dict(), "ema_model": ema.state_dict(), "sched": sched.state_dict(),
                "optim": optim.state_dict(), "step": 123, "x_T": torch.randn(4, 3, 8, 8)}, path)
    loaded = gm.load(path)
    assert isinstance(loaded, gm.PytorchDDPMUNet) and not loaded.training and loaded.T == 50
    with torch.no_grad():
        assert torch.equal(loaded(X, times("pytorch-ddpm")), y)
        assert torch.equal(gm.load(path, use_ema=False)(X, times("pytorch-ddpm")), net(X, times("pytorch-ddpm")))
    with pytest.raises(ValueError, match=r"out of range \[0, 50\)"):
        loaded(X, torch.tensor([0, 50]))


# -- improved-diffusion -----------------------------------------------------------------------------
@pytest.mark.parametrize("name, count, n_keys, levels", [("cifar10_cosine", 52_546_438, 446, 4),
                                                         ("imagenet64", 121_063_942, 450, 4)])
def test_iddpm_paper_configs_build(name, count, n_keys, levels):
    with torch.device("meta"):
        net = getattr(gm.IDDPMUNet, name)()
    sd = net.state_dict()
    assert n_numbers(net) == count and len(sd) == n_keys
    assert {k.split(".")[0] for k in sd} == {"time_embed", "input_blocks", "middle_block", "output_blocks", "out"}
    assert {k for k in sd if k.startswith(("time_embed", "out."))} == {
        "time_embed.0.weight", "time_embed.0.bias", "time_embed.2.weight", "time_embed.2.bias",
        "out.0.weight", "out.0.bias", "out.2.weight", "out.2.bias"}
    width = 128 * net.channel_mult[-1]
    assert tuple(sd["middle_block.1.qkv.weight"].shape) == (3 * width, width, 1)  # Conv1d
    assert tuple(sd["middle_block.1.proj_out.weight"].shape) == (width, width, 1)
    assert len(net.input_blocks) == 1 + 3 * levels + (levels - 1) and len(net.output_blocks) == 4 * levels
    assert net.learn_sigma and net.time_input == "scaled" and net.schedule.T == 4000
    inferred = gm.IDDPMUNet.infer_config(sd)
    assert inferred["attention_resolutions"] == list(net.attention_resolutions)
    assert inferred["channel_mult"] == list(net.channel_mult) and inferred["use_scale_shift_norm"]


def test_iddpm_block_math():
    # time embedding: cos then sin, frequencies 10000^(-k/half), odd widths zero padded
    t = torch.tensor([0.0, 2.5, 999.0])
    emb = iddpm_mod.timestep_embedding(t, 7).double()
    w = 10000.0 ** (-torch.arange(3, dtype=torch.float64) / 3)
    assert torch.allclose(emb[:, :3], torch.cos(t.double()[:, None] * w), atol=1e-4)
    assert torch.allclose(emb[:, 3:6], torch.sin(t.double()[:, None] * w), atol=1e-4) and (emb[:, 6] == 0).all()

    # legacy qkv order: per head h, channels [h*3d, h*3d+d) are q, then k, then v
    attn = randomize(iddpm_mod._Attention(64, num_heads=2), seed=4).double()
    x = torch.randn(1, 64, 2, 3, dtype=torch.float64)
    qkv = F.conv1d(attn.norm(x.reshape(1, 64, 6)), attn.qkv.weight, attn.qkv.bias)[0]
    heads = []
    for h in range(2):
        q, k, v = (qkv[h * 96 + j * 32: h * 96 + (j + 1) * 32] for j in range(3))
        heads.append(v @ torch.softmax(q.T @ k / math.sqrt(32), dim=1).T)
    ref = x.reshape(1, 64, 6) + F.conv1d(torch.cat(heads)[None], attn.proj_out.weight, attn.proj_out.bias)
    assert torch.allclose(attn(x), ref.reshape(x.shape), atol=1e-12)

    # scale-shift norm: out_rest(GN(h) * (1 + scale) + shift) + skip
    block = randomize(iddpm_mod._ResBlock(32, 16, 0.0, 64, scale_shift=True), seed=5).double().eval()
    x, e = torch.randn(2, 32, 4, 4, dtype=torch.float64), torch.randn(2, 16, dtype=torch.float64)
    h = block.in_layers(x)
    scale, shift = block.emb_layers(e)[:, :, None, None].chunk(2, dim=1)
    ref = block.skip_connection(x) + block.out_layers[3](F.silu(block.out_layers[0](h) * (1 + scale) + shift))
    assert torch.allclose(block(x, e), ref, atol=1e-12)

    # GroupNorm statistics in float32 for 16-bit inputs
    gn = GroupNorm32(8, 16)
    xh = (torch.randn(2, 16, 4, 4) * 30 + 100).half()
    assert gn(xh).dtype == torch.float16
    assert torch.equal(gn(xh), F.group_norm(xh.float(), 8, gn.weight, gn.bias).half())


def test_iddpm_roundtrip_and_learned_sigma(tmp_path):
    net = tiny_iddpm()
    t = times("improved-diffusion")
    with torch.no_grad():
        full = net(X, t)
    assert full.shape == (2, 6, 8, 8) and net.learn_sigma
    path = tmp_path / "model.pt"
    torch.save(net.state_dict(), path)
    loaded = gm.load(path, num_heads=2)
    assert isinstance(loaded, gm.IDDPMUNet) and loaded.eps_only and loaded.time_input == "scaled"
    with torch.no_grad():
        assert torch.equal(loaded(X, t), full[:, :3])
        assert torch.equal(gm.load(path, kind="improved-diffusion", num_heads=2, eps_only=False)(X, t), full)
        # num_heads leaves no trace in the weights: the default (4) loads but computes another attention
        assert not torch.allclose(gm.load(path)(X, t), full[:, :3])
    from safetensors.torch import save_file

    save_file(net.state_dict(), tmp_path / "model.safetensors")
    with torch.no_grad():
        assert torch.equal(gm.load(tmp_path / "model.safetensors", num_heads=2)(X, t), full[:, :3])
    x = gk.sample(loaded, shape=(2, 3, 8, 8), steps=3, solver="ddpm", generator=0, progress=False)
    assert x.shape == (2, 3, 8, 8) and torch.isfinite(x).all()


# -- diffusers --------------------------------------------------------------------------------------
def test_diffusers_roundtrip_and_schedule(diffusers_dir):
    unet = tiny_diffusers(diffusers_dir)
    t = times("diffusers")
    with torch.no_grad():
        ref = unet(X, t).sample
    model = gm.load(diffusers_dir)
    assert isinstance(model, gm.DiffusersUNet) and model.time_input == "index" and model.schedule is None
    with torch.no_grad():
        assert torch.equal(model(X, t), ref)
        h, temb, out = model.forward_features(X, t)
    assert torch.equal(out, ref) and h.shape == (2, 16, 8, 8) and temb.shape == (2, 64)
    # a pipeline directory: the unet subfolder, and the schedule from the scheduler config
    sched_dir = diffusers_dir.parent / "scheduler"
    sched_dir.mkdir(exist_ok=True)
    (sched_dir / "scheduler_config.json").write_text(json.dumps(
        {"_class_name": "DDPMScheduler", "num_train_timesteps": 1000, "beta_schedule": "linear",
         "beta_start": 0.0001, "beta_end": 0.02}))
    pipe = gm.load(diffusers_dir.parent)
    assert pipe.schedule.T == 1000 and torch.allclose(pipe.schedule.betas, gk.Schedule.linear(1000).betas)
    with torch.no_grad():
        assert torch.equal(pipe(X, t), ref)


# -- MomentNet --------------------------------------------------------------------------------------
FAMILIES = ["pytorch-ddpm", "improved-diffusion", "diffusers"]


def backbone_for(family, request):
    if family == "pytorch-ddpm":
        return tiny_ddpm()
    if family == "improved-diffusion":
        return tiny_iddpm()
    return tiny_diffusers(request.getfixturevalue("diffusers_dir"))  # skips without diffusers


def first_layer(backbone):
    return {"pytorch-ddpm": lambda b: b.head, "improved-diffusion": lambda b: b.input_blocks[0],
            "diffusers": lambda b: b.unet.conv_in}[backbone.family](backbone)


def eps_of(backbone, x, t):
    out = backbone(x, t)
    return out.sample[:, :3] if hasattr(out, "sample") else out[:, :3]


@pytest.mark.parametrize("head", ["conv", "res_conv"])
@pytest.mark.parametrize("family", FAMILIES)
def test_moment_net(family, head, request, tmp_path):
    backbone = backbone_for(family, request)
    t = times(family)
    with torch.no_grad():
        eps = eps_of(backbone, X, t)
    net = gm.MomentNet(backbone, head=head)
    randomize(net.heads, seed=7)
    assert net.time_input == backbone.time_input if family != "diffusers" else net.time_input == "index"

    calls = []
    hook = first_layer(net.backbone).register_forward_hook(lambda *a: calls.append(1))
    out = net(X, t)
    hook.remove()
    assert len(calls) == 1, "the backbone must run once per MomentNet call"
    assert out.shape == (2, 9, 8, 8) and torch.equal(out[:, :3], eps)

    # frozen backbone: no grads, eval mode kept under .train(); the heads learn
    net.train()
    assert not net.backbone.training and net.heads.training
    assert all(not p.requires_grad for p in net.backbone.parameters())
    out = net(X, t)
    ((out[:, 3:] - 1) ** 2).mean().backward()
    assert all(p.grad is None for p in net.backbone.parameters())
    assert all(p.grad is not None for p in net.heads.parameters())
    net.eval()
    with torch.no_grad():
        ref = net(X, t)

    net.save_heads(tmp_path / "heads.pt")
    fresh = gm.MomentNet(backbone_for(family, request), head=head)
    with torch.no_grad():
        assert torch.equal(fresh.load_heads(tmp_path / "heads.pt")(X, t), ref)
        assert torch.equal(gm.load(tmp_path / "heads.pt", backbone=backbone_for(family, request))(X, t), ref)
    net.save(tmp_path / "net.pt")
    whole = gm.load(tmp_path / "net.pt")
    assert isinstance(whole, gm.MomentNet) and whole.head == head and whole.time_input == net.time_input
    with torch.no_grad():
        assert torch.equal(whole(X, t), ref)
        assert torch.equal(gm.MomentNet.load(tmp_path / "net.pt")(X, t), ref)
    whole.load_state_dict(net.state_dict())

    x = gk.sample(net, shape=(2, 3, 8, 8), steps=3, generator=0, progress=False)
    assert x.shape == (2, 3, 8, 8) and torch.isfinite(x).all()


def test_moment_net_orders_and_checks(tmp_path):
    backbone = tiny_ddpm()
    net = gm.MomentNet(backbone, orders=(2,))
    assert net(X, times("pytorch-ddpm")).shape == (2, 6, 8, 8)
    x = gk.sample(net, shape=(2, 3, 8, 8), steps=3, solver="sn-ddpm", generator=0, progress=False)
    assert torch.isfinite(x).all()
    with pytest.raises(ValueError, match="orders"):
        gm.MomentNet(backbone, orders=(3,))
    with pytest.raises(ValueError, match="res_conv"):
        gm.MomentNet(backbone, head="mlp")
    with pytest.raises(TypeError, match="forward_features"):
        gm.MomentNet(torch.nn.Conv2d(3, 3, 1))
    net.save_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match=r"heads.pt.*orders: this MomentNet has \[2, 3\], the file \[2\]"):
        gm.MomentNet(backbone).load_heads(tmp_path / "heads.pt")
    with pytest.raises(ValueError, match="pass their backbone"):
        gm.load(tmp_path / "heads.pt")
    torch.save({"ema_model": backbone.state_dict()}, tmp_path / "ckpt.pt")
    again = gm.load(tmp_path / "heads.pt", backbone=tmp_path / "ckpt.pt")
    assert again.orders == (2,)
    with torch.no_grad():
        assert torch.equal(again(X, times("pytorch-ddpm")), net(X, times("pytorch-ddpm")))


# -- loader errors ----------------------------------------------------------------------------------
@pytest.fixture
def ddpm_ckpt(tmp_path):
    net = tiny_ddpm()
    path = tmp_path / "ckpt.pt"
    torch.save({"ema_model": net.state_dict(), "net_model": net.state_dict(), "step": 1}, path)
    return path, net.state_dict()


def test_unreadable_files(ddpm_ckpt, tmp_path):
    path, _ = ddpm_ckpt
    data = path.read_bytes()
    cut = tmp_path / "truncated.pt"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"truncated\.pt.*cannot read.*truncated"):
        gm.load(cut)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"this is not a checkpoint\n" * 10)
    with pytest.raises(ValueError, match=r"junk\.pt.*cannot read"):
        gm.load(junk)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        gm.load(empty)
    bad_st = tmp_path / "bad.safetensors"
    bad_st.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError, match=r"bad\.safetensors"):
        gm.load(bad_st)
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        gm.load(tmp_path / "nope.pt")
    import argparse

    pickled = tmp_path / "pickled.pt"
    torch.save({"args": argparse.Namespace(lr=1.0), "ema_model": {}}, pickled)
    with pytest.raises(ValueError, match=r"pickled\.pt: .*argparse\.Namespace.*weights_only=True"):
        gm.load(pickled)
    unknown = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, unknown)
    with pytest.raises(ValueError, match=r"other\.pt: cannot tell.*pytorch-ddpm, improved-diffusion"):
        gm.load(unknown)


def test_key_and_shape_errors(ddpm_ckpt, tmp_path):
    path, sd = ddpm_ckpt

    def save(state, name):
        p = tmp_path / name
        torch.save({"ema_model": state}, p)
        return p

    missing = save({k: v for k, v in sd.items() if k != "tail.2.bias"}, "missing.pt")
    with pytest.raises(ValueError, match=r"(?s)missing\.pt \[ema_model\].*missing keys \(1\): tail\.2\.bias"):
        gm.load(missing)
    extra = save({**sd, "foo.weight": torch.zeros(3)}, "extra.pt")
    with pytest.raises(ValueError, match=r"unexpected keys \(1\): foo\.weight"):
        gm.load(extra)
    shaped = save({**sd, "head.weight": torch.zeros(32, 3, 5, 5)}, "shape.pt")
    with pytest.raises(ValueError, match=r"head\.weight: expected \[32, 3, 3, 3\], found \[32, 3, 5, 5\]"):
        gm.load(shaped)
    # a wrong config: the message names the shapes and the config that matches the file
    with pytest.raises(ValueError) as err:
        gm.load(path, ch=64)
    msg = str(err.value)
    assert "ckpt.pt" in msg and "head.weight: expected [64, 3, 3, 3], found [32, 3, 3, 3]" in msg
    assert "ch=32" in msg and "kind='pytorch-ddpm'" in msg
    with pytest.raises(ValueError, match="unknown option.*chanels.*valid: T, ch"):
        gm.load(path, chanels=3)
    with pytest.raises(ValueError, match="unknown kind 'tf'.*auto, pytorch-ddpm, improved-diffusion, ddim, gms-official, diffusers, "
                                         "gms-heads, moment-net"):
        gm.load(path, kind="tf")
    with pytest.raises(ValueError, match="improved-diffusion raw state dict"):
        gm.load(path, kind="improved-diffusion")


def test_iddpm_and_diffusers_errors(tmp_path, request):
    sd = tiny_iddpm().state_dict()
    p = tmp_path / "iddpm.pt"
    torch.save({**sd, "out.2.weight": torch.zeros(6, 32, 5, 5)}, p)
    with pytest.raises(ValueError, match=r"out\.2\.weight: expected \[6, 32, 3, 3\], found \[6, 32, 5, 5\]"):
        gm.load(p, num_heads=2)
    torch.save(sd, p)
    with pytest.raises(ValueError, match=r"use_scale_shift_norm=True"):
        gm.load(p, use_scale_shift_norm=False)
    # a diffusers directory whose config does not describe its weights
    import shutil

    diffusers_dir = request.getfixturevalue("diffusers_dir")  # skips without diffusers

    bad = tmp_path / "bad_unet"
    shutil.copytree(diffusers_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["out_channels"] = 6
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"(?s)bad_unet: config.json does not describe.*conv_out\.weight: expected "
                                         r"\[6, 16, 3, 3\].*found \[3, 16, 3, 3\]"):
        gm.load(bad)
    os.remove(bad / "diffusion_pytorch_model.safetensors")
    with pytest.raises(ValueError, match="not a diffusers model directory"):
        gm.load(bad)


def _tiny_ddpm() -> gm.PytorchDDPMUNet:
    return gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1)


@pytest.mark.parametrize("load", [lambda p: gm.MomentNet.load(p, map_location="meta"),
                                  lambda p: gm.load(p, map_location="meta"),
                                  lambda p: gm.load(p, map_location=torch.device("meta"))],
                         ids=["MomentNet.load", "gm.load", "gm.load-device"])
def test_a_moment_net_with_a_schedule_loads_onto_meta_with_its_schedule(tmp_path, load, recwarn):
    """A MomentNet file stores its backbone's schedule beside the weights: read onto the meta device, the
    schedule's values were lost ("Cannot copy out of meta tensor"). The file is read onto the CPU, the
    weights go to meta, the schedule keeps its values, and no 'copying ... is a no-op' warning is raised."""
    net = gm.MomentNet(_tiny_ddpm())
    net.save(tmp_path / "n.pt")
    loaded = load(tmp_path / "n.pt")
    assert {t.device.type for t in loaded.state_dict().values()} == {"meta"}
    assert torch.equal(loaded.schedule.betas, net.schedule.betas)
    assert not [w for w in recwarn if "no-op" in str(w.message)]


def test_a_checkpoint_loaded_with_map_location_none_is_on_the_cpu(tmp_path):
    """map_location=None means the CPU for every loader (it gave a model left on the meta device, with
    no data, for pytorch-ddpm, improved-diffusion and DDIM checkpoints)."""
    backbone = _tiny_ddpm()
    torch.save(backbone.state_dict(), tmp_path / "b.pt")
    loaded = gm.load(tmp_path / "b.pt", kind="pytorch-ddpm", map_location=None, T=50, ch=32, ch_mult=(1, 2),
                     attn=(1,), num_res_blocks=1)
    assert {t.device.type for t in loaded.state_dict().values()} == {"cpu"}
    for name, tensor in backbone.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def _saved_as_if_on_cuda(data, path):
    """torch.save of data with every storage tagged cuda:0 (a file written on a GPU machine), without a GPU."""
    from unittest import mock

    import torch.serialization

    with mock.patch.object(torch.serialization, "location_tag", lambda storage: "cuda:0"):
        torch.save(data, path)


@pytest.mark.parametrize("map_location", [None, {"cuda:0": "cpu"}, lambda storage, location: storage],
                         ids=["None", "dict", "function"])
def test_a_gpu_saved_checkpoint_loads_onto_the_cpu_for_none_or_a_remapping(tmp_path, map_location):
    """The loaders' map_location=None is the CPU (torch.load's None would restore the file's CUDA tensors,
    which fails without a GPU), and a torch.load remapping (dict or function) places the model where it put
    the tensors (the meta-built backbones failed with empty_like's TypeError)."""
    backbone = _tiny_ddpm()
    _saved_as_if_on_cuda({"ema_model": backbone.state_dict()}, tmp_path / "ddpm.pt")
    net = gm.MomentNet(backbone)
    net.save(tmp_path / "net.pt")
    _saved_as_if_on_cuda(torch.load(tmp_path / "net.pt", weights_only=True), tmp_path / "net_gpu.pt")
    for loaded, expected in [(gm.load(tmp_path / "ddpm.pt", map_location=map_location), backbone),
                             (gm.load(tmp_path / "net_gpu.pt", map_location=map_location), net)]:
        assert {t.device.type for t in loaded.state_dict().values()} == {"cpu"}
        for name, tensor in expected.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], tensor), name


def test_a_diffusers_directory_goes_where_map_location_says(diffusers_dir, monkeypatch):
    """gk.models.load(directory) ignored map_location (the model stayed on the CPU whatever was asked): it is
    moved there now, a missing CUDA device is named as for a file, and a remapping is refused."""
    assert {t.device.type for t in gm.load(diffusers_dir, map_location="meta").state_dict().values()} == {"meta"}
    assert {t.device.type for t in gm.load(diffusers_dir, map_location=None).state_dict().values()} == {"cpu"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="map_location='cuda' asks for a CUDA device, but this machine has none"):
        gm.load(diffusers_dir, map_location="cuda")
    with pytest.raises(ValueError, match="map_location must be a device"):
        gm.load(diffusers_dir, map_location={"cuda:0": "cpu"})


def test_a_map_location_that_names_no_device_is_refused_before_reading(tmp_path, diffusers_dir):
    """map_location='gpu' gave torch's raw device-string error for a diffusers directory, and called a good
    file "truncated, corrupted or not a torch checkpoint"; it is refused first, the same way everywhere."""
    torch.save(_tiny_ddpm().state_dict(), tmp_path / "b.pt")
    gm.MomentNet(_tiny_ddpm()).save(tmp_path / "n.pt")
    for call in (lambda: gm.load(tmp_path / "b.pt", map_location="gpu"),
                 lambda: gm.load(diffusers_dir, map_location="gpu"),
                 lambda: gm.MomentNet.load(tmp_path / "n.pt", map_location="gpu")):
        with pytest.raises(ValueError, match=r"^map_location='gpu' is not a device: use e\.g\. 'cpu'"):
            call()


def test_lazy_export_names_resolve_on_the_package():
    """gm.export_diffusers and gm.GMSDiffusersModel are listed in __all__ and imported on first use."""
    from gms_kernels.models import diffusers_export

    assert gm.GMSDiffusersModel is diffusers_export.GMSDiffusersModel
    assert gm.export_diffusers is diffusers_export.export_diffusers
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        gm.no_such_name  # noqa: B018


def small_iddpm():
    torch.manual_seed(0)
    return gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=6, num_res_blocks=1, attention_resolutions=(2,),
                        dropout=0.0, channel_mult=(1, 2), num_heads=2, use_scale_shift_norm=True).eval()


def test_networks_take_one_timestep_for_the_whole_batch():
    """A Python int or 0-d tensor timestep means the same step for every sample (as diffusers' pipelines
    pass it): the output equals that of the timestep repeated per sample."""
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))  # (4 samples of 3 channels: N != C)
    every = torch.full((4,), 7)
    ddpm = gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()
    iddpm = small_iddpm()
    exported = gm.GMSDiffusersModel.from_network(gm.MomentNet(iddpm, head="conv"), sample_size=8).eval()
    with torch.no_grad():
        assert torch.equal(ddpm(x, 7), ddpm(x, every))
        assert torch.equal(ddpm(x, torch.tensor(7)), ddpm(x, every))
        assert torch.equal(iddpm(x, torch.tensor(7)), iddpm(x, every))
        assert torch.equal(exported(x, torch.tensor(7)).sample, exported(x, every).sample)
