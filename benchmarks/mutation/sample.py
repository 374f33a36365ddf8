"""Choose a seeded, stratified random sample of mutants: the same fraction of every
source file's mutants, drawn with random.Random(seed) from the names in mutmut's .meta files.

Run from the folder that holds mutants/ (after `mutmut run` has generated the mutants, e.g. with a
pattern that matches nothing new), with the Python that runs mutmut:

    python benchmarks/mutation/sample.py --fraction 0.2 --seed 0 gms_kernels/models > sample.txt
    mutmut run --max-children 1 $(cat sample.txt)

Prints one mutant name a line; the per-stratum counts go to stderr. The draw depends only on the set of
mutant names, the fraction, the strata and the seed (names are sorted before the draw), so it is reproducible.
``--by function`` makes every function (method) its own stratum instead of every file; ``--unchecked`` draws
only among the mutants mutmut has not decided yet (to sample the rest of a stopped run).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from pathlib import Path


def mutant_names(meta: Path, unchecked: bool = False) -> list[str]:
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return sorted(name for name, code in codes.items() if not unchecked or code is None)


def function_of(name: str) -> str:
    """gms_kernels.solvers.x_resolve_options__mutmut_12 -> gms_kernels.solvers.x_resolve_options"""
    return re.sub(r"__mutmut_\d+$", "", name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", help="source folders or files under mutants/, e.g. gms_kernels/models")
    ap.add_argument("--fraction", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", default="mutants")
    ap.add_argument("--by", choices=("file", "function"), default="file", help="the strata")
    ap.add_argument("--unchecked", action="store_true", help="only mutants not yet decided")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    metas = []
    for folder in args.folders:
        p = Path(args.root) / folder
        metas += [p.with_name(p.name + ".meta")] if p.suffix == ".py" else sorted(p.rglob("*.py.meta"))
    strata: dict[str, list[str]] = {}
    for meta in metas:
        for name in mutant_names(meta, args.unchecked):
            key = str(meta.relative_to(args.root)) if args.by == "file" else function_of(name)
            strata.setdefault(key, []).append(name)
    total = 0
    for key, names in strata.items():
        k = math.ceil(args.fraction * len(names))  # every stratum with mutants gets at least one
        chosen = sorted(rng.sample(names, k))
        total += k
        print(f"{key}: {k} of {len(names)}", file=sys.stderr)
        for name in chosen:
            print(name)
    print(f"sampled {total} of {sum(map(len, strata.values()))}", file=sys.stderr)


if __name__ == "__main__":
    main()
