"""The UNet of improved-diffusion (Nichol & Dhariwal 2021), key-compatible with its raw state dicts.

Written from the architecture's description. State-dict layout: ``time_embed.{0,2}``,
``input_blocks.N.M``, ``middle_block.N``, ``output_blocks.N.M``, ``out.{0,2}``; attention uses one
Conv1d ``qkv`` whose output is split per head first and then into q, k, v (the "legacy" order);
every GroupNorm is computed in float32. ``attention_resolutions`` are downsample rates (2 = at half
resolution). The time input is the float t*1000/T (``time_input = "scaled"``). With learned sigma
(out_channels = 2*in_channels) the first in_channels output channels are eps and the rest the
variance interpolation v; ``eps_only=True`` makes forward return eps alone.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..core.schedule import Schedule
from ._common import GroupNorm32, attend


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """[N, dim]: cos(t w_k) for k < dim/2, then sin(t w_k); w_k = max_period^(-k/(dim/2)); zero-padded if dim is odd."""
    half = dim // 2
    rates = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * (-math.log(max_period)) / half)
    angles = t[:, None].float() * rates[None, :]
    out = torch.cat([angles.cos(), angles.sin()], dim=-1)
    return F.pad(out, (0, 1)) if dim % 2 else out


def _norm(ch: int) -> GroupNorm32:
    return GroupNorm32(32, ch)


class _TimeBlock(nn.Module):
    """Marker: a block whose forward takes (x, emb)."""


class _Seq(nn.Sequential):
    """Sequential that hands the time embedding to the blocks that take it."""

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        for block in self:
            x = block(x, emb) if isinstance(block, _TimeBlock) else block(x)
        return x


class _ResBlock(_TimeBlock):
    def __init__(self, ch: int, emb_ch: int, dropout: float, out_ch: int | None = None,
                 scale_shift: bool = False):
        super().__init__()
        out_ch = out_ch or ch
        self.scale_shift = scale_shift
        self.in_layers = nn.Sequential(_norm(ch), nn.SiLU(), nn.Conv2d(ch, out_ch, 3, padding=1))
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_ch, 2 * out_ch if scale_shift else out_ch))
        self.out_layers = nn.Sequential(_norm(out_ch), nn.SiLU(), nn.Dropout(dropout),
                                        nn.Conv2d(out_ch, out_ch, 3, padding=1))
        nn.init.zeros_(self.out_layers[-1].weight)
        nn.init.zeros_(self.out_layers[-1].bias)
        self.skip_connection = nn.Identity() if out_ch == ch else nn.Conv2d(ch, out_ch, 1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.in_layers(x)
        e = self.emb_layers(emb).to(h.dtype)[:, :, None, None]
        norm, rest = self.out_layers[0], self.out_layers[1:]
        if self.scale_shift:
            scale, shift = e.chunk(2, dim=1)
            h = rest(norm(h) * (1 + scale) + shift)
        else:
            h = self.out_layers(h + e)
        return self.skip_connection(x) + h


class _Attention(nn.Module):
    """Multi-head self-attention; the qkv channels are grouped per head, each head as [q, k, v]."""

    def __init__(self, ch: int, num_heads: int):
        super().__init__()
        if ch % num_heads:
            raise ValueError(f"attention width {ch} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.norm = _norm(ch)
        self.qkv = nn.Conv1d(ch, 3 * ch, 1)
        self.proj_out = nn.Conv1d(ch, ch, 1)
        nn.init.zeros_(self.proj_out.weight)
        nn.init.zeros_(self.proj_out.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c = x.shape[:2]
        flat = x.reshape(b, c, -1)
        qkv = self.qkv(self.norm(flat)).reshape(b * self.num_heads, 3 * c // self.num_heads, -1)
        q, k, v = qkv.chunk(3, dim=1)
        h = attend(q, k, v).reshape(b, c, -1)
        return (flat + self.proj_out(h)).reshape(x.shape)


class _Down(nn.Module):
    def __init__(self, ch: int, use_conv: bool):
        super().__init__()
        self.op = nn.Conv2d(ch, ch, 3, stride=2, padding=1) if use_conv else nn.AvgPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


class _Up(nn.Module):
    def __init__(self, ch: int, use_conv: bool):
        super().__init__()
        self.use_conv = use_conv
        if use_conv:
            self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=2, mode="nearest")
        return self.conv(x) if self.use_conv else x


class IDDPMUNet(nn.Module):
    """improved-diffusion's ``UNetModel`` (2-D, unconditional) with the same arguments and state dict.

    ``forward(x, t)`` takes float t*1000/T and returns all ``out_channels`` (eps, and v with learned
    sigma), or eps alone when ``eps_only`` is set. :meth:`forward_features` returns the last decoder
    feature, the time embedding and the full output of one pass. ``schedule`` is None unless set
    (the convenience constructors set improved-diffusion's cosine schedule with T = 4000).
    """

    time_input = "scaled"
    family = "improved-diffusion"

    def __init__(self, in_channels: int, model_channels: int, out_channels: int, num_res_blocks: int,
                 attention_resolutions: Sequence[int], dropout: float = 0.0,
                 channel_mult: Sequence[int] = (1, 2, 4, 8), conv_resample: bool = True, num_heads: int = 1,
                 num_heads_upsample: int = -1, use_scale_shift_norm: bool = False, *, eps_only: bool = False):
        super().__init__()
        channel_mult = tuple(int(m) for m in channel_mult)
        attention_resolutions = tuple(sorted(int(r) for r in attention_resolutions))
        if channel_mult[0] * model_channels != model_channels:
            raise ValueError(f"channel_mult must start with 1 (the output block reads model_channels), got {channel_mult}")
        widths = sorted({model_channels * m for m in channel_mult})
        if any(w % 32 for w in widths):
            raise ValueError(f"every width model_channels*mult must be a multiple of 32 (GroupNorm(32)); got {widths}")
        heads_up = num_heads if num_heads_upsample == -1 else num_heads_upsample
        self.in_channels, self.model_channels, self.out_channels = int(in_channels), int(model_channels), int(out_channels)
        self.num_res_blocks, self.attention_resolutions = int(num_res_blocks), attention_resolutions
        self.dropout, self.channel_mult, self.conv_resample = float(dropout), channel_mult, bool(conv_resample)
        self.num_heads, self.num_heads_upsample = int(num_heads), int(num_heads_upsample)
        self.use_scale_shift_norm, self.eps_only = bool(use_scale_shift_norm), bool(eps_only)
        self.schedule: Schedule | None = None

        emb_ch = 4 * model_channels
        self.time_embed = nn.Sequential(nn.Linear(model_channels, emb_ch), nn.SiLU(), nn.Linear(emb_ch, emb_ch))

        def res(cin: int, cout: int | None = None) -> _ResBlock:
            return _ResBlock(cin, emb_ch, dropout, cout, use_scale_shift_norm)

        self.input_blocks = nn.ModuleList([_Seq(nn.Conv2d(in_channels, model_channels, 3, padding=1))])
        skip_widths, width, rate = [model_channels], model_channels, 1
        for level, mult in enumerate(channel_mult):
            for _ in range(num_res_blocks):
                layers: list[nn.Module] = [res(width, mult * model_channels)]
                width = mult * model_channels
                if rate in attention_resolutions:
                    layers.append(_Attention(width, num_heads))
                self.input_blocks.append(_Seq(*layers))
                skip_widths.append(width)
            if level < len(channel_mult) - 1:
                self.input_blocks.append(_Seq(_Down(width, conv_resample)))
                skip_widths.append(width)
                rate *= 2

        self.middle_block = _Seq(res(width), _Attention(width, num_heads), res(width))

        self.output_blocks = nn.ModuleList()
        for level in reversed(range(len(channel_mult))):
            for i in range(num_res_blocks + 1):
                layers = [res(width + skip_widths.pop(), model_channels * channel_mult[level])]
                width = model_channels * channel_mult[level]
                if rate in attention_resolutions:
                    layers.append(_Attention(width, heads_up))
                if level > 0 and i == num_res_blocks:
                    layers.append(_Up(width, conv_resample))
                    rate //= 2
                self.output_blocks.append(_Seq(*layers))

        self.out = nn.Sequential(_norm(width), nn.SiLU(), nn.Conv2d(model_channels, out_channels, 3, padding=1))
        nn.init.zeros_(self.out[-1].weight)
        nn.init.zeros_(self.out[-1].bias)
        self.feature_channels, self.temb_channels, self.eps_channels = width, emb_ch, int(in_channels)

    # -- convenience configurations (improved-diffusion's published flags) -------------------------
    @classmethod
    def cifar10_cosine(cls, **overrides: Any) -> "IDDPMUNet":
        """improved-diffusion's CIFAR10 model with the cosine schedule (L_hybrid, learned sigma)."""
        return cls._preset(dict(attention_resolutions=(2, 4), dropout=0.3, channel_mult=(1, 2, 2, 2)), overrides)

    @classmethod
    def imagenet64(cls, **overrides: Any) -> "IDDPMUNet":
        """improved-diffusion's unconditional ImageNet 64x64 model (cosine schedule, learned sigma)."""
        return cls._preset(dict(attention_resolutions=(4, 8), dropout=0.0, channel_mult=(1, 2, 3, 4)), overrides)

    @classmethod
    def _preset(cls, cfg: dict, overrides: dict) -> "IDDPMUNet":
        """The settings both released configs share, then ``cfg``, then the caller's overrides."""
        base = dict(in_channels=3, model_channels=128, out_channels=6, num_res_blocks=3, num_heads=4,
                    num_heads_upsample=-1, use_scale_shift_norm=True)
        model = cls(**{**base, **cfg, **overrides})
        with torch.device("cpu"):  # also when built under a meta-device context
            model.schedule = Schedule.cosine(4000)
        return model

    @property
    def learn_sigma(self) -> bool:
        """True when the output holds [eps, v] (out_channels = 2 * in_channels)."""
        return self.out_channels == 2 * self.in_channels

    @property
    def config(self) -> dict[str, Any]:
        return {"in_channels": self.in_channels, "model_channels": self.model_channels,
                "out_channels": self.out_channels, "num_res_blocks": self.num_res_blocks,
                "attention_resolutions": list(self.attention_resolutions), "dropout": self.dropout,
                "channel_mult": list(self.channel_mult), "conv_resample": self.conv_resample,
                "num_heads": self.num_heads, "num_heads_upsample": self.num_heads_upsample,
                "use_scale_shift_norm": self.use_scale_shift_norm}

    # -- forward -----------------------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor, t: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(h, emb, output) of one pass: h is the input of the ``out`` block; output has all channels."""
        t = torch.as_tensor(t, device=x.device)
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        emb = self.time_embed(timestep_embedding(t, self.model_channels).to(self.time_embed[0].weight.dtype))
        skips = []
        h = x
        for block in self.input_blocks:
            h = block(h, emb)
            skips.append(h)
        h = self.middle_block(h, emb)
        for block in self.output_blocks:
            h = block(torch.cat([h, skips.pop()], dim=1), emb)
        return h, emb, self.out(h)

    def forward(self, x: torch.Tensor, t: torch.Tensor | float) -> torch.Tensor:
        out = self.forward_features(x, t)[2]
        return out[:, :self.in_channels] if self.eps_only else out

    # -- reading a checkpoint's architecture -------------------------------------------------------
    @staticmethod
    def infer_config(state: Mapping[str, Any]) -> dict[str, Any] | None:
        """Constructor arguments read from an improved-diffusion state dict, or None.

        num_heads and dropout leave no trace in the weights and are not returned.
        """
        try:
            model_channels = state["time_embed.0.weight"].shape[1]
            in_channels = state["input_blocks.0.0.weight"].shape[1]
            out_channels = state["out.2.weight"].shape[0]
            n_blocks = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("input_blocks."))
            levels: list[list[int]] = [[]]
            attention: set[int] = set()
            scale_shift, conv_resample, rate = None, True, 1
            for n in range(1, n_blocks):
                p = f"input_blocks.{n}."
                if p + "0.in_layers.2.weight" in state:
                    w = state[p + "0.in_layers.2.weight"].shape[0]
                    levels[-1].append(w)
                    if scale_shift is None:
                        scale_shift = state[p + "0.emb_layers.1.weight"].shape[0] == 2 * w
                    if p + "1.qkv.weight" in state:
                        attention.add(rate)
                else:  # a downsample block: a strided conv, or an average pool that holds no weights
                    conv_resample = conv_resample and p + "0.op.weight" in state
                    levels.append([])
                    rate *= 2
            counts = {len(level) for level in levels}
            if len(counts) != 1 or 0 in counts:
                return None
            return {"in_channels": int(in_channels), "model_channels": int(model_channels),
                    "out_channels": int(out_channels), "num_res_blocks": counts.pop(),
                    "attention_resolutions": sorted(attention),
                    "channel_mult": [level[0] // model_channels for level in levels],
                    "conv_resample": conv_resample, "use_scale_shift_norm": bool(scale_shift)}
        except (KeyError, AttributeError, ValueError, TypeError, IndexError):
            return None
