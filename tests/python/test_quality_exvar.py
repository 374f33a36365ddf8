"""python/quality_benchmark.py's shrinkage of the heads' excess variance: the transition
moments' shrinkage and its solvers (row modifier exvar=), the network wrapper ExcessVarianceShrink (exvarpre=),
the per-K tables."""
import json
import sys
from pathlib import Path

import pytest
import torch

import gms_kernels as gk
from conftest import image_oracle, small_central_moment_net
from gms_kernels.core.moments import central_third_moment, last_step_variance_cap, transition_moments, x0_moments
from gms_kernels.core.random import SampleNoise
from gms_kernels.solvers import StepRandomness, solver_step

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))  # the studies are not installed
from studies import quality_study as q  # noqa: E402
import quality_benchmark as qb  # noqa: E402
from studies import controls  # noqa: E402


def _central(out, C):
    e1, e2, e3 = (out[:, j * C:(j + 1) * C].double() for j in range(3))
    return e1, e2 - e1**2, e3 - 3 * e1 * e2 + 2 * e1**3


@torch.no_grad()
def test_central_net_scales_the_heads_c2_exactly_and_keeps_e1_and_c3():
    net = small_central_moment_net()
    x, t = torch.randn(4, 1, 8, 8), torch.full((4,), 500)
    heads = net(x, t, head_outputs=True)  # e1, c2, c3 as the heads predict them
    out = qb.ExcessVarianceShrink(net, 0.3)(x, t)
    assert torch.equal(out[:, :1], heads[:, :1])  # e1 bit for bit
    e1, c2, c3 = _central(out, 1)
    torch.testing.assert_close(c2, 0.3 * heads[:, 1:2].double(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(c3, heads[:, 2:3].double(), rtol=1e-4, atol=1e-6)
    # the factor multiplies the heads' own c2 before raw_from_central: e2 = e1^2 + f c2 in float32, as forward has it
    assert torch.equal(out[:, 1:2], heads[:, :1] ** 2 + heads[:, 1:2] * 0.3)


@torch.no_grad()
def test_factor_one_is_the_network_bit_for_bit():
    net = small_central_moment_net()
    x, t = torch.randn(5, 1, 8, 8), torch.tensor([999] * 5)
    assert torch.equal(qb.ExcessVarianceShrink(net, 1.0)(x, t), net(x, t))
    assert torch.equal(qb.ExcessVarianceShrink(net, {999: 1.0, 0: 0.5})(x, t), net(x, t))
    oracle = image_oracle(gk.Schedule.linear())  # raw heads
    xo = torch.randn(3, 3, 5, 7, dtype=torch.float64)
    assert torch.equal(qb.ExcessVarianceShrink(oracle, 1.0)(xo, 400), oracle(xo, 400))


@torch.no_grad()
def test_raw_heads_transition_has_the_excess_variance_scaled_and_kappa3_kept():
    """Var' - lam2 = f (Var - lam2) and kappa3' = kappa3 of the step's transition (no clamps), M1 unchanged."""
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    x0 = oracle.sample_data(20, torch.Generator().manual_seed(1))
    t, s = 600, 400
    abar = float(sched.alphas_cumprod[t])
    x_t = abar**0.5 * x0 + (1 - abar) ** 0.5 * torch.randn(x0.shape, generator=torch.Generator().manual_seed(2),
                                                             dtype=torch.float64)
    k = sched.coefficients(t, s)
    before = transition_moments(x_t, *oracle(x_t, t).chunk(3, dim=1), k, None)
    after = transition_moments(x_t, *qb.ExcessVarianceShrink(oracle, 0.25)(x_t, t).chunk(3, dim=1), k, None)
    assert torch.equal(after.m1, before.m1)
    torch.testing.assert_close(after.var - k.lam2, 0.25 * (before.var - k.lam2), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(central_third_moment(after.m1, after.var, after.m3),
                               central_third_moment(before.m1, before.var, before.m3), rtol=1e-7, atol=1e-12)


def test_factors_are_looked_up_at_the_t_the_sampler_calls_with():
    """A per-t table is read at each call's time index (also for a 'scaled' time input), one per trajectory t;
    a t with no factor is refused."""
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    seen = []

    class Recording(qb.ExcessVarianceShrink):
        def factor_at(self, t):
            f = super().factor_at(t)
            seen.append(f)
            return f

    ts = gk.trajectory(sched, 4)
    table = {t: 0.1 * (i + 1) for i, t in enumerate(ts)}
    gk.sample(Recording(oracle, table), (2, 3, 5, 7), steps=4, solver="sn-ddpm", generator=0, progress=False)
    assert seen == [table[t] for t in ts]

    class Scaled(torch.nn.Module):
        time_input, schedule = "scaled", gk.Schedule.linear(T=500)

        def forward(self, x, t):
            return torch.cat([x, x * x + 1, x], dim=1)
    wrapped = qb.ExcessVarianceShrink(Scaled(), {123: 0.5})
    assert wrapped.factor_at(gk.model_io.time_tensor(123, 3, 500, "scaled")) == 0.5
    with pytest.raises(ValueError, match="no exvar factor for t=7"):
        qb.ExcessVarianceShrink(oracle, {999: 0.5})(torch.zeros(2, 3, 5, 7), torch.full((2,), 7))


def test_shrunk_sn_ddpm_and_gms_first_steps_see_the_shrunk_moments():
    """Through gk.sample (torch backend): the first step of 'sn-ddpm' draws with lam2 + f (Var - lam2), and the
    closed GMS fit sees the same M1 and kappa3 with that variance (without the sampler's clamps on the x0 moments:
    where the clamp on E[x0^3] binds, kappa3 is the clamp's, which depends on Var)."""
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    f = 0.4

    def first(model, solver, **opts):
        infos = []
        gk.sample(model, (6, 3, 5, 7), steps=5, solver=solver, generator=3, progress=False, backend="torch",
                  callback=infos.append, dtype=torch.float64, data_range=None, **opts)  # (float32: e2 - e1^2 cancels)
        return infos[0]
    lam2 = sched.coefficients(*gk.trajectory(sched, 5)[:2]).lam2
    a, b = first(oracle, "sn-ddpm"), first(qb.ExcessVarianceShrink(oracle, f), "sn-ddpm")
    torch.testing.assert_close(b["var"] - lam2, f * (a["var"] - lam2), rtol=1e-9, atol=1e-12)
    a, b = (first(m, "gms", fit="closed", select="sample") for m in (oracle, qb.ExcessVarianceShrink(oracle, f)))
    torch.testing.assert_close(b["m1"], a["m1"], rtol=0, atol=0)
    torch.testing.assert_close(b["var"] - lam2, f * (a["var"] - lam2), rtol=1e-9, atol=1e-12)
    k3_a = central_third_moment(a["m1"], a["var"], a["m3"])
    assert float(k3_a.abs().max()) > 1e-6  # (a skew the check can see; M3 - 3 M1 Var - M1^3 cancels to ~1e-12)
    torch.testing.assert_close(central_third_moment(b["m1"], b["var"], b["m3"]), k3_a, rtol=1e-6, atol=1e-10)


def test_shrink_excess_variance_scales_var_minus_lam2_and_keeps_m1_and_kappa3():
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    x_t = torch.randn(4, 3, 5, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    k = sched.coefficients(300, 200)
    mom = transition_moments(x_t, *oracle(x_t, 300).chunk(3, dim=1), k, (-1.0, 1.0))
    assert controls.shrink_excess_variance(mom, k, 1.0) is mom
    out = controls.shrink_excess_variance(mom, k, 0.3)
    assert torch.equal(out.m1, mom.m1)
    torch.testing.assert_close(out.var - k.lam2, 0.3 * (mom.var - k.lam2), rtol=1e-12, atol=0)
    k3 = central_third_moment(mom.m1, mom.var, mom.m3)
    assert float(k3.abs().max()) > 1e-4
    torch.testing.assert_close(central_third_moment(out.m1, out.var, out.m3), k3, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("solver,opts", [
    ("sn-ddpm", {}), ("sn-ddpm", {"variance_scale": 1.25}),
    ("gms", {"fit": "closed", "select": "sample"}), ("gms", {"fit": "closed", "select": "pixel"}),
    ("gms", {"fit": "adan", "select": "pixel", "fit_iters": 5}),
    ("gms", {"fit": "closed", "select": "sample", "skew_threshold": 0.05, "variance_scale": 0.8}),
    ("gms", {"fit": "closed", "select": "sample", "gaussian_last_step": False, "skew_scale": 0.5})])
def test_exvar_solvers_with_factor_one_are_the_library_steps_bit_for_bit(solver, opts):
    oracle = image_oracle(gk.Schedule.linear())
    kw = dict(steps=4, generator=5, progress=False, backend="torch", **opts)
    want = gk.sample(oracle, (6, 3, 5, 7), solver=solver, **kw)
    got = gk.sample(oracle, (6, 3, 5, 7), solver=controls.EXVAR_SOLVERS[solver], exvar=1.0, **kw)
    assert torch.equal(got, want)
    assert not torch.equal(gk.sample(oracle, (6, 3, 5, 7), solver=controls.EXVAR_SOLVERS[solver], exvar=0.3, **kw), want)


def test_exvar_solvers_see_the_shrunk_moments_with_the_clamps_on_and_look_up_each_steps_t(monkeypatch):
    """Unlike the wrapper (exvarpre), the solvers shrink the moments the sampler formed, clamps included:
    every step's Var' - lam2 = f(t) (Var - lam2) and kappa3 kept, with f looked up at each step's t."""
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    ts = gk.trajectory(sched, 4)
    table = {t: 0.2 + 0.15 * i for i, t in enumerate(ts)}
    looked_up = []
    real = controls.exvar_factor_at
    monkeypatch.setattr(controls, "exvar_factor_at", lambda f, t: looked_up.append(t) or real(f, t))
    x_t = oracle.sample_data(5, torch.Generator().manual_seed(3)) * 0.6
    clamped = 0
    for i, t in enumerate(ts[:-1]):
        s = ts[i + 1]
        k = sched.coefficients(t, s)
        xt = x_t * sched.alphas_cumprod[t].sqrt().item() + 0.5  # (off the data's centre: the clamps bind)
        heads = list(oracle(xt, t).chunk(3, dim=1))
        x0 = x0_moments(xt, *heads, k.a_t, k.sigma_t)
        clamped += int((x0.m3.abs() > x0.mean.abs().clamp(max=1.0)).sum())  # E[x0^3] replaced by E[x0]
        mom = transition_moments(xt, *heads, k, (-1.0, 1.0))
        infos = {}
        for name, solver in (("gms", "gms"), ("gms-exvar", controls.EXVAR_SOLVERS["gms"])):
            opts = {"fit": "closed", "select": "pixel", **({"exvar": table} if name == "gms-exvar" else {})}
            rand = StepRandomness(SampleNoise.create(0, 5, 0), t, xt)
            infos[name] = solver_step(solver, xt, heads, k, rand, (-1.0, 1.0), sched.T, opts)[1]
        a, b = infos["gms"], infos["gms-exvar"]
        if s == 0:  # the Gaussian last step: N(M1, Var) with Var capped, no m3
            cap = last_step_variance_cap((-1.0, 1.0))
            torch.testing.assert_close(b["var"], (k.lam2 + table[t] * (mom.var - k.lam2)).clamp(0, cap), rtol=1e-12,
                                       atol=0)
            continue
        torch.testing.assert_close(a["var"], mom.var, rtol=0, atol=0)
        torch.testing.assert_close(b["var"] - k.lam2, table[t] * (a["var"] - k.lam2), rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(central_third_moment(b["m1"], b["var"], b["m3"]),
                                   central_third_moment(a["m1"], a["var"], a["m3"]), rtol=1e-8, atol=1e-13)
    assert looked_up == ts[:-1] and clamped > 0
    with pytest.raises(ValueError, match="no exvar factor for t="):
        gk.sample(oracle, (2, 3, 5, 7), steps=3, solver=controls.EXVAR_SOLVERS["gms"], exvar={999: 0.5}, generator=0, progress=False)


def test_exvar_labels_tables_and_rows(tmp_path, monkeypatch):
    assert qb.split_exvar("sn-ddpm exvar=lam") == ("sn-ddpm", "exvar", "lam")
    assert qb.split_exvar("gms closed/sample exvarpre=0.5 skew=lam") == ("gms closed/sample skew=lam", "exvarpre", 0.5)
    assert qb.split_exvar("gms closed/pixel") == ("gms closed/pixel", None, None)
    for bad in ("sn-ddpm exvar=wiener", "sn-ddpm exvar=-1", "sn-ddpm exvar=0.5 exvarpre=0.3"):
        with pytest.raises(ValueError):
            qb.split_exvar(bad)
    # the tables: lambda_var per K from the shrinkage file's runs, clipped, and 1 at the denoising call t = 0
    sched = gk.Schedule.linear()
    oracle = image_oracle(sched)
    bed = q.Testbed("toy", lambda: oracle, "abc123", (3, 5, 7), dict, {}, "fd")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="shrinkage"):
        qb.exvar_tables(bed)
    ts = gk.trajectory(sched, 3)  # 999, 665, 332, 0
    rows = {"3": [{"t": t, "lam_var": v} for t, v in zip(ts[:-1], (0.3, -0.2, 0.7))]}
    q.skew_table_path(bed).parent.mkdir(parents=True)
    q.skew_table_path(bed).write_text(json.dumps({"tables": {}, "runs": {"lam": {"rows": rows}}}))
    tables = qb.exvar_tables(bed)
    assert tables == {"lam": {3: {0: 1.0, ts[0]: 0.3, ts[1]: 0.0, ts[2]: 0.7}}}
    # rows sample with K's table, cached under their full labels: exvar= in the solvers, exvarpre= in the wrapper
    cache = q.ResultCache(None)
    qb.measure_exvar(bed, ["gms closed/pixel exvar=lam", "sn-ddpm exvarpre=lam"], [3], [1], 4, cache, log=None)
    assert sorted(cache.data) == ["toy|abc123|gms closed/pixel exvar=lam|3|1|4",
                                  "toy|abc123|sn-ddpm exvarpre=lam|3|1|4"]
    x = qb.draw_exvar(oracle, (3, 5, 7), "gms closed/pixel exvar=lam", 3, 4, 1, tables)
    direct = gk.sample(oracle, (4, 3, 5, 7), steps=3, solver=controls.EXVAR_SOLVERS["gms"], fit="closed", select="pixel", generator=1,
                       progress=False, exvar=tables["lam"][3])
    torch.testing.assert_close(x, direct, rtol=0, atol=0)
    x = qb.draw_exvar(oracle, (3, 5, 7), "sn-ddpm exvarpre=0.5", 3, 4, 1, tables)
    direct = gk.sample(qb.ExcessVarianceShrink(oracle, 0.5), (4, 3, 5, 7), steps=3, solver="sn-ddpm", generator=1,
                       progress=False)
    torch.testing.assert_close(x, direct, rtol=0, atol=0)
    with pytest.raises(ValueError, match="needs the table"):
        qb.draw_exvar(oracle, (3, 5, 7), "gms closed/pixel exvar=lam", 5, 4, 1, tables)
    with pytest.raises(ValueError, match="exvar= needs a row of"):
        qb.draw_exvar(oracle, (3, 5, 7), "ddim exvar=0.5", 3, 4, 1, tables)
