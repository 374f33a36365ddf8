"""Independent references for every solver step: tests that catch wrong formulas.

Every expected value here comes from somewhere other than gms_kernels' own arithmetic:

- ``ddpm``, ``ddpm-large`` and ``ddim`` are compared with diffusers' ``DDPMScheduler`` and
  ``DDIMScheduler``: their real ``step()``, fed the same noise.
- ``analytic-dpm`` and ``sn-ddpm`` are compared with the variance formulas of Bao et al. 2022
  (Analytic-DPM, Thm. 1; SN-DDPM, "Estimating the optimal covariance with imperfect mean"),
  written in those papers' notation in plain float64; ``estimate_gamma`` with the closed-form
  Gamma_t of Gaussian data.
- ``gms`` (torch and C++ backends) and ``GMSScheduler.step`` are compared with a step computed
  here: the moments of q(x_s|x_t) derived through y = (x0 - centre)/half_width = P + Q eps
  (not through gms_kernels.core.moments' x0 moments), the closed-form moment match
  (delta from the central third moment), and the component draw written out.
- The mixture draw is pinned statistically, the narrow data ranges against hand-derived values,
  and the stochastic steps by the moments of many draws.

The schedule quantities are recomputed here from the betas with ``math.prod`` (not from
``Schedule``). Tolerances: float64 against float64 is held to 1e-12 absolute (the values are
O(1) to O(10): a few thousand ulps, where any change of formula moves results by > 1e-3);
float32 paths have their own bounds, explained where they are used.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gms_kernels as gk
from gms_kernels.core.fit import MixtureParams
from gms_kernels.core.mixture import choose_first_component, sample_mixture
from gms_kernels.core.random import STREAM_COMPONENT, STREAM_STEP_NOISE, SampleNoise

from diffusers import DDIMScheduler, DDPMScheduler

T = 1000
SCHED = gk.Schedule.linear(T)                       # float64 linspace(1e-4, 0.02, 1000)
BETAS = SCHED.betas.tolist()
SHAPE = (4, 3, 8, 8)
F64 = torch.float64
TOL64 = 1e-12


# -- schedule quantities, recomputed here -------------------------------------------------------------
def abar(t: int) -> float:
    """prod_{i<=t} (1 - beta_i); 1 for the data (t = -1)."""
    return 1.0 if t < 0 else math.prod(1.0 - b for b in BETAS[: t + 1])


def posterior(t: int, s: int) -> tuple[float, float, float]:
    """(coefficient of x_t, coefficient of x0, variance) of q(x_s | x_t, x0): DDPM's Eq. 7 with the
    one-step alpha_t replaced by abar_t / abar_s (a jump t -> s)."""
    ab_t, ab_s = abar(t), abar(s)
    alpha = ab_t / ab_s
    c_xt = math.sqrt(alpha) * (1 - ab_s) / (1 - ab_t)
    c_x0 = math.sqrt(ab_s) * (1 - alpha) / (1 - ab_t)
    lam2 = (1 - ab_s) / (1 - ab_t) * (1 - alpha)
    return c_xt, c_x0, lam2


def pixel_cap(data_range, clip_pixel: float = 1.0) -> float:
    """The official last-step variance cap: (clip_pixel * one pixel level * sqrt(pi/2))^2."""
    level = (data_range[1] - data_range[0]) / 255
    return (clip_pixel * level * math.sqrt(math.pi / 2)) ** 2


# -- inputs ---------------------------------------------------------------------------------------------
def noisy_inputs(t: int, seed: int, shape=SHAPE, data_range=(-1.0, 1.0)):
    """x_t = a_t x0 + sigma_t eps with x0 uniform on the data range, and an imperfect e1 = eps + 0.5 n,
    so that E[x0|x_t] from e1 leaves the range for some elements and not for others."""
    g = torch.Generator().manual_seed(seed)
    a, sig = math.sqrt(abar(t)), math.sqrt(1 - abar(t))
    lo, hi = data_range
    x0 = lo + (hi - lo) * torch.rand(shape, generator=g, dtype=F64)
    eps = torch.randn(shape, generator=g, dtype=F64)
    e1 = eps + 0.5 * torch.randn(shape, generator=g, dtype=F64)
    return a * x0 + sig * eps, e1


def moment_heads(t: int, seed: int, shape=SHAPE, negative_var: float = 0.0, data_range=(-1.0, 1.0)):
    """(x_t, e1, e2, e3) with e2 - e1^2 = v > 0 (a fraction ``negative_var`` of elements gets v < 0,
    as learned heads often give) and a skew of either sign in e3."""
    x_t, e1 = noisy_inputs(t, seed, shape, data_range)
    g = torch.Generator().manual_seed(seed + 1000)
    v = 0.1 + 0.9 * torch.rand(shape, generator=g, dtype=F64)
    if negative_var:
        v = torch.where(torch.rand(shape, generator=g, dtype=F64) < negative_var, -0.2 * v, v)
    skew = 1.5 * torch.randn(shape, generator=g, dtype=F64)
    e2 = e1**2 + v
    e3 = e1**3 + 3 * e1 * v + skew * v.abs() ** 1.5
    return x_t, e1, e2, e3


# -- the GMS family written out --------------------------------------------------------------------------
def reference_moments(x_t, e1, e2, e3, t, s, data_range):
    """(M1, Var, M3, E[x0]) of q(x_s|x_t) from the heads, derived through y = (x0 - c)/h.

    x0 = (x_t - sigma_t eps)/a_t gives y = P + Q eps with P = (x_t - a_t c)/(a_t h), Q = -sigma_t/(a_t h),
    so E[y^k] follow from e1, e2, e3 directly. With a data range the official clamps act on y
    (E[y] -> [-1, 1], Var[y] -> [0, 1], E[y^2] -> [0, 1], E[y^3] -> E[y] where |E[y^3]| > |E[y]|,
    then [-1, 1]); Var itself is not clamped (see the narrow-range test). Then x_s = D + F y + sqrt(lam2) z with D = c_xt x_t + c_x0 c,
    F = c_x0 h gives M1 = D + F E[y], Var = lam2 + F^2 Var[y], M3 = E[(D + F y)^3] + 3 lam2 M1.
    """
    c, h = (0.0, 1.0) if data_range is None else ((data_range[0] + data_range[1]) / 2, (data_range[1] - data_range[0]) / 2)
    a_t, sig_t = math.sqrt(abar(t)), math.sqrt(1 - abar(t))
    P = (x_t - a_t * c) / (a_t * h)
    Q = -sig_t / (a_t * h)
    y1 = P + Q * e1
    y2 = P**2 + 2 * P * Q * e1 + Q**2 * e2 if e2 is not None else None
    y3 = P**3 + 3 * P**2 * Q * e1 + 3 * P * Q**2 * e2 + Q**3 * e3 if e3 is not None else None
    vy = Q**2 * (e2 - e1**2) if e2 is not None else None
    if data_range is not None:
        y1 = y1.clamp(-1, 1)
        vy = vy.clamp(0, 1) if vy is not None else None
        y2 = y2.clamp(0, 1) if y2 is not None else None
        if y3 is not None:
            y3 = torch.where(y3.abs() > y1.abs(), y1, y3).clamp(-1, 1)
    x0_mean = c + h * y1
    if s < 0:
        return x0_mean, None, None, x0_mean
    c_xt, c_x0, lam2 = posterior(t, s)
    D, F = c_xt * x_t + c_x0 * c, c_x0 * h
    m1 = D + F * y1
    var = m3 = None
    if vy is not None:
        var = lam2 + F**2 * vy
    if y3 is not None:
        m3 = D**3 + 3 * D**2 * F * y1 + 3 * D * F**2 * y2 + F**3 * y3 + 3 * lam2 * m1
    return m1, var, m3, x0_mean


def reference_fit(m1, var, m3, w1=1 / 3, var_floor=0.1, knee=1e-2):
    """The closed-form moment match, elementwise in numpy: kappa3 = w1 w2 (w2 - w1) d^3,
    Var = s2 + w1 w2 d^2, M1 = w1 mu1 + w2 mu2; s2 held at var_floor * Var (and |d| shrunk) when lower.
    Below the knee of the standardized skewness g = kappa3 / Var^1.5 (|g| < ``knee``), d / sd follows
    the chord from 0 to the cube root's value at the knee: d / sd = (g / knee) cbrt(knee / u)."""
    w2 = 1 - w1
    u = w1 * w2 * (w2 - w1)
    m1, var, m3 = (np.asarray(v.numpy(), dtype=np.float64) for v in (m1, var, m3))
    var = np.maximum(var, 0)
    kappa3 = m3 - 3 * m1 * var - m1**3
    sd = np.sqrt(var)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = kappa3 / sd**3
    d = np.where(np.abs(g) < knee, g / knee * np.cbrt(knee / u) * sd, np.cbrt(kappa3 / u))
    s2 = var - w1 * w2 * d**2
    floor = var_floor * var
    low = s2 < floor
    s2 = np.where(low, floor, s2)
    d = np.where(low, np.sign(d) * np.sqrt(np.maximum(var - floor, 0) / (w1 * w2)), d)
    return [torch.from_numpy(v) for v in (m1 + w2 * d, m1 - w1 * d, s2)]


