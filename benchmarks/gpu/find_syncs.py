"""Where a sampling call synchronises with the GPU: the Python stack of every synchronising CUDA call
(torch's sync debug mode) in one gk.sample and one gk.step, after a warm-up. A diagnostic for
tests/kernels/test_triton_backend.py::test_triton_paths_do_not_sync_the_host_but_for_the_finite_check.
    python benchmarks/gpu/find_syncs.py          (on a machine with CUDA)"""
import traceback
import warnings

import torch

import gms_kernels as gk
from gms_kernels.kernels import triton_gms


def model(x, t):
    return torch.cat([x * 0.1, x * x * 0.01 + 0.5, x * 0.0], 1)


def stacks_of_syncs(fn) -> list[str]:
    found = []

    def record(message, category, filename, lineno, file=None, line=None):
        if "called a synchronizing" in str(message):  # (not the mode's own "prototype feature" notice)
            found.append("".join(traceback.format_stack(limit=12)[:-1]) + f"  -> {message}\n")

    torch.cuda.synchronize()
    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = before
    return found


def main() -> None:
    schedule = gk.Schedule.linear(1000)
    shape = (2, 3, 8, 8)
    for fit in ("closed", "adan"):  # compile first
        gk.sample(model, shape=shape, steps=3, schedule=schedule, generator=0, progress=False, fit=fit, device="cuda")
    triton_gms._device_tables.cache_clear()
    for name, fn in [("gk.sample, 70 steps", lambda: gk.sample(model, shape=shape, steps=70, schedule=schedule,
                                                                 generator=1, progress=False, device="cuda")),
                     ("gk.sample edm-sde, 20 steps (one read: the deferred NaN check)",
                      lambda: gk.sample(model, shape=shape, steps=20, solver="edm-sde", schedule=schedule, generator=3,
                                        progress=False, device="cuda")),
                     ("gk.sample from x_T", lambda: gk.sample(model, x_T=torch.randn(shape, device="cuda"), steps=7,
                                                              schedule=schedule, generator=2, progress=False))]:
        found = stacks_of_syncs(fn)
        print(f"== {name}: {len(found)} synchronising call(s)")
        for stack in found:
            print(stack)


if __name__ == "__main__":
    main()
