"""gms_kernels networks back into diffusers (export, reload, DDPMPipeline), raw
UNet2DModels in gk.sample, and clear refusals for eps-only and learned-variance UNets."""
import json

import pytest
import torch
from diffusers import DDPMPipeline, DDPMScheduler, ModelMixin, UNet2DModel
from diffusers.configuration_utils import ConfigMixin, register_to_config

import gms_kernels as gk
import gms_kernels.models as gm
from gms_kernels.cli import main
from gms_kernels.models.embedded import default_model
from gms_kernels.model_io import time_values
from gms_kernels.models.diffusers_export import GMSDiffusersModel, export_diffusers
from conftest import quiet_pipe, randomize, tiny_diffusers_unet


def tiny_unet(out_channels, seed=0):
    torch.manual_seed(seed)
    return UNet2DModel(sample_size=8, in_channels=3, out_channels=out_channels, layers_per_block=1,
                       block_out_channels=(8, 16), norm_num_groups=4,
                       down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D")).eval()


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "digits"
    export_diffusers(default_model(), path, sample_size=8)
    return path


def test_export_writes_a_diffusers_pipeline_directory(digits_dir):
    index = json.loads((digits_dir / "model_index.json").read_text())
    assert index["_class_name"] == "DDPMPipeline"
    assert index["unet"] == ["gms_kernels", "GMSDiffusersModel"]
    assert index["scheduler"] == ["gms_kernels", "GMSScheduler"]
    assert (digits_dir / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    cfg = json.loads((digits_dir / "unet" / "config.json").read_text())
    assert (cfg["in_channels"], cfg["out_channels"], cfg["sample_size"]) == (1, 3, 8)
    assert cfg["network"]["type"] == "moment-net" and cfg["network"]["backbone"]["family"] == "pytorch-ddpm"
    assert cfg["network"]["heads"]["orders"] == [2, 3] and cfg["time_input"] == "index"
    sched = json.loads((digits_dir / "scheduler" / "scheduler_config.json").read_text())
    assert sched["solver"] == "gms" and sched["trained_betas"] is None  # the linear 1e-4..0.02 schedule by name


def test_reloaded_outputs_equal_the_network_bit_for_bit(digits_dir):
    net = default_model()
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([999, 500, 3, 0])
    unet = GMSDiffusersModel.from_pretrained(digits_dir, subfolder="unet", local_files_only=True)
    out = unet(x, t)
    assert type(out).__name__ == "UNet2DOutput" and out.sample.shape == (4, 3, 8, 8)
    assert torch.equal(out.sample, net(x, t))
    assert torch.equal(unet(x, torch.tensor(7)).sample, net(x, torch.full((4,), 7)))  # one timestep for the batch
    loaded = gm.load(digits_dir)  # the gms_kernels network itself
    assert isinstance(loaded, gm.MomentNet) and torch.equal(loaded(x, t), net(x, t))
    assert torch.equal(loaded.schedule.betas, gk.Schedule.linear().betas)
    with pytest.raises(ValueError, match="integer training index"):
        unet(x, torch.tensor(3.5))
    assert gm.load(digits_dir, schedule=gk.Schedule.cosine(1000)).schedule.T == 1000  # options still apply
    with pytest.raises(ValueError, match="eps_only does not apply"):
        gm.load(digits_dir, eps_only=True)


def test_ddpm_pipeline_runs_gms_from_the_saved_directory(digits_dir):
    """The pipeline from the directory = the same loop written out with the original network: the
    initial noise from the generator, then GMSScheduler.step at each of scheduler.timesteps."""
    pipe = quiet_pipe(digits_dir)
    assert isinstance(pipe.scheduler, gk.GMSScheduler) and pipe.scheduler.config.solver == "gms"
    # (the scheduler carries the digits model's own GMS options: tests/test_model_solver_defaults.py)
    assert (pipe.scheduler.config.fit, pipe.scheduler.config.select) == ("closed", "pixel")
    images = pipe(batch_size=3, num_inference_steps=5, generator=torch.Generator().manual_seed(0),
                  output_type="pt").images
    assert images.shape == (3, 1, 8, 8) and torch.isfinite(images).all()

    net, sched, g = default_model(), gk.GMSScheduler(select="pixel"), torch.Generator().manual_seed(0)
    x = torch.randn((3, 1, 8, 8), generator=g)
    sched.set_timesteps(5)
    for t in sched.timesteps:
        x = sched.step(net(x, t.expand(3)), t, x, generator=g).prev_sample
    assert torch.equal(images, (x / 2 + 0.5).clamp(0, 1))


def test_gk_sample_on_the_exported_model_equals_the_original(digits_dir):
    """gk.sample accepts the diffusers model (and gk.models.load's result) and draws the same samples."""
    kw = dict(shape=(4, 1, 8, 8), steps=4, generator=3, progress=False, backend="torch")
    want = gk.sample(default_model(), **kw)
    unet = GMSDiffusersModel.from_pretrained(digits_dir, subfolder="unet", local_files_only=True)
    assert torch.equal(gk.sample(unet, **kw), want)
    assert torch.equal(gk.sample(gm.load(digits_dir), **kw), want)


def small_backbone(family):
    torch.manual_seed(0)
    if family == "pytorch-ddpm":
        return randomize(gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1, dropout=0.0), 1)
    if family == "improved-diffusion":
        net = randomize(gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=6, num_res_blocks=1,
                                     attention_resolutions=(2,), channel_mult=(1, 2), num_heads=2,
                                     use_scale_shift_norm=True), 2)
        net.schedule = gk.Schedule.cosine(40)
        return net
    return tiny_unet(3, seed=3)


