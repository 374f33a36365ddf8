"""Rerun chosen test files against each surviving mutant of a finished mutmut run, without a new
stats collection: mutmut's trampolines pick the mutant named by MUTANT_UNDER_TEST.

Run from the folder that holds mutants/ (after copying the new test files into mutants/tests/):
    python benchmarks/mutation/recheck.py [--mutants LIST] tests/test_mutation_survivors.py [more test files]
Prints one line per survivor: killed or still surviving. With ``--mutants LIST`` (a file of mutant names,
one a line) only those are rerun, whatever their status (e.g. to recheck a timeout, or only the survivors
not yet rechecked). A test file argument may carry a node id or be followed by pytest options (``-k ...``).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mutmut.stats import status_by_exit_code

sys.path.insert(0, str(Path(__file__).parent))
from report import load  # noqa: E402


def main() -> None:
    tests = sys.argv[1:]
    only = None
    if tests[:1] == ["--mutants"]:
        only = Path(tests[1]).read_text().split()
        tests = tests[2:]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    clean = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                           cwd="mutants", env=dict(env, MUTANT_UNDER_TEST=""), capture_output=True)
    if clean.returncode != 0:
        sys.exit(f"the tests fail without a mutant:\n{clean.stdout.decode()[-2000:]}")
    for statuses in load().values():
        for name, status in statuses.items():
            if (status not in ("survived", "no tests")) if only is None else (name not in only):
                continue
            run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                                 cwd="mutants", env=dict(env, MUTANT_UNDER_TEST=name), capture_output=True)
            print(f"{name} ({status}): {'killed' if run.returncode != 0 else 'survives'}", flush=True)


if __name__ == "__main__":
    assert status_by_exit_code[0] == "survived"
    main()
