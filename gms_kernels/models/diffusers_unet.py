"""An adapter that makes a ``diffusers.UNet2DModel`` a gms_kernels model (diffusers is imported lazily)."""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from ..schedule import Schedule


def is_diffusers_unet(module: Any) -> bool:
    """Whether ``module`` is a diffusers UNet2DModel (without importing diffusers)."""
    lib = sys.modules.get("diffusers")
    cls = getattr(lib, "UNet2DModel", None) if lib is not None else None
    return cls is not None and isinstance(module, cls)


class DiffusersUNet(nn.Module):
    """``model(x, t) = unet(x, t).sample`` for a diffusers ``UNet2DModel`` (time input: the index t).

    ``eps_only``: None (default) returns only the first ``in_channels`` channels when the UNet predicts
    a learned variance too (out_channels = 2 * in_channels) and the whole output otherwise (e.g. a UNet
    trained to output [e1, e2, e3]); True/False force it. ``schedule``: the gk.Schedule the UNet was
    trained with, if known (the loader reads it from a pipeline's scheduler config).
    :meth:`forward_features` returns (h, temb, output) of one pass, h being the input of ``conv_norm_out``.
    """

    time_input = "index"
    family = "diffusers"

    def __init__(self, unet: nn.Module, schedule: Schedule | None = None, eps_only: bool | None = None):
        super().__init__()
        if not is_diffusers_unet(unet):
            raise TypeError(f"DiffusersUNet wraps a diffusers.UNet2DModel, got {type(unet).__name__}")
        self.unet = unet
        self.schedule = schedule
        cfg = unet.config
        self.in_channels, self.out_channels = int(cfg.in_channels), int(cfg.out_channels)
        self.eps_only = self.out_channels == 2 * self.in_channels if eps_only is None else bool(eps_only)
        self.feature_channels = int(unet.conv_norm_out.num_channels)
        self.temb_channels = int(unet.time_embedding.linear_2.out_features)
        self.eps_channels = self.in_channels

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.unet.config)

    def forward(self, x: torch.Tensor, t: torch.Tensor | int) -> torch.Tensor:
        out = self.unet(x, t).sample
        return out[:, :self.in_channels] if self.eps_only else out

    def forward_features(self, x: torch.Tensor, t: torch.Tensor | int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One ordinary UNet2DModel forward, with hooks that catch the time embedding handed to the first
        down block (class embedding included) and the feature entering ``conv_norm_out``."""
        seen: dict[str, torch.Tensor] = {}

        def grab_temb(module, args, kwargs):
            temb = kwargs.get("temb", args[1] if len(args) > 1 else None)
            if temb is not None:
                seen.setdefault("temb", temb)

        def grab_embedding(module, args, output):
            seen.setdefault("emb", output)

        def grab_h(module, args):
            seen["h"] = args[0]

        handles = [self.unet.down_blocks[0].register_forward_pre_hook(grab_temb, with_kwargs=True),
                   self.unet.time_embedding.register_forward_hook(grab_embedding),
                   self.unet.conv_norm_out.register_forward_pre_hook(grab_h)]
        try:
            out = self.unet(x, t).sample
        finally:
            for handle in handles:
                handle.remove()
        temb = seen.get("temb", seen.get("emb"))
        if "h" not in seen or temb is None:
            raise RuntimeError("could not read the decoder feature / time embedding from the UNet2DModel forward")
        return seen["h"], temb, out
