"""Issue 20: baselines, variance controls and GMS variants on the digits and patches testbeds, chosen on
validation and reported on test (gms_kernels.experiments.quality_study).

    # measure cells (cached in gms_out/quality-<testbed>-<run>.json; runs resume; parallel runs take their own --run):
    nice -n 5 python python/quality_benchmark.py measure --testbed digits --labels ddpm "sn-ddpm c=0.5" --seeds 5
    # per-step diagnostics of GMS rows and of the heads:
    python python/quality_benchmark.py diagnose --testbed patches --labels "gms closed/pixel" --steps 10
    # the tables from the cache (no sampling): mean and 95% interval over seeds, significance vs the best baseline
    python python/quality_benchmark.py report --testbed digits --labels ... --out FILE
    # the defaults' choice: mean rank of the candidates on validation over both testbeds and K = 5, 10, 20
    python python/quality_benchmark.py choose --labels "gms closed/pixel" ... --alias-digits central=FILE ...
    # paired per-seed differences of rows against other rows (and the best variance-scaled Gaussian), per K:
    python python/quality_benchmark.py paired --testbed digits --seeds 3 --splits validation --labels ... --versus ...
    # the heads' skew against exact heads of the train data, per step: writes the skew tables rows 'skew=lam' read
    python python/quality_benchmark.py shrinkage --testbed patches --samples 2000

``--model FILE`` runs the testbed's architecture with other weights (an embedded-format file); the cache keys
name the weights' hash, so every model keeps its own cells.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from gms_kernels.devices import cpu_description
from gms_kernels.experiments import quality_study as study
from gms_kernels.experiments.digits_study import ResultCache
from gms_kernels.metrics import paired_difference, seed_interval


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


def _split_label(label: str, aliases: dict[str, str]) -> tuple[str | None, str]:
    """'central: gms closed/pixel' -> (the weights file of alias 'central', 'gms closed/pixel')."""
    if ": " in label:
        alias, row = label.split(": ", 1)
        if alias not in aliases:
            sys.exit(f"label {label!r} names model {alias!r}; pass --alias {alias}=FILE")
        return aliases[alias], row
    return None, label


def collect(args) -> dict:
    """{(label, K, seed): cell} from the caches, for every label (an unmeasured cell stops the report)."""
    aliases = dict(a.split("=", 1) for a in args.alias)
    cache = _cache(args).data
    results = {}
    for label in args.labels:
        model_file, row = _split_label(label, aliases)
        bed = study.testbed(args.testbed, model_file)
        tag = bed.tag
        study.row_options(row)
        for k in args.steps:
            for s in range(args.seeds):
                key = f"{bed.name}|{tag}|{row}|{k}|{s}|{args.samples}"
                if key not in cache:
                    sys.exit(f"not measured: {key} (run the measure command first)")
                results[(label, k, s)] = cache[key]
    return results


def table(results: dict, metric: str, args) -> list[str]:
    seeds = list(range(args.seeds))
    summary = study.summarise(results, metric, args.labels, args.steps, seeds)
    lines = ["| row | " + " | ".join(f"K={k}" for k in args.steps) + " |", "|---|" + "---|" * len(args.steps)]
    for label in args.labels:
        cells = []
        for k in args.steps:
            r = summary[(label, k)]
            iv, mark = r["interval"], "**" if r["best_baseline"] == label else ""
            sig = (" +" if r["diff"].mean < 0 else " -") if r.get("significant") else ""
            cells.append(f"{mark}{iv.mean:.{args.digits}f} ± {iv.half_width:.{args.digits}f}{mark}{sig}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def acceptance(results: dict, metric: str, args) -> list[str]:
    """Issue 20's acceptance cells: the default row against each named baseline and against the best of the
    variance-scaled Gaussians (lowest mean among the baseline rows with c= or v=), per K: both 95% intervals, whether they are
    disjoint with the default below, and the paired difference."""
    seeds = list(range(args.seeds))
    lines = [f"### acceptance: `{args.default_row}` against the baselines ({metric})", "",
             "| K | baseline | default | baseline's | intervals disjoint, default lower | default - baseline, paired |",
             "|---|---|---|---|---|---|"]
    for k in args.steps:
        vals = {label: [results[(label, k, s)][metric] for s in seeds] for label in args.labels}
        scaled = [label for label in args.labels if study.is_variance_scaled(label)]
        best_scaled = min(scaled, key=lambda lb: sum(vals[lb])) if scaled else None
        mine = seed_interval(vals[args.default_row])
        for base in [*args.versus, *([best_scaled] if best_scaled else [])]:
            other = seed_interval(vals[base])
            diff, significant = paired_difference(vals[args.default_row], vals[base])
            name = f"{base} (best variance-scaled)" if base == best_scaled else base
            lines.append(f"| {k} | {name} | {mine.mean:.{args.digits}f} [{mine.low:.{args.digits}f}, "
                         f"{mine.high:.{args.digits}f}] | {other.mean:.{args.digits}f} [{other.low:.{args.digits}f}, "
                         f"{other.high:.{args.digits}f}] | {'yes' if mine.high < other.low else 'no'} | "
                         f"{diff.mean:+.{args.digits}f} [{diff.low:+.{args.digits}f}, {diff.high:+.{args.digits}f}]"
                         f"{' *' if significant else ''} |")
    return lines + [""]


def report(args) -> None:
    results = collect(args)
    bed = study.testbed(args.testbed)
    metrics = args.metrics or [bed.primary]
    cmd = "python python/quality_benchmark.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    lines = [f"Command (tables from the cached cells): `{cmd}`", "",
             f"Machine: {cpu_description()}; torch {torch.__version__}, 1 torch thread. {args.samples} samples per cell; "
             f"seeds 0..{args.seeds - 1} (the same initial noise for every row at a seed). Cells: mean ± half-width "
             "of the 95% Student-t interval over seeds (gk.metrics.seed_interval). **Bold**: the best baseline at "
             "that K (lowest mean of the baseline rows: ddpm, sn-ddpm, ddim, their variance-scaled variants and the SDE "
             "solvers, which run the most steps whose network calls fit in K + 1). "
             "`+` / `-`: significantly better / worse than it (paired per-seed difference, 95% interval excludes "
             "0: gk.metrics.paired_difference). Lower is better.", ""]
    for split in args.splits:
        for metric in metrics:
            lines += [f"### {split} / {metric}", "", *table(results, f"{split}/{metric}", args), ""]
    if args.default_row:
        lines += acceptance(results, f"{args.splits[0]}/{metrics[0]}", args)
    text = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


def ggf(args) -> None:
    """Gotta Go Fast on a testbed: its calls are adaptive, so one row per tolerance with the mean network calls
    per sample (NFE), over seeds, against every reference set."""
    import time

    from gms_kernels.sampling import sample

    bed = study.testbed(args.testbed, args.model)
    model, refs = bed.model(), bed.references()
    cache = _cache(args)
    tag = bed.tag
    cells = []
    for seed in range(args.seeds):
        def run(seed=seed):
            seen: list[dict] = []
            t0 = time.perf_counter()
            x = sample(model, shape=(args.samples, *bed.shape), solver="ggf", generator=seed, progress=False,
                       callback=seen.append, eps_rel=args.ggf_tol)
            nfe = float(torch.as_tensor(seen[-1]["nfe"], dtype=torch.float64).mean())
            scores = {f"{r}/{m}": fn(x, ref) for r, ref in refs.items() for m, fn in bed.metrics.items()}
            return {**scores, "nfe": nfe, "seconds": time.perf_counter() - t0}
        cells.append(cache.get_or_compute(f"{bed.name}|{tag}|ggf eps_rel={args.ggf_tol:g}|adaptive|{seed}|"
                                          f"{args.samples}", run))
    names = [n for n in cells[0] if "/" in n]
    print(f"| ggf eps_rel={args.ggf_tol:g} | NFE | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    nfe = seed_interval([c["nfe"] for c in cells])
    row = [f"{seed_interval([c[n] for c in cells]).mean:.3f} ± {seed_interval([c[n] for c in cells]).half_width:.3f}"
           for n in names]
    print(f"| {args.seeds} seeds x {args.samples} | {nfe.mean:.1f} | " + " | ".join(row) + " |")


def shrinkage(args) -> None:
    """lambda(t) per K: the heads' kappa3 regressed on exact heads of the train data (study.skew_shrinkage), on x_t
    of --samples images (all, if fewer) of --x-split; writes the table rows 'skew=lam' (x_t of train images) or
    'skew=lamval' (of validation images) read, factors clipped to [0, 100], into the testbed's table file."""
    import json

    from gms_kernels.data import digits, patches

    if args.testbed not in ("digits", "patches"):
        sys.exit("shrinkage needs a testbed with a network: digits or patches")
    bed = study.testbed(args.testbed, args.model)
    split = {"train": "train", "validation": "validation"}[args.x_split]
    images = (lambda sp: digits(sp)[0]) if args.testbed == "digits" else patches
    train, source = images("train"), images(split)
    pick = torch.randperm(source.shape[0], generator=torch.Generator().manual_seed(0))[:args.samples].sort().values
    rows = study.skew_shrinkage(bed.model(), study.data_oracle(train), source[pick], args.steps)
    name = "lam" if split == "train" else "lamval"
    path = study.skew_table_path(bed)
    stored = json.loads(path.read_text()) if path.exists() else {"tables": {}, "runs": {}}
    stored["tables"][name] = {k: {r["t"]: min(max(r["lam"], 0.0), 100.0) for r in rs} for k, rs in rows.items()}
    stored["runs"][name] = {"rows": rows, "x_t_images": len(pick), "x_t_split": split,
                            "exact_components": train.shape[0], "blur": study.ORACLE_BLUR}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stored, indent=1))
    print(f"wrote table {name!r} to {path}\n")
    print("| K | t -> s | lambda (kappa3) | corr | RMS kappa3 heads / exact | lambda (Var - lam2) | corr |\n"
          "|---|---|---|---|---|---|---|")
    for k, rs in rows.items():
        for r in rs:
            print(f"| {k} | {r['t']} -> {r['s']} | {r['lam']:.4f} | {r['corr']:.3f} | {r['rms_head']:.3g} / "
                  f"{r['rms_exact']:.3g} | {r['lam_var']:.4f} | {r['corr_var']:.3f} |")


