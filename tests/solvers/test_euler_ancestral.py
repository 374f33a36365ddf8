"""``euler-ancestral``: the Euler ancestral sampler in the sigma form of Karras et al. 2022
(https://arxiv.org/abs/2206.00364; k-diffusion's ``sample_euler_ancestral``), on the discrete VP schedule.

The reference below is written from that form, not from the library. In the variance-exploding view of a VP
state, x~ = x / a_t at the noise level sigma_t~ = sigma_t / a_t, with the denoised estimate D = E[x0 | x_t], a
step t -> s of noise scale eta splits the level sigma_s~ into a deterministic part and fresh noise:

    sigma_up   = min(sigma_s~, eta sqrt(sigma_s~^2 (sigma_t~^2 - sigma_s~^2) / sigma_t~^2)),
    sigma_down = sqrt(sigma_s~^2 - sigma_up^2),
    x~_s       = x~_t + (sigma_down - sigma_t~) (x~_t - D) / sigma_t~ + sigma_up z,

and x_s = a_s x~_s. The step into the data (sigma_s~ = 0) lands on D. With eta = 1 the step is the DDPM
posterior step (its mean a_s (sigma_s~^2 / sigma_t~^2) x~_t + a_s (1 - sigma_s~^2 / sigma_t~^2) D, its variance
a_s^2 sigma_up^2 = beta~); with eta = 0 it is DDIM's deterministic step.

The denoiser, the schedule and the W1 distance to the data come from the DPM-Solver++(2M) SDE tests beside this
file (closed forms written there, independent of the library).
"""
from __future__ import annotations

import math

import pytest
import torch

import gms_kernels as gk
from test_dpmpp_2m_sde import (F64, MEANS, SCHED, STDS, TRAJECTORY, WEIGHTS, alpha_sigma, mixture_denoiser, oracle,
                               step_noises, w1_by_steps)

SOLVER = "euler-ancestral"


def reference_step(x: torch.Tensor, t: int, s: int | None, denoised: torch.Tensor, z: torch.Tensor | None,
                   eta: float = 1.0) -> torch.Tensor:
    """One Euler ancestral step t -> s (s None: into the data) of the module's equations, in float64."""
    a_t, sig_t = alpha_sigma(t)
    a_s, sig_s = (1.0, 0.0) if s is None else alpha_sigma(s)
    level_t, level_s = sig_t / a_t, sig_s / a_s
    up = min(level_s, eta * math.sqrt(level_s**2 * (level_t**2 - level_s**2) / level_t**2))
    down = math.sqrt(level_s**2 - up**2)
    x_ve = x.to(F64) / a_t
    x_ve = x_ve + (down - level_t) * (x_ve - denoised) / level_t
    if up > 0:
        x_ve = x_ve + up * z.to(F64)
    return a_s * x_ve


def reference(x_T, ts, noises, denoise, eta=1.0, clamp=None) -> list[torch.Tensor]:
    """The state after every step of a run over ts, the last one the data."""
    x, states = x_T.to(F64), []
    for i, t in enumerate(ts):
        a_t, sig_t = alpha_sigma(t)
        d = denoise(x, a_t, sig_t)
        if clamp is not None:
            d = d.clamp(*clamp)
        last = i + 1 == len(ts)
        x = reference_step(x, t, None if last else ts[i + 1], d, None if last else noises[i], eta)
        states.append(x)
    return states


def run(model, x_T, ts, seed, **options):
    seen = []
    out = gk.sample(model, x_T=x_T, trajectory=ts, solver=SOLVER, generator=seed, progress=False, schedule=SCHED,
                    dtype=F64, callback=seen.append, **options)
    return out, [c["x"] for c in seen]


