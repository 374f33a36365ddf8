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
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..core.extras import require
from ..core.schedule import Schedule, diffusers_schedule
from ..core.user_warnings import warn_user
from ._checkpoints import (DDIM_ARGS, EXPECTS, IDDPM_ARGS, IDDPM_DEFAULTS, KINDS, article, build_checked, build_ddim,
                           check_holds_weights, is_state_dict, known_kinds, no_weights_error, set_schedule, top_keys,
                           warn_head_count)
from ._common import (check_cuda_present, check_map_location, holds_tensors, mismatch_message, read_location,
                      read_weights_file, strip_prefix)
from .diffusers_conditional import DiffusersConditionalUNet
from .diffusers_unet import DiffusersUNet, scheduler_config_near
from .ddim_model import DDIMModel
from .iddpm import IDDPMUNet
from .moment_net import HEADS_FORMAT, NET_FORMAT, MomentNet
from .official_gms import family_of, load_official, read_state, split_head
from .pytorch_ddpm import PytorchDDPMUNet

DIFFUSERS_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")

_DDPM_ARGS = ("T", "ch", "ch_mult", "attn", "num_res_blocks", "dropout", "in_channels")
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
            keys = strip_prefix(data[name]) if is_state_dict(data[name]) else {}
            found = _marker(keys, ("improved-diffusion", "ddim", "pytorch-ddpm"))
            if found is None:
                return None
            # (the official GMS main.py's format around an improved-diffusion UNet)
            kind = "gms-official" if found[0] == "improved-diffusion" else found[0]
            return kind, f"{name!r} holds a state dict with the key {found[1]!r}"
        if is_state_dict(data):
            found = _marker(strip_prefix(data), ("pytorch-ddpm", "improved-diffusion", "ddim"))
            return (found[0], f"a state dict with the key {found[1]!r}") if found else None
    if isinstance(data, (list, tuple)) and data and is_state_dict(data[0]) \
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
        if is_state_dict(data):
            keys = strip_prefix(data)
            if "conv_in.weight" in keys and any(k.startswith("time_embedding.linear_1") for k in keys):
                raise ValueError(f"{path}: these are diffusers UNet2DModel weights; load the directory that holds "
                                 f"them with config.json: gk.models.load(<dir>)")
    if not holds_tensors(data):
        raise no_weights_error(path, data, "auto")
    raise ValueError(f"{path}: cannot tell which network this file holds (top-level keys: {top_keys(data)}). "
                     f"Pass kind= one of {known_kinds()}")


def _check_kind(path: str, data: Any, kind: str) -> None:
    """Refuse a file whose content names another kind than the one given (its loader would fail obscurely)."""
    guess = _guess(data)
    if guess is not None and guess[0] != kind and kind in EXPECTS:
        found, why = guess
        raise ValueError(f"{path}: kind={kind!r} reads {EXPECTS[kind]}, but this file looks like {article(found)} "
                         f"{found} checkpoint ({why}). Pass kind={found!r}, or leave kind out to detect it (known "
                         f"kinds: {known_kinds()})")


def _no_options(kind: str, given: Mapping[str, Any], valid: tuple[str, ...]) -> None:
    bad = [k for k in given if k not in valid]
    if bad:
        raise ValueError(f"unknown option(s) for kind {kind!r}: {', '.join(bad)}; valid: "
                         f"{', '.join(valid) if valid else 'none'}")


# -- our own UNets --------------------------------------------------------------------------------
def _split(config: dict, names: tuple[str, ...], extra: tuple[str, ...], kind: str) -> tuple[dict, dict]:
    _no_options(kind, config, names + extra)
    return ({k: v for k, v in config.items() if k in names}, {k: v for k, v in config.items() if k in extra})


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
    if not is_state_dict(state):
        raise ValueError(f"{where}: expected a pytorch-ddpm checkpoint ({{'ema_model': state_dict, 'net_model': ...}}) "
                         f"or a raw state dict of tensors, found {type(state).__name__}")
    state = strip_prefix(state)
    inferred = PytorchDDPMUNet.infer_config(state)
    cfg = {**(inferred or {}), **args}
    model = build_checked(PytorchDDPMUNet, cfg, state, where, "pytorch-ddpm", inferred, device)
    set_schedule(model, extra.get("schedule"))
    return model


def _load_iddpm(path: str, data: Any, device: Any, **config: Any) -> IDDPMUNet:
    args, extra = _split(config, IDDPM_ARGS, ("eps_only", "schedule"), "improved-diffusion")
    if not is_state_dict(data):
        raise ValueError(f"{path}: expected an improved-diffusion raw state dict (tensors keyed time_embed.*, "
                         f"input_blocks.*, ...), found {type(data).__name__}")
    state = strip_prefix(data)
    inferred = IDDPMUNet.infer_config(state)
    cfg = {**IDDPM_DEFAULTS, **(inferred or {}), **args}
    model = build_checked(IDDPMUNet, cfg, state, path, "improved-diffusion", inferred, device)
    if "num_heads" not in args:
        warn_head_count(path, model.num_heads)
    model.eps_only = bool(extra.get("eps_only", True))
    set_schedule(model, extra.get("schedule"))
    return model


def _load_ddim(path: str, data: Any, device: Any, **config: Any) -> DDIMModel:
    args, extra = _split(config, DDIM_ARGS, ("use_ema", "schedule"), "ddim")
    state, where = read_state(path, data, use_ema=extra.get("use_ema", True), map_location=device)
    if family_of(state) == "ddim" and split_head(state, "ddim")[1]:
        raise ValueError(f"{where}: a DDIM Model with an official GMS head (before_out / norm_out2 / conv_out2): "
                         "load it with the eps network: gk.models.load([eps, eps2, eps3], kind='gms-official', ...)")
    model = build_ddim(state, args, where, "ddim", device)
    set_schedule(model, extra.get("schedule"))
    return model


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
        from .diffusers_export import load_exported

        return load_exported(model_dir, schedule=schedule, variant=variant, eps_only=eps_only)
    class_name = cfg.get("_class_name", "UNet2DModel") if isinstance(cfg, dict) else None
    if class_name not in ("UNet2DModel", "UNet2DConditionModel"):
        name = class_name if isinstance(cfg, dict) else type(cfg).__name__
        raise ValueError(f"{model_dir}/config.json describes {name!r}, not a UNet2DModel (class-conditional or "
                         "not), a UNet2DConditionModel or gk.models.export_diffusers' GMSDiffusersModel, the diffusers "
                         "models gms_kernels adapts")
    diffusers = require("diffusers", "loading a diffusers checkpoint")

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
    """The training schedule from a pipeline's scheduler config (:func:`scheduler_config_near`), when present and
    understood (:func:`~gms_kernels.core.schedule.diffusers_schedule`); else None."""
    cfg = scheduler_config_near(path, subfolder)
    if cfg is None:
        return None
    if cfg.get("prediction_type", "epsilon") != "epsilon":
        warn_user(f"{path}: the scheduler config has prediction_type={cfg.get('prediction_type')!r}; "
                  "gms_kernels expects eps predictions")
    try:
        return diffusers_schedule(cfg)
    except (TypeError, ValueError):
        return None
