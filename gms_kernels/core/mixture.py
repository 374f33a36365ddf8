"""Drawing x_s from the fitted two-component kernel (step 4 of the pipeline, Eq. (7) of the GMS paper,
https://arxiv.org/abs/2311.00941).

``select="sample"`` draws one component per sample, shared by all its elements: the joint
mixture of Eq. (7), as in the official code. ``select="pixel"`` draws one per element. Both give
every element the same marginal distribution.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .fit import MixtureParams

SELECT_MODES = ("sample", "pixel")


def check_select(select: str) -> str:
    if select not in SELECT_MODES:
        raise ValueError(f"unknown select {select!r}; valid: {', '.join(SELECT_MODES)}")
    return select


def choose_first_component(uniform: torch.Tensor, w1: float, like: torch.Tensor) -> torch.Tensor:
    """Boolean mask of elements that take component 1 (u < w1); a per-sample u is broadcast."""
    if uniform.dim() == 1 and like.dim() > 1:
        uniform = uniform.reshape(-1, *([1] * (like.dim() - 1)))
    return (uniform < w1).expand_as(like)


def sample_mixture(p: MixtureParams, weights: Sequence[float], noise: torch.Tensor,
                   uniform: torch.Tensor) -> torch.Tensor:
    """x = mu_c + sqrt(s2) z with c = 1 where u < w1 else 2; u is [N] (per sample) or like mu."""
    first = choose_first_component(uniform, float(weights[0]), p.mu1)
    return torch.where(first, p.mu1, p.mu2) + p.s2.clamp_min(0.0).sqrt() * noise
