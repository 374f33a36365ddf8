"""The C++ extension gms_kernels._C against the float64 torch reference.

Moments are computed in the reference's order and come out bit-identical, so the closed-form,
Gaussian and denoising steps differ from the reference only by float32 rounding of the outputs
and by the last bits of the normals (the torch reference's log/cos are not correctly rounded).
The ADAN fit runs in float32: its result is compared with a per-element tolerance derived from
the reference's own sensitivity (how far the float64 fit moves when its inputs move by a few
float32 ulps), because the optimiser amplifies rounding differences by a factor that depends on
the element (up to ~10^3 here).
"""
import math

import numpy as np
import pytest
import torch

import gms_kernels as gk
from gms_kernels.core import random as rng
from gms_kernels.core.fit import MixtureParams, fit_adan, moment_residuals
from gms_kernels.kernels import MODE_ADAN, MODE_CLOSED, MODE_DENOISE, MODE_GAUSSIAN, FusedStepConfig, NonFiniteInput
from gms_kernels.core.mixture import sample_mixture as torch_sample_mixture
from gms_kernels.core.moments import TransitionMoments, central_third_moment, transition_moments
from gms_kernels.core.random import SampleNoise
from gms_kernels.core.schedule import DATA
from gms_kernels.solvers import SOLVERS, fused_config, resolve_options

from conftest import image_oracle

try:
    import gms_kernels._C as C
except ImportError as exc:  # only a missing or broken build skips these tests
    pytest.skip(f"the C++ extension gms_kernels._C is not available ({exc}); reinstall with a C++ compiler",
                allow_module_level=True)

from gms_kernels.kernels import cpp

cpp.available()  # (applies GMS_KERNELS_CPU_TARGET, tests/test_cpu_targets.py, before any direct call of C)

