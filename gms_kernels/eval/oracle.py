"""Exact noise heads and the exact reverse sampler for Gaussian-mixture data.

For x_0 ~ sum_k pi_k N(m_k, diag(s_k^2)) everything a solver needs is available in closed form,
so solvers can be measured without any network error, against a sampler with no
discretisation error (solver ``"exact"``).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from ..core.devices import as_tensor_on, generator_device
from ..core.moments import raw_moments
from ..core.schedule import Schedule, StepCoefficients


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
        m2, m3 = raw_moments(mean, var, 0.0)  # (eps given x_t and k is Gaussian)
        e1 = (r * mean).sum(1)
        e2 = (r * m2).sum(1)
        e3 = (r * m3).sum(1)
        return torch.cat([e1, e2, e3], dim=1)

    def _a_sigma(self, t: int | torch.Tensor, x_t: torch.Tensor):
        """a_t, sigma_t: floats for one index, [N, 1, 1, ...] tensors (against [N, K, *shape]) for one per sample."""
        if not torch.is_tensor(t):
            return self.schedule.alpha(t), self.schedule.sigma(t)
        return tuple(v.to(x_t.device).reshape(-1, *([1] * x_t.dim())) for v in self.schedule.alpha_sigma(t.long()))

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


class ClassConditionalOracle(nn.Module):
    """Exact heads of class-conditional Gaussian-mixture data, for conditional sampling and classifier-free
    guidance without any network error.

    Class c (prior ``class_prior[c]``) is its own mixture (``weights[c]``: [K_c], ``means[c]``: [K_c, *shape],
    ``stds[c]``: [K_c] or [K_c, *shape]; one :class:`GaussianMixtureOracle` each, :attr:`classes`).
    ``forward(x_t, t, class_labels=y)`` gives the exact heads of q(x_0 | y) per sample; the label
    :attr:`null_label` (= the number of classes), or no labels, gives those of the unconditional data, the
    mixture over the classes with their prior (:attr:`unconditional`): the exact unconditional branch of
    classifier-free guidance. ``exact_step`` and ``sample_data`` take the labels the same way, so the exact
    solver samples q(x_0 | y) (``gk.sample(oracle, solver="exact", model_kwargs={"class_labels": y})``).
    """

    time_input = "index"

    def __init__(self, class_prior: Sequence[float] | torch.Tensor, weights: Sequence, means: Sequence,
                 stds: Sequence, schedule: Schedule | None = None):
        super().__init__()
        prior = as_tensor_on(class_prior, torch.float64).flatten()
        n = prior.numel()
        if n < 1 or (prior <= 0).any() or not torch.isfinite(prior).all():
            raise ValueError("class_prior must be C >= 1 positive numbers")
        if not len(weights) == len(means) == len(stds) == n:
            raise ValueError(f"weights, means and stds must give one mixture per class ({n}), got "
                             f"{len(weights)}, {len(means)} and {len(stds)}")
        self.schedule = schedule if schedule is not None else Schedule.linear()
        self.classes = nn.ModuleList(GaussianMixtureOracle(w, m, s, self.schedule)
                                     for w, m, s in zip(weights, means, stds))
        shapes = {o.data_shape for o in self.classes}
        if len(shapes) != 1:
            raise ValueError(f"every class must have the same data shape, got {sorted(shapes)}")
        # (each class's components, weighted by prior_c * w_ck: the unconditional data distribution)
        prior = prior / prior.sum()
        mix = torch.cat([p + o.log_weights for p, o in zip(prior.log(), self.classes)]).exp()
        self.unconditional = GaussianMixtureOracle(
            mix, torch.cat([o.means for o in self.classes]), torch.cat([o.variances for o in self.classes]).sqrt(),
            self.schedule)
        self.register_buffer("log_prior", prior.log())

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def null_label(self) -> int:
        """The label of the unconditional branch (one past the classes, as a class embedding's extra row)."""
        return len(self.classes)

    @property
    def data_shape(self) -> tuple[int, ...]:
        return self.unconditional.data_shape

    def _labels(self, class_labels: object, n: int) -> torch.Tensor:
        """The per-sample labels [n] (long, on the CPU: they only choose the mixture)."""
        if class_labels is None:
            return torch.full((n,), self.null_label, dtype=torch.long)
        y = as_tensor_on(class_labels)
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise TypeError(f"class_labels must be integers (0..{self.num_classes - 1}, or {self.null_label} for "
                            f"the unconditional branch), got {y.dtype}")
        y = y.reshape(-1).cpu().long()
        if y.numel() == 1:
            y = y.expand(n)
        if y.numel() != n:
            raise ValueError(f"class_labels must hold one label per sample ({n}) or one for all, got {y.numel()}")
        if n and (int(y.min()) < 0 or int(y.max()) > self.null_label):
            raise ValueError(f"class_labels must lie in 0..{self.null_label} ({self.null_label}: the unconditional "
                             f"branch), got {int(y.min())}..{int(y.max())}")
        return y

    def _groups(self, labels: torch.Tensor):
        """(mixture, rows or None for all) for every label present."""
        values = labels.unique().tolist() or [self.null_label]  # (an empty batch: any mixture will do)
        for v in values:
            oracle = self.unconditional if v == self.null_label else self.classes[v]
            yield oracle, None if len(values) == 1 else (labels == v).nonzero().flatten()

    def forward(self, x_t: torch.Tensor, t: torch.Tensor | int, class_labels: object = None) -> torch.Tensor:
        labels = self._labels(class_labels, x_t.shape[0])
        t = as_tensor_on(t).reshape(-1)
        out = None
        for oracle, rows in self._groups(labels):
            if rows is None:
                return oracle(x_t, t)
            rows = rows.to(x_t.device)
            part = oracle(x_t[rows], t if t.numel() == 1 else t[rows.to(t.device)])
            if out is None:
                out = part.new_empty(x_t.shape[0], *part.shape[1:])
            out[rows] = part
        return out

    def exact_step(self, x_t: torch.Tensor, k: StepCoefficients, uniform: torch.Tensor, noise: torch.Tensor,
                   class_labels: object = None) -> torch.Tensor:
        """:meth:`GaussianMixtureOracle.exact_step` of each sample's class (or of the unconditional data)."""
        labels = self._labels(class_labels, x_t.shape[0])
        out = None
        for oracle, rows in self._groups(labels):
            if rows is None:
                return oracle.exact_step(x_t, k, uniform, noise)
            rows = rows.to(x_t.device)
            part = oracle.exact_step(x_t[rows], k, uniform[rows], noise[rows])
            if out is None:
                out = part.new_empty(x_t.shape[0], *part.shape[1:])
            out[rows] = part
        return out

    def sample_data(self, n: int, class_labels: object = None,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        """n draws from q(x_0 | class_labels) (the unconditional data without labels), fp64 [n, *shape]."""
        labels = self._labels(class_labels, n)
        out = torch.empty(n, *self.data_shape, dtype=torch.float64, device=self.unconditional.means.device)
        for oracle, rows in self._groups(labels):
            rows = torch.arange(n) if rows is None else rows
            out[rows.to(out.device)] = oracle.sample_data(rows.numel(), generator)
        return out


def _component_posterior(x, m, s2, a, sig):
    """q(x0 | x_t = x, component k) = N(mu, v) for a component N(m, s2): mu = m + a s2 (x - a m) / (a^2 s2 +
    sigma^2), v = s2 sigma^2 / (a^2 s2 + sigma^2)."""
    total = a * a * s2 + sig * sig
    return m + (a * s2 / total) * (x - a * m), s2 * sig * sig / total
