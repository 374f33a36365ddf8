"""The E[eps^n] heads of the official GMS code (Guohanzhong/GMS), with the state-dict layout of its files.

Both read the backbone's last decoder feature h and the backbone's time embedding:

- improved-diffusion ``UNetModel4Pretrained.out2`` (kinds ``iddpm-simple``, ``iddpm-complex``,
  ``iddpm-complex2``): ``simple`` = GroupNorm32, SiLU, zero-initialised 3x3 conv; ``complex`` = an
  improved-diffusion ResBlock (time-conditioned, same width, the backbone's scale-shift setting) and then
  the same; ``complex2`` = ResBlock, GroupNorm32, SiLU, ResBlock, SiLU, conv. Keys are ``out2.``'s
  without the prefix (``0.in_layers.0.weight``, ...).
- the DDIM ``Model4Pretrained`` head (kinds ``ddim-simple``, ``ddim-complex``): an optional
  ``before_out`` ResnetBlock (complex), then ``norm_out2`` (GroupNorm 32, eps 1e-6), SiLU, ``conv_out2``.
  Keys are the file's own (``before_out.*``, ``norm_out2.*``, ``conv_out2.*``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import ddim_model, iddpm

IDDPM_MODES = ("simple", "complex", "complex2")
DDIM_MODES = ("simple", "complex")
OFFICIAL_HEAD_KINDS = tuple(f"iddpm-{m}" for m in IDDPM_MODES) + tuple(f"ddim-{m}" for m in DDIM_MODES)


class IDDPMHead(iddpm._Seq):
    """``UNetModel4Pretrained.out2`` in one of the modes simple / complex / complex2 (see module doc)."""

    def __init__(self, mode: str, channels: int, emb_channels: int, out_channels: int, dropout: float = 0.0,
                 use_scale_shift_norm: bool = False):
        if mode not in IDDPM_MODES:
            raise ValueError(f"unknown improved-diffusion head mode {mode!r}; valid: {', '.join(IDDPM_MODES)}")

        def res() -> nn.Module:
            return iddpm._ResBlock(channels, emb_channels, dropout, None, use_scale_shift_norm)

        conv = nn.Conv2d(channels, out_channels, 3, padding=1)
        nn.init.zeros_(conv.weight)  # as the official zero_module: the head starts at 0
        nn.init.zeros_(conv.bias)
        tail = [iddpm._norm(channels), nn.SiLU()]
        layers = {"simple": tail + [conv],
                  "complex": [res()] + tail + [conv],
                  "complex2": [res()] + tail + [res(), nn.SiLU(), conv]}[mode]
        super().__init__(*layers)
        self.mode = mode


class DDIMHead(nn.Module):
    """``Model4Pretrained``'s head: [before_out ResnetBlock (complex)] -> norm_out2 -> SiLU -> conv_out2."""

    def __init__(self, mode: str, channels: int, temb_channels: int, out_channels: int, dropout: float = 0.0):
        super().__init__()
        if mode not in DDIM_MODES:
            raise ValueError(f"unknown DDIM Model head mode {mode!r}; valid: {', '.join(DDIM_MODES)}")
        self.mode = mode
        if mode == "complex":
            self.before_out = ddim_model.ResnetBlock(channels, channels, temb_channels, dropout)
        self.norm_out2 = ddim_model.norm(channels)
        self.conv_out2 = nn.Conv2d(channels, out_channels, 3, padding=1)

    def forward(self, h: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        if self.mode == "complex":
            h = self.before_out(h, temb)
        return self.conv_out2(F.silu(self.norm_out2(h)))


def build_official_head(kind: str, backbone: nn.Module, out_channels: int, dropout: float) -> nn.Module:
    """The head ``kind`` (one of OFFICIAL_HEAD_KINDS) sized for ``backbone``'s feature and embedding widths."""
    family, _, mode = kind.partition("-")
    f, e = int(backbone.feature_channels), int(backbone.temb_channels)
    if family == "iddpm":
        return IDDPMHead(mode, f, e, out_channels, dropout, bool(getattr(backbone, "use_scale_shift_norm", False)))
    if family == "ddim":
        return DDIMHead(mode, f, e, out_channels, dropout)
    raise ValueError(f"unknown official head kind {kind!r}; valid: {', '.join(OFFICIAL_HEAD_KINDS)}")
