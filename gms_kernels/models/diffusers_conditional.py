"""An adapter that makes a conditional diffusers UNet a gms_kernels model: a ``UNet2DModel`` with a class
embedding, or a ``UNet2DConditionModel`` (diffusers is imported lazily)."""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from ..core.schedule import Schedule


def is_conditional_unet(module: Any) -> bool:
    """Whether ``module`` is a diffusers UNet that takes a condition: a ``UNet2DConditionModel``, or a
    ``UNet2DModel`` built with a class embedding (``num_class_embeds`` or ``class_embed_type``)."""
    lib = sys.modules.get("diffusers")
    if lib is None:
        return False
    cond_cls, plain_cls = getattr(lib, "UNet2DConditionModel", None), getattr(lib, "UNet2DModel", None)
    if cond_cls is not None and isinstance(module, cond_cls):
        return True
    return (plain_cls is not None and isinstance(module, plain_cls)
            and getattr(module, "class_embedding", None) is not None)


class DiffusersConditionalUNet(nn.Module):
    """``model(x, t, **kwargs) = unet(x, t, **kwargs).sample`` for a conditional diffusers UNet (time input: the
    index t, as diffusers' pipelines pass it): ``class_labels`` for a class-conditional ``UNet2DModel``,
    ``encoder_hidden_states`` (and the rest of its forward's arguments) for a ``UNet2DConditionModel``.
    :func:`gms_kernels.sample` passes them from its ``model_kwargs``.

    ``eps_only``: None (default) returns only the first ``in_channels`` channels when out_channels =
    2 * in_channels (diffusers' learned-variance layout, never read as E[eps^2]) or the pipeline's
    scheduler says ``variance_type`` is learned, and the whole output otherwise (e.g. a UNet trained to
    output [e1, e2, e3]); True/False force it. ``schedule``: the gk.Schedule the UNet was trained with, if
    known; ``schedule_note``: why it is not (gk.sample then warns). ``source``: the checkpoint path.
    """

    time_input = "index"

    def __init__(self, unet: nn.Module, schedule: Schedule | None = None, eps_only: bool | None = None,
                 variance_type: str | None = None, source: str | None = None):
        super().__init__()
        if not is_conditional_unet(unet):
            raise TypeError("DiffusersConditionalUNet wraps a diffusers UNet2DConditionModel or a UNet2DModel with a "
                            f"class embedding, got {type(unet).__name__}")
        self.unet, self.schedule, self.variance_type, self.source = unet, schedule, variance_type, source
        self.schedule_note: str | None = None
        cfg = unet.config
        self.in_channels, self.out_channels = int(cfg.in_channels), int(cfg.out_channels)
        learned = variance_type in ("learned", "learned_range") or (
            variance_type is None and self.out_channels == 2 * self.in_channels)
        self.eps_only = learned if eps_only is None else bool(eps_only)
        self.eps_channels = self.in_channels
        self.cross_attention = not isinstance(unet, sys.modules["diffusers"].UNet2DModel)  # (it needs the states)

    @property
    def family(self) -> str:
        """The backbone family gk.models.export_diffusers records: a UNet2DModel is rebuilt as a
        :class:`DiffusersUNet` (which takes ``class_labels`` too), a UNet2DConditionModel as this wrapper."""
        return "diffusers-condition" if self.cross_attention else "diffusers"

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.unet.config)

    @property
    def output_heads(self) -> int:
        """How many heads [e1, e2, e3] forward returns (read by gk.sample's checks)."""
        return 1 if self.eps_only else self.out_channels // self.in_channels

    @property
    def heads_hint(self) -> str:
        where = f" at {self.source}" if self.source else ""
        return (f"the conditional diffusers {type(self.unet).__name__}{where} gives {self.output_heads} head(s) "
                f"({self.out_channels} output channels for {self.in_channels}-channel data); use solver ddpm, "
                "ddpm-large or ddim, which read eps alone, or a network trained to output [e1, e2, e3]")

    def forward(self, x: torch.Tensor, t: torch.Tensor | int, **kwargs: Any) -> torch.Tensor:
        if self.cross_attention and kwargs.get("encoder_hidden_states") is None:
            raise TypeError(f"a {type(self.unet).__name__} needs encoder_hidden_states: pass "
                            "gk.sample(..., model_kwargs={'encoder_hidden_states': states}) ([N or 1, tokens, "
                            "cross_attention_dim])")
        out = self.unet(x, t, **kwargs)
        out = out[0] if isinstance(out, tuple) else out.sample  # (return_dict=False gives a tuple)
        return out[:, :self.in_channels] if self.eps_only else out