EPS32 = float(torch.finfo(torch.float32).eps)
SCHED = gk.Schedule.linear(1000)


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every output buffer of the launcher starts as NaN: an element left unwritten shows."""
    monkeypatch.setattr(cpp, "_new_buffer", lambda shape: torch.full(shape, float("nan"), dtype=torch.float32))


# ------------------------------------------------------------------------------------------
# random numbers

def test_philox_known_answers():
    assert [int(w) for w in C.philox_raw(0, 0, 0, 0, 0, 0)] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    m = 0xFFFFFFFF
    assert [int(w) for w in C.philox_raw(m, m, m, m, m, m)] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    # key = seed, counter = (offset lo, offset hi, 0, 0)
    assert [int(w) for w in C.philox(0, np.zeros(1, np.int64))[0]] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def _random_keys_offsets(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    seeds = torch.cat([torch.randint(0, 2**32, (n // 2,), generator=g),                 # below 2^32
                       torch.randint(2**32, 2**63 - 1, (n - n // 2,), generator=g)])    # above
    small = torch.randint(0, 2**32, (n // 3,), generator=g)
    offsets = torch.cat([small, torch.randint(2**32, 2**62, (n - n // 3,), generator=g)])
    offsets[:4] = torch.tensor([0, 2**32 - 1, 2**32, rng.counter(2, 65535, 2**40 - 1)])
    return seeds, offsets[torch.randperm(n, generator=g)]


def test_streams_match_the_torch_reference_bit_for_bit():
    seeds, offsets = _random_keys_offsets(4000)
    words = torch.from_numpy(C.philox(seeds.numpy(), offsets.numpy()).astype(np.int64))
    zero = torch.zeros_like(offsets)
    ref = rng.philox4x32(offsets & 0xFFFFFFFF, (offsets >> 32) & 0xFFFFFFFF, zero, zero,
                         seeds & 0xFFFFFFFF, (seeds >> 32) & 0xFFFFFFFF)
    for i in range(4):
        assert torch.equal(words[:, i], ref[i]), f"word {i}"
    assert torch.equal(torch.from_numpy(C.uniform(seeds.numpy(), offsets.numpy())), rng.uniform(seeds, offsets))
    z = torch.from_numpy(C.normal(seeds.numpy(), offsets.numpy()))
    z_ref = rng.normal(seeds, offsets)
    assert z.dtype == torch.float32 and torch.isfinite(z).all()
    assert ((z - z_ref).abs() <= 1e-6 * z_ref.abs().clamp_min(1.0)).all()
    # one seed for all offsets
    u = torch.from_numpy(C.uniform(np.int64(12345), offsets.numpy()))
    assert torch.equal(u, rng.uniform(torch.full_like(offsets, 12345), offsets))


def test_normals_cover_the_clamped_tail_and_the_whole_circle():
    # u1 below 1e-7 is clamped; u2 sweeps [0, 1): check many consecutive counters of one key
    offsets = torch.arange(200_000, dtype=torch.int64)
    z = torch.from_numpy(C.normal(np.int64(7), offsets.numpy()))
    z_ref = rng.normal(torch.full_like(offsets, 7), offsets)
    assert ((z - z_ref).abs() <= 1e-6 * z_ref.abs().clamp_min(1.0)).all()
    assert float(z.abs().max()) < 5.7  # sqrt(-2 ln 1e-7) = 5.68


# ------------------------------------------------------------------------------------------
# the fused step against the float64 reference

def _heads(kind, shape, g):
    if kind == "random":
        e1 = torch.randn(shape, generator=g)
        e2 = e1**2 + torch.rand(shape, generator=g)
        e3 = 2 * torch.randn(shape, generator=g)
    elif kind == "tiny-var":
        e1 = torch.randn(shape, generator=g) * 0.3
        e2 = e1**2 + 1e-6 * torch.rand(shape, generator=g)
        e3 = e1**3 + 1e-6 * torch.randn(shape, generator=g)
    elif kind == "huge-var":
        e1 = torch.randn(shape, generator=g) * 3
        e2 = e1**2 + 1e3 * torch.rand(shape, generator=g)
        e3 = 1e4 * torch.randn(shape, generator=g)
    elif kind == "wild-skew":  # skew far outside what two components of these variances can match
        e1 = torch.randn(shape, generator=g) * 0.1
        e2 = e1**2 + 0.01
        e3 = torch.sign(torch.randn(shape, generator=g)) * 1e3
    else:
        raise ValueError(kind)
    return e1, e2, e3


def _oracle_heads(x, t, g):
    oracle = image_oracle(SCHED, tuple(x.shape[1:]))
    out = oracle(x.double(), torch.full((x.shape[0],), t)).float()
    return list(out.split(x.shape[1], dim=1))


def _reference(x, heads, t, s, solver, opts, dr, seed, first):
    out = torch.cat([h.double() for h in heads], 1)
    return gk.step(x.double(), out, t, s, SCHED, solver, generator=seed, data_range=dr, first_index=first,
                   return_info=True, backend="torch", **opts)


def _adan_sensitivity(x, heads, k, dr, o, rel):
    """Per-element change of the float64 ADAN fit when (M1, Var, M3) move by a relative `rel`
    (random signs, two draws): the scale below which float32 arithmetic cannot be told apart."""
    mom = transition_moments(x.double(), *[h.double() for h in heads], k, dr)
    fit = lambda m: fit_adan(m, o.weights, o.fit_iters, o.lr, k.t, SCHED.T, o.adan_mean)
    ref = fit(mom)
    g = torch.Generator().manual_seed(123)
    sens = [torch.zeros_like(mom.m1) for _ in range(3)]
    for _ in range(2):
        sign = lambda: torch.randint(0, 2, mom.m1.shape, generator=g).double() * 2 - 1
        p = fit(TransitionMoments(mom.m1 * (1 + rel * sign()), mom.var * (1 + rel * sign()),
                                  mom.m3 * (1 + rel * sign())))
        for i, (a, b) in enumerate([(p.mu1, ref.mu1), (p.mu2, ref.mu2), (p.s2.clamp_min(0).sqrt(),
                                                                          ref.s2.clamp_min(0).sqrt())]):
            sens[i] = torch.maximum(sens[i], (a - b).abs())
    return sens


def _check_step(x, heads, t, s, solver="gms", opts=None, dr=(-1.0, 1.0), seed=11, first=0, adan_rel=2.0**-20):
    """Run the C++ step and the reference on the same inputs and compare everything."""
    opts = dict(opts or {})
    N = x.shape[0]
    D = x[0].numel() if N else math.prod(x.shape[1:])
    o = resolve_options(SOLVERS[solver], opts)
    k = SCHED.coefficients(t, s)
    cfg = fused_config(solver, o, k, dr, SCHED.T, N, D)
    assert cfg is not None
    src = SampleNoise.create(seed, N, first)
    e2, e3 = (list(heads) + [None, None])[1:3]
    x_s, p = cpp.fused_step(x, heads[0], e2, e3, src.seeds, src.indices, cfg, return_params=True)
    assert x_s.shape == x.shape and x_s.dtype == x.dtype
    for v in (x_s, p.mu1, p.mu2, p.s2):
        assert torch.isfinite(v.float()).all(), "an output element is unwritten (NaN) or not finite"
    assert p.mu1.dtype == torch.float32 and p.mu1.shape == x.shape
    if N * D == 0:
        return cfg, x_s, p, None
    ref, info = _reference(x, heads, t, s, solver, opts, dr, seed, first)
    x_s64 = x_s.double()
    z = src.normal(rng.STREAM_STEP_NOISE, t, x.shape[1:]).double()
    rounding = lambda v: 2 * EPS32 * v.abs() + 1e-30

    if cfg.mode == MODE_DENOISE:
        assert ((x_s64 - ref).abs() <= rounding(ref)).all()
        assert torch.equal(p.mu1, ref.float()) and torch.equal(p.mu2, ref.float()) and (p.s2 == 0).all()
        return cfg, x_s, p, ref
    if cfg.mode == MODE_GAUSSIAN:
        var = info["var"].clamp_min(0)
        assert torch.equal(p.mu1, info["m1"].float()) and torch.equal(p.s2, var.float())
        sd = var.sqrt()
        tol = rounding(ref) + 2 * EPS32 * (info["m1"].abs() + sd * (z.abs() + 1))
        assert ((x_s64 - ref).abs() <= tol).all()
        return cfg, x_s, p, ref

    # mixture steps: the component choice is exactly the reference's (same uniforms), and
    # x = chosen mean + sqrt(s2) z holds for the C++ parameters
    u = src.uniform(rng.STREAM_COMPONENT, t, x.shape[1:] if cfg.per_pixel else ())
    first_comp = (u.reshape(N, *([1] * (x.dim() - 1))) if not cfg.per_pixel else u) < cfg.w1
    first_comp = first_comp.expand_as(x)
    mu1, mu2, s2 = p.mu1.double(), p.mu2.double(), p.s2.double()
    own = torch.where(first_comp, mu1, mu2) + s2.clamp_min(0).sqrt() * z
    assert ((x_s64 - own).abs() <= rounding(own) + 2 * EPS32 * s2.clamp_min(0).sqrt() * (z.abs() + 1)).all()

    sd_ref = info["s2"].clamp_min(0).sqrt()
    if cfg.mode == MODE_CLOSED:
        for a, b in ((mu1, info["mu1"]), (mu2, info["mu2"]), (s2, info["s2"])):
            assert ((a - b).abs() <= rounding(b) + 1e-12 * (info["m1"].abs() + sd_ref)).all()
        tol = rounding(ref) + 4 * EPS32 * (info["mu1"].abs() + info["mu2"].abs() + sd_ref * (z.abs() + 1))
        assert ((x_s64 - ref).abs() <= tol).all()
        return cfg, x_s, p, ref

    # ADAN in float32: 4x the reference's own movement under an 8-ulp perturbation of its inputs
    # (the ill-conditioned elements), plus 1e-4 sd (~1000 float32 ulps of the mixture's spread:
    # what 25 sign-normalised steps make of rounding where the fit is well conditioned), plus
    # the float32 rounding of the parameters themselves.
    assert cfg.mode == MODE_ADAN
    s_mu1, s_mu2, s_sd = _adan_sensitivity(x, heads, k, dr, o, adan_rel)
    floor = lambda v: 8 * EPS32 * v.abs() + 1e-4 * sd_ref + 1e-30
    tol_mu1, tol_mu2 = 4 * s_mu1 + floor(info["mu1"]), 4 * s_mu2 + floor(info["mu2"])
    tol_sd = 4 * s_sd + floor(sd_ref)
    assert ((mu1 - info["mu1"]).abs() <= tol_mu1).all()
    assert ((mu2 - info["mu2"]).abs() <= tol_mu2).all()
    assert ((s2.clamp_min(0).sqrt() - sd_ref).abs() <= tol_sd).all()
    tol = torch.where(first_comp, tol_mu1, tol_mu2) + tol_sd * z.abs() + rounding(ref)
    assert ((x_s64 - ref).abs() <= tol).all()
    return cfg, x_s, p, ref


FITS = {
    "closed": {},
    "adan": {"fit": "adan", "fit_iters": 25, "lr": "paper"},
}


@pytest.mark.parametrize("select", ["sample", "pixel"])
@pytest.mark.parametrize("fit", list(FITS))
@pytest.mark.parametrize("t,s", [(999, 899), (500, 400), (60, 20), (2, 1)])
@pytest.mark.parametrize("dr", [(-1.0, 1.0), None])
def test_mixture_step_matches_reference_on_oracle_heads(fit, select, t, s, dr):
    g = torch.Generator().manual_seed(t)
    x = torch.randn(3, 3, 5, 7, generator=g)
    heads = _oracle_heads(x, t, g)
    cfg, *_ = _check_step(x, heads, t, s, opts=dict(FITS[fit], select=select), dr=dr)
    assert cfg.mode == (MODE_CLOSED if fit == "closed" else MODE_ADAN) and cfg.per_pixel == (select == "pixel")


@pytest.mark.parametrize("kind", ["random", "tiny-var", "huge-var", "wild-skew"])
@pytest.mark.parametrize("fit", list(FITS))
@pytest.mark.parametrize("t,s", [(999, 998), (300, 200), (3, 1)])
@pytest.mark.parametrize("dr", [(-1.0, 1.0), None])
def test_mixture_step_matches_reference_on_extreme_heads(kind, fit, t, s, dr):
    g = torch.Generator().manual_seed(7 * t + len(kind))
    x = torch.randn(3, 5, 7, generator=g) * (20 if dr is None else 1)
    _check_step(x, _heads(kind, x.shape, g), t, s, opts=FITS[fit], dr=dr, seed=3, first=5)


@pytest.mark.parametrize("select", ["sample", "pixel"])
@pytest.mark.parametrize("dr", [(-1.0, 1.0), None])
def test_closed_fit_where_kappa3_is_exactly_zero(dr, select):
    """x = e1 = e2 = e3 = 0 gives M1 = M3 = 0 and kappa3 = 0 exactly. The C++ closed fit takes a cube
    root without special cases for passes of 8 vectors (32 elements on avx2) whose |kappa3 / denom| are all
    in [2^-900, inf), and the general one otherwise: here the first passes are regular, later ones hold
    zeros alone, one zero among regular elements, or zeros in every other element; all match the reference."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2, 3, 8, 16, generator=g)
    e1, e2, e3 = _heads("random", x.shape, g)
    zero = torch.zeros(x.shape, dtype=torch.bool)
    flat = zero.view(2, -1)
    flat[0, 128:160] = True  # a whole pass
    flat[0, 200] = True  # one element of a pass
    flat[1, ::2] = True  # every other element of the second sample
    for v in (x, e1, e2, e3):
        v[zero] = 0.0
    cfg, x_s, p, ref = _check_step(x, (e1, e2, e3), 500, 400, opts={"select": select}, dr=dr)
    assert cfg.mode == MODE_CLOSED
    k = SCHED.coefficients(500, 400)
    mom = transition_moments(x.double(), e1.double(), e2.double(), e3.double(), k, dr)
    assert (central_third_moment(mom.m1, mom.var.clamp_min(0), mom.m3)[zero] == 0).all()
    assert torch.equal(p.mu1[zero], p.mu2[zero])  # delta = 0 there


