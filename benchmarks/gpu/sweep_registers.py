"""The register cap of ADAN's fp32 mode (``triton_gms.ADAN_FP32_MAXNREG``), swept at both sizes and
both iteration counts; each cap timed in ``--rounds`` rounds, the order rotating between rounds, so
that the spread between rounds shows the noise.

    python benchmarks/gpu/sweep_registers.py --rounds 2
    TRITON_INTERPRET=1 python benchmarks/gpu/sweep_registers.py --smoke   # CPU dry run

Kernel device time as in bench_gpu.py: a CUDA graph over input sets totalling 4x the L2.
"""
from __future__ import annotations

import argparse
from unittest import mock

import torch

from bench_gpu import Setup, kernel_calls
from gms_kernels import Schedule
from gms_kernels.kernels import triton_gms as tg

CAPS = (80, None, 96, 128, 64)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one round, CPU allowed: a dry run")
    args = p.parse_args()
    env = Setup(args.smoke)
    schedule = Schedule.linear()
    caps = CAPS[:2] if env.smoke else CAPS
    rounds = 1 if env.smoke else args.rounds
    rows = []
    for size, shape in env.sizes.items():
        sets = env.input_sets(shape)
        for fit in ("adan-25", "adan-70"):
            calls = kernel_calls(sets, fit, env.fits[fit], schedule)
            times = {cap: [] for cap in caps}
            for r in range(rounds):
                for cap in caps[r % len(caps):] + caps[:r % len(caps)]:
                    with mock.patch.object(tg, "ADAN_FP32_MAXNREG", cap):
                        times[cap].append(env.graph_seconds(calls))
            best = min(min(v) for v in times.values())
            cells = [f"{' / '.join(f'{t * 1e6:.1f}' for t in times[cap])} us ({min(times[cap]) / best:.3f})"
                     for cap in caps]
            rows.append(f"| {size} | {fit} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
        del sets
        if env.cuda:
            torch.cuda.empty_cache()
    card = torch.cuda.get_device_name() if env.cuda else "cpu (dry run)"
    print(f"\nADAN fp32 kernel device time by register cap, {card}, rounds in order "
          f"(fastest over the best cap); default {tg.ADAN_FP32_MAXNREG}\n")
    print("| size | fit | " + " | ".join(f"maxnreg {cap}" for cap in caps) + " |")
    print("|---|---|" + "---|" * len(caps))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