@pytest.mark.parametrize("family", ["pytorch-ddpm", "improved-diffusion", "diffusers"])
@pytest.mark.parametrize("orders, head", [((2, 3), "res_conv"), ((2,), "conv")])
def test_every_backbone_family_round_trips_exactly(tmp_path, family, orders, head):
    net = randomize(gm.MomentNet(small_backbone(family), orders=orders, head=head), seed=4, scale=0.02).eval()
    solver = "gms" if orders == (2, 3) else "sn-ddpm"
    export_diffusers(net, tmp_path, sample_size=None if family == "diffusers" else 8, solver=solver)
    pipe = quiet_pipe(tmp_path)
    T = net.schedule.T if net.schedule is not None else 1000
    x, t = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2)), torch.tensor([T - 1, 5])
    assert torch.equal(pipe.unet(x, t).sample, net(x, time_values(t, T, net.time_input)))
    assert pipe.unet.config.out_channels == 3 * (1 + len(orders)) and pipe.scheduler.config.solver == solver
    if family == "improved-diffusion":  # the cosine betas travel exactly, to the scheduler and to gk.sample
        assert torch.equal(pipe.scheduler.schedule.betas, net.schedule.betas)
        assert torch.equal(gm.load(tmp_path).schedule.betas, net.schedule.betas)
    img = pipe(batch_size=2, num_inference_steps=3, generator=torch.Generator().manual_seed(0), output_type="pt").images
    assert img.shape == (2, 3, 8, 8) and torch.isfinite(img).all()


def test_bare_backbone_exports_as_an_eps_network(tmp_path):
    iddpm = small_backbone("improved-diffusion")  # learned sigma: 6 output channels, exported as eps (3)
    with pytest.raises(ValueError, match="reads 9 channels but the network gives 3"):
        export_diffusers(iddpm, tmp_path / "gms", sample_size=8)
    export_diffusers(iddpm, tmp_path / "ddpm", sample_size=8, solver="ddpm")
    pipe = quiet_pipe(tmp_path / "ddpm")
    x, t = torch.randn(2, 3, 8, 8), torch.tensor([39, 0])
    assert pipe.unet.config.out_channels == 3
    assert torch.equal(pipe.unet(x, t).sample, iddpm(x, time_values(t, 40, "scaled"))[:, :3])


def test_export_needs_the_image_size_and_a_known_network(tmp_path):
    net = gm.MomentNet(small_backbone("pytorch-ddpm"))
    with pytest.raises(ValueError, match="sample_size"):
        export_diffusers(net, tmp_path)
    with pytest.raises(ValueError, match="backbone families"):
        export_diffusers(torch.nn.Conv2d(3, 9, 1), tmp_path, sample_size=8)
    with pytest.raises(TypeError, match="GMSScheduler"):
        export_diffusers(net, tmp_path, sample_size=8, scheduler=DDPMScheduler())
    d = export_diffusers(net, tmp_path / "tuple_size", sample_size=(8, 8))
    assert quiet_pipe(d).unet.config.sample_size == [8, 8]


# -- raw diffusers UNet2DModel in gk.sample ----------------------------------------------------------
class OtherModel(ModelMixin, ConfigMixin):
    """A diffusers model that is no UNet2DModel."""

    @register_to_config
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)


