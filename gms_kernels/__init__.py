"""gms_kernels: Gaussian Mixture Solvers (GMS, NeurIPS 2023) for diffusion sampling.

Pipeline: schedule -> moments -> fit -> mixture sampling -> solver step -> sampling loop.
"""
from .schedule import DATA, Schedule, StepCoefficients, karras_trajectory, trajectory, TRAJECTORY_KINDS
from .moments import TransitionMoments, X0Moments, transition_moments, x0_moments
from .fit import MixtureParams, fit_adan, fit_closed, mixture_raw_moments
from .mixture import sample_mixture
from .solvers import SOLVERS, solver_step
from .sampling import estimate_gamma, sample, step
from .oracle import GaussianMixtureOracle
from .sdedit import SDEditResult, sdedit, stroke_guide
from .tuning import OptionChoice, choose_options
from . import data, metrics

__version__ = "0.1.0"

__all__ = [
    "DATA", "Schedule", "StepCoefficients", "karras_trajectory", "trajectory", "TRAJECTORY_KINDS",
    "TransitionMoments", "X0Moments", "transition_moments", "x0_moments",
    "MixtureParams", "fit_adan", "fit_closed", "mixture_raw_moments", "sample_mixture",
    "SOLVERS", "solver_step", "estimate_gamma", "sample", "step", "GaussianMixtureOracle",
    "SDEditResult", "sdedit", "stroke_guide", "OptionChoice", "choose_options", "data", "metrics", "models", "inception", "GMSScheduler", "GMSSchedulerOutput",
    "GMSDiffusersModel", "train_heads", "train_backbone", "reproduce",
]

_LAZY = {"GMSScheduler": "scheduler", "GMSSchedulerOutput": "scheduler", "models": None, "inception": None,
         "reproduce": None, "k_diffusion": None,
         "GMSDiffusersModel": "models.diffusers_export", "train_heads": "training", "train_backbone": "training"}
# A pipeline's model_index.json names these classes ["gms_kernels", class name]: diffusers' loader imports the
# library by that name and takes from it the class and the diffusers bases it checks the class against, which
# are found here (not listed by dir or __all__: they are diffusers' names).
_DIFFUSERS_BASES = {"ModelMixin": "models.diffusers_export", "SchedulerMixin": "scheduler"}


def __dir__() -> list[str]:
    """The lazily loaded names too, so that tab completion and dir(gk) show them."""
    return sorted(set(globals()) | set(_LAZY))


def __getattr__(name: str):
    """Heavier parts (diffusers, the model zoo, training) load on first use."""
    where = _LAZY.get(name, _DIFFUSERS_BASES.get(name, ""))
    if where == "":
        raise AttributeError(f"module 'gms_kernels' has no attribute {name!r}")
    import importlib

    if where is None:
        return importlib.import_module(f".{name}", __name__)
    return getattr(importlib.import_module(f".{where}", __name__), name)
