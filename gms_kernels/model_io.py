"""Calling a noise network and reading its heads, with checks that name what went wrong."""
from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from .core.moments import central_moments, raw_moments

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


# Adapters of other libraries' models, installed by the package (gms_kernels.models adapts diffusers' models):
# this module, below the networks, names none of them
_adapters: list[Callable[[Any], Any]] = []


def register_adapter(adapter: Callable[[Any], Any]) -> None:
    """Add ``adapter`` to those :func:`adapt_model` tries, in order: it returns the gms_kernels model for a model
    it knows how to call, else None."""
    if adapter not in _adapters:
        _adapters.append(adapter)


def adapt_model(model: Any) -> Any:
    """``model`` as a gms_kernels model (``model(x_t, t)`` returns the heads): what the first registered adapter
    that knows it makes of it (the package registers :func:`gms_kernels.models.diffusers_unet.adapt_diffusers`,
    which wraps diffusers' UNet2DModel and UNet2DConditionModel); anything else is returned unchanged."""
    for adapter in _adapters:
        adapted = adapter(model)
        if adapted is not None:
            return adapted
    return model


def learned_variance_note(channels: int, variance_type: str | None = None) -> str:
    """Why the channels after eps of a [eps, ...] output of 2C channels are not read as E[eps^2]."""
    what = (f"a learned variance (variance_type={variance_type!r})" if variance_type else
            "(out_channels = 2 * in_channels) what diffusers' DDPM layout takes for a learned variance")
    return f"it predicts eps and, in its other {channels} channels, {what}, which gms_kernels never reads as E[eps^2]"


def add_heads_hint(source: str | None) -> str:
    """How to give an eps network the heads GMS and SN-DDPM read (``source``: its checkpoint, if known)."""
    where = source or "DIR"
    return (f"Add the E[eps^2], E[eps^3] heads on its frozen backbone with `gms-kernels train-heads --model "
            f"{where}` (--orders 2 for sn-ddpm alone; Python: gk.train_heads(gk.models.MomentNet(model), data)), "
            "then sample the saved network; or use solver ddpm, ddpm-large or ddim, which read eps alone")


def check_model_heads(model: Any, n_heads: int, solver: str) -> None:
    """Refuse, before sampling, a model that declares (``output_heads``) fewer heads than ``solver``
    reads, with the model's own advice (``heads_hint``) on how to add them."""
    have = getattr(model, "output_heads", None)
    if isinstance(have, int) and have < n_heads:
        hint = getattr(model, "heads_hint", "")
        raise ValueError(f"solver {solver!r} needs {n_heads} heads ({', '.join(HEAD_NAMES[:n_heads])}) but the model "
                         f"gives {have} ({', '.join(HEAD_NAMES[:have])})" + (f": {hint}" if hint else ""))


def check_model_signature(model: Any, kwarg_names: Sequence[str] = ()) -> None:
    """Refuse, before any work, a model that cannot be called as ``model(x_t, t, **model_kwargs)``
    (``kwarg_names``: the keys of model_kwargs)."""
    if not callable(model):
        raise TypeError(f"model must be callable as model(x_t, t) -> heads, got {type(model).__name__}")
    try:
        signature = inspect.signature(model.forward if isinstance(model, torch.nn.Module) else model)
    except (TypeError, ValueError):  # (a builtin or C extension: nothing to check before the call)
        return
    try:
        (signature.bind_partial if kwarg_names else signature.bind)(None, None)  # (model_kwargs may fill the rest)
    except TypeError as exc:
        raise TypeError(f"the model is called as model(x_t, t) (x_t: [N, C, ...], t: [N] time values), but its "
                        f"signature {signature} cannot take that ({exc}): wrap it, e.g. lambda x_t, t: net(x_t, t)") from None
    if kwarg_names:
        try:
            signature.bind(None, None, **dict.fromkeys(kwarg_names))
        except TypeError as exc:
            names = ", ".join(map(repr, kwarg_names))
            raise TypeError(f"model_kwargs: the model is called as model(x_t, t, **model_kwargs) with {names}, but "
                            f"its signature {signature} cannot take that ({exc}): pass only the keyword arguments "
                            "the network takes, or wrap it") from None


# words of torch's errors for an input of a shape or channel count the network does not take
_SHAPE_ERROR_WORDS = ("channels", "size", "shape", "dimension")


