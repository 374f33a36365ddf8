"""The kernels' one source through another compiler and onto other ISAs (one vector code path that
every compiler vectorises), with Clang from the ``ziglang`` wheel (no system Clang or
cross toolchain needed):

    pip install -e ".[test,cross]"        # ziglang, and the test dependencies for --test
    python benchmarks/cross_compile.py [--test]

1. Compiles csrc/step_target.cpp with Clang (``-Wall -Werror``) for each target setup.py builds on
   x86-64 (avx512, avx2, sse2) and for aarch64 (NEON, the ``baseline`` target of ARM builds), and counts
   the vector instructions in the assembly: packed fused multiply-adds and square roots at the
   target's full width show that the vector-extension code became vector code there.
2. With ``--test``: builds the whole extension with Clang into a temporary copy of the repository
   (setup.py with CC/CXX pointing at zig's Clang; GCC's -march spellings translated) and runs the C++
   backend's test files against it (the float64 reference, every target forced in turn).

Prints a Markdown table (benchmarks/results/cross-compile.md holds one).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# name, zig target, CPU, vector bytes, {instruction kind: regex of its full-width form}
TARGETS = [
    ("avx512", "x86_64-linux-gnu", "x86_64_v4", 64, {"fma": r"vfn?m(add|sub)\d+p[sd]\s.*%zmm", "sqrt": r"vsqrtp[sd]\s.*%zmm"}),
    ("avx2", "x86_64-linux-gnu", "x86_64_v3", 32, {"fma": r"vfn?m(add|sub)\d+p[sd]\s.*%ymm", "sqrt": r"vsqrtp[sd]\s.*%ymm"}),
    ("sse2", "x86_64-linux-gnu", "x86_64", 16, {"fma": r"^\s*(mul|add)p[sd]\s", "sqrt": r"sqrtp[sd]\s"}),
    ("neon (aarch64)", "aarch64-linux-gnu", "generic", 16, {"fma": r"fml[as]\s+v\d+\.(2d|4s)", "sqrt": r"fsqrt\s+v\d+\.(2d|4s)"}),
]
# what the sse2 row counts: x86-64's baseline has no FMA, so its packed multiplies and adds
ROW_NOTE = {"sse2": "packed mul/add (no FMA in x86-64's baseline)"}


def zig() -> list[str]:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        sys.exit("needs Clang from the ziglang wheel: pip install -e \".[cross]\" (or pip install ziglang)")
    return [sys.executable, "-m", "ziglang"]


def compile_target(target: str, cpu: str, vbytes: int, out: Path) -> tuple[int, str]:
    """(return code, compiler messages) of the kernels compiled to assembly for one target."""
    cmd = zig() + ["c++", "-target", target, f"-mcpu={cpu}", "-O3", "-std=c++17", "-Wall", "-Werror", "-Wno-unused-command-line-argument",
                   "-fno-math-errno", "-fopenmp-simd", "-DGMS_OPENMP_SIMD=1", "-DGMS_TARGET_NS=t",
                   f"-DGMS_VBYTES={vbytes}", f"-I{REPO / 'csrc'}", "-S", "-o", str(out), str(REPO / "csrc/step_target.cpp")]
    run = subprocess.run(cmd, capture_output=True, text=True)
    return run.returncode, run.stderr.strip()


def count(asm: Path, pattern: str) -> int:
    rx = re.compile(pattern)
    return sum(1 for line in asm.read_text(errors="replace").splitlines() if rx.search(line))


WRAPPER = '''#!{python}
"""zig's Clang as a drop-in gcc for setup.py (GCC's -march spellings as zig's -mcpu names)."""
import subprocess, sys
args = []
for a in sys.argv[1:]:
    if a.startswith("-march="):
        args.append("-mcpu=" + a.split("=", 1)[1].replace("-", "_"))
    elif not a.startswith("-mtune="):
        args.append(a)
sys.exit(subprocess.call([{python!r}, "-m", "ziglang", {mode!r}, "-target", "x86_64-linux-gnu.2.28"] + args))
'''


def build_and_test(tests: list[str]) -> tuple[int, str]:
    """Build the extension with Clang in a temporary copy of the repository and run ``tests`` there."""
    zig()
    with tempfile.TemporaryDirectory(prefix="gms_clang_") as tmp:
        tmp = Path(tmp)
        copy = tmp / "repo"
        shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.so", "gms_out", "mutants"))
        env = dict(os.environ)
        for mode, name in (("cc", "cc"), ("c++", "cxx")):
            path = tmp / name
            path.write_text(WRAPPER.format(python=sys.executable, mode=mode))
            path.chmod(0o755)
        env.update(CC=str(tmp / "cc"), CXX=str(tmp / "cxx"), LDSHARED=f"{tmp / 'cxx'} -shared")
        build = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=copy, env=env,
                               capture_output=True, text=True)
        if not list((copy / "gms_kernels").glob("_C*.so")):
            return 1, "the Clang build failed:\n" + build.stdout[-3000:] + build.stderr[-3000:]
        env.update(PYTHONPATH=str(copy), CI="true")
        check = subprocess.run([sys.executable, "-c", "import gms_kernels._C as C, gms_kernels.kernels as k; "
                                "print(C.__file__); print(k.cpu_info())"], cwd=copy, env=env, capture_output=True, text=True)
        test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=copy,
                              env=env, capture_output=True, text=True)
        return test.returncode, check.stdout + test.stdout[-1500:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--test", action="store_true", help="also build the extension with Clang and run the C++ tests")
    ap.add_argument("--tests", nargs="+", default=["tests/kernels/test_cpp_backend.py", "tests/kernels/test_cpu_targets.py",
                                                   "tests/solvers/test_references.py", "tests/sampling/test_reproducibility.py"])
    args = ap.parse_args()
    version = subprocess.run(zig() + ["c++", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"Clang: {version} (ziglang); `python benchmarks/cross_compile.py{' --test' if args.test else ''}`\n")
    print("| target | Clang -Wall -Werror | full-width packed FMA | full-width packed sqrt |")
    print("|---|---|---|---|")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for name, target, cpu, vbytes, patterns in TARGETS:
            asm = Path(tmp) / f"{name.split()[0]}.s"
            rc, messages = compile_target(target, cpu, vbytes, asm)
            failed |= rc != 0
            if rc != 0:
                print(f"| {name} | **fails**: {messages.splitlines()[0] if messages else rc} | | |")
                continue
            fma = f"{count(asm, patterns['fma'])}" + (f" ({ROW_NOTE[name]})" if name in ROW_NOTE else "")
            print(f"| {name} | compiles | {fma} | {count(asm, patterns['sqrt'])} |")
    if args.test:
        rc, out = build_and_test(args.tests)
        failed |= rc != 0
        print(f"\nThe extension built with Clang, tests {' '.join(args.tests)} (CI=true):\n\n```\n{out.strip()}\n```")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
