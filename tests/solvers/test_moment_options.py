"""The solvers' ``moments`` option (the official code's separate clamps of the moments of x_0, or mean, variance
and skew made jointly feasible for the data range) and ``pixel_levels`` (the quantisation that sets the Gaussian last
step's variance cap), through core.moments, gk.step on every CPU backend, the presets and the command line."""
import math

import pytest
import torch

import gms_kernels as gk
from gms_kernels.cli import _solver_options, build_parser
from gms_kernels.core.moments import last_step_variance_cap, third_moment_bounds, transition_moments
from gms_kernels.solvers import get_solver, resolve_options
from gms_kernels.solvers.base import denoise_coefficients, fused_config, with_model_defaults

SCHED = gk.Schedule.linear()
STEPS = [(999, 700), (600, 400), (300, 150), (100, 20), (20, 5)]
RANGES = [(-1.0, 1.0), (0.0, 3.0)]


def adversarial_heads(seed: int, shape=(2, 3, 8, 8), dtype=torch.float64):
    """Heads no network should give: large e1, e2 often below e1^2 (a negative variance), huge |e3|."""
    g = torch.Generator().manual_seed(seed)
    x_t = 2 * torch.randn(shape, generator=g, dtype=torch.float64)
    e1 = 5 * torch.randn(shape, generator=g, dtype=torch.float64)
    e2 = e1 * e1 * torch.rand(shape, generator=g, dtype=torch.float64) * 2 + 10 * torch.randn(shape, generator=g,
                                                                                              dtype=torch.float64)
    e3 = 1e4 * torch.randn(shape, generator=g, dtype=torch.float64)
    return x_t.to(dtype), torch.cat([e1, e2, e3], 1).to(dtype)


def x0_moments_used(x_t, heads, t, data_range, moments):
    """(mean, Var, kappa3) of x_0 as transition_moments forms them: its moments for the step t -> data (c1 = 0,
    c2 = 1, lam2 = 0), whose transition is x_0 itself."""
    k = denoise_coefficients(SCHED.coefficients(t, 0))
    mom = transition_moments(x_t, *heads.chunk(3, dim=1), k, data_range, moments=moments)
    kappa3 = mom.m3 - 3 * mom.m1 * mom.var - mom.m1**3
    return mom.m1, mom.var, kappa3


def infeasible(mean, var, kappa3, data_range, tol=1e-9):
    """Where (mean, var, kappa3) is not the moments of any distribution on ``data_range`` (up to ``tol``)."""
    lo, hi = data_range
    scale = (hi - lo) ** 3
    least, greatest = third_moment_bounds(mean.clamp(lo, hi), var.clamp_min(0.0), data_range)
    return ((mean < lo - tol) | (mean > hi + tol) | (var < -tol) | (var > (mean - lo) * (hi - mean) + tol)
            | (kappa3 < least - tol * scale) | (kappa3 > greatest + tol * scale))


# -- moments -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("data_range", RANGES)
@pytest.mark.parametrize("t", [t for t, _ in STEPS])
def test_feasible_moments_are_feasible_on_adversarial_heads(t, data_range):
    x_t, heads = adversarial_heads(t)
    mean, var, kappa3 = x0_moments_used(x_t, heads, t, data_range, "feasible")
    assert not infeasible(mean, var, kappa3, data_range).any()
    # the official clamps leave many elements infeasible on the same heads (what the option is for)
    assert infeasible(*x0_moments_used(x_t, heads, t, data_range, "clamped"), data_range).float().mean() > 0.05


@pytest.mark.parametrize("data_range", RANGES)
@pytest.mark.parametrize("t,s", STEPS)
def test_feasible_transition_moments_carry_feasible_x0_moments(t, s, data_range):
    """In the step t -> s itself: Var = lam2 + c2^2 Var[x0] and kappa3 = c2^3 kappa3[x0] (the posterior noise
    adds no skew), so the x0 moments read back from (M1, Var, M3) are feasible too."""
    x_t, heads = adversarial_heads(s + 1)
    k = SCHED.coefficients(t, s)
    mom = transition_moments(x_t, *heads.chunk(3, dim=1), k, data_range, moments="feasible")
    mean = (mom.m1 - k.c1 * x_t) / k.c2
    var = (mom.var - k.lam2) / k.c2**2
    kappa3 = (mom.m3 - 3 * mom.m1 * mom.var - mom.m1**3) / k.c2**3
    assert not infeasible(mean, var, kappa3, data_range, tol=1e-6).any()


