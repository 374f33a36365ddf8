"""The installed C++ kernels against those of an earlier commit, or against ablated builds of the
working tree, side by side in one process.

    python benchmarks/compare_build.py --commit b623af6 [--rounds 8] [--threads 2]
    python benchmarks/compare_build.py --ablate cbrt sqrt --target avx2 [--threads 1]
    python benchmarks/compare_build.py --without-flag -fno-predictive-commoning --target avx2
    python benchmarks/compare_build.py --against HEAD --target avx2

``--commit``: builds the earlier commit's csrc/ (with the flags setup.py used then: -march=native
-mprefer-vector-width=512, renamed to the module ``_C_<commit>`` so that both load together) into a
temporary directory, then times the kernel alone (closed, ADAN-25, sn-ddpm on 307,200 elements)
with both extensions in turns: the current one on each target it runs, the earlier one as built.
Prints a Markdown table (fastest / median call and the ratio to the earlier build).

``--ablate``: where the closed step's time goes. Builds the working tree's csrc/ for one target
(``--target``: avx2 or avx512, the flags of setup.py) once as it is and once per named part replaced
by the identity (ABLATIONS: the results are wrong, only their time counts), and times them against
each other, the first being the baseline. The installed extension is not used.

``--against``: the csrc/ of a revision and of the working tree, both built for one target as setup.py
builds it, timed against each other in the same way (the revision first, as the baseline).

``--without-flag``: the working tree's csrc/ for one target built as setup.py builds it and once without one of
its compiler flags (COMMON), timed against each other in the same way.
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


# part: (text in csrc/step_target.cpp, its replacement by the identity)
ABLATIONS = {
    "cbrt": ("    cbrt_w<W>(t, delta);\n", "    GMS_EACH delta[j] = t[j];\n"),  # the closed fit's cube root
    "sqrt": ("    GMS_EACH sq[j] = sqrt_pos(t[j]);", "    GMS_EACH sq[j] = t[j];"),  # the closed draw's sqrt
}
# one target's flags, as setup.py compiles it (X86_TARGETS), built as the single "baseline" target
TARGET_FLAGS = {"avx512": (["-march=x86-64-v4", "-mprefer-vector-width=512"], 64), "avx2": (["-march=x86-64-v3"], 32)}
COMMON = ["-O3", "-fno-math-errno", "-Wno-unknown-pragmas", "-fno-wrapv", "-fno-predictive-commoning", "-fopenmp",
          "-fvisibility=hidden", "-std=c++17", "-fPIC"]


def _write_sources(files: dict[str, str], name: str, out: Path) -> Path:
    """csrc files (path -> text) written under out, the module renamed to `name`; the csrc folder."""
    for f, text in files.items():
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        (out / f).write_text(text.replace("PYBIND11_MODULE(_C, m)", f"PYBIND11_MODULE({name}, m)"))
    return out / "csrc"


def _includes(src: Path) -> list[str]:
    import pybind11

    return [f"-I{sysconfig.get_paths()['include']}", f"-I{pybind11.get_include()}", f"-I{src}"]


def csrc_files(commit: str | None = None) -> dict[str, str]:
    """csrc/ (path -> text) of the working tree, or of `commit`."""
    if commit is None:
        return {str(f.relative_to(REPO)): f.read_text() for f in (REPO / "csrc").iterdir()}
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, check=True, capture_output=True, text=True).stdout
    return {f: git("show", f"{commit}:{f}") for f in git("ls-tree", "--name-only", commit, "csrc/").split()}


def build_previous(commit: str, out: Path) -> Path:
    """The extension of `commit`, compiled as module _C_<commit> into out; its path."""
    name = f"_C_{commit}"
    src = _write_sources(csrc_files(commit), name, out)
    so = out / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["g++", "-O3", "-march=native", "-mprefer-vector-width=512", "-fno-math-errno", "-fno-wrapv",
                    "-fopenmp", "-fvisibility=hidden", "-std=c++17", "-shared", "-fPIC", *_includes(src),
                    str(src / "gms_step.cpp"), "-o", str(so)], check=True)
    return so


def build_target(files: dict[str, str], name: str, target: str, out: Path, without: str | None = None) -> Path:
    """csrc/ `files` compiled for one target with setup.py's flags (without the flag `without` of
    COMMON), as the single "baseline" target of module `name` in out; its path."""
    common = [f for f in COMMON if f != without]
    src = _write_sources(files, name, out / name)
    flags, vbytes = TARGET_FLAGS[target]
    obj = out / f"{name}-target.o"
    subprocess.run(["g++", *common, *flags, "-mtune=native", "-DGMS_TARGET_NS=baseline", f"-DGMS_VBYTES={vbytes}",
                    f"-I{src}", "-c", str(src / "step_target.cpp"), "-o", str(obj)], check=True)
    so = out / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["g++", *common, "-shared", *_includes(src), str(src / "gms_step.cpp"), str(obj), "-o", str(so)],
                   check=True)
    return so


def build_ablated(part: str | None, target: str, out: Path) -> Path:
    """The working tree's extension for one target, with `part` (a key of ABLATIONS) replaced by the
    identity, or as it is (None), compiled as module _C_<part or 'as_is'> into out; its path."""
    files = csrc_files()
    if part is not None:
        old, new = ABLATIONS[part]
        assert files["csrc/step_target.cpp"].count(old) == 1, f"the {part} line moved: update ABLATIONS"
        files["csrc/step_target.cpp"] = files["csrc/step_target.cpp"].replace(old, new)
    return build_target(files, f"_C_{part or 'as_is'}", target, out)


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
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--commit")
    what.add_argument("--against", metavar="REV")
    what.add_argument("--ablate", nargs="+", choices=sorted(ABLATIONS))
    what.add_argument("--without-flag", choices=COMMON)
    p.add_argument("--target", choices=sorted(TARGET_FLAGS), default="avx2",
                   help="(--against, --ablate, --without-flag) the target built")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    current = importlib.import_module("gms_kernels._C")
    with tempfile.TemporaryDirectory() as tmp:
        if args.commit:
            earlier = Earlier(load(build_previous(args.commit, Path(tmp))), extra_args=3)
            builds = [(f"{args.commit} (as built)", earlier, None)] + [
                (f"now, {t}", current, t) for t in current.cpu_info()["supported"]]
        elif args.against:
            builds = [(f"{args.target}, {args.against}",
                       load(build_target(csrc_files(args.against), "_C_rev", args.target, Path(tmp))), None),
                      (f"{args.target}, working tree", load(build_ablated(None, args.target, Path(tmp))), None)]
        elif args.without_flag:
            builds = [(f"{args.target}, as setup.py builds it", load(build_ablated(None, args.target, Path(tmp))), None),
                      (f"{args.target}, without {args.without_flag}",
                       load(build_target(csrc_files(), "_C_without", args.target, Path(tmp), args.without_flag)),
                       None)]
        else:
            builds = [(f"{args.target}, {part or 'as it is'}" + (" replaced by the identity" if part else ""),
                       load(build_ablated(part, args.target, Path(tmp))), None) for part in [None, *args.ablate]]
    schedule = gk.Schedule.linear()
    x_t, out = make_inputs(SIZES["cifar10-b100"])
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
