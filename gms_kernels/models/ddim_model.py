"""The UNet of the DDIM repository (ermongroup/ddim ``models/diffusion.py``, class ``Model``), key-compatible.

Written from the architecture's description. It is the PyTorch port of the original DDPM network, so
the classic DDPM checkpoints converted from TensorFlow (CIFAR10, LSUN church/bedroom/cat) and DDIM's
own CelebA model load into it, as raw state dicts. State-dict layout: ``temb.dense.{0,1}``,
``conv_in``, ``down.L.block.B``, ``down.L.attn.B``, ``down.L.downsample.conv``,
``mid.{block_1,attn_1,block_2}``, ``up.L.block.B``, ``up.L.attn.B``, ``up.L.upsample.conv``,
``norm_out``, ``conv_out``. Every GroupNorm has 32 groups and eps 1e-6. The network takes the time
index t in [0, T) (``time_input = "index"``; float t works too: the sinusoids take it as a real number).
``attn_resolutions`` are image sizes (16 = attention where the feature map is 16x16), which is why the
constructor needs ``resolution``.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..core.schedule import Schedule
from ._common import GroupNorm32, attend

NORM_EPS = 1e-6
# how the command line passes the loader's resolution= (an error message names both)
RESOLUTION_FLAG = "--load-option resolution=N"


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[N, dim]: sin(t w_k) for k < dim/2, then cos(t w_k); w_k = 10000^(-k/(dim/2 - 1)); zero-padded if dim is odd.

    (The DDPM/DDIM convention: the rate exponent divides by half-1, so the last rate is exactly 1e-4.)
    """
    half = dim // 2
    if half < 2:
        raise ValueError(f"the time embedding width must be at least 4, got {dim}")
    rates = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * (-math.log(10000.0) / (half - 1)))
    angles = t.float()[:, None] * rates[None, :]
    out = torch.cat([angles.sin(), angles.cos()], dim=1)
    return F.pad(out, (0, 1)) if dim % 2 else out


def norm(channels: int) -> GroupNorm32:
    """The repository's ``Normalize``: GroupNorm(32 groups, eps 1e-6), statistics in float32."""
    return GroupNorm32(32, channels, eps=NORM_EPS)


