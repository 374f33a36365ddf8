"""The built wheel holds the library and its shipped models, nothing else: no studies, scripts, results, benchmarks
or tests (they live in the repository, beside the package)."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what a checkout holds besides the source: environments, build outputs, caches
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "__pycache__", "*.so", "*.egg-info", "gms_out",
                                     "mutants", ".pytest_cache", ".hypothesis", ".benchmarks")


def test_the_wheel_holds_the_library_and_the_shipped_models_only(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE)  # (a build in the checkout would leave build/ behind)
    code = f"from setuptools import build_meta; print(build_meta.build_wheel({str(tmp_path / 'out')!r}))"
    # the file list does not depend on the C++ extension, whose build takes minutes: GMS_KERNELS_NO_EXT skips it
    run = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, check=True,
                         env={**os.environ, "GMS_KERNELS_NO_EXT": "1"})
    with zipfile.ZipFile(tmp_path / "out" / run.stdout.strip().splitlines()[-1]) as wheel:
        files = wheel.namelist()
    tops = {f.split("/")[0] for f in files}
    assert tops == {"gms_kernels", "gms_kernels-0.1.0.dist-info"}, tops
    library = [f for f in files if f.startswith("gms_kernels/")]
    assert sorted(f for f in library if f.startswith("gms_kernels/assets/")) == [
        "gms_kernels/assets/digits_classifier.pt", "gms_kernels/assets/digits_gms.pt",
        "gms_kernels/assets/patches_gms.pt"]
    # every module of the package is in the wheel, and nothing that is not one, an asset or the typing marker
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "gms_kernels").rglob("*.py")}
    assert modules <= set(library)
    assert set(library) - modules == {"gms_kernels/py.typed", *(f for f in library if f.startswith("gms_kernels/assets/"))}
    for part in ("studies", "results", "benchmarks", "tests", "python/", "experiments", ".md", ".png", ".json"):
        assert not [f for f in files if part in f], part
    for entry in ("gms_kernels/eval/digits_job.py", "gms_kernels/eval/oracle_job.py", "gms_kernels/cli.py"):
        assert entry in library  # (the command line's jobs run from the wheel)