@pytest.mark.parametrize("dr", [(-1.0, 1.0), (0.0, 255.0), None])
@pytest.mark.parametrize("solver", ["gms", "sn-ddpm"])
def test_gaussian_last_step_and_denoise_match_reference(dr, solver):
    g = torch.Generator().manual_seed(2)
    scale = 1.0 if dr != (0.0, 255.0) else 100.0
    x = torch.randn(3, 3, 5, 7, generator=g) * scale
    heads = _heads("random", x.shape, g)
    if solver == "sn-ddpm":
        heads = heads[:2]
    cfg, *_ = _check_step(x, heads, 7, 0, solver=solver, dr=dr)  # into s = 0: the capped Gaussian
    assert cfg.mode == MODE_GAUSSIAN and (dr is None) == math.isinf(cfg.var_cap)
    cfg, *_ = _check_step(x, heads, 7, DATA, solver=solver, dr=dr)  # into data: the denoised mean
    assert cfg.mode == MODE_DENOISE
    cfg, *_ = _check_step(x, heads, 7, DATA, solver=solver, dr=dr, opts={"denoise_final": False})
    assert cfg.mode == (MODE_GAUSSIAN if solver == "sn-ddpm" else MODE_CLOSED)
    if solver == "sn-ddpm":
        cfg, *_ = _check_step(x, heads, 500, 300, solver=solver, dr=dr)  # uncapped SN-DDPM step
        assert cfg.mode == MODE_GAUSSIAN and math.isinf(cfg.var_cap)


