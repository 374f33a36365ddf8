"""Results do not depend on torch's default device.

A user who calls ``torch.set_default_device("cuda")`` (or works inside ``with torch.device(...)``)
and samples on the CPU must get the same numbers as everyone else: every tensor the package makes
for itself (schedules, Philox seeds and counters, timesteps, buffers of the loops) is placed
explicitly, on the CPU or where the data are. The tests run each entry point on CPU inputs with
the *meta* device as the default: a factory call that forgets its device then makes a meta tensor,
whose first use fails loudly (meta tensors hold no data), so every such call is found on a CPU-only
machine. (The same omission under a CUDA default would copy bookkeeping to the GPU and back, or
mix devices.)
"""
import pytest
import torch

import gms_kernels as gk
from gms_kernels.models.embedded import default_model

SHAPE = (3, 1, 8, 8)


@pytest.fixture(scope="module")
def digits_model():
    return default_model()


# The meta device everywhere; on a machine with a GPU (benchmarks/gpu/run_gpu.sh) CUDA as well, the
# case the meta device stands in for.
OTHER_DEFAULTS = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


def _same_under_another_default(fn):
    """fn() outside and inside ``with torch.device(d)`` for each d of OTHER_DEFAULTS: equal CPU results."""
    expected = fn()
    for default in OTHER_DEFAULTS:
        with torch.device(default):
            got = fn()
        assert got.device.type == "cpu", default
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)  # (Gamma tables hold NaN)


SOLVER_CASES = [
    ("gms", {}), ("gms", {"fit": "adan", "select": "pixel"}), ("gms", {"preset": "official"}),
    ("sn-ddpm", {}), ("ddpm", {}), ("ddpm-large", {}), ("ddim", {}), ("ddim", {"eta": 0.5}),
    ("seeds-1", {}), ("seeds-2", {}), ("seeds-3", {}), ("edm-sde", {}),
]


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("solver, options", SOLVER_CASES, ids=lambda c: str(c))
def test_sample_on_the_cpu_ignores_the_default_device(digits_model, solver, options, backend):
    _same_under_another_default(lambda: gk.sample(digits_model, SHAPE, steps=5, solver=solver, generator=3,
                                               backend=backend, device="cpu", progress=False, **options))


def test_the_embedded_model_is_built_on_the_cpu_whatever_the_default_device():
    from gms_kernels.models import embedded

    run = lambda: gk.sample(shape=SHAPE, steps=3, generator=0, device="cpu", progress=False)  # noqa: E731
    embedded._cache.clear()  # (so that the model is built under the meta default, not found in the cache)
    with torch.device("meta"):
        got = run()
    assert next(embedded.default_model().parameters()).device.type == "cpu"
    assert torch.equal(got, run())


def test_sample_from_a_given_x_T_with_a_torch_generator_ignores_the_default_device(digits_model):
    x_T = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))
    _same_under_another_default(lambda: gk.sample(digits_model, x_T=x_T, steps=4, generator=torch.Generator().manual_seed(5),
                                               progress=False))


def test_estimate_gamma_and_analytic_dpm_ignore_the_default_device(digits_model):
    schedule = gk.Schedule.linear(1000)
    x0 = gk.data.digits("train")[0][:16]
    _same_under_another_default(lambda: gk.estimate_gamma(digits_model, x0, schedule, timesteps=[0, 500, 999],
                                                       generator=torch.Generator().manual_seed(0)))
    gamma = gk.estimate_gamma(digits_model, x0, schedule, timesteps=gk.trajectory(1000, 5, "even"))
    _same_under_another_default(lambda: gk.sample(digits_model, SHAPE, steps=5, solver="analytic-dpm", gamma=gamma,
                                               generator=2, device="cpu", progress=False))


def test_step_ignores_the_default_device():
    g = torch.Generator().manual_seed(0)
    x_t, heads = torch.randn(2, 1, 5, 7, generator=g), torch.randn(2, 3, 5, 7, generator=g)
    heads[:, 1] = heads[:, 0] ** 2 + 0.3
    schedule = gk.Schedule.linear(1000)
    for solver in ("gms", "sn-ddpm", "ddpm", "ddim"):
        _same_under_another_default(lambda: gk.step(x_t, heads, 600, 500, schedule, solver=solver, generator=4))
    _same_under_another_default(lambda: gk.step(x_t, heads, 600, 500, schedule, generator=torch.Generator().manual_seed(4)))


def _coefficients(k) -> torch.Tensor:
    return torch.tensor([k.a_t, k.a_s, k.sigma_t, k.sigma_s, k.c1, k.c2, k.lam2], dtype=torch.float64, device="cpu")


@pytest.mark.parametrize("make", [lambda: gk.Schedule.linear(100).betas, lambda: gk.Schedule.cosine(100).betas,
                                  lambda: _coefficients(gk.Schedule.linear(100).coefficients(50, 40))],
                         ids=["linear", "cosine", "coefficients"])
def test_schedules_are_built_on_the_cpu_whatever_the_default_device(make):
    _same_under_another_default(make)


def test_the_scheduler_ignores_the_default_device(digits_model):
    def run():
        scheduler = gk.GMSScheduler(num_train_timesteps=1000)
        scheduler.set_timesteps(5, device="cpu")
        x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0), device="cpu")
        x = scheduler.add_noise(x, torch.randn(SHAPE, generator=torch.Generator().manual_seed(1), device="cpu"),
                                scheduler.timesteps[:1].expand(SHAPE[0]))
        for t in scheduler.timesteps:
            out = digits_model(scheduler.scale_model_input(x, t), t.expand(SHAPE[0]))
            x = scheduler.step(out, t, x, generator=torch.Generator().manual_seed(int(t))).prev_sample
        return x

    _same_under_another_default(run)


