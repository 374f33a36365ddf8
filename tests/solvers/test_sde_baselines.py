"""The SDE baselines (EDM-SDE, SEEDS-1, SEEDS-2, SEEDS-3, GGF): one step against a float64 reference
written here from the papers' formulas, convergence to the exact sampler on Gaussian-mixture data,
seeds / batch / backend equality, option checks, GGF's NFE and tolerance; and the sigma conversions."""
import math

import numpy as np
import pytest
import torch

import gms_kernels as gk
from gms_kernels.eval import metrics
from gms_kernels.eval.oracle_job import fresh_data, paper_1d
from gms_kernels.core.random import (STREAM_ADAPTIVE, STREAM_SECOND_NOISE, STREAM_STEP_NOISE, STREAM_THIRD_NOISE,
                                SampleNoise)
from gms_kernels.integrations.scheduler import GMSScheduler
from gms_kernels.core.schedule import _strictly_descending, karras_trajectory
from gms_kernels.solvers import EpsFunction, get_solver, resolve_options
from gms_kernels.solvers.ggf import BrownianTree

SCHED = gk.Schedule.linear(1000)
NEW = ["seeds-1", "seeds-2", "seeds-3", "edm-sde", "ggf"]


def abar(t: int) -> float:
    return float(torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64), 0)[t])


def lam(t: int) -> float:
    """Half log-SNR log(a/sigma), from abar directly."""
    return 0.5 * math.log(abar(t) / (1 - abar(t)))


class LinearEps(torch.nn.Module):
    """A smooth stand-in eps model: e1 = 0.3 x + 0.001 t (per-sample t), float64."""
    time_input = "index"

    def forward(self, x, t):
        t = torch.as_tensor(t, dtype=torch.float64).reshape(-1, *([1] * (x.dim() - 1)))
        return (0.3 * x.double() + 0.001 * t).to(x.dtype)


def _steps(model, solver, ts, x, seed=3, **options):
    """Every callback of a gk.sample run from x over trajectory ts."""
    seen = []
    out = gk.sample(model, x_T=x, steps=len(ts), trajectory=ts, solver=solver, generator=seed, progress=False,
                    data_range=None, schedule=SCHED, callback=seen.append, **options)
    return out, seen


def test_sigma_conversions():
    t = torch.arange(1000)
    a = torch.tensor([abar(i) for i in (0, 250, 999)], dtype=torch.float64)
    assert torch.allclose(torch.tensor([SCHED.ve_sigma(i) for i in (0, 250, 999)], dtype=torch.float64), ((1 - a) / a).sqrt(), rtol=1e-12)
    assert SCHED.ve_sigma(-1) == 0.0
    grid = SCHED.ve_sigmas
    probes = torch.cat([torch.rand(200, dtype=torch.float64) * 3, torch.tensor([0.0, 1e-3, 500.0]), grid[[3, 400]]])
    brute = (probes[:, None] - grid[None, :]).abs().argmin(1)
    assert torch.equal(SCHED.index_of_ve_sigma(probes), brute)
    u = (t + 1).double() / 1000
    assert torch.allclose(SCHED.log_alpha_bar_at(u), SCHED.alphas_cumprod.log(), rtol=1e-12)
    assert torch.equal(SCHED.index_at(u), t)  # the knots are the grid
    mid = torch.tensor([0.2505, 0.7003], dtype=torch.float64)  # (inside intervals: beta jumps at the knots)
    fd = -(SCHED.log_alpha_bar_at(mid + 1e-7) - SCHED.log_alpha_bar_at(mid - 1e-7)) / 2e-7
    assert torch.allclose(SCHED.beta_at(mid), fd, rtol=1e-6)


def test_seeds_1_step_matches_the_formula():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1, 3, 3, generator=g, dtype=torch.float64)
    e1 = torch.randn(x.shape, generator=g, dtype=torch.float64)
    z = torch.randn(x.shape, generator=g, dtype=torch.float64)
    t, s = 600, 350
    got = gk.step(x, e1, t, s, SCHED, "seeds-1", noise=z, data_range=None)
    h = lam(s) - lam(t)
    a_t, a_s, sig_s = abar(t) ** 0.5, abar(s) ** 0.5, (1 - abar(s)) ** 0.5
    ref = a_s / a_t * x - 2 * sig_s * math.expm1(h) * e1 + sig_s * math.sqrt(math.expm1(2 * h)) * z
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12)
    x0 = gk.step(x, e1, t, -1, SCHED, "seeds-1", noise=z, data_range=None)  # last step: the denoised mean
    assert torch.allclose(x0, (x - (1 - abar(t)) ** 0.5 * e1) / a_t, rtol=1e-12)


