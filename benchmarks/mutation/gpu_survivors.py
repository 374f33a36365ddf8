"""The scheduler survivors that only a GPU tells apart (benchmarks/results/mutation.md: scheduler `step` 13, 15,
22, 25), applied by hand one at a time to a copy of the source tree, each run against tests/kernels/test_cuda.py's
scheduler tests: every one must fail them. On a machine with CUDA and diffusers:
    python benchmarks/mutation/gpu_survivors.py"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MOVE = "out = model_output.to(device=sample.device, dtype=work)"
RESOLVE = "resolve_backend(self.config.backend, sample.device, work) == \"triton\""
MUTANTS = {  # mutmut's numbering in scheduler.step
    13: (MOVE, "out = model_output.to(device=None, dtype=work)"),
    15: (MOVE, "out = model_output.to(dtype=work)"),
    22: (RESOLVE, "resolve_backend(self.config.backend, sample.device, None) == \"triton\""),
    25: (RESOLVE, "resolve_backend(self.config.backend, sample.device, ) == \"triton\""),
}


def main() -> int:
    failures = 0
    for number, (original, mutated) in MUTANTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "repo"
            shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", ".venv", "*.so", "__pycache__"))
            source = copy / "gms_kernels" / "integrations" / "scheduler.py"
            text = source.read_text()
            assert text.count(original) == 1, f"mutant {number}: the line to mutate is gone"
            source.write_text(text.replace(original, mutated))
            path = os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")])  # (the copy's package first)
            run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels/test_cuda.py",
                                  "-k", "scheduler"], cwd=copy, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": path})
            killed = run.returncode == 1 and " failed" in run.stdout
            failures += not killed
            print(f"scheduler.step {number}: {'killed' if killed else 'SURVIVED'} ({run.stdout.strip().splitlines()[-1]})")
    return failures


if __name__ == "__main__":
    sys.exit(main())
