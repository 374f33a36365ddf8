"""Fused GMS step backends: one pass over memory that does moments -> fit -> mixture sampling.

Every backend implements the same contract, ``fused_step(x_t, e1, e2, e3, seeds, indices, cfg,
return_params)``, whose meaning is defined by the solvers' float64 steps (:mod:`gms_kernels.solvers.gms` and the
last-step rules of :func:`gms_kernels.solvers.solver_step`); a solver builds its steps' configs itself
(:meth:`gms_kernels.solvers.Solver.fused_config`, from :func:`~gms_kernels.kernels.config.config_fields`). Per element (sample i, element j of D):

1. moments (fp64 in every backend): ``moments.x0_moments`` -> ``moments.clamp_x0_moments``
   (when ``cfg.has_range``) -> M1, Var (no clamp of its own: Var[x0|x_t] is clamped), M3;
2. by ``cfg.mode``: DENOISE writes M1; GAUSSIAN draws N(M1, min(Var, var_cap)); FIXED draws
   N(M1, fixed_var) from e1 alone (ddpm, ddpm-large, analytic-dpm; no draw when fixed_var is 0);
   DDIM takes M1 = E[x0|x_t] (c1 = 0, c2 = 1) and writes
   ``ddim_a_s x0 + ddim_eps_scale (x_t - a_t x0) / sigma_t`` plus N(0, fixed_var) noise
   (:mod:`gms_kernels.solvers.ddim`); CLOSED and ADAN fit
   (mu1, mu2, s2) like ``fit.fit_closed`` / ``fit.fit_adan`` (learning rate ``cfg.lrs[k]`` at
   iteration k, gradient scale ``cfg.grad_scale`` = 2 / count), then draw
   ``(u < w1 ? mu1 : mu2) + sqrt(s2) z``. ADAN's loop runs in fp32 by default (``adan_precision``
   picks fp32 or fp64 per call); in fp32, an element outside :data:`ADAN_FP32_LIMITS` is refitted
   in fp64 by itself, so that no element's result depends on its neighbours;
3. random numbers (``random.py``): z = normal(seeds[i], counter(0, t, indices[i]*D + j));
   u = uniform(seeds[i], counter(1, t, indices[i])) per sample, or
   uniform(seeds[i], counter(1, t, indices[i]*D + j)) per pixel.

Both kernels check their inputs while they read them: they raise :class:`NonFiniteInput` when
x_t or a head that the mode reads holds a NaN or inf, and the caller then names the culprit.
"""
from __future__ import annotations

from .config import (ADAN_FP32_LIMITS, ADAN_FP32_MAX_ITERS, MODE_ADAN, MODE_CLOSED, MODE_DDIM, MODE_DENOISE, MODE_FIXED,
                     MODE_GAUSSIAN, FusedStepConfig, NonFiniteInput, config_fields)

__all__ = ["ADAN_FP32_LIMITS", "ADAN_FP32_MAX_ITERS", "MODE_ADAN", "MODE_CLOSED", "MODE_DDIM", "MODE_DENOISE",
           "MODE_FIXED", "MODE_GAUSSIAN", "FusedStepConfig", "NonFiniteInput", "config_fields", "cpu_info",
           "set_cpu_target"]


def cpu_info() -> dict:
    """The C++ kernels' CPU target (see :func:`gms_kernels.kernels.cpp.cpu_info`): the one in use,
    the best this CPU runs, those compiled into the extension and those this CPU supports."""
    from . import cpp

    return cpp.cpu_info()


def set_cpu_target(name: str | None) -> str:
    """Run the C++ kernels compiled for CPU target ``name`` (e.g. 'avx2' on an AVX-512 machine, to
    test or time that code; None: the best one); returns the target now in use."""
    from . import cpp

    return cpp.set_cpu_target(name)
