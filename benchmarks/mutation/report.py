"""Summarize a mutmut run: per-module counts and every surviving mutant with its diff.

Run from the folder that holds mutants/ (the worktree benchmarks/mutation/run.sh made), with the
Python that ran mutmut:  python benchmarks/mutation/report.py [--diffs] > summary.md
"""
from __future__ import annotations

import json
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


def changed_lines(name: str, source: str) -> str:
    """The -/+ lines of a mutant's diff, joined by ' => '."""
    diff = get_diff_for_mutant(name, path=source).splitlines()
    removed = [line[1:].strip() for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff if line.startswith("+") and not line.startswith("+++")]
    return " / ".join(removed) + " => " + " / ".join(added)


def main() -> None:
    data = load()
    print("| module | mutants | " + " | ".join(COLUMNS) + " | score (killed + timeout) / (checked) |")
    print("|---|---:|" + "---:|" * len(COLUMNS) + "---:|")
    total = Counter()
    for source, statuses in data.items():
        c = Counter(statuses.values())
        total.update(c)
        checked = sum(c.values()) - c["not checked"]
        score = f"{100 * (c['killed'] + c['timeout']) / checked:.1f}%" if checked else "-"
        print(f"| {source} | {len(statuses)} | " + " | ".join(str(c[k]) for k in COLUMNS) + f" | {score} |")
    checked = sum(total.values()) - total["not checked"]
    score = f"{100 * (total['killed'] + total['timeout']) / checked:.1f}%" if checked else "-"
    print(f"| **all** | {sum(total.values())} | " + " | ".join(str(total[k]) for k in COLUMNS) + f" | {score} |")
    if "--diffs" in sys.argv:
        print()
        for source, statuses in data.items():
            for name, status in statuses.items():
                if status in ("survived", "no tests", "suspicious"):
                    print(f"- `{name}` ({status}): `{changed_lines(name, source)}`")


if __name__ == "__main__":
    main()
