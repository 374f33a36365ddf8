"""``gk.models.load``: one entry point for every checkpoint format this package reads (offline, safe).

Formats: pytorch-ddpm ``ckpt.pt`` ({net_model, ema_model, ...} or a raw state dict), improved-diffusion
raw state dicts (``.pt`` or ``.safetensors``), the DDIM repository's ``Model`` (raw state dicts, among them
the DDPM CIFAR10/CelebA/LSUN checkpoints), the official GMS code's eps/eps^2/eps^3 files (merged into
one network by :mod:`.official_gms`), diffusers UNet2DModel / UNet2DConditionModel directories (config.json +
diffusion_pytorch_model.safetensors / .bin, or a pipeline directory with a ``unet`` folder), and this
package's MomentNet heads / whole-network files. Every file is read with ``weights_only=True``.
"""
from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..core.schedule import Schedule
from ._common import (check_cuda_present, check_map_location, check_state_dict, describe_contents, format_call,
                      holds_tensors, materialize, meta_model, mismatch_message, mismatch_report, read_location,
                      read_weights_file, strip_prefix)
from .diffusers_conditional import DiffusersConditionalUNet
from .diffusers_unet import DiffusersUNet, scheduler_config_near
from .ddim_model import RESOLUTION_FLAG, DDIMModel, resolve_resolution
from .iddpm import IDDPMUNet
from .moment_net import HEADS_FORMAT, NET_FORMAT, MomentNet
from .pytorch_ddpm import PytorchDDPMUNet

KINDS = ("auto", "pytorch-ddpm", "improved-diffusion", "ddim", "gms-official", "diffusers", "gms-heads", "moment-net")
DIFFUSERS_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")

_DDIM_ARGS = ("ch", "out_ch", "ch_mult", "num_res_blocks", "attn_resolutions", "dropout", "resamp_with_conv",
              "in_channels", "resolution")
_DDPM_ARGS = ("T", "ch", "ch_mult", "attn", "num_res_blocks", "dropout", "in_channels")
_IDDPM_ARGS = ("in_channels", "model_channels", "out_channels", "num_res_blocks", "attention_resolutions", "dropout",
               "channel_mult", "conv_resample", "num_heads", "num_heads_upsample", "use_scale_shift_norm")
# improved-diffusion's training scripts use 4 heads; the weights cannot tell (the split does not change shapes)
_IDDPM_DEFAULTS = {"dropout": 0.0, "num_heads": 4, "num_heads_upsample": -1}

