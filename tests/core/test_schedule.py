import math

import pytest
import torch

import gms_kernels as gk


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