def test_gk_sample_accepts_a_raw_unet2dmodel():
    unet = randomize(tiny_unet(9), seed=5, scale=0.02)
    kw = dict(shape=(2, 3, 8, 8), steps=3, generator=0, progress=False, backend="torch")
    got = gk.sample(unet, **kw)  # used to fail: 'UNet2DOutput' object has no attribute 'dim'
    assert torch.equal(got, gk.sample(gm.DiffusersUNet(unet), **kw))
    assert torch.isfinite(gk.sample(tiny_unet(3), solver="ddpm", **kw)).all()
    table = gk.estimate_gamma(tiny_unet(3), torch.zeros(2, 3, 8, 8), gk.Schedule.linear(), timesteps=[10])
    assert torch.isfinite(table[10])
    with pytest.raises(TypeError, match="reads UNet2DModel.* and gk.models.GMSDiffusersModel"):
        gk.sample(OtherModel(), **kw)


def test_eps_only_unet_under_gms_says_how_to_add_heads(tmp_path):
    with pytest.raises(ValueError, match=r"needs 3 heads .* gives 1 .*gms-kernels train-heads --model DIR"):
        gk.sample(tiny_unet(3), shape=(1, 3, 8, 8), steps=2, progress=False)
    DDPMPipeline(unet=tiny_unet(3), scheduler=DDPMScheduler()).save_pretrained(tmp_path)
    model = gm.load(tmp_path)
    with pytest.raises(ValueError, match=f"gms-kernels train-heads --model {tmp_path}"):
        gk.sample(model, shape=(1, 3, 8, 8), steps=2, solver="gms", progress=False)


