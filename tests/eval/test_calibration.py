"""gk.calibrate_heads against heads whose calibration slopes are known: exact heads (slopes 1), exact heads with
their central third moment halved (slope 2), heads without skew (no slope); and the moments after the data range's
bounds: unchanged where no bound binds, and, under the official clamps, blind to the heads' third moment where the
E[x_0^3] -> E[x_0] replacement binds on every element."""
import math

import pytest
import torch

import gms_kernels as gk

from readme_examples import example_file, readme_example

TIMESTEPS = [100, 300, 500]


class ScaledSkew(torch.nn.Module):
    """An oracle's exact heads with the central third moment c3 = e3 - 3 e1 e2 + 2 e1^3 multiplied by ``factor``
    (e1, e2 kept), returned in ``dtype``."""

    def __init__(self, oracle: torch.nn.Module, factor: float, dtype: torch.dtype | None = None):
        super().__init__()
        self.oracle, self.factor, self.dtype = oracle, factor, dtype

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        e1, e2, e3 = self.oracle(x_t.to(torch.float64), t).split(x_t.shape[1], dim=1)
        c3 = e3 - 3 * e1 * e2 + 2 * e1**3
        out = torch.cat([e1, e2, e3 + (self.factor - 1.0) * c3], dim=1)
        return out.to(self.dtype or x_t.dtype)


@pytest.fixture(scope="module")
def oracle():
    """Three-component Gaussian mixture on 1x2x2 data: the posterior over components stays uncertain enough
    for the noise to be skewed at every t calibrated here."""
    g = torch.Generator().manual_seed(1)
    centres = torch.tensor([-0.6, 0.1, 0.8], dtype=torch.float64).reshape(3, 1, 1, 1)
    means = centres + 0.1 * torch.randn(3, 1, 2, 2, generator=g, dtype=torch.float64)
    return gk.GaussianMixtureOracle([0.6, 0.25, 0.15], means, [0.15, 0.2, 0.1])


