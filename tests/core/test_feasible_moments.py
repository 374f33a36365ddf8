"""feasible_moments: (mean, var, kappa3) that some distribution on the data range has, and no change to moments
that are feasible already."""
import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from gms_kernels.core.moments import (X0Moments, central_third_moment, feasible_moments, feasible_x0_moments,
                                      first_moment, second_central_moment, third_moment_bounds, third_raw_moment,
                                      x0_moments)
from gms_kernels.core.schedule import Schedule

RANGES = [(-1.0, 1.0), (0.0, 3.0), (-2.5, -0.5)]


def attaining_law(m: float, v: float, k: float, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Points and weights of a distribution with mean m, variance v and third central moment k, built without
    the library: a mixture of the two-point law that puts mass at hi and the one that puts mass at lo (both with
    mean m and variance v; a mixture of laws with one mean keeps the mean and variance and mixes the third
    central moment linearly). The caller checks that the points lie in the range and the weights are a law."""
    if v == 0.0:
        return np.array([m]), np.array([1.0])
    a, b = m - lo, hi - m
    up_points = np.array([m - v / b, hi])  # weights making the mean m
    up_weights = np.array([b, v / b]) / (b + v / b)
    down_points = np.array([lo, m + v / a])
    down_weights = np.array([v / a, a]) / (a + v / a)
    k_up = float(up_weights @ (up_points - m) ** 3)
    k_down = float(down_weights @ (down_points - m) ** 3)
    # (at the Bhatia-Davis bound both laws are the one on {lo, hi}: any mixture will do)
    theta = 0.5 if abs(k_up - k_down) <= 1e-9 * (hi - lo) ** 3 else (k - k_down) / (k_up - k_down)
    return np.concatenate([up_points, down_points]), np.concatenate([theta * up_weights, (1 - theta) * down_weights])


def assert_attained(mean: torch.Tensor, var: torch.Tensor, kappa3: torch.Tensor, lo: float, hi: float) -> None:
    width = hi - lo
    for m, v, k in zip(mean.tolist(), var.tolist(), kappa3.tolist()):
        points, weights = attaining_law(m, v, k, lo, hi)
        tol = 1e-9 * width
        assert points.min() >= lo - tol and points.max() <= hi + tol, (m, v, k, points)
        assert weights.min() >= -1e-9 and abs(weights.sum() - 1.0) < 1e-12, (m, v, k, weights)
        assert abs(weights @ points - m) <= tol
        assert abs(weights @ (points - m) ** 2 - v) <= 1e-9 * width**2
        assert abs(weights @ (points - m) ** 3 - k) <= 1e-9 * width**3, (m, v, k)


def adversarial(lo: float, hi: float, n: int = 3000, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random head outputs far outside what the range allows, plus hand-made edge cases."""
    g = torch.Generator().manual_seed(seed)
    width, centre = hi - lo, (hi + lo) / 2
    mean = centre + width * torch.randn(n, generator=g, dtype=torch.float64)
    var = width**2 * torch.randn(n, generator=g, dtype=torch.float64) * 10 ** torch.randint(-6, 2, (n,), generator=g)
    kappa3 = width**3 * torch.randn(n, generator=g, dtype=torch.float64) * 10 ** torch.randint(-8, 8, (n,), generator=g)
    edges = torch.tensor([
        # mean,          var,            kappa3
        [lo,             0.0,            0.0],
        [hi,             0.0,            1.0],
        [lo,             0.3 * width**2, -1.0],   # mean at an end: var and kappa3 must go to 0
        [hi,             width**2,       1e300],
        [centre,         0.0,            5.0],    # no spread: no skew
        [centre,         width**2,       -1e300],  # above Bhatia-Davis
        [centre,         -1.0,           1.0],    # negative variance
        [lo - 1e6,       1.0,            1.0],    # mean far outside
        [hi + 1e-12,     1e-30,          1e-30],
        [lo + 1e-300,    1.0,            1.0],    # room below the mean of one subnormal step
        [centre,         width**2 / 4,   width**3],  # the two-point law on the ends, overshot
        [centre,         float("inf"),   float("-inf")],
    ], dtype=torch.float64)
    return (torch.cat([mean, edges[:, 0]]), torch.cat([var, edges[:, 1]]), torch.cat([kappa3, edges[:, 2]]))


@pytest.mark.parametrize("data_range", RANGES)
def test_adversarial_heads_give_moments_some_law_on_the_range_has(data_range):
    lo, hi = data_range
    mean, var, kappa3 = feasible_moments(*adversarial(lo, hi), data_range)
    assert torch.isfinite(mean).all() and torch.isfinite(var).all() and torch.isfinite(kappa3).all()
    assert mean.dtype == var.dtype == kappa3.dtype == torch.float64
    assert_attained(mean, var, kappa3, lo, hi)
    # the clips bind where they must: some outputs sit on each bound
    least, greatest = third_moment_bounds(mean, var, data_range)
    assert (kappa3 == greatest).any() and (kappa3 == least).any() and (var == (mean - lo) * (hi - mean)).any()


def test_the_skew_bound_is_sharp_against_a_linear_program_over_laws_on_a_grid():
    """The greatest and least third central moment over every law on a fine grid of [lo, hi] with the given mean
    and variance (a linear program in the weights) match third_moment_bounds: no grid law exceeds them, and the
    best ones come within the grid's resolution."""
    lo, hi = -1.0, 2.0
    grid = np.linspace(lo, hi, 601)
    for m, v in [(0.5, 0.3), (0.5, 2.2), (-0.7, 0.1), (1.9, 0.05), (0.0, 1e-3)]:
        y = grid - m
        equalities = np.stack([np.ones_like(grid), y, y**2])
        found = []
        for sign in (1.0, -1.0):
            lp = linprog(-sign * y**3, A_eq=equalities, b_eq=[1.0, 0.0, v], bounds=(0, None), method="highs")
            assert lp.status == 0
            found.append(sign * -lp.fun)
        least, greatest = third_moment_bounds(torch.tensor([m], dtype=torch.float64),
                                              torch.tensor([v], dtype=torch.float64), (lo, hi))
        assert found[0] <= greatest.item() + 1e-9 and found[1] >= least.item() - 1e-9
        assert found[0] >= greatest.item() - 1e-3 and found[1] <= least.item() + 1e-3, (m, v, found)


@pytest.mark.parametrize("data_range", RANGES)
def test_moments_of_real_bounded_data_come_back_bit_for_bit(data_range):
    lo, hi = data_range
    g = torch.Generator().manual_seed(3)
    n, elements = 200, 500
    shape = torch.rand(2, elements, generator=g, dtype=torch.float64) * 5 + 0.2
    u = torch.distributions.Beta(shape[0], shape[1]).sample((n,))
    data = lo + (hi - lo) * u
    data[: n // 10, ::7] = hi  # some mass on the ends too
    data[n // 10: n // 5, ::5] = lo
    for dtype in (torch.float64, torch.float32):
        x = data.to(dtype)
        mean = x.mean(0)
        var = ((x - mean) ** 2).mean(0)
        kappa3 = ((x - mean) ** 3).mean(0)
        out = feasible_moments(mean, var, kappa3, data_range)
        for given, back in zip((mean, var, kappa3), out):
            assert back.dtype == dtype and torch.equal(given, back)


def discrete_exact_heads(points: torch.Tensor, prior: torch.Tensor, x_t: torch.Tensor, a: float, sigma: float):
    """Exact E[eps^k | x_t] (k = 1, 2, 3) for data x_0 on ``points`` with probabilities ``prior``, per element."""
    eps = (x_t[..., None] - a * points) / sigma  # eps given x_t and x_0 = each point
    log_w = prior.log() - 0.5 * eps**2
    w = torch.softmax(log_w, dim=-1)
    return tuple((w * eps**k).sum(-1) for k in (1, 2, 3))


def test_exact_heads_of_bounded_data_change_nothing():
    """Heads that are exact for data on [lo, hi] give feasible moments: the option leaves them (and the raw
    moments the transition is built from) exactly as they are."""
    lo, hi = -1.0, 1.0
    points = torch.tensor([-1.0, -0.55, -0.1, 0.2, 0.7, 1.0], dtype=torch.float64)
    prior = torch.tensor([0.1, 0.3, 0.15, 0.2, 0.15, 0.1], dtype=torch.float64)
    schedule = Schedule.linear()
    g = torch.Generator().manual_seed(4)
    for t in (150, 400, 700):
        a, sigma = schedule.alpha(t), schedule.sigma(t)
        x0 = points[torch.multinomial(prior, 4000, replacement=True, generator=g)]
        x_t = a * x0 + sigma * torch.randn(x0.shape, generator=g, dtype=torch.float64)
        e1, e2, e3 = discrete_exact_heads(points, prior, x_t, a, sigma)
        m = x0_moments(x_t, e1, e2, e3, a, sigma)
        kappa3 = central_third_moment(m.mean, m.var, m.m3)
        out = feasible_moments(m.mean, m.var, kappa3, (lo, hi))
        assert all(torch.equal(x, y) for x, y in zip(out, (m.mean, m.var, kappa3)))
        kept = feasible_x0_moments(m, (lo, hi))
        assert all(torch.equal(x, y) for x, y in zip((kept.mean, kept.var, kept.m2, kept.m3),
                                                      (m.mean, m.var, m.m2, m.m3)))


def test_edge_cases_at_the_ends_and_without_spread():
    lo, hi = 0.0, 1.0
    mean = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    var = torch.tensor([0.0, 0.0, 0.2, 0.2, 0.0, 0.25])
    kappa3 = torch.tensor([0.1, -0.1, 0.1, -0.1, 0.3, 0.3])
    m, v, k = feasible_moments(mean, var, kappa3, (lo, hi))
    assert m.dtype == torch.float32 and torch.isfinite(k).all()
    assert torch.equal(m, mean)
    assert v.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 0.25]
    assert k.abs().tolist() == [0.0] * 6  # at an end or without spread nothing can be skewed; the fair coin is not


def test_unbounded_data_only_needs_a_nonnegative_variance():
    mean = torch.tensor([-5.0, 0.0, 3.0, 1.0], dtype=torch.float64)
    var = torch.tensor([-1.0, 0.0, 2.0, 0.25], dtype=torch.float64)
    kappa3 = torch.tensor([7.0, 7.0, -1e30, 0.5], dtype=torch.float64)
    m, v, k = feasible_moments(mean, var, kappa3, None)
    assert torch.equal(m, mean) and v.tolist() == [0.0, 0.0, 2.0, 0.25] and k.tolist() == [0.0, 0.0, -1e30, 0.5]
    assert feasible_moments(mean, var, None, (-1.0, 1.0))[2] is None
    m, v, k = feasible_moments(mean, var, None, None)
    assert k is None and torch.equal(m, mean) and v.tolist() == [0.0, 0.0, 2.0, 0.25]


def test_feasible_x0_moments_give_the_transition_exactly_the_feasible_skew():
    """Where the clips move the moments, the rebuilt raw moments carry them into q(x_s|x_t): its central third
    moment is c2^3 times the feasible kappa3 of x_0 and its variance lam2 + c2^2 var (the official clamps,
    by contrast, add a term in M1 wherever E[x0^2] and Var disagree)."""
    schedule = Schedule.linear()
    k = schedule.coefficients(400, 300)
    g = torch.Generator().manual_seed(5)
    x_t = torch.randn(2000, generator=g, dtype=torch.float64)
    e1 = x_t * 0.8 + 0.3 * torch.randn(2000, generator=g, dtype=torch.float64)
    e2 = e1**2 + torch.randn(2000, generator=g, dtype=torch.float64)  # negative variances too
    e3 = 10 * torch.randn(2000, generator=g, dtype=torch.float64)
    m = feasible_x0_moments(x0_moments(x_t, e1, e2, e3, k.a_t, k.sigma_t), (-1.0, 1.0))
    mean, var, kappa3 = m.mean, m.var, central_third_moment(m.mean, m.var, m.m3)
    assert_attained(mean, var, kappa3, -1.0, 1.0)
    m1 = first_moment(x_t, mean, k)
    transition_var = second_central_moment(var, k)
    skew = central_third_moment(m1, transition_var, third_raw_moment(x_t, m, m1, k))
    torch.testing.assert_close(skew, k.c2**3 * kappa3, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="e2 head"):
        feasible_x0_moments(X0Moments(mean, None), (-1.0, 1.0))
    with pytest.raises(ValueError, match="e2 head"):  # (a raw second moment without the variance is not enough)
        feasible_x0_moments(X0Moments(mean, None, m.m2, m.m3), (-1.0, 1.0))


def test_bad_input_is_refused():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="low < high"):
        feasible_moments(x, x, x, (1.0, -1.0))
    with pytest.raises(TypeError, match="var must be a floating-point tensor"):
        feasible_moments(x, torch.zeros(3, dtype=torch.long), x, (-1.0, 1.0))
    with pytest.raises(TypeError, match="mean must be a floating-point tensor, got float"):
        feasible_moments(0.5, x, x, (-1.0, 1.0))
    with pytest.raises(TypeError, match="kappa3 must be a floating-point tensor, got torch.int32"):
        feasible_moments(x, x, torch.zeros(3, dtype=torch.int32), None)
