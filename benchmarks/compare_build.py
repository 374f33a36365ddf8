"""The installed C++ kernels against those of an earlier commit, side by side in one process.

    python benchmarks/compare_build.py --commit b623af6 [--rounds 8] [--threads 2]

Builds the earlier commit's csrc/ (with the flags setup.py used then: -march=native
-mprefer-vector-width=512, renamed to the module ``_C_<commit>`` so that both load together) into a
temporary directory, then times the kernel alone (closed, ADAN-25, sn-ddpm on 307,200 elements)
with both extensions in turns: the current one on each target it runs, the earlier one as built.
Prints a Markdown table (fastest / median call and the ratio to the earlier build).
"""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gms_kernels as gk  # noqa: E402
from cases import SIZES, interleaved_seconds, make_inputs, runner  # noqa: E402
from gms_kernels.kernels import cpp  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
STEPS = {"closed": ("gms", {"fit": "closed"}), "adan-25": ("gms", {"fit": "adan", "fit_iters": 25}),
         "sn-ddpm": ("sn-ddpm", {})}


def build_previous(commit: str, out: Path) -> Path:
    """The extension of `commit`, compiled as module _C_<commit> into out; its path."""
    import pybind11

    name = f"_C_{commit}"
    src = out / "csrc"
    src.mkdir(parents=True)
    files = subprocess.run(["git", "ls-tree", "--name-only", commit, "csrc/"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    for f in files:
        text = subprocess.run(["git", "show", f"{commit}:{f}"], cwd=REPO, check=True, capture_output=True,
                              text=True).stdout
        (out / f).write_text(text.replace("PYBIND11_MODULE(_C, m)", f"PYBIND11_MODULE({name}, m)"))
    so = out / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["g++", "-O3", "-march=native", "-mprefer-vector-width=512", "-fno-math-errno", "-fno-wrapv",
                    "-fopenmp", "-fvisibility=hidden", "-std=c++17", "-shared", "-fPIC",
                    f"-I{sysconfig.get_paths()['include']}", f"-I{pybind11.get_include()}", f"-I{src}",
                    str(src / "gms_step.cpp"), "-o", str(so)], check=True)
    return so


def load(path: Path):
    name = path.name.split(".")[0]
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, str(path), loader=loader))
    loader.exec_module(module)
    return module


class Earlier:
    """An earlier extension behind the current launcher (which passes the FIXED / DDIM scalars last)."""

    def __init__(self, module, extra_args: int):
        self.module, self.extra = module, extra_args

    def fused_step_at(self, *args):
        return self.module.fused_step_at(*args[:len(args) - self.extra])

    def __getattr__(self, name):
        return getattr(self.module, name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--commit", required=True)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    current = importlib.import_module("gms_kernels._C")
    targets = current.cpu_info()["supported"]
    with tempfile.TemporaryDirectory() as tmp:
        earlier = Earlier(load(build_previous(args.commit, Path(tmp))), extra_args=3)
    schedule = gk.Schedule.linear()
    x_t, out = make_inputs(SIZES["cifar10-b100"])
    builds = [(f"{args.commit} (as built)", earlier, None)] + [(f"now, {t}", current, t) for t in targets]
    fns = {}
    for label, ext, target in builds:
        for step, (solver, options) in STEPS.items():
            f = runner("cpp-kernel", step, x_t, out, schedule, options, solver)

            def call(f=f, ext=ext, target=target):
                cpp._ext = ext
                if target is not None:
                    ext.set_target(target)
                return f()
            fns[(label, step)] = call
    times = interleaved_seconds(fns, args.rounds, {k: 5 for k in fns})
    cpp._ext = current
    current.set_target(current.cpu_info()["best"])
    base = builds[0][0]
    print(f"| build | {' | '.join(STEPS)} |\n|---|" + "---|" * len(STEPS))
    for label, _, _ in builds:
        cells = []
        for step in STEPS:
            v, b = times[(label, step)], times[(base, step)]
            cells.append(f"{min(v) * 1e3:.2f} / {statistics.median(v) * 1e3:.2f} ms "
                         f"({min(v) / min(b):.2f}x / {statistics.median(v) / statistics.median(b):.2f}x)")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
