import math

import pytest
import torch

import gms_kernels as gk
from conftest import image_oracle
from gms_kernels.core.moments import (TransitionMoments, X0Moments, central_moments, central_third_moment,
                                      check_data_range, check_pixel_levels, clamp_x0_moments, clamped_x0_mean,
                                      last_step_variance_cap, raw_moments, scale_spread, transition_moments)


@pytest.mark.parametrize("t,s", [(999, 899), (500, 300), (99, 0), (40, gk.DATA)])
def test_oracle_moments_equal_monte_carlo_of_exact_kernel(paper_oracle, t, s):
    """(M1, Var, M3) from the oracle heads vs Monte-Carlo moments of the exact reverse kernel."""
    sched = paper_oracle.schedule
    k = sched.coefficients(t, s)
    x_t = torch.tensor([[-1.3], [-0.2], [0.25], [0.9]], dtype=torch.float64) * max(sched.alpha(t), 0.3)
    out = paper_oracle(x_t, t)
    mom = gk.transition_moments(x_t, out[:, :1], out[:, 1:2], out[:, 2:3], k, data_range=None)
    n = 400_000
    g = torch.Generator().manual_seed(0)
    for i in range(x_t.shape[0]):
        xs = paper_oracle.exact_step(x_t[i:i + 1].expand(n, 1), k, torch.rand(n, generator=g),
                                     torch.randn(n, 1, generator=g, dtype=torch.float64)).flatten()
        se = xs.std() / n**0.5
        assert float(mom.m1[i]) == pytest.approx(float(xs.mean()), abs=5 * float(se))
        se_var = ((xs - xs.mean()) ** 2).std() / n**0.5
        assert float(mom.var[i]) == pytest.approx(float(xs.var()), abs=5 * float(se_var) + 1e-12)
        se3 = (xs**3).std() / n**0.5
        assert float(mom.m3[i]) == pytest.approx(float((xs**3).mean()), abs=5 * float(se3))