@pytest.mark.parametrize("t,s", STEPS)
def test_gms_step_with_feasible_moments_is_finite_on_adversarial_heads(t, s):
    x_t, heads = adversarial_heads(t + s)
    for data_range in RANGES:
        for fit in ("closed", "adan"):
            x_s = gk.step(x_t, heads, t, s, SCHED, "gms", generator=0, data_range=data_range, moments="feasible",
                          fit=fit)
            assert torch.isfinite(x_s).all()


def smooth_oracle():
    """Exact heads of a mixture whose mass lies well inside [-1, 1] (means within +-0.5, stds <= 0.08), so that
    no bound of the data range is needed: its posterior moments are feasible as they are."""
    g = torch.Generator().manual_seed(5)
    means = torch.rand(3, 3, 6, 6, generator=g, dtype=torch.float64) - 0.5
    stds = torch.rand(3, 3, 6, 6, generator=g, dtype=torch.float64) * 0.05 + 0.03
    return gk.GaussianMixtureOracle([0.2, 0.3, 0.5], means, stds, SCHED)


@pytest.mark.parametrize("solver", ["gms", "sn-ddpm"])
def test_feasible_moments_change_nothing_with_exact_heads(solver):
    """With exact heads and s > 0 the step with moments="feasible" and data_range=(-1, 1) is the unclamped step,
    bit for bit, while the official clamps change GMS's step (their E[x0^3] replacement binds on exact heads)."""
    oracle = smooth_oracle()
    g = torch.Generator().manual_seed(11)
    clamps_bind = False
    for t, s in STEPS:
        comp = torch.randint(0, 3, (4,), generator=g)
        x0 = oracle.means[comp] + oracle.variances[comp].sqrt() * torch.randn(4, 3, 6, 6, generator=g,
                                                                              dtype=torch.float64)
        x_t = SCHED.alpha(t) * x0 + SCHED.sigma(t) * torch.randn(x0.shape, generator=g, dtype=torch.float64)
        heads = oracle(x_t, t)[:, :9 if solver == "gms" else 6]
        z = torch.randn(x0.shape, generator=g, dtype=torch.float64)
        u = torch.rand(x0.shape, generator=g, dtype=torch.float64)
        kw = dict(noise=z, uniform=u, backend="torch")
        free = gk.step(x_t, heads, t, s, SCHED, solver, data_range=None, **kw)
        feasible = gk.step(x_t, heads, t, s, SCHED, solver, data_range=(-1.0, 1.0), moments="feasible", **kw)
        assert torch.equal(feasible, free), (t, s)
        clamped = gk.step(x_t, heads, t, s, SCHED, solver, data_range=(-1.0, 1.0), **kw)
        clamps_bind |= not torch.equal(clamped, free)
    assert clamps_bind == (solver == "gms")


@pytest.mark.parametrize("solver", ["gms", "sn-ddpm"])
def test_clamped_and_feasible_differ_where_the_clamps_bind(solver):
    x_t, heads = adversarial_heads(3)
    heads = heads[:, :9 if solver == "gms" else 6]
    kw = dict(generator=4, data_range=(-1.0, 1.0), backend="torch")
    clamped = gk.step(x_t, heads, 600, 400, SCHED, solver, **kw)
    feasible = gk.step(x_t, heads, 600, 400, SCHED, solver, moments="feasible", **kw)
    assert (clamped != feasible).float().mean() > 0.05
    assert torch.equal(gk.step(x_t, heads, 600, 400, SCHED, solver, moments="clamped", **kw), clamped)  # default


@pytest.mark.parametrize("solver", ["gms", "sn-ddpm"])
def test_feasible_moments_run_the_torch_step_on_the_cpp_backend(solver, fused_kernel_calls):
    x_t, heads = adversarial_heads(1, dtype=torch.float32)
    heads = heads[:, :9 if solver == "gms" else 6]
    gk.step(x_t, heads, 600, 400, SCHED, solver, generator=0, backend="cpp", moments="feasible")
    assert fused_kernel_calls == []
    gk.step(x_t, heads, 600, 400, SCHED, solver, generator=0, backend="cpp")
    assert fused_kernel_calls == ["cpp"]


