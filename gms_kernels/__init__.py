"""gms_kernels: Gaussian Mixture Solvers (GMS, NeurIPS 2023) for diffusion sampling.

Pipeline: schedule -> moments -> fit -> mixture sampling -> solver step -> sampling loop.
"""
from .core.schedule import DATA, Schedule, StepCoefficients, karras_trajectory, trajectory, TRAJECTORY_KINDS
from .core.moments import TransitionMoments, X0Moments, transition_moments, x0_moments
from .core.fit import MixtureParams, fit_adan, fit_closed, mixture_raw_moments
from .core.mixture import sample_mixture
from .solvers import SOLVERS, solver_step
from .sampling import estimate_gamma, sample, set_default_model as _set_default_model, step
from .model_io import register_adapter as _register_adapter
from .eval.oracle import GaussianMixtureOracle
from .sdedit import SDEditResult, sdedit, stroke_guide
from .eval.tuning import OptionChoice, choose_options
from .core import data
from .eval import metrics

__version__ = "0.1.0"


def _embedded_digits_model() -> tuple:
    """gk.sample's model for model=None: the embedded digits model and its samples' shape (C, H, W)."""
    from .models.embedded import DIGITS_SHAPE, default_model

    return default_model(), DIGITS_SHAPE


_set_default_model(_embedded_digits_model)


def _adapt_diffusers(model: object) -> object:
    """gk.sample's adapter of diffusers models (:func:`gms_kernels.models.diffusers_unet.adapt_diffusers`)."""
    from .models.diffusers_unet import adapt_diffusers

    return adapt_diffusers(model)


_register_adapter(_adapt_diffusers)

__all__ = [
    "DATA", "Schedule", "StepCoefficients", "karras_trajectory", "trajectory", "TRAJECTORY_KINDS",
    "TransitionMoments", "X0Moments", "transition_moments", "x0_moments",
    "MixtureParams", "fit_adan", "fit_closed", "mixture_raw_moments", "sample_mixture",
    "SOLVERS", "solver_step", "estimate_gamma", "sample", "step", "GaussianMixtureOracle",
    "SDEditResult", "sdedit", "stroke_guide", "OptionChoice", "choose_options", "data", "metrics", "models", "inception", "GMSScheduler", "GMSSchedulerOutput",
    "GMSDiffusersModel", "train_heads", "train_backbone", "reproduce", "calibrate_heads",
]

_LAZY = {"GMSScheduler": "integrations.scheduler", "GMSSchedulerOutput": "integrations.scheduler", "models": None,
         "inception": "eval.inception", "reproduce": "eval.reproduce", "k_diffusion": "integrations.k_diffusion",
         "GMSDiffusersModel": "models.diffusers_export", "train_heads": "train.training",
         "train_backbone": "train.training", "calibrate_heads": "eval.calibration"}
# A pipeline's model_index.json names these classes ["gms_kernels", class name]: diffusers' loader imports the
# library by that name and takes from it the class and the diffusers bases it checks the class against, which
# are found here (not listed by dir or __all__: they are diffusers' names).
_DIFFUSERS_BASES = {"ModelMixin": "models.diffusers_export", "SchedulerMixin": "integrations.scheduler"}


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
    if name in ("inception", "reproduce", "k_diffusion"):  # modules, not names within them
        return importlib.import_module(f".{where}", __name__)
    return getattr(importlib.import_module(f".{where}", __name__), name)
