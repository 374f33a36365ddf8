"""Round trips between gms_kernels and diffusers: exported pipelines that load in a fresh process,
GMSScheduler configs that diffusers' own schedulers read (and back), bare multi-head UNets, schedules
read from a raw UNet's pipeline, and the learned-variance layout refused in the scheduler too."""
import json
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from diffusers import DDIMScheduler, DDPMPipeline, DDPMScheduler, UNet2DModel

import gms_kernels as gk
from gms_kernels.core.schedule import check_schedule
import gms_kernels.models as gm
from gms_kernels.eval import metrics
from gms_kernels.models.embedded import default_model
from gms_kernels.models.diffusers_export import GMSDiffusersModel, export_diffusers
from conftest import quiet_pipe


def tiny_unet(out_channels, seed=0, scale=0.02):
    torch.manual_seed(seed)
    unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=out_channels, layers_per_block=1,
                       block_out_channels=(8, 16), norm_num_groups=4,
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # (the output conv starts at zero: give every channel something to say)
        for p in unet.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return unet.eval()



def messages(caught):
    return [str(w.message) for w in caught]


# -- a pipeline directory loads in a new process ---------------------------------------------------
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The digits model exported with GMS, and a UNet2DModel + GMSScheduler pipeline saved by diffusers."""
    root = tmp_path_factory.mktemp("roundtrip")
    export_diffusers(default_model(), root / "digits", sample_size=8)
    DDPMPipeline(unet=tiny_unet(9), scheduler=gk.GMSScheduler(timestep_spacing="trailing")).save_pretrained(
        root / "raw")
    return root


def test_model_index_names_the_package_itself(exported):
    for name in ("digits", "raw"):
        index = json.loads((exported / name / "model_index.json").read_text())
        assert index["scheduler"] == ["gms_kernels", "GMSScheduler"]
    assert json.loads((exported / "digits" / "model_index.json").read_text())["unet"] == [
        "gms_kernels", "GMSDiffusersModel"]
    assert gk.GMSDiffusersModel is GMSDiffusersModel


FRESH = """
import sys, warnings, torch
warnings.simplefilter("ignore")
torch.set_num_threads(1)  # (as the tests here run: the network's sums then round alike)
{imports}
root, out = sys.argv[1], sys.argv[2]
pipe = DDPMPipeline.from_pretrained(root + "/digits", local_files_only=True)
pipe.set_progress_bar_config(disable=True)
images = pipe(batch_size=3, num_inference_steps=5, generator=torch.Generator().manual_seed(0), output_type="pt").images
# the directory's unet and scheduler stepped over gk.sample's trajectory with gk.sample's int seed
x_T = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(9))
sched, x = pipe.scheduler, x_T
sched.set_timesteps(timesteps=[999, 799, 599, 399, 199, 0])
for t in sched.timesteps:
    x = sched.step(pipe.unet(x, t).sample, t, x, generator=11).prev_sample
raw = DDPMPipeline.from_pretrained(root + "/raw", local_files_only=True)
raw.set_progress_bar_config(disable=True)
raw_images = raw(batch_size=2, num_inference_steps=3, generator=torch.Generator().manual_seed(1),
                 output_type="pt").images
torch.save({{"images": images, "x_T": x_T, "stepped": x, "raw": raw_images,
            "classes": [type(pipe.unet).__name__, type(pipe.scheduler).__name__, type(raw.scheduler).__name__]}}, out)
