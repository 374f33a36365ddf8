"""gms_kernels.integrations.k_diffusion: the denoiser wrapper and the sample_* entry points in k-diffusion's conventions.

k-diffusion itself pulls in a large dependency set and is not needed: its conventions are written out below
in float64 (Karras sigmas, DiscreteEpsDDPMDenoiser's sigma <-> t and denoising), and checked against the
real package only where it is installed.
"""
import math
import re

import pytest
import torch

import gms_kernels as gk
from readme_examples import example_file, readme_example
from gms_kernels.integrations.k_diffusion import (GMSDenoiser, check_sigmas, get_sigmas_karras, sample_analytic_dpm, sample_ddim,
                                     sample_ddpm, sample_ddpm_large, sample_gms, sample_seeds_1, sample_sn_ddpm)

SAMPLERS = {"gms": sample_gms, "sn-ddpm": sample_sn_ddpm, "ddpm": sample_ddpm, "ddpm-large": sample_ddpm_large,
            "ddim": sample_ddim, "analytic-dpm": sample_analytic_dpm, "seeds-1": sample_seeds_1}
GAMMA = torch.linspace(0.3, 0.9, 100, dtype=torch.float64)  # (analytic-dpm's table on the 100-step schedule)


# -- k-diffusion's conventions, written out in float64 ----------------------------------------------------
def reference_karras(n, sigma_min, sigma_max, rho=7.0):
    """EDM Eq. 5: n levels evenly spaced in sigma^(1/rho) from sigma_max down to sigma_min, then a 0."""
    u = torch.linspace(0, 1, n, dtype=torch.float64)
    first, last = sigma_max ** (1 / rho), sigma_min ** (1 / rho)
    return torch.cat([(first + u * (last - first)) ** rho, torch.zeros(1, dtype=torch.float64)])


class ReferenceEpsDenoiser:
    """What DiscreteEpsDDPMDenoiser does with an eps network: levels sqrt((1 - abar) / abar); sigma -> t by
    the nearest level in log-sigma (quantized) or by interpolating log-sigma between neighbours; the network
    sees x / sqrt(1 + sigma^2) and D = x - sigma eps."""

    def __init__(self, eps, alphas_cumprod):
        self.eps = eps
        self.levels = ((1 - alphas_cumprod) / alphas_cumprod).sqrt()
        self.log_levels = self.levels.log()

    def sigma_to_t(self, sigma, quantize=True):
        gaps = sigma.log()[None, :] - self.log_levels[:, None]  # [T, N]
        if quantize:
            return gaps.abs().argmin(dim=0)
        below = (gaps >= 0).sum(dim=0) - 1  # the highest level at or below sigma
        low = below.clamp(0, len(self.levels) - 2)
        a, b = self.log_levels[low], self.log_levels[low + 1]
        return low + ((sigma.log() - a) / (b - a)).clamp(0, 1)

    def t_to_sigma(self, t):
        low, high = t.floor().long(), t.ceil().long()
        w = t - low
        return ((1 - w) * self.log_levels[low] + w * self.log_levels[high]).exp()

    def __call__(self, x, sigma):
        scale = (1 / (sigma**2 + 1).sqrt()).reshape(-1, *([1] * (x.dim() - 1)))
        return x - sigma.reshape(scale.shape) * self.eps(x * scale, self.sigma_to_t(sigma))


# -- models ---------------------------------------------------------------------------------------------
def oracle(schedule=None, shape=(2, 3)):
    """Exact heads of a two-component Gaussian mixture on data of ``shape`` (no network error, cheap)."""
    means = torch.stack([torch.full(shape, -0.4), torch.linspace(-0.2, 0.5, math.prod(shape)).reshape(shape)])
    return gk.GaussianMixtureOracle([0.4, 0.6], means, [0.12, 0.05], schedule or gk.Schedule.linear())


@pytest.fixture(scope="module")
def small():
    """An oracle on a 100-step schedule, in float64 (k-diffusion's arithmetic, without its float32 rounding)."""
    return oracle(gk.Schedule.linear(100, 1e-3, 0.2))


