"""On a real CUDA device: what the CPU-only run checks through stand-ins (the meta device, recording
fakes, the Triton interpreter). Run on a lent GPU by benchmarks/gpu/run_gpu.sh; without CUDA every
test here is skipped (the CPU run holds the stand-in versions: test_default_device.py,
test_triton_backend.py, test_scheduler.py)."""
import copy

import pytest
import torch

import gms_kernels as gk
from gms_kernels.models.embedded import default_model
from gms_kernels.solvers import get_solver
from sampling.test_reproducibility import BACKEND_TOL

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SHAPE = (16, 1, 8, 8)
K = 10
SOLVER_CASES = [
    # (ADAN-70, the official preset, in the fp64 loop: the fp32 loop's trajectory parts from the reference's
    # at 70 iterations, benchmarks/results/adan-precision.md)
    # ({}: the digits model's own options, closed per pixel; select="sample": one component per image, as the official code draws)
    ("gms", {}), ("gms", {"select": "sample"}), ("gms", {"fit": "adan", "select": "pixel"}),
    ("gms", {"preset": "official", "adan_precision": "float64"}),
    ("sn-ddpm", {}), ("ddpm", {}), ("ddpm-large", {}), ("ddim", {}), ("ddim", {"eta": 0.5}),
    ("analytic-dpm", {}), ("seeds-1", {}), ("seeds-2", {}), ("seeds-3", {}), ("edm-sde", {}),
]  # (ggf: its own test below)


@pytest.fixture(scope="module")
def models():
    """The embedded digits model on the CPU and a copy on CUDA, with TF32 off so that the GPU network's
    outputs differ from the CPU's in their last bits only (as between CPU thread counts)."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    cpu = default_model()
    yield cpu, copy.deepcopy(cpu).to("cuda")
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


@pytest.fixture(scope="module")
def gamma(models):
    x0 = gk.data.digits("train")[0][:64]
    return gk.estimate_gamma(models[0], x0, gk.Schedule.linear(1000), timesteps=gk.trajectory(1000, K, "even"),
                             generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("solver, options", SOLVER_CASES, ids=lambda c: str(c))
def test_a_cuda_model_samples_on_cuda_what_the_cpu_reference_samples(models, gamma, solver, options):
    """gk.sample with a CUDA model and no device= samples on CUDA (the fused Triton step for the one-call
    solvers, the float64 torch loops for the others), and draws the CPU float64 reference's samples: the
    same Philox streams, apart only by rounding (BACKEND_TOL, derived in test_reproducibility.py)."""
    cpu, cuda = models
    if solver == "analytic-dpm":
        options = {**options, "gamma": gamma}
    on_gpu = gk.sample(cuda, SHAPE, steps=K, solver=solver, generator=3, progress=False, **options)
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.float32
    ref = gk.sample(cpu, SHAPE, steps=K, solver=solver, generator=3, progress=False, backend="torch", **options)
    apart = float((on_gpu.cpu() - ref).abs().max())
    print(f"{solver} {options if solver != 'analytic-dpm' else ''}: {apart:.3g} apart")  # (the GPU log keeps it)
    assert apart < BACKEND_TOL, f"{apart:.3g} apart"
    # and the batch does not matter: samples 5..7 drawn as a batch of their own
    part = gk.sample(cuda, (3, *SHAPE[1:]), steps=K, solver=solver, generator=3, first_index=5, progress=False,
                     **options)
    assert float((part - on_gpu[5:8]).abs().max()) < BACKEND_TOL


def test_ggf_on_cuda_is_reproducible_on_cuda_but_follows_the_cpu_only_in_law(models):
    """GGF's accept/reject decisions are thresholds on the network's output, so the last-bit differences
    between devices (or batch sizes) flip some and send a sample down another step sequence. Measured on an
    H200 (2026-11-27, this model, K = 10 start, 16 samples): 2 of 16 samples made as many calls on CUDA as on
    the CPU, and samples ended up to 0.17 apart; on the CPU, batch 16 against 3, one of three samples ended
    0.67 away. So GGF promises the same samples for the same seed on one device and batch only."""
    cpu, cuda = models
    seen = {}
    run = lambda: gk.sample(cuda, SHAPE, steps=K, solver="ggf", generator=3, progress=False,  # noqa: E731
                            callback=lambda d: seen.__setitem__("gpu", d["nfe"]))
    on_gpu = run()
    assert on_gpu.device.type == "cuda" and torch.isfinite(on_gpu).all()
    assert torch.equal(on_gpu, run())
    ref = gk.sample(cpu, SHAPE, steps=K, solver="ggf", generator=3, progress=False,
                    callback=lambda d: seen.__setitem__("cpu", d["nfe"]))
    same = seen["gpu"] == seen["cpu"]
    apart = (on_gpu.cpu() - ref).abs().flatten(1).max(1).values
    print(f"ggf: {int(same.sum())} of {len(same)} samples made as many calls on CUDA as on the CPU; "
          f"up to {float(apart.max()):.3g} apart")


def test_the_triton_backend_is_what_a_cuda_sample_runs(models, monkeypatch):
    """(So that the comparison above is one of Triton with the reference, not of the reference with itself.)"""
    from gms_kernels.kernels import triton_gms

    calls = []
    real = triton_gms.fused_step
    monkeypatch.setattr(triton_gms, "fused_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    gk.sample(models[1], SHAPE, steps=3, generator=0, progress=False)
    assert len(calls) == 4  # (3 steps are 4 transitions, the last to the data in the kernel's denoising mode)


def test_sdedit_and_estimate_gamma_on_cuda_match_the_cpu(models):
    cpu, cuda = models
    guide = gk.data.digits("test")[0][:8]
    a = gk.sdedit(cuda, guide.cuda(), 400, steps=4, generator=7, progress=False).images
    b = gk.sdedit(cpu, guide, 400, steps=4, generator=7, progress=False, backend="torch").images
    assert a.device.type == "cuda" and float((a.cpu() - b).abs().max()) < BACKEND_TOL
    x0 = gk.data.digits("train")[0][:32]
    kw = dict(timesteps=[0, 500, 999], generator=torch.Generator().manual_seed(0))
    g_cpu = gk.estimate_gamma(cpu, x0, gk.Schedule.linear(1000), **kw)
    kw["generator"] = torch.Generator().manual_seed(0)
    g_gpu = gk.estimate_gamma(cuda, x0.cuda(), gk.Schedule.linear(1000), **kw)
    torch.testing.assert_close(g_gpu.cpu(), g_cpu, rtol=1e-4, atol=1e-6, equal_nan=True)


# -- GMSScheduler (needs diffusers) ---------------------------------------------------------------
def _heads_and_sample(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    e1 = torch.randn(2, 3, 5, 7, generator=g) * 0.8
    e2 = e1**2 + torch.rand(2, 3, 5, 7, generator=g) * 0.5
    e3 = e1**3 + torch.randn(2, 3, 5, 7, generator=g) * 0.3
    return torch.cat([e1, e2, e3], 1).to(dtype), torch.randn(2, 3, 5, 7, generator=g).to(dtype)


def test_scheduler_moves_the_model_output_to_the_samples_device():
    """A model on one device and the loop's sample on another: step takes the output to the sample."""
    pytest.importorskip("diffusers")
    out, x = _heads_and_sample()
    for sample_device, output_device in [("cpu", "cuda"), ("cuda", "cpu")]:
        s = gk.GMSScheduler(backend="torch")
        s.set_timesteps(5)
        t = s.timesteps[1]
        got = s.step(out.to(output_device), t, x.to(sample_device), generator=4).prev_sample
        assert got.device.type == sample_device
        s = gk.GMSScheduler(backend="torch")
        s.set_timesteps(5)
        same = s.step(out.to(sample_device), t, x.to(sample_device), generator=4).prev_sample
        assert torch.equal(got, same)