def paired(args) -> None:
    """Paired per-seed differences (gk.metrics.paired_difference, 95%) of each --labels row minus each --versus row,
    per K, on --splits[0] / the primary metric (or --metrics[0]); then minus the best variance-scaled Gaussian and
    minus the best baseline among the --versus rows (lowest mean at that K, named in the cell)."""
    labels = list(dict.fromkeys([*args.labels, *args.versus]))
    results = collect(argparse.Namespace(**{**vars(args), "labels": labels}))
    metric = f"{args.splits[0]}/{(args.metrics or [study.testbed(args.testbed).primary])[0]}"
    d = args.digits

    def values(label, k):
        return [results[(label, k, s)][metric] for s in range(args.seeds)]

    def cell(a, b):
        diff, significant = paired_difference(a, b)
        return f"{diff.mean:+.{d}f} [{diff.low:+.{d}f}, {diff.high:+.{d}f}]{' *' if significant else ''}"

    head = ["| row | " + " | ".join(f"K={k}" for k in args.steps) + " |", "|---|" + "---|" * len(args.steps)]
    scaled = [v for v in args.versus if study.is_variance_scaled(v)]
    base = [v for v in args.versus if study.is_baseline(v)]
    lines = []
    groups = [(f"minus {v}", lambda k, v=v: v) for v in args.versus]
    for name, pool in (("the best variance-scaled Gaussian", scaled), ("the best baseline", base)):
        if pool:
            groups.append((f"minus {name} of {', '.join(pool)} (per K)",
                           lambda k, pool=pool: min(pool, key=lambda b: sum(values(b, k)))))
    for title, against in groups:
        lines += [f"### {metric}: {title}, paired", "", *head]
        for label in args.labels:
            cells = []
            for k in args.steps:
                b = against(k)
                cells.append("-" if b == label else cell(values(label, k), values(b, k))
                             + (f" ({b})" if title.endswith("(per K)") else ""))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    print("\n".join(lines))