def call_model(model: Callable, x: torch.Tensor, t: int | torch.Tensor, T: int, time_input: str = "index",
               conditioning: Conditioning | None = None) -> torch.Tensor:
    """The model's output on x at time index ``t`` (one int, or a long tensor [N] of one per sample), called
    with ``conditioning``'s keyword arguments and guidance where given."""
    if torch.is_tensor(t):
        times = time_values(t.to(x.device), T, time_input)
    else:
        times = time_tensor(t, x.shape[0], T, time_input, x.device)
    try:
        return model(x, times) if conditioning is None else conditioning(model, x, times)
    except RuntimeError as exc:  # e.g. "Input type (double) and bias type (float) should be the same"
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reason = dtype_mismatch(model, x.dtype)
        if reason is not None:
            raise ValueError(f"the model failed on its first call ({first_line}): {reason}") from exc
        if "out of memory" not in first_line and any(w in first_line for w in _SHAPE_ERROR_WORDS):
            also = "" if conditioning is None else " (and model_kwargs / null_kwargs the shapes it takes)"
            raise ValueError(f"the model failed on x_t of shape {tuple(x.shape)} ({first_line}): give shape= (or "
                             f"x_T) the channel count and image size the network was built for{also}") from exc
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
                        x_name: str = "x_t") -> None:
    """A ValueError naming the first of x_t and the heads [e1, e2, e3] that has a NaN or inf."""
    if x_t is not None and not all_finite(x_t):
        raise ValueError(f"{x_name} {where}has non-finite values (NaN or inf)")
    for i, h in enumerate(heads):
        if not all_finite(h):
            raise nonfinite_output_error(where, i)


def nonfinite_output_error(where: str, head: int) -> ValueError:
    return ValueError(f"model output {where}has non-finite values (NaN or inf) in head {HEAD_NAMES[head]}; "
                      "check the network's weights, its dtype (fp16 overflow) and its time input")


# --- conditional networks: keyword arguments per sample, classifier-free guidance ---------------------------------


def guided_heads(cond: torch.Tensor, uncond: torch.Tensor, w: float, n_heads: int) -> torch.Tensor:
    """Classifier-free guided heads from the conditional and the unconditional branch's outputs ``cond``,
    ``uncond`` ([N, n_heads*C, ...]: the heads [e1, e2, e3][:n_heads] concatenated along dim 1); same layout,
    in cond's dtype (computed in float64).

    The mean is guided as usual: e1 = e1_u + w (e1_c - e1_u). The central moments c2 = e2 - e1^2 and
    c3 = e3 - 3 e1 e2 + 2 e1^3 are the conditional branch's, for every w, and the raw heads are rebuilt around
    the guided mean: e2 = c2 + e1^2, e3 = c3 + 3 e1 c2 + e1^3. So only the mean is extrapolated: w = 1 is the
    conditional model exactly, and w = 0 the unconditional model's mean with the conditional model's spread
    (not the unconditional model). Why not guide the spread as well: c2_u + w (c2_c - c2_u) turns negative
    for large w wherever the unconditional posterior is the wider one (the usual case), which no Gaussian
    mixture can fit, while the conditional branch's c2 >= 0 holds for every w; and the guided mean has no
    posterior of its own whose spread could be taken instead. The unconditional branch's e2, e3 are not read.
    """
    dtype = cond.dtype
    c = [h.to(torch.float64) for h in cond.tensor_split(n_heads, dim=1)]
    e1_u = uncond[:, :c[0].shape[1]].to(torch.float64)
    e1 = e1_u + w * (c[0] - e1_u)
    if n_heads == 1:
        return e1.to(dtype)
    c2, c3 = central_moments(c[0], c[1], c[2] if n_heads > 2 else None)
    return torch.cat([e1, *(h for h in raw_moments(e1, c2, c3) if h is not None)], dim=1).to(dtype)


def _per_sample(value: torch.Tensor, batch: int) -> bool:
    """Whether a keyword argument's tensor holds one row per sample (its first dimension is the batch)."""
    return value.dim() > 0 and value.shape[0] == batch


def batch_rows(kwargs: dict[str, Any], index: slice | torch.Tensor, batch: int) -> dict[str, Any]:
    """The keyword arguments of the samples ``index`` (a slice, or a long tensor of rows) of a batch of
    ``batch`` samples: tensors whose first dimension is ``batch`` are indexed (nested dicts too, e.g.
    diffusers' ``added_cond_kwargs``), everything else is shared by all samples and kept as it is."""
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, dict):
            out[key] = batch_rows(value, index, batch)
        elif torch.is_tensor(value) and _per_sample(value, batch):
            out[key] = value[index if isinstance(index, slice) else index.to(value.device)]
        else:
            out[key] = value
    return out


