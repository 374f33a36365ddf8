"""GaussianMixtureOracle's heads against the definition, component by component, and one time index per sample
against each sample's own index."""
import math

import pytest
import torch

import gms_kernels as gk


def heads_by_definition(weights, means, stds, x, t, schedule):
    """E[eps^n | x_t], n = 1, 2, 3, summed over the components: given component k, x_t ~ N(a m_k, a^2 s_k^2 +
    sigma^2) elementwise, and eps = (x_t - a x_0) / sigma is Gaussian with mean sigma (x_t - a m_k) / T_k and
    variance a^2 s_k^2 / T_k, T_k = a^2 s_k^2 + sigma^2; the posterior weights are prior times likelihood."""
    abar = float(torch.cumprod(1 - schedule.betas.double(), 0)[t])
    a, sig = math.sqrt(abar), math.sqrt(1 - abar)
    w, m, s2 = (torch.as_tensor(v, dtype=torch.float64) for v in (weights, means, stds))
    s2 = (s2.reshape(len(w), *([1] * (m.dim() - 1))) if s2.dim() == 1 else s2).expand_as(m) ** 2
    x = x.double().unsqueeze(1)
    total = a * a * s2 + sig * sig
    dims = tuple(range(2, x.dim()))
    log_lik = (-0.5 * (torch.log(2 * math.pi * total) + (x - a * m) ** 2 / total)).sum(dims)
    r = torch.softmax(torch.log(w / w.sum()) + log_lik, dim=1).reshape(*log_lik.shape, *([1] * len(dims)))
    mean, var = sig * (x - a * m) / total, a * a * s2 / total
    moments = (mean, mean**2 + var, mean**3 + 3 * mean * var)
    return torch.cat([(r * e).sum(1) for e in moments], dim=1)


@pytest.mark.parametrize("shared", [False, True])
def test_heads_equal_the_definition(shared):
    g = torch.Generator().manual_seed(1)
    w = torch.rand(7, generator=g, dtype=torch.float64) + 0.1
    m = torch.randn(7, 1, 3, 3, generator=g, dtype=torch.float64)
    s = torch.full((7,), 0.2, dtype=torch.float64) if shared else \
        torch.rand(7, 1, 3, 3, generator=g, dtype=torch.float64) * 0.5 + 0.05
    oracle = gk.GaussianMixtureOracle(w, m, s)
    assert (oracle.shared_variance is not None) == shared
    x = torch.randn(50, 1, 3, 3, generator=g, dtype=torch.float64) * 1.5
    for t in (0, 10, 300, 999):
        torch.testing.assert_close(oracle.noise_moments(x, t), heads_by_definition(w, m, s, x, t, oracle.schedule),
                                   rtol=1e-9, atol=1e-10)


def test_one_index_per_sample_gives_each_sample_the_heads_of_its_own_index():
    oracle = gk.GaussianMixtureOracle([0.4, 0.6], [[-0.4, 0.2], [0.3, -0.1]], [[0.12, 0.3], [0.05, 0.2]])
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    t = torch.tensor([999, 10, 500, 10, 999, 0])
    mixed = oracle(x, t)
    for i in range(6):
        torch.testing.assert_close(mixed[i:i + 1], oracle(x[i:i + 1], int(t[i])), rtol=0, atol=1e-12)