"""


@pytest.mark.parametrize("imports", ["import gms_kernels\nfrom diffusers import DDPMPipeline",
                                     "from diffusers import DDPMPipeline\nimport gms_kernels"])
def test_exported_pipeline_loads_in_a_fresh_process_and_samples_as_gk_sample(exported, tmp_path, imports):
    out = tmp_path / "out.pt"
    script = textwrap.dedent(FRESH).format(imports=imports)
    # (cwd: a fresh process in the checkout would import its uncompiled source tree, not the installed package)
    done = subprocess.run([sys.executable, "-c", script, str(exported), str(out)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = torch.load(out, weights_only=True)
    assert got["classes"] == ["GMSDiffusersModel", "GMSScheduler", "GMSScheduler"]
    # the pipeline is the loop it runs, written out on the original network with the same generator
    net, sched, g = default_model(), gk.GMSScheduler(select="pixel"), torch.Generator().manual_seed(0)
    x = torch.randn((3, 1, 8, 8), generator=g)
    sched.set_timesteps(5)
    for t in sched.timesteps:
        x = sched.step(net(x, t.expand(3)), t, x, generator=g).prev_sample
    assert torch.equal(got["images"], (x / 2 + 0.5).clamp(0, 1))
    # and, with gk.sample's noise (x_T and the int seed), the loaded components give gk.sample's samples
    assert torch.equal(got["stepped"], gk.sample(net, x_T=got["x_T"], steps=5, generator=11, progress=False))
    # the UNet2DModel + GMSScheduler pipeline gives what it gave in this process
    want = quiet_pipe(exported / "raw")(batch_size=2, num_inference_steps=3, generator=torch.Generator().manual_seed(1),
                                        output_type="pt").images
    assert torch.equal(got["raw"], want)


# -- a GMSScheduler config that diffusers' schedulers read --------------------------------------------
@pytest.mark.parametrize("kind, diffusers_kind", [("even", "trailing"), ("linear", "trailing"), ("quad", "leading"),
                                                  ("leading", "leading"), ("trailing", "trailing"),
                                                  ("linspace", "linspace")])
def test_saved_config_sets_timesteps_in_ddpm_and_ddim(tmp_path, kind, diffusers_kind):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = gk.GMSScheduler(timestep_spacing=kind)
    assert g.config.timestep_spacing == diffusers_kind and g.config.gms_timestep_spacing == kind
    g.save_pretrained(tmp_path)
    for source in (tmp_path, None):
        for cls in (DDPMScheduler, DDIMScheduler):
            d = cls.from_pretrained(tmp_path) if source else cls.from_config(g.config)
            d.set_timesteps(10)
            assert d.config.timestep_spacing == diffusers_kind
    # GMSScheduler itself keeps its own spacing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = gk.GMSScheduler.from_pretrained(tmp_path)
    again.set_timesteps(10)
    assert again.config.gms_timestep_spacing == kind and again.timesteps.tolist() == gk.trajectory(1000, 10, kind)[:10]


def test_even_and_linear_are_within_one_index_of_trailing():
    for T in (1000, 50, 37):
        for K in (1, 3, 7, 10, T):
            trailing = gk.trajectory(T, K, "trailing")
            for kind in ("even", "linear"):
                ts = gk.trajectory(T, K, kind)[:K]
                assert max(abs(a - b) for a, b in zip(ts, trailing)) <= 1, (T, K, kind)


def test_quad_spacing_warns_that_diffusers_reads_leading():
    with pytest.warns(UserWarning, match=r"'quad'.*'leading'"):
        gk.GMSScheduler(timestep_spacing="quad")


@pytest.mark.parametrize("target", [DDPMScheduler, DDIMScheduler])
def test_round_trip_through_diffusers_schedulers_keeps_what_both_understand(target):
    betas = torch.linspace(2e-4, 0.05, 200).tolist()
    cases = [dict(num_train_timesteps=200, trained_betas=betas, timestep_spacing="linspace", data_range=(-2.0, 2.0)),
             dict(beta_schedule="cosine", timestep_spacing="even", data_range=None, solver="sn-ddpm"),
             dict(beta_schedule="scaled_linear", timestep_spacing="leading", steps_offset=1, solver="ddim", eta=0.3),
             dict(timestep_spacing="linear", data_range=(0.0, 1.0), fit="adan", fit_iters=3)]
    for kwargs in cases:
        g = gk.GMSScheduler(**kwargs)
        d = target.from_config(g.config)
        # what the diffusers scheduler understands: betas, T, spacing, clipping, prediction type
        torch.testing.assert_close(d.betas.double(), g.schedule.betas, atol=1e-7, rtol=1e-5)
        assert d.config.num_train_timesteps == g.config.num_train_timesteps
        assert d.config.prediction_type == "epsilon" and d.config.steps_offset == g.config.steps_offset
        data_range = kwargs.get("data_range", (-1.0, 1.0))
        assert d.config.clip_sample == (data_range is not None)
        if data_range is not None:
            assert d.config.clip_sample_range == max(abs(v) for v in data_range)
        if kwargs["timestep_spacing"] in ("leading", "linspace"):  # diffusers' own: the same timesteps
            d.set_timesteps(10)
            g.set_timesteps(10)
            assert d.timesteps.tolist() == g.timesteps.tolist()
        # and back: nothing is lost
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            back = gk.GMSScheduler.from_config(d.config)
        assert [m for m in messages(caught) if "GMSScheduler" in m] == []
        assert torch.equal(back.schedule.betas, g.schedule.betas)
        for key in ("num_train_timesteps", "gms_timestep_spacing", "timestep_spacing", "steps_offset", "solver",
                    "fit", "fit_iters", "eta", "prediction_type"):
            assert back.config[key] == g.config[key], key
        assert back._data_range == g._data_range and back._options == g._options


def test_round_trip_warns_about_what_only_diffusers_understands():
    g = gk.GMSScheduler(timestep_spacing="even")
    d = DDPMScheduler.from_config(g.config, variance_type="fixed_large", thresholding=True)
    with pytest.warns(UserWarning) as caught:
        back = gk.GMSScheduler.from_config(d.config)
    text = " ".join(messages(caught))
    assert "variance_type='fixed_large'" in text and "thresholding=True" in text
    assert back.config.gms_timestep_spacing == "even"
    # a spacing changed on the diffusers side wins over the one GMSScheduler kept, with a warning
    d = DDPMScheduler.from_config(g.config, timestep_spacing="leading")
    with pytest.warns(UserWarning, match=r"gms_timestep_spacing='even'.*timestep_spacing='leading'"):
        back = gk.GMSScheduler.from_config(d.config)
    assert back.config.gms_timestep_spacing == "leading" and back.config.timestep_spacing == "leading"
    # the data range travels along: a clipping changed on the diffusers side is reported, the range kept
    d = DDPMScheduler.from_config(gk.GMSScheduler().config, clip_sample=False)
    with pytest.warns(UserWarning, match=r"clip_sample=False.*data_range=\[-1.0, 1.0\], which is used"):
        assert gk.GMSScheduler.from_config(d.config)._data_range == (-1.0, 1.0)
    # an explicit timestep_spacing= wins silently
    back = gk.GMSScheduler.from_config(g.config, timestep_spacing="quad")
    assert back.config.gms_timestep_spacing == "quad"
    back = gk.GMSScheduler.from_config(g.config, timestep_spacing="trailing")
    assert back.config.gms_timestep_spacing == "trailing"


# -- the spacing of a diffusers config left at its default -------------------------------------------
@pytest.mark.parametrize("source", [DDPMScheduler, DDIMScheduler])
def test_default_config_in_memory_and_saved_agree_on_leading(source, tmp_path):
    source().save_config(tmp_path)
    in_memory = gk.GMSScheduler.from_config(source().config)
    saved = gk.GMSScheduler.from_pretrained(tmp_path)
    want = source()
    want.set_timesteps(10)
    for s in (in_memory, saved):
        assert s.config.timestep_spacing == "leading"
        s.set_timesteps(10)
        assert s.timesteps.tolist() == want.timesteps.tolist() == list(range(900, -1, -100))
    # a default left in GMSScheduler's own config stays GMSScheduler's default
    assert gk.GMSScheduler.from_config(gk.GMSScheduler().config).config.gms_timestep_spacing == "even"


# -- bare multi-head UNets -----------------------------------------------------------------------------
def test_bare_three_head_unet_exports_as_gms(tmp_path):
    unet = tiny_unet(9, seed=3)
    export_diffusers(unet, tmp_path)
    pipe = quiet_pipe(tmp_path)
    assert pipe.unet.config.out_channels == 9 and pipe.scheduler.config.solver == "gms"
    x, t = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([900, 4])
    with torch.no_grad():
        assert torch.equal(pipe.unet(x, t).sample, unet(x, t).sample)
    kw = dict(shape=(2, 3, 8, 8), steps=3, generator=0, progress=False, backend="torch", schedule=gk.Schedule.linear())
    assert torch.equal(gk.sample(gm.load(tmp_path), **kw), gk.sample(unet, **kw))


def test_bare_two_channel_layout_needs_heads(tmp_path):
    unet = tiny_unet(6, seed=4)
    with pytest.raises(ValueError, match=r"out_channels = 6 .*learned variance.*heads=1.*heads=2"):
        export_diffusers(unet, tmp_path / "ambiguous")
    export_diffusers(unet, tmp_path / "sn", heads=2, solver="sn-ddpm")
    pipe = quiet_pipe(tmp_path / "sn")
    x, t = torch.randn(1, 3, 8, 8), torch.tensor([10])
    with torch.no_grad():
        assert pipe.unet.config.out_channels == 6 and torch.equal(pipe.unet(x, t).sample, unet(x, t).sample)
    img = pipe(batch_size=1, num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="pt").images
    assert torch.isfinite(img).all()
    export_diffusers(unet, tmp_path / "eps", heads=1, solver="ddpm")
    pipe = quiet_pipe(tmp_path / "eps")
    with torch.no_grad():
        assert pipe.unet.config.out_channels == 3 and torch.equal(pipe.unet(x, t).sample, unet(x, t).sample[:, :3])
    with pytest.raises(ValueError, match="heads=3.*gives 2"):
        export_diffusers(unet, tmp_path / "bad", heads=3)
    with pytest.raises(ValueError, match="heads=2.*MomentNet"):
        export_diffusers(gm.MomentNet(tiny_unet(3)), tmp_path / "bad", heads=2)


# -- the schedule of a raw UNet2DModel -------------------------------------------------------------------
@pytest.fixture(scope="module")
def cosine_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cosine")
    DDPMPipeline(unet=tiny_unet(3, seed=5), scheduler=DDPMScheduler(beta_schedule="squaredcos_cap_v2")).save_pretrained(
        path)
    return path


def test_raw_unet_from_a_pipeline_samples_with_the_pipeline_schedule(cosine_dir):
    kw = dict(shape=(2, 3, 8, 8), steps=3, generator=0, progress=False, backend="torch", solver="ddpm")
    unet = tiny_unet(3, seed=5)
    want = gk.sample(unet, schedule=gk.Schedule.cosine(1000), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # found: nothing to warn about
        assert torch.equal(gk.sample(UNet2DModel.from_pretrained(cosine_dir, subfolder="unet"), **kw), want)
        assert torch.equal(gk.sample(UNet2DModel.from_pretrained(cosine_dir / "unet"), **kw), want)
    with pytest.warns(UserWarning, match="linear betas"):
        linear = gk.sample(unet, **kw)
    assert not torch.equal(linear, want)


def test_schedule_accepts_a_diffusers_scheduler_or_its_config(cosine_dir):
    kw = dict(shape=(2, 3, 8, 8), steps=3, generator=0, progress=False, backend="torch", solver="ddpm")
    unet = tiny_unet(3, seed=5)
    want = gk.sample(unet, schedule=gk.Schedule.cosine(1000), **kw)
    ddpm = DDPMScheduler.from_pretrained(cosine_dir, subfolder="scheduler")
    for schedule in (ddpm, ddpm.config, dict(ddpm.config), gk.GMSScheduler(beta_schedule="cosine")):
        assert torch.equal(gk.sample(unet, schedule=schedule, **kw), want)
    s = check_schedule(DDPMScheduler(num_train_timesteps=50, beta_schedule="scaled_linear",
                                                 beta_start=1e-3, beta_end=0.02))
    assert s.T == 50 and torch.equal(s.betas, gk.GMSScheduler(num_train_timesteps=50, beta_schedule="scaled_linear",
                                                              beta_start=1e-3, beta_end=0.02).schedule.betas)
    with pytest.raises(ValueError, match="rescale_betas_zero_snr"):
        check_schedule(DDPMScheduler(rescale_betas_zero_snr=True))
    with pytest.raises(TypeError, match="diffusers scheduler"):
        check_schedule("cosine")


# -- the learned-variance layout in GMSScheduler.step ---------------------------------------------------
def test_scheduler_refuses_learned_variance_channels_as_e2(tmp_path):
    pipe = DDPMPipeline(unet=tiny_unet(6), scheduler=gk.GMSScheduler(solver="sn-ddpm"))
    pipe.set_progress_bar_config(disable=True)
    with pytest.raises(ValueError, match=r"learned variance.*never reads as E\[eps\^2\].*model_heads=2"):
        pipe(batch_size=1, num_inference_steps=2, generator=torch.Generator().manual_seed(0))
    # gk.sample refuses the same UNet with the same words
    with pytest.raises(ValueError, match=r"learned variance.*never reads as E\[eps\^2\]"):
        gk.sample(tiny_unet(6), shape=(1, 3, 8, 8), steps=2, solver="sn-ddpm", progress=False)
    # declared heads pass: a gms_kernels export says so itself
    pipe = DDPMPipeline(unet=tiny_unet(6), scheduler=gk.GMSScheduler(solver="sn-ddpm", model_heads=2))
    pipe.set_progress_bar_config(disable=True)
    assert torch.isfinite(pipe(batch_size=1, num_inference_steps=2, generator=torch.Generator().manual_seed(0),
                               output_type="pt").images).all()
    export_diffusers(gm.MomentNet(tiny_unet(3), orders=(2,)), tmp_path, solver="sn-ddpm")
    assert quiet_pipe(tmp_path).scheduler.config.model_heads == 2
    with pytest.raises(ValueError, match="model_heads=1.*solver 'gms' reads 3"):
        gk.GMSScheduler(model_heads=1)


# -- frictions ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("solver", ["ddpm", "ddim", "sn-ddpm", "gms"])
def test_variance_noise_is_the_step_noise(solver):
    s = gk.GMSScheduler(solver=solver, eta=0.5 if solver == "ddim" else 0.0, backend="torch")
    s.set_timesteps(4)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 4, generator=g)
    e1 = torch.randn(2, 3, 4, 4, generator=g) * 0.5
    out = torch.cat([e1, e1**2 + 0.3, e1**3], 1)
    z = torch.randn(2, 3, 4, 4, generator=g)
    t = s.timesteps[1]
    got = s.step(out, t, x, generator=5, variance_noise=z).prev_sample
    want = gk.step(x.double(), out.double(), int(t), int(s.timesteps[2]), s.schedule, solver, 5, noise=z.double(),
                   backend="torch", options=s._options).float()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    other = s.step(out, t, x, generator=5, variance_noise=-z).prev_sample
    assert solver == "ddim" and s.config.eta == 0.0 or not torch.equal(got, other)
    with pytest.raises(ValueError, match="noise must be a tensor shaped like"):
        s.step(out, t, x, variance_noise=z[:1])


def test_ddim_equals_diffusers_ddim_with_clipped_model_output():
    """The documented sizes: GMS ddim is DDIMScheduler(eta=0) with use_clipped_model_output=True; without it the
    two differ where the x0 clamp acts."""
    g = torch.Generator().manual_seed(0)
    ours, ref = gk.GMSScheduler(solver="ddim", timestep_spacing="trailing", backend="torch"), DDIMScheduler(
        timestep_spacing="trailing")
    ours.set_timesteps(10)
    ref.set_timesteps(10)
    worst_clipped = worst_raw = 0.0
    for t in ours.timesteps:
        x = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64) * 1.5
        eps = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)
        a = ours.step(eps, t, x).prev_sample
        worst_clipped = max(worst_clipped, float((a - ref.step(eps, t, x, use_clipped_model_output=True).prev_sample)
                                                 .abs().max()))
        worst_raw = max(worst_raw, float((a - ref.step(eps, t, x).prev_sample).abs().max()))
    assert worst_clipped < 1e-5 and worst_raw > 0.5


def test_ddpm_large_is_diffusers_fixed_large_but_for_the_noise_of_the_step_into_data():
    """The documented difference: with the same noise every step agrees but the last, where DDPMScheduler adds
    sqrt(1 - abar_t) z and ddpm-large steps to the denoised mean."""
    ours = gk.GMSScheduler(solver="ddpm-large", timestep_spacing="trailing", backend="torch")
    ref = DDPMScheduler(timestep_spacing="trailing", variance_type="fixed_large")
    ours.set_timesteps(10)
    ref.set_timesteps(10)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)
    for i, t in enumerate(ours.timesteps):
        eps = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64) * 0.3
        z = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
        a = ours.step(eps, t, x, variance_noise=z).prev_sample
        b = ref.step(eps, t, x, generator=torch.Generator().manual_seed(i)).prev_sample
        extra = (1 - ours.schedule.alphas_cumprod[int(t)]).sqrt() * z if i == 9 else 0 * z
        torch.testing.assert_close(b - a, extra, atol=1e-5, rtol=0)
        x = a


def test_fid_of_identical_sets_is_zero():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(16, 12, generator=g)
    net = lambda x: x.float().flatten(1)[:, :16] / 255 @ W  # noqa: E731
    a = torch.rand(40, 1, 4, 4, generator=g) * 2 - 1
    assert metrics.fid(a, a, inception=net) == pytest.approx(0.0, abs=1e-9)  # (float64 rounding of equal statistics)
    assert metrics.fid((a + 0.5).clamp(-1, 1), a, inception=net) > 0.0