def randn(n, shape=(2, 3), seed=0, dtype=torch.float64):
    return torch.randn(n, *shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def e1_only(model):
    return lambda x_t, t: model(x_t, t)[:, :x_t.shape[1]]


# -- the denoiser ---------------------------------------------------------------------------------------
def test_denoiser_has_the_levels_and_conversions_of_k_diffusions_discrete_schedule(small):
    den, ref = GMSDenoiser(small), ReferenceEpsDenoiser(None, small.schedule.alphas_cumprod)
    assert den.sigmas.dtype == torch.float64 and bool((den.sigmas[1:] > den.sigmas[:-1]).all())
    torch.testing.assert_close(den.sigmas, ref.levels, rtol=1e-15, atol=0)
    assert float(den.sigma_min) == small.schedule.ve_sigma(0) and float(den.sigma_max) == small.schedule.ve_sigma(99)
    # between levels, above the top, below the bottom, on a level
    probe = torch.cat([torch.logspace(-3, 3, 41, dtype=torch.float64), den.sigmas[[0, 7, 50, 99]]])
    assert den.sigma_to_t(probe).tolist() == ref.sigma_to_t(probe).tolist()
    just_past_half = den.t_to_sigma(torch.arange(99, dtype=torch.float64) + 0.501)  # (in sigma, nearer the lower)
    assert den.sigma_to_t(just_past_half).tolist() == list(range(1, 100)) == ref.sigma_to_t(just_past_half).tolist()
    assert den.sigma_to_t(den.sigmas).tolist() == list(range(100))
    assert den.sigma_to_t(den.sigmas.float()).tolist() == list(range(100))  # k-diffusion's float32 sigmas too
    assert den.sigmas.tolist() == [small.schedule.ve_sigma(t) for t in range(100)]  # the levels the steps use
    torch.testing.assert_close(den.sigma_to_t(probe, quantize=False), ref.sigma_to_t(probe, quantize=False).double())
    t = torch.tensor([0.0, 0.25, 7.5, 42.0, 98.9, 99.0], dtype=torch.float64)
    torch.testing.assert_close(den.t_to_sigma(t), ref.t_to_sigma(t))
    assert den.t_to_sigma(torch.arange(100, dtype=torch.float64)).tolist() == den.sigmas.tolist()  # exactly
    torch.testing.assert_close(den.sigma_to_t(den.t_to_sigma(t), quantize=False), t)


def test_denoiser_output_is_discrete_eps_ddpm_denoisers(small):
    den = GMSDenoiser(small)
    ref = ReferenceEpsDenoiser(e1_only(small), small.schedule.alphas_cumprod)
    sigma = torch.tensor([0.0, 0.03, 0.4, 2.5, 20.0, 300.0], dtype=torch.float64)  # levels and between them
    x = randn(6, seed=0) * (1 + sigma[:, None, None])
    torch.testing.assert_close(den(x, sigma), ref(x, sigma), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(den(x, 2.5), ref(x, torch.full((6,), 2.5, dtype=torch.float64)))  # one number
    torch.testing.assert_close(den(x, sigma)[0], x[0])  # sigma 0: x is the data


def test_denoiser_time_input_and_extra_args_reach_the_network():
    seen = {}

    def net(x_t, t, shift=0.0):
        seen["t"] = t
        return torch.cat([torch.full_like(x_t, shift)] * 3, dim=1)

    net.time_input = "scaled"
    den = GMSDenoiser(net, gk.Schedule.linear(10))
    x = torch.ones(2, 1, 2, 2, dtype=torch.float64)
    out = den(x, den.sigmas[[3, 9]], shift=0.5)
    assert seen["t"].tolist() == [300.0, 900.0]  # t * 1000 / T
    torch.testing.assert_close(out, x - 0.5 * den.sigmas[[3, 9]].reshape(2, 1, 1, 1))
    assert GMSDenoiser(net, gk.Schedule.linear(10), time_input="index+1").time_input == "index+1"


def test_get_sigmas_karras_is_edm_eq5_with_a_zero():
    got = get_sigmas_karras(12, 0.01, 157.4)
    torch.testing.assert_close(got, reference_karras(12, 0.01, 157.4), rtol=1e-14, atol=0)
    assert got.dtype == torch.float64 and got[-1] == 0 and len(got) == 13
    torch.testing.assert_close(got[0], torch.tensor(157.4, dtype=torch.float64))


# -- the samplers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("solver, options", [("gms", {}), ("gms", {"select": "pixel", "fit": "adan"}),
                                             ("sn-ddpm", {}), ("ddpm", {}), ("ddpm-large", {}), ("ddim", {"eta": 0.5}),
                                             ("analytic-dpm", {"gamma": GAMMA}), ("seeds-1", {"prediction": "data"})],
                         ids=lambda c: str(c))
