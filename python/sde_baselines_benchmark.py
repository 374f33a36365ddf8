"""GMS against the SDE baselines (EDM-SDE, SEEDS-1/2, GGF) on the embedded digits model at equal
network calls, over seeds, with 95% intervals and paired tests. Writes python/results/digits_sde_baselines.md.

    nice -n 5 python python/sde_baselines_benchmark.py --part budgets     # NFE 10 and 20, every row
    nice -n 5 python python/sde_baselines_benchmark.py --part ggf         # GGF and one-call rows at NFE 50
    python python/sde_baselines_benchmark.py --part report                # the Markdown from both caches

Each part caches its cells in gms_out/ (JSON), so the parts can run side by side and resume.
"""
from __future__ import annotations

import argparse
import datetime
import shlex
import sys
from pathlib import Path

import torch

from gms_kernels.core.devices import cpu_description
from gms_kernels.core.data import digits
from gms_kernels.models.embedded import default_model
from studies import sde_baselines_study as study
from studies.digits_study import ResultCache



def ggf_cells(args) -> list:
    cells = [(f"ggf eps_rel={tol:g}", "ggf", {"eps_rel": tol}, 10) for tol in args.ggf_tols]
    cells += [c for c in study.budget_cells(args.ggf_budget) if c[0] in args.ggf_compare]
    return cells


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["budgets", "ggf", "report"], required=True)
    p.add_argument("--budgets", type=int, nargs="+", default=[10, 20])
    p.add_argument("--ggf-tols", type=float, nargs="+", default=[0.5])
    p.add_argument("--ggf-budget", type=int, default=50)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--cache-dir", default="gms_out")
    p.add_argument("--cache-name", default=None, help="this run's cache file (default: the part's name)")
    p.add_argument("--rows", nargs="+", default=None, help="measure only these rows (to split a part across runs)")
    p.add_argument("--ggf-compare", nargs="*", default=["sn-ddpm", "gms-adan / pixel"],
                   help="the one-call rows run at --ggf-budget next to GGF")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "digits_sde_baselines.md"))
    args = p.parse_args()
    torch.set_num_threads(1)
    model = default_model()
    reference, _ = digits("test")
    # each run writes its own cache (--cache-name), and reads every cache of the study (runs side by side)
    others = sorted(Path(args.cache_dir).glob("sde_baselines-*.json"))
    caches = {part: ResultCache(Path(args.cache_dir) / f"sde_baselines-{args.cache_name or part}.json", others)
              for part in ("budgets", "ggf")}
    budget_cells = {b: study.budget_cells(b) for b in args.budgets}
    log = print if args.part != "report" else None
    results = {}
    def chosen(cells: list) -> list:
        return [c for c in cells if args.rows is None or c[0] in args.rows]

    if args.part in ("budgets", "report"):
        for b, cells in budget_cells.items():
            results[b] = study.run_cells(model, reference, chosen(cells), args.seeds, args.samples, caches["budgets"],
                                         log=log)
    if args.part in ("ggf", "report"):
        results["ggf"] = study.run_cells(model, reference, chosen(ggf_cells(args)), args.seeds, args.samples,
                                         caches["ggf"], log=log)
    if args.part != "report":
        return
    cmd = "python python/sde_baselines_benchmark.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    lines = ["# Digits: GMS against the SDE baselines at equal network calls", "",
             "Commands: the cells were measured by `nice -n 5 python python/sde_baselines_benchmark.py --part budgets "
             "--budgets B --cache-name NAME [--rows ...] [--seeds ...]` runs side by side (B = 10 and 20, rows and "
             "seeds split between runs to fit the time; each cell is one (row, budget, seed) and does not depend on "
             "the split) and `nice -n 5 python python/sde_baselines_benchmark.py --part ggf --ggf-compare "
             f"--cache-name ggf`; then `{cmd.strip()}` wrote this file from the caches (gms_out/sde_baselines-*.json).",
             "",
             f"Machine: {cpu_description()} 1 torch thread, torch {torch.__version__}, "
             f"{datetime.date.today()}. Model: the embedded digits MomentNet (linear schedule T=1000, even trajectory). "
             f"FD-digits: Fréchet distance in the shipped digits classifier's features against the 359 held-out test "
             f"digits (lower is better). {args.samples} samples per run; seeds {', '.join(map(str, args.seeds))} "
             f"({len(args.seeds)} runs per row, the same seeds for every row). Cells: mean ± half-width of the 95% "
             "Student-t interval over seeds (`gk.metrics.seed_interval`). Last column: the paired over-seeds "
             "difference to the best baseline (lowest mean among the non-GMS rows) with its 95% interval "
             "(`gk.metrics.paired_difference`); * = significant (the interval excludes 0).", "",
             "Equal network calls, not equal K: each row gets the largest K of the even trajectory whose calls fit "
             "the budget (one-call solvers K+1 calls for K steps, as the official even list appends t=0; EDM-SDE "
             "and SEEDS-2 2 calls per step, 1 for the last step into data). The NFE column is the calls made. "
             "`gms (default)`: the model's own options, here the library's defaults (closed-form fit, one component per "
             "pixel, Gaussian last step); "
             "`gms-adan / pixel`: 25 ADAN iterations, one component per pixel. EDM-SDE runs the paper's VP settings "
             "(S_churn 30, S_tmin 0.01, S_tmax 1, S_noise 1.007); off-grid noise levels are rounded to the nearest "
             "trained one.", ""]
    for b in args.budgets:
        lines += [f"## NFE budget {b}", ""] + study.table(results[b], budget_cells[b]) + [""]
    lines += ["## Gotta Go Fast", "",
              "GGF's calls are adaptive (per sample; NFE = mean over samples, including the final denoising call). "
              "Even at a loose tolerance (eps_rel 0.5; the default 0.01 takes ~350 calls here) it needs ~45 calls "
              "on this model, so it cannot be run at NFE 10 or 20. "
              + (f"It is compared with the one-call rows at a budget of {args.ggf_budget}." if args.ggf_compare else
                 "Compare it with the NFE-20 table above: it uses more than twice their calls."), ""]
    lines += study.table(results["ggf"], ggf_cells(args)) + [""]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