@pytest.mark.parametrize("head_dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_model_outputs_of_any_float_dtype(head_dtype):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 5, 7, generator=g)
    heads = [h.to(head_dtype) for h in _heads("random", x.shape, g)]
    for opts in ({}, FITS["adan"]):
        _check_step(x, heads, 400, 350, opts=opts)


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_x_s_comes_back_in_the_dtype_of_x_t(x_dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 4, 4, generator=g).to(x_dtype)
    heads = [h.to(x_dtype) for h in _heads("random", x.shape, g)]
    o = resolve_options(SOLVERS["gms"], {})
    k = SCHED.coefficients(400, 350)
    cfg = fused_config("gms", o, k, (-1.0, 1.0), SCHED.T, 2, 48)
    src = SampleNoise.create(9, 2)
    x_s, p = cpp.fused_step(x, *heads, src.seeds, src.indices, cfg)
    assert x_s.dtype == x_dtype and x_s.shape == x.shape and p is None
    ref = _reference(x, heads, 400, 350, "gms", {}, (-1.0, 1.0), 9, 0)[0].to(x_dtype)
    eps = max(float(torch.finfo(x_dtype).eps), EPS32)
    assert ((x_s.double() - ref.double()).abs() <= 8 * eps * (ref.double().abs() + 1)).all()


def test_odd_sizes_and_non_contiguous_inputs():
    g = torch.Generator().manual_seed(6)
    base = torch.randn(7, 4, 9, generator=g)
    x = base.transpose(1, 2)[1:6:2]          # [3, 9, 4], not contiguous
    assert not x.is_contiguous()
    e1 = torch.randn(3, 4, 9, generator=g).transpose(1, 2)
    e2 = (e1**2 + 0.3)[:, :, :]
    e3 = torch.randn(9, 4, 6, generator=g).permute(2, 0, 1)[:3]
    assert not e1.is_contiguous() and not e3.is_contiguous()
    for opts in ({}, {"select": "pixel"}, FITS["adan"]):
        _check_step(x, [e1, e2, e3], 250, 230, opts=opts, first=17)


@pytest.mark.parametrize("shape", [(0, 3, 5), (2, 0, 3), (1, 1), (5, 1)])
@pytest.mark.parametrize("fit", list(FITS))
def test_empty_and_single_element_batches(shape, fit):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(shape, generator=g)
    _check_step(x, _heads("random", x.shape, g), 300, 290, opts=FITS[fit])


def test_huge_values_take_the_float64_adan_path_per_element():
    # a few elements far outside float32's comfortable range share blocks with ordinary ones
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 600, generator=g)
    e1, e2, e3 = _heads("random", x.shape, g)
    x[0, 10], x[1, 300] = 3e4, -5e4
    e3[0, 11] *= 1e7
    _check_step(x, [e1, e2, e3], 999, 998, opts=FITS["adan"], dr=None)
    # the ordinary elements do not depend on which neighbours needed float64
    o = resolve_options(SOLVERS["gms"], FITS["adan"])
    cfg = fused_config("gms", o, SCHED.coefficients(999, 998), None, SCHED.T, 2, 600)
    src = SampleNoise.create(1, 2)
    a = cpp.fused_step(x, e1, e2, e3, src.seeds, src.indices, cfg, True)[1]
    x2 = x.clone()
    x2[0, 10], x2[1, 300] = 0.5, 0.25
    b = cpp.fused_step(x2, e1, e2, e3, src.seeds, src.indices, cfg, True)[1]
    keep = torch.ones_like(x, dtype=torch.bool)
    keep[0, 10] = keep[1, 300] = False
    assert torch.equal(a.mu1[keep], b.mu1[keep]) and torch.equal(a.s2[keep], b.s2[keep])


@pytest.mark.parametrize("iters", [8, 70])
def test_adan_official_setting_and_float64_path(iters):
    """The official ADAN setting (constant lr 0.06, mean over the batch). Run in double, a few
    iterations agree with the reference to the float32 rounding of the outputs: the algorithm is
    the same. Over 70 iterations the constant, sign-normalised step keeps the parameters moving
    on a limit cycle of size ~lr, where rounding (even float64's) changes the phase: the fits
    then agree to a fraction of lr and match the moments equally well."""
    g = torch.Generator().manual_seed(10)
    x = torch.randn(2, 3, 5, 7, generator=g)
    heads = _oracle_heads(x, 600, g)
    opts = {"fit": "adan", "fit_iters": iters, "lr": 0.06, "adan_mean": "batch"}
    o = resolve_options(SOLVERS["gms"], opts)
    k = SCHED.coefficients(600, 500)
    cfg = fused_config("gms", o, k, (-1.0, 1.0), SCHED.T, 2, 105)
    assert cfg.grad_scale == 2.0 / 210 and len(cfg.lrs) == iters
    src = SampleNoise.create(4, 2)
    _, p = cpp.fused_step(x, *heads, src.seeds, src.indices, cfg, True, adan_fp64=True)
    # the adan_precision option picks the same loops per call
    for precision, fp64 in (("float64", True), ("float32", False)):
        cfg_p = fused_config("gms", resolve_options(SOLVERS["gms"], dict(opts, adan_precision=precision)), k,
                             (-1.0, 1.0), SCHED.T, 2, 105)
        by_option = cpp.fused_step(x, *heads, src.seeds, src.indices, cfg_p, True)[1]
        by_flag = cpp.fused_step(x, *heads, src.seeds, src.indices, cfg, True, adan_fp64=fp64)[1]
        assert all(torch.equal(getattr(by_option, n), getattr(by_flag, n)) for n in ("mu1", "mu2", "s2"))
    _, info = _reference(x, heads, 600, 500, "gms", opts, (-1.0, 1.0), 4, 0)
    if iters == 8:
        for a, b in ((p.mu1, info["mu1"]), (p.mu2, info["mu2"]), (p.s2, info["s2"])):
            assert ((a.double() - b).abs() <= EPS32 * b.abs() + 1e-12).all()
        return
    mom = transition_moments(x.double(), *[h.double() for h in heads], k, (-1.0, 1.0))
    loss = lambda q: sum(float((r**2).mean()) for r in moment_residuals(q, mom, o.weights))
    ref_loss = loss(MixtureParams(info["mu1"], info["mu2"], info["s2"]))
    p32 = cpp.fused_step(x, *heads, src.seeds, src.indices, cfg, True)[1]
    for q in (p, p32):
        q = MixtureParams(q.mu1.double(), q.mu2.double(), q.s2.double())
        assert (q.mu1 - info["mu1"]).abs().max() < 0.5 * 0.06 and (q.mu2 - info["mu2"]).abs().max() < 0.5 * 0.06
        assert loss(q) <= 1.2 * ref_loss + 1e-12


