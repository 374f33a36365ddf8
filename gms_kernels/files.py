"""Writing files so that a reader (or a resumed run) never sees a partial one."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable


def write_atomically(path: str | os.PathLike, write: Callable[[Path], Any], tag: str = "") -> Path:
    """Call ``write(tmp)`` on a temporary name next to ``path``, then rename it to ``path`` (atomic
    on one file system). ``tag`` keeps the temporary names of concurrent writers apart."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{tag}")
    write(tmp)
    os.replace(tmp, path)
    return path


def save_atomically(obj: Any, path: str | os.PathLike, tag: str = "") -> Path:
    """torch.save(obj) through :func:`write_atomically`."""
    import torch

    return write_atomically(path, lambda tmp: torch.save(obj, tmp), tag)


def json_ready(value: Any, name: str = "value") -> Any:
    """A JSON-safe copy of ``value``, for configs and run manifests: tensors, numpy arrays and tuples
    become lists, numpy and 0-d tensor scalars Python numbers, a gk.Schedule its betas, a dtype its
    name (recursively). Anything else that JSON cannot hold is a TypeError now, naming ``name``,
    rather than a failed or misleading file later."""
    import numpy as np
    import torch

    from .schedule import Schedule

    if isinstance(value, Schedule):
        return {"betas": value.betas.tolist()}
    if isinstance(value, torch.dtype):
        return str(value)
    if torch.is_tensor(value):
        value = value.detach().cpu().tolist()
    elif isinstance(value, (np.ndarray, np.generic)):
        value = value.tolist()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_ready(v, f"{name}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{name} must have string keys to be saved as JSON")
        return {k: json_ready(v, f"{name}[{k!r}]") for k, v in value.items()}
    raise TypeError(f"{name} is a {type(value).__name__}, which JSON cannot hold: use a number, a string, None, "
                    "or a list / tuple / tensor / numpy array of numbers")