def test_on_trained_levels_it_is_gk_sample_with_that_trajectory(small, solver, options):
    ts = [99, 70, 41, 20, 6, 2, 0]
    sigmas = torch.tensor([small.schedule.ve_sigma(t) for t in ts] + [0.0], dtype=torch.float64)
    z = randn(5, seed=1, dtype=torch.float32)
    x = (z.double() * sigmas[0]).float()  # k-diffusion's start noise
    got = SAMPLERS[solver](small, x, sigmas, generator=7, disable=True, **options)
    # the start conversion: x_T = x / sqrt(1 + sigma^2), the VP noise z sigma_t
    x_T = (x.double() / math.sqrt(1 + float(sigmas[0]) ** 2)).float()
    torch.testing.assert_close(x_T, z * small.schedule.sigma(99))
    want = gk.sample(small, x_T=x_T, trajectory=ts, solver=solver, generator=7, progress=False, **options)
    assert got.dtype == x.dtype and got.shape == x.shape
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_between_levels_each_sigma_rounds_to_the_nearest_level_in_log_sigma(small):
    """The rule pinned: every nonzero sigma rounds to its nearest trained level in log-sigma; the run then steps
    between those levels' exact sigmas, the start x rescaled to the first level's sigma, and a step whose two
    sigmas round to the same level skipped (no network call, no callback)."""
    lv = GMSDenoiser(small).sigmas

    def between(t, w):  # w of the way from level t to level t + 1 in log-sigma
        return float(lv[t] * (lv[t + 1] / lv[t]) ** w)

    sigmas = [400.0,                          # above the top level: 99
              between(60, 0.55),              # nearer 61
              between(30, 0.3), between(30, 0.1),  # both nearer 30: the second step is skipped
              between(0, 0.52),               # nearer 1 in log-sigma (in sigma itself, nearer 0)
              1e-4,                           # below the bottom level: 0
              0.0]
    rounded = [99, 61, 30, 1, 0]
    calls = []
    x = randn(4, seed=2) * sigmas[0]
    got = sample_gms(small, x, sigmas, generator=3, disable=True, callback=calls.append)
    x_T = x * (small.schedule.sigma(99) / sigmas[0])  # rescaled to level 99's sigma, then VP
    want = gk.sample(small, x_T=x_T, trajectory=rounded, generator=3, progress=False)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert [c["i"] for c in calls] == [0, 1, 3, 4, 5]  # i = 2 (30 -> 30) skipped
    assert [(c["t"], c["s"]) for c in calls] == [(99, 61), (61, 30), (30, 1), (1, 0), (0, -1)]
    assert [float(c["sigma"]) for c in calls] == [sigmas[i] for i in (0, 1, 3, 4, 5)]
    assert [float(c["sigma_hat"]) for c in calls] == [float(lv[t]) for t in (99, 61, 30, 1, 0)]
    # and the same run on the exact levels, with the start noise rescaled to sigma_hat
    exact = [float(lv[t]) for t in rounded] + [0.0]
    torch.testing.assert_close(sample_gms(small, x * exact[0] / sigmas[0], exact, generator=3, disable=True), got)


