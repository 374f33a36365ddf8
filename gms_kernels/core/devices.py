"""Where the package's own tensors go, and host-to-device copies that do not stall the host.

The tensors the package makes for itself (schedules, Philox seeds and counters, the kernels' tables,
the samplers' and the trainer's bookkeeping, the shipped models, data sets and metrics) are placed
explicitly: on the CPU or where the data are, never on torch's default device, so that a user's
``torch.set_default_device(...)`` changes no result (tests/sampling/test_default_device.py). Networks a user
loads or builds go where torch's default device says, as torch's own modules do.

A copy from ordinary (pageable) host memory to a CUDA device waits until everything queued on
the stream before it has run: inside a sampling loop that is a whole network call. Staged through
pinned memory the copy is queued like a kernel and the host goes on at once; torch's pinned-memory
cache keeps the staging buffer until the copy has run.
"""
from __future__ import annotations

import itertools
import numbers

import torch


def as_tensor_on(value: object, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """``value`` as a tensor (of ``dtype`` if given) on ``device``; by default a tensor stays where it is
    and anything else goes to the CPU (``torch.as_tensor`` would use the default device)."""
    if device is None:
        device = value.device if isinstance(value, torch.Tensor) else "cpu"
    return torch.as_tensor(value, dtype=dtype, device=device)


def check_device(device: object, name: str = "device", allow_meta: bool = False) -> torch.device:
    """``device`` as a torch.device that can hold this package's tensors here, refused with a message that names
    ``name``, what was given and the devices this machine has: an unknown name ('gpu'), an accelerator that is not
    there ('cuda' without CUDA, 'cuda:2' on a machine with two), or 'meta' unless ``allow_meta`` (its tensors hold
    no values: fine for a list of timesteps that is never read, not for samples)."""
    available = ", ".join(map(repr, available_devices()))
    if isinstance(device, bool) or not isinstance(device, (str, numbers.Integral, torch.device)):
        raise TypeError(f"{name} must be a torch.device or a device string such as 'cpu' or 'cuda:0', got "
                        f"{type(device).__name__} {device!r}; available here: {available}")
    try:  # (an int names a CUDA device by its index)
        parsed = torch.device("cuda", int(device)) if isinstance(device, numbers.Integral) else torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"{name}={device!r} is not a device torch knows; available here: {available}") from None
    if parsed.type == "meta" and not allow_meta:
        raise ValueError(f"{name}={device!r}: meta tensors hold no values to sample with; available here: {available}")
    if parsed.type not in ("cpu", "meta"):
        module = getattr(torch, parsed.type, None)
        if parsed.type == "mps":
            module = torch.backends.mps
        is_available = getattr(module, "is_available", None)
        label = {"cuda": "CUDA", "mps": "MPS"}.get(parsed.type, parsed.type)
        if not (callable(is_available) and is_available()):
            raise ValueError(f"{name}={device!r} asks for a {label} device, but {label} is not available here; "
                             f"available here: {available}")
        count = getattr(module, "device_count", None)
        if parsed.index is not None and callable(count) and parsed.index >= count():
            raise ValueError(f"{name}={device!r}: this machine has {count()} {label} device(s); available here: "
                             f"{available}")
    return parsed


def available_devices() -> list[str]:
    """The devices this machine offers torch: the CPU, each CUDA device, MPS."""
    cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return ["cpu"] + cuda + (["mps"] if torch.backends.mps.is_available() else [])


def generator_device(generator: torch.Generator | None) -> torch.device:
    """Where ``generator`` draws: its own device, or the CPU for None (torch's global RNG is the CPU's,
    whatever the default device). torch refuses a generator of another device than the draw's."""
    return torch.device("cpu") if generator is None else generator.device


def module_device(model: object) -> torch.device | None:
    """Where a network's weights are: the device of its first parameter (or buffer), None for a callable
    without any (an oracle, a function)."""
    if isinstance(model, torch.nn.Module):
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            return tensor.device
    return None


def to_device_async(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` (a host tensor) on ``device``, without waiting for the device's queue."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def cpu_description() -> str:
    """The CPU the results tables name: its model, logical CPU count and widest vector ISA
    (AVX-512 / AVX2 / NEON / SSE, from /proc/cpuinfo's flags; the platform's name elsewhere)."""
    import os
    import platform
    from pathlib import Path

    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name in ("", platform.machine(), platform.processor()):
                name = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    isa = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else
           "NEON" if {"asimd", "neon"} & flags else "SSE" if flags else "ISA unknown")
    return f"{name}, {os.cpu_count()} CPUs, {isa}"


def machine_note() -> str:
    """:func:`cpu_description`, torch's thread count and version: the machine line of the results tables."""
    return f"{cpu_description()}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}"
