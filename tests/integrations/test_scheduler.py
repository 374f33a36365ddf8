"""GMSScheduler: a diffusers scheduler around gk.step (issue 4 part 5)."""
import collections
import json
import warnings

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
    """Issue 24.1: clip_sample / clip_sample_range of a DDPM or DDIM config set data_range, without a
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
    """Issue 24.1: thresholding=True has no equivalent (one clear warning); variance_type and any other
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
    # issue 22: with sn-ddpm or gms the learned variance channels would be read as E[eps^2]: refused
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
    """Issue 24.3: tensors, numpy arrays and tuples in solver_options (an Analytic-DPM gamma table with
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
    """Issue 24.2: set_timesteps(N) means N network calls, as in diffusers, for every spacing: counted
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
    """Issue 24.6 (documented in GMSScheduler's docstring): DDIMPipeline converts any scheduler to a
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