def test_cli_sample_refuses_an_eps_only_pipeline_in_one_line(tmp_path, capsys):
    DDPMPipeline(unet=tiny_unet(3), scheduler=DDPMScheduler()).save_pretrained(tmp_path / "pipe")
    with pytest.raises(SystemExit) as e:
        main(["sample", "--model", str(tmp_path / "pipe"), "--shape", "3", "8", "8", "--num-samples", "2",
              "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert f"gms-kernels train-heads --model {tmp_path / 'pipe'}" in err and not (tmp_path / "out").exists()


# -- learned variance --------------------------------------------------------------------------------
@pytest.fixture
def learned_variance_dir(tmp_path):
    DDPMPipeline(unet=tiny_unet(6), scheduler=DDPMScheduler(variance_type="learned_range")).save_pretrained(tmp_path)
    return tmp_path


def test_learned_variance_unet_is_never_read_as_e2(learned_variance_dir):
    model = gm.load(learned_variance_dir)
    assert model.variance_type == "learned_range" and model.output_heads == 1
    with pytest.raises(ValueError, match=r"sn-ddpm.*learned variance \(variance_type='learned_range'\)"):
        gk.sample(model, shape=(1, 3, 8, 8), steps=2, solver="sn-ddpm", progress=False)
    with pytest.raises(ValueError, match="learned variance, not E\\[eps\\^2\\]"):
        gm.load(learned_variance_dir, eps_only=False)
    x = gk.sample(model, shape=(1, 3, 8, 8), steps=2, solver="ddpm", progress=False)  # eps alone is fine
    assert torch.isfinite(x).all()
    with pytest.raises(ValueError, match="never reads as E\\[eps\\^2\\]"):  # raw 2C UNet, no scheduler config
        gk.sample(tiny_unet(6), shape=(1, 3, 8, 8), steps=2, solver="sn-ddpm", progress=False)


def test_gms_scheduler_from_a_learned_variance_config_refuses_sn_ddpm_and_gms():
    cfg = DDPMScheduler(variance_type="learned_range").config
    for solver in ("sn-ddpm", "gms"):
        with pytest.raises(ValueError, match="learned variance, not the E\\[eps\\^2\\]"):
            gk.GMSScheduler.from_config(cfg, solver=solver)
    with pytest.warns(UserWarning, match="variance_type"):
        assert gk.GMSScheduler.from_config(cfg, solver="ddpm").config.solver == "ddpm"


def test_saved_unet_and_scheduler_stepped_with_an_int_seed_are_gk_sample(digits_dir):
    """What DDPMPipeline changes against gk.sample is only where randomness comes from (torch
    generators for x_T and one seed per step): the directory's unet and scheduler, stepped over
    gk.sample's trajectory with gk.sample's int seed, give gk.sample's samples exactly."""
    pipe = quiet_pipe(digits_dir)
    x_T = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(9))
    want = gk.sample(default_model(), x_T=x_T, steps=5, generator=11, progress=False)
    sched = pipe.scheduler
    sched.set_timesteps(timesteps=gk.trajectory(sched.schedule, 5, "even"))
    x = x_T
    for t in sched.timesteps:
        x = sched.step(pipe.unet(x, t).sample, t, x, generator=11).prev_sample
    assert torch.equal(x, want)


def test_a_bare_unet2dmodel_exports_and_reloads_with_its_outputs(tmp_path):
    """A plain diffusers UNet2DModel (eps only) goes out as it is: the wrapper's weights are copied, not the bare
    module's (whose keys lack the wrapper's prefix)."""
    unet = randomize(tiny_unet(3), seed=4)
    export_diffusers(unet, tmp_path / "bare", solver="ddpm")
    model = GMSDiffusersModel.from_pretrained(str(tmp_path / "bare"), subfolder="unet", local_files_only=True)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([3, 700])
    with torch.no_grad():
        torch.testing.assert_close(model(x, t).sample, unet(x, t).sample, rtol=0, atol=0)


def test_a_raw_unet2dmodel_is_described_as_a_diffusers_backbone():
    """network_spec / backbone_family wrap a bare UNet2DModel (no gk wrapper) as a DiffusersUNet, and the
    description rebuilds a DiffusersUNet of the same architecture that reads eps alone."""
    from gms_kernels.models.diffusers_export import backbone_family, build_network, network_spec

    unet = tiny_diffusers_unet(6)
    spec = network_spec(unet, heads=1)  # (out_channels = 2C: eps alone, or two heads, is said explicitly)
    assert spec["type"] == "backbone" and spec["backbone"]["family"] == "diffusers"
    assert spec["backbone"]["config"]["block_out_channels"] == [8, 16] and backbone_family(unet) == "diffusers"
    assert "_use_default_values" in unet.config  # diffusers' private entries stay out of the description
    assert not [k for k in spec["backbone"]["config"] if k.startswith("_")]
    rebuilt = build_network(spec)
    assert isinstance(rebuilt, gm.DiffusersUNet) and rebuilt.eps_only is True
    assert rebuilt.state_dict()["unet.conv_out.weight"].shape == unet.conv_out.weight.shape


def tiny_iddpm():
    torch.manual_seed(0)
    return gm.IDDPMUNet(in_channels=3, model_channels=32, out_channels=6, num_res_blocks=1, attention_resolutions=(2,),
                        dropout=0.0, channel_mult=(1, 2), num_heads=2, use_scale_shift_norm=True).eval()


def test_export_keeps_the_heads_dropout_the_backbones_eps_only_and_the_default_T(tmp_path):
    """The exported description rebuilds the MomentNet exactly: head dropout, and a diffusers backbone's
    forced eps_only; with no schedule anywhere the config says T = 1000, as the scheduler written with it."""
    backbone = gm.DiffusersUNet(tiny_diffusers_unet(9), eps_only=True)
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


def test_a_network_description_without_heads_settings_gets_the_defaults():
    from gms_kernels.models.diffusers_export import build_network, network_spec

    torch.manual_seed(0)
    spec = network_spec(gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1))
    net = build_network({"type": "moment-net", "backbone": spec["backbone"], "heads": {}})
    assert isinstance(net, gm.MomentNet) and net.orders == (2, 3) and net.head == "conv"
    assert net.dropout == 0.0 and net.targets == "raw"


def test_a_backbone_config_that_json_cannot_hold_is_named_in_the_export_error():
    from gms_kernels.models.diffusers_export import network_spec

    class Odd(torch.nn.Module):
        family = "pytorch-ddpm"
        config = {"T": object()}

    with pytest.raises(TypeError, match=r"the pytorch-ddpm backbone config\['T'\]"):
        network_spec(Odd())


