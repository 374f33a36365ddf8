"""Pieces shared by the network families: float32 GroupNorm, attention, sinusoids, checkpoint I/O.

Everything that reads a file goes through :func:`read_torch_file` / :func:`read_weights_file`
(offline, ``weights_only=True``) and every state dict is compared with the model by
:func:`check_state_dict` before it is loaded, so a bad file gives one ValueError that names the file,
the keys and the shapes instead of a stack trace from deep inside torch.
"""
from __future__ import annotations

import os
import pickle
import re
import warnings
import zipfile
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ..core.extras import require

PathLike = str | os.PathLike


# -- layers -------------------------------------------------------------------------------------
def group_count(channels: int, max_groups: int = 32) -> int:
    """The largest number of groups <= ``max_groups`` that divides ``channels``."""
    for g in range(min(max_groups, channels), 0, -1):
        if channels % g == 0:
            return g
    return 1


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 when it is a 16-bit float, unchanged otherwise (float64 stays float64)."""
    return x.float() if x.is_floating_point() and x.element_size() < 4 else x


class GroupNorm32(nn.GroupNorm):
    """GroupNorm whose statistics are computed in (at least) float32 whatever the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = at_least_float32(x)
        w = None if self.weight is None else self.weight.to(y.dtype)
        b = None if self.bias is None else self.bias.to(y.dtype)
        return F.group_norm(y, self.num_groups, w, b, self.eps).to(x.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Dot-product attention over positions for channel-first tensors [B, C, L] -> [B, C, L].

    Each query position i gets sum_j softmax_j(<q_i, k_j> / sqrt(C)) v_j; the softmax runs in (at
    least) float32.
    """
    c = q.shape[1]
    logits = torch.einsum("bci,bcj->bij", q, k) * (c ** -0.5)
    weights = torch.softmax(at_least_float32(logits), dim=-1).to(v.dtype)
    return torch.einsum("bij,bcj->bci", weights, v)


# -- checkpoint files ---------------------------------------------------------------------------
def _name(path: PathLike) -> str:
    return os.fspath(path)


def read_torch_file(path: PathLike, map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)`` with the failure modes turned into ValueErrors."""
    path = _name(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory, expected a checkpoint file")
    size = os.path.getsize(path)
    try:
        with warnings.catch_warnings():  # (torch's note on a plain pickle's protocol: the error below says more)
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        refused = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", str(e))
        # an opcode the weights-only unpickler does not know: bytes that are no torch checkpoint (or a pickle
        # written by pickle.dump), not an object it refused; never advise weights_only=False for those
        not_a_checkpoint = "Unsupported operand" in str(e)
        if refused or ("Weights only load failed" in str(e) and not not_a_checkpoint):
            what = f"a Python object ({refused.group(1)})" if refused else "something other than plain data"
            raise ValueError(
                f"{path}: the checkpoint holds {what} that torch.load(weights_only=True) refuses to load; only "
                "tensors, numbers, strings and containers of them are read. If you trust the file, load it once "
                "with weights_only=False and re-save just the state dict (torch.save(model.state_dict(), path)).") from None
        plain_pickle = not_a_checkpoint and _first_bytes(path, 1) == b"\x80"  # (a pickle's PROTO opcode)
        raise _unreadable(path, size, e, "it looks like a plain pickle (pickle.dump), which torch.load(weights_only=True) "
                          "does not read: save it with torch.save" if plain_pickle else None) from None
    except RuntimeError as e:
        if "on a CUDA device but torch.cuda.is_available() is False" in str(e):
            raise _no_cuda(path, map_location) from None
        raise _unreadable(path, size, e) from None
    except Exception as e:  # truncated zip, garbage bytes, EOF, ...
        raise _unreadable(path, size, e) from None


def _no_cuda(path: str, map_location: Any) -> ValueError:
    return ValueError(f"{path}: map_location={map_location!r} asks for a CUDA device, but this machine has none "
                      "(torch.cuda.is_available() is False): pass map_location='cpu'")


def check_cuda_present(path: str, map_location: Any) -> None:
    """Refuse, naming ``path``, a map_location device on CUDA where this machine has none (readers and movers
    that torch would otherwise fail with a message that calls the file corrupted or names no file)."""
    if map_location is not None and str(map_location).split(":")[0] == "cuda" and not torch.cuda.is_available():
        raise _no_cuda(path, map_location)


def _unreadable(path: str, size: int, e: Exception, hint: str | None = None) -> ValueError:
    text = str(e)
    inner = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    text = inner.group(1) if inner else text
    first = text.strip().split(". ")[0].splitlines()[0][:200] if text.strip() else ""
    detail = f"{type(e).__name__}: {first}" if first else type(e).__name__
    if size == 0:
        hint = "it is empty"
    elif hint is None:
        truncated = _starts_like_zip(path) and not zipfile.is_zipfile(path)
        hint = ("it looks truncated (an incomplete download or an interrupted save)" if truncated
                else "it is truncated, corrupted or not a torch checkpoint")
    return ValueError(f"{path}: cannot read this file as a torch checkpoint ({size} bytes; {detail}): {hint}. "
                      "Download or save it again (torch.save), or pass the right file.")


def _first_bytes(path: str, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _starts_like_zip(path: str) -> bool:
    return _first_bytes(path, 4) == b"PK\x03\x04"


def check_map_location(map_location: Any) -> None:
    """A map_location string that names no device (e.g. "gpu") is refused here, before a file is read: torch
    would report it as an unreadable checkpoint or with its own device-string error."""
    if isinstance(map_location, str):
        try:
            torch.device(map_location)
        except RuntimeError:
            raise ValueError(f"map_location={map_location!r} is not a device: use e.g. 'cpu', 'cuda', 'cuda:1' "
                             "or 'meta'") from None


def read_location(map_location: Any) -> Any:
    """Where a loader reads a checkpoint for ``map_location``: the CPU in place of the meta device (a
    schedule stored beside the weights needs its values; the weights go to meta afterwards, when the
    model is materialised there) and in place of None (the loaders' None is the CPU, not torch.load's
    "where each tensor was saved"), ``map_location`` itself otherwise."""
    if map_location is None:
        return "cpu"
    # (a string that names no device was refused by check_map_location)
    if isinstance(map_location, (str, torch.device)) and torch.device(map_location).type == "meta":
        return "cpu"
    return map_location


def read_weights_file(path: PathLike, map_location: Any = "cpu") -> Any:
    """A ``.safetensors`` file (as a dict of tensors) or a torch file, read offline and safely."""
    path = _name(path)
    if path.endswith(".safetensors"):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file")
        load_file = require("safetensors.torch", f"{path}: reading .safetensors").load_file
        device = str(map_location) if map_location is not None else "cpu"
        check_cuda_present(path, map_location)  # (else "corrupted", below)
        try:
            if device == "meta":  # (safetensors cannot load onto meta; torch.load can, and the loaders use it)
                return {name: t.to("meta") for name, t in load_file(path, device="cpu").items()}
            return load_file(path, device=device)
        except Exception as e:
            raise _unreadable(path, os.path.getsize(path), e) from None
    return read_torch_file(path, map_location)


def strip_prefix(state: Mapping[str, Any], prefix: str = "module.") -> dict:
    """Drop a DataParallel/DDP ``module.`` prefix when every key carries it."""
    state = dict(state)
    if state and all(isinstance(k, str) and k.startswith(prefix) for k in state):
        return {k[len(prefix):]: v for k, v in state.items()}
    return state


def holds_tensors(data: Any) -> bool:
    """Whether ``data`` holds a tensor anywhere (in nested dicts, lists and tuples)."""
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, Mapping):
        return any(holds_tensors(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return any(holds_tensors(v) for v in data)
    return False


def _kind_of(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor{list(x.shape)}"
    if isinstance(x, (Mapping, list, tuple)):
        return f"{type(x).__name__} of {len(x)}"
    return type(x).__name__


def describe_contents(data: Any, limit: int = 8) -> str:
    """What a loaded file holds, for messages: its keys (or entries) and their types."""
    if isinstance(data, Mapping):
        if not data:
            return "an empty dict"
        shown = ", ".join(f"{k!r}: {_kind_of(v)}" for k, v in list(data.items())[:limit])
        more = f", ... ({len(data) - limit} more)" if len(data) > limit else ""
        return f"a dict {{{shown}{more}}}"
    if isinstance(data, (list, tuple)):
        shown = ", ".join(_kind_of(v) for v in list(data)[:limit])
        more = f", ... ({len(data) - limit} more)" if len(data) > limit else ""
        name = type(data).__name__
        return f"a {name} of {len(data)} entries ({shown}{more})" if data else f"an empty {name}"
    if data is None:
        return "None"
    name = _kind_of(data)
    value = f" ({repr(data)[:60]})" if isinstance(data, (int, float, str)) else ""
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}{value}"


def _shape(x: Any) -> str:
    return str(list(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def _list(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def mismatch_report(model: nn.Module, state: Mapping[str, Any]) -> tuple[list, list, list]:
    """(missing keys, unexpected keys, [(key, expected shape, found shape)]) of state vs model."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [(k, _shape(expected[k]), _shape(state[k])) for k in expected
              if k in state and (not isinstance(state[k], torch.Tensor) or state[k].shape != expected[k].shape)]
    return missing, unexpected, shapes


def check_state_dict(model: nn.Module, state: Mapping[str, Any], source: str, described: str,
                     suggest: Callable[[], str | None] | None = None) -> None:
    """Raise one ValueError listing every missing/unexpected key and wrong shape of ``state``.

    ``source`` names the file, ``described`` the model it was compared with (e.g. its constructor
    call) and ``suggest`` (called only on failure) may return a hint such as the matching config.
    """
    missing, unexpected, shapes = mismatch_report(model, state)
    if not (missing or unexpected or shapes):
        return
    hint = suggest() if suggest is not None else None
    raise ValueError(mismatch_message(f"{source}: the weights do not match {described}:", missing, unexpected,
                                      shapes, hint or "the file is incomplete, edited, or from a different "
                                      "network: check the file and the kind (gk.models.load(..., kind=...))"))


def mismatch_message(head: str, missing: list, unexpected: list, shapes: list, fix: str) -> str:
    """The text of a key/shape mismatch: ``shapes`` holds (key, expected shape, found shape)."""
    lines = [head]
    if missing:
        lines.append(f"  missing keys ({len(missing)}): {_list(missing)}")
    if unexpected:
        lines.append(f"  unexpected keys ({len(unexpected)}): {_list(unexpected)}")
    if shapes:
        shown = "; ".join(f"{k}: expected {e}, found {f}" for k, e, f in shapes[:8])
        more = f"; ... ({len(shapes) - 8} more)" if len(shapes) > 8 else ""
        lines.append(f"  wrong shapes ({len(shapes)}): {shown}{more}")
    lines.append("  fix: " + fix)
    return "\n".join(lines)


def format_call(name: str, config: Mapping[str, Any]) -> str:
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in config.items()) + ")"


def meta_model(factory: Callable[[], nn.Module]) -> nn.Module:
    """Build a model on the meta device (shapes only, no memory, no initialisation cost)."""
    with torch.device("meta"):
        return factory()


def materialize(model: nn.Module, state: Mapping[str, torch.Tensor], device: Any = "cpu") -> nn.Module:
    """Give a meta-device model real storage on ``device`` and fill every parameter/buffer from ``state``.
    ``device`` is a map_location: None means the CPU, and a torch.load remapping (a dict or a function)
    places the model where it put the state's tensors."""
    if device is None:
        device = "cpu"
    elif not isinstance(device, (str, torch.device, int)):
        device = next((t.device for t in state.values() if isinstance(t, torch.Tensor)), torch.device("cpu"))
    model = model.to_empty(device=device)
    if torch.device(device).type == "meta":  # (shapes only: a state read onto the CPU is checked, not copied)
        state = {name: t.to("meta") if isinstance(t, torch.Tensor) else t for name, t in state.items()}
    model.load_state_dict(state, strict=True)
    return model
