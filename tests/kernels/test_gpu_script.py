"""The GPU runner script is valid bash. The dry runs of the benchmark scripts (minutes on two CPU cores) are in
benchmarks/gpu/test_dry_runs.py, run before the GPU benchmarks, not in the default test run."""
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_runner_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(REPO / "benchmarks" / "gpu" / "run_gpu.sh")], check=True)