def reference_gms(x_t, e1, e2, e3, t, s, noise, uniform, data_range=(-1.0, 1.0), weights=(1 / 3, 2 / 3),
                  var_floor=0.1, clip_pixel=1.0):
    """One GMS step by hand: the data step returns E[x0]; the step into s = 0 is N(M1, min(Var, cap));
    every other step draws component 1 (mean mu1) where u < w1, else mu2, plus sqrt(s2) z."""
    m1, var, m3, x0 = reference_moments(x_t, e1, e2, e3, t, s, data_range)
    if s < 0:
        return x0
    if s == 0:
        v = var.clamp_min(0)
        if data_range is not None:
            v = v.clamp_max(pixel_cap(data_range, clip_pixel))
        return m1 + v.sqrt() * noise
    mu1, mu2, s2 = reference_fit(m1, var, m3, weights[0], var_floor)
    u = uniform if uniform.dim() == x_t.dim() else uniform.reshape(-1, *([1] * (x_t.dim() - 1)))
    return torch.where(u < weights[0], mu1, mu2) + s2.sqrt() * noise


def step_tolerance(x_t, e1, e2, e3, t, s, data_range, base, w1=1 / 3):
    """Per-element bound on |x_s(gk) - x_s(hand)| for a GMS step: ``base`` plus the rounding of the
    cube root. kappa3 = M3 - 3 M1 Var - M1^3 cancels down to rounding, eta ~ 1e-13 (1 + |M1| + Var)^3,
    where the heads are symmetric (e.g. fully clamped elements), and d = cbrt(kappa3 / (w1 w2 (w2 - w1)))
    turns an error eta of kappa3 into up to 2 cbrt(eta / (w1 w2 (w2 - w1))) ~ 1e-4 of mu1 and mu2 (the cube
    root is not Lipschitz at 0). Where |kappa3| >> eta the error is the linear one, |d| eta / (3 |kappa3|)."""
    if s <= 0:
        return torch.full_like(x_t, base)
    m1, var, m3, _ = reference_moments(x_t, e1, e2, e3, t, s, data_range)
    kappa3 = m3 - 3 * m1 * var - m1**3
    k = w1 * (1 - w1) * (1 - 2 * w1)
    eta = 1e-13 * (1 + m1.abs() + var.abs()) ** 3
    linear = (kappa3.abs() / k).pow(1 / 3) * eta / (3 * kappa3.abs().clamp_min(1e-300))
    hoelder = 2 * (eta / k).pow(1 / 3)
    return base + torch.where(kappa3.abs() > 1e3 * eta, linear, hoelder)


def assert_within(got, expected, tol):
    err = (got.double() - expected).abs()
    worst = (err / tol).argmax()
    assert (err <= tol).all(), (f"{int((err > tol).sum())} elements off; worst {err.flatten()[worst].item():.3g} "
                                f"against {tol.flatten()[worst].item():.3g}")


def philox_draws(seed, t, shape, per_pixel=False):
    """The normals and uniforms gk's Philox streams give a step at time t (from the generator seed)."""
    src = SampleNoise.create(seed, shape[0])
    z = src.normal(STREAM_STEP_NOISE, t, shape[1:]).to(F64)
    u = src.uniform(STREAM_COMPONENT, t, shape[1:] if per_pixel else ()).to(F64)
    return z, u


def cpp_or_skip():
    from gms_kernels.kernels import cpp

    if not cpp.available():
        pytest.skip(f"the C++ extension gms_kernels._C is not available ({cpp.import_error()})")


# ===================================================================================================
# 1. ddpm / ddpm-large against diffusers' DDPMScheduler
# ===================================================================================================
def ddpm_scheduler(variance_type: str, clip: bool, float64: bool = True) -> DDPMScheduler:
    """diffusers' DDPMScheduler on SCHED's betas. With ``float64`` its betas / alphas / alphas_cumprod
    are rebuilt from the same float64 betas with diffusers' own formulas (it stores float32), so the
    comparison is float64 against float64."""
    sch = DDPMScheduler(num_train_timesteps=T, beta_schedule="linear", variance_type=variance_type,
                        clip_sample=clip, clip_sample_range=1.0)
    if float64:
        sch.betas = SCHED.betas.clone()
        sch.alphas = 1.0 - sch.betas
        sch.alphas_cumprod = torch.cumprod(sch.alphas, dim=0)
    return sch


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("solver, variance_type", [("ddpm", "fixed_small"), ("ddpm-large", "fixed_large")])
def test_ddpm_steps_equal_diffusers(solver, variance_type, clip):
    """Every step of a 10-step trajectory (900 -> 800 -> ... -> 0 -> data): diffusers looks up
    prev_t = t - T/N from set_timesteps(10), and gk.step(t, s=prev_t) gets the same noise that
    diffusers' generator draws (a CPU generator seeded alike gives the same randn).

    Conventions: clip_sample=True (range 1) is data_range=(-1, 1) (E[x0|x_t] clamped to [-1, 1]),
    clip_sample=False is data_range=None. The step into s = 0 is an ordinary noisy step on both
    sides (DDPM's variance is never capped there). At t = 0, diffusers' step goes to abar = 1 and adds
    no noise, so it returns its (clipped) x0: gk's t -> data step with denoise_final=True."""
    sch = ddpm_scheduler(variance_type, clip)
    sch.set_timesteps(10)
    ts = sch.timesteps.tolist()
    assert ts == list(range(900, -1, -100))
    clipped = 0
    for i, t in enumerate(ts):
        s = ts[i + 1] if i + 1 < len(ts) else gk.DATA
        assert int(sch.previous_timestep(t)) == s
        x_t, e1 = noisy_inputs(t, seed=t)
        expected = sch.step(e1, t, x_t, generator=torch.Generator().manual_seed(7 + t)).prev_sample
        z = torch.randn(SHAPE, generator=torch.Generator().manual_seed(7 + t), dtype=F64)
        got = gk.step(x_t, e1, t, s, SCHED, solver, noise=z, uniform=torch.zeros(SHAPE[0]),
                      data_range=(-1.0, 1.0) if clip else None)
        torch.testing.assert_close(got, expected, atol=TOL64, rtol=0)
        x0 = (x_t - math.sqrt(1 - abar(t)) * e1) / math.sqrt(abar(t))
        clipped += int((x0.abs() > 1).sum())
    total = len(ts) * x_t.numel()
    assert 0.05 * total < clipped < 0.95 * total  # the clamp acts on some elements and not on others


@pytest.mark.parametrize("solver, variance_type", [("ddpm", "fixed_small"), ("ddpm-large", "fixed_large")])
def test_ddpm_steps_equal_diffusers_float32(solver, variance_type):
    """diffusers as shipped (float32 betas and cumulative products, float32 samples) against gk on the
    same float32 betas (computing in float64). abar_t in float32 is a product of up to 1000 factors,
    relative error ~ sqrt(t) * 2^-24 <= 2e-6 (measured 3.6e-6 at most on x_s); 2e-5 bounds it for
    |x_s| <= 5 and is far below any change of formula."""
    sch = ddpm_scheduler(variance_type, clip=True, float64=False)
    sched32 = gk.Schedule.from_betas(sch.betas.to(F64))
    sch.set_timesteps(10)
    ts = sch.timesteps.tolist()
    for i, t in enumerate(ts):
        s = ts[i + 1] if i + 1 < len(ts) else gk.DATA
        x_t, e1 = (v.float() for v in noisy_inputs(t, seed=50 + t))
        expected = sch.step(e1, t, x_t, generator=torch.Generator().manual_seed(t)).prev_sample
        z = torch.randn(SHAPE, generator=torch.Generator().manual_seed(t), dtype=torch.float32)
        got = gk.step(x_t, e1, t, s, sched32, solver, noise=z, uniform=torch.zeros(SHAPE[0]))
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)


# ===================================================================================================
# 1b. ddim against diffusers' DDIMScheduler
# ===================================================================================================
def ddim_scheduler(clip: bool) -> DDIMScheduler:
    """DDIMScheduler on SCHED's float64 cumulative products (set_alpha_to_one: the step after t = 0
    lands on abar = 1, the data)."""
    sch = DDIMScheduler(num_train_timesteps=T, beta_schedule="linear", clip_sample=clip, clip_sample_range=1.0,
                        set_alpha_to_one=True)
    sch.alphas_cumprod = SCHED.alphas_cumprod.clone()
    sch.final_alpha_cumprod = torch.tensor(1.0, dtype=F64)
    return sch


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_ddim_steps_equal_diffusers(eta, clip):
    """DDIM (Song et al. Eq. 12) for each step of set_timesteps(10), the same variance_noise on both
    sides. gk recomputes eps from the clamped x0, which is diffusers' use_clipped_model_output=True
    (without clipping the two choices coincide)."""
    sch = ddim_scheduler(clip)
    sch.set_timesteps(10)
    ts = sch.timesteps.tolist()
    for i, t in enumerate(ts):
        s = ts[i + 1] if i + 1 < len(ts) else gk.DATA
        x_t, e1 = noisy_inputs(t, seed=300 + t)
        z = torch.randn(SHAPE, generator=torch.Generator().manual_seed(t), dtype=F64)
        expected = sch.step(e1, t, x_t, eta=eta, use_clipped_model_output=True,
                            variance_noise=z if eta > 0 else None).prev_sample
        got = gk.step(x_t, e1, t, s, SCHED, "ddim", noise=z, uniform=torch.zeros(SHAPE[0]), eta=eta,
                      data_range=(-1.0, 1.0) if clip else None)
        torch.testing.assert_close(got, expected, atol=TOL64, rtol=0)


def test_ddim_clipped_eps_convention():
    """With clipping and diffusers' default use_clipped_model_output=False (eps taken from the network
    as is), the two agree exactly where E[x0|x_t] lies in [-1, 1] and differ where it was clamped."""
    sch = ddim_scheduler(clip=True)
    sch.set_timesteps(10)
    t, s = 500, 400
    x_t, e1 = noisy_inputs(t, seed=11)
    expected = sch.step(e1, t, x_t, eta=0.0).prev_sample
    # the float64 reference (the fused C++ DDIM step reads float32 and is checked against it in test_cpu_targets)
    got = gk.step(x_t, e1, t, s, SCHED, "ddim", generator=0, data_range=(-1.0, 1.0), backend="torch")
    x0 = (x_t - math.sqrt(1 - abar(t)) * e1) / math.sqrt(abar(t))
    inside = x0.abs() <= 1
    assert 0 < int(inside.sum()) < inside.numel()
    torch.testing.assert_close(got[inside], expected[inside], atol=TOL64, rtol=0)
    assert ((got - expected)[~inside].abs() > 1e-3).all()


# ===================================================================================================
# 1c. analytic-dpm and sn-ddpm against Bao et al.'s formulas; estimate_gamma on Gaussian data
# ===================================================================================================
def ddim_family_mean(x_t, x0, t, s, lam2):
    """Analytic-DPM's mean (their Eq. for the DDIM family): sqrt(abar_s) x0 + sqrt(bbar_s - lam2) * eps_hat
    with eps_hat = (x_t - sqrt(abar_t) x0)/sqrt(bbar_t), bbar = 1 - abar."""
    ab_t, ab_s = abar(t), abar(s)
    return math.sqrt(ab_s) * x0 + math.sqrt(1 - ab_s - lam2) * (x_t - math.sqrt(ab_t) * x0) / math.sqrt(1 - ab_t)


@pytest.mark.parametrize("t, s, data_range", [(999, 899, None), (500, 250, None), (300, 299, None),
                                              (99, 0, None), (200, 100, (-1.0, 1.0)), (99, 0, (-1.0, 1.0))])
def test_analytic_dpm_is_bao_et_al_theorem_1(t, s, data_range):
    """Analytic-DPM (Bao et al. 2022a, Thm. 1) with the posterior lam2 and a jump t -> s
    (alpha_n -> abar_t/abar_s, bbar_n -> 1 - abar_t, bbar_{n-1} -> 1 - abar_s):
        sigma*^2 = lam2 + (sqrt(bbar_t/alpha_ts) - sqrt(bbar_s - lam2))^2 (1 - Gamma_t).
    gk's conventions with a data range (the official GMS clamps): x0 clamped to [-1, 1], the x0
    variance (bbar_t/abar_t)(1 - Gamma_t) clamped to [0, 1], and the step into s = 0 capped at
    one pixel level."""
    gamma = torch.linspace(0.2, 0.9, T, dtype=F64)  # a known table
    g = float(gamma[t])
    x_t, e1 = noisy_inputs(t, seed=t + 1)
    z = torch.randn(SHAPE, generator=torch.Generator().manual_seed(3), dtype=F64)
    ab_t, ab_s = abar(t), abar(s)
    _, _, lam2 = posterior(t, s)
    x0 = (x_t - math.sqrt(1 - ab_t) * e1) / math.sqrt(ab_t)
    gamma_n = (math.sqrt((1 - ab_t) / (ab_t / ab_s)) - math.sqrt(1 - ab_s - lam2)) ** 2
    var = lam2 + gamma_n * (1 - g)
    if data_range is not None:
        # (1 - Gamma) = (abar_t/bbar_t) Var[x0], with Var[x0] = (bbar_t/abar_t)(1 - Gamma) clamped to [0, 1]
        x0 = x0.clamp(-1, 1)
        var = lam2 + gamma_n * ab_t / (1 - ab_t) * min((1 - ab_t) / ab_t * (1 - g), 1.0)
        if s == 0:
            var = min(var, pixel_cap(data_range))
    expected = ddim_family_mean(x_t, x0, t, s, lam2) + math.sqrt(var) * z
    got = gk.step(x_t, e1, t, s, SCHED, "analytic-dpm", noise=z, uniform=torch.zeros(SHAPE[0]),
                  gamma=gamma, data_range=data_range)
    torch.testing.assert_close(got, expected, atol=TOL64, rtol=0)
    assert var > lam2 * 1.001 or (data_range is not None and s == 0)  # the Gamma term matters here


@pytest.mark.parametrize("t, s, data_range", [(999, 899, None), (600, 300, None), (99, 0, None),
                                              (400, 300, (-1.0, 1.0)), (99, 0, (-1.0, 1.0))])
def test_sn_ddpm_is_bao_et_al_2022b(t, s, data_range):
    """SN-DDPM (Bao et al. 2022b): N(mu, Sigma) with the DDPM mean and
        Sigma = lam2 + gamma^2 (bbar_t/abar_t) (h - eps_hat^2),
        gamma = sqrt(abar_s) - sqrt(bbar_s - lam2) sqrt(abar_t/bbar_t),
    h the eps^2 head. With a data range: x0 clamped to [-1, 1], the x0 variance to [0, 1] (so a
    negative h - eps^2 gives Sigma = lam2), the step into s = 0 capped at one pixel level."""
    x_t, e1, e2, _ = moment_heads(t, seed=t + 2, negative_var=0.3 if data_range else 0.0)
    z = torch.randn(SHAPE, generator=torch.Generator().manual_seed(4), dtype=F64)
    ab_t, ab_s = abar(t), abar(s)
    _, _, lam2 = posterior(t, s)
    gamma = math.sqrt(ab_s) - math.sqrt(1 - ab_s - lam2) * math.sqrt(ab_t / (1 - ab_t))
    x0 = (x_t - math.sqrt(1 - ab_t) * e1) / math.sqrt(ab_t)
    x0_var = (1 - ab_t) / ab_t * (e2 - e1**2)
    if data_range is not None:
        x0, x0_var = x0.clamp(-1, 1), x0_var.clamp(0, 1)
        assert (x0_var == 0).any() and (x0_var > 0).any()
    var = lam2 + gamma**2 * x0_var
    if data_range is not None and s == 0:
        var = var.clamp_max(pixel_cap(data_range))
    expected = ddim_family_mean(x_t, x0, t, s, lam2) + var.sqrt() * z
    got = gk.step(x_t, torch.cat([e1, e2], 1), t, s, SCHED, "sn-ddpm", noise=z, uniform=torch.zeros(SHAPE[0]),
                  data_range=data_range)
    torch.testing.assert_close(got, expected, atol=TOL64, rtol=0)


@pytest.mark.parametrize("t, s", [(999, 899), (400, 300), (99, 0)])
def test_sn_ddpm_cpp_backend_is_bao_et_al_2022b(t, s):
    """The fused C++ SN-DDPM step (float32 in and out, moments in double) against the same formula
    on the float32 inputs, with the Philox normals. Bound 2e-6: float32 rounding of |x_s| < 8 is
    <= 4.8e-7, and the C++ normals differ from torch's in the last bits (|z| < 6)."""
    cpp_or_skip()
    x_t, e1, e2, _ = moment_heads(t, seed=t + 5, negative_var=0.3)
    x_t, e1, e2 = (v.float() for v in (x_t, e1, e2))
    z, _ = philox_draws(21, t, SHAPE)
    m1, var, _, _ = reference_moments(x_t.double(), e1.double(), e2.double(), None, t, s, (-1.0, 1.0))
    if s == 0:
        var = var.clamp_max(pixel_cap((-1.0, 1.0)))
    expected = m1 + var.sqrt() * z
    got = gk.step(x_t, torch.cat([e1, e2], 1), t, s, SCHED, "sn-ddpm", generator=21, backend="cpp")
    torch.testing.assert_close(got.double(), expected, atol=2e-6, rtol=0)


class GaussianEps(torch.nn.Module):
    """The exact eps predictor for x0 ~ N(0, v0 I): E[eps|x_t] = sigma_t x_t / (a_t^2 v0 + sigma_t^2)."""

    time_input = "index"

    def __init__(self, v0: float):
        super().__init__()
        self.v0 = v0

    def forward(self, x, t):
        t = int(torch.as_tensor(t).reshape(-1)[0])
        a2, s2 = abar(t), 1 - abar(t)
        return math.sqrt(s2) * x / (a2 * self.v0 + s2)


def test_estimate_gamma_on_gaussian_data():
    """With x0 ~ N(0, v0) and the exact eps predictor, x_t ~ N(0, a^2 v0 + sigma^2) and
    Gamma_t = E||eps_theta||^2/d = sigma_t^2 / (a_t^2 v0 + sigma_t^2) exactly. The estimate averages
    n = 2^17 squares of Gaussians: relative standard error sqrt(2/n) = 0.39%; bound 6 of those."""
    v0 = 0.25
    x0 = torch.randn(2048, 1, 8, 8, generator=torch.Generator().manual_seed(0), dtype=F64) * math.sqrt(v0)
    ts = [0, 20, 100, 300, 999]
    table = gk.estimate_gamma(GaussianEps(v0), x0, SCHED, ts, generator=torch.Generator().manual_seed(1),
                              batch_size=1024)
    assert table.dtype == F64 and table.shape == (T,)
    expected = torch.tensor([(1 - abar(t)) / (abar(t) * v0 + 1 - abar(t)) for t in ts], dtype=F64)
    rel = (table[ts] - expected).abs() / expected
    assert (rel < 6 * math.sqrt(2 / x0.numel())).all(), (table[ts], expected)
    others = torch.ones(T, dtype=torch.bool)
    others[ts] = False
    assert table[others].isnan().all()


# ===================================================================================================
# 1d. gms: torch and C++ backends, and GMSScheduler, against the step written out above
# ===================================================================================================
GMS_STEPS = [(999, 899), (600, 400), (400, 100), (200, 190), (99, 0), (0, -1)]


def assert_reference_is_a_moment_match(m1, var, m3, mu1, mu2, s2, w1, var_floor):
    """Sanity of the hand fit itself: its mixture has mean M1 and variance Var, and third moment M3
    wherever the floor did not bind, exactly above the skew knee and within the knee's bound below it
    (the chord g^3 / knee^2 against g: at most 2 knee / (3 sqrt 3) in standardized skewness)."""
    w2 = 1 - w1
    g1 = w1 * mu1 + w2 * mu2
    g2 = w1 * mu1**2 + w2 * mu2**2 + s2
    g3 = w1 * (mu1**3 + 3 * mu1 * s2) + w2 * (mu2**3 + 3 * mu2 * s2)
    scale = 1 + m1.abs() + var
    torch.testing.assert_close(g1, m1, atol=1e-10, rtol=0)
    torch.testing.assert_close(g2 - g1**2, var, atol=1e-10 * scale.max().item(), rtol=0)
    free = s2 > var_floor * var * (1 + 1e-9)
    sd3 = var.clamp_min(0) ** 1.5
    below_knee = (m3 - 3 * m1 * var - m1**3).abs() < 1e-2 * sd3
    knee_bound = torch.where(below_knee, 2 * 1e-2 / (3 * math.sqrt(3)) * sd3, 0.0)
    assert ((g3 - m3)[free].abs() <= 1e-9 * scale[free] ** 3 + knee_bound[free]).all()
    return free


@pytest.mark.parametrize("data_range", [None, (-1.0, 1.0)])
@pytest.mark.parametrize("t, s", GMS_STEPS)
def test_gms_torch_step_by_hand(t, s, data_range):
    """gk.step(solver='gms', backend='torch') with explicit noise and per-sample uniforms around w1
    (0.3333 takes component 1, 0.3334 component 2)."""
    x_t, e1, e2, e3 = moment_heads(t, seed=t + 3, negative_var=0.2 if data_range else 0.0)
    z = torch.randn(SHAPE, generator=torch.Generator().manual_seed(5), dtype=F64)
    u = torch.tensor([0.05, 0.3333, 0.3334, 0.9], dtype=F64)
    expected = reference_gms(x_t, e1, e2, e3, t, s, z, u, data_range)
    got, info = gk.step(x_t, torch.cat([e1, e2, e3], 1), t, s, SCHED, "gms", noise=z, uniform=u,
                        data_range=data_range, backend="torch", return_info=True)
    tol = step_tolerance(x_t, e1, e2, e3, t, s, data_range, 1e-9)
    assert_within(got, expected, tol)
    if 0 < s:
        m1, var, m3, _ = reference_moments(x_t, e1, e2, e3, t, s, data_range)
        mu1, mu2, s2 = reference_fit(m1, var, m3)
        assert_reference_is_a_moment_match(m1, var, m3, mu1, mu2, s2, 1 / 3, 0.1)
        assert_within(info["mu1"], mu1, tol)
        assert_within(info["s2"], s2, tol)


@pytest.mark.parametrize("options", [dict(select="pixel"), dict(weights=(0.2, 0.8), var_floor=0.3),
                                     dict(clip_pixel=2.0)])
def test_gms_torch_step_by_hand_other_options(options):
    """Per-pixel components, other weights and floor, and the last-step cap at two pixel levels."""
    t, s = (99, 0) if "clip_pixel" in options else (400, 100)
    x_t, e1, e2, e3 = moment_heads(t, seed=77, negative_var=0.2)
    g = torch.Generator().manual_seed(6)
    z = torch.randn(SHAPE, generator=g, dtype=F64)
    u = torch.rand(SHAPE if options.get("select") == "pixel" else SHAPE[:1], generator=g, dtype=F64)
    expected = reference_gms(x_t, e1, e2, e3, t, s, z, u, (-1.0, 1.0), options.get("weights", (1 / 3, 2 / 3)),
                             options.get("var_floor", 0.1), options.get("clip_pixel", 1.0))
    got = gk.step(x_t, torch.cat([e1, e2, e3], 1), t, s, SCHED, "gms", noise=z, uniform=u, backend="torch",
                  **options)
    w1 = options.get("weights", (1 / 3, 2 / 3))[0]
    assert_within(got, expected, step_tolerance(x_t, e1, e2, e3, t, s, (-1.0, 1.0), 1e-9, w1))
    if "var_floor" in options:  # both branches of the fit are exercised
        m1, var, m3, _ = reference_moments(x_t, e1, e2, e3, t, s, (-1.0, 1.0))
        free = assert_reference_is_a_moment_match(m1, var, m3, *reference_fit(m1, var, m3, w1, 0.3), w1, 0.3)
        assert free.any() and (~free).any()


