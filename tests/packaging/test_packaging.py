"""Packaging conventions: PEP 621 metadata, one version, a licence, typed, hard dependencies and extras, a complete
sdist (the wheel: test_wheel.py)."""
import importlib.metadata
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

import gms_kernels as gk

ROOT = Path(__file__).resolve().parents[2]
# (one xdist worker for the module: the sdist build rewrites gms_kernels.egg-info in the checkout, which
# importlib.metadata reads from the working directory, as test_pep621_metadata_with_one_version_source does)
pytestmark = pytest.mark.xdist_group("checkout_metadata")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_pep621_metadata_with_one_version_source():
    project = _project()
    assert project["name"] == "gms_kernels" and project["dynamic"] == ["version"]
    assert project["license"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert any(c.startswith("Programming Language :: Python :: 3") for c in project["classifiers"])
    assert "Typing :: Typed" in project["classifiers"] and (ROOT / "gms_kernels" / "py.typed").exists()
    assert project["scripts"]["gms-kernels"] == "gms_kernels.cli:main"
    assert importlib.metadata.version("gms_kernels") == gk.__version__  # the installed metadata reads __version__


def _names(requirements: list[str]) -> set[str]:
    """Distribution names of requirement strings (versions, markers and a self-reference's extras dropped)."""
    out = set()
    for r in requirements:
        name = r.split(";")[0].split("[")[0]
        for sep in "<>=!~ ":
            name = name.split(sep)[0]
        out.add(name.strip())
    return out


def _extra(name: str) -> set[str]:
    """The distributions an extra installs, the extras it names of gms_kernels itself included."""
    extras = _project()["optional-dependencies"]
    out = set()
    for r in extras[name]:
        if r.startswith("gms_kernels["):
            for inner in r.split("[")[1].split("]")[0].split(","):
                out |= _extra(inner.strip())
        else:
            out |= _names([r])
    return out


def test_hard_dependencies_are_what_the_library_needs_at_run_time():
    """gk.sample, gk.step, the models and the CLI's sample need torch, numpy, tqdm (progress bars) and pillow (image
    grids); everything else is an extra, and each optional import names its extra (gms_kernels.core.extras)."""
    from gms_kernels.core.extras import EXTRAS

    assert _names(_project()["dependencies"]) == {"torch", "numpy", "tqdm", "pillow"}
    for module, (distribution, extra) in EXTRAS.items():
        assert distribution in _extra(extra), (module, extra)
        assert distribution in _extra("test"), distribution  # (the tests exercise every optional part)
    # the command line's jobs: the digits (scikit-learn), the intervals (scipy) and the oracle job's figure
    assert {"scikit-learn", "scipy", "matplotlib"} <= _extra("demo")
    assert "GMS_KERNELS_PORTABLE" in (ROOT / "setup.py").read_text()


def test_a_missing_optional_dependency_names_its_extra(monkeypatch):
    from gms_kernels.core.extras import require

    monkeypatch.setitem(sys.modules, "scipy.stats", None)  # (an import of it now fails as if it were not installed)
    with pytest.raises(ImportError, match=r'gk.metrics.seed_interval needs scipy, which is not installed: '
                                          r'pip install "gms_kernels\[eval\]"'):
        gk.metrics.seed_interval([1.0, 2.0])
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r'pip install "gms_kernels\[data\]"'):
        require("sklearn.datasets", "gk.data.digits")
    with pytest.raises(ValueError, match="not an optional dependency"):
        require("numpy", "anything")


def test_sdist_holds_the_tests_sources_and_licence(tmp_path):
    code = ("import sys; from setuptools import build_meta; "
            f"print(build_meta.build_sdist({str(tmp_path)!r}))")
    name = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    with tarfile.open(tmp_path / name.stdout.strip().splitlines()[-1]) as sdist:
        files = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    for required in ("tests/conftest.py", "tests/packaging/test_packaging.py", "LICENSE", "README.md", "csrc/gms_step.cpp",
                     "csrc/philox.h", "gms_kernels/py.typed", "gms_kernels/assets/digits_gms.pt", "setup.py",
                     "pyproject.toml", "MANIFEST.in",
                     # the studies and scripts that tests/python tests (the source, not the package)
                     "python/studies/quality_study.py", "python/quality_benchmark.py", "python/results/README.md"):
        assert required in files, required
    assert not [f for f in files if "__pycache__" in f or f.endswith(".so")]


_WITHOUT_EXTRAS = """
import importlib.abc, sys, tempfile
OPTIONAL = {optional!r}

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in OPTIONAL:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, NotInstalled())
import gms_kernels as gk
from gms_kernels.cli import main
from gms_kernels.models.embedded import default_model

x = gk.sample(default_model(), shape=(2, 1, 8, 8), steps=2, generator=0, progress=False)
assert x.shape == (2, 1, 8, 8)
assert main(["sample", "--num-samples", "2", "--steps", "2", "--out", tempfile.mkdtemp(), "--quiet"]) == 0
try:
    gk.data.digits("train")
except ImportError as exc:
    print(exc)
assert not [m for m in sys.modules if m.split(".")[0] in OPTIONAL]
"""


def test_the_library_samples_with_its_hard_dependencies_alone():
    """gk.sample and ``gms-kernels sample`` on the embedded model import no optional dependency; the digits (an
    extra's) fail with the pip command that installs it."""
    from gms_kernels.core.extras import EXTRAS

    run = subprocess.run([sys.executable, "-c", _WITHOUT_EXTRAS.format(optional=sorted(EXTRAS))], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().endswith('gk.data.digits needs scikit-learn, which is not installed: '
                                       'pip install "gms_kernels[data]"'), run.stdout