def test_oracle_moments_in_higher_dimensions(small_schedule):
    oracle = image_oracle(small_schedule, (2, 3))
    k = small_schedule.coefficients(60, 30)
    x_t = torch.randn(1, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    out = oracle(x_t, 60)
    mom = gk.transition_moments(x_t, out[:, :2], out[:, 2:4], out[:, 4:], k, data_range=None)
    n = 300_000
    g = torch.Generator().manual_seed(1)
    xs = oracle.exact_step(x_t.expand(n, 2, 3), k, torch.rand(n, generator=g),
                           torch.randn(n, 2, 3, generator=g, dtype=torch.float64))
    se = xs.std(0) / n**0.5
    assert ((mom.m1[0] - xs.mean(0)).abs() < 5 * se).all()
    assert ((mom.m3[0] - (xs**3).mean(0)).abs() < 5 * (xs**3).std(0) / n**0.5).all()


def test_x0_moments_identities():
    g = torch.Generator().manual_seed(0)
    x_t, e1 = torch.randn(50, dtype=torch.float64, generator=g), torch.randn(50, dtype=torch.float64, generator=g)
    e2 = e1**2 + torch.rand(50, dtype=torch.float64, generator=g)
    e3 = torch.randn(50, dtype=torch.float64, generator=g)
    m = gk.x0_moments(x_t, e1, e2, e3, 0.6, 0.8)
    torch.testing.assert_close(m.m2 - m.mean**2, m.var)  # the two forms of Var[x0|x_t] agree
    eps_m3 = e3  # E[x0^3] by direct expansion with x0 = (x_t - 0.8 eps)/0.6
    direct = (x_t**3 - 3 * 0.8 * x_t**2 * e1 + 3 * 0.64 * x_t * e2 - 0.512 * eps_m3) / 0.216
    torch.testing.assert_close(m.m3, direct)


def test_reference_clamps_on_unit_range():
    m = X0Moments(mean=torch.tensor([1.5, -0.2, 0.1]), var=torch.tensor([2.0, -0.1, 0.3]),
                  m2=torch.tensor([1.7, 0.5, -0.1]), m3=torch.tensor([3.0, -0.1, 0.5]))
    c = clamp_x0_moments(m, (-1.0, 1.0))
    torch.testing.assert_close(c.mean, torch.tensor([1.0, -0.2, 0.1]))
    torch.testing.assert_close(c.var, torch.tensor([1.0, 0.0, 0.3]))
    torch.testing.assert_close(c.m2, torch.tensor([1.0, 0.5, 0.0]))
    # |m3| > |mean| -> replaced by the (clamped) mean, then clipped to [-1, 1]
    torch.testing.assert_close(c.m3, torch.tensor([1.0, -0.1, 0.1]))
    assert clamp_x0_moments(m, None) is m


def test_clamps_scale_with_the_data_range():
    """Clamping data in [0, 255] equals clamping the same data mapped to [-1, 1]."""
    g = torch.Generator().manual_seed(0)
    y = X0Moments(mean=torch.randn(200, generator=g, dtype=torch.float64),
                  var=torch.rand(200, generator=g, dtype=torch.float64) * 1.5,
                  m2=torch.rand(200, generator=g, dtype=torch.float64) * 1.5,
                  m3=torch.randn(200, generator=g, dtype=torch.float64))
    c, h = 127.5, 127.5  # x = c + h y
    x = X0Moments(mean=c + h * y.mean, var=h * h * y.var, m2=c * c + 2 * c * h * y.mean + h * h * y.m2,
                  m3=c**3 + 3 * c * c * h * y.mean + 3 * c * h * h * y.m2 + h**3 * y.m3)
    cy, cx = clamp_x0_moments(y, (-1.0, 1.0)), clamp_x0_moments(x, (0.0, 255.0))
    torch.testing.assert_close(cx.mean, c + h * cy.mean)
    torch.testing.assert_close(cx.var, h * h * cy.var)
    torch.testing.assert_close(cx.m2, c * c + 2 * c * h * cy.mean + h * h * cy.m2)
    torch.testing.assert_close(cx.m3, c**3 + 3 * c * c * h * cy.mean + 3 * c * h * h * cy.m2 + h**3 * cy.m3)


def test_transition_variance_is_clamped_with_a_range():
    k = gk.Schedule.linear().coefficients(999, 500)
    x_t = torch.zeros(4, 1, dtype=torch.float64)
    e1, e2, e3 = torch.zeros_like(x_t), torch.full_like(x_t, 1e6), torch.zeros_like(x_t)
    assert float(gk.transition_moments(x_t, e1, e2, e3, k).var.max()) <= 1.0
    assert float(gk.transition_moments(x_t, e1, e2, e3, k, data_range=None).var.max()) > 1.0


def test_scale_spread_keeps_a_missing_third_moment_missing_and_the_skewness_of_a_given_one():
    m1 = torch.tensor([0.3, -1.2], dtype=torch.float64)
    var = torch.tensor([0.5, 0.02], dtype=torch.float64)
    scaled = scale_spread(TransitionMoments(m1, var, None), 2.0)
    assert scaled.m3 is None and torch.equal(scaled.m1, m1) and torch.allclose(scaled.var, 2.0 * var, rtol=0)
    kappa3 = torch.tensor([0.1, -0.001], dtype=torch.float64)
    m3 = kappa3 + 3 * m1 * var + m1**3
    scaled = scale_spread(TransitionMoments(m1, var, m3), 2.0)
    skew = central_third_moment(scaled.m1, scaled.var, scaled.m3) / scaled.var**1.5
    assert torch.allclose(skew, kappa3 / var**1.5, rtol=1e-10)


def test_transition_moments_leave_the_missing_orders_none():
    """From e1 alone only M1 exists (Var and M3 stay None); from e1 and e2, M3 stays None."""
    k = gk.Schedule.linear().coefficients(500, 400)
    x, e = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64) * 0.1
    only_mean = transition_moments(x, e, None, None, k)
    assert only_mean.var is None and only_mean.m3 is None
    with_var = transition_moments(x, e, e * e + 0.5, None, k)
    assert with_var.var is not None and with_var.m3 is None


