import math

import pytest
import torch

from gms_kernels.eval import metrics


def test_w1_of_a_shift_is_the_shift_for_any_sizes():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, generator=g, dtype=torch.float64)
    assert metrics.wasserstein1(x, x + 0.25) == pytest.approx(0.25, abs=1e-9)
    assert metrics.wasserstein1(x[:1000], x[:1000] + 0.25) == pytest.approx(0.25, abs=1e-9)
    # unequal sizes: W1 between {0} and {0, 1} is 1/2
    assert metrics.wasserstein1(torch.tensor([0.0]), torch.tensor([0.0, 1.0])) == pytest.approx(0.5)


def test_sliced_w1_of_a_shift():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 2, generator=g, dtype=torch.float64)
    # E|<(c, 0), u>| over unit directions u in 2-D is 2c/pi
    v = metrics.sliced_wasserstein1(x, x + torch.tensor([0.5, 0.0], dtype=torch.float64), n_projections=4000)
    assert v == pytest.approx(2 * 0.5 / math.pi, rel=0.03)
    assert metrics.sliced_wasserstein1(x, x) == 0.0


def test_kde_log_likelihood_of_a_gaussian():
    g = torch.Generator().manual_seed(0)
    samples = torch.randn(20000, 1, generator=g, dtype=torch.float64)
    data = torch.randn(4000, 1, generator=g, dtype=torch.float64)
    h = metrics.kde_bandwidth(data, samples.shape[0])
    assert h == pytest.approx(1.05 * float(data.std()) * 20000**-0.25)
    # a Gaussian KDE of N(0,1) samples is about N(0, 1 + h^2); its expected log density under N(0,1) data:
    expected = -0.5 * math.log(2 * math.pi * (1 + h * h)) - 0.5 / (1 + h * h)
    assert metrics.kde_log_likelihood(samples, data) == pytest.approx(expected, abs=0.03)


def test_energy_distance():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 2, generator=g, dtype=torch.float64)
    y = torch.randn(3000, 2, generator=g, dtype=torch.float64)
    same = metrics.energy_distance(x, y)
    shifted = metrics.energy_distance(x, y + 1.0)
    assert abs(same) < 0.01 and shifted > 0.5


def test_moment_discrepancy_vanishes_for_gaussian_data_and_not_for_mixtures():
    import gms_kernels as gk

    sched = gk.Schedule.linear()
    gauss = gk.GaussianMixtureOracle([1.0], [[0.1]], [0.3], sched)
    mix = gk.GaussianMixtureOracle([0.4, 0.6], [[-0.4], [0.3]], [0.12, 0.05], sched)
    x_t = torch.linspace(-1, 1, 7, dtype=torch.float64)[:, None]
    assert float(metrics.moment_discrepancy(gauss, x_t, 500, 300, sched, None).max()) < 1e-10
    assert float(metrics.moment_discrepancy(mix, x_t, 500, 300, sched, None).max()) > 1e-3
    few = metrics.moment_discrepancy(mix, x_t, 500, 100, sched, None).mean()
    many = metrics.moment_discrepancy(mix, x_t, 500, 480, sched, None).mean()
    assert few > many  # bigger steps are less Gaussian (paper Fig. 2)


def test_frechet_distance_matches_the_closed_form_for_commuting_covariances():
    mu1, mu2 = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0])
    s1, s2 = torch.diag(torch.tensor([1.0, 4.0])), torch.diag(torch.tensor([4.0, 1.0]))
    # |mu1-mu2|^2 + tr(s1 + s2 - 2 sqrt(s1 s2)) = 1 + (1 + 4 + 4 + 1 - 2 * (2 + 2))
    assert metrics.frechet_distance(mu1, s1, mu2, s2) == pytest.approx(3.0)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5000, 4, generator=g, dtype=torch.float64)
    assert metrics.frechet_distance(*metrics.gaussian_stats(a), *metrics.gaussian_stats(a)) == pytest.approx(0, abs=1e-9)


def test_frechet_distance_from_features_is_the_one_from_their_statistics():
    # fewer samples than dimensions (computed in their span) and more (through the covariance). The
    # covariance route rounds: a rank-deficient S1's zero eigenvalues come out near 1e-16 of its largest,
    # and their square roots add up to ~1e-8 of the result
    g = torch.Generator().manual_seed(1)
    mix = torch.randn(40, 40, generator=g, dtype=torch.float64)
    ref = torch.relu(torch.randn(30, 40, generator=g, dtype=torch.float64) @ mix)
    for n in (2, 7, 40, 90):
        f = torch.relu(torch.randn(n, 40, generator=g, dtype=torch.float64) @ mix + 0.5)
        want = metrics.frechet_distance(*metrics.gaussian_stats(f), *metrics.gaussian_stats(ref))
        assert want > 1.0
        assert metrics.frechet_distance_features(f, *metrics.gaussian_stats(ref)) == pytest.approx(want, rel=1e-7), n
    few = torch.randn(5, 40, generator=g, dtype=torch.float64)
    assert metrics.frechet_distance_features(few, *metrics.gaussian_stats(few)) == pytest.approx(0, abs=1e-9)
    with pytest.raises(ValueError, match="features of dimension 40, mu \\(39,\\)"):
        metrics.frechet_distance_features(few, torch.zeros(39), torch.eye(39))
    with pytest.raises(ValueError, match="at least two feature vectors"):
        metrics.frechet_distance_features(few[:1], torch.zeros(40), torch.eye(40))


