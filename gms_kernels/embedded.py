"""The embedded default model: a small UNet on 8x8 digits with e2/e3 heads, shipped in assets/.

Trained by python/train_digits_model.py; ``gk.sample()`` and ``gms-kernels sample`` use it when no
model is given. Weights are stored in fp16 (the heads were trained on the fp16-rounded backbone).
"""
from __future__ import annotations

from pathlib import Path

import torch

ASSETS = Path(__file__).parent / "assets"
DIGITS_MODEL = ASSETS / "digits_gms.pt"
EMBEDDED_FORMAT = "gms_kernels.embedded/1"
DIGITS_CONFIG = dict(T=1000, ch=32, ch_mult=(1, 2, 2), attn=(1,), num_res_blocks=2, dropout=0.1, in_channels=1)
DIGITS_SHAPE = (1, 8, 8)
_cache: dict[str, torch.nn.Module] = {}


def build_digits_backbone() -> torch.nn.Module:
    from .models import PytorchDDPMUNet

    return PytorchDDPMUNet(**DIGITS_CONFIG)


def save_embedded(net: torch.nn.Module, path: str | Path = DIGITS_MODEL) -> int:
    """Save a digits MomentNet in the compact shipped format; returns the file size in bytes."""
    state = {k: (v.half() if v.is_floating_point() else v) for k, v in net.state_dict().items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": EMBEDDED_FORMAT, "config": DIGITS_CONFIG, "orders": list(net.orders),
                "head": net.head, "state": state}, path)
    return path.stat().st_size


def default_model(path: str | Path = DIGITS_MODEL) -> torch.nn.Module:
    """The shipped digits MomentNet (float32, eval mode; cached)."""
    key = str(path)
    if key not in _cache:
        from .models import MomentNet

        path = Path(path)
        if not path.exists():
            raise ValueError(f"the embedded digits model is missing ({path}): run python/train_digits_model.py "
                             "or pass a model")
        data = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(data, dict) or data.get("format") != EMBEDDED_FORMAT:
            raise ValueError(f"{path} is not a gms_kernels embedded model file")
        net = MomentNet(build_digits_backbone(), orders=tuple(data["orders"]), head=data["head"])
        net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in data["state"].items()})
        _cache[key] = net.eval()
    return _cache[key]
