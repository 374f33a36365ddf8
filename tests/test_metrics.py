import math

import pytest
import torch

from gms_kernels import metrics


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