def test_fd_digits_separates_real_from_noise():
    import gms_kernels as gk

    real = gk.data.digits("train")[0]
    test = gk.data.digits("test")[0]
    noise = torch.rand(359, 1, 8, 8) * 2 - 1
    assert metrics.fd_digits(test, real) < 0.2 * metrics.fd_digits(noise, real)


def test_fid_without_weights_says_what_to_download():
    """(FID itself is tested in test_inception.py, on random weights checked against pytorch-fid.)"""
    with pytest.raises(ValueError, match="needs InceptionV3 weights"):
        metrics.fid(torch.zeros(2, 3, 8, 8), torch.zeros(2, 3, 8, 8))


def test_npz_statistics_roundtrip(tmp_path):
    mu, sigma = torch.randn(5, dtype=torch.float64), torch.eye(5, dtype=torch.float64) * 2
    metrics.save_stats(tmp_path / "s.npz", mu, sigma)
    m2, s2 = metrics.load_stats(tmp_path / "s.npz")
    assert torch.equal(m2, mu) and torch.equal(s2, sigma)
    import numpy as np
    np.savez(tmp_path / "bad.npz", mean=mu.numpy())
    with pytest.raises(ValueError, match="needs arrays mu and sigma"):
        metrics.load_stats(tmp_path / "bad.npz")


# -- edges and options the quality tables rely on (found by mutation testing of metrics.py) --------------------
def test_w1_matches_scipy_for_unequal_sizes_with_ties_in_either_order():
    from scipy.stats import wasserstein_distance

    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 5, (7,), generator=g).double()
    y = torch.randint(0, 5, (12,), generator=g).double()
    expected = wasserstein_distance(x.numpy(), y.numpy())
    assert metrics.wasserstein1(x, y) == pytest.approx(expected, abs=1e-12)
    assert metrics.wasserstein1(y, x) == pytest.approx(expected, abs=1e-12)
    assert metrics.wasserstein1(torch.tensor([0.0, 1.0]), torch.tensor([0.0])) == pytest.approx(0.5)


def test_w1_takes_a_single_point_and_refuses_an_empty_side():
    assert metrics.wasserstein1(torch.tensor([0.0, 2.0]), torch.tensor([1.0])) == pytest.approx(1.0)
    for x, y in ((torch.zeros(0), torch.ones(3)), (torch.ones(3), torch.zeros(0))):
        with pytest.raises(ValueError, match="non-empty"):
            metrics.wasserstein1(x, y)


def test_sliced_w1_in_one_dimension_is_the_exact_w1():
    x = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    y = torch.tensor([[0.5], [2.0]], dtype=torch.float64)
    assert metrics.sliced_wasserstein1(x, y) == metrics.wasserstein1(x.flatten(), y.flatten())


def test_sliced_w1_of_unequal_sizes_equals_that_of_the_same_distribution_at_equal_sizes():
    # repeating every point leaves the empirical distribution as it is, so the general path (unequal sizes)
    # must give what the equal-size path gives, projection by projection
    g = torch.Generator().manual_seed(2)
    x = torch.randn(60, 3, generator=g, dtype=torch.float64)
    y = torch.randn(60, 3, generator=g, dtype=torch.float64) + 0.3
    equal = metrics.sliced_wasserstein1(x, y, n_projections=16, seed=5)
    assert metrics.sliced_wasserstein1(x, torch.cat([y, y]), n_projections=16, seed=5) == pytest.approx(equal, abs=1e-12)


def test_sliced_w1_defaults_are_128_projections_and_seed_0():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(50, 4, generator=g), torch.randn(50, 4, generator=g)
    assert metrics.sliced_wasserstein1(x, y) == metrics.sliced_wasserstein1(x, y, n_projections=128, seed=0)
    assert metrics.sliced_wasserstein1(x, y) != metrics.sliced_wasserstein1(x, y, n_projections=129, seed=0)
    assert metrics.sliced_wasserstein1(x, y) != metrics.sliced_wasserstein1(x, y, n_projections=128, seed=1)


