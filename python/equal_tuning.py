"""Every sampler tuned on the same variance-scale grid on validation seeds and reported on test seeds
(studies.protocol), on one testbed; writes the results tables.

    nice -n 5 python python/equal_tuning.py --testbed smooth --out python/results/smooth_density.md
    nice -n 5 python python/equal_tuning.py --testbed digits --out python/results/equal_tuning_digits.md \
        --last-step python/results/last_step.md --skew-shrinkage python/results/skew_shrinkage.md
    nice -n 5 python python/equal_tuning.py --testbed patches --out python/results/equal_tuning_patches.md

Cells are cached in gms_out/equal-tuning-<testbed>.json (a rerun resumes; with the cache full, it only writes the
tables). The file written holds the protocol, the tables and the command; its question and answer are written by
hand above and below them.
"""
from __future__ import annotations

import argparse
import math
import shlex
import subprocess
import sys

import torch

from gms_kernels.core.devices import machine_note
from gms_kernels.eval.metrics import paired_difference, seed_interval
from studies import protocol as P

METRIC_NAMES = {"fd": "FD-digits", "fd_dct": "FD-|DCT|", "pixel_w1": "per-pixel marginal W1",
                "dct_w1": "marginal W1 of the signed DCT coefficients"}
ROW_NAMES = {"sn-ddpm": "SN-DDPM", "gms closed/pixel": "GMS closed, per pixel", "gms closed/sample":
             "GMS closed, per image", "control-rank1": "rank-one covariance control", "ddpm": "DDPM",
             "ddim": "DDIM", "dpmpp-2m-sde": "DPM-Solver++(2M) SDE", "euler-ancestral": "Euler ancestral"}


