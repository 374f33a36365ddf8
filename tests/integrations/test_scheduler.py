"""GMSScheduler: a diffusers scheduler around gk.step."""
import collections
import json
import warnings
import math

import numpy as np
import pytest
import torch

import gms_kernels as gk

from diffusers import DDIMPipeline, DDIMScheduler, DDPMPipeline, DDPMScheduler, UNet2DModel
from diffusers.models.unets.unet_2d import UNet2DOutput

from gms_kernels.integrations.scheduler import GMSScheduler, GMSSchedulerOutput, inference_timesteps  # noqa: E402

C, H, W = 3, 6, 5




def heads(n=4, k=3, seed=0, dtype=torch.float32):
    """A plausible [e1, e2, e3] output: e2 >= e1^2, e3 of either sign."""
    g = torch.Generator().manual_seed(seed)
    e1 = torch.randn(n, C, H, W, generator=g) * 0.8
    e2 = e1**2 + torch.rand(n, C, H, W, generator=g) * 0.5
    e3 = e1**3 + torch.randn(n, C, H, W, generator=g) * 0.3
    return torch.cat([e1, e2, e3][:k], dim=1).to(dtype)


def x_at(n=4, seed=1, dtype=torch.float32):
    return torch.randn(n, C, H, W, generator=torch.Generator().manual_seed(seed)).to(dtype)


# -- configuration -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid"])
def test_betas_match_diffusers(name):
    ours = GMSScheduler(beta_schedule=name, beta_start=1e-4, beta_end=0.02)
    ref = DDPMScheduler(beta_schedule=name, beta_start=1e-4, beta_end=0.02)
    torch.testing.assert_close(ours.schedule.betas, ref.betas.to(torch.float64), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours.alphas_cumprod, ref.alphas_cumprod, atol=1e-5, rtol=1e-5)


def test_cosine_is_improved_diffusion_and_trained_betas():
    assert torch.equal(GMSScheduler(beta_schedule="cosine").schedule.betas, gk.Schedule.cosine(1000).betas)
    betas = torch.linspace(1e-3, 0.2, 50).tolist()
    s = GMSScheduler(num_train_timesteps=50, trained_betas=betas)
    torch.testing.assert_close(s.schedule.betas, torch.tensor(betas, dtype=torch.float64))
    with pytest.raises(ValueError, match="trained_betas has 50"):
        GMSScheduler(num_train_timesteps=60, trained_betas=betas)


def test_basic_attributes():
    s = GMSScheduler()
    assert len(s) == 1000 and s.order == 1 and s.init_noise_sigma == 1.0
    x = x_at()
    assert s.scale_model_input(x, 10) is x
    assert s.timesteps.tolist() == list(range(999, -1, -1))  # before set_timesteps: every step


