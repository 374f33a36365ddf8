import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import gms_kernels as gk
from gms_kernels.core.schedule import check_schedule, schedule_for, time_index


def test_linear_schedule_hand_values():
    s = gk.Schedule.linear(1000, 1e-4, 0.02)
    assert s.T == 1000 and s.betas.dtype == torch.float64
    beta1 = 1e-4 + (0.02 - 1e-4) / 999
    assert float(s.betas[1]) == pytest.approx(beta1, rel=1e-12)
    abar1 = (1 - 1e-4) * (1 - beta1)
    assert s.alpha(1) == pytest.approx(math.sqrt(abar1), rel=1e-12)
    assert s.sigma(1) == pytest.approx(math.sqrt(1 - abar1), rel=1e-12)
    assert s.alpha(-1) == 1.0 and s.sigma(-1) == 0.0


def test_cosine_schedule_hand_values():
    s = gk.Schedule.cosine(1000)
    f = lambda u: math.cos((u + 0.008) / 1.008 * math.pi / 2) ** 2
    assert float(s.betas[0]) == pytest.approx(1 - f(1 / 1000) / f(0), rel=1e-10)
    assert float(s.betas[-1]) == pytest.approx(0.999)  # capped
    assert float(s.betas.max()) <= 0.999


def test_from_betas_rejects_bad_values():
    with pytest.raises(ValueError, match="open interval"):
        gk.Schedule.from_betas([0.1, 1.0])
    with pytest.raises(ValueError, match="open interval"):
        gk.Schedule.from_betas([float("nan")])


def test_step_coefficients_match_ddpm_posterior():
    s = gk.Schedule.linear()
    k = s.coefficients(1, 0)
    ab0, ab1, b1 = (float(v) for v in (s.alphas_cumprod[0], s.alphas_cumprod[1], s.betas[1]))
    assert k.c1 == pytest.approx(math.sqrt(1 - b1) * (1 - ab0) / (1 - ab1), rel=1e-12)
    assert k.c2 == pytest.approx(math.sqrt(ab0) * b1 / (1 - ab1), rel=1e-12)
    assert k.lam2 == pytest.approx((1 - ab0) / (1 - ab1) * b1, rel=1e-12)
    assert k.beta_ts == pytest.approx(1 - ab1 / ab0, rel=1e-9)
    d = s.coefficients(500, gk.DATA)
    assert (d.c1, d.c2, d.lam2) == (0.0, pytest.approx(1.0), 0.0)


def test_step_coefficients_reject_bad_times():
    s = gk.Schedule.linear(100)
    with pytest.raises(ValueError, match="s < t"):
        s.coefficients(10, 10)
    with pytest.raises(ValueError, match="out of range"):
        s.coefficients(100, 5)


def test_step_coefficients_are_memoised_by_integer_times():
    s = gk.Schedule.linear(100)
    k = s.coefficients(50, 20)
    # the same pair, however the times are spelt, gives the same (frozen) values
    assert s.coefficients(50, 20) is k
    assert s.coefficients(torch.tensor(50), torch.tensor(20)) is k
    assert s.coefficients(50, 20) == gk.Schedule.linear(100).coefficients(50, 20)
    # a cached pair does not let a bad one through
    with pytest.raises(ValueError, match="s < t"):
        s.coefficients(20, 50)
    with pytest.raises(ValueError, match="out of range"):
        s.coefficients(50, -2)


def test_trajectories_hand_values():
    assert gk.trajectory(1000, 10) == [999, 899, 799, 699, 599, 499, 399, 299, 199, 99, 0]
    assert gk.trajectory(1000, 4) == [999, 749, 499, 249, 0]
    assert gk.trajectory(1000, 10, "linear") == [999, 899, 799, 699, 599, 500, 400, 300, 200, 100, 0]
    assert gk.trajectory(1000, 4, "quad") == [999, 562, 250, 62, 0]
    assert gk.trajectory(1000, 10, "leading") == [900, 800, 700, 600, 500, 400, 300, 200, 100, 0]
    assert gk.trajectory(1000, 10, "trailing") == [999, 899, 799, 699, 599, 499, 399, 299, 199, 99]
    assert gk.trajectory(1000, 10, "linspace") == [999, 888, 777, 666, 555, 444, 333, 222, 111, 0]
    assert gk.trajectory(1000, 3, [700, 20, 5]) == [700, 20, 5]


