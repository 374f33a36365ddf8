#!/usr/bin/env bash
# One command for a lent H100/H200: the GPU tests on real Triton (not the interpreter), then the GPU
# benchmarks. Results go to $OUT (the device tool's folder) or benchmarks/results/.
#   bash benchmarks/gpu/run_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu-smi.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_triton_backend.py tests/test_backends.py tests/test_solvers.py \
  2>&1 | tail -25 | tee "$out/gpu-tests.txt"
python3 benchmarks/gpu/bench_gpu.py --out "$out"
