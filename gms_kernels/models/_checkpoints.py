"""What gk.models.load (:mod:`.loading`) and the official GMS loader (:mod:`.official_gms`) share: the kinds of
checkpoint, the constructor arguments of each family, a network built and checked against its weights, and the
messages about a file that holds no weights."""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from ..core.schedule import Schedule
from ..core.user_warnings import warn_user
from ._common import check_state_dict, describe_contents, format_call, holds_tensors, materialize, meta_model, \
    mismatch_report
from .ddim_model import RESOLUTION_FLAG, DDIMModel, resolve_resolution
from .moment_net import HEADS_FORMAT, NET_FORMAT

KINDS = ("auto", "pytorch-ddpm", "improved-diffusion", "ddim", "gms-official", "diffusers", "gms-heads", "moment-net")
DDIM_ARGS = ("ch", "out_ch", "ch_mult", "num_res_blocks", "attn_resolutions", "dropout", "resamp_with_conv",
             "in_channels", "resolution")
IDDPM_ARGS = ("in_channels", "model_channels", "out_channels", "num_res_blocks", "attention_resolutions", "dropout",
              "channel_mult", "conv_resample", "num_heads", "num_heads_upsample", "use_scale_shift_norm")
# improved-diffusion's training scripts use 4 heads; the weights cannot tell (the split does not change shapes)
IDDPM_DEFAULTS = {"dropout": 0.0, "num_heads": 4, "num_heads_upsample": -1}

# What each kind reads (for the messages about a file that does not fit the kind given)
EXPECTS = {
    "pytorch-ddpm": "a pytorch-ddpm checkpoint ({'ema_model': state_dict, 'net_model': ...}) or a raw state dict "
                    "of tensors (keyed time_embedding.*, downblocks.*, ...)",
    "improved-diffusion": "an improved-diffusion raw state dict (tensors keyed time_embed.*, input_blocks.*, ...)",
    "ddim": "a DDIM repository Model state dict (tensors keyed temb.dense.*, conv_in.*, down.*, ...), raw, in "
            "{'ema_model', 'net_model'} or in the DDIM repository's [model, optimizer, epoch, step, ema] list",
    "gms-official": "an official GMS checkpoint ({'ema_model': state_dict, 'net_model': ...}) or a raw state dict "
                    "of tensors",
    "gms-heads": f"a MomentNet heads file (format {HEADS_FORMAT!r}, written by MomentNet.save_heads)",
    "moment-net": f"a MomentNet file (format {NET_FORMAT!r}, written by MomentNet.save)",
}
ACCEPTED = ("gk.models.load reads network weights: a state dict of tensors (pytorch-ddpm, improved-diffusion or "
            "DDIM Model keys), a training checkpoint holding one under 'ema_model' / 'net_model', the DDIM "
            "repository's [model, optimizer, epoch, step, ema] list, a MomentNet file, or a diffusers model directory")


def is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def top_keys(data: Any) -> Any:
    return list(data)[:8] if isinstance(data, Mapping) else type(data).__name__


def known_kinds() -> str:
    return ", ".join(k for k in KINDS if k != "auto")


def article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def check_holds_weights(where: str, data: Any, kind: str) -> None:
    """Refuse a file without a single tensor (a step counter, settings, ...): no kind reads it. A file whose
    layout a loader knows (a format tag, an 'ema_model' / 'net_model' entry) is left to that loader, which
    names the entry that is wrong."""
    known = isinstance(data, Mapping) and any(k in data for k in ("format", "ema_model", "net_model"))
    if not known and not holds_tensors(data):
        raise no_weights_error(where, data, kind)


def no_weights_error(where: str, data: Any, kind: str) -> ValueError:
    """The error for a file that holds no tensors at all, for ``kind`` (or "auto")."""
    head = (f"cannot tell which network this file holds (top-level keys: {top_keys(data)})" if kind == "auto"
            else f"expected {EXPECTS.get(kind, 'network weights')}")
    return ValueError(f"{where}: {head}, but the file holds no tensors, so no network weights: it holds "
                      f"{describe_contents(data)}. {ACCEPTED}. Pass the file the weights were saved to (e.g. with "
                      "torch.save(model.state_dict(), path)), not one of training settings or counters")


