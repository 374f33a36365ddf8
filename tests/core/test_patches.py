"""The natural-image patches: data split by photo, and the FD-|DCT| metric."""
import pytest
import scipy.fft
import torch

from gms_kernels.core import data
from gms_kernels.eval import metrics


def test_splits_are_disjoint_by_photo_and_cover_every_photo():
    splits = {s: set(data.patch_photos(s)) for s in data.PATCH_SPLITS}
    assert all(splits.values())
    assert not splits["train"] & splits["validation"]
    assert not splits["train"] & splits["test"]
    assert not splits["validation"] & splits["test"]
    assert set().union(*splits.values()) == set(data.PATCH_PHOTOS)
    with pytest.raises(ValueError, match="unknown split"):
        data.patches("all")


def test_patches_are_deterministic_in_range_and_cut_from_their_photo():
    a = data.patches("validation", per_photo=64)
    b = data.patches("validation", per_photo=64)
    assert a.shape == (128, 1, 8, 8) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert not torch.equal(a, data.patches("validation", per_photo=64, seed=1))
    assert a.min() >= -1 and a.max() <= 1 and a.std() > 0.1
    # every patch is a crop of its photo, rescaled 2 v - 1: find the first one in the first photo
    photo = 2 * data.photo_grey(data.patch_photos("validation")[0]) - 1
    crops = photo.unfold(0, 8, 1).unfold(1, 8, 1).reshape(-1, 64)
    assert (crops - a[0].double().reshape(64)).abs().amax(dim=1).min() < 1e-6
    assert data.patches("test", size=16, per_photo=3).shape == (6, 1, 16, 16)


def test_no_test_patch_is_found_in_train():
    train = {tuple(r.tolist()) for r in data.patches("train", per_photo=2000).reshape(-1, 64)}
    test = data.patches("test", per_photo=500).reshape(-1, 64)
    flat = test.std(dim=1) > 0.02  # flat (saturated) patches can coincide across photos
    assert not any(tuple(r.tolist()) in train for r in test[flat])


def test_dct_matrix_against_scipy_and_orthonormal():
    m = metrics.dct_matrix(8)
    ref = torch.from_numpy(scipy.fft.dct(torch.eye(8, dtype=torch.float64).numpy(), norm="ortho", axis=0))
    assert torch.allclose(m, ref, atol=1e-14)
    assert torch.allclose(m @ m.T, torch.eye(8, dtype=torch.float64), atol=1e-14)


def test_fd_dct_is_zero_for_identical_sets_and_detects_a_shift_and_gaussian_patches():
    x = data.patches("test", per_photo=1500)
    assert metrics.frechet_distance_dct(x, x.clone()) == pytest.approx(0.0, abs=1e-8)
    # a brightness shift of 0.1 moves the DC coefficient by 0.1 * 8: FD >= 0.64
    assert metrics.frechet_distance_dct(x + 0.1, x) == pytest.approx(0.64, rel=0.05)
    # a Gaussian with the patches' own mean and covariance: pixel FD ~ 0, FD-|DCT| sees the difference
    mu, cov = metrics.gaussian_stats(x)
    g = torch.distributions.MultivariateNormal(mu, cov + 1e-9 * torch.eye(64, dtype=torch.float64))
    torch.manual_seed(0)
    gauss = g.sample((x.shape[0],)).reshape(x.shape)
    other = data.patches("test", per_photo=1500, seed=1)
    pixel_fd = metrics.frechet_distance(*metrics.gaussian_stats(gauss), mu, cov)
    assert pixel_fd < 0.05
    assert metrics.frechet_distance_dct(gauss, x) > 5 * metrics.frechet_distance_dct(other, x)
    with pytest.raises(ValueError, match="images"):
        metrics.dct_features(x.reshape(x.shape[0], -1))