def test_results_do_not_depend_on_thread_count_or_batch_composition():
    g = torch.Generator().manual_seed(12)
    N, D = 6, 700  # blocks straddle samples
    x = torch.randn(N, D, generator=g)
    e1, e2, e3 = _heads("random", x.shape, g)
    o = resolve_options(SOLVERS["gms"], FITS["adan"])
    cfg = fused_config("gms", o, SCHED.coefficients(400, 380), (-1.0, 1.0), SCHED.T, N, D)
    src = SampleNoise.create(21, N)
    args = lambda n_threads, out: (x.numpy(), e1.numpy(), e2.numpy(), e3.numpy(), src.seeds.numpy(),
                                   src.indices.numpy(), out, None, None, None, N, D, cfg.mode, cfg.t,
                                   cpp.coef_scalars(cfg), cfg.has_range, cfg.var_cap, cfg.w1, cfg.var_floor,
                                   list(cfg.lrs), cfg.grad_scale, cfg.per_pixel, n_threads)
    one, two = np.full(N * D, np.nan, np.float32), np.full(N * D, np.nan, np.float32)
    C.fused_step(*args(1, one))
    C.fused_step(*args(2, two))
    assert np.array_equal(one, two)
    # samples 3..5 drawn alone (their own first index) give the same numbers
    part = SampleNoise.create(21, 3, first_index=3)
    x_s = cpp.fused_step(x[3:], e1[3:], e2[3:], e3[3:], part.seeds, part.indices, cfg)[0]
    assert torch.equal(x_s.reshape(-1), torch.from_numpy(one).reshape(N, D)[3:].reshape(-1))


# ------------------------------------------------------------------------------------------
# per-sample strides (heads sliced out of one model output) and caller-provided outputs

# (t, s, solver, options, data range): a mixture step of each fit and select, a general data
# range, no range, the capped Gaussian last step and the denoised mean
STRIDED_CASES = [
    (500, 400, "gms", {}, (-1.0, 1.0)),
    (500, 400, "gms", {"select": "pixel"}, (0.0, 255.0)),
    (300, 290, "gms", FITS["adan"], None),
    (7, 0, "gms", {}, (-1.0, 1.0)),
    (7, DATA, "gms", {}, (-1.0, 1.0)),
]


def _strided_case(shape, extra_channels, g):
    """x_t as a channel slice of a wider tensor and a model output [N, 3C + extra, ...] whose first
    3C channels are the heads: every input is float32 with contiguous samples, none is contiguous."""
    N, C = shape[0], shape[1]
    wide = torch.randn(N, 2 * C, *shape[2:], generator=g)
    x = wide[:, C:]
    e1, e2, e3 = _heads("random", x.shape, g)
    out = torch.cat([e1, e2, e3, torch.randn(N, extra_channels, *shape[2:], generator=g)], 1)
    return x, out, [out[:, i * C:(i + 1) * C] for i in range(3)]


def _run_cpp(x, heads, t, s, solver, opts, dr, n_threads=None, monkeypatch=None, **kw):
    o = resolve_options(SOLVERS[solver], opts)
    cfg = fused_config(solver, o, SCHED.coefficients(t, s), dr, SCHED.T, x.shape[0], x[0].numel())
    src = SampleNoise.create(17, x.shape[0], first_index=3)
    if n_threads is not None:
        monkeypatch.setattr(cpp, "_threads", lambda: n_threads)
    e2, e3 = (list(heads) + [None, None])[1:3]
    return cpp.fused_step(x, heads[0], e2, e3, src.seeds, src.indices, cfg, True, **kw)


