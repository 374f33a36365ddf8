"""The fused step's configuration: the modes, one step's :class:`FusedStepConfig`, and the error a kernel raises on a
non-finite input (the contract every backend implements: :mod:`gms_kernels.kernels`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..core.moments import DataRange
from ..core.schedule import StepCoefficients

MODE_GAUSSIAN, MODE_CLOSED, MODE_ADAN, MODE_DENOISE, MODE_FIXED, MODE_DDIM = 0, 1, 2, 3, 4, 5

# The fp32 ADAN loop is used where |M1| <= 2^10, 2^-60 <= |Var| <= 2^20 and |kappa3| <= 2^30: the
# gradients grow like S^5 and their squares like S^10 (S the largest of |M1|, sqrt|Var|,
# cbrt|kappa3|), which stays far inside fp32's 2^128, and the mixture's cubic terms (~Var^1.5) stay
# normal numbers. Elsewhere (moments far outside the data's scale, the tiny variances of a last
# step to the data, or NaN) the element is fitted in fp64. csrc/gms_step.cpp (adan_needs_double)
# holds the same numbers.
ADAN_FP32_LIMITS = {"m1_max": 2.0**10, "var_min": 2.0**-60, "var_max": 2.0**20, "k3_max": 2.0**30}

# The longest ADAN loop the float32 default runs: up to 40 iterations a float32 fit's x_s stays within a few
# float32 ulps of the float64 reference; beyond, ADAN's late iterations amplify float32 rounding (at 70, as
# preset="official" runs, x_s differs from the reference by up to about 0.07 on unit-scale data), so the
# default (adan_precision=None) runs longer loops in float64.
ADAN_FP32_MAX_ITERS = 40


class NonFiniteInput(ValueError):
    """A fused kernel read a NaN or inf in x_t or a head (its output is then incomplete)."""


@dataclass(frozen=True)
class FusedStepConfig:
    """The scalars of one fused step (all Python floats/ints; fp64 semantics)."""

    mode: int
    t: int
    a_t: float
    sigma_t: float
    c1: float
    c2: float
    lam2: float
    has_range: bool = False
    center: float = 0.0
    half: float = 1.0
    var_cap: float = float("inf")  # GAUSSIAN mode: Var is clamped to [0, var_cap]
    w1: float = 1.0 / 3.0
    var_floor: float = 0.1
    lrs: tuple[float, ...] = field(default_factory=tuple)  # ADAN: one learning rate per iteration
    grad_scale: float = 2.0
    per_pixel: bool = False
    adan_fp64: bool | None = None  # ADAN: the loop in float64 / float32; None: the backend's default
    fixed_var: float = 0.0  # FIXED, DDIM: the noise variance of every element
    ddim_a_s: float = 0.0  # DDIM: x_s = a_s x0 + eps_scale eps (+ noise)
    ddim_eps_scale: float = 0.0


def config_fields(k: StepCoefficients, data_range: DataRange) -> dict:
    """The fields of :class:`FusedStepConfig` that every mode reads: the step's coefficients and the data range's
    centre and half width (the clamps of the moments)."""
    scalars = dict(t=k.t, a_t=k.a_t, sigma_t=k.sigma_t, c1=k.c1, c2=k.c2, lam2=k.lam2, has_range=data_range is not None)
    if data_range is not None:
        scalars.update(center=(data_range[0] + data_range[1]) / 2, half=(data_range[1] - data_range[0]) / 2)
    return scalars
