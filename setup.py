"""gms_kernels: fast, correct Gaussian Mixture Solvers for diffusion models.

The optional C++ extension ``gms_kernels._C`` (csrc/, pybind11, torch-free) is built when a C++
compiler works; any failure to build it prints a warning and the package installs without it (the
torch reference path still works). Environment variables:

- ``GMS_KERNELS_PORTABLE=1``: do not add ``-march=native`` / ``-mtune=native`` (for wheels moved to
  other machines);
- ``GMS_KERNELS_NO_EXT=1``: skip the extension altogether.

The kernels (csrc/step_target.cpp) are compiled once per target ISA and linked into the one
extension, which picks the best target the CPU runs at import (``gms_kernels.kernels.cpu_info()``):
on x86-64 ``avx512`` (x86-64-v4), ``avx2`` (x86-64-v3: AVX2, FMA) and ``sse2`` (every x86-64), so
that a portable wheel still runs AVX2 and AVX-512 code where the CPU has it; elsewhere one
``baseline`` target with the compiler's defaults (plus ``-march=native`` unless portable).
"""
import os
import shutil
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_ext import build_ext

try:
    from pybind11.setup_helpers import Pybind11Extension
except ImportError:  # pybind11 comes from pyproject's build requires; without it, no extension
    Pybind11Extension = None

EXT_NAME = "gms_kernels._C"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _warn_without_extension(reason) -> None:
    _say("\n" + "=" * 78 + "\n"
         f"WARNING: gms_kernels: the C++ extension {EXT_NAME} was NOT built ({reason}).\n"
         "The package is installed without it: the 'cpp' backend is unavailable and gms_kernels\n"
         "falls back to the (slower) torch reference. To get it, install a C++ compiler (g++ or\n"
         "clang++) and the Python headers, then reinstall: pip install --force-reinstall .\n"
         + "=" * 78 + "\n")


_OPENMP_PROBE = """
#include <omp.h>
int gms_probe(void) { int s = 0;
#pragma omp parallel for reduction(+:s)
  for (int i = 0; i < 4; ++i) s += i + omp_get_max_threads();
  return s; }
"""
_PLAIN_PROBE = "int gms_probe(void) { return 0; }\n"


# x86-64 targets, best first: (name, flags, vector bytes). Each flag set is checked with the
# compiler; a target it refuses is left out (the others still build).
X86_TARGETS = (
    ("avx512", ["-march=x86-64-v4", "-mprefer-vector-width=512"], 64),
    ("avx2", ["-march=x86-64-v3"], 32),
    ("sse2", ["-march=x86-64"], 16),
)
TARGET_SOURCE = "csrc/step_target.cpp"


def _is_x86_64() -> bool:
    import platform

    return platform.machine().lower() in ("x86_64", "amd64")


