"""Exact noise heads and the exact reverse sampler for Gaussian-mixture data (reference-notes 4).

For x_0 ~ sum_k pi_k N(m_k, diag(s_k^2)) everything a solver needs is available in closed form,
so solvers can be measured without any network error, against a sampler with no
discretisation error (solver ``"exact"``).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from .devices import as_tensor_on, generator_device
from .schedule import Schedule, StepCoefficients


class GaussianMixtureOracle(nn.Module):
    """An nn.Module whose ``forward(x_t, t)`` returns the exact [E eps, E eps^2, E eps^3].

    weights: [K]; means: [K, *shape]; stds: [K] (isotropic) or [K, *shape]. Time input: index t.
    """

    time_input = "index"

    def __init__(self, weights: Sequence[float] | torch.Tensor, means: Sequence | torch.Tensor,
                 stds: Sequence[float] | torch.Tensor, schedule: Schedule | None = None):
        super().__init__()
        weights = as_tensor_on(weights, torch.float64).flatten()
        means = as_tensor_on(means, torch.float64)
        stds = as_tensor_on(stds, torch.float64)
        K = weights.numel()
        if K < 1 or (weights <= 0).any() or not torch.isfinite(weights).all():
            raise ValueError("weights must be K >= 1 positive numbers")
        if means.dim() < 2 or means.shape[0] != K:
            raise ValueError(f"means must have shape [K={K}, *data_shape], got {tuple(means.shape)}")
        if stds.shape == (K,):
            stds = stds.reshape(K, *([1] * (means.dim() - 1))).expand_as(means)
        if stds.shape != means.shape or (stds <= 0).any():
            raise ValueError(f"stds must be positive with shape [K] or {tuple(means.shape)}, got {tuple(stds.shape)}")
        self.register_buffer("log_weights", (weights / weights.sum()).log())
        self.register_buffer("means", means.clone())
        self.register_buffer("variances", stds.clone() ** 2)
        self.schedule = schedule if schedule is not None else Schedule.linear()
        # One variance for every component and coordinate (e.g. an empirical data set with a small blur): the
        # posterior then reduces to matrix products with the means, without any [N, K, *shape] tensor.
        first = self.variances.flatten()[0]
        self.shared_variance = float(first) if bool((self.variances == first).all()) else None

    @property
    def data_shape(self) -> tuple[int, ...]:
        return tuple(self.means.shape[1:])

    def _posterior(self, x_t: torch.Tensor, t: int):
        """log r_k, and q(x0|x_t,k) = N(mu_k, v_k) for every component (shapes [N,K], [N,K,*], [K,*])."""
        a, sig = self._a_sigma(t, x_t)
        x = x_t.to(torch.float64).unsqueeze(1)  # [N, 1, *shape]
        m, s2 = self.means, self.variances
        total = a * a * s2 + sig * sig
        dims = tuple(range(2, x.dim()))
        log_lik = -0.5 * (torch.log(2 * math.pi * total) + (x - a * m) ** 2 / total).sum(dim=dims)
        log_r = torch.log_softmax(self.log_weights + log_lik, dim=1)
        return (log_r, *_component_posterior(x, m, s2, a, sig))

    def _shared(self, t) -> bool:
        """Whether the shared-variance route applies: one variance, one time index for the whole batch."""
        return self.shared_variance is not None and not torch.is_tensor(t)

    def _shared_log_r(self, x_t: torch.Tensor, t: int) -> torch.Tensor:
        """log r_k [N, K] when every component has the variance ``shared_variance``: the log-likelihood's
        terms that depend on k are (a x.m_k - a^2 |m_k|^2 / 2) / (a^2 s^2 + sigma^2)."""
        a, sig = self._a_sigma(t, x_t)
        x, m = x_t.to(torch.float64).flatten(1), self.means.flatten(1)
        total = a * a * self.shared_variance + sig * sig
        logits = self.log_weights + (a * (x @ m.T) - 0.5 * a * a * (m * m).sum(1)) / total
        return torch.log_softmax(logits, dim=1)

    def _shared_noise_moments(self, x_t: torch.Tensor, t: int) -> torch.Tensor:
        """noise_moments for a shared variance s^2: given k, eps = alpha x + beta m_k + noise of variance var with
        alpha = sigma / total, beta = -a alpha, var = a^2 s^2 / total, so the moments need only sum_k r_k m_k^n."""
        a, sig = self._a_sigma(t, x_t)
        x, m = x_t.to(torch.float64).flatten(1), self.means.flatten(1)
        r = self._shared_log_r(x_t, t).exp()
        r1, r2, r3 = r @ m, r @ (m * m), r @ (m * m * m)
        total = a * a * self.shared_variance + sig * sig
        alpha = sig / total
        beta = -a * alpha
        var = a * a * self.shared_variance / total
        e1 = alpha * x + beta * r1
        e2 = alpha**2 * x * x + 2 * alpha * beta * x * r1 + beta**2 * r2 + var
        e3 = (alpha**3 * x**3 + 3 * alpha**2 * beta * x * x * r1 + 3 * alpha * beta**2 * x * r2 + beta**3 * r3
              + 3 * var * e1)
        return torch.cat([e.reshape(x_t.shape) for e in (e1, e2, e3)], dim=1)

    def noise_moments(self, x_t: torch.Tensor, t: int | torch.Tensor) -> torch.Tensor:
        """[E eps, E eps^2, E eps^3 | x_t] concatenated along dim 1, fp64 (t: one index, or a long tensor [N])."""
        if self._shared(t):
            return self._shared_noise_moments(x_t, t)
        a, sig = self._a_sigma(t, x_t)
        log_r, mu, v = self._posterior(x_t, t)
        r = log_r.exp().reshape(*log_r.shape, *([1] * (mu.dim() - 2)))
        mean = (x_t.to(torch.float64).unsqueeze(1) - a * mu) / sig  # eps | x_t, k
        var = a * a * v / (sig * sig)
        e1 = (r * mean).sum(1)
        e2 = (r * (mean**2 + var)).sum(1)
        e3 = (r * (mean**3 + 3 * mean * var)).sum(1)
        return torch.cat([e1, e2, e3], dim=1)

    def _a_sigma(self, t: int | torch.Tensor, x_t: torch.Tensor):
        """a_t, sigma_t: floats for one index, [N, 1, 1, ...] tensors (against [N, K, *shape]) for one per sample."""
        if not torch.is_tensor(t):
            return self.schedule.alpha(t), self.schedule.sigma(t)
        abar = self.schedule.alphas_cumprod[t.cpu().long()].to(x_t.device).reshape(-1, *([1] * x_t.dim()))
        return abar.sqrt(), (1.0 - abar).sqrt()

    def forward(self, x_t: torch.Tensor, t: torch.Tensor | int) -> torch.Tensor:
        t = as_tensor_on(t).reshape(-1)
        if t.numel() == 1 or bool((t == t[0]).all()):
            return self.noise_moments(x_t, int(t[0])).to(x_t.dtype)
        return self.noise_moments(x_t, t).to(x_t.dtype)  # one index per sample, all at once

    def sample_data(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """n draws from the data distribution, fp64 [n, *shape]."""
        k = torch.multinomial(self.log_weights.exp(), n, replacement=True, generator=generator)
        z = torch.randn(n, *self.data_shape, dtype=torch.float64, generator=generator,
                        device=generator_device(generator))
        return self.means[k] + self.variances[k].sqrt() * z

    def log_prob(self, x0: torch.Tensor) -> torch.Tensor:
        """Exact log density of the data distribution at x0 [N, *shape]."""
        x = x0.to(torch.float64).unsqueeze(1)
        dims = tuple(range(2, x.dim()))
        ll = -0.5 * (torch.log(2 * math.pi * self.variances) + (x - self.means) ** 2 / self.variances).sum(dim=dims)
        return torch.logsumexp(self.log_weights + ll, dim=1)

    def exact_step(self, x_t: torch.Tensor, k: StepCoefficients, uniform: torch.Tensor,
                   noise: torch.Tensor) -> torch.Tensor:
        """One draw of the exact q(x_s|x_t) = sum_k r_k N(c1 x_t + c2 mu_k, lam2 + c2^2 v_k).

        ``uniform`` [N] picks the component (inverse CDF of r); ``noise`` is N(0, I) like x_t.
        s = DATA (-1) samples q(x_0|x_t).
        """
        x, shared = x_t.to(torch.float64), self._shared(k.t)
        if shared:
            log_r = self._shared_log_r(x_t, k.t)
        else:
            log_r, mu, v = self._posterior(x_t, k.t)
        cdf = log_r.exp().cumsum(1)
        comp = (cdf < uniform.to(cdf.dtype)[:, None]).sum(1).clamp_max(cdf.shape[1] - 1)
        if shared:  # q(x0 | x_t, k) of the chosen components only
            mu_k, v_k = _component_posterior(x, self.means[comp], self.shared_variance, *self._a_sigma(k.t, x_t))
        else:
            mu_k, v_k = mu[torch.arange(x_t.shape[0], device=comp.device), comp], v[comp]
        mean = k.c1 * x + k.c2 * mu_k
        var = as_tensor_on(k.lam2 + k.c2**2 * v_k, torch.float64)  # (a number when shared)
        return mean + var.sqrt() * noise.to(torch.float64)


def _component_posterior(x, m, s2, a, sig):
    """q(x0 | x_t = x, component k) = N(mu, v) for a component N(m, s2): mu = m + a s2 (x - a m) / (a^2 s2 +
    sigma^2), v = s2 sigma^2 / (a^2 s2 + sigma^2)."""
    total = a * a * s2 + sig * sig
    return m + (a * s2 / total) * (x - a * m), s2 * sig * sig / total
