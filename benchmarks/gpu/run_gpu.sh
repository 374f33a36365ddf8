#!/usr/bin/env bash
# One command for a lent H100/H200: the GPU tests on real Triton (not the interpreter), then the GPU
# benchmarks. Results go to $OUT (the device tool's folder) or benchmarks/results/.
#   bash benchmarks/gpu/run_gpu.sh
# Runs from the source tree (no install: the GPU machine's image has torch and triton but cannot
# fetch packages); the tests that need a GPU are the Triton backend's and the dispatch's.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu-smi.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# pytest-xdist spreads the kernel compilations (one per specialisation) over the CPU cores
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
start=$SECONDS
timeout 200 python3 -m pytest -q -p no:cacheprovider $workers tests/test_triton_backend.py tests/test_backends.py \
  > "$out/gpu-tests.txt" 2>&1
echo "tests: exit $? after $((SECONDS - start)) s"; tail -30 "$out/gpu-tests.txt"
start=$SECONDS
timeout 300 python3 benchmarks/gpu/bench_gpu.py --out "$out" 2>&1 | tee "$out/gpu-bench-log.txt"
echo "benchmarks: exit $? after $((SECONDS - start)) s"
# the pytest-benchmark suite's Triton cases (the same runners, timed by pytest-benchmark)
timeout 120 python3 -m pytest -q -p no:cacheprovider benchmarks/test_bench_step.py -k triton --benchmark-only \
  --benchmark-json "$out/gpu-pytest-benchmark.json" > "$out/gpu-pytest-benchmark.txt" 2>&1
echo "pytest-benchmark: exit $?"; tail -20 "$out/gpu-pytest-benchmark.txt"
# a diagnostic of gk.step's host time (cProfile + torch.profiler), to $OUT/gpu-profile.txt
timeout 120 python3 benchmarks/gpu/profile_step.py > "$out/gpu-profile.txt" 2>&1
echo "profile: exit $?"; head -40 "$out/gpu-profile.txt"
# ADAN's fp32 register cap at both sizes and iteration counts (triton_gms.ADAN_FP32_MAXNREG)
timeout 120 python3 benchmarks/gpu/sweep_registers.py --rounds 2 > "$out/gpu-registers.txt" 2>&1
echo "register sweep: exit $?"; tail -8 "$out/gpu-registers.txt"