# What each kind reads (for the messages about a file that does not fit the kind given)
_EXPECTS = {
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
_ACCEPTED = ("gk.models.load reads network weights: a state dict of tensors (pytorch-ddpm, improved-diffusion or "
             "DDIM Model keys), a training checkpoint holding one under 'ema_model' / 'net_model', the DDIM "
             "repository's [model, optimizer, epoch, step, ema] list, a MomentNet file, or a diffusers model directory")
# Marker keys of each family's state dict (any one names the family)
_MARKERS = {"pytorch-ddpm": ("time_embedding.timembedding.0.weight", "downblocks.0.block1.0.weight"),
            "improved-diffusion": ("time_embed.0.weight", "input_blocks.0.0.weight"),
            "ddim": ("temb.dense.0.weight",)}


def load(path_or_dir: str | os.PathLike | Sequence[str | os.PathLike], kind: str = "auto", *,
         map_location: Any = "cpu", **config: Any) -> nn.Module:
    """Load a network as a gms_kernels model (eval mode), offline and with ``weights_only=True``.

    ``kind``: ``"auto"`` (detected from the content), ``"pytorch-ddpm"``, ``"improved-diffusion"``,
    ``"ddim"``, ``"gms-official"``, ``"diffusers"``, ``"gms-heads"`` or ``"moment-net"``. ``config`` by kind:

    - pytorch-ddpm: PytorchDDPMUNet arguments (T, ch, ch_mult, attn, num_res_blocks, dropout,
      in_channels; read from the weights when left out), ``use_ema=True`` (ema_model, else net_model),
      ``schedule``.
    - improved-diffusion: IDDPMUNet arguments (read from the weights when left out, except
      ``num_heads``, default 4 as in improved-diffusion's scripts, with a warning as the weights cannot
      tell it, and ``dropout``), ``eps_only=True`` (forward returns eps alone when sigma is learned),
      ``schedule``.
    - ddim: DDIMModel arguments (ch, out_ch, ch_mult, num_res_blocks, attn_resolutions, dropout,
      resamp_with_conv, in_channels, resolution; read from the weights except dropout and the image size:
      pass ``resolution`` or ``attn_resolutions``), ``use_ema=True``, ``schedule``. Reads raw state dicts,
      {ema_model, net_model} dicts and the DDIM repository's [model, optimizer, epoch, step, ema] lists.
    - gms-official: a list of files [eps, eps^2, eps^3] (or [eps, eps^2], or one file) written by the
      official GMS code, and the official constructor's arguments: see :func:`.official_gms.load_official`
      (``shared_backbone``, ``backbone_rtol``, ``use_ema``, ``schedule``, ``time_input``).
    - diffusers: ``subfolder``, ``variant``, ``eps_only`` (see DiffusersUNet), ``schedule`` (default: read
      from a pipeline's ``scheduler/scheduler_config.json`` when there is one). A UNet2DModel directory gives
      a DiffusersUNet (a class-conditional one takes ``class_labels=``), a UNet2DConditionModel directory a
      DiffusersConditionalUNet (``encoder_hidden_states=``); pass them with ``gk.sample(..., model_kwargs=)``.
    - gms-heads: ``backbone`` (a module or a path loaded with this function): returns a MomentNet.
    - moment-net: nothing.

    ``map_location``: where the model goes, as for ``torch.load`` (a device, or a dict / function that remaps
    the saved tensors: the model goes where they go); None means the CPU, and ``"meta"`` gives a model of
    shapes only (the file is still read and checked).

    A bad file (unreadable, missing/unexpected keys, wrong shapes, wrong config, no tensors at all, or the
    content of another kind than ``kind``) raises a ValueError that names the file, the keys and the shapes
    and suggests a fix.
    """
    check_map_location(map_location)
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    if kind == "gms-official" or isinstance(path_or_dir, (list, tuple)):
        if kind not in ("auto", "gms-official"):
            raise ValueError(f"a list of files is read by kind='gms-official' (official GMS [eps, eps^2, eps^3]), "
                             f"got kind={kind!r}")
        from .official_gms import load_official

        return load_official(path_or_dir, map_location=map_location, **config)
    path = os.fspath(path_or_dir)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    data = None
    if os.path.isdir(path) or _diffusers_parent(path):
        if kind not in ("auto", "diffusers"):
            raise ValueError(f"{path} is a directory; only kind='diffusers' (or 'auto') loads directories, "
                             f"got kind={kind!r}")
        return _placed(_load_diffusers(_diffusers_parent(path) or path, **config), path, map_location)
    if kind == "diffusers":
        raise ValueError(f"{path} is a file; kind='diffusers' needs the model directory (config.json + "
                         f"{' or '.join(DIFFUSERS_WEIGHTS)})")
    data = read_weights_file(path, read_location(map_location))
    check_holds_weights(path, data, kind)
    if kind == "auto":
        kind = _detect(path, data)
    else:
        _check_kind(path, data, kind)
    if kind == "pytorch-ddpm":
        return _load_pytorch_ddpm(path, data, map_location, **config)
    if kind == "improved-diffusion":
        return _load_iddpm(path, data, map_location, **config)
    if kind == "ddim":
        return _load_ddim(path, data, map_location, **config)
    if kind == "gms-official":
        from .official_gms import load_official

        return load_official([path], map_location=map_location, **config)
    if kind == "gms-heads":
        return _load_heads(path, data, map_location, **config)
    _no_options("moment-net", config, ())
    return MomentNet.load(path, data, map_location)


# -- detection ------------------------------------------------------------------------------------
def _diffusers_parent(path: str) -> str | None:
    """The model directory when ``path`` is a diffusers weights/config file inside one."""
    name, parent = os.path.basename(path), os.path.dirname(os.path.abspath(path))
    if os.path.isfile(path) and (name in DIFFUSERS_WEIGHTS or name == "config.json") \
            and os.path.isfile(os.path.join(parent, "config.json")):
        return parent
    return None


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def _marker(keys: Mapping[str, Any], families: tuple[str, ...]) -> tuple[str, str] | None:
    """(family, its marker key) of the first of ``families`` whose marker key is in ``keys``."""
    for family in families:
        for key in _MARKERS[family]:
            if key in keys:
                return family, key
    return None


def _guess(data: Any) -> tuple[str, str] | None:
    """(kind, the evidence) when the content names its kind (a format tag or a family's marker key), else None."""
    if isinstance(data, Mapping):
        fmt = data.get("format")
        if fmt == HEADS_FORMAT:
            return "gms-heads", f"format tag {fmt!r}"
        if fmt == NET_FORMAT:
            return "moment-net", f"format tag {fmt!r}"
        if "ema_model" in data or "net_model" in data:
            name = "ema_model" if "ema_model" in data else "net_model"
            keys = strip_prefix(data[name]) if _is_state_dict(data[name]) else {}
            found = _marker(keys, ("improved-diffusion", "ddim", "pytorch-ddpm"))
            if found is None:
                return None
            # (the official GMS main.py's format around an improved-diffusion UNet)
            kind = "gms-official" if found[0] == "improved-diffusion" else found[0]
            return kind, f"{name!r} holds a state dict with the key {found[1]!r}"
        if _is_state_dict(data):
            found = _marker(strip_prefix(data), ("pytorch-ddpm", "improved-diffusion", "ddim"))
            return (found[0], f"a state dict with the key {found[1]!r}") if found else None
    if isinstance(data, (list, tuple)) and data and _is_state_dict(data[0]) \
            and "temb.dense.0.weight" in strip_prefix(data[0]):
        return "ddim", "the DDIM repository's [model, optimizer, epoch, step, (ema)] list"
    return None


def _detect(path: str, data: Any) -> str:
    guess = _guess(data)
    if guess is not None:
        return guess[0]
    if isinstance(data, Mapping):
        if "ema_model" in data or "net_model" in data:
            return "pytorch-ddpm"
        if _is_state_dict(data):
            keys = strip_prefix(data)
            if "conv_in.weight" in keys and any(k.startswith("time_embedding.linear_1") for k in keys):
                raise ValueError(f"{path}: these are diffusers UNet2DModel weights; load the directory that holds "
                                 f"them with config.json: gk.models.load(<dir>)")
    if not holds_tensors(data):
        raise no_weights_error(path, data, "auto")
    raise ValueError(f"{path}: cannot tell which network this file holds (top-level keys: {_top(data)}). Pass kind= "
                     f"one of {_known_kinds()}")


def _top(data: Any) -> Any:
    return list(data)[:8] if isinstance(data, Mapping) else type(data).__name__


def _known_kinds() -> str:
    return ", ".join(k for k in KINDS if k != "auto")


def _article(word: str) -> str:
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
    head = (f"cannot tell which network this file holds (top-level keys: {_top(data)})" if kind == "auto"
            else f"expected {_EXPECTS.get(kind, 'network weights')}")
    return ValueError(f"{where}: {head}, but the file holds no tensors, so no network weights: it holds "
                      f"{describe_contents(data)}. {_ACCEPTED}. Pass the file the weights were saved to (e.g. with "
                      "torch.save(model.state_dict(), path)), not one of training settings or counters")


def _check_kind(path: str, data: Any, kind: str) -> None:
    """Refuse a file whose content names another kind than the one given (its loader would fail obscurely)."""
    guess = _guess(data)
    if guess is not None and guess[0] != kind and kind in _EXPECTS:
        found, why = guess
        raise ValueError(f"{path}: kind={kind!r} reads {_EXPECTS[kind]}, but this file looks like {_article(found)} "
                         f"{found} checkpoint ({why}). Pass kind={found!r}, or leave kind out to detect it (known "
                         f"kinds: {_known_kinds()})")


def _no_options(kind: str, given: Mapping[str, Any], valid: tuple[str, ...]) -> None:
    bad = [k for k in given if k not in valid]
    if bad:
        raise ValueError(f"unknown option(s) for kind {kind!r}: {', '.join(bad)}; valid: "
                         f"{', '.join(valid) if valid else 'none'}")


# -- our own UNets --------------------------------------------------------------------------------
def _build_checked(cls: type, cfg: dict, state: Mapping[str, Any], where: str, kind: str,
                   inferred: dict | None, device: Any) -> nn.Module:
    """Build ``cls(**cfg)`` on the meta device, compare with ``state``, then materialise and load it."""
    unreadable = (f"the keys do not look like {_article(kind)} {kind} {cls.__name__} state dict (first keys: "
                  f"{list(state)[:6]}): check the file and the kind (valid kinds: {_known_kinds()}; leave kind out "
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


def _split(config: dict, names: tuple[str, ...], extra: tuple[str, ...], kind: str) -> tuple[dict, dict]:
    _no_options(kind, config, names + extra)
    return ({k: v for k, v in config.items() if k in names}, {k: v for k, v in config.items() if k in extra})


def _set_schedule(model: nn.Module, schedule: Any) -> None:
    if schedule is not None:
        if not isinstance(schedule, Schedule):
            raise ValueError(f"schedule must be a gk.Schedule, got {type(schedule).__name__}")
        model.schedule = schedule


def _load_pytorch_ddpm(path: str, data: Any, device: Any, **config: Any) -> PytorchDDPMUNet:
    args, extra = _split(config, _DDPM_ARGS, ("use_ema", "schedule"), "pytorch-ddpm")
    where = path
    if isinstance(data, Mapping) and ("ema_model" in data or "net_model" in data):
        key = "ema_model" if extra.get("use_ema", True) else "net_model"
        if key not in data:
            other = "net_model" if key == "ema_model" else "ema_model"
            raise ValueError(f"{path}: the checkpoint has no {key!r} (found {list(data)[:8]}); "
                             f"pass use_ema={other == 'ema_model'} to load {other!r}")
        state, where = data[key], f"{path} [{key}]"
    else:
        state = data
    if not _is_state_dict(state):
        raise ValueError(f"{where}: expected a pytorch-ddpm checkpoint ({{'ema_model': state_dict, 'net_model': ...}}) "
                         f"or a raw state dict of tensors, found {type(state).__name__}")
    state = strip_prefix(state)
    inferred = PytorchDDPMUNet.infer_config(state)
    cfg = {**(inferred or {}), **args}
    model = _build_checked(PytorchDDPMUNet, cfg, state, where, "pytorch-ddpm", inferred, device)
    _set_schedule(model, extra.get("schedule"))
    return model


def _load_iddpm(path: str, data: Any, device: Any, **config: Any) -> IDDPMUNet:
    args, extra = _split(config, _IDDPM_ARGS, ("eps_only", "schedule"), "improved-diffusion")
    if not _is_state_dict(data):
        raise ValueError(f"{path}: expected an improved-diffusion raw state dict (tensors keyed time_embed.*, "
                         f"input_blocks.*, ...), found {type(data).__name__}")
    state = strip_prefix(data)
    inferred = IDDPMUNet.infer_config(state)
    cfg = {**_IDDPM_DEFAULTS, **(inferred or {}), **args}
    model = _build_checked(IDDPMUNet, cfg, state, path, "improved-diffusion", inferred, device)
    if "num_heads" not in args:
        warn_head_count(path, model.num_heads)
    model.eps_only = bool(extra.get("eps_only", True))
    _set_schedule(model, extra.get("schedule"))
    return model


def warn_head_count(where: str, assumed: int, stacklevel: int = 4) -> None:
    """Say that an improved-diffusion network's attention head count was assumed (``stacklevel``: the caller
    of gk.models.load). Every IDDPMUNet has attention (the middle block's), and the weights cannot tell how
    it was split into heads, while the split changes the outputs."""
    warnings.warn(f"{where}: the attention head count of an improved-diffusion network cannot be read from its "
                  f"weights (the split into heads changes no shape); num_heads={assumed} was assumed, as in "
                  "improved-diffusion's training scripts. If the model was trained with another count, pass "
                  "num_heads= (CLI: --load-option num_heads=N), e.g. num_heads=2", UserWarning, stacklevel=stacklevel)


def _load_ddim(path: str, data: Any, device: Any, **config: Any) -> DDIMModel:
    args, extra = _split(config, _DDIM_ARGS, ("use_ema", "schedule"), "ddim")
    from .official_gms import family_of, read_state, split_head

    state, where = read_state(path, data, use_ema=extra.get("use_ema", True), map_location=device)
    if family_of(state) == "ddim" and split_head(state, "ddim")[1]:
        raise ValueError(f"{where}: a DDIM Model with an official GMS head (before_out / norm_out2 / conv_out2): "
                         "load it with the eps network: gk.models.load([eps, eps2, eps3], kind='gms-official', ...)")
    model = build_ddim(state, args, where, "ddim", device)
    _set_schedule(model, extra.get("schedule"))
    return model


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
    return _build_checked(DDIMModel, cfg, state, where, kind, inferred, device)


def _load_heads(path: str, data: Any, device: Any, **config: Any) -> MomentNet:
    _no_options("gms-heads", config, ("backbone",))
    backbone = config.get("backbone")
    if backbone is None:
        raise ValueError(f"{path} holds MomentNet heads only; pass their backbone: "
                         "gk.models.load(path, backbone=<module or checkpoint path>)")
    if isinstance(backbone, (str, os.PathLike)):
        backbone = load(backbone, map_location=device)
    if isinstance(backbone, MomentNet):
        backbone = backbone.backbone
    return MomentNet.from_heads(backbone, path, data).to(device).eval()


# -- diffusers ------------------------------------------------------------------------------------
_SIZE_MISMATCH = re.compile(r"size mismatch for (\S+): copying a param with shape torch\.Size\((\[[^\]]*\])\) "
                            r"from checkpoint, the shape in current model is torch\.Size\((\[[^\]]*\])\)")


def _placed(model: nn.Module, path: str, map_location: Any) -> nn.Module:
    """A model that diffusers read onto the CPU, moved to ``map_location`` (a device; None: the CPU)."""
    if map_location is None:
        return model
    if not isinstance(map_location, (str, torch.device)):
        raise ValueError(f"{path}: diffusers reads the model onto the CPU and it is then moved, so map_location must "
                         f"be a device (or None), not a {type(map_location).__name__}")
    check_cuda_present(path, map_location)
    return model.to(torch.device(map_location))


def _load_diffusers(path: str, subfolder: str | None = None, variant: str | None = None, eps_only: bool | None = None,
                    schedule: Schedule | None = None) -> nn.Module:
    if subfolder is None and not os.path.isfile(os.path.join(path, "config.json")) \
            and os.path.isfile(os.path.join(path, "unet", "config.json")):
        subfolder = "unet"  # a pipeline directory
    model_dir = os.path.join(path, subfolder) if subfolder else path
    present = sorted(os.listdir(model_dir)) if os.path.isdir(model_dir) else []
    weights = [f for f in present if f.startswith("diffusion_pytorch_model") and f.endswith((".safetensors", ".bin"))]
    if "config.json" not in present or not weights:
        raise ValueError(f"{model_dir}: not a diffusers model directory: expected config.json and "
                         f"{' or '.join(DIFFUSERS_WEIGHTS)}, found {present[:12]}. For a pipeline, pass its folder "
                         "(the 'unet' subfolder is used) or subfolder=")
    try:
        cfg = json.loads(Path(model_dir, "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{model_dir}/config.json: cannot read it as JSON ({e}); restore the file") from None
    if isinstance(cfg, dict) and cfg.get("_class_name") == "GMSDiffusersModel":  # gk.models.export_diffusers
        from ..integrations.diffusers_export import load_exported

        return load_exported(model_dir, schedule=schedule, variant=variant, eps_only=eps_only)
    class_name = cfg.get("_class_name", "UNet2DModel") if isinstance(cfg, dict) else None
    if class_name not in ("UNet2DModel", "UNet2DConditionModel"):
        name = class_name if isinstance(cfg, dict) else type(cfg).__name__
        raise ValueError(f"{model_dir}/config.json describes {name!r}, not a UNet2DModel (class-conditional or "
                         "not), a UNet2DConditionModel or gk.models.export_diffusers' GMSDiffusersModel, the diffusers "
                         "models gms_kernels adapts")
    import diffusers

    try:
        unet, info = getattr(diffusers, class_name).from_pretrained(
            path, subfolder=subfolder, variant=variant, local_files_only=True, low_cpu_mem_usage=False,
            output_loading_info=True)
    except Exception as e:  # diffusers raises many types; report them uniformly
        text = str(e)
        shapes = _SIZE_MISMATCH.findall(text)
        if shapes:
            found = "; ".join(f"{k}: expected {m} (from config.json), found {c} (weights file)" for k, c, m in shapes[:8])
            raise ValueError(f"{model_dir}: config.json does not describe the weights: wrong shapes ({len(shapes)}): "
                             f"{found}. Fix: correct config.json (block_out_channels, layers_per_block, in/out_channels, "
                             "norm_num_groups, attention settings) to the one the weights were saved with") from None
        first = text.strip().splitlines()[0] if text.strip() else ""
        raise ValueError(f"{model_dir}: diffusers could not load the {class_name} ({type(e).__name__}: {first}). "
                         f"Check that config.json and {', '.join(weights)} are complete and belong together "
                         "(a truncated or corrupted weights file gives this too: download or save it again)") from None
    missing, unexpected = list(info.get("missing_keys", [])), list(info.get("unexpected_keys", []))
    mismatched = list(info.get("mismatched_keys", []))
    if missing or unexpected or mismatched:
        raise ValueError(mismatch_message(f"{model_dir}: the weights do not match config.json:", missing, unexpected,
                                          [(k, list(m), list(c)) for k, c, m in mismatched],
                                          "the weights file is incomplete or from another model: save it again "
                                          "with save_pretrained, or fix config.json"))
    if schedule is None:
        schedule = _diffusers_schedule(path, subfolder)
    variance_type = (scheduler_config_near(path, subfolder) or {}).get("variance_type")
    # (a class-conditional UNet2DModel stays a DiffusersUNet: it takes class_labels and carries heads)
    wrap = DiffusersUNet if class_name == "UNet2DModel" else DiffusersConditionalUNet
    return wrap(unet.eval(), schedule=schedule, eps_only=eps_only, variance_type=variance_type, source=path).eval()


def _diffusers_schedule(path: str, subfolder: str | None) -> Schedule | None:
    """The training schedule from a pipeline's scheduler config, when present and understood."""
    root = path if subfolder else os.path.dirname(os.path.abspath(path))
    candidates = [os.path.join(root, "scheduler", "scheduler_config.json"), os.path.join(path, "scheduler_config.json")]
    for file in candidates:
        if not os.path.isfile(file):
            continue
        try:
            cfg = json.loads(Path(file).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(cfg, dict):  # (valid JSON, but no config: ignored, as scheduler_config_near does)
            return None
        T = int(cfg.get("num_train_timesteps", 1000))
        kind = cfg.get("beta_schedule", "linear")
        start, end = float(cfg.get("beta_start", 1e-4)), float(cfg.get("beta_end", 0.02))
        if cfg.get("prediction_type", "epsilon") != "epsilon":
            warnings.warn(f"{file}: prediction_type={cfg.get('prediction_type')!r}; gms_kernels expects eps "
                          "predictions", stacklevel=4)  # (at the caller of gk.models.load)
        if cfg.get("trained_betas"):
            return Schedule.from_betas(cfg["trained_betas"])
        if kind == "linear":
            return Schedule.linear(T, start, end)
        if kind == "scaled_linear":
            return Schedule.from_betas(torch.linspace(start ** 0.5, end ** 0.5, T, dtype=torch.float64, device="cpu") ** 2)
        if kind == "squaredcos_cap_v2":
            return Schedule.cosine(T)
        return None
    return None