@pytest.mark.parametrize("kwargs, match", [
    (dict(solver="exact"), "unknown solver"), (dict(solver="foo"), "unknown solver"),
    (dict(timestep_spacing="karras"), "unknown timestep_spacing"), (dict(fit="lbfgs"), "unknown fit"),
    (dict(select="max"), "select"), (dict(eta=2.0, solver="ddim"), "eta"),
    (dict(prediction_type="v_prediction"), "epsilon"), (dict(rescale_betas_zero_snr=True), "zero terminal"),
    (dict(beta_schedule="laplace"), "unknown beta_schedule"), (dict(data_range=(1, -1)), "data_range"),
    (dict(backend="cuda"), "unknown backend"), (dict(solver_options={"bogus": 1}), "unknown option"),
    (dict(solver_options={"fit": "adan"}), "GMSScheduler argument"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GMSScheduler(**kwargs)


def test_from_ddpm_config_and_roundtrip(tmp_path):
    ddpm = DDPMScheduler(beta_schedule="squaredcos_cap_v2", timestep_spacing="trailing", variance_type="fixed_large")
    with pytest.warns(UserWarning, match="variance_type='fixed_large'"):
        s = GMSScheduler.from_config(ddpm.config)
    assert s.config.beta_schedule == "squaredcos_cap_v2" and s.config.timestep_spacing == "trailing"
    assert s.config.solver == "gms"
    with pytest.warns(UserWarning, match="variance_type"):
        s = GMSScheduler.from_config(ddpm.config, solver="sn-ddpm", timestep_spacing="even")
    assert s.config.solver == "sn-ddpm" and s.config.gms_timestep_spacing == "even"
    with pytest.raises(ValueError, match="epsilon"):
        GMSScheduler.from_config(DDPMScheduler(prediction_type="v_prediction").config)
    # JSON round trip (tuples become lists)
    a = GMSScheduler(solver="gms", fit="adan", fit_iters=3, data_range=(0.0, 1.0),
                     solver_options={"weights": [0.25, 0.75], "var_floor": 0.2})
    a.save_config(tmp_path)
    b = GMSScheduler.from_pretrained(tmp_path)
    assert b._options == a._options and b._data_range == (0.0, 1.0)


def _gms_warnings(fn):
    """Run fn; return (its result, the messages of the UserWarnings raised from gms_kernels)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught if "GMSScheduler" in str(w.message)]


@pytest.mark.parametrize("source, data_range", [
    (DDPMScheduler(clip_sample=False), None),
    (DDPMScheduler(clip_sample=True, clip_sample_range=2.0), (-2.0, 2.0)),
    (DDPMScheduler(clip_sample_range=0.5), (-0.5, 0.5)),  # clip_sample left at its default, True
    (DDIMScheduler(clip_sample=False), None),
    (DDIMScheduler(clip_sample_range=3.0), (-3.0, 3.0)),
    (DDPMScheduler(), (-1.0, 1.0)),  # nothing set: GMSScheduler's default
])
def test_from_config_translates_clip_sample_to_data_range(source, data_range, tmp_path):
    """clip_sample / clip_sample_range of a DDPM or DDIM config set data_range, without a
    warning; the result survives save_pretrained / from_pretrained without being translated again."""
    s, messages = _gms_warnings(lambda: GMSScheduler.from_config(source.config))
    assert s._data_range == data_range and messages == []
    assert (None if s.config.data_range is None else tuple(s.config.data_range)) == data_range
    s.save_pretrained(tmp_path)
    again, messages = _gms_warnings(lambda: GMSScheduler.from_pretrained(tmp_path))
    assert again._data_range == data_range and messages == []
    # an explicit data_range wins over clip_sample
    explicit, messages = _gms_warnings(lambda: GMSScheduler.from_config(source.config, data_range=(0.0, 1.0)))
    assert explicit._data_range == (0.0, 1.0) and messages == []


def test_from_config_warns_once_about_thresholding_and_dropped_keys(tmp_path):
    """thresholding=True has no equivalent (one clear warning); variance_type and any other
    explicitly set key that is dropped is named in one warning; keys left at their defaults, or with
    GMSScheduler's behaviour (set_alpha_to_one=True), give none."""
    s, messages = _gms_warnings(lambda: GMSScheduler.from_config(
        DDPMScheduler(thresholding=True, sample_max_value=2.5, clip_sample=False).config))
    assert len(messages) == 1 and "thresholding=True" in messages[0] and "no equivalent" in messages[0]
    assert "sample_max_value=2.5" in messages[0] and "data_range=None" in messages[0]
    assert s._data_range is None and s.config.solver == "gms"

    s, messages = _gms_warnings(lambda: GMSScheduler.from_config(DDPMScheduler(variance_type="fixed_small").config))
    assert len(messages) == 1 and "variance_type='fixed_small'" in messages[0] and "solver='ddpm'" in messages[0]
    assert s.config.solver == "gms"  # variance_type never picks the solver
    s, messages = _gms_warnings(lambda: GMSScheduler.from_config(
        DDPMScheduler(variance_type="learned_range").config, solver="ddim"))
    assert len(messages) == 1 and "'learned_range'" in messages[0] and "solver='ddim'" in messages[0]
    assert s.config.solver == "ddim"
    # with sn-ddpm or gms the learned variance channels would be read as E[eps^2]: refused
    with pytest.raises(ValueError, match="learned variance"):
        GMSScheduler.from_config(DDPMScheduler(variance_type="learned_range").config, solver="sn-ddpm")

    _, messages = _gms_warnings(lambda: GMSScheduler.from_config(DDIMScheduler(set_alpha_to_one=False).config))
    assert len(messages) == 1 and "set_alpha_to_one=False" in messages[0]
    _, messages = _gms_warnings(lambda: GMSScheduler.from_config(
        DDIMScheduler(set_alpha_to_one=True, thresholding=False, dynamic_thresholding_ratio=0.9).config))
    assert messages == []

    # a saved DDPM config (as on the Hub) sets every key: only variance_type is reported
    DDPMScheduler(clip_sample=False).save_config(tmp_path)
    s, messages = _gms_warnings(lambda: GMSScheduler.from_pretrained(tmp_path))
    assert len(messages) == 1 and "variance_type='fixed_small'" in messages[0] and s._data_range is None

    config = dict(DDPMScheduler().config, some_future_key=7)  # a key of no scheduler diffusers knows here
    _, messages = _gms_warnings(lambda: GMSScheduler.from_config(config))
    assert len(messages) == 1 and "some_future_key=7" in messages[0]


def test_save_pretrained_with_tensor_options_round_trips(tmp_path):
    """Tensors, numpy arrays and tuples in solver_options (an Analytic-DPM gamma table with
    NaN where it was not estimated), trained_betas and data_range are stored as lists, so
    save_pretrained writes valid JSON, and from_pretrained gives back a scheduler that steps the same."""
    gamma = torch.linspace(0.1, 0.9, 50, dtype=torch.float64)
    gamma[::7] = float("nan")
    betas = np.linspace(1e-3, 0.2, 50)
    a = GMSScheduler(num_train_timesteps=50, trained_betas=betas, solver="analytic-dpm", backend="torch",
                     data_range=torch.tensor([-2.0, 2.0]), solver_options={"gamma": gamma, "clip_pixel": np.float32(2)})
    assert isinstance(a.config.solver_options["gamma"], list) and isinstance(a.config.trained_betas, list)
    a.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "scheduler_config.json").read_text())
    assert saved["solver_options"]["clip_pixel"] == 2.0 and len(saved["solver_options"]["gamma"]) == 50
    b = GMSScheduler.from_pretrained(tmp_path)
    for s in (a, b):
        assert torch.equal(s._options.gamma.nan_to_num(-1), gamma.nan_to_num(-1))
        assert s._options.gamma.dtype == torch.float64 and s._data_range == (-2.0, 2.0)
    torch.testing.assert_close(b.schedule.betas, torch.as_tensor(betas), rtol=0, atol=0)
    ts = [48, 30, 12]  # gamma is estimated there
    x = x_at()
    for s in (a, b):
        s.set_timesteps(timesteps=ts)
    for t_a, t_b in zip(a.timesteps, b.timesteps):
        out = heads(k=1, seed=int(t_a))
        assert torch.equal(a.step(out, t_a, x, generator=3).prev_sample, b.step(out, t_b, x, generator=3).prev_sample)
    with pytest.raises(TypeError, match="cannot hold"):
        GMSScheduler(solver_options={"var_floor": object()})


# -- timesteps -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", gk.TRAJECTORY_KINDS)
@pytest.mark.parametrize("K", [1, 7, 10])
def test_every_spacing(kind, K):
    s = GMSScheduler(timestep_spacing=kind)
    s.set_timesteps(K)
    assert s.timesteps.dtype == torch.long
    assert s.timesteps.tolist() == gk.trajectory(1000, K, kind)[:K]
    assert len(s.timesteps) == K
    assert (s.timesteps[:-1] > s.timesteps[1:]).all()
    assert s.num_inference_steps == K
    if kind in ("leading", "trailing", "linspace"):  # diffusers' own spacings agree
        ref = DDPMScheduler(timestep_spacing=kind)
        ref.set_timesteps(K)
        assert s.timesteps.tolist() == ref.timesteps.tolist()


class CountingUNet(UNet2DModel):
    """A UNet2DModel that records the timestep of every forward call."""

    def forward(self, sample, timestep, *args, **kwargs):
        self.calls.append(int(timestep))
        return super().forward(sample, timestep, *args, **kwargs)


@pytest.mark.parametrize("kind", gk.TRAJECTORY_KINDS)
def test_num_inference_steps_is_the_number_of_network_calls(kind):
    """set_timesteps(N) means N network calls, as in diffusers, for every spacing: counted
    inside DDPMPipeline and in a hand-written loop (also where "even" reaches t = 0 by itself, N > T/2)."""
    unet = tiny_unet(9, cls=CountingUNet)
    for n in (1, 2, 3, 10):
        unet.calls = []
        pipe = DDPMPipeline(unet=unet, scheduler=GMSScheduler(timestep_spacing=kind, backend="torch"))
        pipe.set_progress_bar_config(disable=True)
        pipe(num_inference_steps=n, batch_size=1, generator=torch.Generator().manual_seed(0), output_type="pt")
        assert len(unet.calls) == n, (kind, n, unet.calls)
        assert unet.calls == gk.trajectory(1000, n, kind)[:n]
    T = 40
    s = GMSScheduler(num_train_timesteps=T, timestep_spacing=kind, backend="torch", solver="ddpm")
    x = x_at(1)
    for n in (1, 2, 19, 20, 21, 22, 39, 40):
        s.set_timesteps(n)
        calls = 0
        for t in s.timesteps:
            calls += 1
            x = s.step(heads(1, k=1, seed=calls), t, x, generator=0).prev_sample
        assert calls == n == s.num_inference_steps
        assert inference_timesteps(T, n, kind) == s.timesteps.tolist()


def test_leading_steps_offset_matches_diffusers():
    s, ref = GMSScheduler(timestep_spacing="leading", steps_offset=1), DDPMScheduler(timestep_spacing="leading",
                                                                                       steps_offset=1)
    s.set_timesteps(20)
    ref.set_timesteps(20)
    assert s.timesteps.tolist() == ref.timesteps.tolist()


def test_custom_timesteps_and_errors():
    s = GMSScheduler()
    s.set_timesteps(timesteps=[900, 500, 37, 2])
    assert s.timesteps.tolist() == [900, 500, 37, 2] and s.custom_timesteps
    s.set_timesteps(timesteps=torch.tensor([10, 5]))
    assert s.timesteps.tolist() == [10, 5]
    for bad in ([5, 10], [1000, 3], [4, 4]):
        with pytest.raises(ValueError):
            s.set_timesteps(timesteps=bad)
    with pytest.raises(ValueError, match="exactly one"):
        s.set_timesteps()
    with pytest.raises(ValueError, match="exactly one"):
        s.set_timesteps(5, timesteps=[3, 2])
    with pytest.raises(ValueError):
        s.set_timesteps(1001)
    with pytest.raises(ValueError, match="integer"):
        s.set_timesteps(4.5)
    s.set_timesteps(torch.tensor(4))
    assert s.timesteps.tolist() == gk.trajectory(1000, 4, "even")[:4]


def test_previous_timestep_is_looked_up():
    s = GMSScheduler()
    s.set_timesteps(timesteps=[950, 700, 420, 100, 3])
    assert [s.previous_timestep(t) for t in s.timesteps] == [700, 420, 100, 3, gk.DATA]
    with pytest.raises(ValueError, match="not one of scheduler.timesteps"):
        s.step(heads(), 500, x_at())
    with pytest.raises(ValueError, match="one timestep"):
        s.step(heads(), torch.tensor([950, 700, 700, 700]), x_at())


# -- step ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("solver, k, extra", [
    ("gms", 3, {}), ("gms", 3, dict(fit="adan", fit_iters=4, select="pixel")),
    ("sn-ddpm", 2, {}), ("ddpm", 1, {}), ("ddpm-large", 3, {}), ("ddim", 1, dict(eta=0.5)),
])
def test_step_equals_gk_step(solver, k, extra):
    ts = [950, 700, 420, 100, 3]
    s = GMSScheduler(solver=solver, backend="torch", model_heads=k, **extra)
    s.set_timesteps(timesteps=ts)
    opts = {key: v for key, v in extra.items()}
    x = x_at()
    for i, t in enumerate(s.timesteps):
        nxt = ts[i + 1] if i + 1 < len(ts) else gk.DATA
        out = heads(k=k, seed=i)
        got = s.step(out, t, x, generator=123 + i)
        assert isinstance(got, GMSSchedulerOutput)
        ref = gk.step(x, out, ts[i], nxt, s.schedule, solver, 123 + i, backend="torch", **opts)
        assert torch.equal(got.prev_sample, ref)
        a, sig = s.schedule.alpha(ts[i]), s.schedule.sigma(ts[i])
        x0 = ((x.double() - sig * out[:, :C].double()) / a).clamp(-1, 1).float()
        torch.testing.assert_close(got.pred_original_sample, x0)
        # torch.Generator: one seed drawn per step, the same draw as gk.step makes
        g1, g2 = torch.Generator().manual_seed(i), torch.Generator().manual_seed(i)
        prev, x0b = s.step(out, t, x, generator=g1, return_dict=False)
        assert torch.equal(prev, gk.step(x, out, ts[i], nxt, s.schedule, solver, g2, backend="torch", **opts))
        x = prev


