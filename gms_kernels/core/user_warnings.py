"""Warnings that point at the user's line.

A warning about the user's input is only useful where that input was given: the line that called the library,
however deep inside it the warning is raised, and whichever framework (diffusers' config decorators and
``from_pretrained``, torch's module calls) sits between. Counting frames by hand at each ``warnings.warn``
breaks whenever a call path changes; :func:`warn_user` finds the frame instead (as Python 3.12's
``skip_file_prefixes`` does, which Python 3.10 lacks).
"""
from __future__ import annotations

import sys
import warnings
from types import FrameType

# top-level packages whose frames are plumbing between the user and the warning
_LIBRARY_PACKAGES = frozenset({"gms_kernels", "diffusers", "torch"})


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the innermost frame outside gms_kernels, diffusers
    and torch: the user's call."""
    frame = sys._getframe(1)
    stacklevel = 2  # 2: warn_user's caller
    while frame.f_back is not None and (_in_library(frame) or _import_machinery(frame)):
        frame = frame.f_back
        if not _import_machinery(frame):  # (warnings.warn does not count these frames either)
            stacklevel += 1
    warnings.warn(message, category, stacklevel=stacklevel)


def _in_library(frame: FrameType) -> bool:
    module = frame.f_globals.get("__name__") or ""
    return module.partition(".")[0] in _LIBRARY_PACKAGES


def _import_machinery(frame: FrameType) -> bool:
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename
