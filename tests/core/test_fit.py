import math

import pytest
import torch

import gms_kernels as gk
from gms_kernels.core.fit import SKEW_KNEE, adan_learning_rates, knee_delta2, moment_residuals


def _moments_of(p, w=(1 / 3, 2 / 3)):
    g1, g2, g3 = gk.mixture_raw_moments(p, w)
    return gk.TransitionMoments(g1, g2 - g1**2, g3)


def _standardized_skew(mom):
    var = mom.var.clamp_min(0)
    return (mom.m3 - 3 * mom.m1 * var - mom.m1**3) / var.pow(1.5)


def test_closed_form_reproduces_feasible_moments_exactly():
    """Exact above the knee; below it (|skew| < SKEW_KNEE) M1 and Var exact, the third moment within
    the documented 2 / (3 sqrt 3) SKEW_KNEE Var^1.5."""
    g = torch.Generator().manual_seed(0)
    n = 1000
    mu1, mu2 = torch.randn(n, dtype=torch.float64, generator=g), torch.randn(n, dtype=torch.float64, generator=g)
    s2 = torch.rand(n, dtype=torch.float64, generator=g) + 0.05
    mom = _moments_of(gk.MixtureParams(mu1, mu2, s2))
    mom.var = mom.var  # feasible whenever s2 >= floor * Var; use no floor here
    p = gk.fit_closed(mom, var_floor=0.0)
    above = _standardized_skew(mom).abs() >= SKEW_KNEE
    assert 0 < int((~above).sum()) < n  # both sides of the knee are exercised
    torch.testing.assert_close(p.mu1[above], mu1[above], rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(p.mu2[above], mu2[above], rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(p.s2[above], s2[above], rtol=1e-8, atol=1e-8)
    r1, r2, r3 = moment_residuals(p, mom, (1 / 3, 2 / 3))
    assert float(r1.abs().max()) < 1e-10 and float(r2.abs().max()) < 1e-10
    assert float(r3[above].abs().max()) < 1e-10
    bound = 2 / (3 * math.sqrt(3)) * SKEW_KNEE * mom.var.pow(1.5)
    assert (r3.abs() <= bound * (1 + 1e-9) + 1e-12).all()


def test_closed_form_knee_is_continuous_lipschitz_and_bounded():
    """delta against the standardized skew g: the cube root above |g| = SKEW_KNEE, the straight line
    through 0 below it, continuous at the knee; slope 1 / (w1 w2 (w2 - w1) knee_delta2) sd per unit
    of g at most (51.3 at the default weights); third-moment error at most 0.385 SKEW_KNEE Var^1.5."""
    w1, w2 = 1 / 3, 2 / 3
    unit = w1 * w2 * (w2 - w1)
    for var in (1e-6, 0.3, 4.0):
        skews = torch.linspace(-3 * SKEW_KNEE, 3 * SKEW_KNEE, 6001, dtype=torch.float64)
        m1 = torch.zeros_like(skews)  # (kappa3 = M3 without cancellation: the map itself is checked)
        vv = torch.full_like(skews, var)
        mom = gk.TransitionMoments(m1, vv, skews * var**1.5 + 3 * m1 * vv + m1**3)
        p = gk.fit_closed(mom)
        delta = (p.mu1 - p.mu2) / math.sqrt(var)
        exact = torch.sign(skews) * (skews.abs() / unit).pow(1 / 3)
        below = skews.abs() < SKEW_KNEE
        torch.testing.assert_close(delta[~below], exact[~below], rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(delta[below], skews[below] / (unit * knee_delta2(w1)), rtol=1e-6, atol=1e-9)
        slope = (delta.diff() / skews.diff()).abs().max()
        assert float(slope) <= 1 / (unit * knee_delta2(w1)) * (1 + 1e-6)
        assert 51.0 < 1 / (unit * knee_delta2(w1)) < 51.5
        fitted = unit * delta**3
        assert float((fitted - skews).abs().max()) <= 2 / (3 * math.sqrt(3)) * SKEW_KNEE * (1 + 1e-6)
    # continuity at the knee, from both sides
    var = 0.5
    for g in (SKEW_KNEE * (1 - 1e-12), SKEW_KNEE * (1 + 1e-12)):
        mom = gk.TransitionMoments(torch.zeros(1, dtype=torch.float64), torch.full((1,), var, dtype=torch.float64),
                                   torch.full((1,), g * var**1.5, dtype=torch.float64))
        p = gk.fit_closed(mom)
        assert float((p.mu1 - p.mu2) / math.sqrt(var)) == pytest.approx((SKEW_KNEE / unit) ** (1 / 3), rel=1e-9)


def test_closed_form_knee_with_the_heavier_component_first():
    """Weights (2/3, 1/3): w2 - w1 < 0, the knee acts on |skew| alike and delta keeps the sign the fit needs."""
    var = torch.full((4,), 0.5, dtype=torch.float64)
    m1 = torch.full((4,), -0.1, dtype=torch.float64)
    skews = torch.tensor([-0.5, -1e-3, 1e-3, 0.5], dtype=torch.float64)
    mom = gk.TransitionMoments(m1, var, skews * var.pow(1.5) + 3 * m1 * var + m1**3)
    p = gk.fit_closed(mom, weights=(2 / 3, 1 / 3))
    r1, r2, r3 = moment_residuals(p, mom, (2 / 3, 1 / 3))
    assert float(r1.abs().max()) < 1e-12 and float(r2.abs().max()) < 1e-12
    assert float(r3[[0, 3]].abs().max()) < 1e-12  # above the knee: exact
    fitted = (r3 + skews * var.pow(1.5)) / var.pow(1.5)
    assert (torch.sign(fitted) == torch.sign(skews)).all()
    assert float((fitted - skews).abs().max()) <= 2 / (3 * math.sqrt(3)) * SKEW_KNEE


def test_closed_form_respects_the_floor_when_infeasible():
    m1 = torch.tensor([0.3, -0.2, 0.0])
    var = torch.tensor([0.04, 0.5, 1.0], dtype=torch.float64)
    m1 = m1.double()
    kappa3 = torch.tensor([5.0, -20.0, 1e3], dtype=torch.float64)  # far outside the feasible region
    mom = gk.TransitionMoments(m1, var, kappa3 + 3 * m1 * var + m1**3)
    p = gk.fit_closed(mom, var_floor=0.1)
    torch.testing.assert_close(p.s2, 0.1 * var)
    r1, r2, r3 = moment_residuals(p, mom, (1 / 3, 2 / 3))
    assert float(r1.abs().max()) < 1e-12 and float(r2.abs().max()) < 1e-12  # M1 and Var still exact
    fitted_k3 = (1 / 3) * (2 / 3) * (1 / 3) * (p.mu1 - p.mu2) ** 3
    assert (torch.sign(fitted_k3) == torch.sign(kappa3)).all() and (fitted_k3.abs() < kappa3.abs()).all()


def test_closed_form_handles_zero_variance_and_symmetric_moments():
    mom = gk.TransitionMoments(torch.tensor([0.5, 0.1], dtype=torch.float64),
                               torch.tensor([0.0, 0.2], dtype=torch.float64), None)
    mom.m3 = mom.m1**3 + 3 * mom.m1 * mom.var  # zero skew
    p = gk.fit_closed(mom)
    # rounding in kappa3 (~1e-17) stays rounding: below the knee delta is linear in kappa3 (the cube
    # root made ~1e-6 of it)
    torch.testing.assert_close(p.mu1, mom.m1, rtol=0, atol=1e-14)
    torch.testing.assert_close(p.mu2, mom.m1, rtol=0, atol=1e-14)
    torch.testing.assert_close(p.s2, mom.var, rtol=0, atol=1e-14)


def test_weights_are_checked():
    mom = gk.TransitionMoments(torch.zeros(1), torch.ones(1), torch.zeros(1))
    with pytest.raises(ValueError, match="equal weights"):
        gk.fit_closed(mom, weights=(0.5, 0.5))
    with pytest.raises(ValueError, match="sum to 1"):
        gk.fit_closed(mom, weights=(0.3, 0.3))


def test_adan_first_iteration_by_hand():
    M1, V, M3 = 0.2, 0.5, 0.6
    w1, w2 = 1 / 3, 2 / 3
    mom = gk.TransitionMoments(torch.tensor([M1], dtype=torch.float64), torch.tensor([V], dtype=torch.float64),
                               torch.tensor([M3], dtype=torch.float64))
    p = gk.fit_adan(mom, iters=1, lr=0.06)
    # by hand: init mu1 = M1, mu2 = M1 - 1e-3, beta = 0.998; loss = r1^2 + r2^2 + r3^2 over D = 1 element
    mu1, mu2, beta = M1, M1 - 1e-3, 0.998
    s2 = beta * V
    g1 = w1 * mu1 + w2 * mu2
    r1 = g1 - M1
    r2 = w1 * mu1**2 + w2 * mu2**2 + s2 - (M1**2 + V)
    r3 = w1 * (mu1**3 + 3 * mu1 * s2) + w2 * (mu2**3 + 3 * mu2 * s2) - M3
    grads = [2 * w1 * (r1 + 2 * mu1 * r2 + 3 * (mu1**2 + s2) * r3),
             2 * w2 * (r1 + 2 * mu2 * r2 + 3 * (mu2**2 + s2) * r3),
             2 * V * (r2 + 3 * g1 * r3)]
    b1, b3 = 0.9, 0.92
    new = []
    for theta, gr in zip((mu1, mu2, beta), grads):
        m = (1 - b1) * gr
        n = (1 - b3) * gr**2  # d_1 = 0, so u = g and v = 0
        denom = math.sqrt(n) / math.sqrt(1 - b3) + 1e-8
        new.append(theta - 0.06 / (1 - b1) * m / denom)
    assert float(p.mu1) == pytest.approx(new[0], rel=1e-12)
    assert float(p.mu2) == pytest.approx(new[1], rel=1e-12)
    assert float(p.s2) == pytest.approx(min(max(new[2], 0.1), 1.2) * V, rel=1e-12)


def test_adan_lowers_the_residual():
    g = torch.Generator().manual_seed(0)
    n = 500
    mom = _moments_of(gk.MixtureParams(torch.randn(n, generator=g, dtype=torch.float64) * 0.3,
                                       torch.randn(n, generator=g, dtype=torch.float64) * 0.3,
                                       torch.rand(n, generator=g, dtype=torch.float64) * 0.2 + 0.05))
    def loss(p):
        return sum(float((r**2).sum()) for r in moment_residuals(p, mom, (1 / 3, 2 / 3)))
    start = loss(gk.fit_adan(mom, iters=0))
    after = loss(gk.fit_adan(mom, iters=25))
    assert after < 0.5 * start


def test_adan_batch_mean_depends_on_batch_but_sample_mean_does_not():
    # moments 1e-4 away from the init's, so per-element gradients approach ADAN's eps in "batch" mode
    init = gk.MixtureParams(torch.full((64, 50), 0.2, dtype=torch.float64),
                            torch.full((64, 50), 0.2 - 1e-3, dtype=torch.float64),
                            torch.full((64, 50), 0.998 * 0.5, dtype=torch.float64))
    g1, g2, g3 = gk.mixture_raw_moments(init, (1 / 3, 2 / 3))
    mom = gk.TransitionMoments(g1, torch.full_like(g1, 0.5), g3 + 1e-4)
    half = gk.TransitionMoments(mom.m1[:4], mom.var[:4], mom.m3[:4])
    torch.testing.assert_close(gk.fit_adan(mom).mu1[:4], gk.fit_adan(half).mu1, rtol=0, atol=0)
    diff = gk.fit_adan(mom, mean_over="batch").mu1[:4] - gk.fit_adan(half, mean_over="batch").mu1
    assert float(diff.abs().max()) > 1e-4


def test_paper_learning_rate_table():
    rates = adan_learning_rates(25, "paper", t=999, T=1000)
    base = max(0.16 - (1 / 1000) ** 2 * 0.16, 0.12)
    assert rates[0] == pytest.approx(base / 18) and rates[17] == pytest.approx(base)
    assert all(r >= 0.1 for r in rates[18:]) and rates[-1] == pytest.approx(0.1)
    late = adan_learning_rates(25, "paper", t=0, T=1000)
    assert late[17] == pytest.approx(0.12)
    with pytest.raises(ValueError, match="paper, paper-imagenet64"):
        adan_learning_rates(5, "cosine")


def test_per_element_adan_equals_the_official_autograd_loop():
    """fit_adan(mean_over="batch") is the official autograd + optimizer-object loop, written out."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from reference_loop import reference_fit

    g = torch.Generator().manual_seed(3)
    m1 = torch.randn(4, 3, 5, dtype=torch.float64, generator=g) * 0.3
    var = torch.rand(4, 3, 5, dtype=torch.float64, generator=g) * 0.2 + 0.01
    m3 = m1**3 + 3 * m1 * var + torch.randn(4, 3, 5, dtype=torch.float64, generator=g) * 0.01
    mu1, mu2, s2 = reference_fit(m1, var, m3, iters=30)
    p = gk.fit_adan(gk.TransitionMoments(m1, var, m3), iters=30, mean_over="batch")
    torch.testing.assert_close(p.mu1, mu1, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(p.mu2, mu2, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(p.s2, s2, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("weights", [(0.0, 1.0), (1.0, 0.0), (-0.5, 1.5)])
def test_mixture_weights_must_both_be_positive(weights):
    from gms_kernels.core.fit import check_weights

    with pytest.raises(ValueError, match="weights must be positive and sum to 1"):
        check_weights(weights)


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
    """The paper's Table 7, written out: base = max(high (1 - iota), low), iota = ((T - t)/T)^2;
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


def _cpp_constants() -> dict[str, float]:
    """The ``constexpr double kName = value`` definitions of csrc/step_api.h, the C++ kernels' one copy."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "csrc" / "step_api.h").read_text()
    found = {}
    for line in re.findall(r"constexpr double ([^;]+);", text):
        for name, value in re.findall(r"(k\w+) = ([0-9a-fA-Fx.+\-p]+)", line):
            found[name] = float.fromhex(value) if value.lower().startswith("0x") else float(value)
    return found


def test_the_cpp_kernels_fit_with_the_constants_of_the_python_reference():
    """csrc/step_api.h defines the fit's numbers for C++ by hand; they must be fit.py's (and the float32
    ADAN limits those of gms_kernels.kernels), bit for bit, or the kernels would fit another mixture."""
    from gms_kernels.core import fit
    from gms_kernels.kernels import ADAN_FP32_LIMITS

    expected = {
        "kAdanBeta1": fit.ADAN_BETAS[0], "kAdanBeta2": fit.ADAN_BETAS[1], "kAdanBeta3": fit.ADAN_BETAS[2],
        "kAdanEps": fit.ADAN_EPS, "kAdanInitBeta": fit.ADAN_INIT_BETA, "kAdanInitGap": fit.ADAN_INIT_GAP,
        "kAdanBetaLo": fit.ADAN_BETA_BOUNDS[0], "kAdanBetaHi": fit.ADAN_BETA_BOUNDS[1], "kSkewKnee": fit.SKEW_KNEE,
        "kAdanFp32M1Max": ADAN_FP32_LIMITS["m1_max"], "kAdanFp32VarMin": ADAN_FP32_LIMITS["var_min"],
        "kAdanFp32VarMax": ADAN_FP32_LIMITS["var_max"], "kAdanFp32K3Max": ADAN_FP32_LIMITS["k3_max"],
    }
    assert _cpp_constants() == expected


def test_fit_iters_must_be_an_integer_in_range():
    from gms_kernels.core.fit import MAX_FIT_ITERS, check_fit_iters

    assert check_fit_iters(0) == 0 and check_fit_iters(MAX_FIT_ITERS) == MAX_FIT_ITERS
    for bad in (True, 2.5, -1, MAX_FIT_ITERS + 1, "3"):
        with pytest.raises(ValueError, match="fit_iters must be an integer"):
            check_fit_iters(bad)