def test_generator_list_is_honoured_per_sample():
    s = GMSScheduler(backend="torch")
    s.set_timesteps(5)
    t = s.timesteps[1]
    x, out = x_at(3), heads(3)
    batch = s.step(out, t, x, generator=[torch.Generator().manual_seed(i) for i in range(3)]).prev_sample
    for i in range(3):
        alone = s.step(out[i:i + 1], t, x[i:i + 1], generator=torch.Generator().manual_seed(i)).prev_sample
        assert torch.equal(batch[i:i + 1], alone)
    other = s.step(out, t, x, generator=[torch.Generator().manual_seed(i + 7) for i in range(3)]).prev_sample
    assert not torch.equal(batch, other)
    with pytest.raises(ValueError, match="one per sample"):
        s.step(out, t, x, generator=[torch.Generator()] * 2)


@pytest.mark.parametrize("solver, k", [("gms", 3), ("sn-ddpm", 2), ("ddim", 1)])
def test_fp16_is_upcast(solver, k):
    s = GMSScheduler(solver=solver, backend="torch", model_heads=k)
    s.set_timesteps(4)
    x16, out16 = (x_at() * 3).half(), (heads(k=k) * 4).half()  # large heads: fp16 maths would overflow
    for t in s.timesteps:
        res = s.step(out16, t, x16, generator=1)
        assert res.prev_sample.dtype == torch.float16 and res.pred_original_sample.dtype == torch.float16
        assert torch.isfinite(res.prev_sample).all()
        ref = s.step(out16.float(), t, x16.float(), generator=1).prev_sample
        torch.testing.assert_close(res.prev_sample.float(), ref, atol=1e-2, rtol=1e-2)
        x16 = res.prev_sample


def test_timesteps_are_found_by_position_or_by_value():
    """Elements of scheduler.timesteps (views) are located by their position; any other tensor or
    int by its value, with the same result."""
    s = GMSScheduler(backend="torch")
    s.set_timesteps(6)
    x, out = x_at(), heads()
    for i, t in enumerate(s.timesteps):
        for other in (t, s.timesteps[i:i + 1], t.clone(), int(t), t.expand(4)):
            assert s._index(other) == i
    assert s._position_in_timesteps(s.timesteps[2]) == 2
    assert s._position_in_timesteps(s.timesteps[2].clone()) is None
    assert torch.equal(s.step(out, s.timesteps[3], x, generator=4).prev_sample,
                       s.step(out, int(s.timesteps[3]), x, generator=4).prev_sample)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's numpy
