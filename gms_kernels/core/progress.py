"""Progress bars that respect tqdm's environment variables.

tqdm (>= 4.66) reads ``TQDM_*`` variables such as ``TQDM_DISABLE=1`` as new *defaults* for its
arguments, when tqdm is imported; an argument passed explicitly wins over them. So
``tqdm(..., disable=not progress)`` passes ``disable=False`` whenever a bar is wanted and silently
overrides ``TQDM_DISABLE=1``. :func:`progress_bar` passes ``disable`` only to switch a bar off, so
that a requested bar still obeys the environment.
"""
from __future__ import annotations

from typing import Any, Iterable

from tqdm.auto import tqdm


def progress_bar(iterable: Iterable | None = None, enabled: bool = True, **kwargs: Any) -> tqdm:
    """``tqdm(iterable, **kwargs)``, switched off when ``enabled`` is false.

    With ``enabled=True`` the ``disable`` argument is left at tqdm's default, so ``TQDM_DISABLE=1``
    (and the other ``TQDM_*`` variables) still apply. Pass ``enabled``, not ``disable``.
    """
    if "disable" in kwargs:
        raise TypeError("progress_bar takes enabled=..., not disable=... (an explicit disable would "
                        "override TQDM_DISABLE)")
    if not enabled:
        kwargs["disable"] = True
    return tqdm(iterable, **kwargs)
