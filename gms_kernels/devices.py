"""Where the package's own tensors go, and host-to-device copies that do not stall the host.

The tensors the package makes for itself (schedules, Philox seeds and counters, the kernels' tables,
the samplers' and the trainer's bookkeeping, the shipped models, data sets and metrics) are placed
explicitly: on the CPU or where the data are, never on torch's default device, so that a user's
``torch.set_default_device(...)`` changes no result (tests/test_default_device.py). Networks a user
loads or builds go where torch's default device says, as torch's own modules do.

A copy from ordinary (pageable) host memory to a CUDA device waits until everything queued on
the stream before it has run: inside a sampling loop that is a whole network call. Staged through
pinned memory the copy is queued like a kernel and the host goes on at once; torch's pinned-memory
cache keeps the staging buffer until the copy has run.
"""
from __future__ import annotations

import itertools

import torch


def as_tensor_on(value: object, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """``value`` as a tensor (of ``dtype`` if given) on ``device``; by default a tensor stays where it is
    and anything else goes to the CPU (``torch.as_tensor`` would use the default device)."""
    if device is None:
        device = value.device if isinstance(value, torch.Tensor) else "cpu"
    return torch.as_tensor(value, dtype=dtype, device=device)


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