def test_an_exported_network_saved_as_a_variant_loads_by_that_variant(tmp_path):
    """load_exported hands ``variant`` to diffusers: the fp16-named weights file is the one read."""
    net = gm.MomentNet(tiny_iddpm(), head="conv")
    model = gm.GMSDiffusersModel.from_network(net, sample_size=8)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # (weights that differ from a fresh build)
    model.save_pretrained(tmp_path, variant="ema", safe_serialization=True)
    assert (tmp_path / "diffusion_pytorch_model.ema.safetensors").exists()
    from gms_kernels.models.diffusers_export import load_exported

    loaded = load_exported(tmp_path, variant="ema")
    for (name, a), (_, b) in zip(model.net.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_gk_load_hands_the_variant_to_an_exported_network(tmp_path):
    net = gm.MomentNet(tiny_iddpm(), head="conv")
    model = gm.GMSDiffusersModel.from_network(net, sample_size=8)
    model.save_pretrained(tmp_path, variant="ema", safe_serialization=True)
    loaded = gm.load(tmp_path, variant="ema")
    assert all(torch.equal(a, b) for a, b in zip(model.net.state_dict().values(), loaded.state_dict().values()))


def test_an_exported_model_takes_a_whole_number_float_timestep():
    """A float timestep with whole values (7.0) is the integer index 7, not refused; 7.5 is refused."""
    exported = gm.GMSDiffusersModel.from_network(gm.MomentNet(tiny_iddpm(), head="conv"), sample_size=8).eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(exported(x, torch.tensor([7.0, 7.0])).sample, exported(x, torch.tensor([7, 7])).sample)
        with pytest.raises(ValueError, match="integer training index"):
            exported(x, torch.tensor([7.5, 7.0]))


def test_an_exported_model_returns_a_tuple_when_asked():
    exported = gm.GMSDiffusersModel.from_network(gm.MomentNet(tiny_iddpm(), head="conv"), sample_size=8).eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = exported(x, 7, return_dict=False)
        assert isinstance(out, tuple) and len(out) == 1 and torch.equal(out[0], exported(x, 7).sample)


def test_an_exported_network_loads_with_the_schedule_it_is_given(tmp_path):
    """load_exported(dir, schedule=s) (and gk.models.load) puts s on the network, replacing the stored betas."""
    from gms_kernels.models.diffusers_export import load_exported

    gm.GMSDiffusersModel.from_network(gm.MomentNet(tiny_iddpm(), head="conv"), sample_size=8).save_pretrained(tmp_path)
    schedule = gk.Schedule.cosine(20)
    assert load_exported(tmp_path, schedule=schedule).schedule is schedule
    assert gm.load(tmp_path, schedule=schedule).schedule is schedule


def test_an_exported_central_moment_net_keeps_its_targets(tmp_path):
    """The exported description records targets='central', and the network loaded back has it."""
    from gms_kernels.models.diffusers_export import build_network, network_spec

    net = gm.MomentNet(tiny_iddpm(), head="conv", targets="central")
    spec = network_spec(net)
    assert spec["heads"]["targets"] == "central"
    assert build_network(spec).targets == "central"


@pytest.mark.parametrize("backbone", [{"family": "no-such-family"}, None, ["pytorch-ddpm"]])
def test_a_network_description_with_an_unknown_or_malformed_backbone_is_refused(backbone):
    """build_network refuses a description whose backbone is not a dict of a known family with its ValueError
    (not a KeyError or AttributeError from reading it)."""
    from gms_kernels.models.diffusers_export import build_network

    with pytest.raises(ValueError, match="not a gms_kernels network description: .*export it again"):
        build_network({"type": "backbone", "backbone": backbone})


def tiny_ddpm():
    torch.manual_seed(0)
    return gm.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).eval()


def test_an_exported_network_description_of_an_unknown_type_is_refused():
    from gms_kernels.models.diffusers_export import build_network, network_spec

    spec = network_spec(gm.MomentNet(tiny_ddpm()))
    assert build_network(spec) is not None
    with pytest.raises(ValueError, match="not a gms_kernels network description"):
        build_network({**spec, "type": "something-else"})


def test_the_exported_diffusers_model_puts_an_integer_timestep_on_the_samples_device():
    """GMSDiffusersModel(sample, 17): the timestep tensor is made where the sample is, whatever torch's
    default device (under a meta default a forgotten device makes a meta tensor, which fails)."""
    from gms_kernels.models.diffusers_export import GMSDiffusersModel

    model = GMSDiffusersModel.from_network(gm.MomentNet(tiny_ddpm()), sample_size=8).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x, 17).sample
        with torch.device("meta"):
            got = model(x, 17).sample
    assert got.device.type == "cpu" and torch.equal(got, expected)


def test_the_exported_models_sample_size_is_a_list_of_ints():
    """A (height, width) given as a tuple of numpy ints is stored as a JSON-ready list of Python ints, the
    form config.json gives back after a save."""
    import numpy as np
    from gms_kernels.models.diffusers_export import GMSDiffusersModel

    model = GMSDiffusersModel.from_network(gm.MomentNet(tiny_ddpm()), sample_size=(np.int64(8), np.int64(12)))
    size = model.config.sample_size
    assert size == [8, 12] and all(type(s) is int for s in size)
    assert GMSDiffusersModel.from_network(gm.MomentNet(tiny_ddpm()), sample_size=16).config.sample_size == 16