@pytest.mark.parametrize("solver", ["gms", "sn-ddpm"])
@pytest.mark.parametrize("t,s", [(600, 400), (100, 0)])
def test_feasible_moments_agree_across_cpu_backends(solver, t, s):
    x_t, heads = adversarial_heads(t, dtype=torch.float32)
    heads = heads[:, :9 if solver == "gms" else 6]
    kw = dict(generator=[3, 4], data_range=(0.0, 3.0), moments="feasible")
    cpp = gk.step(x_t, heads, t, s, SCHED, solver, backend="cpp", **kw)
    ref = gk.step(x_t, heads, t, s, SCHED, solver, backend="torch", **kw)
    assert cpp.dtype == torch.float32 and torch.isfinite(cpp).all()
    assert torch.equal(cpp, ref)


@pytest.mark.parametrize("bad", ["exact", "Feasible", None, 1])
def test_bad_moments_are_refused(bad):
    x_t, heads = adversarial_heads(0)
    for solver, n in (("gms", 9), ("sn-ddpm", 6)):
        with pytest.raises(ValueError, match="moments must be one of 'clamped', 'feasible'"):
            gk.step(x_t, heads[:, :n], 600, 400, SCHED, solver, generator=0, moments=bad)
    with pytest.raises(ValueError, match="moments must be one of"):
        transition_moments(x_t, *heads.chunk(3, dim=1), SCHED.coefficients(600, 400), moments=bad)


# -- pixel_levels ------------------------------------------------------------------------------------------------

def test_default_cap_is_one_8_bit_level():
    for lo, hi in RANGES + [(-2.0, 3.0)]:
        by_hand = (1.0 * ((hi - lo) / 255) * math.sqrt(math.pi / 2)) ** 2
        assert last_step_variance_cap((lo, hi)) == by_hand  # bit for bit
        assert last_step_variance_cap((lo, hi), 1.0, 256) == by_hand
        assert last_step_variance_cap((lo, hi), 0.5, 17) == (0.5 * (hi - lo) / 16 * math.sqrt(math.pi / 2)) ** 2
        assert last_step_variance_cap((lo, hi), 1.0, None) is None
    assert resolve_options("sn-ddpm").pixel_levels == 256


def wide_last_step(dtype=torch.float64):
    """Heads at t = 100 whose Var[x0|x_t] is large (e2 - e1^2 = 5): the step into 0 has Var far above every cap."""
    g = torch.Generator().manual_seed(9)
    x_t = torch.randn(2, 1, 5, 5, generator=g, dtype=torch.float64)
    e1 = 0.3 * torch.randn(x_t.shape, generator=g, dtype=torch.float64)
    e2 = e1 * e1 + 5.0
    e3 = e1**3 + 15.0 * e1
    return x_t.to(dtype), torch.cat([e1, e2, e3], 1).to(dtype)


@pytest.mark.parametrize("solver", ["gms", "sn-ddpm"])
@pytest.mark.parametrize("data_range", RANGES)
def test_pixel_levels_set_the_last_step_cap(solver, data_range):
    x_t, heads = wide_last_step()
    heads = heads[:, :9 if solver == "gms" else 6]
    k = SCHED.coefficients(100, 0)
    uncapped = transition_moments(x_t, *heads.chunk(3, dim=1)[:2], None, k, data_range).var
    lo, hi = data_range
    for levels, cap in ((256, ((hi - lo) / 255) ** 2 * math.pi / 2), (17, ((hi - lo) / 16) ** 2 * math.pi / 2)):
        _, info = gk.step(x_t, heads, 100, 0, SCHED, solver, generator=0, data_range=data_range, return_info=True,
                          backend="torch", pixel_levels=levels)
        torch.testing.assert_close(info["var"], torch.full_like(x_t, cap), rtol=1e-14, atol=0)
    _, info = gk.step(x_t, heads, 100, 0, SCHED, solver, generator=0, data_range=data_range, return_info=True,
                      backend="torch", pixel_levels=None)
    assert torch.equal(info["var"], uncapped) and float(uncapped.min()) > 5 * ((hi - lo) / 16) ** 2 * math.pi / 2