@pytest.mark.parametrize("kind", gk.TRAJECTORY_KINDS)
@pytest.mark.parametrize("steps", [1, 2, 7, 100])
def test_trajectories_are_strictly_descending_in_range(kind, steps):
    ts = gk.trajectory(100, steps, kind)
    assert all(a > b for a, b in zip(ts, ts[1:]))
    assert 0 <= ts[-1] and ts[0] <= 99


def test_trajectory_takes_a_schedule_or_its_length_and_an_explicit_list_in_any_integral_form():
    assert gk.trajectory(gk.Schedule.linear(100), 4) == gk.trajectory(100, 4) == [99, 74, 49, 24, 0]
    for explicit in (torch.tensor([700, 20, 0]), torch.tensor([[700], [20], [0]]), (700.0, 20, np.int64(0))):
        ts = gk.trajectory(1000, 3, explicit)
        assert ts == [700, 20, 0] and all(type(t) is int for t in ts)


def test_leading_trajectory_steps_by_the_integer_ratio():
    """diffusers' "leading": multiples of T // K (333 for T = 1000, K = 3), integers however T divides."""
    ts = gk.trajectory(1000, 3, "leading")
    assert ts == [666, 333, 0] and all(type(t) is int for t in ts)


def test_rounding_collisions_are_nudged_up_so_a_dense_trajectory_keeps_every_step():
    """The quad list rounds several of its small times to the same index (0, 0, 2, 4, ...); each collision is moved
    one index above the previous point, so K steps stay K steps."""
    raw = [round((math.sqrt(999) * (50 - i) / 50) ** 2) for i in range(51)]
    assert len(set(raw)) < len(raw)  # the collisions this test is about
    ts = gk.trajectory(1000, 50, "quad")
    assert len(ts) == 51 and ts[-3:] == [2, 1, 0] and ts[0] == 999


def test_trajectory_errors_say_what_to_do():
    with pytest.raises(ValueError, match="valid kinds: even, linear, quad, leading, trailing, linspace"):
        gk.trajectory(1000, 10, "cosine")
    for bad in (0, 1001, -3, 2.5):
        with pytest.raises(ValueError, match=r"steps must be an integer in \[1, T = 1000\]"):
            gk.trajectory(1000, bad)
    with pytest.raises(ValueError, match="strictly descending"):
        gk.trajectory(1000, 3, [5, 10])
    with pytest.raises(ValueError, match="must lie in"):
        gk.trajectory(1000, 3, [1000, 3])
    with pytest.raises(ValueError, match="strictly descending"):
        gk.trajectory(1000, 3, [5, 5, 0])
    with pytest.raises(ValueError, match=r"^every trajectory entry must be an integer time index .* got 20\.5"):
        gk.trajectory(1000, 3, [700, 20.5])


SCHED = gk.Schedule.linear(1000)


def test_log_alpha_bar_at_a_python_float_is_computed_in_float64():
    u = 0.123456789
    pos = u * SCHED.T
    left = int(pos)
    log_abar = SCHED.alphas_cumprod.log()
    expected = log_abar[left - 1] + (pos - left) * (log_abar[left] - log_abar[left - 1])  # knots at u = (t + 1) / T
    got = SCHED.log_alpha_bar_at(u)
    assert got.dtype == torch.float64
    assert abs(float(got) - float(expected)) < 1e-12


def test_log_alpha_bar_at_clamps_u_to_the_unit_interval_and_interpolates_the_first_interval():
    log_abar = SCHED.alphas_cumprod.log()
    u = torch.tensor([-0.5, 0.0, 0.5 / SCHED.T, 1.0, 1.5], dtype=torch.float64)
    expected = torch.stack([torch.tensor(0.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64),
                            log_abar[0] / 2, log_abar[-1], log_abar[-1]])  # data at u = 0, index 0 at u = 1/T
    assert torch.allclose(SCHED.log_alpha_bar_at(u), expected, rtol=1e-13, atol=0)


