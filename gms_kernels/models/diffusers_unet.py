"""An adapter that makes a ``diffusers.UNet2DModel`` a gms_kernels model (diffusers is imported lazily)."""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..core.schedule import Schedule, diffusers_schedule
from ..model_io import add_heads_hint, learned_variance_note
from .diffusers_conditional import DiffusersConditionalUNet, is_conditional_unet


LEARNED_VARIANCE = ("learned", "learned_range")


def scheduler_config_near(path: str, subfolder: str | None) -> dict | None:
    """The pipeline's ``scheduler/scheduler_config.json`` next to a UNet folder (or in it), if readable."""
    root = path if subfolder else os.path.dirname(os.path.abspath(path))
    for file in (os.path.join(root, "scheduler", "scheduler_config.json"), os.path.join(path, "scheduler_config.json")):
        try:
            with open(file) as f:
                cfg = json.load(f)
        except (OSError, ValueError):
            continue
        return cfg if isinstance(cfg, dict) else None
    return None


def pipeline_scheduler_config(unet: Any) -> tuple[dict | None, str | None]:
    """(the pipeline's scheduler config, the directory) for a UNet2DModel loaded with ``from_pretrained``:
    its config's ``_name_or_path`` is the pipeline folder (loaded with ``subfolder=``) or the UNet's own
    folder (which holds its config.json). (None, the directory or None) when there is none to read."""
    path = unet.config.get("_name_or_path") if isinstance(unet.config, Mapping) else None
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        return None, None
    path = os.fspath(path)
    unet_folder = os.path.isfile(os.path.join(path, "config.json"))
    return scheduler_config_near(path, None if unet_folder else "unet"), path


def adapt_diffusers(model: Any) -> nn.Module | None:
    """A diffusers model passed as is, made a gms_kernels model (registered with
    :func:`gms_kernels.model_io.register_adapter`): a ``UNet2DModel`` is wrapped in :class:`DiffusersUNet` (reads
    ``.sample`` of its ``UNet2DOutput``; time input: the 0-based index, as diffusers' pipelines pass it), with the
    training schedule and ``variance_type`` of its pipeline's ``scheduler/scheduler_config.json`` when it was loaded
    from a pipeline directory; a ``GMSDiffusersModel`` gives its gms_kernels network. A class-conditional
    ``UNet2DModel`` (a class embedding) or a ``UNet2DConditionModel`` is wrapped in
    :class:`~gms_kernels.models.diffusers_conditional.DiffusersConditionalUNet` instead, which takes the condition
    as keyword arguments (``gk.sample(..., model_kwargs=...)``). None for anything that is not a diffusers model."""
    lib = sys.modules.get("diffusers")  # (never imports diffusers: a diffusers model means it is loaded)
    if lib is None or not isinstance(model, lib.ModelMixin):
        return None
    conditional = is_conditional_unet(model)  # (it takes gk.sample's model_kwargs)
    if conditional or is_diffusers_unet(model):
        config, where = pipeline_scheduler_config(model)
        wrap = DiffusersConditionalUNet if conditional else DiffusersUNet
        unet = wrap(model, variance_type=(config or {}).get("variance_type"), source=where)
        if config is None:
            unet.schedule_note = (f"no scheduler/scheduler_config.json next to {where}" if where else
                                  "it was not loaded from a directory (its config has no _name_or_path to look in)")
            return unet
        try:
            unet.schedule = diffusers_schedule(config)
        except (TypeError, ValueError) as exc:  # (only a warning unless the schedule is needed: schedule= may be given)
            unet.schedule_note = f"its pipeline's scheduler config (next to {where}) gives no schedule: {exc}"
        return unet
    if type(model).__name__ == "GMSDiffusersModel":
        return model.net
    raise TypeError(f"a diffusers {type(model).__name__} cannot be sampled directly: gms_kernels reads UNet2DModel, "
                    "UNet2DConditionModel and gk.models.GMSDiffusersModel; wrap it so that forward(x_t, t) returns "
                    "one tensor holding the heads [e1, e2, e3] along dim 1")


def is_diffusers_unet(module: Any) -> bool:
    """Whether ``module`` is a diffusers UNet2DModel (without importing diffusers)."""
    lib = sys.modules.get("diffusers")
    cls = getattr(lib, "UNet2DModel", None) if lib is not None else None
    return cls is not None and isinstance(module, cls)


