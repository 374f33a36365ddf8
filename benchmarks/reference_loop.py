"""Baseline (i): a faithful re-implementation of the official GMS code's per-step loop.

The official code fits the mixture with autograd: parameters (mu1, mu2, beta) as leaf tensors,
an ADAN optimizer object, a loss that is the mean over the whole batch of the squared raw-moment
errors, ``fit_iters`` optimizer steps each costing about a dozen kernel launches, beta clamped after
each step (https://github.com/Guohanzhong/GMS). Moments come from the shared torch code in the model's dtype
(float32), like the official code. This is only the speed baseline; gms_kernels' own fit is
``gms_kernels.core.fit.fit_adan`` (the same update written per element, no autograd).
"""
from __future__ import annotations

import torch

from gms_kernels.core.fit import ADAN_BETA_BOUNDS, ADAN_BETAS, ADAN_EPS, ADAN_INIT_BETA, ADAN_INIT_GAP
from gms_kernels.core.moments import transition_moments
from gms_kernels.train.optim import Adan


def reference_fit(m1: torch.Tensor, var: torch.Tensor, m3: torch.Tensor, iters: int = 70, lr: float = 0.06,
                  weights=(1 / 3, 2 / 3)):
    """The official autograd fit; returns (mu1, mu2, s2) detached."""
    w1, w2 = weights
    mu1 = m1.detach().clone().requires_grad_(True)
    mu2 = (m1.detach() - ADAN_INIT_GAP).requires_grad_(True)
    beta = torch.full_like(m1, ADAN_INIT_BETA).requires_grad_(True)
    opt = Adan([mu1, mu2, beta], lr=lr, betas=ADAN_BETAS, eps=ADAN_EPS)
    target2 = m1**2 + var
    for _ in range(iters):
        opt.zero_grad(set_to_none=False)
        s2 = beta * var
        r1 = w1 * mu1 + w2 * mu2 - m1
        r2 = w1 * mu1**2 + w2 * mu2**2 + s2 - target2
        r3 = w1 * (mu1**3 + 3 * mu1 * s2) + w2 * (mu2**3 + 3 * mu2 * s2) - m3
        loss = (r1**2 + r2**2 + r3**2).mean()
        loss.backward()
        opt.step()
        with torch.no_grad():
            beta.clamp_(*ADAN_BETA_BOUNDS)
    return mu1.detach(), mu2.detach(), (beta * var).detach()


def reference_step(x_t: torch.Tensor, e1: torch.Tensor, e2: torch.Tensor, e3: torch.Tensor, k, iters: int = 70,
                   data_range=(-1.0, 1.0), generator: torch.Generator | None = None) -> torch.Tensor:
    """One GMS step the official way: moments, autograd ADAN fit, per-image component choice."""
    mom = transition_moments(x_t, e1, e2, e3, k, data_range)
    mu1, mu2, s2 = reference_fit(mom.m1, mom.var, mom.m3, iters)
    first = torch.rand(x_t.shape[0], generator=generator, device=x_t.device) < 1 / 3
    first = first.reshape(-1, *([1] * (x_t.dim() - 1)))
    z = torch.randn(x_t.shape, generator=generator, device=x_t.device, dtype=x_t.dtype)
    return torch.where(first, mu1, mu2) + s2.clamp_min(0).sqrt() * z