def test_third_moment_clamp_keeps_a_tie():
    """The official rule replaces E[y^3] by E[y] only where |E[y^3]| > |E[y]| (strictly): at a tie of
    opposite signs E[y^3] = -E[y] it is kept."""
    m = X0Moments(mean=torch.tensor([0.5, 0.5], dtype=torch.float64), var=torch.tensor([0.1, 0.1], dtype=torch.float64),
                  m2=torch.tensor([0.35, 0.35], dtype=torch.float64), m3=torch.tensor([-0.5, -0.6], dtype=torch.float64))
    out = clamp_x0_moments(m, (-1.0, 1.0))
    assert out.m3.tolist() == [-0.5, 0.5]


def test_empty_data_range_and_fractional_step_times_are_refused_by_name():
    with pytest.raises(ValueError, match="low < high"):
        check_data_range((0.5, 0.5))
    assert check_data_range((0, 1)) == (0.0, 1.0)
    s = gk.Schedule.linear(100)
    with pytest.raises(ValueError, match="^t must be an integer"):
        s.coefficients(50.5, 10)
    with pytest.raises(ValueError, match="^s must be an integer"):
        s.coefficients(50, 10.5)


def test_raw_and_central_moments_convert_both_ways():
    """A two-point law (x = -1 w.p. 0.8, 4 w.p. 0.2): mean 0, var 4, kappa3 = 0.8 (-1) + 0.2 (64) = 12; raw
    moments 4 and 12. The conversions are exact here and each other's inverse."""
    m1, m2, m3 = (torch.tensor([v], dtype=torch.float64) for v in (0.0, 4.0, 12.0))
    var, kappa3 = central_moments(m1, m2, m3)
    assert var.item() == 4.0 and kappa3.item() == 12.0
    shifted = torch.tensor([1.5], dtype=torch.float64)  # (the same law moved by 1.5)
    raw2, raw3 = raw_moments(shifted, var, kappa3)
    assert raw2.item() == 1.5**2 + 4 and raw3.item() == 1.5**3 + 3 * 1.5 * 4 + 12
    assert [v.item() for v in central_moments(shifted, raw2, raw3)] == [4.0, 12.0]
    assert central_moments(m1, m2)[1] is None and raw_moments(m1, var)[1] is None


def test_clamped_x0_mean_is_the_clamped_tweedie_estimate():
    x_t = torch.tensor([0.3, 5.0, -5.0], dtype=torch.float64)
    e1 = torch.tensor([0.1, -1.0, 1.0], dtype=torch.float64)
    a, sigma = 0.6, 0.8
    raw = (x_t - sigma * e1) / a
    assert torch.equal(clamped_x0_mean(x_t, e1, a, sigma, None), raw)
    assert torch.equal(clamped_x0_mean(x_t, e1, a, sigma, (-1.0, 1.0)), raw.clamp(-1.0, 1.0))
    # (another range is clamped in its normalised coordinates, (x0 - 1) / 1: equal up to rounding)
    torch.testing.assert_close(clamped_x0_mean(x_t, e1, a, sigma, (0.0, 2.0)), raw.clamp(0.0, 2.0), rtol=0, atol=1e-15)


def test_pixel_levels_take_any_integer_from_two():
    assert check_pixel_levels(2) == 2 and check_pixel_levels(None) is None
    # two levels on [-1, 1]: one level is the whole range
    assert last_step_variance_cap((-1.0, 1.0), 1.0, 2) == pytest.approx(4.0 * math.pi / 2, rel=1e-15)
    for bad in (1, 0, True, 2.5):
        with pytest.raises(ValueError, match="pixel_levels must be an integer >= 2"):
            check_pixel_levels(bad)
