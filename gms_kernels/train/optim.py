"""ADAN (Xie et al. 2022, https://arxiv.org/abs/2208.06677), the optimiser the GMS paper uses for the heads (and,
per element, for the fit).

The update, as the official GMS code runs it, per parameter, step k from 1, decay factors (b1, b2, b3):
d_k = g_k - g_{k-1} (d_1 = 0); m = b1 m + (1-b1) g; v = b2 v + (1-b2) d; n = b3 n + (1-b3) (g + b2 d)^2;
theta -= lr/(1-b1^k) m/denom + lr b2/(1-b2^k) v/denom with denom = sqrt(n)/sqrt(1-b3^k) + eps;
decoupled weight decay theta /= 1 + lr*wd.
"""
from __future__ import annotations

import math

import torch


class Adan(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.92, 0.92), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        if lr <= 0 or eps <= 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid Adan settings: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2, b3 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["m"], st["v"], st["n"] = (torch.zeros_like(p) for _ in range(3))
                    st["prev"] = g.clone()
                st["step"] += 1
                k = st["step"]
                d = g - st["prev"]  # zero at k = 1
                u = g + b2 * d
                st["m"].mul_(b1).add_(g, alpha=1 - b1)
                st["v"].mul_(b2).add_(d, alpha=1 - b2)
                st["n"].mul_(b3).addcmul_(u, u, value=1 - b3)
                denom = st["n"].sqrt().div_(math.sqrt(1 - b3**k)).add_(eps)
                p.addcdiv_(st["m"], denom, value=-lr / (1 - b1**k))
                p.addcdiv_(st["v"], denom, value=-lr * b2 / (1 - b2**k))
                if wd:
                    p.div_(1 + lr * wd)
                st["prev"].copy_(g)
        return loss
