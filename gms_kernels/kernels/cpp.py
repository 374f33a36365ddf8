"""Launcher of the C++ fused step (``gms_kernels._C``, csrc/gms_step.cpp) for CPU tensors.

The extension is torch-free: it works on float32 buffers holding N samples of D elements each,
sample i starting ``stride`` elements after sample i - 1. This module checks every buffer (dtype,
size, layout, overlaps) and hands the extension their addresses (``_C.fused_step_at``: no numpy
wrapping on the per-step path). x_t and the heads are read in place wherever that layout fits, i.e.
for float32 tensors whose samples are each contiguous, whatever the stride between samples (the
heads of a [N, 3C, ...] model output sliced along channels, ``out[:, C:2C]``, are such views);
anything else (other dtypes, other strides) is first copied to contiguous float32. The extension
releases the GIL and uses OpenMP with ``torch.get_num_threads()`` threads; x_s comes back in the
dtype and shape of x_t, in a new buffer or in the caller's ``out``. The extension is imported
lazily: without it, :func:`available` is False and the torch reference is used instead.

The extension holds the kernels compiled for several CPU targets (x86-64: avx512, avx2, sse2) and
uses the best one the CPU runs; the environment variable ``GMS_KERNELS_CPU_TARGET`` (read at the
first use) or :func:`set_cpu_target` picks a lower one, e.g. to test or time the AVX2 code on an
AVX-512 machine. :func:`cpu_info` says which one runs.
"""
from __future__ import annotations

import functools
import importlib
import os

import torch

from ..core.devices import as_tensor_on
from ..core.fit import MixtureParams
from .config import FusedStepConfig, NonFiniteInput
from .scalars import step_scalars

CPU_TARGET_ENV = "GMS_KERNELS_CPU_TARGET"

_ext = None
_import_error: Exception | None = None


def _load():
    global _ext, _import_error
    if _ext is None and _import_error is None:
        try:
            ext = importlib.import_module("gms_kernels._C")  # (compiled: no Python module for the import graph)
        except ImportError as exc:  # not built (no compiler at install time) or broken build
            _import_error = exc
            return None
        forced = os.environ.get(CPU_TARGET_ENV)
        if forced:
            try:
                ext.set_target(forced)
            except ValueError as exc:
                raise ValueError(f"environment variable {CPU_TARGET_ENV}={forced!r}: {exc}") from None
        _ext = ext
    return _ext


def cpu_info() -> dict:
    """The C++ kernels' CPU target: ``{'target': in use, 'best': the best this CPU runs, 'compiled':
    [...], 'supported': [...], 'vector_bits': .., 'fma': ..}``, plus ``'forced'`` (the environment
    override, or None)."""
    info = dict(_ext_or_raise().cpu_info())
    info["forced"] = os.environ.get(CPU_TARGET_ENV) or None
    return info


def set_cpu_target(name: str | None) -> str:
    """Run the kernels compiled for target ``name`` (one of ``cpu_info()['supported']``; None: the
    best one); returns the target now in use. ValueError for a target this build or CPU lacks."""
    ext = _ext_or_raise()
    ext.set_target(ext.cpu_info()["best"] if name is None else str(name))
    return ext.cpu_info()["target"]


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


@functools.lru_cache(maxsize=1024)
def coef_scalars(cfg: FusedStepConfig) -> tuple[float, ...]:
    """The entries of the step's scalar table (:func:`~gms_kernels.kernels.scalars.step_scalars`) that the
    extension reads, in its order (``gms_kernels._C.STEP_SCALARS``). One entry per step of a 1000-step
    trajectory, as the Triton launcher keeps its tables."""
    table = step_scalars(cfg)
    return tuple(table[name] for name in _ext_or_raise().STEP_SCALARS)


def _check_float_cpu(t, name: str) -> None:
    if not torch.is_tensor(t):
        raise TypeError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise ValueError(f"the cpp backend runs on CPU tensors; {name} is on {t.device}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")


def _flat_f32(t: torch.Tensor, name: str) -> torch.Tensor:
    _check_float_cpu(t, name)
    return t.detach().to(torch.float32).contiguous().reshape(-1)


@functools.lru_cache(maxsize=64)
def _row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _samples_contiguous(t: torch.Tensor) -> bool:
    """Whether the elements of each t[i] are contiguous (dims 1.. in row-major order; any dim-0 stride)."""
    if t.is_contiguous() or t.stride()[1:] == _row_major_strides(t.shape[1:]):  # (the usual cases, fast)
        return True
    expected = 1  # (size-1 dims may have any stride)
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _samples(t: torch.Tensor, n: int, d: int, name: str) -> tuple[torch.Tensor, int]:
    """(tensor, stride): t's N samples of D elements, sample i at element i * stride from the
    tensor's first element.

    t itself when it is float32 with each sample contiguous (stride = t.stride(0)); otherwise a
    contiguous float32 copy (stride = D).
    """
    _check_float_cpu(t, name)
    if t.requires_grad:
        t = t.detach()
    if t.dtype == torch.float32 and n > 0 and d > 0 and t.dim() >= 1 and t.shape[0] == n and _samples_contiguous(t):
        return t, (t.stride(0) if n > 1 else d)
    return t.to(torch.float32).contiguous(), d


def _span(t: torch.Tensor, n: int, d: int, stride: int) -> tuple[int, int]:
    """[first, last) byte addresses of N samples of D float32, ``stride`` elements apart, from t's first element."""
    start = t.data_ptr()
    return start, start + ((n - 1) * stride + d) * 4 if n and d else start


