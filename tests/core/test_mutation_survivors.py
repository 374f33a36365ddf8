"""Tests written for mutants that survived the mutation run (issue 25 item 7,
benchmarks/results/mutation.md): each pins a default, a value or a check that no other test did.
They are quick (well under a second each)."""
from __future__ import annotations

import math

import pytest
import torch

import gms_kernels as gk


def test_schedule_defaults_and_repr():
    """The cosine schedule's defaults are improved-diffusion's (T = 1000, s = 0.008, max_beta = 0.999)."""
    s = gk.Schedule.cosine()
    assert s.T == 1000

    def abar(u):
        return math.cos((u + 0.008) / 1.008 * math.pi / 2) ** 2

    expected = [min(1 - abar((i + 1) / 1000) / abar(i / 1000), 0.999) for i in range(1000)]
    assert s.betas.tolist() == pytest.approx(expected, rel=1e-12)
    assert s.betas[-1].item() == 0.999  # the cap binds at the last step
    assert repr(gk.Schedule.linear(10, 1e-3, 0.2)) == "Schedule(T=10, beta[0]=0.001, beta[-1]=0.2)"


def test_schedule_refuses_the_boundary_betas_and_lengths():
    """beta = 0 (a step that adds no noise) and beta = 1 are refused; T may be 65535 but not 65536
    (the Philox counters and the kernels' time index hold 16 bits)."""
    for bad in ([0.0, 0.1], [0.1, 1.0]):
        with pytest.raises(ValueError, match="open interval"):
            gk.Schedule(bad)
    assert gk.Schedule(torch.full((2**16 - 1,), 1e-3)).T == 65535
    with pytest.raises(ValueError, match="at most 65535"):
        gk.Schedule(torch.full((2**16,), 1e-3))


@pytest.mark.parametrize("T, K", [(1000, 10), (1000, 400), (1000, 700), (1000, 1000), (100, 3), (7, 7)])
def test_even_trajectory_is_the_official_list(T, K):
    """The official GMS list t_i = floor(T - 1 - i T/K), i < K, with 0 appended when missing; it ends in
    1 for 2 <= T/K < 3 (then 0 is appended) and in 0 for T/K < 2 (nothing is appended)."""
    official = [math.floor(T - 1 - i * T / K) for i in range(K)]
    if official[-1] != 0:
        official.append(0)
    assert gk.trajectory(T, K, "even") == official


@pytest.mark.parametrize("K", [1, 2, 3, 10, 50])
def test_linspace_trajectory_is_diffusers_linspace(K):
    """diffusers' "linspace" spacing: linspace(0, T - 1, K) rounded, descending (K = 1 gives [0])."""
    import numpy as np

    expected = np.linspace(0, 999, K).round()[::-1].astype(int).tolist()
    assert gk.trajectory(1000, K, "linspace") == expected


def test_transition_moments_leave_the_missing_orders_none():
    """From e1 alone only M1 exists (Var and M3 stay None); from e1 and e2, M3 stays None."""
    from gms_kernels.core.moments import transition_moments

    k = gk.Schedule.linear().coefficients(500, 400)
    x, e = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64) * 0.1
    only_mean = transition_moments(x, e, None, None, k)
    assert only_mean.var is None and only_mean.m3 is None
    with_var = transition_moments(x, e, e * e + 0.5, None, k)
    assert with_var.var is not None and with_var.m3 is None


def test_third_moment_clamp_keeps_a_tie():
    """The official rule replaces E[y^3] by E[y] only where |E[y^3]| > |E[y]| (strictly): at a tie of
    opposite signs E[y^3] = -E[y] it is kept."""
    from gms_kernels.core.moments import X0Moments, clamp_x0_moments

    m = X0Moments(mean=torch.tensor([0.5, 0.5], dtype=torch.float64), var=torch.tensor([0.1, 0.1], dtype=torch.float64),
                  m2=torch.tensor([0.35, 0.35], dtype=torch.float64), m3=torch.tensor([-0.5, -0.6], dtype=torch.float64))
    out = clamp_x0_moments(m, (-1.0, 1.0))
    assert out.m3.tolist() == [-0.5, 0.5]


def test_empty_data_range_and_fractional_step_times_are_refused_by_name():
    from gms_kernels.core.moments import check_data_range

    with pytest.raises(ValueError, match="low < high"):
        check_data_range((0.5, 0.5))
    assert check_data_range((0, 1)) == (0.0, 1.0)
    s = gk.Schedule.linear(100)
    with pytest.raises(ValueError, match="^t must be an integer"):
        s.coefficients(50.5, 10)
    with pytest.raises(ValueError, match="^s must be an integer"):
        s.coefficients(50, 10.5)


def test_step_coefficients_a_ts_is_the_ratio():
    """a_{t|s} = a_t / a_s (a public field the samplers themselves do not read)."""
    s = gk.Schedule.linear()
    for t, u in [(999, 899), (10, 0), (5, -1)]:
        k = s.coefficients(t, u)
        assert k.a_ts == pytest.approx(s.alpha(t) / s.alpha(u), rel=1e-15)


def test_a_fractional_time_index_is_named_in_the_error():
    with pytest.raises(ValueError, match="^time index must be an integer time index"):
        gk.Schedule.linear(100).alpha(3.5)


def test_fit_adan_defaults():
    """fit_adan's defaults: weights (1/3, 2/3), 25 iterations, lr 0.06 (the official constant),
    mean over each sample; each default changes the result when changed."""
    g = torch.Generator().manual_seed(0)
    m1 = torch.randn(3, 8, dtype=torch.float64, generator=g) * 0.3
    var = torch.rand(3, 8, dtype=torch.float64, generator=g) * 0.2 + 0.05
    m3 = m1**3 + 3 * m1 * var + 0.3 * var**1.5 * torch.randn(3, 8, dtype=torch.float64, generator=g)
    mom = gk.TransitionMoments(m1, var, m3)
    default = gk.fit_adan(mom)
    explicit = gk.fit_adan(mom, (1 / 3, 2 / 3), iters=25, lr=0.06, mean_over="sample")
    for a, b in zip((default.mu1, default.mu2, default.s2), (explicit.mu1, explicit.mu2, explicit.s2)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for other in (gk.fit_adan(mom, iters=26), gk.fit_adan(mom, lr=0.07), gk.fit_adan(mom, mean_over="batch")):
        assert not torch.equal(other.mu1, default.mu1)


def _paper_rates(iters, high, low, min_lr, t, T, warmup=18):
    """The paper's Tab. optimizer, written out: base = max(high (1 - iota), low), iota = ((T - t)/T)^2;
    k/warmup * base for k <= warmup, then max(base (1 + cos(pi (k - warmup)/(iters - warmup)))/2, min_lr)."""
    base = max(high * (1 - ((T - t) / T) ** 2), low)
    out = []
    for k in range(1, iters + 1):
        if k <= warmup:
            out.append(base * k / warmup)
        else:
            out.append(max(base * (1 + math.cos(math.pi * (k - warmup) / (iters - warmup))) / 2, min_lr))
    return out


@pytest.mark.parametrize("table, iters, t", [("paper", 25, 600), ("paper", 40, 999), ("paper", 60, 100),
                                             ("paper-imagenet64", 19, 900), ("paper-imagenet64", 30, 700),
                                             ("paper", 18, 800), ("paper", 5, 400)])
def test_paper_learning_rates_against_the_table(table, iters, t):
    from gms_kernels.core.fit import adan_learning_rates

    high, low, min_lr = {"paper": (0.16, 0.12, 0.1), "paper-imagenet64": (0.1, 0.06, 0.04)}[table]
    rates = adan_learning_rates(iters, table, t=t, T=1000)
    assert rates == pytest.approx(_paper_rates(iters, high, low, min_lr, t, 1000), rel=1e-12, abs=0)


def test_learning_rate_default_and_missing_time():
    from gms_kernels.core.fit import adan_learning_rates

    assert adan_learning_rates(3) == [0.06] * 3
    for t, T in [(500, None), (None, 1000)]:
        with pytest.raises(ValueError, match="needs the time index t and T"):
            adan_learning_rates(5, "paper", t=t, T=T)


def test_knee_delta2_values():
    """(SKEW_KNEE / |w1 w2 (w2 - w1)|)^(2/3): 0.263 at the default weights; 0 for equal weights,
    whose mixture has no skew (a guard: the fits refuse equal weights before they get here)."""
    from gms_kernels.core.fit import SKEW_KNEE, knee_delta2

    assert knee_delta2(1 / 3) == pytest.approx((SKEW_KNEE / (2 / 27)) ** (2 / 3), rel=1e-14)
    assert knee_delta2(1 / 3) == pytest.approx(0.263, abs=5e-4)
    assert knee_delta2(0.5) == 0.0


def test_var_floor_bounds():
    from gms_kernels.core.fit import check_var_floor

    assert check_var_floor(0) == 0.0 and check_var_floor(1) == 1.0
    for bad in (1.5, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match="var_floor must be a number in"):
            check_var_floor(bad)


# -- solvers.py (the mutation run of gms_kernels/solvers.py, benchmarks/results/mutation.md) ----------------------
LINEAR_BETAS = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64).tolist()


def _abar(t: int) -> float:
    """prod_{i<=t} (1 - beta_i) of the linear schedule, recomputed here (1 for the data, t = -1)."""
    return 1.0 if t < 0 else math.prod(1.0 - b for b in LINEAR_BETAS[: t + 1])


def _posterior(t: int, s: int) -> tuple[float, float, float]:
    """(coefficient of x_t, coefficient of x0, variance) of q(x_s | x_t, x0) for a jump t -> s (DDPM Eq. 7)."""
    ab_t, ab_s = _abar(t), _abar(s)
    alpha = ab_t / ab_s
    return (math.sqrt(alpha) * (1 - ab_s) / (1 - ab_t), math.sqrt(ab_s) * (1 - alpha) / (1 - ab_t),
            (1 - ab_s) / (1 - ab_t) * (1 - alpha))


def _inputs(seed: int, shape=(3, 2, 4, 4), scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) * scale for _ in range(3)]


