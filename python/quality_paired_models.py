"""Two models of one testbed side by side, from the quality benchmark's cached cells.

    python python/quality_paired_models.py --testbed digits --old gms_out/digits_central.pt \
        --new gms_out/digits_central_long.pt --metric validation/fd --seeds 3 \
        --rows 'gms closed/sample' 'gms closed/pixel' 'gms adan/pixel' sn-ddpm ddpm

Prints two tables of paired per-seed differences (mean and 95% Student-t interval, gk.metrics.paired_difference;
`*`: the interval excludes 0), per K: (1) each row of the new model minus the same row of the old one (the seeds
share the initial noise, so the pairs are tight); (2) each GMS row minus the better (lower mean) of the Gaussian
baselines among --rows (sn-ddpm, ddpm) of the same model. Every cell must have been measured
(`python python/quality_benchmark.py measure --model FILE ...`); nothing is sampled here.
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from gms_kernels.eval.metrics import paired_difference

BASELINES = ("sn-ddpm", "ddpm")


def _benchmark():
    spec = importlib.util.spec_from_file_location("quality_benchmark", Path(__file__).with_name("quality_benchmark.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--testbed", choices=("digits", "patches"), required=True)
    p.add_argument("--old", required=True, help="the first model file (embedded format)")
    p.add_argument("--new", required=True, help="the second model file")
    p.add_argument("--metric", required=True, help="split/metric, e.g. validation/fd or validation/fd_dct")
    p.add_argument("--rows", nargs="+", required=True)
    p.add_argument("--steps", type=int, nargs="+", default=[5, 10, 20])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--digits", type=int, default=2)
    args = p.parse_args()

    labels = [f"{m}: {r}" for r in args.rows for m in ("old", "new")]
    query = argparse.Namespace(testbed=args.testbed, run="main", labels=labels, steps=args.steps, seeds=args.seeds,
                               samples=args.samples, alias=[f"old={args.old}", f"new={args.new}"])
    results = _benchmark().collect(query)  # exits naming the first unmeasured cell

    def values(label: str, k: int) -> list[float]:
        return [results[(label, k, s)][args.metric] for s in range(args.seeds)]

    def cell(a: list[float], b: list[float]) -> str:
        diff, significant = paired_difference(a, b)
        d = args.digits
        return f"{diff.mean:+.{d}f} [{diff.low:+.{d}f}, {diff.high:+.{d}f}]{' *' if significant else ''}"

    head = "| row | " + " | ".join(f"K={k}" for k in args.steps) + " |\n|---|" + "---|" * len(args.steps)
    print(f"new = {args.new}, old = {args.old}; {args.seeds} seeds x {args.samples} samples\n")
    print(f"### new - old, paired ({args.metric})\n\n{head}")
    for row in args.rows:
        print(f"| {row} | " + " | ".join(cell(values(f"new: {row}", k), values(f"old: {row}", k))
                                         for k in args.steps) + " |")
    base = [r for r in args.rows if r in BASELINES]
    if not base:
        return
    print(f"\n### GMS rows minus the better of {' / '.join(base)} of the same model, paired ({args.metric})\n\n{head}")
    for m in ("old", "new"):
        for row in args.rows:
            if row in base:
                continue
            cells = []
            for k in args.steps:
                best = min(base, key=lambda b: sum(values(f"{m}: {b}", k)))
                cells.append(f"{cell(values(f'{m}: {row}', k), values(f'{m}: {best}', k))} ({best})")
            print(f"| {m}: {row} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
