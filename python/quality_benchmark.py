"""Issue 20: baselines, variance controls and GMS variants on the digits and patches testbeds, chosen on
validation and reported on test (gms_kernels.experiments.quality_study).

    # measure cells (cached in gms_out/quality-<testbed>-<run>.json; runs resume; parallel runs take their own --run):
    nice -n 5 python python/quality_benchmark.py measure --testbed digits --labels ddpm "sn-ddpm c=0.5" --seeds 5
    # per-step diagnostics of GMS rows and of the heads:
    python python/quality_benchmark.py diagnose --testbed patches --labels "gms closed/pixel" --steps 10
    # the tables from the cache (no sampling): mean and 95% interval over seeds, significance vs the best baseline
    python python/quality_benchmark.py report --testbed digits --split validation --labels ... --out FILE

``--model FILE`` runs the testbed's architecture with other weights (an embedded-format file); the cache keys
name the weights' hash, so every model keeps its own cells.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from gms_kernels.experiments import quality_study as study
from gms_kernels.experiments.digits_study import ResultCache


def _cache(args) -> ResultCache:
    """Writes gms_out/quality-<testbed>-<run>.json; reads every run's file of that testbed (runs side by side
    must each write their own file)."""
    runs = sorted(Path("gms_out").glob(f"quality-{args.testbed}-*.json"))
    return ResultCache(f"gms_out/quality-{args.testbed}-{args.run}.json", also_read=runs)


def measure(args) -> None:
    bed = study.testbed(args.testbed, args.model)
    study.measure(bed, args.labels, args.steps, range(args.seeds), args.samples, _cache(args))


def diagnose(args) -> None:
    bed = study.testbed(args.testbed, args.model)
    model = bed.model()
    for label in args.labels:
        for k in args.steps:
            print(f"## {label}, K={k}\n\n| t -> s | mean abs(mu1 - mu2) / sd | mean s2 / Var | at floor / bounds | "
                  "mean abs skewness | sent to Gaussian |\n|---|---|---|---|---|---|")
            for r in study.fit_diagnostics(model, bed.shape, label, k, n=args.samples):
                print(f"| {r['t']} -> {r['s']} | {r['gap_sd']:.3f} | {r['s2_var']:.3f} | {r['at_floor']:.3f} | "
                      f"{r['skew']:.3f} | {r['gaussian']:.3f} |")
            print()
    data = bed.references()["validation"][:args.samples]
    heads = study.head_diagnostics(model, data, args.times)
    print("| t | mean e2 - e1^2 | MC mean (eps - e1)^2 | mean kappa3 (heads) | MC mean (eps - e1)^3 | "
          "mean abs kappa3 (heads) | share e2 - e1^2 < 0 |\n|---|---|---|---|---|---|---|")
    for t, r in heads.items():
        print(f"| {t} | {r['var_head']:.4f} | {r['var_mc']:.4f} | {r['kappa3_head']:+.5f} | {r['kappa3_mc']:+.5f} | "
              f"{r['abs_kappa3_head']:.5f} | {r['negative']:.3f} |")


def report(args) -> None:
    bed = study.testbed(args.testbed, args.model)
    tag = study.model_tag(bed.model_file)
    cache = _cache(args).data
    seeds = list(range(args.seeds))
    results = {}
    for label in args.labels:
        for k in args.steps:
            for s in seeds:
                key = f"{bed.name}|{tag}|{label}|{k}|{s}|{args.samples}"
                if key not in cache:
                    sys.exit(f"not measured: {key} (run the measure command first)")
                results[(label, k, s)] = cache[key]
    lines = []
    for metric in args.metrics or [bed.primary]:
        name = f"{args.split}/{metric}"
        summary = study.summarise(results, name, args.labels, args.steps, seeds)
        lines += [f"### {name}", "", "| row | " + " | ".join(f"K={k}" for k in args.steps) + " |",
                  "|---|" + "---|" * len(args.steps)]
        for label in args.labels:
            cells = []
            for k in args.steps:
                r = summary[(label, k)]
                iv = r["interval"]
                mark = "**" if r["best_baseline"] == label else ""
                sig = ""
                if "diff" in r and r["significant"]:
                    sig = " +" if r["diff"].mean < 0 else " -"
                cells.append(f"{mark}{iv.mean:.{args.digits}f} ± {iv.half_width:.{args.digits}f}{mark}{sig}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    text = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("measure", "diagnose", "report"))
    p.add_argument("--testbed", choices=("digits", "patches"), required=True)
    p.add_argument("--model", default=None, help="other weights for the testbed's architecture (embedded format)")
    p.add_argument("--labels", nargs="+", required=True)
    p.add_argument("--steps", type=int, nargs="+", default=list(study.STEPS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--times", type=int, nargs="+", default=[50, 100, 200, 400, 700, 900],
                   help="diagnose: the t of the heads' check")
    p.add_argument("--split", default="validation")
    p.add_argument("--metrics", nargs="+", default=None)
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--run", default="main", help="this run's cache file name (parallel runs need their own)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    print("command: python python/quality_benchmark.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
          file=sys.stderr)
    {"measure": measure, "diagnose": diagnose, "report": report}[args.part](args)


if __name__ == "__main__":
    main()