@pytest.mark.parametrize("select", ["sample", "pixel"])
@pytest.mark.parametrize("data_range", [None, (-1.0, 1.0)])
@pytest.mark.parametrize("t, s", GMS_STEPS)
def test_gms_cpp_step_by_hand(t, s, data_range, select):
    """The fused C++ step (float32 inputs and output; moments and closed fit in double) against the
    hand step on the same float32 inputs, with the Philox draws of the same seed (uniforms are
    bit-identical, normals agree to float32 rounding). Bound 1e-5 absolute: float32 rounding of
    |x_s| < 8 (4.8e-7) plus last-bit differences of the normals, times sqrt(s2) <= 3."""
    cpp_or_skip()
    x_t, e1, e2, e3 = moment_heads(t, seed=t + 4, negative_var=0.2 if data_range else 0.0)
    x_t, e1, e2, e3 = (v.float() for v in (x_t, e1, e2, e3))
    z, u = philox_draws(33, t, SHAPE, per_pixel=select == "pixel")
    expected = reference_gms(*(v.double() for v in (x_t, e1, e2, e3)), t, s, z, u, data_range)
    got = gk.step(x_t, torch.cat([e1, e2, e3], 1), t, s, SCHED, "gms", generator=33, data_range=data_range,
                  backend="cpp", select=select)
    assert got.dtype == torch.float32
    assert_within(got, expected, step_tolerance(*(v.double() for v in (x_t, e1, e2, e3)), t, s, data_range, 1e-5))


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("solver", ["gms", "sn-ddpm"])
def test_gms_scheduler_steps_by_hand(backend, solver):
    """GMSScheduler on the timesteps 999, 899, 500, 99, 0 (a one-step-of-100 jump, large jumps, the
    capped step into 0, then the data) step by step against the hand step with the Philox draws of
    the int seed passed as generator; pred_original_sample is the clamped E[x0|x_t]. float32
    samples: bound 1e-5 as for the C++ step."""
    if backend == "cpp":
        cpp_or_skip()
    from gms_kernels.integrations.scheduler import GMSScheduler

    sch = GMSScheduler(solver=solver, backend=backend, model_heads=3 if solver == "gms" else 2)
    ts = [999, 899, 500, 99, 0]
    sch.set_timesteps(timesteps=ts)
    assert sch.timesteps.tolist() == ts
    for i, t in enumerate(ts):
        s = ts[i + 1] if i + 1 < len(ts) else -1
        assert sch.previous_timestep(t) == s
        x_t, e1, e2, e3 = (v.float() for v in moment_heads(t, seed=900 + t, negative_var=0.2))
        heads = [e1, e2, e3] if solver == "gms" else [e1, e2]
        out = sch.step(torch.cat(heads, 1), t, x_t, generator=1234 + t)
        z, u = philox_draws(1234 + t, t, SHAPE, per_pixel=True)  # (GMS's default: one component per pixel)
        x64 = [v.double() for v in (x_t, e1, e2, e3)]
        if solver == "gms":
            expected = reference_gms(*x64, t, s, z, u)
        else:
            m1, var, _, x0 = reference_moments(*x64[:3], None, t, s, (-1.0, 1.0))
            if s < 0:
                expected = x0
            else:
                expected = m1 + (var.clamp_max(pixel_cap((-1.0, 1.0))) if s == 0 else var).sqrt() * z
        tol = step_tolerance(*x64, t, s, (-1.0, 1.0), 1e-5) if solver == "gms" else torch.full_like(expected, 1e-5)
        assert_within(out.prev_sample, expected, tol)
        x0 = reference_moments(*x64[:2], None, None, t, -1, (-1.0, 1.0))[3]
        torch.testing.assert_close(out.pred_original_sample.double(), x0, atol=1e-5, rtol=0)


# ===================================================================================================
# 2. the mixture draw, statistically
# ===================================================================================================
def binomial_bound(p: float, n: int, k: float = 5.0) -> float:
    return k * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("weights", [(1 / 3, 2 / 3), (0.2, 0.8)])
