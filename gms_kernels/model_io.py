"""Calling a noise network and reading its heads, with checks that name what went wrong."""
from __future__ import annotations

import inspect
import numbers
import sys
from typing import Any, Callable, Sequence

import torch

TIME_INPUTS = ("index", "index+1", "scaled")
HEAD_NAMES = ("e1 = E[eps]", "e2 = E[eps^2]", "e3 = E[eps^3]")


def all_finite(t: torch.Tensor) -> bool:
    """True when every element is finite. Fast path: a sum is finite only if every term is (an inf
    or NaN cannot cancel out); if the sum overflowed, the exact element-wise check decides."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def check_time_input(time_input: str) -> str:
    if time_input not in TIME_INPUTS:
        raise ValueError(f"unknown time_input {time_input!r}; valid: {', '.join(TIME_INPUTS)} "
                         "(integer t, t+1, or float t*1000/T)")
    return time_input


def time_values(t: torch.Tensor, T: int, time_input: str = "index") -> torch.Tensor:
    """The time argument a network expects for integer indices ``t``: long t or t+1, or float t*1000/T."""
    if time_input == "scaled":
        return t.to(torch.float32) * (1000.0 / T)
    return t.long() + (time_input == "index+1")


def time_indices(values: torch.Tensor, T: int, time_input: str = "index") -> torch.Tensor:
    """The inverse of :func:`time_values`: the (float64, possibly fractional) time indices of a network's time
    arguments ``values``."""
    values = values.to(torch.float64)
    if time_input == "scaled":
        return values * (T / 1000.0)
    return values - int(time_input == "index+1")


def time_tensor(t: int, batch: int, T: int, time_input: str = "index",
                device: torch.device | str = "cpu") -> torch.Tensor:
    """:func:`time_values` of one index for a whole batch."""
    return time_values(torch.full((batch,), int(t), dtype=torch.long, device=device), T, time_input)


def adapt_model(model: Any) -> Any:
    """A diffusers model passed as is, made a gms_kernels model: a ``UNet2DModel`` is wrapped in
    :class:`gms_kernels.models.DiffusersUNet` (reads ``.sample`` of its ``UNet2DOutput``; time input: the
    0-based index, as diffusers' pipelines pass it), a ``GMSDiffusersModel`` gives its gms_kernels
    network. Anything else is returned unchanged."""
    lib = sys.modules.get("diffusers")  # (never imports diffusers: a diffusers model means it is loaded)
    if lib is None or not isinstance(model, lib.ModelMixin):
        return model
    from .models.diffusers_unet import DiffusersUNet, is_diffusers_unet

    if is_diffusers_unet(model):
        return DiffusersUNet(model)
    if type(model).__name__ == "GMSDiffusersModel":
        return model.net
    raise TypeError(f"a diffusers {type(model).__name__} cannot be sampled directly: gms_kernels reads UNet2DModel "
                    "and gk.models.GMSDiffusersModel; wrap it so that forward(x_t, t) returns one tensor holding "
                    "the heads [e1, e2, e3] along dim 1")


def check_model_heads(model: Any, n_heads: int, solver: str) -> None:
    """Refuse, before sampling, a model that declares (``output_heads``) fewer heads than ``solver``
    reads, with the model's own advice (``heads_hint``) on how to add them."""
    have = getattr(model, "output_heads", None)
    if isinstance(have, int) and have < n_heads:
        hint = getattr(model, "heads_hint", "")
        raise ValueError(f"solver {solver!r} needs {n_heads} heads ({', '.join(HEAD_NAMES[:n_heads])}) but the model "
                         f"gives {have} ({', '.join(HEAD_NAMES[:have])})" + (f": {hint}" if hint else ""))


def check_model_signature(model: Any) -> None:
    """Refuse, before any work, a model that cannot be called as ``model(x_t, t)``."""
    if not callable(model):
        raise TypeError(f"model must be callable as model(x_t, t) -> heads, got {type(model).__name__}")
    try:
        signature = inspect.signature(model.forward if isinstance(model, torch.nn.Module) else model)
    except (TypeError, ValueError):  # (a builtin or C extension: nothing to check before the call)
        return
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise TypeError(f"the model is called as model(x_t, t) (x_t: [N, C, ...], t: [N] time values), but its "
                        f"signature {signature} cannot take that ({exc}): wrap it, e.g. lambda x_t, t: net(x_t, t)") from None


# words of torch's errors for an input of a shape or channel count the network does not take
_SHAPE_ERROR_WORDS = ("channels", "size", "shape", "dimension")


def call_model(model: Callable, x: torch.Tensor, t: int, T: int, time_input: str = "index") -> torch.Tensor:
    try:
        return model(x, time_tensor(t, x.shape[0], T, time_input, x.device))
    except RuntimeError as exc:  # e.g. "Input type (double) and bias type (float) should be the same"
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reason = dtype_mismatch(model, x.dtype)
        if reason is not None:
            raise ValueError(f"the model failed on its first call ({first_line}): {reason}") from exc
        if "out of memory" not in first_line and any(w in first_line for w in _SHAPE_ERROR_WORDS):
            raise ValueError(f"the model failed on x_t of shape {tuple(x.shape)} ({first_line}): give shape= (or "
                             "x_T) the channel count and image size the network was built for") from exc
        raise


def split_heads(output: torch.Tensor, x_t: torch.Tensor, n_heads: int, solver: str,
                where: str = "", check_finite: bool = True) -> list[torch.Tensor]:
    """The first ``n_heads`` heads [e1, e2, e3][:n_heads] of a concatenated model output (dim 1).

    ``check_finite=False`` leaves the NaN/inf check to the caller (:func:`gms_kernels.solvers.solver_step`
    makes it, inside the fused kernel where there is one)."""
    if not torch.is_tensor(output):
        raise TypeError(f"the model returned a {type(output).__name__}, expected one tensor holding the heads "
                        "[e1, e2, e3] concatenated along dim 1 (wrap the network so that forward returns that)")
    if not output.is_floating_point():  # (complex heads would lose their imaginary part on the float64 path)
        raise TypeError(f"the model output must be a real floating-point tensor, got {output.dtype}")
    if output.dim() < 2 or output.shape[0] != x_t.shape[0] or output.shape[2:] != x_t.shape[2:]:
        expected = f"[{x_t.shape[0]}, k*{x_t.shape[1]}" + "".join(f", {d}" for d in x_t.shape[2:]) + "]"
        raise ValueError(f"model output has shape {tuple(output.shape)}, expected {expected} "
                         "(the heads concatenated along dim 1)")
    c = x_t.shape[1]
    if output.shape[1] < n_heads * c:
        need = ", ".join(HEAD_NAMES[:n_heads])
        raise ValueError(f"solver {solver!r} needs {n_heads} head(s) ({need}), i.e. {n_heads * c} output "
                         f"channels for {c}-channel data, but the model gave {output.shape[1]}. "
                         "Concatenate the heads along dim 1 (see gk.models.MomentNet; `gms-kernels train-heads "
                         "--model CHECKPOINT` adds e2, e3 to an eps network) or pick a solver that needs fewer "
                         "heads (ddpm/ddim: 1, sn-ddpm: 2, gms: 3).")
    if output.shape[1] % c or output.shape[1] > len(HEAD_NAMES) * c:
        raise ValueError(f"model output has {output.shape[1]} channels for {c}-channel data; expected {c}, {2 * c} "
                         f"or {3 * c} (1 to 3 heads of {c} channels: {', '.join(HEAD_NAMES)})")
    heads = list(output.split(c, dim=1)[:n_heads])  # (views; one call for all heads)
    if check_finite and not all_finite(output[:, :n_heads * c]):
        check_inputs_finite(None, heads, where)
    return heads


def check_positive_ints(values: Sequence[object], name: str) -> tuple[int, ...]:
    """``values`` (a shape, or counts) as ints, refused unless every one is a positive integer."""
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in values):
        raise ValueError(f"{name} must hold positive integers, got {tuple(values)}")
    return tuple(int(v) for v in values)