def test_kde_log_likelihood_closed_form_with_a_given_bandwidth():
    # one kernel at the origin, evaluated at the origin in 3-D: log N(0; 0, h^2 I) = -1.5 log(2 pi h^2)
    zero = torch.zeros(1, 3, dtype=torch.float64)
    assert metrics.kde_log_likelihood(zero, zero, bandwidth=0.5) == pytest.approx(-1.5 * math.log(2 * math.pi * 0.25))
    # two kernels, one data point on each: the mixture halves every density
    pts = torch.tensor([[0.0, 0.0, 0.0], [100.0, 0.0, 0.0]], dtype=torch.float64)
    assert metrics.kde_log_likelihood(pts, pts, bandwidth=0.5) == pytest.approx(
        -1.5 * math.log(2 * math.pi * 0.25) - math.log(2))
    with pytest.raises(ValueError, match="positive"):
        metrics.kde_log_likelihood(zero, zero, bandwidth=0.0)


def _record_cdist_sizes(monkeypatch) -> list[tuple[int, int]]:
    """Every torch.cdist call's (rows of a, rows of b), as energy_distance makes them."""
    sizes, real = [], torch.cdist
    monkeypatch.setattr(torch, "cdist", lambda a, b: sizes.append((a.shape[0], b.shape[0])) or real(a, b))
    return sizes


def test_energy_distance_uses_at_most_max_points_of_each_side(monkeypatch):
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(50, 2, generator=g), torch.randn(40, 2, generator=g)
    rows = _record_cdist_sizes(monkeypatch)
    first = metrics.energy_distance(x, y, max_points=10, seed=7)
    assert rows and all(r <= 10 and c == 10 for r, c in rows)
    assert metrics.energy_distance(x, y, max_points=10, seed=7) == first  # seeded subsets
    rows.clear()
    metrics.energy_distance(x, y)  # the default (5000) takes every point
    assert sorted(set(c for _, c in rows)) == [40, 50]


def test_gaussian_stats_take_two_rows_and_one_column_but_not_one_row():
    mu, sigma = metrics.gaussian_stats(torch.tensor([[1.0], [3.0]]))
    assert mu.tolist() == [2.0] and sigma.tolist() == [[2.0]]
    with pytest.raises(ValueError, match="two feature vectors"):
        metrics.gaussian_stats(torch.ones(1, 4))


def test_frechet_distance_refuses_each_kind_of_mismatch():
    mu3, s3, mu4, s4 = torch.zeros(3), torch.eye(3), torch.zeros(4), torch.eye(4)
    for args in ((mu3, s3, mu4, s3), (mu3, s3, mu3, s4), (mu4, s3, mu4, s3)):
        with pytest.raises(ValueError, match="mismatched statistics"):
            metrics.frechet_distance(*args)


def test_load_stats_refuses_pickled_arrays_and_files_without_mu_and_sigma(tmp_path):
    import numpy as np

    np.savez(tmp_path / "pickled.npz", mu=np.array([{"a": 1}], dtype=object), sigma=np.eye(1))
    with pytest.raises(ValueError, match="allow_pickle"):
        metrics.load_stats(tmp_path / "pickled.npz")
    np.savez(tmp_path / "mu_only.npz", mu=np.zeros(2))
    with pytest.raises(ValueError, match="pytorch-fid statistics"):
        metrics.load_stats(tmp_path / "mu_only.npz")


def test_seed_interval_level_must_lie_strictly_between_0_and_1():
    for level in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="level"):
            metrics.seed_interval([1.0, 2.0, 4.0], level=level)


def test_paired_difference_uses_its_level_and_calls_identical_rows_not_significant():
    a, b = [10.0, 11.0, 12.5, 9.0, 10.5], [12.0, 12.5, 13.0, 10.0, 13.0]
    diffs = [x - y for x, y in zip(a, b)]
    for level in (0.5, 0.99):
        diff, _ = metrics.paired_difference(a, b, level=level)
        assert diff == metrics.seed_interval(diffs, level=level)
    # every per-seed difference 0: the interval is [0, 0], which contains 0
    diff, significant = metrics.paired_difference([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert (diff.low, diff.high) == (0.0, 0.0) and not significant


def test_dct_features_of_non_square_images_against_scipy():
    from scipy.fft import dctn

    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 2, 4, 6, generator=g, dtype=torch.float64)
    c = torch.from_numpy(dctn(x.numpy(), type=2, norm="ortho", axes=(2, 3)))
    expected = c.abs()
    expected[:, :, 0, 0] = c[:, :, 0, 0]
    got = metrics.dct_features(x)
    assert got.shape == (3, 2 * 4 * 6)
    torch.testing.assert_close(got, expected.reshape(3, -1))


def test_energy_distance_defaults_are_5000_points_and_seed_0(monkeypatch):
    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(5001, 1, generator=g), torch.randn(30, 1, generator=g)
    assert metrics.energy_distance(x, y) == metrics.energy_distance(x, y, max_points=5000, seed=0)
    assert metrics.energy_distance(x, y) != metrics.energy_distance(x, y, max_points=5000, seed=1)
    rows = _record_cdist_sizes(monkeypatch)
    metrics.energy_distance(x, y)
    assert max(c for _, c in rows) == 5000