def test_beta_at_reads_the_interval_below_u_in_float64():
    beta = -SCHED.T * torch.log1p(-SCHED.betas)  # the constant rate on ((t) / T, (t + 1) / T]
    # u = 0 is in the first interval; a knot counts as below; 1e-8 past the knot at u = 0.25 is the next
    # interval, which float32 (spacing 3e-8 there) would round back onto the knot
    for u, t in ((-0.5, 0), (0.0, 0), (0.25, 249), (0.25 + 1e-8, 250), (1.0, SCHED.T - 1), (1.5, SCHED.T - 1)):
        assert float(SCHED.beta_at(u)) == pytest.approx(float(beta[t]), rel=1e-14), u


def test_index_of_ve_sigma_breaks_ties_down_and_rounds_in_float64():
    grid = SCHED.ve_sigmas
    mid = (grid[:-1] + grid[1:]) / 2
    # an exact tie between two trained sigmas goes to the lower index (EDM's round_sigma takes the first minimum)
    k = next(k for k in range(SCHED.T - 1) if mid[k] - grid[k] == grid[k + 1] - mid[k])
    assert int(SCHED.index_of_ve_sigma(float(mid[k]))) == k
    # one float64 step above a midpoint is nearer the upper index; float32 would round it back below
    for k in range(SCHED.T - 1):
        above = torch.nextafter(mid[k], torch.tensor(float("inf"), dtype=torch.float64))
        if torch.tensor(float(above), dtype=torch.float32).double() < mid[k]:
            assert int(SCHED.index_of_ve_sigma(float(above))) == k + 1
            break
    else:
        pytest.fail("no midpoint that float32 rounds down")


def test_index_of_ve_sigma_on_one_and_two_step_schedules():
    one = gk.Schedule.from_betas([0.3])
    assert one.index_of_ve_sigma(torch.tensor([0.0, 0.1, 5.0])).tolist() == [0, 0, 0]
    two = gk.Schedule.from_betas([0.1, 0.5])
    grid = two.ve_sigmas
    probes = torch.tensor([0.0, float(grid[0]), float(grid[1]) * 0.99, 100.0], dtype=torch.float64)
    assert two.index_of_ve_sigma(probes).tolist() == [0, 0, 1, 1]


def test_ve_sigmas_of_a_schedule_built_in_the_test():
    # (built here, not at import: mutmut credits a test only with the calls made while it runs)
    schedule = gk.Schedule.from_betas([0.1, 0.5])
    abar = torch.tensor([0.9, 0.9 * 0.5], dtype=torch.float64)
    assert torch.allclose(schedule.ve_sigmas, ((1 - abar) / abar).sqrt(), rtol=1e-14, atol=0)
    assert schedule.ve_sigma(1) == pytest.approx(float(((1 - abar[1]) / abar[1]).sqrt()), rel=1e-14)


def test_schedules_and_their_continuous_time_views_ignore_the_default_device():
    """``log_alpha_bar_at`` makes its knot at u = 0, ``karras_trajectory`` its levels, ``Schedule.linear`` its
    betas and a schedule its (a_t, sigma_t) tables on the CPU, not on torch's default device. Under a *meta*
    default device such a tensor would hold no data, so the result could not be the CPU one (as in
    tests/sampling/test_default_device.py)."""
    u = torch.tensor([0.0, 0.3, 0.75, 1.0], dtype=torch.float64)

    def views():
        schedule = gk.Schedule.linear(1000)  # built inside: mutmut credits only calls made while a test runs
        karras = torch.tensor(gk.karras_trajectory(schedule, 18), dtype=torch.float64, device="cpu")
        return torch.cat([schedule.betas, schedule.log_alpha_bar_at(u), schedule.log_alpha_bar_at(0.3).reshape(1),
                          schedule.beta_at(u), karras, *schedule.alpha_sigma(torch.tensor([0, 5, -1], device="cpu"))])

    expected = views()
    with torch.device("meta"):
        got = views()
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_schedule_defaults_and_repr():
    """The cosine schedule's defaults are improved-diffusion's (T = 1000, s = 0.008, max_beta = 0.999)."""
    s = gk.Schedule.cosine()
    assert s.T == 1000

    def abar(u):
        return math.cos((u + 0.008) / 1.008 * math.pi / 2) ** 2

    expected = [min(1 - abar((i + 1) / 1000) / abar(i / 1000), 0.999) for i in range(1000)]
    assert s.betas.tolist() == pytest.approx(expected, rel=1e-12)
    assert s.betas[-1].item() == 0.999  # the cap binds at the last step
    assert repr(gk.Schedule.linear(10, 1e-3, 0.2)) == "Schedule(T=10, beta[0]=0.001, beta[-1]=0.2)"


