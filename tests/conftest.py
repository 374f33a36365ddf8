import contextlib
import json
import os
import platform

# Set before torch loads OpenMP, in this process and (inherited) in the pytest-xdist workers of the default run
# (README.md) and the processes the tests start (torchrun, the command line, nested pytest runs): one thread
# each, as the workers share the cores, and waiting threads sleep instead of spinning, so that a test that runs
# two threads (test_reproducibility.py) does not spin against the other worker for a core (3x slower).
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import pytest  # noqa: E402
import torch  # noqa: E402

import gms_kernels as gk  # noqa: E402

# Skips that mean "part of the package is missing": on CI (CI=true) they fail the run instead, so that
# a broken build of the C++ extension or a missing triton cannot pass by skipping its tests.
MISSING_PART = ("gms_kernels._C is not available", "triton is not installed")


def _on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def pytest_sessionstart(session):
    if not _on_ci():
        return
    from gms_kernels.kernels import cpp

    missing = []
    if not cpp.available():
        missing.append(f"the C++ extension gms_kernels._C ({cpp.import_error()})")
    if platform.system() == "Linux" and platform.machine() == "x86_64":  # where the [test] extra installs triton
        try:
            import triton  # noqa: F401
        except ImportError as exc:
            missing.append(f"triton ({exc})")
    if missing:
        pytest.exit("CI=true but the test environment lacks " + " and ".join(missing)
                    + ": its tests would be skipped. Install with pip install \".[test]\" and a C++ compiler.",
                    returncode=3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _on_ci() and report.skipped and any(text in str(report.longrepr) for text in MISSING_PART):
        report.outcome, report.longrepr = "failed", f"skipped on CI: {report.longrepr}"


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests use small tensors: one intra-op thread is faster, and far faster on a busy machine or with
    several pytest-xdist workers."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def default_dtype():
    """``with default_dtype(torch.float64): ...`` runs a block under another torch default dtype and restores it."""
    @contextlib.contextmanager
    def use(dtype: torch.dtype):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)
    return use


@pytest.fixture
def small_scale_estimate(monkeypatch):
    """A cheaper estimate of the heads' target sizes s_n(t) (train_heads' loss_weighting="normalized" and
    output_scale): 10 bands of t and about 1,024 values per band instead of 50 and 16,384."""
    import gms_kernels.train.training as training

    monkeypatch.setattr(training, "SCALE_BUCKETS", 10)
    monkeypatch.setattr(training, "SCALE_VALUES", 1024)
    monkeypatch.setattr(training, "SCALE_MIN_ROWS", 8)


@pytest.fixture
def small_schedule():
    return gk.Schedule.linear(100, 1e-3, 0.2)


@pytest.fixture
def paper_oracle():
    return gk.GaussianMixtureOracle([0.4, 0.6], [[-0.4], [0.3]], [0.12, 0.05], gk.Schedule.linear())


def small_central_moment_net(seed: int = 0, in_channels: int = 1):
    """A small MomentNet with central heads whose (zero-initialised) heads were given some output."""
    torch.manual_seed(seed)
    backbone = gk.models.PytorchDDPMUNet(T=1000, ch=32, ch_mult=(1,), attn=(), num_res_blocks=1, dropout=0.0,
                                         in_channels=in_channels)
    net = gk.models.MomentNet(backbone, targets="central").eval()
    for head in net.heads.values():
        for p in head.parameters():
            torch.nn.init.normal_(p, std=0.05)
    return net


def image_oracle(schedule, shape=(3, 5, 7), seed=0):
    """A 3-component mixture over odd-shaped 'images' in [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    means = torch.rand(3, *shape, generator=g, dtype=torch.float64) * 1.4 - 0.7
    stds = torch.rand(3, *shape, generator=g, dtype=torch.float64) * 0.1 + 0.05
    return gk.GaussianMixtureOracle([0.2, 0.3, 0.5], means, stds, schedule)


@pytest.fixture
def fused_kernel_calls(monkeypatch):
    """A list of the backends solvers.solver_step hands a step to: solvers.fused_step is replaced by a stub
    that records its backend and returns x_t, so a test sees which steps would run in a fused kernel (and
    which on the float64 torch step) without running one."""
    import gms_kernels.solvers.base as solvers

    calls = []

    def fake_fused_step(backend, x_t, *args):
        calls.append(backend)
        return x_t.clone(), None

    monkeypatch.setattr(solvers, "fused_step", fake_fused_step)
    return calls


@pytest.fixture
def host_reads(monkeypatch):
    """A list that collects (method, calling function) for every read of tensor data on the host
    (item, tolist, bool, int, float, numpy, cpu): on a GPU each such read waits for the device's
    queue. The launchers' counter-range check, which only host tensors take, is not counted."""
    import sys

    reads = []
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "numpy", "cpu"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_name
            if caller != "check_counter_range":
                reads.append((_name, caller))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


def randomize(module, seed=0, scale=0.05):
    """Weights moved off their initial values (a fresh diffusers UNet's output layer is zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return module


def quiet_pipe(directory):
    """DDPMPipeline.from_pretrained(directory) without its warnings and progress bar."""
    import warnings

    from diffusers import DDPMPipeline

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = DDPMPipeline.from_pretrained(directory, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# small networks of gk.models and diffusers for the model and loader tests (random weights, fixed by the seed)
def tiny_diffusers_unet(out_channels: int, seed: int = 0):
    """A 3-channel 8x8 diffusers UNet2DModel with small random weights."""
    from diffusers import UNet2DModel

    torch.manual_seed(seed)
    unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=out_channels, layers_per_block=1,
                       block_out_channels=(8, 16), norm_num_groups=4, down_block_types=("DownBlock2D", "DownBlock2D"),
                       up_block_types=("UpBlock2D", "UpBlock2D"))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in unet.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return unet.eval()


def tiny_ddim(seed: int):
    """A small gk.models.DDIMModel (3 channels, 8x8) in eval mode."""
    torch.manual_seed(seed)
    return gk.models.DDIMModel(ch=32, out_ch=3, ch_mult=(1, 2), num_res_blocks=1, attn_resolutions=(4,), resolution=8).eval()


def tiny_ddpm_state():
    """The state dict of a small gk.models.PytorchDDPMUNet (T = 50)."""
    torch.manual_seed(0)
    return gk.models.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(1,), num_res_blocks=1).state_dict()


def tiny_iddpm():
    """A small gk.models.IDDPMUNet (3 channels in, 6 out: eps and the learned variance) in eval mode."""
    torch.manual_seed(0)
    return gk.models.IDDPMUNet(in_channels=3, model_channels=32, out_channels=6, num_res_blocks=1, attention_resolutions=(2,),
                        dropout=0.0, channel_mult=(1, 2), num_heads=2, use_scale_shift_norm=True).eval()


def official_fixtures(family: str):
    """The official GMS checkpoints of one family in the shared fixtures: ([eps1, eps2, eps3] paths, config)."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "official_gms" / family
    if not folder.is_dir():  # (as in test_official_gms.py: the shared folder next to the working tree)
        folder = Path("/work/shared/fixtures/official_gms") / family
    return [folder / f"eps{i}.pt" for i in (1, 2, 3)], json.loads((folder / "config.json").read_text())
