"""GaussianMixtureOracle's three routes to the exact heads agree: the matrix-product route of one time index (any
diagonal variances), the shared-variance route, and the per-component route every per-sample time index takes."""
import torch

import gms_kernels as gk


def per_component(oracle: gk.GaussianMixtureOracle, x: torch.Tensor, t: int) -> torch.Tensor:
    """The heads through the [N, K, *shape] route: one time index per sample, all equal to t."""
    return oracle.noise_moments(x, torch.full((x.shape[0],), t, dtype=torch.long))


def test_one_time_index_with_diagonal_variances_equals_the_per_component_route():
    g = torch.Generator().manual_seed(1)
    w = torch.rand(7, generator=g, dtype=torch.float64) + 0.1
    m = torch.randn(7, 1, 3, 3, generator=g, dtype=torch.float64)
    s = torch.rand(7, 1, 3, 3, generator=g, dtype=torch.float64) * 0.5 + 0.05
    oracle = gk.GaussianMixtureOracle(w, m, s)
    assert oracle.shared_variance is None
    x = torch.randn(50, 1, 3, 3, generator=g, dtype=torch.float64) * 1.5
    for t in (0, 10, 300, 999):
        torch.testing.assert_close(oracle.noise_moments(x, t), per_component(oracle, x, t), rtol=1e-9, atol=1e-10)


def test_one_shared_variance_equals_the_per_component_route():
    g = torch.Generator().manual_seed(2)
    m = torch.randn(5, 2, 4, generator=g, dtype=torch.float64)
    oracle = gk.GaussianMixtureOracle(torch.ones(5), m, [0.2] * 5)
    assert oracle.shared_variance is not None
    x = torch.randn(30, 2, 4, generator=g, dtype=torch.float64)
    for t in (0, 500, 999):
        torch.testing.assert_close(oracle.noise_moments(x, t), per_component(oracle, x, t), rtol=1e-9, atol=1e-10)
