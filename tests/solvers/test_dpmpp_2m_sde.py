"""``dpmpp-2m-sde``: DPM-Solver++(2M) SDE (Lu et al. 2022, https://arxiv.org/abs/2211.01095), the multistep
second-order solver of the reverse SDE in the data prediction, midpoint type, as k-diffusion's
``sample_dpmpp_2m_sde`` runs it, here on the discrete VP schedule.

The reference below is written from the paper's data-prediction form, not from the library. With
a_t = sqrt(abar_t), sigma_t = sqrt(1 - abar_t), lambda_t = log(a_t / sigma_t), the denoised estimate
x0_t = E[x0 | x_t] and, for a step t -> s, h = lambda_s - lambda_t > 0:

    x_s = (sigma_s / sigma_t) e^{-eta h} x_t + a_s (1 - e^{-(1 + eta) h}) D + sigma_s sqrt(1 - e^{-2 eta h}) z,
    D   = x0_t + (x0_t - x0_prev) / (2 r),   r = h_prev / h,

where x0_prev and h_prev are the previous step's denoised estimate and step length (the first step has no
correction: D = x0_t), z ~ N(0, I), and the step into the data returns x0_t. With eta = 1 this is the paper's
SDE-DPM-Solver++(2M); its first step is then the DDPM posterior step.

The denoiser is the exact posterior mean of Gaussian-mixture data, written here in closed form (not through
gk.GaussianMixtureOracle, which the library samples); the schedule is recomputed from its betas.
"""
from __future__ import annotations

import math

import pytest
import torch

import gms_kernels as gk
from gms_kernels.core.random import STREAM_STEP_NOISE, SampleNoise

SOLVER = "dpmpp-2m-sde"
F64 = torch.float64
SCHED = gk.Schedule.linear(1000)
ABAR = torch.cumprod(1.0 - torch.linspace(1e-4, 0.02, 1000, dtype=F64), 0).tolist()

# a 2-D mixture with one component beyond [-1, 1], so that clamping the denoised estimate matters
WEIGHTS, MEANS, STDS = [0.3, 0.5, 0.2], [[-0.6, 0.4], [0.5, -0.2], [1.1, 0.9]], [0.15, 0.1, 0.3]
# uneven steps, so that r = h_prev / h is not 1
TRAJECTORY = [999, 700, 450, 300, 120, 40, 7, 0]


def alpha_sigma(t: int) -> tuple[float, float]:
    return math.sqrt(ABAR[t]), math.sqrt(1.0 - ABAR[t])


def mixture_denoiser(weights, means, stds):
    """E[x0 | x_t] for x0 ~ sum_k w_k N(m_k, s_k^2 I), x_t = a x0 + sigma eps: the component responsibilities
    r_k ~ w_k N(x_t; a m_k, (a^2 s_k^2 + sigma^2) I), times each component's posterior mean
    m_k + a s_k^2 (x_t - a m_k) / (a^2 s_k^2 + sigma^2)."""
    w, m = torch.tensor(weights, dtype=F64), torch.tensor(means, dtype=F64)
    v = torch.tensor(stds, dtype=F64) ** 2

    def denoise(x: torch.Tensor, a: float, sigma: float) -> torch.Tensor:
        total = a * a * v + sigma * sigma  # [K]
        diff = x[:, None, :] - a * m[None]  # [N, K, d]
        log_r = w.log() - 0.5 * (x.shape[1] * total.log() + (diff**2).sum(-1) / total)
        r = torch.softmax(log_r, dim=1)
        post = m[None] + (a * v / total)[None, :, None] * diff
        return (r[..., None] * post).sum(1)

    return denoise


def reference(x_T: torch.Tensor, ts: list[int], noises: list[torch.Tensor], denoise, eta: float = 1.0,
              clamp: tuple[float, float] | None = None) -> list[torch.Tensor]:
    """The state after every step of DPM-Solver++(2M) SDE (the module's equations), the last one the data."""
    x, states, previous = x_T.to(F64), [], None
    for i, t in enumerate(ts):
        a_t, sig_t = alpha_sigma(t)
        x0 = denoise(x, a_t, sig_t)
        if clamp is not None:
            x0 = x0.clamp(*clamp)
        if i + 1 == len(ts):
            states.append(x0)
            break
        a_s, sig_s = alpha_sigma(ts[i + 1])
        h = math.log(a_s / sig_s) - math.log(a_t / sig_t)
        d = x0 if previous is None else x0 + (x0 - previous[0]) * (h / (2.0 * previous[1]))
        x = sig_s / sig_t * math.exp(-eta * h) * x + a_s * (1.0 - math.exp(-(1.0 + eta) * h)) * d
        if eta > 0:
            x = x + sig_s * math.sqrt(1.0 - math.exp(-2.0 * eta * h)) * noises[i].to(F64)
        states.append(x)
        previous = (x0, h)
    return states


