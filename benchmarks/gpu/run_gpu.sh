#!/usr/bin/env bash
# One command for a lent H100/H200: the GPU tests on real Triton (not the interpreter) and real CUDA,
# then the GPU benchmarks. Results go to $OUT (the device tool's folder) or benchmarks/results/.
#   bash benchmarks/gpu/run_gpu.sh [all|core]     (core: the tests and bench_gpu.py only)
# Runs from the source tree (no install: the GPU machine's image has torch and triton but cannot
# fetch packages, and the C++ extension is not built there, so cpp cases are left out). diffusers,
# for the scheduler's CUDA tests, travels as wheels in .whl/ where present:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl diffusers==<version> importlib_metadata
set -uo pipefail
cd "$(dirname "$0")/../.."
what="${1:-all}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu-smi.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -c "import diffusers; print('diffusers', diffusers.__version__)" || echo "no diffusers: the scheduler's CUDA tests skip"
# pytest-xdist spreads the kernel compilations (one per specialisation) over the CPU cores
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
start=$SECONDS
# the Triton kernel and dispatch; every solver, SDEdit and estimate_gamma on a CUDA model against the CPU
# reference; the default-device tests under a CUDA default; the Philox streams on the GPU; the scheduler
timeout 240 python3 -m pytest -q -rs -p no:cacheprovider $workers tests/kernels/test_triton_backend.py tests/kernels/test_backends.py \
  tests/kernels/test_cuda.py tests/core/test_random.py "tests/sampling/test_default_device.py" -k "not cpp" \
  > "$out/gpu-tests.txt" 2>&1
echo "tests: exit $? after $((SECONDS - start)) s"; tail -30 "$out/gpu-tests.txt"
start=$SECONDS
timeout 60 python3 -m pytest -q -s -p no:cacheprovider tests/kernels/test_cuda.py -k "samples or ggf" > "$out/gpu-cuda-apart.txt" 2>&1
grep "apart" "$out/gpu-cuda-apart.txt"
timeout 60 python3 benchmarks/gpu/find_syncs.py > "$out/gpu-syncs.txt" 2>&1  # where gk.sample still waits, if anywhere
grep "==" "$out/gpu-syncs.txt"
timeout 60 python3 -m pytest -q -rs -p no:cacheprovider tests/integrations/test_scheduler.py \
  -k "triton" > "$out/gpu-tests-scheduler.txt" 2>&1
echo "scheduler tests: exit $? after $((SECONDS - start)) s"; tail -5 "$out/gpu-tests-scheduler.txt"
start=$SECONDS
timeout 240 python3 benchmarks/gpu/bench_gpu.py --out "$out" 2>&1 | tee "$out/gpu-bench-log.txt"
echo "benchmarks: exit $? after $((SECONDS - start)) s"
[ "$what" = core ] && exit 0
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
