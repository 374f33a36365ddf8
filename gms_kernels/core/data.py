"""Data sets the project can use offline, scaled to [-1, 1]: scikit-learn's 8x8 digits, grey patches of
the photos bundled in scikit-image's wheel (split by photo). Both need the ``data`` extra: ``pip install "gms_kernels[data]"``,
and :class:`ImageFolder`, a folder of PNG / JPEG files read one image at a time.

Patch photos, their splits and licences (from the ``skimage.data`` docstrings): see :data:`PATCH_PHOTOS`.
Left out: photos whose docstring states no licence (moon, page, stereo_motorcycle, ...), synthetic or binary
images (checkerboard, logo, horse, ...), and images that need a download (eagle, lily, ...).
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .extras import require

SPLITS = ("all", "train", "validation", "test")


def digits(split: str = "all", test_fraction: float = 0.2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits (1797 images, 8x8, values 0..16) as float32 [N, 1, 8, 8] in [-1, 1], and labels.

    ``train`` / ``validation`` / ``test`` is a fixed seeded split: a permutation drawn from ``seed`` gives its
    first ``test_fraction`` of the images to ``test``, the next ``test_fraction`` to ``validation`` and the rest
    (60% by default) to ``train``. The embedded digits model is trained on ``train`` only, settings are chosen
    on ``validation`` and results reported on ``test``; the shipped FD-digits classifier was trained on
    ``train`` alone (python/train_digits_classifier.py), so neither reference set took part in its fit.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    if not 0.0 < test_fraction < 0.5:
        raise ValueError(f"test_fraction must be in (0, 0.5) (test and validation take one each), got {test_fraction!r}")
    d = require("sklearn.datasets", "gk.data.digits").load_digits()
    x = torch.as_tensor(d.images, dtype=torch.float32, device="cpu").unsqueeze(1) / 8.0 - 1.0
    y = torch.as_tensor(d.target, dtype=torch.long, device="cpu")
    if split == "all":
        return x, y
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed), device="cpu")
    n = int(round(test_fraction * x.shape[0]))
    idx = {"test": perm[:n], "validation": perm[n:2 * n], "train": perm[2 * n:]}[split]
    return x[idx], y[idx]


# --- natural-image patches (scikit-image's bundled photos) -------------------------------------------------------

# Photos bundled in scikit-image's wheel whose docstrings state a free licence, assigned to splits BY PHOTO (no
# photo contributes to two splits). name -> (split, licence as the skimage.data docstring states it).
PATCH_PHOTOS: dict[str, tuple[str, str]] = {
    "astronaut": ("train", "public domain (NASA)"),
    "camera": ("train", "CC0 (Lav Varshney)"),
    "coffee": ("train", "CC0 (Rachel Michetti)"),
    "rocket": ("train", "public domain (SpaceX)"),
    "hubble_deep_field": ("train", "public domain (NASA)"),
    "brick": ("train", "CC0 (CC0Textures)"),
    "grass": ("train", "CC0 (CC0Textures)"),
    "clock": ("validation", "public domain (Stefan van der Walt)"),
    "coins": ("validation", "no known copyright restrictions (Brooklyn Museum)"),
    "chelsea": ("test", "CC0 (Stefan van der Walt)"),
    "gravel": ("test", "CC0 (CC0Textures)"),
}
PATCH_SPLITS = ("train", "validation", "test")
# patches drawn from each photo of a split (every photo weighs the same within its split)
PATCHES_PER_PHOTO = {"train": 7000, "validation": 3000, "test": 5000}
_LUMA = (0.2125, 0.7154, 0.0721)  # ITU-R BT.709 weights, as skimage.color.rgb2gray uses


def patch_photos(split: str) -> tuple[str, ...]:
    """The scikit-image photos of a patch split, in their fixed order."""
    if split not in PATCH_SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(PATCH_SPLITS)}")
    return tuple(name for name, (s, _) in PATCH_PHOTOS.items() if s == split)


@lru_cache(maxsize=None)
def photo_grey(name: str) -> torch.Tensor:
    """A bundled scikit-image photo as float64 [H, W] grey intensity in [0, 1] (uint8 / 255; colour photos
    through the BT.709 luma weights). Nothing is downloaded: these files ship inside the wheel."""
    if name not in PATCH_PHOTOS:
        raise ValueError(f"unknown patch photo {name!r}; valid: {', '.join(PATCH_PHOTOS)}")
    img = torch.as_tensor(getattr(require("skimage.data", "gk.data.patches"), name)(), device="cpu")
    if img.dtype != torch.uint8:
        raise ValueError(f"skimage.data.{name} is {img.dtype}, expected uint8")
    img = img.to(torch.float64) / 255.0
    if img.dim() == 3:
        img = (img[..., :3] * torch.tensor(_LUMA, dtype=torch.float64, device="cpu")).sum(-1)
    return img


def patches(split: str = "train", size: int = 8, per_photo: int | None = None, seed: int = 0) -> torch.Tensor:
    """Grey natural-image patches as float32 [N, 1, size, size] in [-1, 1], from scikit-image's bundled photos.

    Splits are by photo (:data:`PATCH_PHOTOS`): train 7 photos, validation 2, test 2. From each photo of
    the split, ``per_photo`` patches (default :data:`PATCHES_PER_PHOTO`) are cut at uniformly random
    positions, drawn from a generator seeded by ``seed`` and the photo's place in :data:`PATCH_PHOTOS`,
    so the same arguments always give the same patches. Scaling is fixed and global: grey intensity
    v in [0, 1] (uint8 / 255) -> 2 v - 1. Patches are not normalised one by one: their contrast
    (flat sky next to sharp edges) is the heavy-tailed, non-Gaussian part of their distribution.
    Rows are ordered photo by photo.
    """
    if not isinstance(size, int) or size < 2:
        raise ValueError(f"size must be an integer >= 2, got {size!r}")
    names = patch_photos(split)
    count = PATCHES_PER_PHOTO[split] if per_photo is None else per_photo
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"per_photo must be a positive integer, got {per_photo!r}")
    out = []
    for name in names:
        img = photo_grey(name)
        h, w = img.shape
        if h < size or w < size:
            raise ValueError(f"photo {name} ({h}x{w}) is smaller than the patch size {size}")
        g = torch.Generator().manual_seed(seed * 1000 + list(PATCH_PHOTOS).index(name))
        top = torch.randint(0, h - size + 1, (count,), generator=g, device="cpu")
        left = torch.randint(0, w - size + 1, (count,), generator=g, device="cpu")
        rows = (top[:, None] + torch.arange(size, device="cpu"))[:, :, None]   # [N, size, 1]
        cols = (left[:, None] + torch.arange(size, device="cpu"))[:, None, :]  # [N, 1, size]
        out.append(img[rows, cols])
    return (2.0 * torch.cat(out) - 1.0).to(torch.float32).unsqueeze(1)


# --- image folders -------------------------------------------------------------------------------------------------

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_GREY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N")


def image_files(root: str | os.PathLike) -> list[str]:
    """The PNG / JPEG files under ``root`` (subfolders included; hidden files and folders left out), as paths
    relative to it, sorted."""
    root = Path(root)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a folder of images")
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = Path(folder).relative_to(root)
        found += [(rel / f).as_posix() for f in files
                  if not f.startswith(".") and os.path.splitext(f)[1].lower() in IMAGE_SUFFIXES]
    if not found:
        raise ValueError(f"{root} holds no {' / '.join(IMAGE_SUFFIXES)} images")
    return sorted(found)


class ImageFolder(Dataset):
    """The images of a folder (:func:`image_files`: PNG / JPEG, in sorted order of their paths), read with
    Pillow when an item is asked for, never all at once: item i is float32 [channels, H, W] in [-1, 1].

    8-bit values v become v / 127.5 - 1 (16-bit grey PNGs: v / 32767.5 - 1). ``channels`` is 1 (Pillow's
    ``convert("L")``) or 3 (``convert("RGB")``; an alpha channel is dropped); None takes 1 if the first image is
    grey, else 3. Every image must have the first one's size.
    """

    def __init__(self, root: str | os.PathLike, channels: int | None = None):
        self.root = Path(root)
        self.files = image_files(root)
        with self._open(0) as img:
            self.size = img.size  # (W, H)
            if channels is None:
                channels = 1 if img.mode in _GREY_MODES else 3
        if channels not in (1, 3):
            raise ValueError(f"an image folder gives 1 (grey) or 3 (RGB) channels, not {channels!r}")
        self.channels = channels

    def __len__(self) -> int:
        return len(self.files)

    def _open(self, i: int):
        from PIL import Image

        try:
            img = Image.open(self.root / self.files[i])
            img.load()  # (a truncated or corrupt file fails here, not later)
            return img
        except OSError as exc:
            raise ValueError(f"cannot read image {self.root / self.files[i]}: {exc}") from exc

    def __getitem__(self, i: int) -> torch.Tensor:
        with self._open(i) as img:
            if img.size != self.size:
                raise ValueError(f"{self.root / self.files[i]} is {img.size[0]}x{img.size[1]}, the first image "
                                 f"{self.size[0]}x{self.size[1]}: an image folder's images must share one size")
            if img.mode.startswith("I"):  # 16-bit (or 32-bit integer) grey
                v = torch.from_numpy(np.asarray(img, dtype=np.float32)).div_(32767.5).sub_(1.0)
                return v.unsqueeze(0).expand(self.channels, -1, -1).clone()
            v = np.asarray(img.convert("L" if self.channels == 1 else "RGB"), dtype=np.uint8)
        v = torch.from_numpy(v.copy())
        v = v.unsqueeze(0) if v.dim() == 2 else v.permute(2, 0, 1).contiguous()
        return v.to(torch.float32) / 127.5 - 1.0

    def __repr__(self) -> str:
        w, h = self.size
        return f"ImageFolder({str(self.root)!r}, channels={self.channels}: {len(self)} images, {w}x{h})"
