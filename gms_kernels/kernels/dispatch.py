"""Choosing the backend of the fused GMS step: ``auto | triton | cpp | torch``.

``auto`` takes the Triton kernel for CUDA tensors and the C++ extension for CPU tensors, and falls
back to the torch reference with one warning when the fast path is missing. float64 tensors take the
float64 torch reference under ``auto`` (the kernels compute in float32; name a backend to run them anyway). The environment
variable ``GMS_KERNELS_BACKEND`` overrides the argument (e.g. to force ``torch`` everywhere).
"""
from __future__ import annotations

import os

import torch

from ..core.user_warnings import warn_user

BACKENDS = ("auto", "triton", "cpp", "torch")
ENV_VAR = "GMS_KERNELS_BACKEND"
_FIXES = {
    "cpp": "reinstall with a working C++ compiler (g++ and the Python headers): pip install --force-reinstall .",
    "triton": "pip install triton (Linux, CUDA GPU), or set TRITON_INTERPRET=1 before import to run it on CPU",
}
_warned: set[str] = set()


def _module(name: str):
    """The kernel module of backend ``name`` ('cpp' or 'triton'), imported on first use: importing triton takes
    seconds, which a process that never runs the kernel should not pay."""
    if name == "cpp":
        from . import cpp

        return cpp
    from . import triton_gms

    return triton_gms


def backend_available(name: str) -> bool:
    try:
        return bool(_module(name).available())
    except ImportError:
        return False


def resolve_backend(backend: str | None, device: torch.device | str, dtype: torch.dtype | None = None) -> str:
    """The backend that will run, after the environment override and availability checks; ``dtype``: the
    sample's (float64 keeps ``auto`` on the float64 torch reference)."""
    forced = os.environ.get(ENV_VAR)
    requested = forced or ("auto" if backend is None else backend)  # ('' is refused, not taken for auto)
    if requested not in BACKENDS:
        source = f"environment variable {ENV_VAR}" if forced else "backend"
        raise ValueError(f"unknown {source} {requested!r}; valid: {', '.join(BACKENDS)}")
    device = torch.device(device)
    if requested == "torch":
        return "torch"
    if requested == "auto":
        if dtype == torch.float64:
            return "torch"
        name = "triton" if device.type == "cuda" else "cpp"
        if backend_available(name):
            return name
        if name not in _warned:
            _warned.add(name)
            warn_user(f"gms_kernels: the {name} backend is not available, using the (slower) torch "
                      f"reference instead. Fix: {_FIXES[name]}", RuntimeWarning)
        return "torch"
    if not backend_available(requested):
        raise ValueError(f"backend {requested!r} is not available. Fix: {_FIXES[requested]}")
    if requested == "cpp" and device.type != "cpu":
        raise ValueError("backend 'cpp' runs on CPU tensors; use 'triton' or 'auto' for CUDA tensors")
    if requested == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1 set before import)")
    return requested


def fused_step(backend: str, x_t, e1, e2, e3, seeds, indices, cfg, return_params: bool, nonfinite_flag=None):
    """Run the fused step of ``backend`` ('cpp' or 'triton'); returns (x_s, MixtureParams | None).

    ``nonfinite_flag`` (triton): a device int32[1] the kernel sets on a NaN/inf input, read later by
    the caller instead of a sync now. The C++ kernel always reports at once (it costs it nothing)."""
    if backend == "triton":
        return _module(backend).fused_step(x_t, e1, e2, e3, seeds, indices, cfg, return_params=return_params,
                                           nonfinite_flag=nonfinite_flag)
    return _module(backend).fused_step(x_t, e1, e2, e3, seeds, indices, cfg, return_params=return_params)