def _decimals(values: list[float]) -> int:
    typical = sorted(abs(v) for v in values)[len(values) // 2] or 1.0
    return max(2, 2 - math.floor(math.log10(typical)))


def _interval(i, d: int, sign: bool = False) -> str:
    f = f"{{:{'+' if sign else ''}.{d}f}}"
    return f"{f.format(i.mean)} [{f.format(i.low)}, {f.format(i.high)}]"


def _diff(diff, d: int) -> str:
    return _interval(diff[0], d, sign=True) + (" *" if diff[1] else "")


def _paired(a: list[float], b: list[float], d: int) -> str:
    """a minus b, paired over the seeds, formatted with its interval."""
    return _diff(paired_difference(a, b), d)


def _footer() -> str:
    return f"**Command.** `nice -n 5 python {command()}`\n\nMachine: {machine_note()}. Commit: {commit()}.\n"


def row_title(name: str, protocol: P.Protocol) -> str:
    if name == P.DEFAULT:
        base, c = protocol.default.rsplit(" c=", 1)
        return f"GMS, the model's default options (= {ROW_NAMES[base]}, c = {c})"
    return ROW_NAMES[name]


def main_table(protocol: P.Protocol, choices: dict, results: P.Results, metric: str, reference: str) -> str:
    summary = P.test_summary(results, protocol, choices, metric, reference)
    d = _decimals([r.interval.mean for r in summary.values()])
    steps = list(choices)
    lines = ["| row | c at K = " + " / ".join(map(str, steps)) + " | "
             + " | ".join(f"K = {k}" for k in steps) + " |", "|---|---|" + "---|" * len(steps)]
    for name in choices[steps[0]].rows(protocol):
        cs = " / ".join(f"{choices[k].c[name]:g}" if name in protocol.families else "-" for k in steps)
        cells = []
        for k in steps:
            r = summary[(name, k)]
            rel = "best validated Gaussian" if r.minus_gaussian is None else _diff(r.minus_gaussian, d)
            cells.append(f"{_interval(r.interval, d)}<br>{rel}")
        lines.append(f"| {row_title(name, protocol)} | {cs} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def default_table(protocol: P.Protocol, choices: dict, results: P.Results, metric: str, reference: str) -> str:
    summary = P.test_summary(results, protocol, choices, metric, reference)
    d = _decimals([r.interval.mean for r in summary.values()])
    steps = list(choices)
    lines = ["| default minus | " + " | ".join(f"K = {k}" for k in steps) + " |", "|---|" + "---|" * len(steps)]
    for name in choices[steps[0]].rows(protocol):
        if name == P.DEFAULT:
            continue
        cells = [("same cell" if summary[(name, k)].default_minus is None else
                  _diff(summary[(name, k)].default_minus, d)) for k in steps]
        lines.append(f"| {row_title(name, protocol)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdicts(protocol: P.Protocol, choices: dict, results: P.Results) -> str:
    """One line per K: each GMS row against the best validated Gaussian on the primary metric."""
    summary = P.test_summary(results, protocol, choices, protocol.primary, "test")
    out = []
    for k, choice in choices.items():
        parts = [f"{row_title(n, protocol)} {P.verdict(summary[(n, k)].minus_gaussian)}"
                 for n in (P.DEFAULT, "gms closed/pixel", "gms closed/sample")]
        rows = choice.rows(protocol)
        per_image, control = ([results[(rows[n], k, s)][f"test/{protocol.primary}"] for s in protocol.test_seeds]
                              for n in ("gms closed/sample", "control-rank1"))
        diff = paired_difference(per_image, control)
        d = _decimals([summary[(n, k)].interval.mean for n in rows])
        out.append(f"- K = {k}: best validated Gaussian `{choice.gaussian}`, best validated baseline "
                   f"`{choice.baseline}`; against the best validated Gaussian: " + "; ".join(parts)
                   + f". GMS per image minus the rank-one control (each at its c): {_diff(diff, d)}.")
    return "\n".join(out)


def command() -> str:
    """The command that samples these tables (without the flags that only read the cache or quiet the log)."""
    return " ".join(shlex.quote(a) for a in sys.argv if a not in ("--report-only", "--quiet"))


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "python/studies", "python/equal_tuning.py"],
                           capture_output=True, text=True).stdout.strip()
    return head + (" with uncommitted study code" if dirty else "")


def report(pbed: P.ProtocolBed, protocol: P.Protocol, choices: dict, results: P.Results) -> str:
    bed = pbed.bed
    metrics = [protocol.primary, *[m for m in bed.metrics if m != protocol.primary]]
    parts = [
        "**Protocol.** " + f"Testbed `{bed.name}` (model tag `{bed.tag}`): {pbed.notes}. "
        f"{protocol.n_samples} samples per cell, K = {', '.join(map(str, protocol.steps))} steps at K + 1 network "
        f"calls (solvers with more calls per step take fewer steps), linear schedule T = 1000, even trajectory, "
        f"data range {pbed.data_range}. Grid: c in {{{', '.join(f'{c:g}' for c in protocol.grid)}}} for SN-DDPM, "
        "GMS per pixel, GMS per image and the rank-one covariance control; DDPM, DDIM, DPM-Solver++(2M) SDE and "
        "Euler ancestral take no c. Every cell on validation seeds "
        f"{', '.join(map(str, protocol.validation_seeds))} against the validation reference; per family and K the "
        f"c with the lowest validation mean of {METRIC_NAMES[protocol.primary]}; the best validated Gaussian "
        "(DDPM or SN-DDPM at its c) and the best validated baseline likewise. Reported: test seeds "
        f"{', '.join(map(str, protocol.test_seeds))} (never used for a choice) against the test reference: mean "
        "[95% Student-t interval], and below it the paired per-seed difference to the best validated Gaussian "
        "[95% interval] (`*`: significant).",
        f"**{METRIC_NAMES[protocol.primary]}, test** (lower is better).",
        main_table(protocol, choices, results, protocol.primary, "test"),
        f"**The default minus each row** ({METRIC_NAMES[protocol.primary]}, test, paired over the test seeds).",
        default_table(protocol, choices, results, protocol.primary, "test"),
        "**Per K.**\n" + verdicts(protocol, choices, results),
    ]
    for m in metrics[1:]:
        parts += [f"**{METRIC_NAMES[m]}, test** (same rows and c; nothing chosen on this metric).",
                  main_table(protocol, choices, results, m, "test")]
    if any(key.startswith("generalisation/") for key in next(iter(results.values()))):
        parts += [f"**Generalisation (other photos): {METRIC_NAMES[protocol.primary]} against "
                  '`gk.data.patches("test")`** (same cells).',
                  main_table(protocol, choices, results, protocol.primary, "generalisation")]
    return "\n\n".join(parts) + "\n\n" + _footer()


def last_step_report(pbed: P.ProtocolBed, protocol: P.Protocol, choices: dict, results: P.Results) -> str:
    key = f"test/{protocol.primary}"
    steps = list(choices)
    rows = {k: P.last_step_rows(choices[k]) for k in steps}
    values = {(label, k): [results[(label, k, s)][key] for s in protocol.test_seeds]
              for k in steps for label in [choices[k].gaussian, *(label for label, _ in rows[k].values())]}
    d = _decimals([sum(v) / len(v) for v in values.values()])
    lines = ["| row | c at K = " + " / ".join(map(str, steps)) + " | " + " | ".join(f"K = {k}" for k in steps)
             + " |", "|---|---|" + "---|" * len(steps)]
    for name in rows[steps[0]]:
        family = name.split(",")[0]
        cells = []
        for k in steps:
            label, against = rows[k][name]
            rel = ("(the library's cap: the reference)" if label == against else
                   _paired(values[(label, k)], values[(against, k)], d)
                   + ("" if against == rows[k][f"{family}, cap at 256 levels"][0] else " (against cap none)"))
            best = ("best validated Gaussian" if label == choices[k].gaussian else "minus the best validated "
                    f"Gaussian: {_paired(values[(label, k)], values[(choices[k].gaussian, k)], d)}")
            cells.append(f"{_interval(seed_interval(values[(label, k)]), d)}<br>{rel}<br>{best}")
        lines.append(f"| {name} | " + " / ".join(f"{choices[k].c[family]:g}" for k in steps) + " | "
                     + " | ".join(cells) + " |")
    return (f"**Protocol.** Testbed `{pbed.bed.name}` (model tag `{pbed.bed.tag}`), {pbed.notes}; each family at "
            "the c it was validated at (python/results/equal_tuning_digits.md); test seeds "
            f"{', '.join(map(str, protocol.test_seeds))}, {protocol.n_samples} samples per cell, "
            f"{METRIC_NAMES[protocol.primary]} against the test reference: mean [95% interval], and below it the "
            "paired difference to the same family with the library's cap (256 levels), or for the mixture last step to "
            "the same family with no cap, the Gaussian last step it replaces, then the paired difference to the best "
            "validated Gaussian of the equal-tuning table [95% intervals] (`*`: significant).\n\n" + "\n".join(lines)
            + "\n\n" + _footer())


def skew_report(pbed: P.ProtocolBed, protocol: P.Protocol, choices: dict, chosen: dict, tables: dict,
                results: P.Results) -> str:
    key = f"test/{protocol.primary}"
    steps = list(choices)

    def values(label: str, k: int) -> list[float]:
        return [results[(label, k, s)][key] for s in protocol.test_seeds]

    rows = {k: {"GMS per pixel, kappa3 x lambda(t)": P.family_label(P.SKEW_FAMILY, chosen[k]),
                "GMS per pixel": P.family_label("gms closed/pixel", choices[k].c["gms closed/pixel"]),
                "best validated Gaussian": choices[k].gaussian} for k in steps}
    d = _decimals([sum(values(label, k)) / len(protocol.test_seeds) for k in steps for label in rows[k].values()])
    lines = ["| row | K = " + " | K = ".join(map(str, steps)) + " |", "|---|" + "---|" * len(steps)]
    for name in rows[steps[0]]:
        cells = []
        for k in steps:
            label = rows[k][name]
            cell = f"`{label}`<br>{_interval(seed_interval(values(label, k)), d)}"
            if name == "GMS per pixel, kappa3 x lambda(t)":
                for other in ("GMS per pixel", "best validated Gaussian"):
                    cell += f"<br>minus {other}: " + _paired(values(label, k), values(rows[k][other], k), d)
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    factors = ["| K | lambda(t) at t = ... (data step excluded) |", "|---|---|"]
    factors += [f"| {k} | " + ", ".join(f"{t}: {v:.3f}" for t, v in sorted(tables[k].items(), reverse=True)) + " |"
                for k in steps]
    return (f"**Protocol.** Testbed `{pbed.bed.name}` (model tag `{pbed.bed.tag}`), {pbed.notes}. lambda(t): "
            "`gk.calibrate_heads(model, validation reference, moments=\"clamped\", step=T / K)` at every step of "
            "K's trajectory, 8 noise draws per image and t, the slope of r^3 on the skew the fit receives, clipped "
            "to [0, 1] (`HeadCalibration.skew_scale()`). The row GMS per pixel with kappa3 times lambda(t) gets "
            f"the grid c in {{{', '.join(f'{c:g}' for c in protocol.grid)}}}, chosen per K on validation seeds "
            f"{', '.join(map(str, protocol.validation_seeds))} as every family is; reported on test seeds "
            f"{', '.join(map(str, protocol.test_seeds))}, {protocol.n_samples} samples per cell, "
            f"{METRIC_NAMES[protocol.primary]} against the test reference: mean [95% interval] and paired "
            "differences [95% interval] (`*`: significant).\n\n" + "\n".join(lines) + "\n\n" + "\n".join(factors)
            + "\n\n" + _footer())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--testbed", required=True, choices=("smooth", "digits", "patches"))
    p.add_argument("--steps", type=int, nargs="+", default=list(P.STEPS))
    p.add_argument("--out", help="write the tables to this file")
    p.add_argument("--last-step", metavar="FILE", help="then the last-step control at the validated c; its table "
                   "goes to FILE")
    p.add_argument("--skew-shrinkage", metavar="FILE", help="then GMS per pixel with the calibrated skew shrinkage "
                   "lambda(t), tuned on the same grid; its table goes to FILE")
    p.add_argument("--report-only", action="store_true", help="sample nothing: the tables from cached cells")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    pbed = P.protocol_testbed(args.testbed)
    protocol, choices, results = P.run(pbed, args.steps, log=None if args.quiet else print,
                                       sample=not args.report_only)
    text = report(pbed, protocol, choices, results)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    if args.last_step:
        results.update(P.run_last_step(pbed, protocol, choices, log=None if args.quiet else print))
        text = last_step_report(pbed, protocol, choices, results)
        with open(args.last_step, "w") as f:
            f.write(text)
        print(text)
    if args.skew_shrinkage:
        tables = P.calibrated_skew_tables(pbed, protocol.steps)
        chosen, cells = P.run_skew_shrinkage(pbed, protocol, tables, log=None if args.quiet else print)
        results.update(cells)
        text = skew_report(pbed, protocol, choices, chosen, tables, results)
        with open(args.skew_shrinkage, "w") as f:
            f.write(text)
        print(text)


if __name__ == "__main__":
    main()