def test_schedule_refuses_the_boundary_betas_and_lengths():
    """beta = 0 (a step that adds no noise) and beta = 1 are refused; T may be 65535 but not 65536
    (the Philox counters and the kernels' time index hold 16 bits)."""
    for bad in ([0.0, 0.1], [0.1, 1.0]):
        with pytest.raises(ValueError, match="open interval"):
            gk.Schedule(bad)
    assert gk.Schedule(torch.full((2**16 - 1,), 1e-3)).T == 65535
    with pytest.raises(ValueError, match="at most 65535"):
        gk.Schedule(torch.full((2**16,), 1e-3))


@pytest.mark.parametrize("T, K", [(1000, 10), (1000, 400), (1000, 700), (1000, 1000), (100, 3), (7, 7)])
def test_even_trajectory_is_the_official_list(T, K):
    """The official GMS list t_i = floor(T - 1 - i T/K), i < K, with 0 appended when missing; it ends in
    1 for 2 <= T/K < 3 (then 0 is appended) and in 0 for T/K < 2 (nothing is appended)."""
    official = [math.floor(T - 1 - i * T / K) for i in range(K)]
    if official[-1] != 0:
        official.append(0)
    assert gk.trajectory(T, K, "even") == official


@pytest.mark.parametrize("K", [1, 2, 3, 10, 50])
def test_linspace_trajectory_is_diffusers_linspace(K):
    """diffusers' "linspace" spacing: linspace(0, T - 1, K) rounded, descending (K = 1 gives [0])."""
    expected = np.linspace(0, 999, K).round()[::-1].astype(int).tolist()
    assert gk.trajectory(1000, K, "linspace") == expected


def test_step_coefficients_a_ts_is_the_ratio():
    """a_{t|s} = a_t / a_s (a public field the samplers themselves do not read)."""
    s = gk.Schedule.linear()
    for t, u in [(999, 899), (10, 0), (5, -1)]:
        k = s.coefficients(t, u)
        assert k.a_ts == pytest.approx(s.alpha(t) / s.alpha(u), rel=1e-15)


def test_a_fractional_time_index_is_named_in_the_error():
    with pytest.raises(ValueError, match="^time index must be an integer time index"):
        gk.Schedule.linear(100).alpha(3.5)


@pytest.mark.parametrize("value", [7, 7.0, torch.tensor(7), torch.tensor([7.0]), torch.tensor(7, dtype=torch.int16)])
def test_time_index_takes_integral_values_of_any_numeric_type(value):
    assert time_index(value) == 7 and type(time_index(value)) is int
    assert time_index(np.float64(7.0)) == 7 and time_index(np.int32(7)) == 7


@pytest.mark.parametrize("value", [True, False, torch.tensor(True), 7.5, "7", None, torch.tensor([1, 2])])
def test_time_index_refuses_booleans_fractions_and_non_numbers(value):
    """A bool is an Integral in Python, but a time index of True is a caller's mistake, not t = 1."""
    with pytest.raises(ValueError, match="^t must be an integer time index"):
        time_index(value, "t")


LINEAR_BETAS = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64).tolist()


def _abar(t: int) -> float:
    """prod_{i<=t} (1 - beta_i) of the linear schedule, recomputed here (1 for the data, t = -1)."""
    return 1.0 if t < 0 else math.prod(1.0 - b for b in LINEAR_BETAS[: t + 1])


@pytest.mark.parametrize("t, s", [(500, 400), (10, 0), (999, -1)])
def test_denoise_coefficients_are_the_schedules_step_to_data(t, s):
    """The shortcut t -> data coefficients (DDIM's x0, the callback's "denoised") equal the schedule's own
    coefficients of the step t -> -1, every field: a_s = 1, sigma_s = 0, a_ts = a_t, beta_ts = sigma_t^2,
    c1 = 0, c2 = 1, lam2 = 0."""
    from dataclasses import fields

    from gms_kernels.solvers import denoise_coefficients

    sched = gk.Schedule.linear()
    got, ref = denoise_coefficients(sched.coefficients(t, s)), sched.coefficients(t, -1)
    for f in fields(ref):
        assert getattr(got, f.name) == pytest.approx(getattr(ref, f.name), rel=1e-12, abs=1e-15), f.name
    assert (got.a_ts, got.beta_ts) == pytest.approx((math.sqrt(_abar(t)), 1 - _abar(t)), rel=1e-12)