class DiffusersUNet(nn.Module):
    """``model(x, t, **kwargs) = unet(x, t, **kwargs).sample`` for a diffusers ``UNet2DModel`` (time input: the
    index t). A class-conditional UNet2DModel (``num_class_embeds`` or ``class_embed_type``; ``conditional``
    is then True) needs ``class_labels=`` (``gk.sample(..., model_kwargs={"class_labels": y})``).

    ``eps_only``: None (default) returns only the first ``in_channels`` channels when the UNet predicts
    a learned variance too (out_channels = 2 * in_channels) and the whole output otherwise (e.g. a UNet
    trained to output [e1, e2, e3]); True/False force it. ``schedule``: the gk.Schedule the UNet was
    trained with, if known (the loader reads it from a pipeline's scheduler config).
    ``variance_type``: the pipeline scheduler's ``variance_type`` when known (the loader reads it). With
    ``"learned"`` / ``"learned_range"`` the channels after the first C are a learned variance: they are
    never returned as E[eps^2] (``eps_only=False`` is refused). ``source``: the checkpoint path, named in
    error messages. :meth:`forward_features` returns (h, temb, output) of one pass, h being the input of
    ``conv_norm_out`` (temb includes the class embedding of a class-conditional UNet). ``schedule_note``: set
    when the training schedule was looked for and not found (what was looked at); ``gk.sample`` then warns
    that it assumes linear betas.
    """

    time_input = "index"
    family = "diffusers"

    def __init__(self, unet: nn.Module, schedule: Schedule | None = None, eps_only: bool | None = None,
                 variance_type: str | None = None, source: str | None = None):
        super().__init__()
        if not is_diffusers_unet(unet):
            raise TypeError(f"DiffusersUNet wraps a diffusers.UNet2DModel, got {type(unet).__name__}")
        self.unet = unet
        self.schedule = schedule
        self.variance_type, self.source = variance_type, source
        self.schedule_note: str | None = None
        self.eps_only_given = eps_only  # (None: the layout was inferred from the channel counts)
        cfg = unet.config
        self.in_channels, self.out_channels = int(cfg.in_channels), int(cfg.out_channels)
        if eps_only is False and self.learned_variance and self.out_channels == 2 * self.in_channels:
            raise ValueError(f"{self._name()}: its scheduler has variance_type={variance_type!r}, so output channels "
                             f"{self.in_channels}..{self.out_channels - 1} are a learned variance, not E[eps^2]: "
                             f"eps_only=False would read them as a head. {self._add_heads_hint()}")
        self.eps_only = self.out_channels == 2 * self.in_channels if eps_only is None else bool(eps_only)
        self.feature_channels = int(unet.conv_norm_out.num_channels)
        self.temb_channels = int(unet.time_embedding.linear_2.out_features)
        self.eps_channels = self.in_channels
        self.conditional = getattr(unet, "class_embedding", None) is not None

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.unet.config)

    @property
    def learned_variance(self) -> bool:
        """True when the UNet's extra C channels are diffusers' learned variance: the scheduler says
        so, or (no scheduler config known) out_channels = 2 * in_channels, DDPM's learned-variance layout."""
        if self.variance_type is not None:
            return self.variance_type in LEARNED_VARIANCE
        return self.out_channels == 2 * self.in_channels

    @property
    def output_heads(self) -> int:
        """How many heads [e1, e2, e3] forward returns (read by gk.sample's checks)."""
        return 1 if self.eps_only else self.out_channels // self.in_channels

    @property
    def heads_hint(self) -> str:
        """What to do when a solver needs more heads than this UNet gives (in gk.sample's error)."""
        if self.eps_only and self.out_channels == 2 * self.in_channels:
            what = learned_variance_note(self.in_channels, self.variance_type)
        else:
            what = f"it gives {self.output_heads} head(s) ({self.out_channels} output channels)"
        return f"{self._name()}: {what}. {self._add_heads_hint()}"

    def _name(self) -> str:
        return f"the diffusers UNet2DModel at {self.source}" if self.source else "the diffusers UNet2DModel"

    def _add_heads_hint(self) -> str:
        return add_heads_hint(self.source)

    def _check_condition(self, kwargs: dict[str, Any]) -> None:
        if self.conditional and kwargs.get("class_labels") is None:
            raise TypeError(f"{self._name()} is class-conditional (num_class_embeds="
                            f"{self.unet.config.num_class_embeds}, class_embed_type="
                            f"{self.unet.config.class_embed_type!r}) and needs class_labels: pass "
                            "gk.sample(..., model_kwargs={'class_labels': labels}) or model(x, t, class_labels=labels)")

    def forward(self, x: torch.Tensor, t: torch.Tensor | int, **kwargs: Any) -> torch.Tensor:
        """The UNet's output (its first C channels when ``eps_only``); ``kwargs`` (e.g. ``class_labels``) go
        to the UNet's forward."""
        self._check_condition(kwargs)
        out = self.unet(x, t, **kwargs).sample
        return out[:, :self.in_channels] if self.eps_only else out

    def forward_features(self, x: torch.Tensor, t: torch.Tensor | int,
                         **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One ordinary UNet2DModel forward (``kwargs``, e.g. ``class_labels``, passed to it), with hooks that
        catch the time embedding handed to the first down block (class embedding included) and the feature
        entering ``conv_norm_out``."""
        self._check_condition(kwargs)
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
            out = self.unet(x, t, **kwargs).sample
        finally:
            for handle in handles:
                handle.remove()
        temb = seen.get("temb", seen.get("emb"))
        if "h" not in seen or temb is None:
            raise RuntimeError("could not read the decoder feature / time embedding from the UNet2DModel forward")
        return seen["h"], temb, out