def test_triton_nan_is_reported_at_the_next_step_and_at_once_at_the_last(monkeypatch):
    """With the Triton backend a step's NaN/inf flag is read at the next step (no sync now), at once
    for the last step, and by set_timesteps when a loop stops half-way; the error names the timestep."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the Triton kernel on CPU tensors
    s = GMSScheduler(backend="triton")
    s.set_timesteps(timesteps=[900, 600, 300])
    x, good = x_at(2), heads(2)
    bad = good.clone()
    bad[1, C + 1, 2, 3] = float("nan")  # e2
    first, middle, last = s.timesteps
    s.step(bad, first, x, generator=0)  # queued, not read
    with pytest.raises(ValueError, match="at timestep 900 .*head e2"):
        s.step(good, middle, x, generator=0)
    s.step(good, middle, x, generator=0)  # the flag was consumed with the error
    bad_e1 = good.clone()
    bad_e1[0, 2, 1, 1] = float("inf")  # (the last step, to the data, reads e1 only)
    with pytest.raises(ValueError, match="at t=300 .*head e1"):  # gk.step reads the last step's flag itself
        s.step(bad_e1, last, x, generator=0)
    s.step(bad, middle, x, generator=0)
    with pytest.raises(ValueError, match="at timestep 600 "):
        s.set_timesteps(3)
    ok = s.step(good, s.timesteps[0], x, generator=0).prev_sample
    assert torch.isfinite(ok).all()


def test_triton_loop_reads_nothing_on_the_host_per_step_but_the_deferred_flag(monkeypatch, host_reads):
    """Stepping through scheduler.timesteps with the Triton backend reads one thing per step on the
    host (each read of a device tensor waits for the device's queue): the previous step's NaN/inf
    flag. Counted on CPU tensors with the kernel launch stubbed out."""
    tg = pytest.importorskip("gms_kernels.kernels.triton_gms")
    if not tg.available():
        pytest.skip("triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tg, "_launch_interpreted", lambda grid, *args, **kwargs: None)
    s = GMSScheduler(backend="triton")
    x, out = x_at(2), heads(2)
    per_run, lengths = {}, {}
    for steps in (2, 3, 7):  # (the first loop also takes the one-off reads of first use)
        s.set_timesteps(steps)
        lengths[steps] = len(s.timesteps)
        for t in s.timesteps:
            s.step(out, t, x, generator=1)
        per_run[steps], host_reads[:] = collections.Counter(host_reads), []
    extra = lengths[7] - lengths[3]
    assert per_run[7] - per_run[3] == collections.Counter({("item", "raise_if_set"): extra}), per_run
    assert not per_run[3] - per_run[7]


def test_channel_mismatch_error():
    s = GMSScheduler(backend="torch")
    s.set_timesteps(3)
    with pytest.raises(ValueError, match=r"needs 3 head\(s\).*gave 6"):
        s.step(heads(k=2), s.timesteps[0], x_at())
    sn = GMSScheduler(solver="sn-ddpm")
    sn.set_timesteps(3)
    with pytest.raises(ValueError, match=r"needs 2 head\(s\)"):
        sn.step(heads(k=1), sn.timesteps[0], x_at())


def test_add_noise():
    s, ref = GMSScheduler(), DDPMScheduler()
    x0, eps = x_at(4, 1), x_at(4, 2)
    t = torch.tensor([0, 10, 500, 999])
    got = s.add_noise(x0, eps, t)
    want = torch.stack([s.schedule.add_noise(x0[i].double(), eps[i].double(), int(t[i])) for i in range(4)])
    torch.testing.assert_close(got, want.float())
    torch.testing.assert_close(got, ref.add_noise(x0, eps, t), atol=1e-5, rtol=1e-5)
    assert s.add_noise(x0.half(), eps.half(), t).dtype == torch.float16
    with pytest.raises(ValueError):
        s.add_noise(x0, eps, torch.tensor([1000, 0, 0, 0]))


# -- end to end inside diffusers' DDPMPipeline -----------------------------------------------------
def tiny_unet(out_channels, seed=0, cls=UNet2DModel):
    torch.manual_seed(seed)
    return cls(sample_size=8, in_channels=3, out_channels=out_channels, layers_per_block=1,
               block_out_channels=(8, 16), norm_num_groups=4,
               down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))


class PerSampleUNet(UNet2DModel):
    """Runs the batch one sample at a time, so the network itself is exactly batch-independent
    (batched convolutions round differently, and the GMS cube root amplifies rounding)."""

    def forward(self, sample, timestep, *args, **kwargs):
        outs = [super(PerSampleUNet, self).forward(sample[i:i + 1], timestep, *args, **kwargs).sample
                for i in range(sample.shape[0])]
        return UNet2DOutput(sample=torch.cat(outs))


def run_pipe(unet, scheduler, **kw):
    pipe = DDPMPipeline(unet=unet, scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe(num_inference_steps=3, **kw).images


def test_ddpm_pipeline_end_to_end_gms():
    img = run_pipe(tiny_unet(9), GMSScheduler(), batch_size=2, generator=torch.Generator().manual_seed(0),
                   output_type="np")
    assert img.shape == (2, 8, 8, 3) and img.min() >= 0 and img.max() <= 1
    again = run_pipe(tiny_unet(9), GMSScheduler(), batch_size=2, generator=torch.Generator().manual_seed(0),
                     output_type="np")
    assert (img == again).all()
    pt = run_pipe(tiny_unet(9), GMSScheduler(timestep_spacing="trailing"), batch_size=1, output_type="pt")
    assert pt.shape == (1, 3, 8, 8) and torch.isfinite(pt).all()


def test_ddpm_pipeline_generator_list_matches_single_runs():
    sched = GMSScheduler(backend="torch")
    unet = tiny_unet(9, cls=PerSampleUNet)
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    batch = run_pipe(unet, sched, batch_size=3, generator=gens, output_type="pt")
    for i in range(3):
        alone = run_pipe(unet, sched, batch_size=1, generator=torch.Generator().manual_seed(i), output_type="pt")
        assert torch.equal(batch[i], alone[0])
    assert not torch.equal(batch[0], batch[1])


@pytest.mark.parametrize("solver, channels", [("sn-ddpm", 6), ("ddpm", 3), ("ddim", 3)])
def test_ddpm_pipeline_other_solvers(solver, channels):
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    img = run_pipe(tiny_unet(channels), GMSScheduler(solver=solver, model_heads=channels // 3), batch_size=2,
                   generator=gens, output_type="np")
    assert img.shape == (2, 8, 8, 3) and img.min() >= 0 and img.max() <= 1


def test_ddim_pipeline_replaces_the_scheduler():
    """(Documented in GMSScheduler's docstring) DDIMPipeline converts any scheduler to a
    DDIMScheduler, so GMS must run in DDPMPipeline or a hand-written loop."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = DDIMPipeline(unet=tiny_unet(9), scheduler=GMSScheduler())
    assert type(pipe.scheduler) is DDIMScheduler
    assert "DDIMPipeline" in GMSScheduler.__doc__ and "DDPMPipeline" in GMSScheduler.__doc__


def test_add_noise_refuses_fractional_timesteps_and_takes_integral_floats():
    s = GMSScheduler(num_train_timesteps=100)
    x0, eps = torch.ones(2, 1, 2, 2), torch.zeros(2, 1, 2, 2)
    a = float(s.schedule.alphas_cumprod[10].sqrt())
    assert torch.allclose(s.add_noise(x0, eps, torch.tensor([10.0, 10.0])), torch.full_like(x0, a))
    for bad in (torch.tensor([10.5, 10.0]), 3.7, torch.tensor([True, False])):
        with pytest.raises(ValueError, match="timesteps must be integer time indices"):
            s.add_noise(x0, eps, bad)


LINEAR_BETAS = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64).tolist()


def _abar(t: int) -> float:
    """prod_{i<=t} (1 - beta_i) of the linear schedule, recomputed here (1 for the data, t = -1)."""
    return 1.0 if t < 0 else math.prod(1.0 - b for b in LINEAR_BETAS[: t + 1])


def _inputs(seed: int, shape=(3, 2, 4, 4), scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) * scale for _ in range(3)]


