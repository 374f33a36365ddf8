"""pytest-benchmark: the GMS per-step cost for every backend (not part of the default test run).

    pytest benchmarks/test_bench_step.py --benchmark-only
"""
import pytest
import torch

import gms_kernels as gk
from gms_kernels.kernels.dispatch import backend_available
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


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_mixture_sampling(benchmark, size, backend):
    """The mixture-sampling primitive alone: given (mu1, mu2, s2), seeds and indices, draw
    x = (u < w1 ? mu1 : mu2) + sqrt(s2) z with the step's Philox streams. torch: the reference
    (random.py's streams, then mixture.sample_mixture); cpp: the C++ extension."""
    from gms_kernels import random as rng
    from gms_kernels.core.fit import MixtureParams
    from gms_kernels.core.mixture import sample_mixture

    if backend == "cpp" and not backend_available("cpp"):
        pytest.skip("the C++ extension is not built")
    g = torch.Generator().manual_seed(0)
    shape = SIZES[size]
    mu1 = torch.randn(shape, generator=g)
    params = MixtureParams(mu1, mu1 - torch.rand(shape, generator=g), 0.1 * torch.rand(shape, generator=g))
    noise = rng.SampleNoise.create(0, shape[0])
    t, w1 = 500, 1 / 3
    if backend == "cpp":
        from gms_kernels.kernels import cpp

        fn = lambda: cpp.sample_mixture(params, w1, noise.seeds, noise.indices, t)
    else:
        fn = lambda: sample_mixture(params, (w1, 1 - w1), noise.normal(rng.STREAM_STEP_NOISE, t, shape[1:]),
                                    noise.uniform(rng.STREAM_COMPONENT, t))
    benchmark.pedantic(fn, rounds=3 if backend == "torch" else 10, warmup_rounds=1)
