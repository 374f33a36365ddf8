"""The portable build of the C++ extension (GMS_KERNELS_PORTABLE=1: no -march=native / -mtune=native,
as for wheels moved to other machines) picks the best CPU target this machine runs at import and
passes the same backend tests as the native build, run whole on a lower target forced with
GMS_KERNELS_CPU_TARGET: one rerun of tests/kernels/test_cpp_backend.py covers both the portable
flags and a target below the best (the default run's own pass covers the native build's best).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gms_kernels
from gms_kernels.kernels import cpu_info

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _lower_target() -> str | None:
    """The target the whole backend suite runs on: AVX2 (the common CPU without AVX-512) where this
    machine runs a wider one, else the next lower target (SSE2 on an AVX2 machine), so the suite runs
    below the best on every x86-64 host; None where the CPU has one target only (e.g. NEON)."""
    lower = [t for t in cpu_info()["supported"] if t != cpu_info()["best"]]
    return "avx2" if "avx2" in lower else (lower[0] if lower else None)


def test_portable_extension_passes_the_cpp_backend_tests_on_a_lower_target(tmp_path):
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.fail("no C++ compiler: the extension cannot be built on this machine")
    env = {**os.environ, "GMS_KERNELS_PORTABLE": "1"}
    build = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "obj")],
        cwd=REPO, env=env, capture_output=True, text=True)
    built = list((tmp_path / "lib" / "gms_kernels").glob("_C*"))
    assert build.returncode == 0 and len(built) == 1, build.stdout[-3000:] + build.stderr[-3000:]
    assert "-march=native" not in build.stderr

    # the installed package with the portable extension in place of the native one
    pkg = tmp_path / "pkg" / "gms_kernels"
    shutil.copytree(Path(gms_kernels.__file__).parent, pkg, ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    shutil.copy2(built[0], pkg / built[0].name)
    # PYTHONPATH puts the copy first; an editable install's import hook would still win, so drop it
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkg")}
    prelude = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
    info = subprocess.run(
        [sys.executable, "-c", prelude + "import gms_kernels, gms_kernels._C as C; print(gms_kernels.__file__, "
         "C.build_info(), C.cpu_info()['target'] == C.cpu_info()['best'] == C.cpu_info()['supported'][0])"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    assert str(pkg) in info and "'kernels': 'portable'" in info and info.strip().endswith("True"), info
    assert "-mtune=native" not in build.stderr

    tests = str(REPO / "tests" / "kernels" / "test_cpp_backend.py")
    target = _lower_target() or cpu_info()["best"]
    run = subprocess.run(
        [sys.executable, "-c", prelude + f"import gms_kernels; assert gms_kernels.__file__.startswith({str(pkg)!r}); "
         f"from gms_kernels.kernels import cpu_info; assert cpu_info()['target'] == {target!r}, cpu_info(); "
         f"import pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', {tests!r}]))"],
        cwd=REPO / "tests", env={**env, "GMS_KERNELS_CPU_TARGET": target}, capture_output=True, text=True)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 100 and "skipped" not in summary, summary