@pytest.mark.parametrize("solver", ["gms", "sn-ddpm"])
@pytest.mark.parametrize("levels", [17, None])
def test_pixel_levels_agree_across_cpu_backends(solver, levels):
    x_t, heads = wide_last_step(torch.float32)
    heads = heads[:, :9 if solver == "gms" else 6]
    cfg = fused_config(solver, {"pixel_levels": levels}, SCHED.coefficients(100, 0), (0.0, 3.0), SCHED.T, 2, 25)
    assert cfg is not None  # the fused kernel runs this step (pixel_levels is not a torch-only option)
    assert cfg.var_cap == (math.inf if levels is None else last_step_variance_cap((0.0, 3.0), 1.0, levels))
    kw = dict(generator=[1, 2], data_range=(0.0, 3.0), pixel_levels=levels)
    cpp = gk.step(x_t, heads, 100, 0, SCHED, solver, backend="cpp", **kw)
    ref = gk.step(x_t, heads, 100, 0, SCHED, solver, backend="torch", **kw)
    torch.testing.assert_close(cpp, ref, rtol=1e-5, atol=1e-5)
    capped = gk.step(x_t, heads, 100, 0, SCHED, solver, backend="cpp", **dict(kw, pixel_levels=256))
    assert not torch.allclose(cpp, capped)  # the option reaches the kernel


@pytest.mark.parametrize("bad", [1, 0, -3, 2.5, 256.0, True, "8"])
def test_bad_pixel_levels_are_refused(bad):
    for solver in ("gms", "sn-ddpm", "analytic-dpm", "ddpm"):
        with pytest.raises(ValueError, match="pixel_levels must be an integer >= 2"):
            resolve_options(solver, {"pixel_levels": bad, **({"gamma": [0.5] * 10} if solver == "analytic-dpm"
                                                              else {})})
    with pytest.raises(ValueError, match="pixel_levels must be an integer >= 2"):
        last_step_variance_cap((-1.0, 1.0), 1.0, bad)


# -- presets, models, the command line -----------------------------------------------------------------------------

def test_official_preset_pins_both():
    class Model:
        solver_defaults = {"gms": {"moments": "feasible", "pixel_levels": 17}}

    gms = get_solver("gms")
    options = gms.resolve(with_model_defaults(gms, {"preset": "official"}, Model()))
    assert (options.moments, options.pixel_levels) == ("clamped", 256)
    own = gms.resolve(with_model_defaults(gms, {}, Model()))
    assert (own.moments, own.pixel_levels) == ("feasible", 17)


def test_command_line_spells_the_options_as_json():
    parser = build_parser()
    args = parser.parse_args(["sample", "--solver", "sn-ddpm", "--option", "moments=feasible",
                              "--option", "pixel_levels=17"])
    assert _solver_options(args) == {"moments": "feasible", "pixel_levels": 17}
    args = parser.parse_args(["sample", "--solver", "gms", "--option", "pixel_levels=null"])
    assert _solver_options(args) == {"pixel_levels": None}
    assert resolve_options("gms", _solver_options(args)).pixel_levels is None


def test_sample_and_scheduler_take_the_options():
    oracle = smooth_oracle()
    x = gk.sample(oracle, (2, 3, 6, 6), steps=4, solver="gms", generator=0, progress=False, moments="feasible",
                  pixel_levels=17, dtype=torch.float64)
    assert x.shape == (2, 3, 6, 6) and torch.isfinite(x).all()
    scheduler = gk.GMSScheduler(solver="sn-ddpm", model_heads=2,
                                solver_options={"moments": "feasible", "pixel_levels": None})
    scheduler.set_timesteps(4)
    sample = torch.randn(1, 3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for t in scheduler.timesteps:
        sample = scheduler.step(oracle(sample, int(t))[:, :6], t, sample, generator=torch.Generator().manual_seed(1)
                                ).prev_sample
    assert torch.isfinite(sample).all()
