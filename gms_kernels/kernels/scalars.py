"""The per-step scalar table of the fused kernels, formed once on the host for both the Triton and the C++ kernel.

Every product of the step's Python floats that a kernel reads is formed here, once per step, exactly as the
float64 torch reference forms it (``3 * sigma_t**2 * x`` multiplies x by the Python float ``3 * sigma_t**2``), so
that the kernels see the reference's constants bit for bit. The Triton kernel reads the table by slot (the
position of a name in :data:`STEP_SCALARS`); the C++ extension takes the entries it reads in the order it
names them (``gms_kernels._C.STEP_SCALARS``).
"""
from __future__ import annotations

import math

from ..core.fit import knee_delta2
from .config import FusedStepConfig

# the names of the table's entries, in the order of the table
STEP_SCALARS = (
    # x0_moments
    "a_t", "sigma_t", "rr", "two_sigma", "sigma_sq", "a_sq", "three_sigma", "three_sigma_sq", "sigma_cu", "a_cu",
    # clamp_x0_moments: the centre c and half-width h of the data range
    "c", "h", "h_sq", "two_c", "cc", "three_c", "three_c_c", "c_cu", "h_cu", "two_c_h", "hh", "three_c_c_h",
    "three_c_h_h",
    # transition moments, the last step's variance cap
    "c1", "c2", "lam2", "c2_sq", "c2_cu", "three_lam2", "var_cap",
    # the fits
    "w1", "w2", "w1w2", "inv_skew", "var_floor", "grad_scale", "knee2",
    # one variance for every element (FIXED, DDIM) and DDIM's coefficients
    "fixed_var", "fixed_sd", "ddim_a_s", "ddim_eps_scale",
    # the reciprocals of the divisors (the C++ kernels divide by multiplying, with an exact correction)
    "inv_a", "inv_a_sq", "inv_a_cu", "inv_h", "inv_h_sq", "inv_h_cu",
)


def step_scalars(cfg: FusedStepConfig) -> dict[str, float]:
    """The scalar table of the step ``cfg``: name -> float64 value, in the order of :data:`STEP_SCALARS`."""
    s, a = cfg.sigma_t, cfg.a_t
    r = s / a
    c, h = (cfg.center, cfg.half) if cfg.has_range else (0.0, 1.0)
    c2, lam2, w1 = cfg.c2, cfg.lam2, cfg.w1
    w2 = 1.0 - w1
    values = dict(
        a_t=a, sigma_t=s, rr=r * r, two_sigma=2 * s, sigma_sq=s**2, a_sq=a**2, three_sigma=3 * s,
        three_sigma_sq=3 * s**2, sigma_cu=s**3, a_cu=a**3,
        c=c, h=h, h_sq=h**2, two_c=2 * c, cc=c * c, three_c=3 * c, three_c_c=3 * c * c, c_cu=c**3, h_cu=h**3,
        two_c_h=2 * c * h, hh=h * h, three_c_c_h=3 * c * c * h, three_c_h_h=3 * c * h * h,
        c1=cfg.c1, c2=c2, lam2=lam2, c2_sq=c2**2, c2_cu=c2**3, three_lam2=3 * lam2, var_cap=cfg.var_cap,
        w1=w1, w2=w2, w1w2=w1 * w2, inv_skew=1.0 / (w1 * w2 * (w2 - w1)) if w1 != w2 else 0.0,
        var_floor=cfg.var_floor, grad_scale=cfg.grad_scale, knee2=knee_delta2(w1),
        fixed_var=cfg.fixed_var, fixed_sd=math.sqrt(cfg.fixed_var) if cfg.fixed_var > 0 else 0.0,
        ddim_a_s=cfg.ddim_a_s, ddim_eps_scale=cfg.ddim_eps_scale,
        inv_a=1.0 / a, inv_a_sq=1.0 / a**2, inv_a_cu=1.0 / a**3, inv_h=1.0 / h, inv_h_sq=1.0 / h**2,
        inv_h_cu=1.0 / h**3,
    )
    return {name: float(values[name]) for name in STEP_SCALARS}
