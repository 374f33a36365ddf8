"""Feature extractors for Fréchet distances: a small digits classifier shipped with the package."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

ASSETS = Path(__file__).parent / "assets"
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
    net = DigitsClassifier()
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return net.eval()


@torch.no_grad()
def digits_features(images: torch.Tensor, net: DigitsClassifier | None = None, batch_size: int = 1024) -> torch.Tensor:
    """float64 [N, 128] classifier features of digits images (clamped to [-1, 1])."""
    net = net or load_digits_classifier()
    feats = [net.features(b.clamp(-1, 1)) for b in images.split(batch_size)]
    return torch.cat(feats).double()


def inception_extractor(weights_path: str | Path | None):
    """torch-fidelity's InceptionV3 (FID's 2048-d pool features) from a user-supplied weights file.

    Nothing is downloaded: ``weights_path`` is required (e.g. torch-fidelity's
    ``weights-inception-2015-12-05-6726825d.pth``). The file is first opened with
    ``torch.load(weights_only=True)`` so that only plain tensors are ever read from it.
    """
    if weights_path is None:
        raise ValueError("FID needs InceptionV3 weights and nothing can be downloaded: pass weights_path= the "
                         "local file pt_inception-2015-12-05 / weights-inception-2015-12-05-6726825d.pth")
    path = Path(weights_path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"cannot read Inception weights {path} as a plain state dict: {exc}") from exc
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ValueError(f"{path} is not a state dict of tensors")
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    return FeatureExtractorInceptionV3("inception-v3-compat", ["2048"], feature_extractor_weights_path=str(path)).eval()


@torch.no_grad()
def inception_features(images: torch.Tensor, extractor, data_range: tuple[float, float] = (-1.0, 1.0),
                       batch_size: int = 200) -> torch.Tensor:
    """float64 [N, 2048] features of images [N, C, H, W] in ``data_range`` (grey images are repeated to RGB)."""
    lo, hi = data_range
    feats = []
    for b in images.split(batch_size):
        u8 = ((b.float().cpu() - lo) / (hi - lo) * 255).round().clamp(0, 255).to(torch.uint8)
        if u8.shape[1] == 1:
            u8 = u8.repeat(1, 3, 1, 1)
        feats.append(extractor(u8)[0].double())
    return torch.cat(feats)
