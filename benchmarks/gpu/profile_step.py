"""Where the host time of one ``gk.step`` on CUDA goes: cProfile over many calls, then torch's profiler.

    python benchmarks/gpu/profile_step.py [--fit closed] [--calls 300]

A diagnostic for the launch path (Python work per call), not a benchmark: the profilers' own cost
inflates every figure, so read the shares, not the absolute times.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gms_kernels as gk  # noqa: E402
from cases import FITS, SIZES, STEP, make_inputs  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fit", default="closed", choices=list(FITS))
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x_t, out = make_inputs(SIZES["cifar10-b100"], device)
    schedule = gk.Schedule.linear()
    t, s = STEP

    def step():
        return gk.step(x_t, out, t, s, schedule, "gms", generator=0, backend="triton", **FITS[args.fit])

    for _ in range(20):
        step()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.calls):
        step()
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(22)
    stats.sort_stats("cumulative").print_stats(22)
    print(text.getvalue().replace(str(Path.cwd()), "."))

    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(20):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50))


if __name__ == "__main__":
    main()
