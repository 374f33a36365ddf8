"""Launcher of the C++ fused step (``gms_kernels._C``, csrc/gms_step.cpp) for CPU tensors.

The extension is torch-free: it works on flat float32 buffers. This module upcasts the inputs to
contiguous float32 (any float dtype, any strides), hands zero-copy numpy views to the extension
(which releases the GIL and uses OpenMP with ``torch.get_num_threads()`` threads) and returns
x_s in the dtype and shape of x_t. The extension is imported lazily: without it,
:func:`available` is False and the torch reference is used instead.
"""
from __future__ import annotations

import importlib

import torch

from . import FusedStepConfig

_ext = None
_import_error: Exception | None = None


def _load():
    global _ext, _import_error
    if _ext is None and _import_error is None:
        try:
            _ext = importlib.import_module("gms_kernels._C")
        except ImportError as exc:  # not built (no compiler at install time) or broken build
            _import_error = exc
    return _ext


def available() -> bool:
    """True when the compiled extension imports."""
    return _load() is not None


def import_error() -> Exception | None:
    """Why the extension is unavailable (None when it is available)."""
    _load()
    return _import_error


def _ext_or_raise():
    ext = _load()
    if ext is None:
        raise RuntimeError(f"the C++ extension gms_kernels._C is not available ({_import_error}); reinstall "
                           "with a working C++ compiler: pip install --force-reinstall .")
    return ext


def _flat_f32(t: torch.Tensor, name: str) -> torch.Tensor:
    if not torch.is_tensor(t):
        raise TypeError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"the cpp backend runs on CPU tensors; {name} is on {t.device}")
    if not (t.is_floating_point()):
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    return t.detach().to(torch.float32).contiguous().reshape(-1)


def _flat_i64(t, n: int, name: str) -> torch.Tensor:
    t = torch.as_tensor(t).detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.to(torch.int64).contiguous().reshape(-1)
    if t.numel() != n:
        raise ValueError(f"{name} must hold one value per sample ({n}), got {t.numel()}")
    return t


def _batch_dims(x: torch.Tensor) -> tuple[int, int]:
    if x.dim() == 0:
        raise ValueError("x_t must have a batch dimension: [N, ...]")
    n = x.shape[0]
    d = 1
    for s in x.shape[1:]:
        d *= int(s)
    return n, d


def _threads() -> int:
    return max(1, torch.get_num_threads())


def _new_buffer(n: int) -> torch.Tensor:
    """An output buffer of n float32 (every element is written by the extension)."""
    return torch.empty(n, dtype=torch.float32)


def fused_step(x_t: torch.Tensor, e1: torch.Tensor, e2: torch.Tensor | None, e3: torch.Tensor | None,
               seeds: torch.Tensor, indices: torch.Tensor, cfg: FusedStepConfig, return_params: bool = False,
               *, adan_fp64: bool = False):
    """One fused GMS step (see :mod:`gms_kernels.kernels` for the contract).

    Returns ``(x_s, params)``: x_s like x_t (dtype and shape); params a
    :class:`gms_kernels.fit.MixtureParams` of float32 tensors shaped like x_t, or None.
    The ADAN fit runs in float32 (in double for blocks whose values could overflow float32);
    ``adan_fp64=True`` runs it in double everywhere (about 3x slower; for checks).
    """
    from ..fit import MixtureParams

    ext = _ext_or_raise()
    n, d = _batch_dims(x_t)
    total = n * d
    heads = {"e1": e1, "e2": e2, "e3": e3}
    flat = {"x_t": _flat_f32(x_t, "x_t")}
    for name, h in heads.items():
        if h is None:
            flat[name] = None
            continue
        if h.numel() != total:
            raise ValueError(f"{name} has {h.numel()} elements, x_t has {total}: heads must be shaped like x_t")
        flat[name] = _flat_f32(h, name)
    seeds = _flat_i64(seeds, n, "seeds")
    indices = _flat_i64(indices, n, "indices")

    out = _new_buffer(total)
    params = [_new_buffer(total) for _ in range(3)] if return_params else [None] * 3
    np_or_none = lambda t: None if t is None else t.numpy()
    ext.fused_step(
        flat["x_t"].numpy(), flat["e1"].numpy(), np_or_none(flat["e2"]), np_or_none(flat["e3"]),
        seeds.numpy(), indices.numpy(), out.numpy(), *(np_or_none(p) for p in params),
        n, d, int(cfg.mode), int(cfg.t), float(cfg.a_t), float(cfg.sigma_t), float(cfg.c1), float(cfg.c2),
        float(cfg.lam2), bool(cfg.has_range), float(cfg.center), float(cfg.half), float(cfg.var_cap),
        float(cfg.w1), float(cfg.var_floor), [float(lr) for lr in cfg.lrs], float(cfg.grad_scale),
        bool(cfg.per_pixel), _threads(), bool(adan_fp64))
    x_s = out.reshape(x_t.shape).to(x_t.dtype)
    if not return_params:
        return x_s, None
    mu1, mu2, s2 = (p.reshape(x_t.shape) for p in params)
    return x_s, MixtureParams(mu1, mu2, s2)


def sample_mixture(params, w1: float, seeds: torch.Tensor, indices: torch.Tensor, t: int,
                   per_pixel: bool = False) -> torch.Tensor:
    """Draw ``(u < w1 ? mu1 : mu2) + sqrt(max(s2, 0)) z`` with the Philox streams of step t.

    ``params`` is a MixtureParams with mu1/mu2/s2 shaped [N, ...]; returns float32 shaped like mu1.
    """
    ext = _ext_or_raise()
    like = params.mu1
    n, d = _batch_dims(like)
    total = n * d
    flat = []
    for name in ("mu1", "mu2", "s2"):
        p = getattr(params, name)
        if p.numel() != total:
            raise ValueError(f"params.{name} has {p.numel()} elements, mu1 has {total}")
        flat.append(_flat_f32(p, f"params.{name}"))
    seeds = _flat_i64(seeds, n, "seeds")
    indices = _flat_i64(indices, n, "indices")
    out = _new_buffer(total)
    ext.sample_mixture(*(p.numpy() for p in flat), out.numpy(), seeds.numpy(), indices.numpy(), n, d,
                       float(w1), int(t), bool(per_pixel), _threads())
    return out.reshape(like.shape)