def test_sdedit_ignores_the_default_device(digits_model):
    guide = gk.data.digits("test")[0][: SHAPE[0]]
    _same_under_another_default(lambda: gk.sdedit(digits_model, guide, 400, steps=4, generator=7, progress=False).images)


def test_the_exact_sampler_on_an_oracle_ignores_the_default_device():
    oracle = gk.GaussianMixtureOracle([0.3, 0.7], [[-1.0], [0.8]], [0.2, 0.3], gk.Schedule.linear(1000))
    _same_under_another_default(lambda: gk.sample(oracle, (64, 1), steps=5, solver="exact", generator=1, progress=False))


def test_head_training_ignores_the_default_device():
    from train.test_training import TinyMomentNet, _data  # (tests/ is on sys.path under pytest)

    data, trained = _data(64), []
    for default in ("cpu", "meta"):
        torch.manual_seed(0)
        net = TinyMomentNet()  # (built on the CPU: modules made under a default device belong there)
        with torch.device(default):
            gk.train_heads(net, data, steps=3, batch_size=16, progress=False, ema_decay=0.0)
        trained.append(torch.cat([p.detach().flatten() for p in net.heads.parameters()]))
    assert trained[1].device.type == "cpu"
    assert torch.equal(trained[0], trained[1])



def test_the_data_sets_and_metrics_ignore_the_default_device():
    _same_under_another_default(lambda: gk.data.digits("validation")[0])
    _same_under_another_default(lambda: gk.data.patches("validation", per_photo=50))
    x = gk.data.digits("test")[0][:200]
    y = gk.data.digits("validation")[0][:300]
    for metric in (lambda: gk.metrics.sliced_wasserstein1(x, y), lambda: gk.metrics.energy_distance(x, y, max_points=150),
                   lambda: gk.metrics.frechet_distance_dct(x, y), lambda: gk.metrics.fd_digits(x, y),
                   lambda: gk.metrics.seed_interval([1.0, 2.0, 4.0]).high):
        _same_under_another_default(lambda: torch.tensor(metric(), dtype=torch.float64, device="cpu"))


class _Stop(Exception):
    pass


class _WhereCalled(torch.nn.Module):
    """A network whose weights sit on ``device``; it records where it is called and stops the sampler."""

    def __init__(self, device):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, device=device))
        self.seen = None

    def forward(self, x, t):
        self.seen = (x.device, torch.as_tensor(t).device)
        raise _Stop


@pytest.mark.parametrize("given, expected", [(None, "meta"), ("cpu", "cpu")])
def test_sample_draws_where_the_model_is_unless_told(given, expected):
    """Without device=, x_T is drawn where the model's weights are (a CUDA model samples on CUDA);
    device= wins; a model without weights samples on the CPU (the oracle tests)."""
    net = _WhereCalled("meta")
    with pytest.raises(_Stop):
        gk.sample(net, SHAPE, steps=3, solver="ddpm", generator=0, device=given, progress=False, backend="torch")
    assert net.seen[0].type == expected
    x = gk.sample(lambda x, t: torch.zeros_like(x), SHAPE, steps=2, solver="ddpm", generator=0, progress=False)
    assert x.device.type == "cpu"


def test_a_device_that_contradicts_x_T_is_refused(digits_model):
    x_T = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"device='meta': meta tensors hold no values"):
        gk.sample(digits_model, x_T=x_T, steps=2, device="meta", progress=False)
    same = gk.sample(digits_model, x_T=x_T, steps=2, device="cpu", generator=0, progress=False)
    assert torch.equal(same, gk.sample(digits_model, x_T=x_T, steps=2, generator=0, progress=False))


def test_an_exported_diffusers_model_ignores_the_default_device(digits_model):
    """GMSDiffusersModel.forward makes its timestep tensor where the sample is, whatever the default."""
    from gms_kernels.models.diffusers_export import GMSDiffusersModel

    pytest.importorskip("diffusers")
    unet = GMSDiffusersModel.from_network(digits_model, sample_size=8)
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _same_under_another_default(lambda: unet(x, 500).sample)


@pytest.mark.parametrize("make", [
    lambda: gk.models.IDDPMUNet(in_channels=1, model_channels=32, out_channels=1, num_res_blocks=1,
                                attention_resolutions=(), dropout=0.0, channel_mult=(1, 2), num_heads=2),
    lambda: gk.models.PytorchDDPMUNet(T=50, ch=32, ch_mult=(1, 2), attn=(), num_res_blocks=1, in_channels=1),
], ids=["improved-diffusion", "pytorch-ddpm"])
def test_the_package_unets_take_an_int_timestep_whatever_the_default_device(make):
    """forward(x, 17) makes the timestep tensor where x is."""
    torch.manual_seed(0)
    net = make().eval()
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _same_under_another_default(lambda: net(x, 17))


@pytest.mark.parametrize("kind", ["scaled_linear", "sigmoid", "trained"])
def test_scheduler_betas_of_every_kind_are_made_on_the_cpu(kind):
    """make_betas (GMSScheduler's beta table) for the kinds not built by gk.Schedule: diffusers'
    scaled_linear and sigmoid, and a given trained_betas list."""
    from gms_kernels.core.schedule import make_betas

    trained = [0.001 * (i + 1) for i in range(10)] if kind == "trained" else None
    _same_under_another_default(lambda: make_betas(10, 1e-4, 0.02, "linear" if trained else kind, trained))