@pytest.mark.parametrize("shape", [(7, 3, 5, 7), (40, 1, 3, 3), (3, 2, 16, 16)])  # D = 105, 9 (< 16), 512
@pytest.mark.parametrize("case", range(len(STRIDED_CASES)))
def test_heads_sliced_from_one_model_output_are_read_in_place(shape, case, monkeypatch):
    t, s, solver, opts, dr = STRIDED_CASES[case]
    g = torch.Generator().manual_seed(31 + case)
    x, out, heads = _strided_case(shape, extra_channels=2, g=g)
    N, D, C = shape[0], x[0].numel(), shape[1]
    assert not x.is_contiguous() and not any(h.is_contiguous() for h in heads)
    for t_in, stride in [(x, 2 * D)] + [(h, (3 * C + 2) * D // C) for h in heads]:
        read, got = cpp._samples(t_in, N, D, "input")
        assert read is t_in and got == stride, "not read in place"
    # every output element is written (the launcher's buffers start as NaN), the numbers are those
    # of contiguous copies of the same inputs, whatever the thread count
    x_s, p = _run_cpp(x, heads, t, s, solver, opts, dr)
    for v in (x_s, p.mu1, p.mu2, p.s2):
        assert torch.isfinite(v).all()
    ref_s, ref_p = _run_cpp(x.contiguous(), [h.contiguous() for h in heads], t, s, solver, opts, dr)
    assert torch.equal(x_s, ref_s)
    for a, b in zip((p.mu1, p.mu2, p.s2), (ref_p.mu1, ref_p.mu2, ref_p.s2)):
        assert torch.equal(a, b)
    one_s, _ = _run_cpp(x, heads, t, s, solver, opts, dr, n_threads=1, monkeypatch=monkeypatch)
    two_s, _ = _run_cpp(x, heads, t, s, solver, opts, dr, n_threads=2, monkeypatch=monkeypatch)
    assert torch.equal(one_s, x_s) and torch.equal(two_s, x_s)


def test_sliced_heads_match_the_reference():
    g = torch.Generator().manual_seed(33)
    x = torch.randn(5, 6, 5, 7, generator=g)[:, 3:]  # [5, 3, 5, 7], a channel slice
    out = torch.cat(_oracle_heads(x.contiguous(), 400, g), 1)
    heads = [out[:, i * 3:(i + 1) * 3] for i in range(3)]
    for opts in ({}, {"select": "pixel"}, FITS["adan"]):
        _check_step(x, heads, 400, 350, opts=opts, first=2)


def test_extension_takes_per_sample_strides():
    g = torch.Generator().manual_seed(34)
    N, D = 6, 300  # blocks straddle samples
    x = torch.randn(N, D, generator=g)
    e1, e2, e3 = _heads("random", x.shape, g)
    o = resolve_options(SOLVERS["gms"], {})
    cfg = fused_config("gms", o, SCHED.coefficients(400, 380), (-1.0, 1.0), SCHED.T, N, D)
    src = SampleNoise.create(5, N)

    def run(xa, h1, h2, h3, **strides):
        res = np.full(N * D, np.nan, np.float32)
        C.fused_step(xa, h1, h2, h3, src.seeds.numpy(), src.indices.numpy(), res, None, None, None, N, D, cfg.mode,
                     cfg.t, cpp.coef_scalars(cfg), cfg.has_range, cfg.var_cap, cfg.w1, cfg.var_floor, list(cfg.lrs),
                     cfg.grad_scale, cfg.per_pixel, 2, **strides)
        return res

    flat = lambda v: v.reshape(-1).numpy()
    ref = run(flat(x), flat(e1), flat(e2), flat(e3))
    assert np.isfinite(ref).all()
    # the heads interleaved per sample in one buffer [N, 3, D] (stride 3 D), passed from their first element
    buf = torch.stack([e1, e2, e3], 1).reshape(-1).numpy()
    got = run(flat(x), buf, buf[D:], buf[2 * D:], e1_stride=3 * D, e2_stride=3 * D, e3_stride=3 * D)
    assert np.array_equal(got, ref)
    # stride 0: one sample's heads for every sample
    rep = lambda h: flat(h[:1].expand(N, D).contiguous())
    got = run(flat(x), flat(e1[0]), flat(e2[0]), flat(e3[0]), e1_stride=0, e2_stride=0, e3_stride=0)
    assert np.array_equal(got, run(flat(x), rep(e1), rep(e2), rep(e3)))
    with pytest.raises(ValueError, match="fewer than"):
        run(flat(x), buf, buf[D:], buf[2 * D + 1:], e1_stride=3 * D, e2_stride=3 * D, e3_stride=3 * D)


def test_out_receives_the_step_in_place():
    g = torch.Generator().manual_seed(35)
    x, _, heads = _strided_case((4, 3, 5, 7), extra_channels=0, g=g)
    x = x.contiguous()
    for opts in ({}, FITS["adan"]):
        fresh, fresh_p = _run_cpp(x, heads, 500, 400, "gms", opts, (-1.0, 1.0))
        buf = torch.full_like(x, float("nan"))
        x_s, p = _run_cpp(x, heads, 500, 400, "gms", opts, (-1.0, 1.0), out=buf)
        assert x_s is buf and torch.equal(buf, fresh) and torch.equal(p.mu1, fresh_p.mu1)
        # the step written over x_t itself
        x_in = x.clone()
        x_s, _ = _run_cpp(x_in, heads, 500, 400, "gms", opts, (-1.0, 1.0), out=x_in)
        assert x_s is x_in and torch.equal(x_in, fresh)
    # x_t of another dtype: out holds the float32 step, x_s is it in x_t's dtype
    buf = torch.full_like(x, float("nan"))
    x_s, _ = _run_cpp(x.double(), heads, 500, 400, "gms", {}, (-1.0, 1.0), out=buf)
    assert x_s.dtype == torch.float64 and torch.isfinite(buf).all() and torch.equal(x_s, buf.double())
    e2 = heads[1].contiguous()
    with pytest.raises(ValueError, match="overlaps e2"):
        _run_cpp(x, [heads[0], e2, heads[2]], 500, 400, "gms", {}, (-1.0, 1.0), out=e2)
    with pytest.raises(ValueError, match="overlaps x_t"):
        wide = torch.zeros(4, 6, 5, 7)
        _run_cpp(wide[:, :3], heads, 500, 400, "gms", {}, (-1.0, 1.0), out=wide.view(-1)[:x.numel()].view(x.shape))
    with pytest.raises(ValueError, match="float32"):
        _run_cpp(x, heads, 500, 400, "gms", {}, (-1.0, 1.0), out=torch.zeros_like(x, dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        _run_cpp(x, heads, 500, 400, "gms", {}, (-1.0, 1.0), out=torch.zeros(x.numel()))


def test_gk_step_with_the_cpp_backend():
    g = torch.Generator().manual_seed(13)
    x = torch.randn(2, 3, 5, 7, generator=g)
    out = torch.cat(_heads("random", x.shape, g), 1)
    for opts in ({}, {"select": "pixel"}):
        fast, info = gk.step(x, out, 300, 200, SCHED, "gms", generator=3, backend="cpp", return_info=True, **opts)
        ref = gk.step(x, out, 300, 200, SCHED, "gms", generator=3, backend="torch", **opts)
        assert fast.dtype == x.dtype and set(info) == {"mu1", "mu2", "s2"}
        assert (fast.double() - ref.double()).abs().max() < 1e-5


@pytest.mark.parametrize("lr", [1e-10, 100.0])
def test_adan_at_the_extreme_learning_rates_matches_the_reference(lr):
    # (the float32 kernel divides its step constants by sm ~ lr: they must stay finite)
    g = torch.Generator().manual_seed(14)
    x = torch.randn(3, 2, 9, generator=g)
    out = torch.cat(_heads("random", x.shape, g), 1)
    opts = dict(fit="adan", fit_iters=5, lr=lr)
    fast = gk.step(x, out, 300, 200, SCHED, "gms", generator=3, backend="cpp", **opts)
    ref = gk.step(x, out, 300, 200, SCHED, "gms", generator=3, backend="torch", **opts)
    assert torch.isfinite(fast).all() and (fast.double() - ref.double()).abs().max() < 1e-3
    beyond = lr / 10 if lr < 1 else lr * 10
    for backend in ("cpp", "torch"):
        with pytest.raises(ValueError, match="lr must be a number in"):
            gk.step(x, out, 300, 200, SCHED, "gms", generator=3, backend=backend, **dict(opts, lr=beyond))


@pytest.mark.parametrize("fit", list(FITS))
@pytest.mark.parametrize("where", ["x_t", 0, 1, 2])  # x_t or the head e1 / e2 / e3
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("pixel", [(1, 2, 6, 4), (2, 2, 12, 10)])  # in a middle block; the very last element
def test_kernel_reports_a_non_finite_input_and_gk_step_names_it(fit, where, bad, pixel):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 3, 13, 11, generator=g)  # 1287 elements: the last sits in a partial vector of the last block
    out = torch.cat(_heads("random", x.shape, g), 1)
    i, c, h, w = pixel
    if where == "x_t":
        x[i, c, h, w] = bad
    else:
        out[i, where * 3 + c, h, w] = bad
    cfg = fused_config("gms", resolve_options(SOLVERS["gms"], FITS[fit]), SCHED.coefficients(300, 200), (-1.0, 1.0),
                      1000, 3, x[0].numel())
    noise = SampleNoise.create(0, 3)
    with pytest.raises(NonFiniteInput):
        cpp.fused_step(x, out[:, :3], out[:, 3:6], out[:, 6:], noise.seeds, noise.indices, cfg)
    name = "x_t at t=300 has" if where == "x_t" else f"at t=300 has non-finite .* head e{where + 1} "
    for backend in ("cpp", "torch"):  # the same message from the in-kernel check and the reference's
        with pytest.raises(ValueError, match=name):
            gk.step(x, out, 300, 200, SCHED, "gms", generator=0, backend=backend, **FITS[fit])


# ------------------------------------------------------------------------------------------
# sampling primitive, errors

@pytest.mark.parametrize("shape", [(3, 5, 7), (5,), (1,)])  # runs of one key per sample; per-element keys
@pytest.mark.parametrize("per_pixel", [False, True])
def test_sample_mixture_matches_torch(per_pixel, shape):
    g = torch.Generator().manual_seed(14)
    N = 4
    mu1 = torch.randn(N, *shape, generator=g)
    mu2 = mu1 - torch.rand(N, *shape, generator=g)
    s2 = torch.rand(N, *shape, generator=g) * 0.1
    s2.view(N, -1)[0, 0] = -1e-3  # a negative variance is read as 0
    params = MixtureParams(mu1, mu2, s2)
    noise = SampleNoise.create(5, N, first_index=2)
    x = cpp.sample_mixture(params, 1 / 3, noise.seeds, noise.indices, t=42, per_pixel=per_pixel)
    assert x.dtype == torch.float32 and x.shape == mu1.shape and torch.isfinite(x).all()
    z = noise.normal(rng.STREAM_STEP_NOISE, 42, shape)
    u = noise.uniform(rng.STREAM_COMPONENT, 42, shape if per_pixel else ())
    ref = torch_sample_mixture(MixtureParams(mu1.double(), mu2.double(), s2.double()), (1 / 3, 2 / 3), z.double(), u)
    assert ((x.double() - ref).abs() <= 2 * EPS32 * (ref.abs() + mu1.abs() + 1) + 2e-6 * s2.clamp_min(0).sqrt()).all()


def test_fused_step_at_takes_addresses_and_refuses_missing_buffers():
    """The launcher's path: the same step on raw addresses (0 = not given) as on numpy arrays."""
    g = np.random.default_rng(5)
    x, e1 = g.standard_normal(6).astype(np.float32), 0.5 * g.standard_normal(6).astype(np.float32)
    e2, e3 = e1**2 + 0.3, e1**3 + 0.9 * e1
    seeds, idx = np.full(2, 7, np.int64), np.arange(2, dtype=np.int64)
    step = FusedStepConfig(mode=MODE_CLOSED, t=5, a_t=0.5, sigma_t=0.8, c1=0.1, c2=0.5, lam2=0.01, has_range=True)
    cfg = dict(N=2, D=3, mode=MODE_CLOSED, t=5, scalars=cpp.coef_scalars(step), has_range=True, var_cap=float("inf"),
               w1=1 / 3, var_floor=0.1, lrs=[], grad_scale=2 / 3, per_pixel=False, num_threads=1, adan_fp64=False)
    by_array = np.full(6, np.nan, np.float32)
    assert C.fused_step(x, e1, e2, e3, seeds, idx, by_array, None, None, None, **cfg)
    at = lambda a: a.ctypes.data
    by_address = np.full(6, np.nan, np.float32)
    args = dict(x_t=at(x), x_stride=3, e1=at(e1), e1_stride=3, e2=at(e2), e2_stride=3, e3=at(e3), e3_stride=3,
                seeds=at(seeds), indices=at(idx), out=at(by_address), mu1=0, mu2=0, s2=0)
    assert C.fused_step_at(**args, **cfg)
    assert np.array_equal(by_array, by_address)
    with pytest.raises(ValueError, match="missing"):
        C.fused_step_at(**{**args, "e3": 0}, **cfg)
    assert C.fused_step_at(**{**args, "e3": 0}, **{**cfg, "mode": MODE_GAUSSIAN})  # (e3 unread)


def test_bad_arguments_raise_clear_errors():
    f = np.zeros(6, np.float32)
    seeds, idx = np.zeros(2, np.int64), np.arange(2, dtype=np.int64)
    step = FusedStepConfig(mode=MODE_CLOSED, t=5, a_t=0.5, sigma_t=0.8, c1=0.1, c2=0.5, lam2=0.01, has_range=True)
    common = dict(N=2, D=3, t=5, scalars=cpp.coef_scalars(step), has_range=True, var_cap=float("inf"), w1=1 / 3,
                  var_floor=0.1, lrs=[], grad_scale=2 / 3, per_pixel=False)
    call = lambda **kw: C.fused_step(**{**dict(x_t=f, e1=f, e2=f, e3=f, seeds=seeds, indices=idx, out=f.copy(),
                                               mu1=None, mu2=None, s2=None, mode=MODE_CLOSED), **common, **kw})
    call()
    with pytest.raises(ValueError, match="e3"):
        call(e3=None)
    with pytest.raises(ValueError, match="x_t has 5"):
        call(x_t=np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="float32"):
        call(out=np.zeros(6, np.float64))
    with pytest.raises(ValueError, match="mode"):
        call(mode=9)
    with pytest.raises(ValueError, match="indices"):
        call(indices=np.array([0, 2**40], np.int64))
    call(mode=MODE_ADAN, lrs=[0.06, 0.03])
    call(mode=MODE_ADAN, lrs=[1e-10, 100.0])
    for bad_lr in (0.0, -0.06, 1e-11, 101.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="learning rates"):
            call(mode=MODE_ADAN, lrs=[0.06, bad_lr])
    call(mode=MODE_DENOISE, e2=None, e3=None)
    call(mode=MODE_GAUSSIAN, e3=None)
    with pytest.raises(ValueError, match="CPU"):
        cpp.fused_step(torch.zeros(2, 3, device="meta"), *[torch.zeros(2, 3)] * 3, torch.zeros(2, dtype=torch.long),
                       torch.arange(2), fused_config("gms", resolve_options(SOLVERS["gms"], {}), SCHED.coefficients(5, 3),
                                                     (-1.0, 1.0), SCHED.T, 2, 3))


def test_build_reports_openmp_and_isa():
    info = C.build_info()
    assert set(info) >= {"openmp", "max_threads", "isa", "block"} and info["max_threads"] >= 1
    assert cpp.available() and cpp.import_error() is None
    assert info["isa"] == cpp.cpu_info()["target"] and info["isa"] in info["targets"]


@pytest.mark.parametrize("solver", ["ddpm", "ddpm-large", "ddim"])
def test_the_cpp_backend_runs_the_fixed_variance_and_ddim_steps_fused(solver, monkeypatch):
    """backend='cpp' runs ddpm, ddpm-large and ddim (the modes only the C++ kernel has) in its fused kernel,
    not in the float64 torch reference; the kernel's result is kept."""
    pytest.importorskip("gms_kernels._C")
    import gms_kernels.solvers.base as solvers

    calls = []
    real = solvers.fused_step

    def spy(backend, *args, **kwargs):
        calls.append(backend)
        return real(backend, *args, **kwargs)

    monkeypatch.setattr(solvers, "fused_step", spy)
    sched = gk.Schedule.linear(20)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(10))
    e1 = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(11))
    gk.step(x, e1, 10, 5, sched, solver, generator=0, backend="cpp")
    assert calls == ["cpp"]


def test_solver_step_reports_the_fitted_mixture_by_default():
    """solver_step's want_info defaults to True: the C++ GMS step hands back the fitted mu1, mu2, s2."""
    pytest.importorskip("gms_kernels._C")
    from gms_kernels.core.random import SampleNoise
    from gms_kernels.solvers import StepRandomness, solver_step

    sched = gk.Schedule.linear(20)
    x = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(12))
    e1 = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(13))
    heads = [e1, e1 * e1 + 0.1, e1**3]
    k = sched.coefficients(10, 5)
    rand = StepRandomness(SampleNoise.create(0, 2, 0), 10, x)
    _, info = solver_step("gms", x, heads, k, rand, (-1.0, 1.0), sched.T, {}, "cpp")
    assert set(info) == {"mu1", "mu2", "s2"} and info["mu1"].shape == x.shape