def test_ddpm_large_and_ddim_report_their_step_quantities():
    """return_info (and sample's callback) hand out the step's own quantities under fixed keys: ddpm's and
    ddpm-large's "m1" is the posterior mean c_xt x_t + c_x0 x0 (and x_s - m1 is sqrt(lam2) z, sqrt(beta_{t|s}) z);
    ddim's "x0" is the
    clamped x0 estimate (x_t - sqrt(1 - abar_t) e1) / sqrt(abar_t)."""
    sched = gk.Schedule.linear()
    x, e1, z = _inputs(1)
    t, s = 700, 500
    c_xt, c_x0, _ = _posterior(t, s)
    x0 = ((x - math.sqrt(1 - _abar(t)) * e1) / math.sqrt(_abar(t))).clamp(-1, 1)
    for solver, var in [("ddpm", _posterior(t, s)[2]), ("ddpm-large", 1 - _abar(t) / _abar(s))]:
        x_s, info = gk.step(x, e1, t, s, sched, solver, noise=z, return_info=True, backend="torch")
        torch.testing.assert_close(info["m1"], c_xt * x + c_x0 * x0, rtol=0, atol=1e-12)
        torch.testing.assert_close(x_s - info["m1"], math.sqrt(var) * z, rtol=0, atol=1e-12)
    _, info = gk.step(x, e1, t, s, sched, "ddim", noise=z, return_info=True, backend="torch")
    assert 0 < int((x0.abs() == 1).sum()) < x0.numel()  # the clamp binds somewhere
    torch.testing.assert_close(info["x0"], x0, rtol=0, atol=1e-12)


def test_analytic_dpm_reads_a_list_table_in_float64():
    """A Gamma table given as a list of Python floats is read in float64 (not rounded to float32): the
    variance is Bao et al.'s lam2 + (sqrt(bbar_t / alpha_ts) - sqrt(bbar_s - lam2))^2 (1 - Gamma_t) to 1e-13."""
    sched = gk.Schedule.linear()
    t, s = 999, 899
    gamma = [0.1 + 0.7 * i / 999 for i in range(1000)]  # none of these is a float32 number
    g = gamma[t]
    assert float(torch.tensor(g, dtype=torch.float32)) != g
    x, e1, z = _inputs(2)
    _, info = gk.step(x, e1, t, s, sched, "analytic-dpm", noise=z, gamma=gamma, data_range=None,
                      return_info=True, backend="torch")
    ab_t, ab_s = _abar(t), _abar(s)
    lam2 = _posterior(t, s)[2]
    var = lam2 + (math.sqrt((1 - ab_t) / (ab_t / ab_s)) - math.sqrt(1 - ab_s - lam2)) ** 2 * (1 - g)
    torch.testing.assert_close(info["var"], torch.full_like(x, var), rtol=1e-13, atol=0)


@pytest.mark.parametrize("prediction", ["noise", "data"])
def test_seeds_1_clamps_x0_to_the_data_range(prediction):
    """SEEDS-1 with a data range uses the clamped x0 (and, in the noise form, the eps it implies), as DDIM
    does: x_s = (a_s/a_t) x_t - 2 sigma_s (e^h - 1) eps~ + sigma_s sqrt(e^2h - 1) z with
    eps~ = (x_t - a_t clamp(x0)) / sigma_t; the data form is the DDPM posterior step on clamp(x0)."""
    sched = gk.Schedule.linear()
    x, e1, z = _inputs(3)
    t, s = 600, 350
    a_t, a_s = math.sqrt(_abar(t)), math.sqrt(_abar(s))
    sig_t, sig_s = math.sqrt(1 - _abar(t)), math.sqrt(1 - _abar(s))
    x0 = ((x - sig_t * e1) / a_t).clamp(-1, 1)
    assert 0 < int((x0.abs() == 1).sum()) < x0.numel()
    h = math.log(a_s / sig_s) - math.log(a_t / sig_t)
    if prediction == "noise":
        eps = (x - a_t * x0) / sig_t
        ref = a_s / a_t * x - 2 * sig_s * math.expm1(h) * eps + sig_s * math.sqrt(math.expm1(2 * h)) * z
    else:
        c_xt, c_x0, lam2 = _posterior(t, s)
        ref = c_xt * x + c_x0 * x0 + math.sqrt(lam2) * z
    got, info = gk.step(x, e1, t, s, sched, "seeds-1", noise=z, data_range=(-1.0, 1.0), prediction=prediction,
                        return_info=True)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(info["x0"], x0, rtol=0, atol=1e-12)
    # the step to data (SEEDS-1's own branch: it has no denoise_final option) returns clamp(x0)
    last, info = gk.step(x, e1, t, -1, sched, "seeds-1", noise=z, data_range=(-1.0, 1.0), prediction=prediction,
                         return_info=True)
    torch.testing.assert_close(last, x0, rtol=0, atol=1e-12)
    torch.testing.assert_close(info["x0"], x0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("t, s", [(500, 400), (10, 0), (999, -1)])
def test_denoise_coefficients_are_the_schedules_step_to_data(t, s):
    """The shortcut t -> data coefficients (DDIM's x0, the callback's "denoised") equal the schedule's own
    coefficients of the step t -> -1, every field: a_s = 1, sigma_s = 0, a_ts = a_t, beta_ts = sigma_t^2,
    c1 = 0, c2 = 1, lam2 = 0."""
    from dataclasses import fields

    from gms_kernels.solvers import denoise_coefficients

    sched = gk.Schedule.linear()
    got, ref = denoise_coefficients(sched.coefficients(t, s)), sched.coefficients(t, -1)
    for f in fields(ref):
        assert getattr(got, f.name) == pytest.approx(getattr(ref, f.name), rel=1e-12, abs=1e-15), f.name
    assert (got.a_ts, got.beta_ts) == pytest.approx((math.sqrt(_abar(t)), 1 - _abar(t)), rel=1e-12)


@pytest.mark.parametrize("v", [0.0, 0.5, 1.0])
def test_ddpm_reports_its_variance(v):
    """ddpm's info "var" is the variance it draws with: lam2 = (1 - abar_s)/(1 - abar_t) beta_{t|s} at
    variance_interp v = 0, lam2^(1 - v) beta_{t|s}^v otherwise (beta_{t|s} at v = 1), from the betas."""
    sched = gk.Schedule.linear()
    x, e1, z = _inputs(4)
    t, s = 300, 150
    lam2, beta_ts = _posterior(t, s)[2], 1 - _abar(t) / _abar(s)
    var = lam2 ** (1 - v) * beta_ts**v
    x_s, info = gk.step(x, e1, t, s, sched, "ddpm", noise=z, variance_interp=v, return_info=True, backend="torch")
    assert float(info["var"]) == pytest.approx(var, rel=1e-12)
    torch.testing.assert_close(x_s - info["m1"], math.sqrt(var) * z, rtol=0, atol=1e-12)


def test_explicit_float32_noise_enters_the_float64_step_exactly():
    """The torch backend is the float64 reference: explicit float32 noise z is widened before it is scaled, so
    ddpm's x_s - m1 is sqrt(lam2) * float64(z) to float64 rounding (scaling z in float32 first errs by ~1e-8)."""
    sched = gk.Schedule.linear()
    x, e1, _ = _inputs(5)
    z32 = torch.randn(x.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float32) * 3
    t, s = 400, 200
    lam2 = _posterior(t, s)[2]
    x_s, info = gk.step(x, e1, t, s, sched, "ddpm", noise=z32, return_info=True, backend="torch")
    assert x_s.dtype == torch.float64
    torch.testing.assert_close(x_s - info["m1"], math.sqrt(lam2) * z32.double(), rtol=0, atol=1e-14)


def test_a_step_without_a_randomness_source_names_what_it_needs():
    """StepRandomness without a Philox source refuses to draw, naming the missing noise or uniforms."""
    from gms_kernels.solvers import StepRandomness

    rand = StepRandomness(None, 5, torch.zeros(2, 1, 3))
    with pytest.raises(ValueError, match=r"needs noise: pass a generator/seed or explicit noise"):
        rand.normal()
    with pytest.raises(ValueError, match=r"needs uniform: pass a generator/seed or explicit uniform"):
        rand.uniform(False)


def test_an_open_interval_is_written_open_in_the_error():
    """_real's message names the option and what it is, and shows an open lower end as "(", a closed one as "["."""
    sched = gk.Schedule.linear(20)
    x, e1, _ = _inputs(7, shape=(2, 1, 2, 2))
    heads = torch.cat([e1, e1 * e1, e1**3], dim=1)
    with pytest.raises(ValueError, match=r"^variance_scale must be a number in \(0, 100\] \(the factor on Var\)"):
        gk.step(x, heads, 10, 5, sched, "gms", generator=0, variance_scale=0.0, backend="torch")
    with pytest.raises(ValueError, match=r"^eta must be a number in \[0, 1\] \(DDIM's eta\), got -0.5"):
        gk.step(x, e1, 10, 5, sched, "ddim", generator=0, eta=-0.5, backend="torch")


def test_the_fused_config_memo_keeps_option_types_apart():
    """The fused kernels' config memo keys each option by its type as well as its value: gaussian_last_step=1
    (== True, same hash) after a step with True must still be refused as not a bool, not served from the memo."""
    pytest.importorskip("gms_kernels._C")
    sched = gk.Schedule.linear(20)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(8))
    e1 = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(9))
    gk.step(x, e1, 10, 5, sched, "ddpm", generator=0, gaussian_last_step=True, backend="cpp")
    with pytest.raises(ValueError, match="gaussian_last_step must be True or False"):
        gk.step(x, e1, 10, 5, sched, "ddpm", generator=0, gaussian_last_step=1, backend="cpp")


@pytest.mark.parametrize("solver", ["ddpm", "ddpm-large", "ddim"])
def test_the_cpp_backend_runs_the_fixed_variance_and_ddim_steps_fused(solver, monkeypatch):
    """backend='cpp' runs ddpm, ddpm-large and ddim (the modes only the C++ kernel has) in its fused kernel,
    not in the float64 torch reference; the kernel's result is kept."""
    pytest.importorskip("gms_kernels._C")
    import gms_kernels.solvers.base as solvers

    calls = []
    real = solvers.fused_step

    def spy(backend, *args, **kwargs):
        calls.append(backend)
        return real(backend, *args, **kwargs)

    monkeypatch.setattr(solvers, "fused_step", spy)
    sched = gk.Schedule.linear(20)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(10))
    e1 = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(11))
    gk.step(x, e1, 10, 5, sched, solver, generator=0, backend="cpp")
    assert calls == ["cpp"]