def build_checked(cls: type, cfg: dict, state: Mapping[str, Any], where: str, kind: str,
                  inferred: dict | None, device: Any) -> nn.Module:
    """Build ``cls(**cfg)`` on the meta device, compare with ``state``, then materialise and load it."""
    unreadable = (f"the keys do not look like {article(kind)} {kind} {cls.__name__} state dict (first keys: "
                  f"{list(state)[:6]}): check the file and the kind (valid kinds: {known_kinds()}; leave kind out "
                  "to detect it)")
    try:
        model = meta_model(lambda: cls(**cfg))
    except (TypeError, ValueError) as e:
        if inferred is None and isinstance(e, TypeError):  # (a missing argument: the keys did not give the shape)
            raise ValueError(f"{where}: cannot build {format_call(cls.__name__, cfg)}: {unreadable}") from None
        hint = f" The weights look like {format_call(cls.__name__, inferred)}." if inferred else ""
        raise ValueError(f"{where}: cannot build {format_call(cls.__name__, cfg)}: {e}.{hint}") from None

    def suggest() -> str | None:
        if inferred is None:
            return unreadable
        try:
            ref = meta_model(lambda: cls(**{**cfg, **inferred}))
        except (TypeError, ValueError):
            return None
        missing, unexpected, shapes = mismatch_report(ref, state)
        if not (missing or unexpected or shapes):
            changed = {k: v for k, v in inferred.items() if cfg.get(k) != v}
            args = ", ".join(f"{k}={v!r}" for k, v in changed.items())
            return (f"the weights match {format_call(cls.__name__, {**cfg, **inferred})}: load with "
                    f"gk.models.load(path, kind={kind!r}, {args}) or leave these options out")
        return (f"the file resembles {format_call(cls.__name__, inferred)} but is incomplete or edited "
                "(keys missing, extra or reshaped): re-export it from the training code")

    check_state_dict(model, state, where, format_call(cls.__name__, cfg), suggest)
    return materialize(model, state, device).eval()


def set_schedule(model: nn.Module, schedule: Any) -> None:
    if schedule is not None:
        if not isinstance(schedule, Schedule):
            raise ValueError(f"schedule must be a gk.Schedule, got {type(schedule).__name__}")
        model.schedule = schedule


def warn_head_count(where: str, assumed: int) -> None:
    """Say, at the user's call of gk.models.load, that an improved-diffusion network's attention head count was
    assumed. Every IDDPMUNet has attention (the middle block's), and the weights cannot tell how
    it was split into heads, while the split changes the outputs."""
    warn_user(f"{where}: the attention head count of an improved-diffusion network cannot be read from its "
              f"weights (the split into heads changes no shape); num_heads={assumed} was assumed, as in "
              "improved-diffusion's training scripts. If the model was trained with another count, pass "
              "num_heads= (CLI: --load-option num_heads=N), e.g. num_heads=2")


def build_ddim(state: Mapping[str, Any], args: Mapping[str, Any], where: str, kind: str, device: Any) -> DDIMModel:
    """A DDIMModel for ``state``: widths, blocks and attention levels read from the weights, the image size
    from ``args`` (``resolution``, or ``attn_resolutions`` to derive it), the rest of ``args`` on top."""
    inferred = DDIMModel.infer_config(state)
    if inferred is not None:
        try:
            levels = inferred.pop("attn_levels")
            inferred.update(resolve_resolution(levels, args.get("resolution"), args.get("attn_resolutions")))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    cfg = {**(inferred or {}), **args}
    if "resolution" not in cfg:
        raise ValueError(f"{where}: pass resolution= (the image size; it is not stored in the weights; CLI: "
                         f"{RESOLUTION_FLAG})")
    return build_checked(DDIMModel, cfg, state, where, kind, inferred, device)
