"""The GPU benchmark scripts run end to end before any device time is spent on them: dry runs at tiny sizes
on the CPU, through the Triton interpreter (bench_gpu.py --smoke, sweep_registers.py --smoke).

They check the benchmark scripts, not the library, and take minutes on two CPU cores (the full-size
ImageNet64 backbone runs on the CPU, in fp32 and under bf16 autocast), so they are not part of the default
test run (testpaths = tests). Run them before the GPU benchmarks:
    python -m pytest -q -p no:cacheprovider benchmarks/gpu/test_dry_runs.py
"""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DRY_RUN = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}


def test_gpu_benchmark_dry_run_writes_its_report(tmp_path):
    env = {**os.environ, **DRY_RUN}
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "bench_gpu.py"), "--smoke",
                          "--out", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    reports = list(tmp_path.glob("gpu-cpu-smoke-*.md"))
    assert len(reports) == 1
    text = reports[0].read_text()
    assert "not a measurement" in text and "One network call" in text and "## In a sampling loop" in text
    assert "| gk.step (all of it: its flag read is one sync) |" in text
    assert "| gk.step given a nonfinite_flag (no sync) |" in text and "flag read a step later" in text
    for size in ("cifar10-b100", "imagenet64-b100"):
        for fit in ("closed", "adan-25", "adan-70"):
            assert f"| {size} (" in text and f"| {fit} |" in text
    # every row has its timings and overhead columns filled in
    rows = [line for line in text.splitlines() if line.startswith("| cifar10") or line.startswith("| imagenet64")]
    assert len(rows) == 6 + 4 + 6 + 4 + 2 + 1 and all("nan" not in r and "n/a" not in r for r in rows)
    assert "## EDM-SDE's NaN/inf check" in text and "| cifar10 | 1 |" in text
    assert "## The baselines in the same kernel" in text and "| size | gms, closed | sn-ddpm | ddpm | ddim |" in text


def test_register_sweep_dry_run_prints_its_table(tmp_path):
    env = {**os.environ, **DRY_RUN}
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "sweep_registers.py"), "--smoke"],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "| size | fit | maxnreg 80 | maxnreg None |" in run.stdout
    rows = [line for line in run.stdout.splitlines() if line.startswith(("| cifar10", "| imagenet64"))]
    assert len(rows) == 2 * 4  # printed as measured and again in the table
    assert all(row.count(" us (") == 2 and "nan" not in row for row in rows)