def test_callback_gets_k_diffusions_keys_before_each_step(small):
    sigmas = get_sigmas_karras(4, float(GMSDenoiser(small).sigma_min), 80.0)
    x = randn(3, seed=4) * sigmas[0]
    calls = []
    sample_gms(small, x, sigmas, generator=0, disable=True, callback=calls.append)
    assert [c["i"] for c in calls] == [0, 1, 2, 3]
    assert {"x", "i", "sigma", "sigma_hat", "denoised"} <= set(calls[0])
    den = GMSDenoiser(small)
    torch.testing.assert_close(calls[0]["x"], x * calls[0]["sigma_hat"] / sigmas[0])  # VE scale, at sigma_hat
    for c in calls:  # D(x, sigma_hat), clamped to the data range as the solver uses it
        torch.testing.assert_close(c["denoised"], den(c["x"], c["sigma_hat"]).clamp(-1, 1), rtol=1e-9, atol=1e-9)


def test_seeds_reproduce_and_do_not_depend_on_the_batch(small):
    sigmas = get_sigmas_karras(5, float(GMSDenoiser(small).sigma_min), 100.0)
    x = randn(6, seed=5, dtype=torch.float32) * sigmas[0].float()
    a = sample_gms(small, x, sigmas, generator=11, disable=True)
    torch.testing.assert_close(sample_gms(small, x, sigmas, generator=11, disable=True), a, rtol=0, atol=0)
    torch.testing.assert_close(sample_gms(small, x[2:4], sigmas, generator=11, first_index=2, disable=True), a[2:4],
                               rtol=1e-6, atol=1e-6)
    assert not torch.equal(sample_gms(small, x, sigmas, generator=12, disable=True), a)
    torch.manual_seed(0)  # no generator: one seed from torch's global RNG
    b = sample_gms(small, x, sigmas, disable=True)
    torch.manual_seed(0)
    torch.testing.assert_close(sample_gms(small, x, sigmas, disable=True), b, rtol=0, atol=0)
    c = sample_gms(small, x, sigmas, generator=torch.Generator().manual_seed(1), disable=True)
    again = sample_gms(small, x, sigmas, generator=torch.Generator().manual_seed(1), disable=True)
    torch.testing.assert_close(again, c, rtol=0, atol=0)


def test_a_bare_model_is_wrapped_and_extra_args_reach_it(small):
    seen = []

    def net(x_t, t, cond=None):
        seen.append(cond)
        return small(x_t, t)

    net.schedule = small.schedule
    sigmas = [float(small.schedule.ve_sigma(t)) for t in (99, 40, 0)] + [0.0]
    x = randn(2, seed=6) * sigmas[0]
    got = sample_ddpm(net, x, sigmas, extra_args={"cond": "c"}, generator=1, disable=True)
    assert seen == ["c"] * 3
    torch.testing.assert_close(got, sample_ddpm(GMSDenoiser(small), x, sigmas, generator=1, disable=True))


def test_karras_runs_converge_with_the_exact_heads():
    """With the exact heads the only error left is the discretisation's: it shrinks as steps are added."""
    model = oracle(gk.Schedule.linear(), shape=(1,))
    den = GMSDenoiser(model)
    x = randn(4000, shape=(1,), seed=8)
    data = model.sample_data(4000, torch.Generator().manual_seed(9)).flatten().sort().values

    def w1(steps):  # the 1-D Wasserstein distance to the data
        sigmas = get_sigmas_karras(steps, den.sigma_min, den.sigma_max)
        out = sample_gms(den, x * sigmas[0], sigmas, generator=0, disable=True)
        return float((out.flatten().sort().values - data).abs().mean())

    coarse, fine = w1(3), w1(40)
    assert fine < 0.1 * coarse and fine < 0.01, (coarse, fine)