def _check_out(out, x_t: torch.Tensor) -> torch.Tensor:
    if not torch.is_tensor(out):
        raise TypeError(f"out must be a torch tensor, got {type(out).__name__}")
    if out.device.type != "cpu" or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 CPU tensor, got {out.dtype} on {out.device}"
                         f"{'' if out.is_contiguous() else ' (not contiguous)'}")
    if tuple(out.shape) != tuple(x_t.shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, x_t has {tuple(x_t.shape)}")
    return out.detach().reshape(-1)


def _flat_i64(t, n: int, name: str) -> torch.Tensor:
    if (torch.is_tensor(t) and t.dtype == torch.int64 and t.is_cpu and t.dim() == 1
            and t.numel() == n and t.is_contiguous()):
        return t  # (SampleNoise's seeds and indices: already as the extension reads them)
    t = as_tensor_on(t).detach()
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


def _new_buffer(shape) -> torch.Tensor:
    """A contiguous float32 output buffer (every element is written by the extension)."""
    return torch.empty(shape, dtype=torch.float32, device="cpu")


def fused_step(x_t: torch.Tensor, e1: torch.Tensor, e2: torch.Tensor | None, e3: torch.Tensor | None,
               seeds: torch.Tensor, indices: torch.Tensor, cfg: FusedStepConfig, return_params: bool = False,
               *, adan_fp64: bool | None = None, out: torch.Tensor | None = None):
    """One fused GMS step (see :mod:`gms_kernels.kernels` for the contract).

    Returns ``(x_s, params)``: x_s like x_t (dtype and shape); params a
    :class:`gms_kernels.core.fit.MixtureParams` of float32 tensors shaped like x_t, or None.
    The ADAN fit runs in float32 (in double for elements whose values could overflow float32);
    ``adan_fp64=True`` runs it in double everywhere (about 3x slower). By default (None) it follows
    ``cfg.adan_fp64`` (the ``adan_precision`` option), else float32.

    x_t and the heads are read in place when they are float32 with each sample contiguous (e.g.
    channel slices of one model output); other layouts and dtypes are copied first. ``out``: a
    contiguous float32 tensor shaped like x_t that receives x_s instead of a new buffer (it may be
    x_t itself, for an in-place step, but must not overlap the heads); x_s is then ``out`` (or,
    for an x_t of another dtype, ``out`` converted to it).
    """
    ext = _ext_or_raise()
    n, d = _batch_dims(x_t)
    total = n * d
    x, x_stride = _samples(x_t, n, d, "x_t")
    heads = []  # (tensor or None, stride) of e1, e2, e3
    for name, h in (("e1", e1), ("e2", e2), ("e3", e3)):
        if h is None:
            heads.append((None, d))
            continue
        if not torch.is_tensor(h):
            raise TypeError(f"{name} must be a torch tensor, got {type(h).__name__}")
        if h.numel() != total:
            raise ValueError(f"{name} has {h.numel()} elements, x_t has {total}: heads must be shaped like x_t")
        heads.append(_samples(h, n, d, name))
    seeds = _flat_i64(seeds, n, "seeds")
    indices = _flat_i64(indices, n, "indices")

    if out is None:
        x_s = _new_buffer(x_t.shape)
    else:
        x_s = _check_out(out, x_t)
        if total:
            lo, hi = _span(x_s, 1, total, total)
            for name, (h, stride) in zip(("e1", "e2", "e3"), heads):
                if h is not None:
                    a, b = _span(h, n, d, stride)
                    if a < hi and lo < b:
                        raise ValueError(f"out overlaps {name}: the step would overwrite heads it has yet to read")
            a, b = _span(x, n, d, x_stride)
            if a < hi and lo < b and not (a == lo and x_stride == d):
                raise ValueError("out overlaps x_t without being x_t itself")
    params = (_new_buffer(x_t.shape), _new_buffer(x_t.shape), _new_buffer(x_t.shape)) if return_params else None
    address = lambda t: 0 if t is None else t.data_ptr()
    (h1, stride1), (h2, stride2), (h3, stride3) = heads
    finite = ext.fused_step_at(
        address(x), x_stride, address(h1), stride1, address(h2), stride2, address(h3), stride3, seeds.data_ptr(),
        indices.data_ptr(), x_s.data_ptr(), *((0, 0, 0) if params is None else (p.data_ptr() for p in params)),
        n, d, int(cfg.mode), int(cfg.t), coef_scalars(cfg), bool(cfg.has_range), float(cfg.var_cap),
        float(cfg.w1), float(cfg.var_floor), cfg.lrs, float(cfg.grad_scale),
        bool(cfg.per_pixel), _threads(), bool(cfg.adan_fp64 if adan_fp64 is None else adan_fp64),
        float(cfg.fixed_var), float(cfg.ddim_a_s), float(cfg.ddim_eps_scale))
    if not finite:
        raise NonFiniteInput("the fused step read a NaN or inf in x_t or a head")
    x_s = x_s if out is None else out
    if x_t.dtype != torch.float32:
        x_s = x_s.to(x_t.dtype)
    return x_s, None if params is None else MixtureParams(*params)


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
    out = _new_buffer(like.shape)
    ext.sample_mixture(*(p.numpy() for p in flat), out.numpy().reshape(-1), seeds.numpy(), indices.numpy(), n, d,
                       float(w1), int(t), bool(per_pixel), _threads())
    return out
