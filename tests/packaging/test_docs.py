"""README.md and docs/: the usage example runs, the set-up commands are the ones the project runs, every
relative link resolves, every solver is listed, and every marked example is run by some test."""
import re
import tomllib

import torch

import gms_kernels as gk
from gms_kernels.models import PytorchDDPMUNet

from readme_examples import DOCUMENTS, ROOT, example_file, readme_example

README = ROOT / "README.md"


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_the_readme_usage_example_runs(tmp_path, monkeypatch):
    """The README's usage example, on a tiny pytorch-ddpm network saved as a raw state dict."""
    torch.manual_seed(0)
    backbone = PytorchDDPMUNet(T=1000, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1, dropout=0.0, in_channels=1)
    torch.save(backbone.state_dict(), tmp_path / "ckpt.pt")
    monkeypatch.chdir(tmp_path)  # (the example writes heads.ckpt where it runs)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    scope = {"checkpoint": str(tmp_path / "ckpt.pt"), "images": torch.rand(32, 1, 8, 8) * 2 - 1, "train_steps": 2}
    exec(compile(readme_example("usage"), example_file("usage"), "exec"), scope)
    assert scope["x"].shape == (16, 1, 8, 8) and bool(torch.isfinite(scope["x"]).all())
    assert scope["x_s"].shape == (16, 1, 8, 8) and bool(torch.isfinite(scope["x_s"]).all())
    assert (tmp_path / "heads.ckpt").exists()


def test_the_readme_commands_are_what_the_project_runs():
    """The test command is .ci/run's own; the main job's installs an extra the package declares and runs its
    script."""
    install_and_run, install_and_test = _bash_blocks(README.read_text())[:2]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3 -m venv")]
    assert ci == [install_and_test]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = re.search(r'pip install "?\.(?:\[(\w+)\])?"?', install_and_run)
    assert extra is not None and (extra.group(1) is None or extra.group(1) in project["optional-dependencies"])
    assert install_and_run.endswith("&& gms-kernels") and "gms-kernels" in project["scripts"]


def test_every_relative_link_resolves():
    broken = []
    for doc in DOCUMENTS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+://|#|mailto:", target):
                continue
            if not (doc.parent / target.split("#")[0]).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_readme_lists_every_solver():
    section = README.read_text().split("## Solvers and backends")[1].split("\n## ")[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    listed = {name for row in rows for name in re.findall(r"`([^`]+)`", row)}
    assert listed == set(gk.SOLVERS)


def test_every_marked_example_is_run_by_a_test():
    names = {n for doc in DOCUMENTS for n in re.findall(r"<!-- example: ([\w-]+) -->", doc.read_text())}
    tests = "".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    assert names and all(f'readme_example("{n}")' in tests for n in names), names
