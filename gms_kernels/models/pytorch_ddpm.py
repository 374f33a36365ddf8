"""The UNet of pytorch-ddpm (w86763777/pytorch-ddpm), the CIFAR10 network the GMS paper builds on.

Written from the architecture's description; module names are chosen so that the state dict is
key-for-key the original's (``time_embedding.timembedding.{0,1,3}``, ``head``, ``downblocks.N``,
``middleblocks.N``, ``upblocks.N``, ``tail.{0,2}``), so a pytorch-ddpm ``ckpt["ema_model"]`` loads with
``strict=True``. The network takes the integer time index t in [0, T) and returns eps.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..core.schedule import Schedule
from ._common import attend


def sinusoid_table(T: int, dim: int) -> torch.Tensor:
    """[T, dim] table: row t holds sin(t w_k), cos(t w_k) interleaved, w_k = 10000^(-2k/dim)."""
    if dim % 2:
        raise ValueError(f"the time embedding width must be even, got {dim}")
    rates = torch.exp(-(torch.arange(0, dim, 2) / dim * math.log(10000)))
    angles = torch.arange(T).float()[:, None] * rates[None, :]
    return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(T, dim)


class _TimeEmbedding(nn.Module):
    def __init__(self, T: int, ch: int, dim: int):
        super().__init__()
        device = torch.empty(0).device  # the ambient default device (e.g. meta)
        with torch.device("cpu"):  # sin/cos on the meta device would go through slow decompositions
            table = sinusoid_table(T, ch)
        self.timembedding = nn.Sequential(
            nn.Embedding.from_pretrained(table.to(device), freeze=True),  # index 0: fixed table
            nn.Linear(ch, dim),
            nn.SiLU(),
            nn.Linear(dim, dim),
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.timembedding(t)


class _Attention(nn.Module):
    """Single-head self-attention over all pixels, added to its input."""

    def __init__(self, ch: int):
        super().__init__()
        self.group_norm = nn.GroupNorm(32, ch)
        self.proj_q = nn.Conv2d(ch, ch, 1)
        self.proj_k = nn.Conv2d(ch, ch, 1)
        self.proj_v = nn.Conv2d(ch, ch, 1)
        self.proj = nn.Conv2d(ch, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.group_norm(x)
        q, k, v = (p(n).flatten(2) for p in (self.proj_q, self.proj_k, self.proj_v))
        return x + self.proj(attend(q, k, v).view_as(x))


class _ResBlock(nn.Module):
    """GN-SiLU-conv, + projected time embedding, GN-SiLU-dropout-conv, + shortcut, then optional attention."""

    def __init__(self, in_ch: int, out_ch: int, tdim: int, dropout: float, attn: bool):
        super().__init__()
        self.block1 = nn.Sequential(nn.GroupNorm(32, in_ch), nn.SiLU(), nn.Conv2d(in_ch, out_ch, 3, padding=1))
        self.temb_proj = nn.Sequential(nn.SiLU(), nn.Linear(tdim, out_ch))
        self.block2 = nn.Sequential(nn.GroupNorm(32, out_ch), nn.SiLU(), nn.Dropout(dropout),
                                    nn.Conv2d(out_ch, out_ch, 3, padding=1))
        self.shortcut = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()
        self.attn = _Attention(out_ch) if attn else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.block1(x) + self.temb_proj(temb)[:, :, None, None]
        h = self.block2(h) + self.shortcut(x)
        return self.attn(h)


class _Down(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.main = nn.Conv2d(ch, ch, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        return self.main(x)


class _Up(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.main = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        return self.main(F.interpolate(x, scale_factor=2, mode="nearest"))


class PytorchDDPMUNet(nn.Module):
    """pytorch-ddpm's UNet; ``forward(x, t)`` with long t in [0, T) returns eps (3 channels).

    Defaults are the CIFAR10 model (35,874,307 numbers in 329 state-dict entries, the fixed
    sinusoid table included). ``in_channels`` (keyword only; the original fixes 3) sets the data
    channels. ``schedule`` defaults to pytorch-ddpm's linear betas 1e-4..0.02 over T steps.
    :meth:`forward_features` returns the last decoder feature, the time embedding and eps of one pass.
    """

    time_input = "index"
    family = "pytorch-ddpm"

    def __init__(self, T: int = 1000, ch: int = 128, ch_mult: Sequence[int] = (1, 2, 2, 2),
                 attn: Sequence[int] = (1,), num_res_blocks: int = 2, dropout: float = 0.1, *,
                 in_channels: int = 3):
        super().__init__()
        ch_mult, attn = tuple(int(m) for m in ch_mult), tuple(int(a) for a in attn)
        bad = [a for a in attn if not 0 <= a < len(ch_mult)]
        if bad:
            raise ValueError(f"attn levels {bad} are out of range for ch_mult={ch_mult} (levels 0..{len(ch_mult) - 1})")
        widths = sorted({ch * m for m in ch_mult})
        if any(w % 32 for w in widths):
            raise ValueError(f"every width ch*mult must be a multiple of 32 (GroupNorm(32)); got {widths}")
        self.T, self.ch, self.ch_mult, self.attn = int(T), int(ch), ch_mult, attn
        self.num_res_blocks, self.dropout, self.in_channels = int(num_res_blocks), float(dropout), int(in_channels)
        self._schedule: Schedule | None = None
        tdim = 4 * ch
        self.time_embedding = _TimeEmbedding(T, ch, tdim)
        self.head = nn.Conv2d(in_channels, ch, 3, padding=1)

        self.downblocks = nn.ModuleList()
        skip_widths, width = [ch], ch
        for level, mult in enumerate(ch_mult):
            for _ in range(num_res_blocks):
                self.downblocks.append(_ResBlock(width, ch * mult, tdim, dropout, level in attn))
                width = ch * mult
                skip_widths.append(width)
            if level < len(ch_mult) - 1:
                self.downblocks.append(_Down(width))
                skip_widths.append(width)

        self.middleblocks = nn.ModuleList([_ResBlock(width, width, tdim, dropout, True),
                                           _ResBlock(width, width, tdim, dropout, False)])

        self.upblocks = nn.ModuleList()
        for level in reversed(range(len(ch_mult))):
            for _ in range(num_res_blocks + 1):
                self.upblocks.append(_ResBlock(width + skip_widths.pop(), ch * ch_mult[level], tdim, dropout,
                                               level in attn))
                width = ch * ch_mult[level]
            if level > 0:
                self.upblocks.append(_Up(width))

        self.tail = nn.Sequential(nn.GroupNorm(32, width), nn.SiLU(), nn.Conv2d(width, in_channels, 3, padding=1))
        self.feature_channels, self.temb_channels, self.eps_channels = width, tdim, in_channels
        self._init_weights()

    def _init_weights(self) -> None:
        # Glorot-uniform weights and zero biases; the convs that close a residual branch, the attention
        # output and the final conv start almost at zero so the network starts near identity / zero.
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        small = [self.tail[-1]] + [m.block2[-1] for m in self.modules() if isinstance(m, _ResBlock)] \
            + [m.proj for m in self.modules() if isinstance(m, _Attention)]
        for conv in small:
            nn.init.xavier_uniform_(conv.weight, gain=1e-5)

    # -- attributes gk.sample reads ----------------------------------------------------------------
    @property
    def schedule(self) -> Schedule:
        if self._schedule is None:
            with torch.device("cpu"):  # also when accessed under a meta-device context
                self._schedule = Schedule.linear(self.T, 1e-4, 0.02)
        return self._schedule

    @schedule.setter
    def schedule(self, value: Schedule | None) -> None:
        self._schedule = value

    @property
    def config(self) -> dict[str, Any]:
        return {"T": self.T, "ch": self.ch, "ch_mult": list(self.ch_mult), "attn": list(self.attn),
                "num_res_blocks": self.num_res_blocks, "dropout": self.dropout, "in_channels": self.in_channels}

    # -- forward -----------------------------------------------------------------------------------
    def _time(self, t: torch.Tensor | int, x: torch.Tensor) -> torch.Tensor:
        t = torch.as_tensor(t, device=x.device)
        if t.dim() == 0:
            t = t.expand(x.shape[0])
        if t.is_floating_point():
            if not torch.equal(t, t.round()):
                raise ValueError("PytorchDDPMUNet takes an integer time index t in [0, T) (time_input='index'), "
                                 "got fractional values")
            t = t.long()
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.T):
            raise ValueError(f"time index out of range [0, {self.T}): got min {int(t.min())}, max {int(t.max())}")
        return t

    def forward_features(self, x: torch.Tensor, t: torch.Tensor | int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(h, temb, eps) of one pass: h is the last decoder feature (the input of ``tail``)."""
        temb = self.time_embedding(self._time(t, x))
        h = self.head(x)
        skips = [h]
        for block in self.downblocks:
            h = block(h, temb)
            skips.append(h)
        for block in self.middleblocks:
            h = block(h, temb)
        for block in self.upblocks:
            if isinstance(block, _ResBlock):
                h = torch.cat([h, skips.pop()], dim=1)
            h = block(h, temb)
        return h, temb, self.tail(h)

    def forward(self, x: torch.Tensor, t: torch.Tensor | int) -> torch.Tensor:
        return self.forward_features(x, t)[2]

    # -- reading a checkpoint's architecture -------------------------------------------------------
    @staticmethod
    def infer_config(state: Mapping[str, Any]) -> dict[str, Any] | None:
        """The constructor arguments a pytorch-ddpm state dict was made with (dropout excepted), or None.

        Each argument is read from any of several entries, so that a file with a few entries
        missing is still compared with its own architecture (and its missing keys named)."""
        def dim(keys: Sequence[str], axis: int) -> int | None:
            for k in keys:
                if isinstance(state.get(k), torch.Tensor) and state[k].dim() > axis:
                    return int(state[k].shape[axis])
            return None

        tdim = dim(["time_embedding.timembedding.1.weight", "time_embedding.timembedding.3.weight"], 0)
        found = {
            "T": dim(["time_embedding.timembedding.0.weight"], 0),
            "ch": dim(["time_embedding.timembedding.0.weight", "time_embedding.timembedding.1.weight"], 1)
            or dim(["head.weight", "head.bias"], 0) or (tdim // 4 if tdim else None),
            "in_channels": dim(["head.weight"], 1) or dim(["tail.2.weight", "tail.2.bias"], 0),
        }
        blocks: dict[int, set[str]] = {}
        for key in state:
            parts = key.split(".")
            if len(parts) > 2 and parts[0] == "downblocks" and parts[1].isdigit():
                blocks.setdefault(int(parts[1]), set()).add(".".join(parts[2:]))
        levels: list[list[int]] = [[]]
        attn: set[int] = set()
        for n in range(max(blocks, default=-1) + 1):
            p, names = f"downblocks.{n}.", blocks.get(n, set())
            if any(name.startswith("main.") for name in names):
                levels.append([])
                continue
            width = dim([p + "block1.2.weight", p + "block1.2.bias", p + "temb_proj.1.weight",
                         p + "block2.3.weight", p + "block2.0.weight"], 0)
            if width is None:
                return None  # a whole block is gone: the level structure cannot be read
            levels[-1].append(width)
            if any(name.startswith("attn.") for name in names):
                attn.add(len(levels) - 1)
        counts = {len(level) for level in levels}
        if found["ch"] is None or found["in_channels"] is None or len(counts) != 1 or 0 in counts:
            return None
        if found["T"] is None:  # (only the sinusoid table tells T; the constructor's default stands in)
            del found["T"]
        return {**found, "ch_mult": [level[0] // found["ch"] for level in levels], "attn": sorted(attn),
                "num_res_blocks": counts.pop()}
