"""The embedded models, shipped in assets/ with fp16 weights (the heads were trained on the fp16-rounded backbone).

- :func:`default_model`: a small UNet on 8x8 digits (``gk.data.digits("train")``: validation and test stay
  unseen) with central-moment e2/e3 heads (``MomentNet(targets="central")``; python/train_digits_model.py);
  ``gk.sample()`` and ``gms-kernels sample`` use it when no model is given.
- :func:`patches_model`: a smaller UNet on 8x8 grey natural-image patches (``gk.data.patches``, train
  split) with central-moment e2/e3 heads (python/train_patches_model.py).

Both ship central heads, which sampled better than raw eps^n heads on their validation splits.
Each carries the GMS options chosen on its own validation split (``solver_defaults``, :data:`SOLVER_DEFAULTS`),
which ``gk.sample`` uses in place of the library's defaults.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from .moment_net import MomentNet
from .pytorch_ddpm import PytorchDDPMUNet

ASSETS = Path(__file__).parent.parent / "assets"
DIGITS_MODEL = ASSETS / "digits_gms.pt"
EMBEDDED_FORMAT = "gms_kernels.embedded/1"
DIGITS_CONFIG = dict(T=1000, ch=32, ch_mult=(1, 2, 2), attn=(1,), num_res_blocks=2, dropout=0.1, in_channels=1)
DIGITS_SHAPE = (1, 8, 8)
PATCHES_MODEL = ASSETS / "patches_gms.pt"
PATCHES_CONFIG = dict(T=1000, ch=32, ch_mult=(1, 2), attn=(), num_res_blocks=1, dropout=0.0, in_channels=1)
PATCHES_SHAPE = (1, 8, 8)
_cache: dict[str, torch.nn.Module] = {}

# The solver options each shipped model samples with unless the caller names others (the model's
# ``solver_defaults``, read by gk.sample), keyed by the first 12 hex digits of its file's SHA-256: they were chosen
# for those weights on their own validation split, so a retrained file
# gets none until they are chosen again. Each is the candidate (closed fit, per pixel or per image, variance scale c
# in {1, 1.25, 1.5, 2}) with the best mean rank over K = 5, 10, 20 on the model's validation seeds and references
# (python/results/model_options.md): per pixel at c = 1 on digits, per pixel at c = 1.25 on patches (which runs the
# float64 torch step: the fused kernels take c = 1 only).
SOLVER_DEFAULTS = {
    "3d2a54b4d17d": {"gms": {"fit": "closed", "select": "pixel"}},  # digits_gms.pt
    "e70272e465a5": {"gms": {"fit": "closed", "select": "pixel", "variance_scale": 1.25}},  # patches_gms.pt
}


def build_digits_backbone() -> torch.nn.Module:
    return PytorchDDPMUNet(**DIGITS_CONFIG)


def build_patches_backbone() -> torch.nn.Module:
    return PytorchDDPMUNet(**PATCHES_CONFIG)


def save_embedded(net: torch.nn.Module, path: str | Path = DIGITS_MODEL, config: dict = DIGITS_CONFIG) -> int:
    """Save a MomentNet (its backbone built from ``config``) in the compact shipped format; returns the
    file size in bytes."""
    # (fp16 weights; the heads' per-t output scale, MomentNet.output_scale, stays float32: it spans many orders
    # of magnitude, below fp16's normal range at large t)
    state = {k: (v.half() if v.is_floating_point() and k != "output_scale" else v) for k, v in net.state_dict().items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": EMBEDDED_FORMAT, "config": config, "orders": list(net.orders),
                "head": net.head, "targets": net.targets, "state": state}, path)
    return path.stat().st_size


def _load_embedded(path: str | Path, build, what: str, script: str) -> torch.nn.Module:
    key = str(path)
    if key not in _cache:
        path = Path(path)
        if not path.exists():
            raise ValueError(f"the embedded {what} model is missing ({path}): run {script} or pass a model")
        data = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(data, dict) or data.get("format") != EMBEDDED_FORMAT:
            raise ValueError(f"{path} is not a gms_kernels embedded model file")
        with torch.device("cpu"):  # (the shipped models live on the CPU, whatever torch's default device is)
            net = MomentNet(build(), orders=tuple(data["orders"]), head=data["head"],
                            targets=data.get("targets", "raw"))
        state = {k: v.float() if v.is_floating_point() else v for k, v in data["state"].items()}
        if "output_scale" in state:  # (heads with a per-t output scale: the buffer exists only when set)
            net.output_scale_from_file(state["output_scale"], path)
        net.load_state_dict(state)
        net.solver_defaults = SOLVER_DEFAULTS.get(file_tag(path), {})
        _cache[key] = net.eval()
    return _cache[key]


def file_tag(path: str | Path) -> str:
    """The first 12 hex digits of a file's SHA-256: what names a model file in result caches and in
    :data:`SOLVER_DEFAULTS`."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def default_model(path: str | Path = DIGITS_MODEL) -> torch.nn.Module:
    """The shipped digits MomentNet (float32, eval mode; cached)."""
    return _load_embedded(path, build_digits_backbone, "digits", "python/train_digits_model.py")


def patches_model(path: str | Path = PATCHES_MODEL) -> torch.nn.Module:
    """The shipped 8x8 natural-image patches MomentNet (float32, eval mode; cached). Data: ``gk.data.patches``
    (grey, [-1, 1]); linear schedule T=1000, eps backbone plus conv heads for E[eps^2], E[eps^3]."""
    return _load_embedded(path, build_patches_backbone, "patches", "python/train_patches_model.py")
