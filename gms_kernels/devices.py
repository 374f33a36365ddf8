"""Host-to-device copies that do not stall the host.

A copy from ordinary (pageable) host memory to a CUDA device waits until everything queued on
the stream before it has run: inside a sampling loop that is a whole network call. Staged through
pinned memory the copy is queued like a kernel and the host goes on at once; torch's pinned-memory
cache keeps the staging buffer until the copy has run.
"""
from __future__ import annotations

import torch


def to_device_async(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` (a host tensor) on ``device``, without waiting for the device's queue."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
