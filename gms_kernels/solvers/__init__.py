"""The solvers: one module per solver (or small family), each registering itself in :data:`SOLVERS` on import.

Adding a solver is adding its module and one import line below; see :mod:`gms_kernels.solvers.base` for what a
solver gives, and for running a solver of your own without registering it.
"""
from .base import (SOLVERS, EpsFunction, LastStepOptions, Solver, SolverOptions, StepRandomness, denoise_coefficients,
                   denoised_and_eps, fused_config, get_solver, register, resolve_options, solver_step,
                   with_model_defaults)
# the registry, in this order (each module registers its solvers when imported)
from . import ddpm  # noqa: F401
from . import sn_ddpm  # noqa: F401
from . import ddim  # noqa: F401
from . import analytic_dpm  # noqa: F401
from . import gms  # noqa: F401
from . import exact  # noqa: F401
from . import seeds  # noqa: F401
from . import edm  # noqa: F401
from . import ggf  # noqa: F401
from . import dpmpp_2m_sde  # noqa: F401
from . import euler_ancestral  # noqa: F401

__all__ = ["SOLVERS", "EpsFunction", "LastStepOptions", "Solver", "SolverOptions", "StepRandomness",
           "denoise_coefficients", "denoised_and_eps", "fused_config", "get_solver", "register", "resolve_options",
           "solver_step", "with_model_defaults"]