def _scheduler_warnings(fn):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [(w.category, str(w.message)) for w in caught if "GMSScheduler" in str(w.message)]


def test_from_config_clip_defaults_and_an_explicit_data_range_in_the_config():
    """A foreign config that sets clip_sample without clip_sample_range clips to diffusers' default range 1
    (data_range (-1, 1)); a data_range already in the config wins over clip_sample."""
    from gms_kernels import GMSScheduler

    base = {"_class_name": "DDPMScheduler", "num_train_timesteps": 1000}
    s, _ = _scheduler_warnings(lambda: GMSScheduler.from_config(dict(base, clip_sample=True)))
    assert s._data_range == (-1.0, 1.0)
    s, _ = _scheduler_warnings(lambda: GMSScheduler.from_config(dict(base, clip_sample=True, clip_sample_range=3.0,
                                                                    data_range=[0.0, 1.0])))
    assert s._data_range == (0.0, 1.0)


def test_from_config_returns_the_unused_kwargs_when_asked():
    """from_config(..., return_unused_kwargs=True) returns (scheduler, unused kwargs), as ConfigMixin does."""
    from gms_kernels import GMSScheduler

    out = GMSScheduler.from_config(GMSScheduler(solver="ddpm").config, return_unused_kwargs=True)
    assert isinstance(out, tuple) and isinstance(out[0], GMSScheduler) and isinstance(out[1], dict)


def test_from_config_names_a_config_without_a_class_and_refuses_learned_variance_heads():
    """A dropped key of a config with no _class_name is reported against "the source config"; a learned
    variance ("learned" as well as "learned_range") is refused for solvers that read more than one head; an
    unknown solver next to variance_type is refused as unknown (ValueError), not by an AttributeError."""
    from gms_kernels import GMSScheduler

    s, messages = _scheduler_warnings(lambda: GMSScheduler.from_config({"num_train_timesteps": 1000, "foo": 1}))
    assert any("ignores these settings of the source config: foo=1" in m for _, m in messages)
    for vt in ("learned", "learned_range"):
        with pytest.raises(ValueError, match=f"variance_type='{vt}'"):
            GMSScheduler.from_config({"_class_name": "DDPMScheduler", "variance_type": vt}, solver="gms")
    with pytest.raises(ValueError, match="unknown solver 'bogus'"):
        _scheduler_warnings(lambda: GMSScheduler.from_config({"_class_name": "DDPMScheduler",
                                                              "variance_type": "learned"}, solver="bogus"))


def test_from_config_thresholding_warning_names_the_data_range_used():
    """The thresholding warning says which data_range the steps clamp to instead (the default (-1, 1))."""
    from gms_kernels import GMSScheduler

    cfg = {"_class_name": "DDPMScheduler", "thresholding": True, "sample_max_value": 1.5}
    _, messages = _scheduler_warnings(lambda: GMSScheduler.from_config(cfg))
    assert any(cat is UserWarning and "clamp to data_range=(-1.0, 1.0) instead" in m for cat, m in messages)


def test_scheduler_add_noise_takes_one_timestep_for_the_whole_batch():
    """add_noise with one timestep for a batch of 3 uses it for every sample: sqrt(abar_t) x0 + sqrt(1 - abar_t) eps
    with abar from the linear betas (recomputed here); a timestep per sample works too."""
    from gms_kernels import GMSScheduler

    s = GMSScheduler(solver="ddpm")
    x0, eps, _ = _inputs(18, shape=(3, 1, 2, 2))
    got = s.add_noise(x0, eps, 10)
    torch.testing.assert_close(got, math.sqrt(_abar(10)) * x0 + math.sqrt(1 - _abar(10)) * eps, rtol=0, atol=1e-12)
    per = s.add_noise(x0, eps, torch.tensor([10, 500, 999]))
    for i, t in enumerate((10, 500, 999)):
        torch.testing.assert_close(per[i], math.sqrt(_abar(t)) * x0[i] + math.sqrt(1 - _abar(t)) * eps[i],
                                   rtol=0, atol=1e-12)


def test_from_config_variance_type_warning_hints_only_known_types():
    """The dropped variance_type is reported with DDPM's matching solver when there is one ("fixed_large" is
    solver='ddpm-large'), and without a hint otherwise."""
    from gms_kernels import GMSScheduler

    _, messages = _scheduler_warnings(lambda: GMSScheduler.from_config(
        {"_class_name": "DDPMScheduler", "variance_type": "fixed_large"}, solver="ddpm"))
    assert any("DDPM's 'fixed_large' is solver='ddpm-large'" in m for _, m in messages)
    _, messages = _scheduler_warnings(lambda: GMSScheduler.from_config(
        {"_class_name": "DDPMScheduler", "variance_type": "learned_range"}, solver="ddpm"))
    text = " ".join(m for _, m in messages)
    assert "variance_type='learned_range' (the solver sets the variance, here solver='ddpm')" in text
    assert "is solver=" not in text


