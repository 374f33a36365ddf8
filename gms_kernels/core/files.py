"""Writing files so that a reader (or a resumed run) never sees a partial one, and locks that let
concurrent runs share a folder."""
from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import Any, Callable


def write_atomically(path: str | os.PathLike, write: Callable[[Path], Any], tag: str = "") -> Path:
    """Call ``write(tmp)`` on a temporary name next to ``path``, then rename it to ``path`` (atomic
    on one file system). The temporary name is the call's own (``tag``, the process id and a random
    part), so concurrent writers of one path never share one: each rename is whole, the last one
    stays. A failed write removes its temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # one last extension without dots: torch.save names its archive after the file name up to the
    # last dot, so what it writes does not depend on the random part
    tmp = path.with_name(f"{path.name}.tmp{tag}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def save_atomically(obj: Any, path: str | os.PathLike, tag: str = "") -> Path:
    """torch.save(obj) through :func:`write_atomically`."""
    import torch

    return write_atomically(path, lambda tmp: torch.save(obj, tmp), tag)


class FileLock:
    """An advisory lock (``flock``) on the file ``path``, created if missing: exclusive or shared
    between processes, released by :meth:`release` or when the process ends (a killed process never
    leaves it held). Where the file system (or the platform) has no such locks, every acquire
    succeeds: the caller then behaves as the only writer."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, shared: bool = False, blocking: bool = True) -> bool:
        """Take the lock (waiting for it unless ``blocking`` is False); False when another holds it."""
        try:
            import fcntl
        except ImportError:  # (not POSIX)
            return True
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(self._fd, flags)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # (closing the only descriptor drops the lock)
            self._fd = None

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


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
    if isinstance(value, dict):  # (integer keys, e.g. skew_scale's time indices, as their digits, as JSON has them)
        if not all(isinstance(k, str) or isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in value):
            raise TypeError(f"{name} must have string or integer keys to be saved as JSON")
        return {str(k): json_ready(v, f"{name}[{k!r}]") for k, v in value.items()}
    raise TypeError(f"{name} is a {type(value).__name__}, which JSON cannot hold: use a number, a string, None, "
                    "or a list / tuple / tensor / numpy array of numbers")