def choose(args) -> None:
    """The defaults' choice on validation: mean rank of each candidate over (testbed, K), both testbeds."""
    scores, lines = {}, []
    for bed_name in ("digits", "patches"):
        sub = argparse.Namespace(**{**vars(args), "testbed": bed_name,
                                    "alias": getattr(args, f"alias_{bed_name}")})
        results = collect(sub)
        metric = f"validation/{study.testbed(bed_name).primary}"
        for label in args.labels:
            for k in args.steps:
                scores[(bed_name, label, k)] = sum(results[(label, k, s)][metric] for s in range(args.seeds)) / args.seeds
    ranks = study.mean_ranks(scores, args.labels)
    cols = [(b, k) for b in ("digits", "patches") for k in args.steps]
    lines += ["| candidate | " + " | ".join(f"{b} K={k}" for b, k in cols) + " | mean rank |",
              "|---|" + "---|" * (len(cols) + 1)]
    for label in sorted(args.labels, key=ranks.get):
        lines.append(f"| {label} | " + " | ".join(f"{scores[(b, label, k)]:.2f}" for b, k in cols)
                     + f" | {ranks[label]:.2f} |")
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("measure", "diagnose", "report", "choose", "ggf", "shrinkage", "paired"))
    p.add_argument("--testbed", choices=("digits", "digits-oracle", "patches", "patches-oracle"), default="digits")
    p.add_argument("--model", default=None, help="other weights for the testbed's architecture (embedded format)")
    p.add_argument("--labels", nargs="+", default=None, help="the rows (every part but ggf)")
    p.add_argument("--steps", type=int, nargs="+", default=list(study.STEPS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--times", type=int, nargs="+", default=[50, 100, 200, 400, 700, 900],
                   help="diagnose: the t of the heads' check")
    p.add_argument("--splits", nargs="+", default=["validation", "test"], help="report: the reference sets")
    p.add_argument("--alias", nargs="*", default=[], metavar="NAME=FILE",
                   help="report: rows labelled 'NAME: row' use these weights (embedded format)")
    p.add_argument("--default-row", default=None, help="report: the acceptance table of this row (first split/metric)")
    p.add_argument("--versus", nargs="*", default=["sn-ddpm", "ddpm"],
                   help="report: the acceptance's baselines; paired: the rows every --labels row is compared with")
    p.add_argument("--alias-digits", nargs="*", default=[], metavar="NAME=FILE", help="choose: the digits aliases")
    p.add_argument("--alias-patches", nargs="*", default=[], metavar="NAME=FILE", help="choose: the patches aliases")
    p.add_argument("--metrics", nargs="+", default=None)
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--ggf-tol", type=float, default=0.5, help="ggf: GGF's relative tolerance eps_rel")
    p.add_argument("--x-split", choices=("train", "validation"), default="train",
                   help="shrinkage: the images whose x_t the heads are compared on (exact heads: the train images)")
    p.add_argument("--run", default="main", help="this run's cache file name (parallel runs need their own)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.part not in ("ggf", "shrinkage") and not args.labels:
        p.error(f"{args.part} needs --labels")
    torch.set_num_threads(1)
    print("command: python python/quality_benchmark.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
          file=sys.stderr)
    {"measure": measure, "diagnose": diagnose, "report": report, "choose": choose, "ggf": ggf,
     "shrinkage": shrinkage, "paired": paired}[args.part](args)


if __name__ == "__main__":
    main()
