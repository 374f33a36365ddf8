"""Image grids and figures for the command line's jobs (Pillow; figures: matplotlib)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch


def to_uint8(images: torch.Tensor, data_range: tuple[float, float] = (-1.0, 1.0)) -> np.ndarray:
    """[N, C, H, W] in data_range -> uint8 [N, H, W, C]."""
    lo, hi = data_range
    x = ((images.detach().to("cpu", torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    return (x.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)


def image_grid(images: torch.Tensor, nrow: int = 10, gap: int = 1, scale: int = 1,
               data_range: tuple[float, float] = (-1.0, 1.0)):
    """A PIL image of the images laid out ``nrow`` per row, ``scale``-times enlarged (nearest)."""
    from PIL import Image

    pix = to_uint8(images, data_range)
    n, h, w, c = pix.shape
    rows = -(-n // nrow)
    grid = np.full((rows * (h + gap) + gap, nrow * (w + gap) + gap, c), 255, dtype=np.uint8)
    for i in range(n):
        r, q = divmod(i, nrow)
        grid[gap + r * (h + gap):gap + r * (h + gap) + h, gap + q * (w + gap):gap + q * (w + gap) + w] = pix[i]
    img = Image.fromarray(grid[:, :, 0] if c == 1 else grid[:, :, :3])
    return img.resize((img.width * scale, img.height * scale), Image.NEAREST) if scale > 1 else img


def save_panels(panels: Sequence[tuple[str, torch.Tensor]], path: str | Path, nrow: int = 10, scale: int = 4,
                data_range: tuple[float, float] = (-1.0, 1.0)) -> Path:
    """Grids side by side, each titled (e.g. GMS | SN-DDPM), saved as a PNG."""
    from PIL import Image, ImageDraw

    grids = [image_grid(x, nrow, scale=scale, data_range=data_range).convert("RGB") for _, x in panels]
    title_h, pad = 18, 12
    width = sum(g.width for g in grids) + pad * (len(grids) + 1)
    height = max(g.height for g in grids) + title_h + 2 * pad
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    x = pad
    for (title, _), g in zip(panels, grids):
        draw.text((x, pad // 2), title, fill="black")
        canvas.paste(g, (x, pad + title_h))
        x += g.width + pad
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    return path


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure as a PNG (creating the folder) and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
