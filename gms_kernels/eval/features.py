"""Feature extractors for Fréchet distances: a small digits classifier shipped with the package."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

ASSETS = Path(__file__).parent.parent / "assets"
DIGITS_CLASSIFIER = ASSETS / "digits_classifier.pt"


class DigitsClassifier(nn.Module):
    """A small CNN for 8x8 digits in [-1, 1]; ``features`` are its 128-d penultimate activations."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.SiLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.SiLU(),
            nn.Flatten(), nn.Linear(64 * 2 * 2, 128), nn.SiLU(),
        )
        self.classify = nn.Linear(128, 10)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1:] != (1, 8, 8):
            raise ValueError(f"the digits classifier takes [N, 1, 8, 8] images in [-1, 1], got {tuple(x.shape)}")
        return self.body(x.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(x))


def load_digits_classifier(path: str | Path = DIGITS_CLASSIFIER) -> DigitsClassifier:
    """The shipped classifier (trained by python/train_digits_classifier.py), in eval mode."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"digits classifier weights not found at {path}: run python/train_digits_classifier.py")
    with torch.device("cpu"):  # (shipped weights: built on the CPU, whatever torch's default device is)
        net = DigitsClassifier()
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return net.eval()


@torch.no_grad()
def digits_features(images: torch.Tensor, net: DigitsClassifier | None = None, batch_size: int = 1024) -> torch.Tensor:
    """float64 [N, 128] classifier features of digits images (clamped to [-1, 1])."""
    net = net or load_digits_classifier().to(images.device)
    feats = [net.features(b.clamp(-1, 1)) for b in images.split(batch_size)]
    return torch.cat(feats).double()
