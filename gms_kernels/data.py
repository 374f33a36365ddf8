"""Data sets the project can use offline: scikit-learn's 8x8 digits, scaled to [-1, 1]."""
from __future__ import annotations

import torch

SPLITS = ("all", "train", "test")


def digits(split: str = "all", test_fraction: float = 0.2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits (1797 images, 8x8, values 0..16) as float32 [N, 1, 8, 8] in [-1, 1], and labels.

    ``train``/``test`` is a fixed seeded split (``test_fraction`` of the images in ``test``).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.as_tensor(d.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0
    y = torch.as_tensor(d.target, dtype=torch.long)
    if split == "all":
        return x, y
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    n_test = int(round(test_fraction * x.shape[0]))
    idx = perm[:n_test] if split == "test" else perm[n_test:]
    return x[idx], y[idx]