@pytest.mark.parametrize("data_range", [None, (-1.0, 1.0)])
def test_every_step_matches_the_reference(data_range):
    n = 16
    x_T = torch.randn(n, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    out, states = run(oracle(), x_T, TRAJECTORY, seed=5, data_range=data_range)
    ref = reference(x_T, TRAJECTORY, step_noises(5, n, TRAJECTORY, (2,)), mixture_denoiser(WEIGHTS, MEANS, STDS),
                    clamp=data_range)
    assert len(states) == len(ref) == len(TRAJECTORY)
    for i, (got, want) in enumerate(zip(states, ref)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=lambda m: f"step {i}: {m}")
    torch.testing.assert_close(out, ref[-1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("eta", [1.0, 0.3])
@pytest.mark.parametrize("t, s", [(999, 850), (640, 410), (120, 3), (5, gk.DATA)])
def test_one_step_through_gk_step_matches_the_reference(t, s, eta):
    """gk.step with explicit noise, from the heads of the exact denoiser (e1 = (x_t - a_t D) / sigma_t)."""
    g = torch.Generator().manual_seed(t)
    x = torch.randn(6, 2, generator=g, dtype=F64) * 0.8
    z = torch.randn(6, 2, generator=g, dtype=F64)
    a_t, sig_t = alpha_sigma(t)
    d = mixture_denoiser(WEIGHTS, MEANS, STDS)(x, a_t, sig_t)
    e1 = (x - a_t * d) / sig_t
    got = gk.step(x, e1, t, s, SCHED, SOLVER, noise=z, data_range=None, eta=eta)
    want = reference_step(x, t, None if s == gk.DATA else s, d, z, eta)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    if s == gk.DATA:
        torch.testing.assert_close(got, d, rtol=1e-10, atol=1e-10)


def test_eta_one_is_the_ddpm_step_and_eta_zero_the_ddim_step():
    g = torch.Generator().manual_seed(3)
    x, z = torch.randn(8, 2, generator=g, dtype=F64), torch.randn(8, 2, generator=g, dtype=F64)
    t, s = 640, 410
    heads = oracle()(x, t)
    for eta, other, options in [(1.0, "ddpm", {}), (0.0, "ddim", {"eta": 0.0})]:
        torch.testing.assert_close(gk.step(x, heads, t, s, SCHED, SOLVER, noise=z, data_range=None, eta=eta),
                                   gk.step(x, heads, t, s, SCHED, other, noise=z, data_range=None, **options),
                                   rtol=1e-10, atol=1e-10)
    # eta = 0 draws nothing: no noise and no generator is enough
    gk.step(x, heads, t, s, SCHED, SOLVER, data_range=None, eta=0.0)


def test_converges_to_the_data_with_exact_heads():
    """With exact heads the W1 distance to the data falls as the step count grows (from about 0.04 at 10 steps:
    a first-order solver, so more slowly than DPM-Solver++(2M) SDE) and at 100 steps lies within twice the
    sampling floor (about 0.006 against 0.005)."""
    w1, floor = w1_by_steps(SOLVER)
    assert w1[10] > w1[20] > w1[50], w1
    assert w1[100] < w1[10] / 4, w1
    assert w1[100] < 2.0 * floor, (w1, floor)


def test_a_sample_does_not_depend_on_its_batch():
    model = oracle()
    kw = dict(steps=6, solver=SOLVER, generator=9, progress=False, schedule=SCHED)
    full = gk.sample(model, shape=(6, 2), **kw)
    parts = torch.cat([gk.sample(model, shape=(2, 2), first_index=0, **kw),
                       gk.sample(model, shape=(4, 2), first_index=2, **kw)])
    torch.testing.assert_close(parts, full, rtol=0, atol=0)
    torch.testing.assert_close(gk.sample(model, shape=(6, 2), **kw), full, rtol=0, atol=0)
    assert not torch.equal(gk.sample(model, shape=(6, 2), **dict(kw, generator=10)), full)


def test_one_network_call_per_point_visited():
    """Equal network calls: one per time index visited (the step into data included), as its registry entry says."""
    model, calls = oracle(), []

    def counted(x, t):
        calls.append(t)
        return model(x, t)

    gk.sample(counted, shape=(3, 2), trajectory=TRAJECTORY, solver=SOLVER, generator=0, progress=False,
              schedule=SCHED)
    assert len(calls) == len(TRAJECTORY) == gk.SOLVERS[SOLVER].network_calls(len(TRAJECTORY))


def test_unknown_options_are_refused_before_sampling():
    calls = []

    def model(x, t):
        calls.append(t)
        return x

    for bad, message in [({"s_churn": 1.0}, "unknown option"), ({"fit": "closed"}, "unknown option"),
                         ({"variance_scale": 2.0}, "unknown option"),
                         ({"eta": 1.5}, r"eta must be a number in \[0, 1\]"), ({"eta": -0.1}, "eta must be a number"),
                         ({"eta": "1"}, "eta must be a number"), ({"eta": float("nan")}, "eta must be a number")]:
        with pytest.raises(ValueError, match=message):
            gk.sample(model, shape=(2, 1), steps=3, solver=SOLVER, generator=0, progress=False, **bad)
        with pytest.raises(ValueError, match=message):
            gk.step(torch.zeros(2, 1), torch.zeros(2, 1), 10, 5, SCHED, SOLVER, generator=0, **bad)
    assert not calls