def check_state_tensor(x: object, name: str = "x_t") -> torch.Tensor:
    """``x`` must be a floating-point tensor [N, C, ...] (a batch with a channel dimension)."""
    if not torch.is_tensor(x):
        raise TypeError(f"{name} must be a torch tensor [N, C, ...], got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"{name} must be [N, C, ...] (a batch with a channel dimension), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} must have at least one channel, got shape {tuple(x.shape)}")
    return x


def dtype_mismatch(model: object, dtype: torch.dtype) -> str | None:
    """Why a network whose parameters all have one other float dtype may fail on ``dtype`` inputs,
    or None (a model may well cast its input itself, so this only explains a failure)."""
    params = getattr(model, "parameters", None)
    if not callable(params):
        return None
    dtypes = {p.dtype for p in params() if p.is_floating_point()}
    if len(dtypes) != 1 or dtype in dtypes:
        return None
    (have,) = dtypes
    return (f"the samples are {dtype} but the model's parameters are {have}: convert the model "
            f"(model.to({dtype})) or sample in its dtype (dtype={have})")


def check_inputs_finite(x_t: torch.Tensor | None, heads: list[torch.Tensor], where: str = "",
                        x_name: str = "x_t", first_head: int = 0) -> None:
    """A ValueError naming the first of x_t and the heads [e1, e2, e3][first_head:] that has a NaN or inf."""
    if x_t is not None and not all_finite(x_t):
        raise ValueError(f"{x_name} {where}has non-finite values (NaN or inf)")
    for i in range(first_head, len(heads)):
        if not all_finite(heads[i]):
            raise nonfinite_output_error(where, i)


def nonfinite_output_error(where: str, head: int) -> ValueError:
    return ValueError(f"model output {where}has non-finite values (NaN or inf) in head {HEAD_NAMES[head]}; "
                      "check the network's weights, its dtype (fp16 overflow) and its time input")