def test_solver_step_reports_the_fitted_mixture_by_default():
    """solver_step's want_info defaults to True: the C++ GMS step hands back the fitted mu1, mu2, s2."""
    pytest.importorskip("gms_kernels._C")
    from gms_kernels.core.random import SampleNoise
    from gms_kernels.solvers import StepRandomness, solver_step

    sched = gk.Schedule.linear(20)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(12))
    e1 = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(13))
    heads = [e1, e1 * e1 + 0.1, e1**3]
    k = sched.coefficients(10, 5)
    rand = StepRandomness(SampleNoise.create(0, 2, 0), 10, x)
    _, info = solver_step("gms", x, heads, k, rand, (-1.0, 1.0), sched.T, {}, "cpp")
    assert set(info) == {"mu1", "mu2", "s2"} and info["mu1"].shape == x.shape


def test_the_denoised_last_step_reports_x0():
    """The step to data with denoise_final (the default) returns the clamped E[x0|x_t] and reports it as "x0"."""
    sched = gk.Schedule.linear()
    x, e1, z = _inputs(14)
    t = 300
    x0 = ((x - math.sqrt(1 - _abar(t)) * e1) / math.sqrt(_abar(t))).clamp(-1, 1)
    assert 0 < int((x0.abs() == 1).sum()) < x0.numel()
    got, info = gk.step(x, e1, t, -1, sched, "ddpm", noise=z, return_info=True, backend="torch")
    torch.testing.assert_close(got, x0, rtol=0, atol=1e-12)
    torch.testing.assert_close(info["x0"], x0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["cpp", "torch"])
@pytest.mark.parametrize("weights, message", [((0.5, 0.6), "sum to 1"), ((0.5, 0.5), "equal weights")])
def test_bad_mixture_weights_are_refused_on_every_backend(backend, weights, message):
    """resolve_options checks the weights for every backend: the fused C++ kernel (which reads w1 as given)
    must refuse weights that do not sum to 1, or equal weights, as the torch fit does."""
    if backend == "cpp":
        pytest.importorskip("gms_kernels._C")
    sched = gk.Schedule.linear(20)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(15))
    heads = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(16))
    with pytest.raises(ValueError, match=message):
        gk.step(x, heads, 10, 5, sched, "gms", generator=0, weights=weights, backend=backend)


@pytest.mark.parametrize("solver, key, value", [("ddim", "eta", 0.3), ("ddpm", "variance_interp", 0.3),
                                                ("ddpm", "clip_pixel", 1.5), ("gms", "variance_scale", 1.3),
                                                ("gms", "skew_threshold", 0.3), ("gms", "lr", 0.03),
                                                ("edm-sde", "s_churn", 0.3), ("edm-sde", "s_tmin", 0.3),
                                                ("edm-sde", "s_tmax", 5.3), ("edm-sde", "s_noise", 1.3),
                                                ("seeds-2", "r", 0.3), ("ggf", "eps_abs", 0.3), ("ggf", "eps_rel", 0.3),
                                                ("ggf", "h_init", 0.3), ("ggf", "exponent", 0.3),
                                                ("ggf", "safety", 0.3)])
def test_real_options_are_resolved_to_python_floats(solver, key, value):
    """A real-valued option given as a NumPy float32 comes back from resolve_options as the Python float of
    the same value (under NumPy 2 a float32 would otherwise pull the float64 reference's arithmetic down to
    float32); e.g. DDIM with eta = float32(0.3) takes the same step as with eta = float(float32(0.3))."""
    import numpy as np

    from gms_kernels.solvers import SOLVERS, resolve_options

    v32 = np.float32(value)
    got = resolve_options(SOLVERS[solver], {key: v32}).as_dict()[key]
    assert type(got) is float and got == float(v32)
    if key == "eta":
        sched = gk.Schedule.linear()
        x, e1, z = _inputs(17)
        a = gk.step(x, e1, 500, 300, sched, "ddim", noise=z, eta=v32, backend="torch")
        b = gk.step(x, e1, 500, 300, sched, "ddim", noise=z, eta=float(v32), backend="torch")
        assert torch.equal(a, b)


def test_edm_sde_churn_bounds():
    """EDM's S_churn is any real number >= 0 (0 turns the churn off; Karras et al. use values like 0.5 to 80):
    0 and 0.5 are accepted as given, a negative one is refused with the option described."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    for churn in (0.0, 0.5, 80.0):
        assert resolve_options(SOLVERS["edm-sde"], {"s_churn": churn}).as_dict()["s_churn"] == churn
    with pytest.raises(ValueError, match=r"^s_churn must be a number in \[0, inf\] \(EDM's total churn S_churn\)"):
        resolve_options(SOLVERS["edm-sde"], {"s_churn": -0.1})
    with pytest.raises(ValueError, match=r"^s_tmin must be a number in \[0, inf\] \(EDM's lowest churned sigma S_tmin\)"):
        resolve_options(SOLVERS["edm-sde"], {"s_tmin": -0.1})
    with pytest.raises(ValueError, match=r"^s_tmax must be a number in \[2, inf\] \(EDM's highest churned sigma S_tmax, "
                                         r">= s_tmin\)"):
        resolve_options(SOLVERS["edm-sde"], {"s_tmin": 2.0, "s_tmax": 1.0})
    with pytest.raises(ValueError, match=r"^s_noise must be a number in \[0, 2\] \(EDM's noise inflation S_noise\)"):
        resolve_options(SOLVERS["edm-sde"], {"s_noise": 2.5})


def test_seeds_2_intermediate_point_lies_inside_the_step():
    """SEEDS-2's r is a fraction of the step in lambda, in (0, 1): 0.5 and 0.999 are accepted; 0, 1 and 1.5
    (a point beyond the step) are refused, with the option described."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    for r in (0.5, 0.999):
        assert resolve_options(SOLVERS["seeds-2"], {"r": r}).as_dict()["r"] == r
    for r in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"^r must be a number in \(0, 1\] \(SEEDS-2's intermediate point, a "
                                             r"fraction of the step in lambda\)"):
            resolve_options(SOLVERS["seeds-2"], {"r": r})
    with pytest.raises(ValueError, match=r"r must be a number in \(0, 1\)"):
        resolve_options(SOLVERS["seeds-2"], {"r": 1.0})


def test_ggf_option_errors_describe_the_option():
    """GGF's option errors name the option, its interval and what it is."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    cases = [({"eps_abs": 0.0}, r"^eps_abs must be a number in \(0, inf\] \(GGF's absolute tolerance\)"),
             ({"eps_rel": -1.0}, r"^eps_rel must be a number in \[0, inf\] \(GGF's relative tolerance\)"),
             ({"h_init": 0.0}, r"^h_init must be a number in \(0, 1\] \(GGF's first step in u in \[0, 1\]\)"),
             ({"exponent": 1.5}, r"^exponent must be a number in \(0, 1\] \(GGF's step-size exponent r\)"),
             ({"exponent": 0.0}, r"^exponent must be a number in \(0, 1\]"),
             ({"safety": 0.0}, r"^safety must be a number in \(0, 1\] \(GGF's safety factor theta\)")]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            resolve_options(SOLVERS["ggf"], options)


def test_ggf_max_attempts_bounds():
    """GGF's max_attempts is an integer in [1, 65535] (the per-sample noise counter holds 16 bits)."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    for m in (1, 65535):
        assert resolve_options(SOLVERS["ggf"], {"max_attempts": m}).as_dict()["max_attempts"] == m
    for m in (0, 65536, 2.0, True):
        with pytest.raises(ValueError, match=r"max_attempts must be an integer in \[1, 65535\]"):
            resolve_options(SOLVERS["ggf"], {"max_attempts": m})


def test_explicit_randomness_of_the_wrong_kind_is_named():
    """gk.step refuses explicit noise / uniforms that are not tensors (naming their type) or are misshapen
    (naming their shape), with a ValueError."""
    sched = gk.Schedule.linear(20)
    x, heads = torch.zeros(2, 1, 2, 2), torch.zeros(2, 3, 2, 2)
    with pytest.raises(ValueError, match=r"^noise must be a tensor shaped like x_t \(2, 1, 2, 2\), got list$"):
        gk.step(x, heads, 10, 5, sched, "gms", noise=[0.0])
    with pytest.raises(ValueError, match=r"^uniform must be a tensor .* got list$"):
        gk.step(x, heads, 10, 5, sched, "gms", uniform=[0.0])
    with pytest.raises(ValueError, match=r"^uniform must be a tensor .* got \(3,\)$"):
        gk.step(x, heads, 10, 5, sched, "gms", uniform=torch.zeros(3))


def test_check_sample_args_checks_the_schedule_range_and_backend():
    """check_sample_args refuses what sample() would: more steps than the given schedule's T, an empty data
    range, an unknown backend (and accepts the same call with good values)."""
    from gms_kernels.sampling import check_sample_args

    def model(x, t):
        return torch.zeros(x.shape[0], 3 * x.shape[1], *x.shape[2:])

    check_sample_args(model, steps=20, schedule=gk.Schedule.linear(20), data_range=(0.0, 1.0), backend="torch")
    with pytest.raises(ValueError, match=r"steps must be an integer in \[1, T = 20\], got 50"):
        check_sample_args(model, steps=50, schedule=gk.Schedule.linear(20))
    with pytest.raises(ValueError, match="data_range must satisfy low < high"):
        check_sample_args(model, data_range=(1.0, 0.0))
    with pytest.raises(ValueError, match="unknown backend 'bogus'"):
        check_sample_args(model, backend="bogus")


def test_the_deferred_finite_check_flag_is_one_int32_zero():
    """The NaN/inf flag a deferred check hands to the Triton kernel is what gk.step documents for
    nonfinite_flag: one int32 element, zero, on x_t's device; a set flag raises, naming the step."""
    from gms_kernels.sampling import DeferredFiniteCheck

    x = torch.zeros(2, 1, 2, 2)
    check = DeferredFiniteCheck(x, [torch.zeros_like(x)], "at step 3 ")
    assert check.flag.dtype == torch.int32 and check.flag.shape == (1,) and int(check.flag) == 0
    assert check.flag.device == x.device
    check.launched()
    check.raise_if_set()  # not set: nothing
    check.flag.fill_(1)
    with pytest.raises(ValueError, match="at step 3 has non-finite values"):
        check.raise_if_set()


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


