"""Optional dependencies: each comes with one extra of the package, and a missing one is reported with the
command that installs it."""
from __future__ import annotations

import importlib
from types import ModuleType

# top-level module -> (the distribution that provides it, the extra of gms_kernels that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "sklearn": ("scikit-learn", "data"),
    "skimage": ("scikit-image", "data"),
    "scipy": ("scipy", "eval"),
    "matplotlib": ("matplotlib", "eval"),
    "diffusers": ("diffusers", "diffusers"),
    "safetensors": ("safetensors", "diffusers"),
}


def require(module: str, purpose: str) -> ModuleType:
    """``import module`` (a dotted name whose top level is a key of :data:`EXTRAS`); if that package is not
    installed, an ImportError that names ``purpose`` (what needs it) and the pip command of its extra."""
    top = module.split(".")[0]
    if top not in EXTRAS:
        raise ValueError(f"{module!r} is not an optional dependency; known: {', '.join(EXTRAS)}")
    distribution, extra = EXTRAS[top]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != top:
            raise  # the package is there but one of its own dependencies is missing: its error says which
        raise ImportError(f"{purpose} needs {distribution}, which is not installed: "
                          f'pip install "gms_kernels[{extra}]"') from exc