def test_steps_offset_may_not_move_the_first_timestep_to_T():
    """With "leading" spacing, steps_offset shifts every timestep; a first timestep of exactly T is refused
    (T = 10, N = 10: 9 + 1 = 10), one of T - 1 is accepted (N = 5: 8 + 1 = 9)."""
    from gms_kernels import GMSScheduler

    s = GMSScheduler(num_train_timesteps=10, timestep_spacing="leading", steps_offset=1)
    with pytest.raises(ValueError, match=r"moves the first timestep to 10 >= T = 10"):
        s.set_timesteps(10)
    s.set_timesteps(5)
    assert s.timesteps.tolist() == [9, 7, 5, 3, 1]


def test_scheduler_steps_a_float64_sample_in_float64():
    """GMSScheduler.step on a float64 sample hands it to the step in float64 (not rounded to float32 first): with
    the float64 torch backend, DDIM (eta 0) from 999 to 899 equals a_s x0 + sigma_s eps~ with
    x0 = clamp((x_t - sigma_t e1) / a_t), eps~ = (x_t - a_t x0) / sigma_t, to 1e-12. (The default C++ backend
    computes DDIM in float32, so it agrees only to ~1e-7.)"""
    from gms_kernels import GMSScheduler

    s = GMSScheduler(solver="ddim", backend="torch")
    s.set_timesteps(10)
    x, e1, _ = _inputs(19)
    t, u = 999, 899
    a_t, a_s = math.sqrt(_abar(t)), math.sqrt(_abar(u))
    sig_t, sig_s = math.sqrt(1 - _abar(t)), math.sqrt(1 - _abar(u))
    x0 = ((x - sig_t * e1) / a_t).clamp(-1, 1)
    ref = a_s * x0 + sig_s * (x - a_t * x0) / sig_t
    out = s.step(e1, s.timesteps[0], x)
    assert out.prev_sample.dtype == torch.float64
    torch.testing.assert_close(out.prev_sample, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.pred_original_sample, x0, rtol=0, atol=1e-12)