def test_a_fused_adan_step_averages_its_loss_over_the_whole_batch():
    """With adan_mean='batch' (the official loss: the mean of the squared moment errors over every element of
    the batch), a fused C++ step fits the same mixture as the float64 torch step on the same Philox draws.
    On 64 samples of 1 x 8 x 8 each gradient is divided by 4096, small enough that ADAN's eps shapes the fit:
    dividing by one sample's 64 elements instead (or by the channels times them) moves x_s by ~1e-2, while the
    two backends agree to ~1e-7 (float32 rounding)."""
    pytest.importorskip("gms_kernels._C")
    from gms_kernels.core.random import SampleNoise
    from gms_kernels.solvers import StepRandomness, solver_step

    sched = gk.Schedule.linear(20)
    k = sched.coefficients(10, 5)
    g = torch.Generator().manual_seed(31)
    x = torch.randn(64, 1, 8, 8, generator=g, dtype=torch.float64)
    e1 = torch.randn(64, 1, 8, 8, generator=g, dtype=torch.float64) * 0.5
    e2 = e1 * e1 + 0.2
    e3 = e1**3 + 3 * e1 * 0.2 + 0.01 * torch.randn(64, 1, 8, 8, generator=g, dtype=torch.float64)
    options = {"fit": "adan", "fit_iters": 8, "adan_mean": "batch", "adan_precision": "float64"}

    def run(backend):
        rand = StepRandomness(SampleNoise.create(5, 64), 10, x)
        return solver_step("gms", x, [e1, e2, e3], k, rand, (-1.0, 1.0), sched.T, options, backend)

    (x_fused, fused), (x_ref, ref) = run("cpp"), run("torch")
    for name in ("mu1", "mu2", "s2"):
        torch.testing.assert_close(fused[name].double(), ref[name], rtol=0, atol=1e-5)
    torch.testing.assert_close(x_fused.double(), x_ref, rtol=0, atol=1e-5)