def oracle(weights=WEIGHTS, means=MEANS, stds=STDS) -> gk.GaussianMixtureOracle:
    return gk.GaussianMixtureOracle(weights, means, stds, SCHED)


def run(model, x_T, ts, seed, **options):
    """gk.sample from x_T over the explicit trajectory ts: (the samples, the state after every step)."""
    seen = []
    out = gk.sample(model, x_T=x_T, trajectory=ts, solver=SOLVER, generator=seed, progress=False,
                    schedule=SCHED, dtype=F64, callback=seen.append, **options)
    return out, [c["x"] for c in seen]


def step_noises(seed: int, n: int, ts: list[int], shape) -> list[torch.Tensor]:
    """The library's per-step Gaussians: the Philox stream of step noise at each step's t."""
    src = SampleNoise.create(seed, n)
    return [src.normal(STREAM_STEP_NOISE, t, shape).to(F64) for t in ts[:-1]]


@pytest.mark.parametrize("data_range", [None, (-1.0, 1.0)])
def test_every_step_matches_the_reference(data_range):
    """Every state of a run (x after each step, and the samples) equals the float64 reference fed the same
    noise: the first-order first step, the second-order steps with uneven r, and the final denoising."""
    n = 16
    x_T = torch.randn(n, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    out, states = run(oracle(), x_T, TRAJECTORY, seed=5, data_range=data_range)
    ref = reference(x_T, TRAJECTORY, step_noises(5, n, TRAJECTORY, (2,)), mixture_denoiser(WEIGHTS, MEANS, STDS),
                    clamp=data_range)
    assert len(states) == len(ref) == len(TRAJECTORY)
    for i, (got, want) in enumerate(zip(states, ref)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=lambda m: f"step {i}: {m}")
    torch.testing.assert_close(out, ref[-1], rtol=1e-10, atol=1e-10)
    if data_range is not None:
        assert out.abs().max() <= 1.0  # the step into data returns the clamped estimate


def test_the_second_order_correction_is_used():
    """Against the reference without its correction (D = x0_t at every step: SDE-DPM-Solver++1, the DDPM
    posterior step) the run differs from its second step on: the test above cannot pass a first-order solver."""
    n = 16
    x_T = torch.randn(n, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    _, states = run(oracle(), x_T, TRAJECTORY, seed=2, data_range=None)
    noises, denoise = step_noises(2, n, TRAJECTORY, (2,)), mixture_denoiser(WEIGHTS, MEANS, STDS)
    # one first-order step from the solver's own state before it (the reference's first step has no correction)
    first_order = [reference(x_T if i == 0 else states[i - 1], TRAJECTORY[i:i + 2], noises[i:i + 1], denoise)[0]
                   for i in range(3)]
    torch.testing.assert_close(states[0], first_order[0], rtol=1e-10, atol=1e-10)
    for i in (1, 2):
        assert (states[i] - first_order[i]).abs().max() > 1e-4, i


def test_the_first_step_is_the_ddpm_posterior_step():
    """With eta = 1, h = lambda_s - lambda_t: (sigma_s/sigma_t) e^{-h} = a_t sigma_s^2 / (a_s sigma_t^2), the
    posterior's coefficient of x_t, and sigma_s^2 (1 - e^{-2h}) its variance: one step is solver 'ddpm'."""
    n, t, s = 8, 640, 410
    x_T = torch.randn(n, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    _, states = run(oracle(), x_T, [t, s], seed=4, data_range=None)
    z = step_noises(4, n, [t, s], (2,))[0]
    ddpm = gk.step(x_T, oracle()(x_T, t), t, s, SCHED, "ddpm", noise=z, data_range=None)
    torch.testing.assert_close(states[0], ddpm, rtol=1e-10, atol=1e-10)


def data_w1(x: torch.Tensor, weights, means, stds) -> float:
    """W1 between the empirical distribution of the 1-D samples x and the mixture sum_k w_k N(m_k, s_k^2):
    the integral of |F_n - F| on a grid fine enough (1e-4) that its error is far below the sampling error."""
    x = x.flatten().to(F64).sort().values
    lo, hi = min(float(x[0]), min(means) - 8 * max(stds)), max(float(x[-1]), max(means) + 8 * max(stds))
    grid = torch.linspace(lo, hi, int((hi - lo) / 1e-4) + 1, dtype=F64)
    exact = sum(w * 0.5 * (1 + torch.erf((grid - m) / (s * math.sqrt(2)))) for w, m, s in zip(weights, means, stds))
    empirical = torch.searchsorted(x, grid, right=True).to(F64) / x.numel()
    return float(torch.trapezoid((empirical - exact).abs(), grid))


# a 1-D two-component mixture, the components 0.7 apart and 2.4 and 6 stds wide: asymmetric and clearly bimodal
MIX_1D = ([0.4, 0.6], [-0.4, 0.3], [0.12, 0.05])


def w1_by_steps(solver: str, steps=(10, 20, 50, 100), n: int = 4000, seeds=(0, 1)) -> tuple[dict[int, float], float]:
    """The W1 distance to the data of ``solver``'s samples with the exact heads of MIX_1D at each step count (the
    mean over ``seeds``, on the "quad" trajectory, dense where the denoiser changes fast), and the floor: the
    same distance for n exact draws from the data (the mean over 10 seeds). At n = 4000 the floor, about 0.005,
    is the error of the empirical mode weights, sqrt(0.4 * 0.6 / n) * 0.7; averaging two seeds shrinks it."""
    weights, means, stds = MIX_1D
    model = gk.GaussianMixtureOracle(weights, [[m] for m in means], stds, SCHED)
    w1 = {K: sum(data_w1(gk.sample(model, shape=(n, 1), steps=K, trajectory="quad", solver=solver, generator=seed,
                                   progress=False, data_range=None, dtype=F64, schedule=SCHED), *MIX_1D)
                     for seed in seeds) / len(seeds)
          for K in steps}
    floor = sum(data_w1(model.sample_data(n, torch.Generator().manual_seed(seed)), *MIX_1D) for seed in range(10)) / 10
    return w1, floor


def test_converges_to_the_data_with_exact_heads():
    """With exact heads the W1 distance to the data falls as the step count grows (from about 0.06 at 10 steps)
    and at 100 steps lies within twice the sampling floor (about 0.003 against a floor of 0.005)."""
    w1, floor = w1_by_steps(SOLVER)
    assert w1[10] > w1[20] > w1[50], w1
    assert w1[100] < w1[10] / 5, w1
    assert w1[100] < 2.0 * floor, (w1, floor)


def test_a_sample_does_not_depend_on_its_batch():
    """Sample i is a function of (seed, first_index + i): 6 samples in one batch equal batches of 2 and 4."""
    model = oracle()
    kw = dict(steps=6, solver=SOLVER, generator=9, progress=False, schedule=SCHED)
    full = gk.sample(model, shape=(6, 2), **kw)
    parts = torch.cat([gk.sample(model, shape=(2, 2), first_index=0, **kw),
                       gk.sample(model, shape=(4, 2), first_index=2, **kw)])
    torch.testing.assert_close(parts, full, rtol=0, atol=0)
    torch.testing.assert_close(gk.sample(model, shape=(6, 2), **kw), full, rtol=0, atol=0)  # seeded
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


@pytest.mark.parametrize("eta", [0.0, 0.4])
def test_eta_matches_the_reference(eta):
    """eta < 1 keeps part of the step deterministic; eta = 0 is the ODE solver DPM-Solver++(2M), which draws nothing."""
    n = 8
    x_T = torch.randn(n, 2, generator=torch.Generator().manual_seed(6), dtype=F64)
    _, states = run(oracle(), x_T, TRAJECTORY, seed=8, data_range=None, eta=eta)
    ref = reference(x_T, TRAJECTORY, step_noises(8, n, TRAJECTORY, (2,)), mixture_denoiser(WEIGHTS, MEANS, STDS),
                    eta=eta)
    for i, (got, want) in enumerate(zip(states, ref)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=lambda m: f"step {i}: {m}")
    other_seed = run(oracle(), x_T, TRAJECTORY, seed=9, data_range=None, eta=eta)[0]
    assert torch.equal(other_seed, states[-1]) == (eta == 0.0)


def test_it_has_no_one_step_form():
    """The correction needs the previous step's estimate: gk.step refuses it and names gk.sample."""
    with pytest.raises(ValueError, match=r"gk\.sample"):
        gk.step(torch.zeros(2, 1), torch.zeros(2, 1), 10, 5, SCHED, SOLVER, generator=0)


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
    assert not calls
