"""pytest-benchmark: the GMS per-step cost for every backend (not part of the default test run).

    pytest benchmarks/test_bench_step.py --benchmark-only
"""
import pytest
import torch

import gms_kernels as gk
from gms_kernels.backends import backend_available
from cases import FITS, SIZES, make_inputs, runner

BACKENDS = ["reference-loop", "torch", "cpp", "triton"]


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("fit", list(FITS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_gms_step(benchmark, size, fit, backend):
    device = "cuda" if backend == "triton" else "cpu"
    if backend == "triton" and not (torch.cuda.is_available() and backend_available("triton")):
        pytest.skip("triton timing needs a CUDA GPU")
    if backend == "cpp" and not backend_available("cpp"):
        pytest.skip("the C++ extension is not built")
    x_t, out = make_inputs(SIZES[size], device)
    fn = runner(backend, fit, x_t, out, gk.Schedule.linear())
    if device == "cuda":
        def timed():
            fn()
            torch.cuda.synchronize()
        benchmark.pedantic(timed, rounds=10, warmup_rounds=2)
    else:
        benchmark.pedantic(fn, rounds=3 if backend in ("reference-loop", "torch") else 10, warmup_rounds=1)
