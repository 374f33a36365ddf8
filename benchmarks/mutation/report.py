"""Summarize a mutmut run: per-module counts and every surviving mutant with its diff.

Run from the folder that holds mutants/ (the worktree benchmarks/mutation/run.sh made), with the
Python that ran mutmut:  python benchmarks/mutation/report.py [--diffs] > summary.md

With --sample LIST (a file of mutant names, one a line, from sample.py) the counts are of those mutants
only, and the score comes with its 95% Wilson interval (the sample's score as an estimate of the whole
population it was drawn from).
"""
from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code

COLUMNS = ("killed", "survived", "timeout", "no tests", "suspicious", "segfault", "not checked")


def load(root: Path = Path("mutants")) -> dict[str, dict[str, str]]:
    """{source file: {mutant name: status}} from mutmut's .meta files."""
    out = {}
    for meta in sorted(root.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        source = str(meta.relative_to(root))[: -len(".meta")]
        out[source] = {name: status_by_exit_code[code] for name, code in codes.items()}
    return out


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion k / n."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half, centre + half)


def changed_lines(name: str, source: str) -> str:
    """The -/+ lines of a mutant's diff, joined by ' => '."""
    diff = get_diff_for_mutant(name, path=source).splitlines()
    removed = [line[1:].strip() for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff if line.startswith("+") and not line.startswith("+++")]
    return " / ".join(removed) + " => " + " / ".join(added)


def main() -> None:
    data = load()
    sample = None
    if "--sample" in sys.argv:
        names = Path(sys.argv[sys.argv.index("--sample") + 1]).read_text().split()
        sample = set(names)
        data = {src: {n: st for n, st in sts.items() if n in sample} for src, sts in data.items()}
        data = {src: sts for src, sts in data.items() if sts}
    interval = " | 95% Wilson interval" if sample is not None else ""
    print("| module | mutants | " + " | ".join(COLUMNS) + " | score (killed + timeout) / (checked)" + interval + " |")
    print("|---|---:|" + "---:|" * len(COLUMNS) + "---:|" + ("---:|" if sample is not None else ""))
    total = Counter()
    for source, statuses in data.items():
        c = Counter(statuses.values())
        total.update(c)
        checked = sum(c.values()) - c["not checked"]
        score = f"{100 * (c['killed'] + c['timeout']) / checked:.1f}%" if checked else "-"
        print(f"| {source} | {len(statuses)} | " + " | ".join(str(c[k]) for k in COLUMNS) + f" | {score} |"
              + (f" {_interval(c)} |" if sample is not None else ""))
    checked = sum(total.values()) - total["not checked"]
    score = f"{100 * (total['killed'] + total['timeout']) / checked:.1f}%" if checked else "-"
    print(f"| **all** | {sum(total.values())} | " + " | ".join(str(total[k]) for k in COLUMNS) + f" | {score} |"
          + (f" {_interval(total)} |" if sample is not None else ""))
    if "--diffs" in sys.argv:
        print()
        for source, statuses in data.items():
            for name, status in statuses.items():
                if status in ("survived", "no tests", "suspicious"):
                    print(f"- `{name}` ({status}): `{changed_lines(name, source)}`")


def _interval(c: Counter) -> str:
    checked = sum(c.values()) - c["not checked"]
    if not checked:
        return "-"
    lo, hi = wilson(c["killed"] + c["timeout"], checked)
    return f"{100 * lo:.1f}-{100 * hi:.1f}%"


if __name__ == "__main__":
    main()