def test_step_names_the_solver_that_lacks_heads():
    """gk.step with too few heads names the solver and the heads it needs."""
    x = torch.zeros(2, 1, 2, 2)
    with pytest.raises(ValueError, match=r"^solver 'gms' needs 3 head\(s\) \(e1 = E\[eps\]"):
        gk.step(x, torch.zeros(2, 2, 2, 2), 10, 5, gk.Schedule.linear(20), "gms", generator=0)


class _ScaledTimeModel(torch.nn.Module):
    """A zero eps model that declares ``time_input = "scaled"`` and records the first time value of each call."""
    time_input = "scaled"

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x, t):
        self.seen.append(float(t[0]))
        return torch.zeros_like(x)


def test_sample_reads_the_models_time_input_and_keeps_an_explicit_oracle():
    """gk.sample calls the model with its own time_input convention ("scaled": t * 1000 / T), and the exact
    solver uses an oracle passed as an option rather than the model."""
    scaled = _ScaledTimeModel()
    sched = gk.Schedule.linear(100)
    gk.sample(scaled, shape=(2, 1, 2, 2), steps=2, solver="ddim", schedule=sched, generator=0, progress=False,
              trajectory=[99, 49])
    assert scaled.seen == [990.0, 490.0]

    mean = torch.full((1, 2, 2), 0.5, dtype=torch.float64)
    model = gk.GaussianMixtureOracle([1.0], mean[None] * 0 - 0.5, [0.01], schedule=sched)
    oracle = gk.GaussianMixtureOracle([1.0], mean[None], [0.01], schedule=sched)
    x = gk.sample(model, shape=(4, 1, 2, 2), steps=5, solver="exact", schedule=sched, generator=0, progress=False,
                  oracle=oracle, dtype=torch.float64)
    assert torch.allclose(x, torch.full_like(x, 0.5), atol=0.1)  # the oracle's data (0.5), not the model's (-0.5)


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


class _Recorder:
    """Stand-ins for the CUDA objects of DeferredFiniteCheck's device branch, recording every call in ``log``."""

    def __init__(self):
        self.log = []
        rec = self

        class Flag:  # the kernel's flag "on the GPU": only its value and is_cuda; a synchronous read is refused
            is_cuda = True

            def __init__(self, value):
                self.value = torch.tensor([value], dtype=torch.int32)

            def item(self):
                raise AssertionError("the flag of a CUDA step was read with .item(), which waits for the whole queue")

        class Host:  # the pinned host buffer: starts as garbage, gets the flag's value only through copy_
            def __init__(self, size, dtype):
                self.data = torch.full(size, 77, dtype=dtype)

            def copy_(self, src, non_blocking=False):
                rec.log.append(("copy", src, non_blocking))
                self.data.copy_(src.value)
                return self

            def __getitem__(self, i):
                rec.log.append(("read", i))
                return self.data[i]

        class Event:
            def __init__(self, *args, **kwargs):
                rec.log.append(("event", args, kwargs))

            def record(self, *args, **kwargs):
                rec.log.append(("record", args, kwargs))

            def synchronize(self):
                rec.log.append(("synchronize",))

        def empty(*size, **kwargs):
            rec.log.append(("empty", size, kwargs))
            return Host(size, kwargs.get("dtype"))

        class Torch:  # the sampling module's torch, with torch.empty and torch.cuda.Event replaced
            def __getattr__(self, name):
                return getattr(torch, name)

        self.Flag = Flag
        self.torch = Torch()
        self.torch.empty = empty
        self.torch.cuda = type("cuda", (), {"Event": Event})


@pytest.mark.parametrize("value", [0, 1])
def test_the_deferred_finite_check_on_cuda_reads_the_flag_from_pinned_memory_after_its_event(value, monkeypatch):
    """The CUDA branch of DeferredFiniteCheck, pinned on the CPU with recording fakes (a flag whose is_cuda is
    True, torch.empty and torch.cuda.Event replaced in the sampling module): launched() allocates one pinned
    int32 host element, copies the flag into it with non_blocking=True and records an event after the copy;
    raise_if_set() waits on that event (not on the flag: .item() would wait for the whole queue), then reads
    element 0 of the host copy, and raises for a set flag only. (This checks the order and arguments of the
    calls, not what a GPU does with them.)"""
    from gms_kernels import sampling

    rec = _Recorder()
    x = torch.zeros(2, 1, 2, 2)
    check = sampling.DeferredFiniteCheck(x, [torch.zeros_like(x)], "at step 3 ")
    check.flag = flag = rec.Flag(value)  # as if the kernel had written it on the device
    monkeypatch.setattr(sampling, "torch", rec.torch)
    check.launched()
    assert rec.log == [("empty", (1,), {"dtype": torch.int32, "device": "cpu", "pin_memory": True}),
                       ("copy", flag, True), ("event", (), {}), ("record", (), {})]
    assert rec.log[1][1] is flag
    del rec.log[:]
    if value:
        with pytest.raises(ValueError, match="^x_t or the model output at step 3 has non-finite values"):
            check.raise_if_set()
    else:
        check.raise_if_set()
    assert rec.log == [("synchronize",), ("read", 0)]


def test_the_callbacks_denoised_is_clamped_to_the_sampling_data_range():
    """The callback's "denoised" is E[x0 | x_t] = (x_t - sigma_t e1) / a_t clamped to sample()'s data_range (here
    (0, 1), not the default (-1, 1)); without a range it is left unclamped. With e1 = 0 at t = 999 it is
    x_T / a_t, about 150 x_T, far outside either range."""
    def zero_eps(x, t):
        return torch.zeros_like(x)

    sched = gk.Schedule.linear(1000)
    x_T = torch.linspace(-1.0, 1.0, 8, dtype=torch.float64).reshape(2, 1, 2, 2)
    a_t = math.sqrt(float(sched.alphas_cumprod[999]))
    for data_range, expected in (((0.0, 1.0), (x_T / a_t).clamp(0.0, 1.0)), (None, x_T / a_t)):
        seen = []
        gk.sample(zero_eps, x_T=x_T, steps=2, solver="ddim", schedule=sched, trajectory=[999, 499], progress=False,
                  data_range=data_range, callback=seen.append, generator=0)
        assert seen[0]["t"] == 999
        torch.testing.assert_close(seen[0]["denoised"], expected, rtol=1e-12, atol=0)
    seen = []  # a float32 run hands out a float32 denoised, like its x
    gk.sample(zero_eps, x_T=x_T.float(), steps=2, solver="ddim", schedule=sched, trajectory=[999, 499], progress=False,
              callback=seen.append, generator=0)
    assert seen[0]["x"].dtype == seen[0]["denoised"].dtype == torch.float32


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