def test_log_alpha_bar_at_holds_its_end_values_outside_0_1_and_weights_must_be_positive():
    """log_alpha_bar_at clamps continuous time to [0, 1] (no extrapolation past the last knot: u = 1.5 gives
    log abar_{T-1}, u = -0.5 gives 0); mixture weights (1, 0) are refused (both must be positive)."""
    from gms_kernels.core.fit import check_weights

    sched = gk.Schedule.linear(10)
    last = math.log(float(sched.alphas_cumprod[-1]))
    got = sched.log_alpha_bar_at(torch.tensor([1.5, 1.0, -0.5, 0.0]))
    torch.testing.assert_close(got, torch.tensor([last, last, 0.0, 0.0], dtype=torch.float64), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="weights must be positive and sum to 1"):
        check_weights((1.0, 0.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_add_noise_takes_one_time_index_per_sample(dtype):
    """A tensor [N] of indices noises each row with its own a_t, sigma_t: row by row what the scalar form gives,
    bit for bit (the same float64 values in x0's dtype); DATA (-1) leaves the row clean."""
    s = gk.Schedule.linear(1000)
    g = torch.Generator().manual_seed(0)
    x0, eps = (torch.randn(4, 2, 3, generator=g, dtype=dtype) for _ in range(2))
    t = torch.tensor([999, 0, 417, -1])
    got = s.add_noise(x0, eps, t)
    assert got.dtype == dtype
    for i, ti in enumerate(t.tolist()):
        assert torch.equal(got[i], s.add_noise(x0[i], eps[i], ti))
    assert torch.equal(got[3], x0[3])
    assert torch.equal(s.add_noise(x0, eps, torch.tensor(417)), s.add_noise(x0, eps, 417))


def test_add_noise_puts_the_per_sample_coefficients_on_the_device_of_x0():
    """Indices on the CPU, images elsewhere (the meta device stands in for a GPU here): a_t and sigma_t follow x0."""
    x0 = torch.zeros(3, 2, device="meta")
    assert gk.Schedule.linear(1000).add_noise(x0, x0, torch.tensor([1, 2, 3])).device.type == "meta"


def test_alpha_sigma_of_a_tensor_of_indices_are_the_scalar_values():
    s = gk.Schedule.cosine(50)
    t = torch.tensor([[0, 49], [-1, 7]])
    a, sigma = s.alpha_sigma(t)
    assert a.shape == sigma.shape == t.shape and a.dtype == torch.float64
    assert a.flatten().tolist() == [s.alpha(i) for i in t.flatten().tolist()]
    assert sigma.flatten().tolist() == [s.sigma(i) for i in t.flatten().tolist()]


def test_add_noise_refuses_indices_it_cannot_use():
    s = gk.Schedule.linear(10)
    x0 = torch.zeros(2, 3)
    with pytest.raises(TypeError, match="integer tensor"):
        s.add_noise(x0, x0, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="lie in"):
        s.add_noise(x0, x0, torch.tensor([10, 0]))
    with pytest.raises(ValueError, match="one per sample"):
        s.add_noise(x0, x0, torch.tensor([1, 2, 3]))


def test_diffusers_schedule_reads_a_scheduler_config():
    """gk.Schedule from a diffusers scheduler config: its named betas over num_train_timesteps, trained_betas first;
    a zero terminal SNR is refused, naming the setting."""
    from gms_kernels.core.schedule import diffusers_schedule, make_betas

    s = diffusers_schedule({"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012,
                            "num_train_timesteps": 20})
    assert torch.equal(s.betas, torch.linspace(0.00085**0.5, 0.012**0.5, 20, dtype=torch.float64) ** 2)
    assert torch.equal(diffusers_schedule({"beta_schedule": "squaredcos_cap_v2", "num_train_timesteps": 30}).betas,
                       gk.Schedule.cosine(30).betas)
    assert diffusers_schedule({"trained_betas": [0.1, 0.2], "beta_schedule": "linear"}).betas.tolist() == [0.1, 0.2]
    assert torch.equal(make_betas(5, 1e-4, 0.02, "linear"), gk.Schedule.linear(5).betas)
    with pytest.raises(ValueError, match="rescale_betas_zero_snr"):
        diffusers_schedule({"rescale_betas_zero_snr": True})
    with pytest.raises(ValueError, match="unknown beta_schedule 'laplace'"):
        make_betas(10, 1e-4, 0.02, "laplace")


def test_ve_sigma_is_sigma_over_alpha_and_zero_at_data():
    s = gk.Schedule.linear(100)
    assert s.ve_sigma(-1) == 0.0
    assert s.ve_sigma(37) == pytest.approx(s.sigma(37) / s.alpha(37), rel=1e-15)


def test_index_at_is_the_index_whose_noise_level_is_nearest_abar_of_u():
    """At u = (t + 1) / T the continuous schedule passes through index t's abar, so index_at gives t; data (u = 0)
    and anything below index 0's noise level give 0, u past 1 the last index."""
    s = gk.Schedule.linear(100)
    t = torch.tensor([0, 1, 10, 57, 98, 99])
    assert s.index_at((t + 1).double() / s.T).tolist() == t.tolist()
    assert s.index_at(torch.tensor([0.0, 0.2 / s.T, 1.5])).tolist() == [0, 0, 99]
    # between two knots: the index whose ve_sigma is nearest the interpolated one
    u = torch.tensor([0.4237, 0.8761], dtype=torch.float64)
    sigma = torch.expm1(-s.log_alpha_bar_at(u)).sqrt()
    nearest = (sigma[:, None] - s.ve_sigmas[None, :]).abs().argmin(dim=1)
    assert s.index_at(u).tolist() == nearest.tolist()


def test_alpha_sigma_refuses_a_boolean_index_tensor():
    with pytest.raises(TypeError, match="integer tensor"):
        gk.Schedule.linear(10).alpha_sigma(torch.tensor([True, False]))


def test_schedule_for_takes_the_given_schedule_then_the_models_own_then_ddpms_linear():
    given, own = gk.Schedule.cosine(20), gk.Schedule.linear(30)
    assert schedule_for(SimpleNamespace(schedule=own), given) is given
    assert schedule_for(SimpleNamespace(), {"beta_schedule": "linear", "num_train_timesteps": 12,
                                   "beta_start": 1e-4, "beta_end": 0.02}).T == 12  # a diffusers config
    assert schedule_for(SimpleNamespace(schedule=own)) is own
    fallback = schedule_for(SimpleNamespace())
    assert fallback.T == 1000 and torch.equal(fallback.betas, gk.Schedule.linear().betas)


def test_schedule_for_warns_only_when_the_model_says_its_schedule_is_unknown():
    with pytest.warns(UserWarning, match=r"training schedule is unknown \(no scheduler config\): assuming DDPM"):
        assert schedule_for(SimpleNamespace(schedule_note="no scheduler config")).T == 1000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert schedule_for(SimpleNamespace(schedule_note=None)).T == 1000
        assert schedule_for(SimpleNamespace(schedule=gk.Schedule.linear(5), schedule_note="stale")).T == 5


def test_check_schedule_takes_a_schedule_a_gms_scheduler_or_a_diffusers_config():
    """A GMSScheduler is recognised by its ``schedule`` and ``set_timesteps``; a diffusers scheduler by the
    ``config`` mapping it carries; an object with a ``schedule`` attribute alone (a model) is not a schedule."""
    own = gk.Schedule.cosine(20)
    config = {"beta_schedule": "linear", "num_train_timesteps": 12, "beta_start": 1e-4, "beta_end": 0.02}
    assert check_schedule(own) is own
    assert check_schedule(SimpleNamespace(schedule=own, set_timesteps=lambda n: None)) is own
    from_config = check_schedule(SimpleNamespace(config=config))
    assert from_config.T == 12 and torch.equal(from_config.betas, gk.Schedule.linear(12).betas)
    with pytest.raises(TypeError, match="^schedule must be a gk.Schedule, a diffusers scheduler"):
        check_schedule(SimpleNamespace(schedule=own))
    with pytest.raises(TypeError, match="^schedule must be a gk.Schedule"):
        check_schedule("linear")