class OptionalBuildExt(build_ext):
    """build_ext that adds tested optimisation flags and never fails the install."""

    _warned = False

    def finalize_options(self):
        super().finalize_options()
        # always recompile: the flags depend on the environment (GMS_KERNELS_PORTABLE, the compiler),
        # which an up-to-date check on a reused build/ directory would not see
        self.force = True

    def _give_up(self, exc):
        if not self._warned:  # (an editable install also fails to copy the missing output: say it once)
            _warn_without_extension(f"{type(exc).__name__}: {exc}")
            self._warned = True

    def run(self):
        try:
            super().run()
        except Exception as exc:  # no compiler, failed copy of a missing output, ...
            self._give_up(exc)

    def build_extension(self, ext):
        try:
            if self.compiler.compiler_type != "msvc":
                self._add_unix_flags(ext)
            else:
                openmp = ["/openmp"] if self._accepts(["/openmp"], _OPENMP_PROBE, link=True) else []
                ext.extra_compile_args += ["/O2", "/fp:precise"] + openmp
            super().build_extension(ext)
        except Exception as exc:
            self._give_up(exc)

    def _add_unix_flags(self, ext):
        portable = os.environ.get("GMS_KERNELS_PORTABLE", "0") == "1"
        flags = ["-O3", "-fno-math-errno", "-Wno-unknown-pragmas"]
        if self._accepts(["-fno-wrapv"], _PLAIN_PROBE):
            # Python's CFLAGS carry -fwrapv, which makes int index arithmetic wrap: the compiler
            # must then keep a separate pointer per array in the ADAN loop (spilled: ~25% slower)
            flags.append("-fno-wrapv")
        if self._accepts(["-fno-predictive-commoning"], _PLAIN_PROBE):
            # GCC's predictive commoning keeps the ADAN loop's parameters, loaded in its first pipeline stage,
            # in registers until its third instead of loading them again; with 16 vector registers (AVX2, SSE2)
            # they spill to the stack and rotate there: 4-5% slower on AVX2 (ROOFLINE_NOTES, benchmarks/run_cpu.py)
            flags.append("-fno-predictive-commoning")
        link = []
        if self._accepts(["-fopenmp"], _OPENMP_PROBE, link=True):
            flags.append("-fopenmp")
            link.append("-fopenmp")
        elif self._accepts(["-fopenmp-simd"], _PLAIN_PROBE):
            flags.append("-fopenmp-simd")
            ext.define_macros.append(("GMS_OPENMP_SIMD", "1"))
            _say("gms_kernels: OpenMP is not available with this compiler; building the extension single-threaded")
        # the kernels, once per target, as objects linked into the extension
        if _is_x86_64():
            targets = [t for t in X86_TARGETS if self._accepts(t[1], _PLAIN_PROBE)]
            if [t[0] for t in targets] == [t[0] for t in X86_TARGETS]:
                ext.define_macros.append(("GMS_TARGETS_X86", "1"))
                tune = ["-mtune=native"] if not portable and self._accepts(["-mtune=native"], _PLAIN_PROBE) else []
                targets = [(name, t_flags + tune, vbytes) for name, t_flags, vbytes in targets]
            else:  # (an old compiler without the x86-64-v3/v4 levels: one target, the default ISA)
                targets = [("baseline", [], 16)]
        else:
            targets = [("baseline", [], 16)]
        if targets[0][0] == "baseline" and not portable and self._accepts(["-march=native"], _PLAIN_PROBE):
            targets = [("baseline", ["-march=native"], 16)]
        macros = [m for m in ext.define_macros]
        objects = []
        for name, t_flags, vbytes in targets:
            out_dir = os.path.join(self.build_temp, f"target_{name}")
            objects += self.compiler.compile(
                [TARGET_SOURCE], output_dir=out_dir, include_dirs=["csrc"],
                macros=macros + [("GMS_TARGET_NS", name), ("GMS_VBYTES", str(vbytes))],
                extra_postargs=["-std=c++17", "-fvisibility=hidden"] + flags + t_flags)
            _say(f"gms_kernels: target {name}: {' '.join(flags + t_flags)}")
        ext.extra_objects = list(ext.extra_objects or []) + objects
        ext.extra_compile_args += flags
        ext.extra_link_args += link
        _say(f"gms_kernels: building {ext.name} with {' '.join(flags)}")

    def _accepts(self, flags, code, link=False) -> bool:
        """Whether the compiler compiles (and, with link, links) a probe with these flags."""
        tmp = tempfile.mkdtemp(prefix="gms_probe_")
        try:
            src = os.path.join(tmp, "probe.cpp")
            with open(src, "w") as f:
                f.write(code)
            objs = self.compiler.compile([src], output_dir=tmp, extra_postargs=flags)
            if link:
                self.compiler.link_shared_object(objs, os.path.join(tmp, "probe.so"), extra_postargs=flags)
            return True
        except Exception:
            return False
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _extensions():
    if os.environ.get("GMS_KERNELS_NO_EXT", "0") == "1":
        return []
    if Pybind11Extension is None:
        _warn_without_extension("pybind11 is not importable at build time")
        return []
    return [Pybind11Extension(EXT_NAME, ["csrc/gms_step.cpp"], include_dirs=["csrc"],
                              depends=["csrc/philox.h", "csrc/step_api.h", "csrc/simd.h", "csrc/vector_random.h",
                                       TARGET_SOURCE], cxx_std=17)]


# Name, version (gms_kernels.__version__), dependencies and entry points: pyproject.toml's [project].
setup(
    ext_modules=_extensions(),
    cmdclass={"build_ext": OptionalBuildExt},
)