def _gamma_run(x0, sched, seed, **kwargs):
    """estimate_gamma with the identity "network" (e1 = x_t), recording every call's (x_t, time input)."""
    calls = []

    def identity(x, t):
        calls.append((x.clone(), t.clone()))
        return x.clone()

    model = kwargs.pop("model_class", None)
    if model is not None:
        model = model(identity)
    table = gk.estimate_gamma(model or identity, x0, sched, generator=torch.Generator().manual_seed(seed), **kwargs)
    return table, calls


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_estimate_gamma_draws_from_the_generator_in_batches_and_averages_in_float64(dtype):
    """Gamma_t = sum ||e1||^2 / (number of elements), summed in float64 over the batches of x0 (default 256),
    with x_t = a_t x0 + sigma_t eps and eps drawn from the given generator batch by batch in x0's dtype; every
    t of the schedule by default (T = 6 here), NaN at the t not asked for."""
    sched = gk.Schedule.linear(6)
    x0 = torch.randn(300, 1, 2, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    table, calls = _gamma_run(x0, sched, 7)
    assert table.dtype == torch.float64 and table.shape == (6,)
    assert len(calls) == 12  # 6 timesteps x 2 batches (256 + 44)
    g = torch.Generator().manual_seed(7)
    for t in range(6):
        total = 0.0
        for j, batch in enumerate(x0.split(256)):
            x_t, tin = calls[2 * t + j]
            assert tin.dtype == torch.long and tin.tolist() == [t] * batch.shape[0]  # the 0-based index by default
            eps = torch.randn(batch.shape, generator=g, dtype=dtype)
            assert x_t.dtype == dtype
            torch.testing.assert_close(x_t, sched.alpha(t) * batch + sched.sigma(t) * eps, rtol=1e-6, atol=1e-6)
            total += float(x_t.to(torch.float64).pow(2).sum())
        assert table[t].item() == total / x0.numel()  # exactly: float64 sums of the float64 squares
    table, calls = _gamma_run(x0, sched, 7, timesteps=[4, 1], batch_size=100)
    assert len(calls) == 6 and [int(c[1][0]) for c in calls] == [4, 4, 4, 1, 1, 1]
    assert table[[0, 2, 3, 5]].isnan().all() and not table[[1, 4]].isnan().any()


def test_estimate_gamma_calls_the_model_with_its_time_input():
    """estimate_gamma passes t as the model's ``time_input`` says ("scaled": t * 1000 / T as float) unless the
    caller names one; a model output with too few channels is refused naming the solver that needs it."""
    sched = gk.Schedule.linear(20)
    x0 = torch.zeros(2, 1, 2, 2)

    def scaled(fn):
        class Scaled(torch.nn.Module):
            time_input = "scaled"

            def forward(self, x, t):
                return fn(x, t)

        return Scaled()

    _, calls = _gamma_run(x0, sched, 0, model_class=scaled, timesteps=[5])
    assert calls[0][1].dtype == torch.float32 and calls[0][1].tolist() == [250.0, 250.0]
    _, calls = _gamma_run(x0, sched, 0, model_class=scaled, timesteps=[5], time_input="index+1")
    assert calls[0][1].tolist() == [6, 6]
    with pytest.raises(ValueError, match="unknown time_input 'bogus'"):
        _gamma_run(x0, sched, 0, timesteps=[5], time_input="bogus")
    with pytest.raises(ValueError, match=r"^solver 'analytic-dpm' needs 1 head"):
        gk.estimate_gamma(lambda x, t: torch.zeros(2, 0, 2, 2), x0, sched, timesteps=[5])


def test_check_sample_args_uses_samples_default_steps_and_the_given_time_input():
    """check_sample_args has sample()'s defaults (10 steps: accepted for a T = 10 schedule) and refuses a
    time_input that sample() would refuse."""
    from gms_kernels.sampling import check_sample_args

    def model(x, t):
        return torch.zeros(x.shape[0], 3 * x.shape[1], *x.shape[2:])

    check_sample_args(model, schedule=gk.Schedule.linear(10))
    check_sample_args(model, time_input="scaled")
    with pytest.raises(ValueError, match="unknown time_input 'bogus'"):
        check_sample_args(model, time_input="bogus")


def test_the_deferred_finite_check_flag_lives_on_x_ts_device():
    """The flag is made on x_t's device (the meta device here, so that a CPU run can tell it from the default)."""
    from gms_kernels.sampling import DeferredFiniteCheck

    x = torch.zeros(2, 1, 2, 2, device="meta")
    check = DeferredFiniteCheck(x, [], "at step 0 ")
    assert check.flag.device.type == "meta" and check.flag.dtype == torch.int32 and check.flag.shape == (1,)


def test_scheduler_add_noise_keeps_the_samples_device():
    """add_noise moves a_t, sigma_t and the noise to the sample's device (the meta device here, so that a CPU run
    can tell it from the CPU the schedule lives on; mixing the two raises)."""
    from gms_kernels import GMSScheduler

    s = GMSScheduler(solver="ddpm")
    x0 = torch.zeros(2, 1, 2, 2, device="meta")
    for noise in (torch.zeros(2, 1, 2, 2, device="meta"), torch.zeros(2, 1, 2, 2)):
        out = s.add_noise(x0, noise, torch.tensor([10, 20]))
        assert out.device.type == "meta" and out.dtype == torch.float32 and out.shape == x0.shape


def test_a_set_deferred_flag_names_the_non_finite_input():
    """A set flag with a NaN in x_t names x_t itself (the inputs kept for that); with a NaN in a head, the head."""
    from gms_kernels.sampling import DeferredFiniteCheck

    x = torch.zeros(2, 1, 2, 2)
    x[1, 0, 0, 0] = float("nan")
    check = DeferredFiniteCheck(x, [torch.zeros_like(x)], "at step 3 ")
    check.flag.fill_(1)
    with pytest.raises(ValueError, match=r"^x_t at step 3 has non-finite values"):
        check.raise_if_set()
    e1 = torch.zeros(2, 1, 2, 2)
    e1[0, 0, 1, 1] = float("inf")
    check = DeferredFiniteCheck(torch.zeros_like(x), [e1], "at step 3 ")
    check.flag.fill_(1)
    with pytest.raises(ValueError, match=r"^model output at step 3 has non-finite values \(NaN or inf\) in head e1"):
        check.raise_if_set()


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
    from gms_kernels import GMSScheduler, scheduler as sched_module

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
    from gms_kernels.integrations.scheduler import make_betas

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
    from gms_kernels.integrations.scheduler import make_betas

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


def _step_inputs(n=4):
    g = torch.Generator().manual_seed(31)
    x = torch.randn(n, 1, 4, 4, generator=g)
    heads = torch.cat([torch.randn(n, 1, 4, 4, generator=g) * 0.3, torch.rand(n, 1, 4, 4, generator=g) + 0.2,
                       torch.zeros(n, 1, 4, 4)], 1)
    return x, heads


def test_gk_step_noise_sources_first_index_explicit_uniforms_and_the_seed_memo():
    """gk.step's randomness: with a torch.Generator, first_index = 2 on the last two samples draws what the full
    batch draws for them; explicit uniforms alone still take the noise from the generator (a GMS step that selects
    mixture components per sample needs both); an int seed's per-sample noise source is built once and reused by
    the following calls with that seed and batch (the memo a gk.step loop relies on)."""
    from gms_kernels import sampling

    sched = gk.Schedule.linear(100)
    x, heads = _step_inputs()
    full = gk.step(x, heads, 50, 30, sched, "gms", torch.Generator().manual_seed(5))
    tail = gk.step(x[2:], heads[2:], 50, 30, sched, "gms", torch.Generator().manual_seed(5), first_index=2)
    assert torch.equal(full[2:], tail)
    u = torch.rand(4, generator=torch.Generator().manual_seed(6))
    with_u = gk.step(x, heads, 50, 30, sched, "gms", 5, uniform=u)
    assert with_u.shape == x.shape and torch.isfinite(with_u).all()
    assert torch.equal(with_u, gk.step(x, heads, 50, 30, sched, "gms", 5, uniform=u))
    sampling._seeded_noise.cache_clear()
    gk.step(x, heads, 50, 30, sched, "gms", 11)
    gk.step(x, heads, 30, 10, sched, "gms", 11)
    info = sampling._seeded_noise.cache_info()
    assert (info.misses, info.hits) == (1, 1)


def test_gk_step_takes_no_model_output_for_the_exact_solver():
    """The exact solver reads no network heads: gk.step accepts model_output=None for it (the oracle gives the
    moments)."""
    sched = gk.Schedule.linear(100)
    oracle = gk.GaussianMixtureOracle([1.0], torch.full((1, 1, 2, 2), 0.5, dtype=torch.float64), [0.01],
                                      schedule=sched)
    x = torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(2))
    out = gk.step(x, None, 50, 30, sched, "exact", 0, oracle=oracle)
    assert out.shape == x.shape and torch.isfinite(out).all()


def test_misshapen_explicit_noise_is_named_by_its_shape_and_sample_takes_10_steps_by_default():
    """Explicit noise of the wrong shape is refused naming its shape; gk.sample's default is steps=10 (the same
    network calls as steps=10 given explicitly, not those of 11)."""
    sched = gk.Schedule.linear(100)
    x, heads = torch.zeros(2, 1, 2, 2), torch.zeros(2, 3, 2, 2)
    with pytest.raises(ValueError, match=r"^noise must be a tensor shaped like x_t \(2, 1, 2, 2\), got \(3, 1, 2, 2\)"):
        gk.step(x, heads, 10, 5, sched, "gms", noise=torch.zeros(3, 1, 2, 2))

    def times(**kwargs):
        seen = []

        def model(x, t):
            seen.append(int(t[0]))
            return torch.zeros_like(x)

        gk.sample(model, shape=(1, 1, 2, 2), solver="ddim", schedule=sched, generator=0, progress=False, **kwargs)
        return seen

    assert times() == times(steps=10) != times(steps=11)


def test_sample_without_a_model_draws_16_digits_with_a_progress_bar_by_default(monkeypatch):
    """gk.sample() with no model and no shape samples 16 images of the embedded digits model (shape (16, 1, 8, 8)),
    and gk.sample shows its progress bar unless told not to, labelled with the solver and K, not left on screen."""
    from gms_kernels import sampling
    from gms_kernels.models.embedded import DIGITS_SHAPE

    enabled = []
    real_bar = sampling.progress_bar

    def bar(iterable, progress, **kwargs):
        enabled.append((progress, kwargs))
        return real_bar(iterable, False, **kwargs)

    monkeypatch.setattr(sampling, "progress_bar", bar)
    x = gk.sample(steps=1, generator=0)
    assert x.shape == (16, *DIGITS_SHAPE) and tuple(DIGITS_SHAPE) == (1, 8, 8) and torch.isfinite(x).all()
    assert enabled == [(True, {"desc": "gms K=1", "leave": False})]  # labelled, and cleared when done


def test_sample_names_a_bad_shape():
    """A shape with a zero or a negative entry is refused naming the argument: "shape (N, C, ...)"."""
    def model(x, t):
        return torch.zeros_like(x)

    for shape in ((0, 1, 2, 2), (2, -1, 2)):
        with pytest.raises(ValueError, match=r"^shape \(N, C, \.\.\.\) must hold positive integers, got "):
            gk.sample(model, shape=shape, steps=2, solver="ddim", schedule=gk.Schedule.linear(20), progress=False)


def test_sample_draws_x_T_at_time_zero_of_the_initial_stream_and_names_a_bad_x_T():
    """gk.sample(shape=..., generator=seed) starts from the seed's initial-noise stream at time field 0: the same
    samples as gk.sample(x_T=SampleNoise.create(seed, N).normal(STREAM_INITIAL, 0, shape[1:])); an x_T without
    a channel dimension is refused naming x_T."""
    from gms_kernels.core.random import STREAM_INITIAL, SampleNoise

    def model(x, t):
        return 0.1 * x

    sched = gk.Schedule.linear(50)
    kwargs = dict(steps=3, solver="ddpm", schedule=sched, progress=False)
    x_T = SampleNoise.create(4, 3).normal(STREAM_INITIAL, 0, (1, 2, 2), "cpu")
    assert torch.equal(gk.sample(model, shape=(3, 1, 2, 2), generator=4, **kwargs),
                       gk.sample(model, x_T=x_T, generator=4, **kwargs))
    assert not torch.equal(x_T, SampleNoise.create(4, 3).normal(STREAM_INITIAL, 1, (1, 2, 2), "cpu"))
    with pytest.raises(ValueError, match=r"^x_T must be \[N, C, \.\.\.\]"):
        gk.sample(model, x_T=torch.zeros(4), **kwargs)


def test_sample_checks_a_shape_given_with_x_T():
    """A shape passed together with x_T must be x_T's shape: the same shape is accepted (same samples as without
    it), another is refused naming both."""
    def model(x, t):
        return 0.1 * x

    kwargs = dict(steps=2, solver="ddim", schedule=gk.Schedule.linear(20), progress=False, generator=0)
    x_T = torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(8))
    assert torch.equal(gk.sample(model, shape=(3, 1, 2, 2), x_T=x_T, **kwargs), gk.sample(model, x_T=x_T, **kwargs))
    with pytest.raises(ValueError, match=r"^shape \(2, 1, 2, 2\) does not match x_T's shape \(3, 1, 2, 2\)"):
        gk.sample(model, shape=[2, 1, 2, 2], x_T=x_T, **kwargs)