def test_component_frequency_is_w1(weights):
    """Over 2^18 Philox uniforms (one per element, select='pixel', through gk.step with zero noise so
    that x_s is exactly mu1 or mu2), the share of component 1 is w1 within 5 binomial standard
    errors (0.0046 for 1/3: 0.34 instead of 1/3 is 1.5x that away)."""
    shape = (4, 1, 256, 256)
    n = math.prod(shape)
    t, s = 300, 200
    x_t = torch.full(shape, 0.3, dtype=F64)
    heads = torch.cat([torch.full(shape, 0.2, dtype=F64), torch.full(shape, 0.2**2 + 0.6, dtype=F64),
                       torch.full(shape, 0.2**3 + 3 * 0.2 * 0.6 + 0.5, dtype=F64)], 1)
    kw = dict(weights=weights, select="pixel", data_range=None, backend="torch", return_info=True)
    x_s, info = gk.step(x_t, heads, t, s, SCHED, "gms", generator=5, noise=torch.zeros(shape, dtype=F64), **kw)
    mu1, mu2 = info["mu1"].flatten()[0].item(), info["mu2"].flatten()[0].item()
    assert abs(mu1 - mu2) > 0.01
    first = x_s == mu1
    assert (first | (x_s == mu2)).all()
    freq = first.double().mean().item()
    assert abs(freq - weights[0]) < binomial_bound(weights[0], n), freq
    # the same share from the per-sample choice (one uniform per image) over many images
    x1 = torch.full((n // 16, 1, 1, 1), 0.3, dtype=F64)
    h1 = heads[:, :, :1, :1].repeat(n // 16 // 4, 1, 1, 1)
    x_s1, _ = gk.step(x1, h1, t, s, SCHED, "gms", generator=6, noise=torch.zeros_like(x1),
                      **dict(kw, select="sample"))
    freq1 = (x_s1 == mu1).double().mean().item()
    assert abs(freq1 - weights[0]) < binomial_bound(weights[0], n // 16), freq1


@pytest.mark.parametrize("w1", [1 / 3, 0.2])
def test_uniforms_either_side_of_w1_pick_different_components(w1):
    """u < w1 takes component 1, u >= w1 component 2, per sample and per element."""
    below, above = math.nextafter(w1, 0.0), w1
    like = torch.zeros(2, 3)
    mask = choose_first_component(torch.tensor([below, above], dtype=F64), w1, like)
    assert mask[0].all() and not mask[1].any()
    p = MixtureParams(torch.full((2, 3), 1.0, dtype=F64), torch.full((2, 3), -1.0, dtype=F64),
                      torch.zeros(2, 3, dtype=F64))
    u = torch.tensor([[below, above, w1 + 1e-9], [0.0, 0.999, w1 - 1e-9]], dtype=F64)
    x = sample_mixture(p, (w1, 1 - w1), torch.zeros(2, 3, dtype=F64), u)
    assert x.tolist() == [[1.0, -1.0, -1.0], [1.0, -1.0, 1.0]]


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_many_draws_have_the_mixture_moments(backend):
    """2^18 draws of one element's step (select='pixel', Philox noise and uniforms): sample mean,
    variance and third central moment equal the fitted mixture's, i.e. the targets M1, Var and
    kappa3 = w1 w2 (w2 - w1) (mu1 - mu2)^3, within 6 standard errors estimated from the draws."""
    if backend == "cpp":
        cpp_or_skip()
    shape = (4, 1, 256, 256)
    t, s = 500, 300
    x_t = torch.full(shape, 0.4, dtype=torch.float32)
    e1, v, k3 = 0.1, 0.7, 0.4
    heads = torch.cat([torch.full(shape, e1), torch.full(shape, e1**2 + v),
                       torch.full(shape, e1**3 + 3 * e1 * v + k3)], 1)
    x_s = gk.step(x_t, heads, t, s, SCHED, "gms", generator=9, data_range=None, select="pixel",
                  backend=backend).double().flatten()
    one = lambda h: h[:1, :, :1, :1].double()  # noqa: E731
    m1, var, m3, _ = reference_moments(one(x_t), one(heads[:, :1]), one(heads[:, 1:2]), one(heads[:, 2:]),
                                       t, s, None)
    mu1, mu2, s2 = reference_fit(m1, var, m3)
    w1, w2 = 1 / 3, 2 / 3
    assert (s2 > 0.1 * var).all()  # not floored: the mixture matches all three moments
    m1, var, kappa3 = m1.item(), var.item(), (w1 * w2 * (w2 - w1) * (mu1 - mu2) ** 3).item()
    assert abs(kappa3) > 0.01
    n = x_s.numel()
    d = x_s - x_s.mean()
    assert abs(x_s.mean().item() - m1) < 6 * math.sqrt(var / n)
    assert abs((d**2).mean().item() - var) < 6 * (d**2).std().item() / math.sqrt(n)
    assert abs((d**3).mean().item() - kappa3) < 6 * (d**3).std().item() / math.sqrt(n)


# ===================================================================================================
# 3. narrow data ranges
# ===================================================================================================
@pytest.mark.parametrize("data_range", [(0.0, 1.0), (-2.0, 3.0)])
@pytest.mark.parametrize("t, s", [(999, 899), (500, 300), (99, 0), (0, -1)])
def test_gms_and_sn_ddpm_on_other_data_ranges(data_range, t, s):
    """The official clamps mapped to [lo, hi] through y = (x0 - c)/h (c the centre, h the half width):
    E[x0] in [lo, hi], Var[x0] in [0, h^2], E[y^2] in [0, 1], the E[y^3] rule, Var in [0, h^2],
    and the step into s = 0 capped at one pixel level (hi - lo)/255 (times sqrt(pi/2), squared)."""
    lo, hi = data_range
    x_t, e1, e2, e3 = moment_heads(t, seed=t + 8, negative_var=0.2, data_range=data_range)
    g = torch.Generator().manual_seed(12)
    z = torch.randn(SHAPE, generator=g, dtype=F64)
    u = torch.rand(SHAPE[:1], generator=g, dtype=F64)
    expected = reference_gms(x_t, e1, e2, e3, t, s, z, u, data_range)
    got = gk.step(x_t, torch.cat([e1, e2, e3], 1), t, s, SCHED, "gms", noise=z, uniform=u, data_range=data_range,
                  backend="torch")
    assert_within(got, expected, step_tolerance(x_t, e1, e2, e3, t, s, data_range, 1e-9))
    if s < 0:
        assert got.min() >= lo and got.max() <= hi
        assert (got == lo).any() or (got == hi).any()
    m1, var, _, _ = reference_moments(x_t, e1, e2, None, t, s, data_range)
    if s >= 0:
        var = var.clamp_max(pixel_cap(data_range)) if s == 0 else var
        expected_sn = m1 + var.sqrt() * z
    else:
        expected_sn = m1
    got_sn = gk.step(x_t, torch.cat([e1, e2], 1), t, s, SCHED, "sn-ddpm", noise=z, uniform=u,
                     data_range=data_range)
    torch.testing.assert_close(got_sn, expected_sn, atol=1e-9, rtol=0)


def test_last_step_caps_scale_with_the_range():
    """The cap into s = 0 is one pixel level of the range: 2/255 for [-1, 1], 1/255 for [0, 1],
    5/255 for [-2, 3] (times sqrt(pi/2), squared). At 99 -> 0 the posterior variance lam2 ~ 1e-4 is
    above all three caps' (the official code's cap binds there too), so the step's variance is the cap."""
    from gms_kernels.core.moments import last_step_variance_cap

    _, _, lam2 = posterior(99, 0)
    for (lo, hi), level in [((-1.0, 1.0), 2 / 255), ((0.0, 1.0), 1 / 255), ((-2.0, 3.0), 5 / 255)]:
        cap = (level * math.sqrt(math.pi / 2)) ** 2
        assert last_step_variance_cap((lo, hi)) == pytest.approx(cap, rel=1e-14)
        x_t, e1, e2, _ = moment_heads(99, seed=1)
        _, info = gk.step(x_t, torch.cat([e1, e2], 1), 99, 0, SCHED, "sn-ddpm", generator=0,
                          data_range=(lo, hi), return_info=True, backend="torch")
        if cap < lam2:
            torch.testing.assert_close(info["var"], torch.full_like(x_t, cap), atol=0, rtol=1e-14)
    assert last_step_variance_cap(None) is None


def test_narrow_range_keeps_the_posterior_noise():
    """The official code clamps the transition variance to [0, 1] for data in [-1, 1]; that never binds
    once Var[x0|x_t] is clamped to [0, 1]: Var = lam2 + c2^2 Var[x0] <= lam2 + c2^2
    = beta_ts (sigma_t^2 - a_t^2 sigma_s^2)/sigma_t^4 <= 1. Scaled to a range of half width h (to
    [0, h^2]) it would cut lam2, the noise of q(x_s|x_t,x0), which is unit-scale whatever the range:
    for [0, 1] (h^2 = 0.25) below lam2 = 0.8532 at 999 -> 899, drawing sn-ddpm and gms with less
    noise than DDPM, and handing the gms fit a Var inconsistent with its M3 (a spurious skew that
    drove most elements onto the variance floor). So Var is not clamped: it lies in
    [lam2, lam2 + c2^2 h^2], for every range and backend."""
    t, s = 999, 899
    _, c2, lam2 = posterior(t, s)
    assert lam2 == pytest.approx(0.85315, abs=1e-4)
    assert lam2 + c2**2 <= 1  # (so for [-1, 1] nothing changes)
    x_t, e1, e2, e3 = moment_heads(t, seed=2)
    heads = torch.cat([e1, e2, e3], 1)
    for data_range in ((0.0, 1.0), (-2.0, 3.0), (-1.0, 1.0)):
        h2 = ((data_range[1] - data_range[0]) / 2) ** 2
        _, info = gk.step(x_t, heads[:, :6], t, s, SCHED, "sn-ddpm", generator=0, data_range=data_range,
                          return_info=True, backend="torch")
        assert (info["var"] >= lam2 - 1e-12).all() and (info["var"] <= lam2 + c2**2 * h2 + 1e-12).all()
    for backend in ("torch", "cpp"):
        _, info = gk.step(x_t, heads, t, s, SCHED, "gms", generator=0, data_range=(0.0, 1.0), return_info=True,
                          backend=backend)
        floored = info["s2"] <= 0.1 * lam2 * (1 + 1e-6)
        assert floored.double().mean() < 0.1, backend  # no spurious skew pushing the fit to the floor
        assert (info["s2"] >= 0.1 * lam2 * (1 - 1e-6)).all()


# ===================================================================================================
# 4. properties of whole samplers
# ===================================================================================================
@pytest.fixture(scope="module")
def paper_oracle_1d():
    return gk.GaussianMixtureOracle([0.4, 0.6], [[-0.4], [0.3]], [0.12, 0.05], SCHED)


def test_ddim_eta0_is_deterministic_given_x_T(paper_oracle_1d):
    """DDIM with eta = 0 uses no randomness: two generators give the same samples bit for bit, and
    they differ once eta > 0."""
    x_T = torch.randn(64, 1, generator=torch.Generator().manual_seed(0))
    run = lambda gen, eta: gk.sample(paper_oracle_1d, x_T=x_T, steps=8, solver="ddim", generator=gen,  # noqa: E731
                                     eta=eta, progress=False)
    assert torch.equal(run(1, 0.0), run(2, 0.0))
    assert not torch.allclose(run(1, 0.5), run(2, 0.5), atol=1e-3)


@pytest.mark.parametrize("solver, backend", [("ddpm", "torch"), ("ddpm-large", "torch"), ("sn-ddpm", "torch"),
                                             ("sn-ddpm", "cpp"), ("analytic-dpm", "torch"), ("ddim", "torch")])
def test_many_draws_of_one_step_have_the_formula_moments(solver, backend):
    """2^17 draws of one step from one x_t (Philox noise): the sample mean is M1 and the sample
    variance the solver's variance (lam2, beta_ts, lam2 + c2^2 sigma_t^2/a_t^2 (e2 - e1^2),
    Analytic-DPM's, or DDIM's eta^2 lam2) within 6 standard errors."""
    if backend == "cpp":
        cpp_or_skip()
    t, s = 600, 450
    shape = (2, 1, 256, 256)
    xv, e1v, e2v = 0.3, -0.2, 0.04 + 0.5
    x_t = torch.full(shape, xv, dtype=torch.float32)
    heads = torch.cat([torch.full(shape, e1v), torch.full(shape, e2v)], 1)
    gamma = torch.full((T,), 0.6, dtype=F64)
    opts = {"analytic-dpm": dict(gamma=gamma), "ddim": dict(eta=0.7)}.get(solver, {})
    x_s = gk.step(x_t, heads if solver == "sn-ddpm" else heads[:, :1], t, s, SCHED, solver, generator=3,
                  data_range=None, backend=backend, **opts).double().flatten()
    ab_t, ab_s = abar(t), abar(s)
    c_xt, c_x0, lam2 = posterior(t, s)
    x0 = (xv - math.sqrt(1 - ab_t) * e1v) / math.sqrt(ab_t)
    mean = c_xt * xv + c_x0 * x0
    variance = {
        "ddpm": lam2,
        "ddpm-large": 1 - ab_t / ab_s,
        "sn-ddpm": lam2 + c_x0**2 * (1 - ab_t) / ab_t * (e2v - e1v**2),
        "analytic-dpm": lam2 + c_x0**2 * (1 - ab_t) / ab_t * (1 - 0.6),
        "ddim": 0.49 * lam2,
    }[solver]
    if solver == "ddim":  # DDIM's mean: sqrt(abar_s) x0 + sqrt(bbar_s - eta^2 lam2) eps_hat
        mean = math.sqrt(ab_s) * x0 + math.sqrt(1 - ab_s - 0.49 * lam2) * e1v
    n = x_s.numel()
    assert abs(x_s.mean().item() - mean) < 6 * math.sqrt(variance / n)
    assert abs(x_s.var().item() - variance) < 6 * variance * math.sqrt(2 / n)


def test_solvers_converge_to_the_exact_sampler_as_steps_grow(paper_oracle_1d):
    """On the paper's 1-D mixture with exact heads, W1 to the exact sampler's draws shrinks as K
    grows from 5 to 50 for ddpm, sn-ddpm and gms: from ~0.2 to below a quarter of that and below
    0.05 (measured 0.013-0.037 over seeds; W1 of two 4000-draw samples of one law is ~0.005).
    The exact sampler itself matches the data at K = 5 (measured 0.005)."""
    n = 4000
    exact = gk.sample(paper_oracle_1d, shape=(n, 1), steps=5, solver="exact", generator=100, progress=False)
    data = paper_oracle_1d.sample_data(n, torch.Generator().manual_seed(0))
    assert gk.metrics.wasserstein1(exact, data) < 0.02
    for solver in ["ddpm", "sn-ddpm", "gms"]:
        w = {K: gk.metrics.wasserstein1(gk.sample(paper_oracle_1d, shape=(n, 1), steps=K, solver=solver,
                                                  generator=200 + K, progress=False), exact)
             for K in (5, 50)}
        assert w[5] > 0.1 and w[50] < 0.25 * w[5] and w[50] < 0.05, (solver, w)


@pytest.mark.parametrize("data_range", [(-1.0, 1.0), None])
def test_gms_step_info_reports_the_transition_moments(data_range):
    """return_info's m1 / var / m3 are the moments of q(x_s|x_t) derived by hand (reference_moments)."""
    t, s = 600, 500
    x_t, e1, e2, e3 = moment_heads(t, seed=21, negative_var=0.2 if data_range else 0.0)
    heads = torch.cat([e1, e2, e3], dim=1)
    _, info = gk.step(x_t, heads, t, s, SCHED, "gms", noise=torch.zeros(SHAPE, dtype=F64),
                      uniform=torch.zeros(SHAPE[0]), data_range=data_range, return_info=True)
    m1, var, m3, _ = reference_moments(x_t, e1, e2, e3, t, s, data_range)
    for name, want in (("m1", m1), ("var", var), ("m3", m3)):
        torch.testing.assert_close(info[name], want, rtol=1e-10, atol=1e-12, msg=name)
