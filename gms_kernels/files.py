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