def test_sample_resolves_the_backend_it_is_given_and_tells_multi_call_solvers_T(monkeypatch):
    """gk.sample passes the named backend to every step (torch stays torch; auto picks the float64 torch step for
    a float64 sample and the C++ one for float32 on a CPU), and a multi-call solver (SEEDS-2) calls a "scaled"
    model with t * 1000 / T of the schedule."""
    from gms_kernels import sampling

    used = []
    real = sampling.solver_step

    def spy(solver, x, heads, k, rand, data_range, T, options, backend, *args):
        used.append(backend)
        return real(solver, x, heads, k, rand, data_range, T, options, backend, *args)

    monkeypatch.setattr(sampling, "solver_step", spy)

    def model(x, t):
        return torch.zeros_like(x)

    from gms_kernels.kernels import cpp

    sched = gk.Schedule.linear(20)
    for backend, dtype, expected in (("torch", torch.float32, "torch"), ("auto", torch.float64, "torch"),
                                     ("auto", torch.float32, "cpp" if cpp.available() else "torch")):
        used.clear()
        gk.sample(model, shape=(2, 1, 2, 2), steps=2, solver="ddim", schedule=sched, generator=0, progress=False,
                  backend=backend, dtype=dtype)
        assert used and set(used) == {expected}, (backend, dtype, used)
    scaled = _ScaledTimeModel()
    gk.sample(scaled, shape=(2, 1, 2, 2), steps=2, solver="seeds-2", schedule=gk.Schedule.linear(100), generator=0,
              progress=False, trajectory=[99, 49])
    assert scaled.seen[0] == 990.0 and all(0.0 <= v <= 990.0 for v in scaled.seen)


def test_sample_hands_multi_call_solvers_its_data_range_progress_flag_and_solver_name(monkeypatch):
    """For a multi-call solver (SEEDS-2) gk.sample passes on its data_range (the final denoised sample lies in
    (0, 1), unlike without a range), its progress flag (True by default, False when asked), and the solver's
    name for the heads check."""
    from gms_kernels.solvers import seeds as sde

    flags = []
    real_bar = sde.progress_bar

    def bar(iterable, progress, **kwargs):
        flags.append(progress)
        return real_bar(iterable, False, **kwargs)

    monkeypatch.setattr(sde, "progress_bar", bar)

    def model(x, t):
        return -0.5 * torch.ones_like(x)  # E[x0 | x_t] well above 1 at the last step

    kwargs = dict(shape=(2, 1, 2, 2), steps=2, solver="seeds-2", schedule=gk.Schedule.linear(50), generator=0)
    x = gk.sample(model, data_range=(0.0, 1.0), **kwargs)
    assert flags == [True] and x.min() >= 0.0 and x.max() <= 1.0
    free = gk.sample(model, data_range=None, progress=False, **kwargs)
    assert flags == [True, False] and free.max() > 1.0
    with pytest.raises(ValueError, match=r"^solver 'seeds-2' needs 1 head"):
        gk.sample(lambda x, t: torch.zeros(x.shape[0], 0, *x.shape[2:]), progress=False, **kwargs)


def test_sample_triton_loop_defers_the_finite_check_unless_a_callback_watches(monkeypatch):
    """gk.sample's Triton loop, run on the CPU with resolve_backend answering "triton" and each step done by the
    torch backend (recording the flag it is handed): without a callback every step gets an int32 zero flag, read
    once the next step's network call is made (a flag set at step 0 raises after the model's second call, naming
    step 0); with a callback, or on another backend, no flag is handed (the check is immediate)."""
    from gms_kernels import sampling

    handed, calls = [], []
    real = sampling.solver_step

    def torch_step(solver, x, heads, k, rand, data_range, T, options, backend, want_info, where, flag):
        handed.append(flag)
        out = real(solver, x, heads, k, rand, data_range, T, options, "torch", want_info, where, None)
        if flag is not None and set_at == len(handed) - 1:
            flag.fill_(1)  # as if the kernel had met a NaN here
        return out

    def model(x, t):
        calls.append(int(t[0]))
        return torch.zeros_like(x)

    monkeypatch.setattr(sampling, "solver_step", torch_step)
    kwargs = dict(shape=(2, 1, 2, 2), steps=3, solver="ddim", schedule=gk.Schedule.linear(30), generator=0,
                  progress=False, trajectory=[29, 19, 9])
    set_at = None
    monkeypatch.setattr(sampling, "resolve_backend", lambda *args, **kwargs: "triton")
    gk.sample(model, **kwargs)
    assert len(handed) == 3 and all(f is not None and f.dtype == torch.int32 and f.shape == (1,) for f in handed)
    handed.clear()
    gk.sample(model, callback=lambda info: None, **kwargs)
    assert handed == [None, None, None]
    handed.clear()
    calls.clear()
    set_at = 0
    with pytest.raises(ValueError, match=r"^x_t or the model output at step 0 \(t=29\) has non-finite values"):
        gk.sample(model, **kwargs)
    assert calls == [29, 19] and len(handed) == 1  # read after the second network call, before the second step
    monkeypatch.setattr(sampling, "resolve_backend", lambda *args, **kwargs: "cpp")
    handed.clear()
    set_at = None
    gk.sample(model, **kwargs)
    assert handed == [None, None, None]


def test_log_alpha_bar_at_holds_its_end_values_outside_0_1_and_weights_must_be_positive():
    """log_alpha_bar_at clamps continuous time to [0, 1] (no extrapolation past the last knot: u = 1.5 gives
    log abar_{T-1}, u = -0.5 gives 0); mixture weights (1, 0) are refused (both must be positive)."""
    from gms_kernels.core.fit import check_weights

    sched = gk.Schedule.linear(10)
    last = math.log(float(sched.alphas_cumprod[-1]))
    got = sched.log_alpha_bar_at(torch.tensor([1.5, 1.0, -0.5, 0.0]))
    torch.testing.assert_close(got, torch.tensor([last, last, 0.0, 0.0], dtype=torch.float64), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="weights must be positive and sum to 1"):
        check_weights((1.0, 0.0))


def test_a_callback_on_a_headless_solver_calls_the_model_with_its_time_input():
    """With the exact solver (no network heads) a callback's denoised needs e1, so gk.sample calls the model once
    per step for it, with the model's time_input ("scaled": t * 1000 / T); a model output without channels is
    refused naming the solver."""
    sched = gk.Schedule.linear(100)
    oracle = gk.GaussianMixtureOracle([1.0], torch.full((1, 1, 2, 2), 0.5, dtype=torch.float64), [0.01],
                                      schedule=sched)
    seen, infos = [], []

    class Scaled(torch.nn.Module):
        time_input = "scaled"

        def __init__(self, channels):
            super().__init__()
            self.channels = channels

        def forward(self, x, t):
            seen.append(float(t[0]))
            return torch.zeros(x.shape[0], self.channels, *x.shape[2:])

    kwargs = dict(shape=(2, 1, 2, 2), steps=2, solver="exact", schedule=sched, generator=0, progress=False,
                  trajectory=[99, 49], oracle=oracle, callback=infos.append)
    gk.sample(Scaled(1), **kwargs)
    assert seen == [990.0, 490.0] and len(infos) == 2
    with pytest.raises(ValueError, match=r"^solver 'exact' needs 1 head"):
        gk.sample(Scaled(0), **kwargs)


def test_sample_refuses_an_unknown_option_of_the_exact_solver():
    """The exact solver's options are checked as given (the model is only added as its default oracle): an unknown
    option is refused, not dropped."""
    sched = gk.Schedule.linear(20)
    oracle = gk.GaussianMixtureOracle([1.0], torch.zeros(1, 1, 2, 2, dtype=torch.float64), [0.01], schedule=sched)
    with pytest.raises(ValueError, match=r"unknown option\(s\) bogus for solver 'exact'"):
        gk.sample(oracle, shape=(2, 1, 2, 2), steps=2, solver="exact", schedule=sched, progress=False, bogus=1)


class _CountingOracle(torch.nn.Module):
    """An exact-heads Gaussian-mixture model that counts its calls and can return NaN."""

    def __init__(self, schedule, nan=False):
        super().__init__()
        self.oracle = gk.GaussianMixtureOracle([0.5, 0.5], torch.tensor([[[[-0.5]]], [[[0.5]]]], dtype=torch.float64),
                                               [0.02, 0.02], schedule=schedule)
        self.calls, self.nan = 0, nan

    def forward(self, x, t):
        self.calls += 1
        out = self.oracle(x, t)
        return torch.full_like(out, float("nan")) if self.nan else out


def test_sample_passes_T_to_the_fused_step_with_the_papers_learning_rates():
    """gk.sample hands the schedule's T to the fused step: ADAN with lr="paper" needs it for its rate table, and
    the C++ step then follows the float64 torch step."""
    from gms_kernels.kernels import cpp

    if not cpp.available():
        pytest.fail("the C++ extension is missing (CI builds it)")
    sched = gk.Schedule.linear(50)
    runs = [gk.sample(_CountingOracle(sched), shape=(3, 1, 1, 1), steps=3, solver="gms", schedule=sched, generator=0,
                      progress=False, fit="adan", lr="paper", backend=backend) for backend in ("cpp", "torch")]
    assert torch.allclose(runs[0], runs[1], atol=1e-3)


def test_sample_with_a_callback_reuses_the_step_heads_and_names_the_step_of_a_bad_recomputed_e1():
    """With a callback, gk.sample makes no extra network call for a solver that has heads (e1 is heads[0]); for
    the exact solver (no heads) it calls the model once more per step for e1, and a NaN there is reported with
    the step it happened at."""
    sched = gk.Schedule.linear(50)
    model = _CountingOracle(sched)
    gk.sample(model, shape=(2, 1, 1, 1), steps=4, solver="sn-ddpm", schedule=sched, generator=0, progress=False,
              callback=lambda info: None)
    assert model.calls == len(gk.trajectory(sched, 4, "even"))
    bad = _CountingOracle(sched, nan=True)
    with pytest.raises(ValueError, match=r"at step 0 \(t=49\) has non-finite values"):
        gk.sample(bad, shape=(2, 1, 1, 1), steps=4, solver="exact", schedule=sched, generator=0, progress=False,
                  oracle=model.oracle, callback=lambda info: None)


def test_resolved_weights_are_a_pair_of_python_floats():
    """resolve_options hands the fit its weights as the checked pair of Python floats, whatever sequence the
    caller gave: a list of NumPy float32 values comes back as the tuple (0.25, 0.75)."""
    import numpy as np

    from gms_kernels.solvers import SOLVERS, resolve_options

    got = resolve_options(SOLVERS["gms"], {"weights": [np.float32(0.25), np.float32(0.75)]}).as_dict()["weights"]
    assert type(got) is tuple and [type(w) for w in got] == [float, float] and got == (0.25, 0.75)