def test_scheduler_defers_the_finite_check_only_for_the_triton_kernel():
    """auto on CUDA: a float32 sample runs the Triton kernel, whose NaN/inf flag is read a step later; a
    float64 sample runs the float64 reference, which checks at once, so no flag is left pending."""
    pytest.importorskip("diffusers")
    for dtype, deferred in [(torch.float32, True), (torch.float64, False)]:
        out, x = _heads_and_sample(dtype)
        s = gk.GMSScheduler()
        s.set_timesteps(5)
        s.step(out.cuda(), s.timesteps[0], x.cuda(), generator=4)
        assert (s._pending is not None) == deferred, dtype


def test_a_scheduler_loop_on_cuda_does_not_sync_the_host():
    """A diffusers-style loop over scheduler.timesteps on CUDA: each step reads the previous step's NaN/inf flag
    through pinned memory and an event, never with a synchronising copy or read; only the step into the data
    reads its own flag at once (so that a loop never ends on an unread flag): one read per loop."""
    pytest.importorskip("diffusers")
    from test_triton_backend import _count_syncs

    def model(x, t):
        return torch.cat([x * 0.1, x * x * 0.01 + 0.5, x * 0.0], 1)

    s = gk.GMSScheduler()
    x = torch.randn(2, 3, 8, 8, device="cuda")
    for steps in (3, 40):  # (the first loop compiles the kernel)
        s.set_timesteps(steps, device="cuda")

        def loop():
            y = x
            for t in s.timesteps:
                y = s.step(model(y, t), t, y, generator=1).prev_sample
            return y

        syncs = _count_syncs(loop)
    assert syncs == _count_syncs(lambda: torch.ones(1, device="cuda").item())


def test_the_multi_call_sde_loops_read_the_device_once():
    """EDM-SDE and SEEDS-2/3 check every network output for NaN/inf on the device and read the verdicts
    once, at the end (sde.EpsFunction): the count does not grow with the steps, as a read per call would."""
    from test_triton_backend import _count_syncs

    def model(x, t):
        return x * 0.1

    one_read = _count_syncs(lambda: torch.ones(1, device="cuda").item())
    counts = {}
    for solver in ("edm-sde", "seeds-2", "seeds-3"):
        for steps in (3, 20):
            run = lambda: gk.sample(model, shape=(2, 3, 8, 8), steps=steps, solver=solver,  # noqa: E731
                                    generator=3, progress=False, device="cuda")
            run()  # (warm-up)
            counts[solver, steps] = _count_syncs(run)
    assert all(1 <= n <= one_read and n == counts[solver, 3] for (solver, _), n in counts.items()), counts


def test_a_deferred_nonfinite_output_on_cuda_names_its_call():
    calls = []

    def model(x, t):
        calls.append(t)
        return x * float("nan") if len(calls) == 4 else x * 0.1

    with pytest.raises(ValueError, match=r"model output at network call 3 \(t=\d+\) has non-finite"):
        gk.sample(model, shape=(2, 3, 8, 8), steps=5, solver="edm-sde", generator=3, progress=False, device="cuda")
    # the loop ran to its end: the check was read once, there
    assert len(calls) == get_solver("edm-sde").network_calls(len(gk.trajectory(gk.Schedule.linear(1000), 5, "even")))