def test_seeds_1_data_prediction_is_the_ddpm_posterior_step():
    g = torch.Generator().manual_seed(5)
    x, e1, z = (torch.randn(3, 1, 2, 2, generator=g, dtype=torch.float64) for _ in range(3))
    t, s = 420, 300
    got = gk.step(x, e1, t, s, SCHED, "seeds-1", noise=z, data_range=None, prediction="data")
    h = lam(s) - lam(t)
    sig_t, sig_s, a_t, a_s = (1 - abar(t)) ** 0.5, (1 - abar(s)) ** 0.5, abar(t) ** 0.5, abar(s) ** 0.5
    x0 = (x - sig_t * e1) / a_t
    ref = sig_s / sig_t * math.exp(-h) * x + a_s * -math.expm1(-2 * h) * x0 + sig_s * math.sqrt(-math.expm1(-2 * h)) * z
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose(got, gk.step(x, e1, t, s, SCHED, "ddpm", noise=z, data_range=None), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("prediction", ["noise", "data"])
def test_seeds_2_step_matches_the_formula(prediction):
    x = torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    t, s = 700, 400
    _, seen = _steps(LinearEps(), "seeds-2", [t, s], x, prediction=prediction)
    noise = SampleNoise.create(3, 3)
    z1 = noise.normal(STREAM_STEP_NOISE, t, x.shape[1:]).double()
    z2 = noise.normal(STREAM_SECOND_NOISE, t, x.shape[1:]).double()
    h = lam(s) - lam(t)
    target = math.exp(-(lam(t) + 0.5 * h))  # sigma/a at the midpoint in lambda, rounded to the grid
    sig_over_a = [((1 - abar(i)) / abar(i)) ** 0.5 for i in range(1000)]
    m = min(range(1000), key=lambda i: abs(sig_over_a[i] - target))
    h1 = lam(m) - lam(t)
    a = {i: abar(i) ** 0.5 for i in (t, m, s)}
    sg = {i: (1 - abar(i)) ** 0.5 for i in (t, m, s)}
    eps_t = 0.3 * x + 0.001 * t
    if prediction == "noise":
        u = a[m] / a[t] * x - 2 * sg[m] * math.expm1(h1) * eps_t + sg[m] * math.sqrt(math.expm1(2 * h1)) * z1
        eps_m = 0.3 * u + 0.001 * m
        ref = (a[s] / a[t] * x - 2 * sg[s] * math.expm1(h) * eps_m
               + sg[s] * (math.sqrt(math.exp(2 * h) - math.exp(2 * (h - h1))) * z1 + math.sqrt(math.expm1(2 * (h - h1))) * z2))
    else:
        x0_t = (x - sg[t] * eps_t) / a[t]
        u = (sg[m] / sg[t] * math.exp(-h1) * x + a[m] * (1 - math.exp(-2 * h1)) * x0_t
             + sg[m] * math.sqrt(1 - math.exp(-2 * h1)) * z1)
        x0_m = (u - sg[m] * (0.3 * u + 0.001 * m)) / a[m]
        ref = (sg[s] / sg[t] * math.exp(-h) * x + a[s] * (1 - math.exp(-2 * h)) * x0_m
               + sg[s] * (math.sqrt(math.exp(-2 * (h - h1)) - math.exp(-2 * h)) * z1
                          + math.sqrt(1 - math.exp(-2 * (h - h1))) * z2))
    assert torch.allclose(seen[0]["x"], ref, rtol=1e-10, atol=1e-12)
    assert [c["nfe"] for c in seen] == [2, 3] == [2, get_solver("seeds-2").network_calls(2)]


def _quad(f, p: float, n: int = 4000) -> float:
    """int_0^p f(l) dl by the midpoint rule (an independent check of the closed-form integrals)."""
    dl = p / n
    return sum(f((k + 0.5) * dl) for k in range(n)) * dl


@pytest.mark.parametrize("prediction", ["noise", "data"])
def test_seeds_3_step_matches_the_solution_it_integrates(prediction):
    """One SEEDS-3 step against the exact solution of the linear SDE with the model term taken linear in
    lambda through the stages, its kernels integrated numerically here, and the noise of one Brownian path
    split over [0, h1], [h1, h2], [h2, h] (each weight the square root of the integrated squared kernel)."""
    x = torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    t, s = 700, 400
    _, seen = _steps(LinearEps(), "seeds-3", [t, s], x, prediction=prediction)
    noise = SampleNoise.create(3, 3)
    streams = (STREAM_STEP_NOISE, STREAM_SECOND_NOISE, STREAM_THIRD_NOISE)
    z = [noise.normal(st, t, x.shape[1:]).double() for st in streams]
    h = lam(s) - lam(t)
    sig_over_a = [((1 - abar(i)) / abar(i)) ** 0.5 for i in range(1000)]
    ms = [min(range(1000), key=lambda i: abs(sig_over_a[i] - math.exp(-(lam(t) + r * h)))) for r in (1 / 3, 2 / 3)]
    cuts = [lam(m) - lam(t) for m in ms] + [h]
    a = {i: abar(i) ** 0.5 for i in (t, *ms, s)}
    sg = {i: (1 - abar(i)) ** 0.5 for i in (t, *ms, s)}

    def pred(y, i):  # the model's eps, or the x0 it implies
        e = 0.3 * y + 0.001 * i
        return e if prediction == "noise" else (y - sg[i] * e) / a[i]

    def kernel(p, l):  # d x_p / d pred at lambda_t + l, and the noise's squared kernel
        return (-2 * sg_p * math.exp(p - l), 2 * math.exp(2 * (p - l))) if prediction == "noise" else \
            (2 * a_p * math.exp(-2 * (p - l)), 2 * math.exp(-2 * (p - l)))

    def solution(i_p, p, slope):
        nonlocal sg_p, a_p
        sg_p, a_p = sg[i_p], a[i_p]
        lin = a_p / a[t] if prediction == "noise" else sg_p / sg[t] * math.exp(-p)
        out = lin * x + _quad(lambda l: kernel(p, l)[0], p) * pred(x, t)
        if slope is not None:
            out = out + _quad(lambda l: kernel(p, l)[0] * l, p) * slope
        lo = 0.0
        for c, zi in zip(cuts, z):
            if c <= p:
                out = out + sg_p * math.sqrt(_quad(lambda l: kernel(p, lo + l)[1], c - lo)) * zi
                lo = c
        return out

    sg_p = a_p = 0.0
    u1 = solution(ms[0], cuts[0], None)
    u2 = solution(ms[1], cuts[1], (pred(u1, ms[0]) - pred(x, t)) / cuts[0])
    ref = solution(s, h, (pred(u2, ms[1]) - pred(x, t)) / cuts[1])
    assert torch.allclose(seen[0]["x"], ref, rtol=1e-6, atol=1e-8)
    assert [c["nfe"] for c in seen] == [3, 4] == [3, get_solver("seeds-3").network_calls(2)]


def test_edm_sde_step_matches_algorithm_2():
    x = torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    t, s = 150, 60  # sigma_t ~ 0.4 lies in [S_tmin, S_tmax]: this step churns
    opts = dict(s_churn=2.0, s_noise=1.01)
    _, seen = _steps(LinearEps(), "edm-sde", [t, s], x, **opts)
    sig = lambda i: ((1 - abar(i)) / abar(i)) ** 0.5  # noqa: E731
    gamma = min(2.0 / 2, math.sqrt(2) - 1)
    t_hat = min(range(1000), key=lambda i: abs(sig(i) - sig(t) * (1 + gamma)))
    assert seen[0]["t_hat"] == t_hat > t
    z = SampleNoise.create(3, 3).normal(STREAM_STEP_NOISE, t, x.shape[1:]).double()
    xh = x / abar(t) ** 0.5 + math.sqrt(sig(t_hat) ** 2 - sig(t) ** 2) * 1.01 * z

    def d(y, i):  # (y - D(y; sigma_i)) / sigma_i = the eps model at x = a_i y
        return 0.3 * abar(i) ** 0.5 * y + 0.001 * i

    euler = xh + (sig(s) - sig(t_hat)) * d(xh, t_hat)
    heun = xh + (sig(s) - sig(t_hat)) * 0.5 * (d(xh, t_hat) + d(euler, s))
    assert torch.allclose(seen[0]["x"], abar(s) ** 0.5 * heun, rtol=1e-10, atol=1e-12)
    assert [c["nfe"] for c in seen] == [2, 3]
    # last step (churned too, sigma_60 ~ 0.2): the Euler step into sigma = 0 lands on the denoised mean
    assert seen[1]["t_hat"] > s and torch.allclose(seen[1]["x"], seen[1]["denoised"], rtol=1e-12)


@pytest.mark.parametrize("noise", ["redraw", "brownian"])
def test_ggf_first_proposal_matches_algorithm_1(noise):
    x = torch.randn(5, 1, 2, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    opts = dict(eps_abs=0.01, eps_rel=0.05, h_init=0.05, noise=noise)
    _, seen = _steps(LinearEps(), "ggf", [999], x, **opts)
    first = seen[0]
    u, h = 1.0, 0.05
    if noise == "redraw":  # Alg. 1: a fresh z per proposal
        z = SampleNoise.create(3, 5).normal_per_sample(STREAM_ADAPTIVE, torch.zeros(5, dtype=torch.long),
                                                       x.shape[1:]).double()
    else:  # the increment W(1) - W(0.95) of the sample's Brownian path, in units of sqrt(h)
        tree, rows = BrownianTree(SampleNoise.create(3, 5), x.shape[1:], x.device), torch.arange(5)
        z = (tree(torch.full((5,), u, dtype=torch.float64), rows)
             - tree(torch.full((5,), u - h, dtype=torch.float64), rows)) / math.sqrt(h)
    beta = lambda v: -1000 * math.log(1 - float(torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)[  # noqa: E731
        math.ceil(v * 1000 - 1e-9) - 1]))

    def score(y, v):  # the model at the grid index nearest in noise level (here the knot's own index)
        i = round(v * 1000) - 1
        return -(0.3 * y + 0.001 * i) / (1 - abar(i)) ** 0.5

    x1 = x + h * beta(u) * (0.5 * x + score(x, u)) + math.sqrt(h * beta(u)) * z
    x_tilde = x1 + h * beta(u - h) * (0.5 * x1 + score(x1, u - h)) + math.sqrt(h * beta(u - h)) * z
    x2 = 0.5 * (x + x_tilde)
    delta = torch.maximum(torch.full_like(x1, 0.01), 0.05 * torch.maximum(x1.abs(), x.abs()))
    err = ((x1 - x2) / delta).pow(2).flatten(1).mean(1).sqrt()
    assert torch.allclose(first["error"], err, rtol=1e-9)
    ok = err <= 1
    assert torch.equal(first["accepted"], ok)
    assert torch.allclose(first["x"][ok], x2[ok], rtol=1e-10) and torch.equal(first["x"][~ok], x[~ok])
    assert torch.allclose(first["u"], torch.where(ok, u - h, u).double())
    assert torch.equal(first["nfe"], torch.full((5,), 2))


@pytest.mark.parametrize("solver, options", [("seeds-1", {}), ("seeds-2", {}), ("seeds-2", {"prediction": "data"}),
                                             ("seeds-3", {}), ("seeds-3", {"prediction": "data"}), ("edm-sde", {})])
def test_oracle_convergence(solver, options):
    """With exact heads, W1 to the data falls toward the exact sampler's as K grows."""
    oracle = paper_1d(SCHED)
    fresh = fresh_data(oracle, 4000)
    w1 = {}
    for K in ("exact", 10, 100):
        x = gk.sample(oracle, shape=(4000, 1), steps=100 if K == "exact" else K, generator=0, progress=False,
                      solver="exact" if K == "exact" else solver, data_range=None, dtype=torch.float64,
                      **({} if K == "exact" else options))
        w1[K] = metrics.wasserstein1(x, fresh)
    assert w1[100] < w1[10] / 5, w1
    assert w1[100] < w1["exact"] + 0.01, w1


def test_ggf_tolerance_buys_accuracy_and_reports_nfe():
    oracle = paper_1d(SCHED)
    fresh = fresh_data(oracle, 2000)
    res = {}
    for tol in (0.5, 0.05):
        seen = []
        x = gk.sample(oracle, shape=(2000, 1), steps=10, solver="ggf", generator=0, progress=False, data_range=None,
                      dtype=torch.float64, callback=seen.append, eps_rel=tol)
        nfe = seen[-1]["nfe"]
        assert nfe.shape == (2000,) and (nfe >= 3).all()
        # every accepted proposal met the tolerance: E <= 1 exactly where accepted
        for c in seen[:-1]:
            assert (c["error"] <= 1).sum() == c["accepted"].sum()
        res[tol] = (metrics.wasserstein1(x, fresh), float(nfe.double().mean()))
    assert res[0.05][1] > 2 * res[0.5][1]  # a tighter tolerance takes more calls ...
    assert res[0.05][0] < 0.75 * res[0.5][0]  # ... and buys accuracy
    with pytest.raises(ValueError, match="max_attempts"):
        gk.sample(oracle, shape=(4, 1), steps=10, solver="ggf", generator=0, progress=False, data_range=None,
                  eps_rel=1e-6, eps_abs=1e-7, max_attempts=5)


def test_brownian_tree_is_one_fixed_brownian_path():
    """Any W(u) comes back the same whatever else was asked, in any order or batch; increments over
    disjoint intervals are independent N(0, length), down to lengths far below GGF's steps."""
    n = 20000
    tree, rows = BrownianTree(SampleNoise.create(5, n), (1,), torch.device("cpu")), torch.arange(n)
    points = torch.tensor([0.0, 0.3, 0.3 + 2e-6, 0.5, 0.61, 1.0], dtype=torch.float64)
    w = torch.stack([tree(torch.full((n,), float(p), dtype=torch.float64), rows)[:, 0] for p in points], 1)
    assert torch.equal(w[:, 0], torch.zeros(n))
    inc = w.diff(dim=1)
    lengths = points.diff()
    torch.testing.assert_close(inc.var(0) / lengths, torch.ones(5, dtype=torch.float64), atol=0.04, rtol=0)
    corr = torch.corrcoef(inc.T)
    assert (corr - torch.eye(5, dtype=torch.float64)).abs().max() < 0.03
    # the same values in another order, per-sample points, and a sub-batch
    mixed = torch.where(rows % 2 == 0, points[4], points[1])
    again = tree(mixed, rows)[:, 0]
    torch.testing.assert_close(again, torch.where(rows % 2 == 0, w[:, 4], w[:, 1]), rtol=0, atol=0)
    part = BrownianTree(SampleNoise(torch.full((3,), 5), torch.arange(7, 10)), (1,), torch.device("cpu"))
    torch.testing.assert_close(part(torch.full((3,), 0.5, dtype=torch.float64), torch.arange(3))[:, 0], w[7:10, 3],
                               rtol=0, atol=0)


def test_ggf_converges_with_brownian_noise_and_not_with_redrawn_noise():
    """Alg. 1's fresh noise per proposal biases the accepted increments (more so the tighter the tolerance);
    a fixed Brownian path does not: its W1 approaches the exact sampler's."""
    oracle = paper_1d(SCHED)
    n = 1500
    fresh = fresh_data(oracle, 20000)
    exact = gk.sample(oracle, shape=(n, 1), steps=100, solver="exact", generator=0, progress=False, data_range=None,
                      dtype=torch.float64)
    w1 = {"exact": metrics.wasserstein1(exact, fresh)}
    for noise in ("brownian", "redraw"):
        x = gk.sample(oracle, shape=(n, 1), steps=10, solver="ggf", generator=0, progress=False, data_range=None,
                      dtype=torch.float64, eps_rel=0.02, eps_abs=1e-3, noise=noise)
        w1[noise] = metrics.wasserstein1(x, fresh)
    # (seeds 0-2 at this size: exact 0.005-0.012, brownian 0.004-0.014, redraw 0.07)
    assert w1["brownian"] < w1["exact"] + 0.015 and w1["redraw"] > 4 * w1["brownian"], w1


@pytest.mark.parametrize("solver", NEW)
def test_seed_batch_and_backend_equality(solver):
    model = LinearEps()
    x_T = SampleNoise.create(11, 6).normal(2, 0, (1, 2, 2)).double()
    kw = dict(steps=5, solver=solver, generator=11, progress=False, schedule=SCHED,
              **({"eps_rel": 0.5} if solver == "ggf" else {}))
    full = gk.sample(model, x_T=x_T, backend="torch", **kw)
    assert torch.equal(full, gk.sample(model, x_T=x_T, backend="torch", **kw))  # seeded
    assert not torch.equal(full, gk.sample(model, x_T=x_T, backend="torch", **dict(kw, generator=12)))
    for backend in ("cpp", "auto"):  # no fused kernel: the torch code runs on every backend
        assert torch.equal(full, gk.sample(model, x_T=x_T, backend=backend, **kw))
    # sample i does not depend on the batch it is drawn in
    part = gk.sample(model, x_T=x_T[2:5], first_index=2, backend="torch", **kw)
    assert torch.equal(part, full[2:5])


def test_embedded_model_runs_every_new_solver():
    for solver in NEW:
        x = gk.sample(shape=(3, 1, 8, 8), steps=4, solver=solver, generator=0, progress=False,
                      **({"eps_rel": 0.5} if solver == "ggf" else {}))
        assert x.shape == (3, 1, 8, 8) and torch.isfinite(x).all()


def test_seeds_1_in_the_scheduler_and_step():
    sched = GMSScheduler(solver="seeds-1", backend="torch")
    sched.set_timesteps(5)
    x = SampleNoise.create(0, 2).normal(2, 0, (1, 8, 8))
    from gms_kernels.models.embedded import default_model

    model = default_model()
    for i, t in enumerate(sched.timesteps):
        out = model(x, torch.full((2,), int(t)))
        x = sched.step(out, t, x, generator=[5, 6]).prev_sample
    assert torch.isfinite(x).all()
    for solver in ("edm-sde", "seeds-2", "seeds-3", "ggf"):
        with pytest.raises(ValueError, match="unknown solver"):
            GMSScheduler(solver=solver)
        with pytest.raises(ValueError, match="gk.sample"):
            gk.step(torch.zeros(1, 1), torch.zeros(1, 1), 10, 5, SCHED, solver)


@pytest.mark.parametrize("solver, options, message", [
    ("edm-sde", {"s_churn": -1.0}, "s_churn must be a number"),
    ("edm-sde", {"s_tmin": 2.0, "s_tmax": 1.0}, "s_tmax must be a number in \\[2"),
    ("edm-sde", {"s_noise": "1"}, "s_noise must be a number"),
    ("seeds-2", {"r": 1.0}, "r must be a number in \\(0, 1\\)"),
    ("seeds-2", {"r": 0.0}, "r must be a number"),
    ("seeds-1", {"prediction": "x0"}, "prediction must be 'noise' or 'data'"),
    ("seeds-3", {"prediction": "eps"}, "prediction must be 'noise' or 'data'"),
    ("seeds-3", {"r": 0.5}, "unknown option"),
    ("ggf", {"eps_abs": 0.0}, "eps_abs must be a number"),
    ("ggf", {"exponent": 2.0}, "exponent must be a number"),
    ("ggf", {"max_attempts": 70000}, "max_attempts must be an integer"),
    ("ggf", {"noise": "fresh"}, "noise must be 'brownian' or 'redraw'"),
    ("seeds-1", {"eta": 0.5}, "unknown option"),
    ("ggf", {"s_churn": 1.0}, "unknown option"),
])
def test_bad_options_are_refused_before_sampling(solver, options, message):
    calls = []

    def model(x, t):
        calls.append(1)
        return x

    with pytest.raises(ValueError, match=message):
        gk.sample(model, shape=(2, 1), steps=3, solver=solver, generator=0, progress=False, **options)
    assert not calls


def test_seed_interval_and_paired_difference():
    """gk.metrics' over-seeds helpers against hand numbers: t_{4, 0.975} = 2.7764451."""
    ci = metrics.seed_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert ci.mean == 3.0 and ci.n == 5
    assert abs(ci.half_width - 2.7764451 * math.sqrt(2.5) / math.sqrt(5)) < 1e-6
    diff, significant = metrics.paired_difference([10.0, 11.0, 12.5, 9.0, 10.5], [12.0, 13.5, 14.0, 11.0, 13.0])
    assert significant and diff.high < 0 and abs(diff.mean - (-2.1)) < 1e-12
    diff, significant = metrics.paired_difference([1.0, 2.0, 3.0], [1.5, 1.0, 3.2])
    assert not significant and diff.low < 0 < diff.high
    with pytest.raises(ValueError, match="at least two"):
        metrics.seed_interval([1.0])
    with pytest.raises(ValueError, match="one value per seed"):
        metrics.paired_difference([1.0, 2.0], [1.0])


def test_karras_trajectory_is_edm_eq5_rounded_to_the_grid():
    """EDM Eq. 5 written out in numpy (edm_grid): levels evenly spaced in sigma^(1/rho), then the nearest index."""
    for K, rho in ((1, 7.0), (5, 7.0), (10, 7.0), (10, 3.0)):
        assert karras_trajectory(SCHED, K, rho) == edm_grid(SCHED, K, rho)
    assert karras_trajectory(SCHED, 5)[0] == SCHED.T - 1 and karras_trajectory(SCHED, 5)[-1] == 0
    with pytest.raises(ValueError, match="rho must be"):
        karras_trajectory(SCHED, 5, rho=0.0)
    # EDM-SDE runs on it as an explicit trajectory
    x = gk.sample(paper_1d(SCHED), shape=(64, 1), steps=5, solver="edm-sde", generator=0, progress=False,
                  data_range=None, dtype=torch.float64, trajectory=karras_trajectory(SCHED, 5))
    assert torch.isfinite(x).all()


def edm_grid(schedule: gk.Schedule, steps: int, rho: float) -> list[int]:
    """EDM Eq. 5 in float64 numpy, each level rounded to the nearest trained sigma (ties to the lower index)."""
    abar = schedule.alphas_cumprod.numpy()
    sigmas = np.sqrt((1 - abar) / abar)
    top, bottom = sigmas[-1] ** (1 / rho), sigmas[0] ** (1 / rho)
    levels = [(top + i / steps * (bottom - top)) ** rho for i in range(steps + 1)]
    return _strictly_descending([int(np.argmin(np.abs(sigmas - level))) for level in levels], schedule.T)


def test_karras_trajectory_defaults_to_edms_rho_of_seven():
    for steps in (4, 8, 25):
        assert karras_trajectory(SCHED, steps) == edm_grid(SCHED, steps, 7.0)


def test_karras_trajectory_rounds_float64_levels():
    # at K = 197 one level lies so close to the midpoint of two trained sigmas that float32 levels round it
    # to the other index (found by scanning K = 1..1000)
    assert karras_trajectory(SCHED, 197) == edm_grid(SCHED, 197, 7.0)


def test_karras_trajectory_takes_any_positive_rho_and_every_step_count_up_to_T():
    assert karras_trajectory(SCHED, 6, rho=0.5) == edm_grid(SCHED, 6, 0.5)
    small = gk.Schedule.linear(20)
    assert karras_trajectory(small, 20) == list(range(19, -1, -1))  # T steps visit every index
    for bad in (21, 0, 2.0, True):
        with pytest.raises(ValueError, match=r"steps must be an integer in \[1, T = 20\]"):
            karras_trajectory(small, bad)


@pytest.mark.parametrize("defer", [False, True])
def test_a_nonfinite_network_output_is_reported_with_its_call(defer):
    """The multi-call loops check every network output; deferred (as on a GPU, where a read per call
    stalls the host) the error comes at the end and still names the first bad call."""
    calls = []

    def model(x, t):
        calls.append(t)
        return torch.full_like(x, float("nan")) if len(calls) in (3, 5) else 0.1 * x

    e1 = EpsFunction(model, 1000, "index", "edm-sde", torch.float32, defer=defer)
    noise = SampleNoise.create(0, 2)
    run = lambda: get_solver("edm-sde").loop(e1, torch.ones(2, 3), [999, 600, 300, 100], SCHED, noise,  # noqa: E731
                                      (-1.0, 1.0), resolve_options("edm-sde", {"s_churn": 0.0, "s_tmin": 0.0,
                                                                               "s_tmax": 1e3, "s_noise": 1.0}))
    message = r"model output at network call 2 \(t=600\) has non-finite values .* head e1"
    if defer:
        x, info = run()  # (runs to the end)
        assert len(calls) == info["nfe"] == 7 == e1.calls
        with pytest.raises(ValueError, match=message):
            e1.raise_if_nonfinite()
    else:
        with pytest.raises(ValueError, match=message):
            run()
        assert len(calls) == 3


def test_a_finite_run_passes_the_deferred_check():
    e1 = EpsFunction(lambda x, t: 0.1 * x, 1000, "index", "seeds-2", torch.float32, defer=True)
    x, info = get_solver("seeds-2").loop(e1, torch.ones(2, 3), [999, 500], SCHED, SampleNoise.create(0, 2),
                                         (-1.0, 1.0), resolve_options("seeds-2", {"r": 0.5, "prediction": "noise"}))
    e1.raise_if_nonfinite()
    assert e1.calls == info["nfe"] == 3 and torch.isfinite(x).all()