def test_the_fused_backends_run_every_fusable_solver_and_leave_the_rest_to_the_float64_step(fused_kernel_calls):
    """solver_step hands ddpm, ddim and gms to the fused kernel of the backend asked for (Triton has every mode
    the C++ kernel has), and a step whose option no kernel implements (gms with variance_scale) to the float64
    torch step, with no kernel call."""
    import gms_kernels.solvers.base as solvers
    from gms_kernels.core.random import SampleNoise

    calls = fused_kernel_calls
    sched = gk.Schedule.linear(20)
    k = sched.coefficients(10, 5)
    x, e1, _ = _inputs(18, shape=(2, 1, 2, 2))
    gms_heads = [e1, e1 * e1 + 0.1, e1**3]

    def run(solver, heads, backend, options=None):
        rand = solvers.StepRandomness(SampleNoise.create(3, 2), 10, x)
        return solvers.solver_step(solver, x, heads, k, rand, (-1.0, 1.0), sched.T, options or {}, backend)[0]

    for backend in ("triton", "cpp"):
        calls.clear()
        run("ddpm", [e1], backend)
        run("ddim", [e1], backend, {"eta": 0.5})
        run("gms", gms_heads, backend)
        assert calls == [backend] * 3
    calls.clear()
    got = run("gms", gms_heads, "triton", {"variance_scale": 1.5})
    assert calls == [] and torch.equal(got, run("gms", gms_heads, "torch", {"variance_scale": 1.5}))


def test_a_fused_step_on_another_device_gets_the_seeds_there_after_the_counter_check(monkeypatch):
    """When x_t is not on the Philox seeds' device, solver_step checks the counter range on the host (elements
    per sample = C*H*W) and hands the fused kernel the seeds and indices moved to x_t's device. The meta device
    stands in for a GPU: with 4 x 8 x 8 = 256 elements per sample, the sample indices must stay below
    2^40 / 256 = 2^32, so indices 2^32 - 2 and 2^32 - 1 pass and 2^32 - 1, 2^32 are refused."""
    import gms_kernels.solvers.base as solvers
    from gms_kernels.core.random import SampleNoise

    seen = []

    def fake_fused_step(backend, x_t, e1, e2, e3, seeds, indices, *args):
        seen.append((seeds.device.type, indices.device.type, indices.tolist() if indices.device.type == "cpu"
                     else None))
        return x_t, None

    monkeypatch.setattr(solvers, "fused_step", fake_fused_step)
    sched = gk.Schedule.linear(20)
    k = sched.coefficients(10, 5)
    x = torch.zeros(2, 4, 8, 8, device="meta")
    heads = [torch.zeros(2, 4, 8, 8, device="meta") for _ in range(3)]

    def run(first_index):
        rand = solvers.StepRandomness(SampleNoise.create(0, 2, first_index), 10, x)
        return solvers.solver_step("gms", x, heads, k, rand, (-1.0, 1.0), sched.T, {}, "cpp")

    run(2**32 - 2)
    assert seen == [("meta", "meta", None)]
    with pytest.raises(ValueError, match="sample indices must lie in"):
        run(2**32 - 1)
    assert len(seen) == 1


@pytest.mark.parametrize("solver, options, message", [
    ("ddpm", {"clip_pixel": 0.0},
     r"^clip_pixel must be a number in \(0, inf\] \(the last step's std cap in pixel levels\), got 0.0$"),
    ("gms", {"lr": 200.0}, r"^lr must be a number in \[1e-10, 100\] \(ADAN's learning rate\), got 200.0$"),
    ("ddpm", {"variance_interp": 1.5},
     r"^variance_interp must be a number in \[0, 1\] \(the log-space weight of beta_\{t\|s\} in DDPM's variance\), "
     r"got 1.5$"),
    ("gms", {"skew_threshold": -1.0},
     r"^skew_threshold must be a number in \[0, inf\] \(the standardized skewness at or below which GMS draws a "
     r"Gaussian\), got -1.0$")])
def test_the_remaining_real_option_errors_describe_the_option(solver, options, message):
    """Each real-valued option's error names the option, its interval (open ends as "(") and what it is: the
    last step's pixel cap, ADAN's learning rate, DDPM's variance interpolation and GMS's skewness threshold."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    with pytest.raises(ValueError, match=message):
        resolve_options(SOLVERS[solver], options)


@pytest.mark.parametrize("solver, key, low, high, open_low, interval", [
    ("ddpm", "clip_pixel", 0.0, None, True, "(0, inf]"),
    ("gms", "lr", 1e-10, 100.0, False, "[1e-10, 100]"),
    ("ddim", "eta", 0.0, 1.0, False, "[0, 1]"),
    ("ddpm", "variance_interp", 0.0, 1.0, False, "[0, 1]"),
    ("gms", "variance_scale", 0.0, 100.0, True, "(0, 100]"),
    ("gms", "skew_threshold", 0.0, None, False, "[0, inf]"),
    ("edm-sde", "s_churn", 0.0, None, False, "[0, inf]"),
    ("edm-sde", "s_noise", 0.0, 2.0, False, "[0, 2]"),
    ("ggf", "eps_abs", 0.0, None, True, "(0, inf]"),
    ("ggf", "eps_rel", 0.0, None, False, "[0, inf]"),
    ("ggf", "h_init", 0.0, 1.0, True, "(0, 1]"),
    ("ggf", "exponent", 0.0, 1.0, True, "(0, 1]"),
    ("ggf", "safety", 0.0, 1.0, True, "(0, 1]")])
def test_every_real_option_takes_the_ends_of_its_interval_and_refuses_just_past_them(solver, key, low, high,
                                                                                      open_low, interval):
    """Each real-valued option accepts the closed ends of its documented interval (returned as given) and the
    first float inside an open end, and refuses the open end itself and the first float past a closed one,
    naming the option and the interval. An unbounded option takes 1e300 (inf itself is refused as not finite)."""
    import re

    from gms_kernels.solvers import SOLVERS, resolve_options

    def ok(value):
        assert resolve_options(SOLVERS[solver], {key: value}).as_dict()[key] == value

    def refused(value):
        with pytest.raises(ValueError, match="^" + re.escape(f"{key} must be a number in {interval} (")):
            resolve_options(SOLVERS[solver], {key: value})

    if open_low:
        refused(low)
        ok(math.nextafter(low, math.inf))
    else:
        ok(low)
        refused(math.nextafter(low, -math.inf))
    if high is None:
        ok(1e300)
        refused(math.inf)
    else:
        ok(high)
        refused(math.nextafter(high, math.inf))


def test_edm_sde_s_tmin_and_s_tmax_ends():
    """S_tmin is any real >= 0 and S_tmax any real >= S_tmin (equal ends allowed): [0, 0] and [2, 2] are accepted;
    S_tmin just below 0 and S_tmax just below S_tmin are refused, S_tmax's interval written from S_tmin."""
    from gms_kernels.solvers import SOLVERS, resolve_options

    edm = SOLVERS["edm-sde"]
    for tmin in (0.0, 2.0):
        o = resolve_options(edm, {"s_tmin": tmin, "s_tmax": tmin})
        assert (o.s_tmin, o.s_tmax) == (tmin, tmin)
    with pytest.raises(ValueError, match=r"^s_tmin must be a number in \[0, inf\]"):
        resolve_options(edm, {"s_tmin": math.nextafter(0.0, -1.0), "s_tmax": 1.0})
    with pytest.raises(ValueError, match=r"^s_tmax must be a number in \[2, inf\]"):
        resolve_options(edm, {"s_tmin": 2.0, "s_tmax": math.nextafter(2.0, 0.0)})



@pytest.mark.parametrize("solver, key, value, kind", [("gms", "fit_iters", "int64", int),
                                                      ("ggf", "max_attempts", "int64", int),
                                                      ("gms", "var_floor", "float32", float)])
def test_integer_and_var_floor_options_are_resolved_to_python_numbers(solver, key, value, kind):
    """fit_iters and max_attempts given as a NumPy int64, and var_floor as a NumPy float32, come back from
    resolve_options as the Python int or float of the same value (as the other real options do)."""
    import numpy as np

    from gms_kernels.solvers import SOLVERS, resolve_options

    given = getattr(np, value)(7 if kind is int else 0.25)
    got = resolve_options(SOLVERS[solver], {key: given}).as_dict()[key]
    assert type(got) is kind and got == (7 if kind is int else 0.25)


def test_solver_step_runs_the_float64_torch_step_unless_a_backend_is_named():
    """solver_step's backend defaults to the float64 torch reference, even with a Philox source that a fused
    kernel could draw from: a float32 x_t gives a float64 x_s, the same as with backend='torch'."""
    from gms_kernels.core.random import SampleNoise
    from gms_kernels.solvers import StepRandomness, solver_step

    sched = gk.Schedule.linear(20)
    k = sched.coefficients(10, 5)
    x = torch.randn(2, 1, 2, 2, generator=torch.Generator().manual_seed(19))
    e1 = torch.randn(2, 1, 2, 2, generator=torch.Generator().manual_seed(20))

    def run(*backend):
        rand = StepRandomness(SampleNoise.create(4, 2), 10, x)
        return solver_step("ddpm", x, [e1], k, rand, (-1.0, 1.0), sched.T, {}, *backend)[0]

    got = run()
    assert got.dtype == torch.float64
    assert torch.equal(got, run("torch"))



def test_float32_inputs_enter_the_float64_step_exactly():
    """solver_step's torch path is the float64 reference: it widens a float32 x_t before it scales it, so
    ddpm's x_s (noise 0) is c_xt x_t + c_x0 x0 (DDPM Eq. 7, x0 the clamped estimate) in float64 arithmetic to
    1e-13 (c_xt x_t taken in float32 errs by ~1e-8)."""
    from gms_kernels.solvers import StepRandomness, solver_step

    sched = gk.Schedule.linear()
    x, e1, _ = (v.float() for v in _inputs(22))
    t, s = 700, 500
    c_xt, c_x0, _ = _posterior(t, s)
    x64, e64 = x.double(), e1.double()
    x0 = ((x64 - math.sqrt(1 - _abar(t)) * e64) / math.sqrt(_abar(t))).clamp(-1, 1)
    rand = StepRandomness(None, t, x, noise=torch.zeros_like(x64))
    x_s, _ = solver_step("ddpm", x, [e1], sched.coefficients(t, s), rand, (-1.0, 1.0), sched.T, {})
    assert x_s.dtype == torch.float64
    torch.testing.assert_close(x_s, c_xt * x64 + c_x0 * x0, rtol=0, atol=1e-13)