def test_nothing_depends_on_torchs_default_device(small):
    """Every tensor the module makes is placed explicitly: under a meta default, a forgotten device would fail."""
    sigmas = get_sigmas_karras(4, 0.05, 50.0)
    x = randn(2, seed=7) * 50.0

    def run():
        den = GMSDenoiser(small)
        return torch.cat([sample_gms(den, x, get_sigmas_karras(4, 0.05, 50.0), generator=1, disable=True,
                                     callback=lambda info: None).flatten(),
                          den(x, sigmas[1]).flatten(), den.t_to_sigma(2.5).reshape(1), den.sigma_to_t(3.0).reshape(1)])

    expected = run()
    with torch.device("meta"):
        got = run()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# -- bad input ------------------------------------------------------------------------------------------
def test_bad_input_is_refused_with_the_argument_named(small):
    x, good = torch.zeros(2, 2, 3), [10.0, 1.0, 0.0]
    cases = [
        (ValueError, "descending", dict(sigmas=[1.0, 10.0, 0.0])),
        (ValueError, "descending", dict(sigmas=[10.0, 10.0, 0.0])),
        (ValueError, "end in 0", dict(sigmas=[10.0, 1.0])),
        (ValueError, "at least two", dict(sigmas=[0.0])),
        (ValueError, "finite", dict(sigmas=[float("nan"), 1.0, 0.0])),
        (ValueError, "descending", dict(sigmas=[1.0, -1.0, 0.0])),
        (TypeError, "sigmas", dict(sigmas="10 1 0")),
        (TypeError, "sigmas", dict(sigmas=3.0)),
        (TypeError, "sigmas", dict(sigmas=[10.0, None, 0.0])),
        (TypeError, "x must be a torch tensor", dict(x=[[0.0]])),
        (TypeError, "x must be a floating-point", dict(x=torch.zeros(2, 2, 3, dtype=torch.long))),
        (ValueError, "x ", dict(x=torch.full((2, 2, 3), float("nan")))),
        (TypeError, "extra_args", dict(extra_args=[1])),
        (TypeError, "callback", dict(callback=3)),
        (TypeError, "generator", dict(generator="seed")),
        (ValueError, "generators for a batch of 2", dict(generator=[1, 2, 3])),
        (ValueError, "first_index", dict(first_index=-1)),
        (ValueError, "unknown option", dict(fitt="closed")),
        (ValueError, "data_range", dict(data_range=(1, -1))),
        (ValueError, "backend", dict(backend="fast")),
        (TypeError, "model", dict(model=3)),
    ]
    for error, words, change in cases:
        args = dict(model=small, x=x, sigmas=good, disable=True, generator=0) | change
        with pytest.raises(error, match=re.escape(words)):
            sample_gms(**args)
    with pytest.raises(ValueError, match="needs 3 head"):
        sample_gms(GMSDenoiser(e1_only(small), small.schedule), x, good, disable=True)
    with pytest.raises(TypeError, match="already a GMSDenoiser"):
        GMSDenoiser(GMSDenoiser(small))
    with pytest.raises(TypeError, match="schedule"):
        GMSDenoiser(small, schedule="linear")
    with pytest.raises(ValueError, match="time_input"):
        GMSDenoiser(small, time_input="seconds")
    with pytest.raises(ValueError, match="one per sample"):
        GMSDenoiser(small)(x, torch.ones(3))
    with pytest.raises(ValueError, match="t must lie"):
        GMSDenoiser(small).t_to_sigma(100.0)
    for bad in [dict(n=0), dict(sigma_min=2.0), dict(sigma_min=0.0), dict(rho=-1.0)]:
        with pytest.raises(ValueError, match=next(iter(bad))):
            get_sigmas_karras(**(dict(n=5, sigma_min=0.1, sigma_max=1.0) | bad))
    assert check_sigmas(torch.tensor([3.0, 0.5, 0.0])) == [3.0, 0.5, 0.0]


# -- the documented example -----------------------------------------------------------------------------
def test_the_readme_example_runs():
    scope = {"model": oracle(shape=(1, 8, 8))}
    exec(compile(readme_example("k-diffusion"), example_file("k-diffusion"), "exec"), scope)
    assert scope["samples"].shape == (4, 1, 8, 8) and bool(torch.isfinite(scope["samples"]).all())
    assert scope["denoised"].shape == (4, 1, 8, 8)
