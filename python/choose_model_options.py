"""Choose the shipped models' own GMS options from the equal-tuning protocol's validation cells, and print the
Markdown report python/results/model_options.md holds.

    python python/choose_model_options.py --out python/results/model_options.md

The candidates: the closed fit with one component per pixel or per image, at each variance scale c of the grid
(c = 1 keeps the step on the fused kernels; other c run the float64 torch step). Their cells are the validation seeds' cells of
python/equal_tuning.py (run it first for each testbed: this script samples nothing). The rule is
gk.choose_options': the lowest mean rank over K = 5, 10, 20 of the validation means (gms_kernels.eval.tuning.mean_ranks),
per model; for the library's own default, over all three testbeds among the candidates at c = 1, since a default
must keep every backend's fused step (the winner at any c is reported beside it).
"""
import argparse
import shlex
import sys
from pathlib import Path

import torch

from gms_kernels.core.devices import machine_note
from gms_kernels.eval.tuning import mean_ranks
from gms_kernels.models.embedded import default_model as digits_model, patches_model
from gms_kernels.solvers import get_solver
from studies import protocol as P

CANDIDATES = {f"closed, per {where}, c = {c:g}": P.family_label(f"gms closed/{select}", c)
              for where, select in (("pixel", "pixel"), ("image", "sample")) for c in P.GRID}
TESTBEDS = ("digits", "patches", "smooth")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the report to this file")
    args = p.parse_args()
    torch.set_num_threads(1)
    scores, names = {}, {}
    for name in TESTBEDS:
        pbed = P.protocol_testbed(name)
        protocol, _, results = P.run(pbed, sample=False, log=None)
        key = f"validation/{protocol.primary}"
        names[name] = f"{name} ({pbed.bed.primary}, seeds {', '.join(map(str, protocol.validation_seeds))})"
        for candidate, label in CANDIDATES.items():
            for k in protocol.steps:
                values = [results[(label, k, s)][key] for s in protocol.validation_seeds]
                scores[(name, candidate, k)] = sum(values) / len(values)
    steps = sorted({k for _, _, k in scores})
    lines = ["| candidate | " + " | ".join(f"{n} K={k}" for n in TESTBEDS for k in steps)
             + " | " + " | ".join(f"rank {n}" for n in TESTBEDS) + " | rank, all |",
             "|---|" + "---|" * (len(TESTBEDS) * len(steps) + len(TESTBEDS) + 1)]
    per_bed = {n: mean_ranks({key: v for key, v in scores.items() if key[0] == n}, list(CANDIDATES))
               for n in TESTBEDS}
    overall = mean_ranks(scores, list(CANDIDATES))
    for candidate in CANDIDATES:
        lines.append(f"| {candidate} | " + " | ".join(f"{scores[(n, candidate, k)]:.3g}" for n in TESTBEDS
                                                      for k in steps)
                     + " | " + " | ".join(f"{per_bed[n][candidate]:.2f}" for n in TESTBEDS)
                     + f" | {overall[candidate]:.2f} |")
    chosen = {n: min(CANDIDATES, key=per_bed[n].get) for n in TESTBEDS}
    # the library's default: ranked among the fused candidates alone
    fused = [name for name in CANDIDATES if name.endswith("c = 1")]
    fused_ranks = mean_ranks({key: v for key, v in scores.items() if key[1] in fused}, fused)
    library = min(fused, key=fused_ranks.get)
    fused_note = ", ".join(f"{name} {fused_ranks[name]:.2f}" for name in fused)
    gms = get_solver("gms").options
    text = "\n".join([
        "# Each shipped model's own GMS options",
        "",
        "**Question.** Which GMS options should each shipped model carry (its `solver_defaults`, used by `gk.sample` "
        "and the command line unless the caller names others), and which the library's default?",
        "",
        "**Protocol.** The candidates: the closed fit with one component per pixel or per image, at each variance "
        "scale c in {1, 1.25, 1.5, 2} (c = 1 runs on the fused kernels, other c on the float64 torch step). Their scores: the validation cells of the equal-tuning protocol "
        "([equal_tuning_digits.md](equal_tuning_digits.md), [equal_tuning_patches.md](equal_tuning_patches.md), "
        "[smooth_density.md](smooth_density.md)): the mean over the validation seeds against the validation "
        "reference, never a test seed. The rule: the lowest mean rank over K = 5, 10, 20 (`gk.choose_options`' rule, "
        "`gms_kernels.eval.tuning.mean_ranks`), per model; for the library's default, over all three testbeds "
        "among the candidates at c = 1, the ones every backend runs fused (a default must keep the fused step). "
        "Testbeds: " + "; ".join(names.values()) + ".",
        "",
        *lines,
        "",
        "**Command.** `python python/choose_model_options.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]) + "`",
        "",
        f"Machine: {machine_note()}.",
        "",
        f"**Answer.** Digits: {chosen['digits']}; patches: {chosen['patches']}; the library's default, among the "
        f"fused candidates over all three testbeds: {library} (mean rank among them: {fused_note}; among all "
        f"candidates the lowest is {min(CANDIDATES, key=overall.get)}, {min(overall.values()):.2f}, which runs on "
        f"the float64 torch step only). Shipped now: digits {digits_model().solver_defaults['gms']}, patches "
        f"{patches_model().solver_defaults['gms']}; the library's default (no model options) is "
        f"fit={gms['fit']!r}, select={gms['select']!r}, variance_scale={gms['variance_scale']:g}.",
        "",
    ])
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