def test_scheduler_defaults_to_gms_for_the_learned_variance_check_and_flags_custom_timesteps():
    """A learned-variance config converted with no solver named is refused for the default solver 'gms'; the
    custom_timesteps flag says whether the last set_timesteps call took an explicit list; a model output with too
    few heads names the scheduler's solver."""
    from gms_kernels import GMSScheduler

    with pytest.raises(ValueError, match="variance_type='learned'.*solver='gms'"):
        GMSScheduler.from_config({"_class_name": "DDPMScheduler", "variance_type": "learned"})
    s = GMSScheduler()
    s.set_timesteps(timesteps=[900, 500, 100])
    assert s.custom_timesteps is True
    s.set_timesteps(10)
    assert s.custom_timesteps is False
    with pytest.raises(ValueError, match=r"^solver 'gms' needs 3 head\(s\)"):
        s.step(torch.zeros(2, 2, 2, 2), s.timesteps[0], torch.zeros(2, 1, 2, 2), generator=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_scheduler_add_noise_works_in_float32_for_float32_and_float16_samples(dtype):
    """add_noise on a float32 or float16 sample computes in float32 (fp16 upcast, not fp16 arithmetic; not float64,
    which would double the memory and run at a fraction of the speed on most GPUs): a_t and sigma_t are rounded to
    float32 once, so the result equals a32 x + s32 eps in float32 arithmetic bit for bit, then rounded to the
    sample's dtype; float64 noise is rounded to float32 too. Integral float timesteps index like integers."""
    from gms_kernels import GMSScheduler

    s = GMSScheduler(solver="ddpm")
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(3, 2, 8, 8, generator=g).to(dtype)
    eps = torch.randn(3, 2, 8, 8, generator=g, dtype=torch.float64)
    ts = [10, 500, 999]
    abar = s.schedule.alphas_cumprod[ts].reshape(-1, 1, 1, 1)
    a32, s32 = abar.sqrt().float(), (1.0 - abar).sqrt().float()
    expected = (a32 * x0.float() + s32 * eps.float()).to(dtype)
    for timesteps in (torch.tensor(ts), torch.tensor([10.0, 500.0, 999.0]), ts):
        got = s.add_noise(x0, eps, timesteps)
        assert got.dtype == dtype
        assert torch.equal(got, expected)
    # float64 arithmetic (for a float32 sample) and float16 arithmetic (for a float16 one) give other bits
    if dtype == torch.float32:
        other = (abar.sqrt() * x0.double() + (1.0 - abar).sqrt() * eps).to(dtype)
    else:
        other = a32.half() * x0 + s32.half() * eps.half()
    assert not torch.equal(other, expected)


def test_scheduler_add_noise_keeps_the_samples_device():
    """add_noise moves a_t, sigma_t and the noise to the sample's device (the meta device here, so that a CPU run
    can tell it from the CPU the schedule lives on; mixing the two raises)."""
    from gms_kernels import GMSScheduler

    s = GMSScheduler(solver="ddpm")
    x0 = torch.zeros(2, 1, 2, 2, device="meta")
    for noise in (torch.zeros(2, 1, 2, 2, device="meta"), torch.zeros(2, 1, 2, 2)):
        out = s.add_noise(x0, noise, torch.tensor([10, 20]))
        assert out.device.type == "meta" and out.dtype == torch.float32 and out.shape == x0.shape


def test_from_config_translation_names_the_source_and_keeps_its_own_configs():
    """from_config names the foreign class in its warnings, joins several dropped settings with "; ", lists the
    thresholding settings it drops (every key after "thresholding") and the data_range the caller passes; a config
    whose _class_name is GMSScheduler is not translated (no warning, even with a key GMSScheduler does not take)."""
    from gms_kernels import GMSScheduler

    _, messages = _scheduler_warnings(lambda: GMSScheduler.from_config(
        {"_class_name": "DDPMScheduler", "foo": 1, "bar": 2}))
    assert any("ignores these settings of DDPMScheduler: foo=1; bar=2" in m for _, m in messages)
    cfg = {"_class_name": "DDIMScheduler", "thresholding": True, "dynamic_thresholding_ratio": 0.9,
           "sample_max_value": 1.5}
    _, messages = _scheduler_warnings(lambda: GMSScheduler.from_config(cfg, data_range=(0.0, 1.0)))
    assert any("DDIMScheduler sets thresholding=True (dynamic_thresholding_ratio=0.9, sample_max_value=1.5)" in m
               and "clamp to data_range=(0.0, 1.0) instead" in m for _, m in messages)
    own = dict(GMSScheduler(solver="ddpm").config, _class_name="GMSScheduler")  # as save_config writes it
    s, messages = _scheduler_warnings(lambda: GMSScheduler.from_config(dict(own, clip_sample=True,
                                                                            clip_sample_range=3.0, foo=1)))
    assert messages == [] and s._data_range == (-1.0, 1.0)


def test_from_config_clip_sample_range_alone_clips_and_a_named_solver_in_the_config_counts():
    """A foreign config with clip_sample_range but no clip_sample clips (diffusers' clip_sample defaults to True);
    a learned-variance config that already names solver='ddpm' (a single-head solver) is accepted."""
    from gms_kernels import GMSScheduler

    s, _ = _scheduler_warnings(lambda: GMSScheduler.from_config({"_class_name": "DDPMScheduler",
                                                                 "clip_sample_range": 2.0}))
    assert s._data_range == (-2.0, 2.0)
    s, _ = _scheduler_warnings(lambda: GMSScheduler.from_config({"_class_name": "DDPMScheduler", "solver": "ddpm",
                                                                 "variance_type": "learned_range"}))
    assert s.config.solver == "ddpm"


def test_scheduler_step_refuses_a_timestep_tensor_that_is_not_one_element_of_its_timesteps():
    """A view of scheduler.timesteps is located by its memory only when it is one element of the same dtype: a
    two-element slice is refused as more than one timestep, and a float64 reinterpretation of an element is read
    by value (and refused), while the element itself and a plain integer work."""
    from gms_kernels import GMSScheduler

    s = GMSScheduler(solver="ddim")
    s.set_timesteps(4)
    x, e1 = torch.zeros(2, 1, 2, 2), torch.zeros(2, 1, 2, 2)
    with pytest.raises(ValueError, match="takes one timestep for the whole batch"):
        s.step(e1, s.timesteps[0:2], x)
    with pytest.raises(ValueError, match="is not one of scheduler.timesteps"):
        s.step(e1, s.timesteps.view(torch.float64)[1], x)
    assert s._index(s.timesteps[1]) == 1 and s._index(int(s.timesteps[2])) == 2


def test_scheduler_finds_an_element_of_its_timesteps_without_reading_its_value():
    """Every element of scheduler.timesteps is located from its memory, not by reading its value (which on a GPU
    waits for the device's queue): with the timesteps on the meta device, whose values cannot be read at all,
    previous_timestep still answers for each element, the first and the last included."""
    from gms_kernels import GMSScheduler

    s = GMSScheduler(solver="ddim")
    s.set_timesteps(4, device="meta")
    ts = [999, 749, 499, 249]
    assert s.timesteps.device.type == "meta"
    assert [s.previous_timestep(s.timesteps[i]) for i in range(4)] == ts[1:] + [gk.DATA]


def test_scheduler_explicit_timesteps_flatten_and_count():
    """set_timesteps(timesteps=...) takes a tensor of any shape (flattened, e.g. [[900, 500, 100]]) and sets
    num_inference_steps to the number of entries."""
    from gms_kernels import GMSScheduler

    s = GMSScheduler(solver="ddim")
    s.set_timesteps(timesteps=torch.tensor([[900, 500, 100]]))
    assert s.timesteps.tolist() == [900, 500, 100] and s.num_inference_steps == 3 and len(s.timesteps) == 3


def test_scheduler_step_uses_its_data_range_its_generators_seeds_and_the_samples_dtype():
    """GMSScheduler.step clamps with its own data_range (here (0, 1), as gk.step with that range, not gk.step's
    default (-1, 1)); a list of torch.Generators becomes one 62-bit seed per generator (the draw of
    gk.random.draw_seed), so it equals the step with those int seeds; a float64 model output is cast to the float32
    sample's dtype before the step (the float64 torch step then gives the same bits as with the float32 output)."""
    from gms_kernels import GMSScheduler

    x, e1, _ = _inputs(23, shape=(2, 1, 4, 4))
    x, e1 = x.float(), e1.float()
    s = GMSScheduler(solver="ddpm", data_range=(0.0, 1.0), backend="torch")
    s.set_timesteps(10)
    t0 = int(s.timesteps[0])
    got = s.step(e1, s.timesteps[0], x, generator=7).prev_sample
    want = gk.step(x, e1, t0, int(s.timesteps[1]), s.schedule, "ddpm", 7, data_range=(0.0, 1.0), backend="torch")
    assert torch.equal(got, want)
    assert not torch.equal(got, gk.step(x, e1, t0, int(s.timesteps[1]), s.schedule, "ddpm", 7, backend="torch"))
    seeds = [int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(i), dtype=torch.int64))
             for i in (1, 2)]
    by_generators = s.step(e1, s.timesteps[0], x, generator=[torch.Generator().manual_seed(i) for i in (1, 2)])
    assert torch.equal(by_generators.prev_sample, s.step(e1, s.timesteps[0], x, generator=seeds).prev_sample)
    s = GMSScheduler(solver="ddim", backend="torch", data_range=None)
    s.set_timesteps(10)
    g = torch.Generator().manual_seed(24)
    x, e64 = torch.randn(4, 1, 16, 16, generator=g), torch.randn(4, 1, 16, 16, generator=g, dtype=torch.float64)
    out64 = s.step(e64, s.timesteps[0], x).prev_sample
    assert torch.equal(out64, s.step(e64.float(), s.timesteps[0], x).prev_sample)
    # (the float64 output itself would give other bits: the cast is what makes them equal)
    t1 = int(s.timesteps[1])
    assert not torch.equal(gk.step(x, e64, t0, t1, s.schedule, "ddim", backend="torch", data_range=None),
                           gk.step(x, e64.float(), t0, t1, s.schedule, "ddim", backend="torch", data_range=None))


def test_scheduler_triton_branch_defers_the_flag_read_to_the_next_step(monkeypatch):
    """The scheduler's Triton branch, run on the CPU with resolve_backend answering "triton" and the step done by
    the torch backend (which records the flag it is handed): every step but the last to the data hands an int32
    zero flag to the kernel and keeps it pending; the next step reads it before it runs its own (a set flag raises,
    naming the timestep of the step that set it); the last step gets no flag. A model output with too few heads
    is refused there naming the solver."""
    from gms_kernels import GMSScheduler
    from gms_kernels.integrations import scheduler as sched_module

    handed = []
    real_step = sched_module.gk_step

    def torch_step(*args, nonfinite_flag=None, **kwargs):
        handed.append(nonfinite_flag)
        return real_step(*args, **dict(kwargs, backend="torch"))

    monkeypatch.setattr(sched_module, "resolve_backend", lambda *args, **kwargs: "triton")
    monkeypatch.setattr(sched_module, "gk_step", torch_step)
    s = GMSScheduler(solver="ddim")
    s.set_timesteps(3)
    x, e1 = torch.zeros(2, 1, 2, 2), torch.zeros(2, 1, 2, 2)
    s.step(e1, s.timesteps[0], x)
    flag = handed[0]
    assert flag.dtype == torch.int32 and flag.shape == (1,) and int(flag) == 0 and s._pending.flag is flag
    flag.fill_(1)  # as if the kernel had met a NaN at t = 999
    with pytest.raises(ValueError, match="^x_t or the model output at timestep 999 has non-finite values"):
        s.step(e1, s.timesteps[1], x)
    assert len(handed) == 1 and s._pending is None  # refused before its own step
    s.step(e1, s.timesteps[1], x)
    s.step(e1, s.timesteps[2], x)  # to the data
    assert torch.is_tensor(handed[1]) and handed[2] is None and s._pending is None
    s = GMSScheduler(solver="gms")
    s.set_timesteps(3)
    with pytest.raises(ValueError, match=r"^solver 'gms' needs 3 head\(s\)"):
        s.step(torch.zeros(2, 2, 2, 2), s.timesteps[0], x)
    assert len(handed) == 3


