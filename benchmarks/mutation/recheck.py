"""Rerun chosen test files against each surviving mutant of a finished mutmut run, without a new
stats collection: mutmut's trampolines pick the mutant named by MUTANT_UNDER_TEST.

Run from the folder that holds mutants/ (after copying the new test files into mutants/tests/):
    python benchmarks/mutation/recheck.py [--mutants LIST] tests/core/test_fit.py [more test files]
Prints one line per survivor: killed or still surviving. With ``--mutants LIST`` (a file of mutant names,
one a line) only those are rerun, whatever their status (e.g. to recheck a timeout, or only the survivors
not yet rechecked). A test file argument may carry a node id or be followed by pytest options (``-k ...``).
With ``--fork`` (after ``--mutants LIST`` if both) the tests run in a child forked, for each mutant, from one
process that has imported pytest, torch and the mutated package but run nothing (as mutmut's forkserver does):
no per-mutant interpreter start, and no cache filled by one mutant's run is seen by the next.

``python benchmarks/mutation/recheck.py --generate``, run in a worktree of a commit (extension built), only writes
mutants/ (every mutant of the settings' modules, all "not checked") without mutmut's stats run over the whole
selection; then ``--mutants LIST --fork ...`` runs the chosen ones.
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
    if tests == ["--generate"]:
        return generate()
    only = None
    if tests[:1] == ["--mutants"]:
        only = Path(tests[1]).read_text().split()
        tests = tests[2:]
    if tests[:1] == ["--fork"]:
        return forked(tests[1:], only)
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


def generate() -> None:
    import mutmut.__main__ as mutmut_main

    mutmut_main.set_mutant_under_test("mutant_generation")
    for folder in ("mutants/benchmarks", "mutants/csrc"):  # where also_copy puts its files (as run.sh does)
        os.makedirs(folder, exist_ok=True)
    mutmut_main.copy_src_dir()
    mutmut_main.copy_also_copy_files()
    mutmut_main.setup_source_paths()
    mutmut_main.store_lines_covered_by_tests()
    print(mutmut_main.create_mutants(os.cpu_count() or 1))


def forked(tests: list[str], only: list[str] | None, limit_s: float = 300.0) -> None:
    import signal
    import time

    todo = [(name, status) for statuses in load().values() for name, status in statuses.items()
            if ((status in ("survived", "no tests")) if only is None else (name in only))]
    os.environ["OMP_NUM_THREADS"] = "1"
    os.chdir("mutants")
    sys.path.insert(0, os.getcwd())
    import pytest
    import torch  # noqa: F401
    import gms_kernels  # noqa: F401  (the mutated copy: mutants/ is first on sys.path)
    assert gms_kernels.__file__.startswith(os.getcwd()), gms_kernels.__file__
    for module in ("diffusers", "gms_kernels.integrations.scheduler", "gms_kernels.models"):  # slow imports, once
        try:
            __import__(module)
        except ImportError:
            pass

    def run(name: str) -> int:
        pid = os.fork()
        if pid == 0:
            os.environ["MUTANT_UNDER_TEST"] = name
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os._exit(int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests])))
        start = time.time()
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if time.time() - start > limit_s:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return -9
            time.sleep(0.05)

    if run("") != 0:
        sys.exit("the tests fail without a mutant")
    for name, status in todo:
        code = run(name)
        verdict = "survives" if code == 0 else ("timeout (killed after %.0f s)" % limit_s if code == -9 else "killed")
        print(f"{name} ({status}): {verdict}", flush=True)


if __name__ == "__main__":
    assert status_by_exit_code[0] == "survived"
    main()