@pytest.fixture(scope="module")
def heldout(oracle):
    return oracle.sample_data(1000, generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def exact(oracle, heldout):
    return gk.calibrate_heads(oracle, heldout, timesteps=TIMESTEPS, draws=8, seed=0, level=0.99)


@pytest.fixture(scope="module")
def halved(oracle, heldout):
    return gk.calibrate_heads(ScaledSkew(oracle, 0.5), heldout, timesteps=TIMESTEPS, draws=8, seed=0, level=0.99)


def test_exact_heads_have_slope_one(exact):
    assert [r.t for r in exact.rows] == TIMESTEPS
    for r in exact.rows:
        assert r.images == 1000 and r.draws == 8 and r.n == 1000 * 8 * 4
        for slope, (low, high) in ((r.slope2, r.interval2), (r.slope3, r.interval3)):
            assert low < 1.0 < high and low < slope < high, r
            assert abs(slope - 1.0) < 0.25, r
        assert r.skew_defined and r.rms_c3 > 1e-3


def test_halved_skew_has_slope_two_and_leaves_the_variance_slope(halved, exact):
    for r, e in zip(halved.rows, exact.rows):
        assert r.slope2 == e.slope2 and r.interval2 == e.interval2  # the same draws, the same e1 and e2
        assert math.isclose(r.slope3, 2 * e.slope3, rel_tol=1e-9)  # half the regressor, twice the slope
        assert r.interval3[0] < 2.0 < r.interval3[1] and r.interval3[0] > 1.3, r
        assert math.isclose(r.rms_c3, e.rms_c3 / 2, rel_tol=1e-9)


def test_skew_scale_is_the_clipped_slope_and_the_solver_takes_it(oracle, exact, halved):
    lam = exact.skew_scale()
    assert list(lam) == TIMESTEPS and all(type(t) is int and type(v) is float for t, v in lam.items())
    assert all(v == min(max(exact.row(t).slope3, 0.0), 1.0) for t, v in lam.items())
    assert halved.skew_scale() == {t: 1.0 for t in TIMESTEPS}  # heads that under-state the skew keep it
    x = gk.sample(oracle, shape=(6, 1, 2, 2), trajectory=TIMESTEPS[::-1], generator=0, progress=False,
                  dtype=torch.float64, skew_scale=lam)
    assert x.shape == (6, 1, 2, 2) and torch.isfinite(x).all()


def test_heads_without_skew_have_no_slope(oracle, heldout):
    """c3 = 0 up to the rounding of the float32 heads: the slope is NaN, flagged, and the factor is the caller's."""
    flat = gk.calibrate_heads(ScaledSkew(oracle, 0.0, torch.float32), heldout[:200].float(), timesteps=TIMESTEPS,
                              draws=2, seed=0)
    for r in flat.rows:
        assert not r.skew_defined and math.isnan(r.slope3) and all(map(math.isnan, r.interval3))
        assert 0.9 < r.slope2 < 1.1
    assert flat.skew_scale() == {t: 0.0 for t in TIMESTEPS}
    assert flat.skew_scale(undefined=1.0) == {t: 1.0 for t in TIMESTEPS}
    assert flat.markdown().count("undefined") == len(TIMESTEPS)


def test_rows_are_reproducible_and_do_not_depend_on_the_other_timesteps(oracle, heldout):
    small = heldout[:100]
    both = gk.calibrate_heads(oracle, small, timesteps=[300, 100], draws=2, seed=5, n_boot=200)
    alone = gk.calibrate_heads(oracle, small, timesteps=[100], draws=2, seed=5, n_boot=200)
    assert alone.rows[0] == both.row(100)
    other = gk.calibrate_heads(oracle, small, timesteps=[100], draws=2, seed=6, n_boot=200)
    assert other.rows[0].slope3 != alone.rows[0].slope3
    default = gk.calibrate_heads(oracle, small[:10], draws=1, n_boot=100)
    assert [r.t for r in default.rows] == gk.trajectory(oracle.schedule, 10)  # what gk.sample visits by default


def test_feasible_moments_change_nothing_where_the_range_does_not_bind(oracle, heldout):
    small = heldout[:200]
    plain = gk.calibrate_heads(oracle, small, timesteps=[300], draws=2, seed=0, n_boot=200)
    wide = gk.calibrate_heads(oracle, small, timesteps=[300], draws=2, seed=0, n_boot=200, moments="feasible",
                              data_range=(-50.0, 50.0))
    narrow = gk.calibrate_heads(oracle, small, timesteps=[300], draws=2, seed=0, n_boot=200, moments="feasible",
                                data_range=(-0.2, 0.2))
    for field in ("slope2", "slope3", "rms_c2", "rms_c3"):
        assert math.isclose(getattr(wide.rows[0], field), getattr(plain.rows[0], field), rel_tol=1e-9)
    assert narrow.rows[0].rms_c2 < 0.5 * plain.rows[0].rms_c2  # (the range leaves x_0 little room)
    assert wide.moments == "feasible" and wide.data_range == (-50.0, 50.0) and plain.data_range is None


def test_clamped_moments_are_the_heads_where_the_clamps_do_not_bind(oracle, heldout):
    """A range so wide that no clamp binds: not the mean's, variance's or E[x_0^2]'s, nor the replacement of
    E[y^3] by E[y] (y = x_0 / half width), which binds where |E[x_0^3]| > half_width^2 |E[x_0]|. Then the
    step's moments stand for the heads' own, whatever the step's length (the default: T // 10)."""
    small = heldout[:200]
    plain = gk.calibrate_heads(oracle, small, timesteps=[100, 500], draws=2, seed=0, n_boot=200)
    for step in (None, 10, 400):
        wide = gk.calibrate_heads(oracle, small, timesteps=[100, 500], draws=2, seed=0, n_boot=200,
                                  moments="clamped", data_range=(-1e4, 1e4), step=step)
        for r, w in zip(plain.rows, wide.rows):
            for field in ("slope2", "slope3", "rms_c2", "rms_c3"):
                assert math.isclose(getattr(w, field), getattr(r, field), rel_tol=1e-9), (field, step, r, w)
        assert wide.moments == "clamped" and wide.data_range == (-1e4, 1e4)
        assert wide.step == (step or oracle.schedule.T // 10) and plain.step is None


def test_feasible_moments_do_not_depend_on_the_step(oracle, heldout):
    """Feasible moments of x_0 are consistent (E[x_0^2] = E1^2 + Var), so the step's skew is c2^3 times x_0's
    for every step, and the rows are the same for any step length (t = 50 with a step of 100 goes to the data)."""
    small = heldout[:200]
    rows = [gk.calibrate_heads(oracle, small, timesteps=[50, 300], draws=2, seed=0, n_boot=200,
                               moments="feasible", data_range=(-0.5, 0.5), step=step).rows for step in (5, 100, 250)]
    for field in ("slope2", "slope3", "rms_c2", "rms_c3"):
        for i in range(2):
            values = [getattr(r[i], field) for r in rows]
            assert all(math.isclose(v, values[0], rel_tol=1e-9) for v in values), (field, values)


def test_clamps_that_replace_the_third_moment_forget_the_heads_skew(oracle, heldout):
    """Heads with the true skew times +-1e4 on data_range (-1, 1): E[y^3] is far beyond E[y] on every element,
    so the clamp replaces it by E[y], and the clamped c3 is -(a/sigma)^3 (E1 - 3 E1 Var - E1^3) of x_0, a function
    of e1 and e2 alone. Both signs of the heads' skew then give the same clamped rows (while the heads' own slopes
    flip sign), the clamped c3 is tiny next to the heads', and e1, c2 (no other clamp binds) are the heads'."""
    small, ts = heldout[:400], [500, 700]
    rows = {(f, m): gk.calibrate_heads(ScaledSkew(oracle, f), small, timesteps=ts, draws=2, seed=0, n_boot=200,
                                       moments=m).rows for f in (1e4, -1e4) for m in ("heads", "clamped")}
    longer = gk.calibrate_heads(ScaledSkew(oracle, 1e4), small, timesteps=ts, draws=2, seed=0, n_boot=200,
                                moments="clamped", step=450).rows
    for i in range(len(ts)):
        up, down = rows[1e4, "heads"][i], rows[-1e4, "heads"][i]
        assert math.isclose(up.slope3, -down.slope3, rel_tol=1e-9) and 0 < up.slope3 < 1e-3
        clamped = rows[1e4, "clamped"][i]
        assert clamped == rows[-1e4, "clamped"][i]  # the heads' third moment no longer matters
        # (E[x_0^2] and Var are not clamped, so they agree and the step's length does not matter either)
        assert math.isclose(longer[i].slope3, clamped.slope3, rel_tol=1e-9)
        assert clamped.rms_c3 < 1e-2 * up.rms_c3
        assert math.isclose(clamped.slope2, up.slope2, rel_tol=1e-9) and math.isclose(clamped.rms_c2, up.rms_c2,
                                                                                     rel_tol=1e-9)


def test_bad_input_is_refused(oracle, heldout):
    x = heldout[:4]
    cases = [
        (dict(x_heldout=x[:1]), "at least 2 images"),
        (dict(timesteps=[1000]), r"\[0, T - 1"),
        (dict(timesteps=[5, 5]), "repeat"),
        (dict(timesteps=[]), "at least one"),
        (dict(draws=0), "positive integers"),
        (dict(n_boot=10), "n_boot must be at least 100"),
        (dict(level=95), r"level must lie in \(0, 1\)"),
        (dict(seed=-1), "seed"),
        (dict(moments="official"), "moments must be one of"),
        (dict(moments="feasible", data_range=None), "needs the data's range"),
        (dict(moments="clamped", data_range=None), "needs the data's range"),
        (dict(moments="clamped", step=0), "step must be a positive number"),
        (dict(x_heldout=x.clone().fill_(float("nan"))), "non-finite"),
        (dict(model=lambda x_t, t: oracle(x_t, t)[:, :2]), "three heads"),
    ]
    for change, message in cases:
        kwargs = dict(model=oracle, x_heldout=x, timesteps=[10], draws=1, **{"n_boot": 100})
        kwargs.update(change)
        with pytest.raises(ValueError, match=message):
            gk.calibrate_heads(**kwargs)
    cal = gk.calibrate_heads(oracle, x, timesteps=[10], draws=1, n_boot=100)
    with pytest.raises(KeyError, match="rows are at t = 10"):
        cal.row(11)
    with pytest.raises(ValueError, match="undefined must be a factor"):
        cal.skew_scale(undefined=2.0)


def test_the_documented_example_runs(oracle, heldout):
    oracle.solver_defaults = {"gms": {"select": "pixel"}}
    try:
        scope = {"net": oracle, "x_val": heldout[:100]}
        exec(compile(readme_example("calibration"), example_file("calibration"), "exec"), scope)
        assert scope["x"].shape == (16, 1, 2, 2)
        assert oracle.solver_defaults == {"gms": {"select": "pixel", "skew_scale": scope["cal"].skew_scale()}}
        assert list(scope["skew"]) == gk.trajectory(oracle.schedule, 10)
    finally:
        del oracle.solver_defaults
