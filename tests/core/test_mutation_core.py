"""Tests for the mutants of schedule.py and moments.py that survived the mutation run at HEAD (issue 25
item 7, benchmarks/results/mutation.md): the sigma view's input checks and float64 arithmetic,
and scale_spread without a third moment."""
import pytest
import torch

import gms_kernels as gk
from gms_kernels.core.moments import TransitionMoments, central_third_moment, scale_spread

SCHED = gk.Schedule.linear(1000)


def test_log_alpha_bar_at_a_python_float_is_computed_in_float64():
    u = 0.123456789
    pos = u * SCHED.T
    left = int(pos)
    log_abar = SCHED.alphas_cumprod.log()
    expected = log_abar[left - 1] + (pos - left) * (log_abar[left] - log_abar[left - 1])  # knots at u = (t + 1) / T
    got = SCHED.log_alpha_bar_at(u)
    assert got.dtype == torch.float64
    assert abs(float(got) - float(expected)) < 1e-12


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


def test_log_alpha_bar_at_clamps_u_to_the_unit_interval_and_interpolates_the_first_interval():
    log_abar = SCHED.alphas_cumprod.log()
    u = torch.tensor([-0.5, 0.0, 0.5 / SCHED.T, 1.0, 1.5], dtype=torch.float64)
    expected = torch.stack([torch.tensor(0.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64),
                            log_abar[0] / 2, log_abar[-1], log_abar[-1]])  # data at u = 0, index 0 at u = 1/T
    assert torch.allclose(SCHED.log_alpha_bar_at(u), expected, rtol=1e-13, atol=0)


def test_beta_at_reads_the_interval_below_u_in_float64():
    beta = -SCHED.T * torch.log1p(-SCHED.betas)  # the constant rate on ((t) / T, (t + 1) / T]
    # u = 0 is in the first interval; a knot counts as below; 1e-8 past the knot at u = 0.25 is the next
    # interval, which float32 (spacing 3e-8 there) would round back onto the knot
    for u, t in ((0.0, 0), (0.25, 249), (0.25 + 1e-8, 250), (1.0, SCHED.T - 1)):
        assert float(SCHED.beta_at(u)) == pytest.approx(float(beta[t]), rel=1e-14), u


def test_index_of_ve_sigma_breaks_ties_down_and_rounds_in_float64():
    grid = SCHED.ve_sigmas
    mid = (grid[:-1] + grid[1:]) / 2
    # an exact tie between two trained sigmas goes to the lower index (EDM's round_sigma takes the first minimum)
    k = next(k for k in range(SCHED.T - 1) if mid[k] - grid[k] == grid[k + 1] - mid[k])
    assert int(SCHED.index_of_ve_sigma(float(mid[k]))) == k
    # one float64 step above a midpoint is nearer the upper index; float32 would round it back below
    for k in range(SCHED.T - 1):
        above = torch.nextafter(mid[k], torch.tensor(float("inf"), dtype=torch.float64))
        if torch.tensor(float(above), dtype=torch.float32).double() < mid[k]:
            assert int(SCHED.index_of_ve_sigma(float(above))) == k + 1
            break
    else:
        pytest.fail("no midpoint that float32 rounds down")


def test_index_of_ve_sigma_on_one_and_two_step_schedules():
    one = gk.Schedule.from_betas([0.3])
    assert one.index_of_ve_sigma(torch.tensor([0.0, 0.1, 5.0])).tolist() == [0, 0, 0]
    two = gk.Schedule.from_betas([0.1, 0.5])
    grid = two.ve_sigmas
    probes = torch.tensor([0.0, float(grid[0]), float(grid[1]) * 0.99, 100.0], dtype=torch.float64)
    assert two.index_of_ve_sigma(probes).tolist() == [0, 0, 1, 1]


def test_ve_sigmas_of_a_schedule_built_in_the_test():
    # (built here, not at import: mutmut credits a test only with the calls made while it runs)
    schedule = gk.Schedule.from_betas([0.1, 0.5])
    abar = torch.tensor([0.9, 0.9 * 0.5], dtype=torch.float64)
    assert torch.allclose(schedule.ve_sigmas, ((1 - abar) / abar).sqrt(), rtol=1e-14, atol=0)
    assert schedule.ve_sigma(1) == pytest.approx(float(((1 - abar[1]) / abar[1]).sqrt()), rel=1e-14)


@pytest.mark.parametrize("weights", [(0.0, 1.0), (1.0, 0.0), (-0.5, 1.5)])
def test_mixture_weights_must_both_be_positive(weights):
    from gms_kernels.core.fit import check_weights

    with pytest.raises(ValueError, match="weights must be positive and sum to 1"):
        check_weights(weights)


def test_schedules_and_their_continuous_time_views_ignore_the_default_device():
    """Kills, at a72eee7 (eighth session), schedule ``log_alpha_bar_at`` 10 and 13 (the knot at u = 0 made
    on torch's default device: ``device=None`` or no device), ``karras_trajectory`` 30 and 33 (its levels on
    the default device) and ``Schedule.linear`` 9 and 14 (the betas' linspace on the default device;
    tests/test_default_device.py also kills these two, but it is outside mutmut's selection). Under a
    *meta* default device such a tensor holds no data, so the result cannot be the CPU one (as in
    tests/test_default_device.py)."""
    u = torch.tensor([0.0, 0.3, 0.75, 1.0], dtype=torch.float64)

    def views():
        schedule = gk.Schedule.linear(1000)  # built inside: mutmut credits only calls made while a test runs
        karras = torch.tensor(gk.karras_trajectory(schedule, 18), dtype=torch.float64, device="cpu")
        return torch.cat([schedule.betas, schedule.log_alpha_bar_at(u), schedule.log_alpha_bar_at(0.3).reshape(1),
                          schedule.beta_at(u), karras])

    expected = views()
    with torch.device("meta"):
        got = views()
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