def test_scheduler_steps_a_half_precision_sample_in_float32():
    """A float16 sample is stepped in float32 and rounded back: the result equals the float32 step rounded to
    float16 (C++ and torch backends), for a float16 model output and for a float32 one (which is not rounded to
    float16 on the way in)."""
    from gms_kernels import GMSScheduler

    x, e1, _ = _inputs(29, shape=(2, 3, 4, 4))
    x16 = x.half()
    out32 = torch.cat([e1, e1 * e1 + 0.1, e1 * 0.3], 1).float()
    for backend in ("cpp", "torch"):
        s = GMSScheduler(solver="gms", backend=backend)
        s.set_timesteps(10)
        for out in (out32.half(), out32):
            got = s.step(out, s.timesteps[2], x16, generator=3)
            want = s.step(out.float(), s.timesteps[2], x16.float(), generator=3)
            assert got.prev_sample.dtype == torch.float16
            assert torch.equal(got.prev_sample, want.prev_sample.half())
            assert torch.equal(got.pred_original_sample, want.pred_original_sample.half())
        # (rounding the float32 output to float16 first gives other bits)
        rounded = s.step(out32.half().float(), s.timesteps[2], x16.float(), generator=3)
        assert not torch.equal(rounded.pred_original_sample.half(), want.pred_original_sample.half())


def test_make_betas_linear_uses_both_ends_and_takes_one_timestep():
    """make_betas' linear schedule runs from beta_start to the given beta_end (not the default 0.02); T = 1 is a
    valid length (one beta, beta_start), T = 0 is refused."""
    from gms_kernels.core.schedule import make_betas

    betas = make_betas(10, 1e-4, 0.05, "linear")
    torch.testing.assert_close(betas, torch.linspace(1e-4, 0.05, 10, dtype=torch.float64), rtol=0, atol=1e-15)
    assert make_betas(1, 1e-4, 0.05, "linear").tolist() == [1e-4]
    with pytest.raises(ValueError, match="num_train_timesteps must be >= 1, got 0"):
        make_betas(0, 1e-4, 0.05, "linear")


def test_steps_offset_applies_to_leading_spacing_only():
    """steps_offset shifts diffusers' "leading" timesteps only; "trailing" and "even" ignore it."""
    from gms_kernels import GMSScheduler

    for spacing in ("trailing", "even"):
        with_offset = GMSScheduler(timestep_spacing=spacing, steps_offset=1)
        without = GMSScheduler(timestep_spacing=spacing)
        with_offset.set_timesteps(4)
        without.set_timesteps(4)
        assert with_offset.timesteps.tolist() == without.timesteps.tolist()


def test_make_betas_scaled_linear_and_sigmoid_are_float64():
    """The scaled_linear (linear in sqrt(beta)) and sigmoid schedules are computed in float64 end to end (diffusers
    computes them in float32): equal to the float64 formulas to 1e-18, which float32 arithmetic misses."""
    from gms_kernels.core.schedule import make_betas

    T, b0, b1 = 50, 0.00085, 0.012
    root = torch.tensor([math.sqrt(b0) + (math.sqrt(b1) - math.sqrt(b0)) * i / (T - 1) for i in range(T)],
                        dtype=torch.float64)
    sig = torch.tensor([1 / (1 + math.exp(6.0 - 12.0 * i / (T - 1))) for i in range(T)], dtype=torch.float64)
    for kind, expected in (("scaled_linear", root**2), ("sigmoid", sig * (b1 - b0) + b0)):
        betas = make_betas(T, b0, b1, kind)
        assert betas.dtype == torch.float64
        torch.testing.assert_close(betas, expected, rtol=1e-13, atol=1e-18)


def test_scheduler_refuses_eta_in_solver_options_and_names_the_unstorable_setting():
    """eta is a GMSScheduler argument: inside solver_options it is refused (it would override the argument); a
    setting the JSON config cannot hold is refused naming it (trained_betas as a set)."""
    from gms_kernels import GMSScheduler

    with pytest.raises(ValueError, match="pass 'eta' as a GMSScheduler argument, not in solver_options"):
        GMSScheduler(solver="ddim", solver_options={"eta": 0.5})
    with pytest.raises(TypeError, match="^trained_betas is a set, which JSON cannot hold"):
        GMSScheduler(solver="ddpm", num_train_timesteps=2, trained_betas={0.1, 0.2})


def test_a_new_scheduler_exposes_float32_schedule_views_and_no_inference_steps_yet():
    """A new GMSScheduler has diffusers' float32 views betas, alphas = 1 - betas and alphas_cumprod (read by
    img2img-style pipelines), init_noise_sigma 1, no num_inference_steps and custom_timesteps False, and all T
    timesteps; a data_range or solver_options the JSON config cannot hold is refused naming it."""
    from gms_kernels import GMSScheduler

    s = GMSScheduler(solver="ddpm", num_train_timesteps=20, beta_end=0.2)
    betas = torch.linspace(1e-4, 0.2, 20, dtype=torch.float64)
    assert s.betas.dtype == s.alphas.dtype == s.alphas_cumprod.dtype == torch.float32
    assert torch.equal(s.betas, betas.float()) and torch.equal(s.alphas, 1.0 - betas.float())
    torch.testing.assert_close(s.alphas_cumprod, torch.cumprod(1.0 - betas, 0).float(), rtol=1e-6, atol=0)
    assert s.init_noise_sigma == 1.0 and s.num_inference_steps is None and s.custom_timesteps is False
    assert s.timesteps.tolist() == list(range(19, -1, -1))
    with pytest.raises(TypeError, match="^data_range is a object, which JSON cannot hold"):
        GMSScheduler(solver="ddpm", data_range=object())
    with pytest.raises(TypeError, match=r"^solver_options\['gamma'\] is a object, which JSON cannot hold"):
        GMSScheduler(solver="ddpm", solver_options={"gamma": object()})