class ResnetBlock(nn.Module):
    """x' = shortcut(x) + conv2(drop(SiLU(norm2(conv1(SiLU(norm1(x))) + W SiLU(temb))))); 1x1 shortcut
    (``nin_shortcut``) when the width changes."""

    def __init__(self, in_channels: int, out_channels: int, temb_channels: int, dropout: float):
        super().__init__()
        self.norm1 = norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.temb_proj = nn.Linear(temb_channels, out_channels)
        self.norm2 = norm(out_channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb_proj(F.silu(temb)).to(h.dtype)[:, :, None, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        skip = self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x
        return skip + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all pixels (1x1 convs q, k, v, proj_out), added to its input."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = norm(channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm(x)
        q, k, v = (p(n).flatten(2) for p in (self.q, self.k, self.v))
        return x + self.proj_out(attend(q, k, v).view_as(x))


class Downsample(nn.Module):
    """Halve the size: a 3x3 stride-2 conv after padding one row/column at the bottom/right (the
    TensorFlow 'SAME' placement the converted weights expect), or a 2x2 average pool."""

    def __init__(self, channels: int, with_conv: bool):
        super().__init__()
        if with_conv:
            self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "conv"):
            return self.conv(F.pad(x, (0, 1, 0, 1)))
        return F.avg_pool2d(x, 2, 2)


class Upsample(nn.Module):
    """Double the size (nearest neighbour), then an optional 3x3 conv."""

    def __init__(self, channels: int, with_conv: bool):
        super().__init__()
        if with_conv:
            self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.conv(x) if hasattr(self, "conv") else x


class _Level(nn.Module):
    """One resolution of the encoder or decoder: ``block`` (ResnetBlocks), ``attn`` (one per block or
    none) and an optional ``downsample`` / ``upsample``."""

    def __init__(self, blocks: list[nn.Module], attns: list[nn.Module]):
        super().__init__()
        self.block = nn.ModuleList(blocks)
        self.attn = nn.ModuleList(attns)

    def run_block(self, i: int, h: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.block[i](h, temb)
        return self.attn[i](h) if len(self.attn) else h


class _TimeEmbedding(nn.Module):
    def __init__(self, ch: int, temb_ch: int):
        super().__init__()
        self.dense = nn.ModuleList([nn.Linear(ch, temb_ch), nn.Linear(temb_ch, temb_ch)])

    def forward(self, t: torch.Tensor, ch: int) -> torch.Tensor:
        e = timestep_embedding(t, ch).to(self.dense[0].weight.dtype)
        return self.dense[1](F.silu(self.dense[0](e)))


class _Middle(nn.Module):
    def __init__(self, width: int, temb_ch: int, dropout: float):
        super().__init__()
        self.block_1 = ResnetBlock(width, width, temb_ch, dropout)
        self.attn_1 = AttnBlock(width)
        self.block_2 = ResnetBlock(width, width, temb_ch, dropout)

    def forward(self, h: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(h, temb)), temb)


class DDIMModel(nn.Module):
    """The DDIM repository's ``Model`` with its constructor's argument names and its state dict.

    ``forward(x, t)`` takes the time index t (long or float, [N] or a scalar) and returns ``out_ch``
    channels (eps). :meth:`forward_features` returns the last decoder feature (the input of
    ``norm_out``), the time embedding and the output of one pass. ``schedule`` defaults to the linear
    betas 1e-4..0.02 over 1000 steps that all the released models were trained with. Inputs must be
    ``resolution`` x ``resolution`` (the attention placement depends on it).
    """

    time_input = "index"
    family = "ddim"

    def __init__(self, ch: int, out_ch: int, ch_mult: Sequence[int] = (1, 2, 4, 8), num_res_blocks: int = 2,
                 attn_resolutions: Sequence[int] = (16,), dropout: float = 0.0, resamp_with_conv: bool = True,
                 in_channels: int = 3, resolution: int = 32):
        super().__init__()
        ch_mult = tuple(int(m) for m in ch_mult)
        attn_resolutions = tuple(sorted(int(r) for r in attn_resolutions))
        if not ch_mult or num_res_blocks < 1:
            raise ValueError(f"ch_mult must be non-empty and num_res_blocks >= 1, got ch_mult={ch_mult}, "
                             f"num_res_blocks={num_res_blocks}")
        widths = sorted({ch} | {ch * m for m in ch_mult})
        if any(w % 32 for w in widths):
            raise ValueError(f"every width ch*mult (and ch) must be a multiple of 32 (GroupNorm(32)); got {widths}")
        if resolution % (2 ** (len(ch_mult) - 1)):
            raise ValueError(f"resolution {resolution} cannot be halved {len(ch_mult) - 1} times "
                             f"(one per level of ch_mult={ch_mult})")
        self.ch, self.out_ch, self.ch_mult = int(ch), int(out_ch), ch_mult
        self.num_res_blocks, self.attn_resolutions, self.dropout = int(num_res_blocks), attn_resolutions, float(dropout)
        self.resamp_with_conv, self.in_channels, self.resolution = bool(resamp_with_conv), int(in_channels), int(resolution)
        self._schedule: Schedule | None = None
        temb_ch = 4 * ch
        self.temb = _TimeEmbedding(ch, temb_ch)
        self.conv_in = nn.Conv2d(in_channels, ch, 3, padding=1)

        self.down = nn.ModuleList()
        size, width, skip_widths = resolution, ch, [ch]
        for level, mult in enumerate(ch_mult):
            blocks, attns = [], []
            for _ in range(num_res_blocks):
                blocks.append(ResnetBlock(width, ch * mult, temb_ch, dropout))
                width = ch * mult
                if size in attn_resolutions:
                    attns.append(AttnBlock(width))
                skip_widths.append(width)
            down = _Level(blocks, attns)
            if level < len(ch_mult) - 1:
                down.downsample = Downsample(width, resamp_with_conv)
                skip_widths.append(width)
                size //= 2
            self.down.append(down)

        self.mid = _Middle(width, temb_ch, dropout)

        up_levels = []
        for level in reversed(range(len(ch_mult))):
            blocks, attns = [], []
            for _ in range(num_res_blocks + 1):
                blocks.append(ResnetBlock(width + skip_widths.pop(), ch * ch_mult[level], temb_ch, dropout))
                width = ch * ch_mult[level]
                if size in attn_resolutions:
                    attns.append(AttnBlock(width))
            up = _Level(blocks, attns)
            if level > 0:
                up.upsample = Upsample(width, resamp_with_conv)
                size *= 2
            up_levels.insert(0, up)  # self.up[L] is level L, as in the original
        self.up = nn.ModuleList(up_levels)

        self.norm_out = norm(width)
        self.conv_out = nn.Conv2d(width, out_ch, 3, padding=1)
        self.feature_channels, self.temb_channels, self.eps_channels = width, temb_ch, int(in_channels)

    # -- the released configurations (DDIM repository configs/*.yml) --------------------------------
    PRESETS = {
        "cifar10": dict(ch=128, out_ch=3, ch_mult=(1, 2, 2, 2), num_res_blocks=2, attn_resolutions=(16,),
                        dropout=0.1, in_channels=3, resolution=32),
        "celeba": dict(ch=128, out_ch=3, ch_mult=(1, 2, 2, 2, 4), num_res_blocks=2, attn_resolutions=(16,),
                       dropout=0.1, in_channels=3, resolution=64),
        "lsun": dict(ch=128, out_ch=3, ch_mult=(1, 1, 2, 2, 4, 4), num_res_blocks=2, attn_resolutions=(16,),
                     dropout=0.0, in_channels=3, resolution=256),
    }

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "DDIMModel":
        """``"cifar10"`` (DDPM's 35.7M-parameter model), ``"celeba"`` (64x64) or ``"lsun"`` (256x256:
        church, bedroom, cat), with ``overrides`` applied."""
        if name not in cls.PRESETS:
            raise ValueError(f"unknown preset {name!r}; valid: {', '.join(cls.PRESETS)}")
        return cls(**{**cls.PRESETS[name], **overrides})

    # -- attributes gk.sample reads ----------------------------------------------------------------
    @property
    def schedule(self) -> Schedule:
        if self._schedule is None:
            with torch.device("cpu"):  # also when accessed under a meta-device context
                self._schedule = Schedule.linear(1000, 1e-4, 0.02)
        return self._schedule

    @schedule.setter
    def schedule(self, value: Schedule | None) -> None:
        self._schedule = value

    @property
    def config(self) -> dict[str, Any]:
        return {"ch": self.ch, "out_ch": self.out_ch, "ch_mult": list(self.ch_mult),
                "num_res_blocks": self.num_res_blocks, "attn_resolutions": list(self.attn_resolutions),
                "dropout": self.dropout, "resamp_with_conv": self.resamp_with_conv,
                "in_channels": self.in_channels, "resolution": self.resolution}

    # -- forward -----------------------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor, t: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(h, temb, output) of one pass: h is the last decoder feature (the input of ``norm_out``)."""
        if x.dim() != 4 or x.shape[-2:] != (self.resolution, self.resolution):
            raise ValueError(f"DDIMModel(resolution={self.resolution}) takes [N, {self.in_channels}, "
                             f"{self.resolution}, {self.resolution}] inputs, got {tuple(x.shape)}")
        t = torch.as_tensor(t, device=x.device)
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        temb = self.temb(t, self.ch)
        skips = [self.conv_in(x)]
        for level in self.down:
            for i in range(self.num_res_blocks):
                skips.append(level.run_block(i, skips[-1], temb))
            if hasattr(level, "downsample"):
                skips.append(level.downsample(skips[-1]))
        h = self.mid(skips[-1], temb)
        for level in reversed(self.up):
            for i in range(self.num_res_blocks + 1):
                h = level.run_block(i, torch.cat([h, skips.pop()], dim=1), temb)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return h, temb, self.conv_out(F.silu(self.norm_out(h)))

    def forward(self, x: torch.Tensor, t: torch.Tensor | float) -> torch.Tensor:
        return self.forward_features(x, t)[2]

    # -- reading a checkpoint's architecture -------------------------------------------------------
    @staticmethod
    def infer_config(state: Mapping[str, Any]) -> dict[str, Any] | None:
        """What the weights tell: ch, out_ch, in_channels, ch_mult, num_res_blocks, resamp_with_conv and
        ``attn_levels`` (the encoder levels with attention), or None when the layout is not readable.

        ``resolution`` / ``attn_resolutions`` are not in the weights (only their ratio is):
        :func:`resolve_resolution` combines ``attn_levels`` with what the caller knows."""
        try:
            ch, in_channels = (int(d) for d in state["conv_in.weight"].shape[:2])
            out_ch = int(state["conv_out.weight"].shape[0])
            levels = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("down."))
            blocks = 1 + max(int(k.split(".")[3]) for k in state if k.startswith("down.0.block."))
            mult, attn_levels = [], []
            for level in range(levels):
                width = int(state[f"down.{level}.block.0.conv1.weight"].shape[0])
                if width % ch:
                    return None
                mult.append(width // ch)
                if f"down.{level}.attn.0.q.weight" in state:
                    attn_levels.append(level)
            return {"ch": ch, "out_ch": out_ch, "in_channels": in_channels, "ch_mult": mult,
                    "num_res_blocks": blocks, "resamp_with_conv": levels == 1 or "down.0.downsample.conv.weight" in state,
                    "attn_levels": attn_levels}
        except (KeyError, AttributeError, ValueError, TypeError, IndexError):
            return None


def resolve_resolution(attn_levels: Sequence[int], resolution: int | None,
                       attn_resolutions: Sequence[int] | None) -> dict[str, Any]:
    """``resolution`` and ``attn_resolutions`` consistent with the encoder levels that hold attention.

    Level L works at resolution / 2^L. Given ``resolution``, the attention sizes follow from the weights;
    given only ``attn_resolutions``, the resolution follows when attention exists. ValueError otherwise.
    """
    if resolution is not None:
        found = sorted(int(resolution) >> level for level in attn_levels)
        return {"resolution": int(resolution), "attn_resolutions": found}
    if attn_resolutions is None or not attn_levels:
        raise ValueError("the image size is not stored in DDIM Model weights: pass resolution= (e.g. 32 for "
                         f"CIFAR10, 64 for CelebA, 256 for LSUN; CLI: {RESOLUTION_FLAG})")
    sizes = sorted((int(r) for r in attn_resolutions), reverse=True)
    if len(sizes) != len(attn_levels):
        raise ValueError(f"attn_resolutions={list(attn_resolutions)} names {len(sizes)} size(s), but the weights "
                         f"have attention at {len(attn_levels)} encoder level(s) {list(attn_levels)}: pass resolution= "
                         f"({RESOLUTION_FLAG})")
    candidates = {size << level for size, level in zip(sizes, sorted(attn_levels))}
    if len(candidates) != 1:
        raise ValueError(f"attn_resolutions={list(attn_resolutions)} does not fit the encoder levels with attention "
                         f"{list(attn_levels)} at any single image size: pass resolution= "
                         f"({RESOLUTION_FLAG})")
    return {"resolution": candidates.pop(), "attn_resolutions": sorted(sizes)}
