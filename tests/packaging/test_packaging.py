"""Packaging conventions (issue 24): PEP 621 metadata, one version, a licence, typed, a complete sdist."""
import importlib.metadata
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import gms_kernels as gk

ROOT = Path(__file__).resolve().parents[2]


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


def test_hard_dependencies_agree_with_the_readme():
    """diffusers (GMSScheduler, checkpoints), matplotlib (figures) and scikit-learn (the digits job) are
    imported by the package itself, so they are installed with it; the README must not call them optional."""
    deps = {d.split(">")[0].split("=")[0].strip() for d in _project()["dependencies"]}
    assert {"torch", "diffusers", "matplotlib", "scikit-learn", "scipy", "tqdm", "pillow", "numpy"} <= deps
    readme = (ROOT / "README.md").read_text()
    for name in ("diffusers", "matplotlib", "scikit-learn"):
        assert f"optional {name}" not in readme.lower()
    assert "GMS_KERNELS_PORTABLE" in readme


def test_sdist_holds_the_tests_sources_and_licence(tmp_path):
    code = ("import sys; from setuptools import build_meta; "
            f"print(build_meta.build_sdist({str(tmp_path)!r}))")
    name = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    with tarfile.open(tmp_path / name.stdout.strip().splitlines()[-1]) as sdist:
        files = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    for required in ("tests/conftest.py", "tests/packaging/test_packaging.py", "LICENSE", "README.md", "csrc/gms_step.cpp",
                     "csrc/philox.h", "gms_kernels/py.typed", "setup.py", "pyproject.toml"):
        assert required in files, required