def test_step_randomness_lives_on_x_ts_device():
    """StepRandomness asks its Philox source for noise and uniforms on x_t's device and hands explicit host
    noise and uniforms back on that device (the meta device stands in for a GPU; a recording source stands
    in for SampleNoise)."""
    from gms_kernels.solvers import StepRandomness

    like = torch.zeros(2, 1, 3, device="meta")
    asked = []

    class RecordingSource:
        def normal(self, stream, t, shape, device):
            asked.append(("normal", tuple(shape), device))
            return torch.zeros(2, *shape, device=device)

        def uniform(self, stream, t, shape, device):
            asked.append(("uniform", tuple(shape), device))
            return torch.zeros(2, *shape, device=device)

    rand = StepRandomness(RecordingSource(), 5, like)
    assert rand.normal().device.type == "meta" and rand.uniform(True).device.type == "meta"
    assert asked == [("normal", (1, 3), like.device), ("uniform", (1, 3), like.device)]
    explicit = StepRandomness(None, 5, like, noise=torch.zeros(2, 1, 3), uniform=torch.zeros(2))
    noise, uniform = explicit.normal(), explicit.uniform(False)
    assert (noise.device.type, noise.dtype) == ("meta", torch.float64) and uniform.device.type == "meta"


@pytest.mark.parametrize("solver", ["ddpm", "gms"])
@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_denoise_final_must_be_a_bool(solver, value):
    """denoise_final (return the denoised mean at the step into the data) is a switch like gaussian_last_step:
    1, 0, "yes" or None is refused with a message that names the option and the value given."""
    import re

    from gms_kernels.solvers import SOLVERS, resolve_options

    with pytest.raises(ValueError, match="^" + re.escape(f"denoise_final must be True or False, got {value!r}") + "$"):
        resolve_options(SOLVERS[solver], {"denoise_final": value})
    assert resolve_options(SOLVERS[solver], {"denoise_final": False}).as_dict()["denoise_final"] is False


def test_a_direct_solver_step_names_a_non_finite_x_t_without_a_step_label():
    """Called without ``where``, solver_step's NaN check names the culprit and nothing else: "x_t has
    non-finite values (NaN or inf)", with no step label in between."""
    from gms_kernels.solvers import StepRandomness, solver_step

    sched = gk.Schedule.linear(20)
    x, e1, _ = _inputs(23, shape=(2, 1, 2, 2))
    x[0, 0, 0, 0] = float("nan")
    rand = StepRandomness(None, 10, x, noise=torch.zeros_like(x))
    with pytest.raises(ValueError, match=r"^x_t has non-finite values \(NaN or inf\)$"):
        solver_step("ddpm", x, [e1], sched.coefficients(10, 5), rand, (-1.0, 1.0), sched.T, {})


def test_a_fused_adan_step_averages_its_loss_over_the_whole_batch():
    """With adan_mean='batch' (the official loss: the mean of the squared moment errors over every element of
    the batch), a fused C++ step fits the same mixture as the float64 torch step on the same Philox draws.
    On 64 samples of 1 x 8 x 8 each gradient is divided by 4096, small enough that ADAN's eps shapes the fit:
    dividing by one sample's 64 elements instead (or by the channels times them) moves x_s by ~1e-2, while the
    two backends agree to ~1e-7 (float32 rounding)."""
    pytest.importorskip("gms_kernels._C")
    from gms_kernels.core.random import SampleNoise
    from gms_kernels.solvers import StepRandomness, solver_step

    sched = gk.Schedule.linear(20)
    k = sched.coefficients(10, 5)
    g = torch.Generator().manual_seed(31)
    x = torch.randn(64, 1, 8, 8, generator=g, dtype=torch.float64)
    e1 = torch.randn(64, 1, 8, 8, generator=g, dtype=torch.float64) * 0.5
    e2 = e1 * e1 + 0.2
    e3 = e1**3 + 3 * e1 * 0.2 + 0.01 * torch.randn(64, 1, 8, 8, generator=g, dtype=torch.float64)
    options = {"fit": "adan", "fit_iters": 8, "adan_mean": "batch", "adan_precision": "float64"}

    def run(backend):
        rand = StepRandomness(SampleNoise.create(5, 64), 10, x)
        return solver_step("gms", x, [e1, e2, e3], k, rand, (-1.0, 1.0), sched.T, options, backend)

    (x_fused, fused), (x_ref, ref) = run("cpp"), run("torch")
    for name in ("mu1", "mu2", "s2"):
        torch.testing.assert_close(fused[name].double(), ref[name], rtol=0, atol=1e-5)
    torch.testing.assert_close(x_fused.double(), x_ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("a, b, same", [
    ("cpu", "cpu", True), ("cpu:0", "cpu", True), ("cuda", "cuda:1", True), ("cuda:1", "cuda:1", True),
    ("cuda:0", "cuda:1", False), ("cpu", "cuda", False), ("cpu", "meta", False),
])
def test_a_device_named_without_an_index_matches_any_index_of_its_type(a, b, same):
    """gk.sample refuses a device= that contradicts x_T's device through this comparison: "cuda" names
    whichever CUDA device x_T is on, "cuda:0" and "cuda:1" are different devices (checked both ways round;
    torch.device needs no GPU to name one)."""
    from gms_kernels.sampling import _same_device

    assert _same_device(a, b) is same
    assert _same_device(b, a) is same


def test_check_sample_args_resolves_the_backend_where_the_samples_will_be_made():
    """check_sample_args refuses what gk.sample would: the C++ backend for samples made off the CPU, where the
    model's weights put them without device= (a model on the meta device stands for one on a GPU); device= wins
    over the model's device, and device='meta' itself is refused (its samples would hold no values)."""
    import copy

    from gms_kernels.models.embedded import default_model
    from gms_kernels.sampling import check_sample_args

    model = default_model()
    on_meta = copy.deepcopy(model).to("meta")
    check_sample_args(model, backend="cpp")
    check_sample_args(on_meta, backend="cpp", device="cpu")
    with pytest.raises(ValueError, match="device='meta': meta tensors hold no values"):
        check_sample_args(model, backend="cpp", device="meta")
    with pytest.raises(ValueError, match="runs on CPU tensors"):
        check_sample_args(on_meta, backend="cpp")


@pytest.mark.parametrize("solver", ["edm-sde", "seeds-2"])
def test_a_multi_call_cpu_run_stops_at_the_first_nonfinite_network_output(solver):
    """On the CPU gk.sample checks each network call of the multi-call loops at once (a deferred check,
    made only off the CPU, would run every remaining call before raising)."""
    calls = []

    def model(x, t):
        calls.append(t)
        return torch.full_like(x, float("nan")) if len(calls) == 3 else 0.1 * x

    with pytest.raises(ValueError, match=r"network call 2 \(t=799\) has non-finite values"):
        gk.sample(model, steps=5, solver=solver, shape=(2, 1, 4, 4), schedule=gk.Schedule.linear(1000),
                  generator=0, progress=False)
    assert len(calls) == 3


def test_the_progress_bar_of_an_explicit_trajectory_counts_its_steps(monkeypatch):
    """An explicit trajectory fixes K (its length, whatever ``steps`` says), and the bar's label says so."""
    from gms_kernels import sampling

    labels = []
    real_bar = sampling.progress_bar

    def bar(iterable, progress, **kwargs):
        labels.append(kwargs["desc"])
        return real_bar(iterable, False, **kwargs)

    monkeypatch.setattr(sampling, "progress_bar", bar)
    model = lambda x, t: torch.zeros_like(x)  # noqa: E731
    gk.sample(model, shape=(1, 1, 2, 2), solver="ddim", schedule=gk.Schedule.linear(100), trajectory=[99, 50, 10],
              generator=0)
    assert labels == ["ddim K=3"]


@pytest.mark.parametrize("device, with_callback, solver, defers", [
    ("cuda", False, "edm-sde", True), ("cuda:1", False, "seeds-3", True), ("meta", False, "seeds-2", True),
    ("cpu", False, "edm-sde", False), ("cpu", False, "seeds-2", False),
    ("cuda", True, "edm-sde", False),   # a callback sees x at once
    ("cuda", False, "ggf", False),      # GGF's step-size decisions read the device anyway
])
def test_which_multi_call_runs_defer_their_finite_check(device, with_callback, solver, defers):
    from gms_kernels.sampling import _multi_call_defers_finite_check

    callback = (lambda info: None) if with_callback else None
    assert _multi_call_defers_finite_check(torch.device(device), callback, solver) is defers


def test_gk_sample_hands_the_deferral_decision_to_the_multi_call_loop(monkeypatch):
    """The decision is made from x's device, the callback and the solver, and a deferring loop runs every call
    before it reports the first non-finite one (here forced on the CPU)."""
    from gms_kernels import sampling

    asked, calls = [], []
    monkeypatch.setattr(sampling, "_multi_call_defers_finite_check", lambda *args: asked.append(args) or True)

    def model(x, t):
        calls.append(t)
        return torch.full_like(x, float("nan")) if len(calls) == 3 else 0.1 * x

    with pytest.raises(ValueError, match=r"network call 2 \(t=799\) has non-finite values"):
        gk.sample(model, steps=5, solver="edm-sde", shape=(2, 1, 4, 4), schedule=gk.Schedule.linear(1000),
                  generator=0, progress=False)
    assert asked == [(torch.device("cpu"), None, gk.solvers.get_solver("edm-sde"))]
    from gms_kernels.solvers import get_solver  # the loop ran to its end before it reported the bad call
    assert len(calls) == get_solver("edm-sde").network_calls(len(gk.trajectory(gk.Schedule.linear(1000), 5, "even")))

    asked.clear()
    callback = lambda info: None  # noqa: E731
    gk.sample(lambda x, t: 0.1 * x, steps=3, solver="seeds-2", shape=(1, 1, 2, 2), generator=0, progress=False,
              callback=callback)
    assert asked == [(torch.device("cpu"), callback, gk.solvers.get_solver("seeds-2"))]