def _rows_for(value: torch.Tensor, n: int) -> torch.Tensor:
    """A keyword argument's tensor as n rows: a 0-dim one or a single row repeated (views, no copy)."""
    if value.dim() == 0:
        return value.expand(n)
    return value if value.shape[0] == n else value.expand(n, *value.shape[1:])


def _both_branches(cond: Any, null: Any, n: int) -> Any:
    """One keyword argument of the batched guided call: the conditional rows, then the unconditional ones."""
    if isinstance(cond, dict):
        return {k: _both_branches(cond[k], null[k], n) for k in cond}
    if torch.is_tensor(cond):
        return torch.cat([_rows_for(cond, n), _rows_for(null, n)])
    return cond  # (the same in both branches: checked when the conditioning was made)


@dataclass(frozen=True)
class Conditioning:
    """How a conditional network is called: ``model(x_t, t, **kwargs)``, the tensors whose first dimension is
    ``batch`` following the samples (:meth:`rows`). With ``null`` (the unconditional branch's arguments: kwargs
    overridden by null_kwargs) and ``scale`` != 1, classifier-free guidance: one call on both branches (x
    doubled, the arguments concatenated along dim 0) and :func:`guided_heads` of its ``heads`` first heads."""

    kwargs: dict[str, Any]
    batch: int
    null: dict[str, Any] | None = None
    scale: float = 1.0
    heads: int = 3

    @property
    def guided(self) -> bool:
        """Whether the unconditional branch is called (w = 1 is the conditional model: one call, no mixing)."""
        return self.null is not None and self.scale != 1.0

    def rows(self, index: slice | torch.Tensor) -> Conditioning:
        """The conditioning of the samples ``index`` of the batch (a sampler that steps samples apart, GGF)."""
        n = len(range(*index.indices(self.batch))) if isinstance(index, slice) else int(index.numel())
        null = None if self.null is None else batch_rows(self.null, index, self.batch)
        return replace(self, kwargs=batch_rows(self.kwargs, index, self.batch), null=null, batch=n)

    def __call__(self, model: Callable, x: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        if not self.guided:
            return model(x, times, **self.kwargs)
        n = x.shape[0]
        both = {k: _both_branches(v, self.null[k], n) for k, v in self.kwargs.items()}
        out = model(torch.cat([x, x]), torch.cat([times, times]), **both)
        if not torch.is_tensor(out):
            return out  # (split_heads names what the model returned)
        if out.dim() < 2 or out.shape[0] != 2 * n or out.shape[2:] != x.shape[2:]:
            raise ValueError(f"with guidance_scale the model is called once on both branches, x_t of "
                             f"{2 * n} rows (the conditional ones, then the unconditional ones), and must return "
                             f"[{2 * n}, k*{x.shape[1]}, ...]; it returned shape {tuple(out.shape)}")
        c = x.shape[1]
        k = min(self.heads, out.shape[1] // c)
        if k == 0 or out.shape[1] % c:
            return out[:n]  # (a channel count split_heads refuses, naming it)
        return guided_heads(out[:n, :k * c], out[n:, :k * c], self.scale, k)


def _check_kwargs(value: object, name: str, batch: int | None, what: str) -> dict[str, Any]:
    """A dict of keyword arguments, its tensors checked against ``batch`` samples (``what`` names them)."""
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict of the network's keyword arguments (e.g. {{'class_labels': y}}), "
                        f"got {type(value).__name__}")
    for key, v in value.items():
        if not isinstance(key, str):
            raise TypeError(f"{name} must have string keys (the network's argument names), got {key!r}")
        if isinstance(v, dict):
            _check_kwargs(v, f"{name}[{key!r}]", batch, what)
        elif torch.is_tensor(v) and batch is not None and v.dim() > 0 and v.shape[0] not in (batch, 1):
            raise ValueError(f"{name}[{key!r}] has {v.shape[0]} rows (shape {tuple(v.shape)}) but {what} has "
                             f"{batch} samples: a tensor's first dimension holds one row per sample ({batch}), or "
                             "1 (or a 0-dim tensor) for a value shared by all samples")
    return value


def _check_branches(cond: dict[str, Any], null: dict[str, Any], name: str = "null_kwargs") -> None:
    """The unconditional branch's arguments must concatenate with the conditional ones (one batched call)."""
    for key, u in null.items():
        where = f"{name}[{key!r}]"
        if key not in cond:
            raise ValueError(f"{where} has no counterpart in model_kwargs: both branches run in one batched "
                             "call, so they take the same arguments (give model_kwargs a value for it too)")
        c = cond[key]
        if isinstance(c, dict) or isinstance(u, dict):
            if not (isinstance(c, dict) and isinstance(u, dict)):
                raise ValueError(f"{where} and model_kwargs[{key!r}] must both be dicts or neither")
            _check_branches(c, u, where)
        elif torch.is_tensor(c) or torch.is_tensor(u):
            if not (torch.is_tensor(c) and torch.is_tensor(u)):
                raise ValueError(f"{where} and model_kwargs[{key!r}] must both be tensors (they are concatenated "
                                 f"along dim 0), got {type(u).__name__} and {type(c).__name__}")
            if _trailing(c) != _trailing(u):
                raise ValueError(f"{where} has shape {tuple(u.shape)} and model_kwargs[{key!r}] {tuple(c.shape)}: "
                                 "they are concatenated along dim 0, so all other dimensions must agree")
        elif not _same_value(c, u):
            raise ValueError(f"{where} = {u!r} differs from model_kwargs[{key!r}] = {c!r}: both branches run in "
                             "one batched call, so an argument that is not a tensor must be the same in both")


def _trailing(value: torch.Tensor) -> tuple[int, ...]:
    """A tensor's shape after its rows (a 0-dim tensor is one value per sample)."""
    return tuple(value.shape[1:])


def _merged(cond: dict[str, Any], null: dict[str, Any]) -> dict[str, Any]:
    """The unconditional branch's arguments: the conditional ones, overridden by null_kwargs (nested dicts too)."""
    out = dict(cond)
    for key, value in null.items():
        out[key] = _merged(cond[key], value) if isinstance(value, dict) else value
    return out


def _same_value(a: object, b: object) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # (an object whose == is not a truth value)
        return False


def _to_device(kwargs: dict[str, Any], device: torch.device | None) -> dict[str, Any]:
    if device is None:
        return kwargs
    return {k: _to_device(v, device) if isinstance(v, dict) else v.to(device) if torch.is_tensor(v) else v
            for k, v in kwargs.items()}


def make_conditioning(model_kwargs: object = None, guidance_scale: object = None, null_kwargs: object = None,
                      *, heads: int = 3, batch: int | None = None, what: str = "the batch",
                      device: torch.device | None = None) -> Conditioning | None:
    """:func:`gms_kernels.sample`'s ``model_kwargs``, ``guidance_scale`` and ``null_kwargs`` checked (the
    tensors' rows against ``batch`` samples, unless None) and moved to ``device``; None when there is
    nothing to pass (the unconditional call, unchanged)."""
    if guidance_scale is not None:
        if isinstance(guidance_scale, bool) or not isinstance(guidance_scale, numbers.Real):
            raise TypeError(f"guidance_scale must be a real number w (e1 = e1_u + w (e1_c - e1_u)), got "
                            f"{type(guidance_scale).__name__}")
        if not math.isfinite(float(guidance_scale)):
            raise ValueError(f"guidance_scale must be finite, got {guidance_scale}")
        if null_kwargs is None and float(guidance_scale) != 1.0:
            raise ValueError(f"guidance_scale={guidance_scale} needs null_kwargs, the unconditional branch's "
                             "arguments (e.g. {'class_labels': null_label} or a null embedding)")
    elif null_kwargs is not None:
        raise ValueError("null_kwargs is the unconditional branch of classifier-free guidance: it is read only "
                         "with guidance_scale")
    kwargs = {} if model_kwargs is None else _check_kwargs(model_kwargs, "model_kwargs", batch, what)
    null = None
    if null_kwargs is not None:
        _check_kwargs(null_kwargs, "null_kwargs", batch, what)
        if not null_kwargs:
            raise ValueError("null_kwargs is empty: the unconditional branch would be the conditional one; give the "
                             "arguments it changes (e.g. {'class_labels': null_label})")
        _check_branches(kwargs, null_kwargs)
        null = _to_device(_merged(kwargs, null_kwargs), device)
    if not kwargs and null is None:
        return None
    # (batch unknown: a conditioning to check the arguments with, whose tensors follow no samples)
    return Conditioning(_to_device(kwargs, device), batch if batch is not None else -1, null,
                        1.0 if guidance_scale is None else float(guidance_scale), heads)
