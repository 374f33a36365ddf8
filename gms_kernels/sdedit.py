"""SDEdit (Meng et al. 2022) with any solver: stroke-based synthesis / image editing.

A guide image x^g (e.g. coarse colour strokes) is lifted to time t0 with the forward process,
x_t0 = a_t0 x^g + sigma_t0 eps, and then solved back to data with the reverse process over
``steps`` steps of the chosen solver. Small t0 keeps the result faithful to the guide, large t0
makes it realistic (paper Sec. SDEdit). Faithfulness is reported as the per-image L2 distance
||x_edit - x^g||_2 over all pixels (the square root of the summed squared differences, in data
units), as in the paper's "L2 distance summed over all pixels".

Randomness: the noise eps that lifts the guide comes from the Philox stream ``STREAM_SDEDIT``
(= 3) of :mod:`gms_kernels.core.random`, addressed by (seed, t0, sample index) like every other random
number of the package (streams 0-2 are the step noise, the component choice and x_T), so an edit
is reproducible and does not depend on the batch it is computed in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from .core.moments import DataRange, check_data_range
from .core.random import GeneratorLike, SampleNoise, fixed_seeds
from .sampling import sample
from .core.schedule import Schedule, schedule_for, trajectory as make_trajectory

STREAM_SDEDIT = 3  # Philox stream of the noise that lifts the guide to t0 (0, 1, 2: see gms_kernels.core.random)


@dataclass
class SDEditResult:
    """images: the edited images [N, C, ...] (dtype of the guide); l2: float64 [N], per-image
    L2 distance ||images[i] - guide[i]||_2 over all pixels; t0 and trajectory: what was solved."""

    images: torch.Tensor
    l2: torch.Tensor
    t0: int = 0
    trajectory: list[int] = field(default_factory=list)


def resolve_t0(t0: int | float, T: int) -> int:
    """The time index of ``t0``: an int is an index in [0, T-1]; a float f in (0, 1] is the
    fraction f of the diffusion time, i.e. f*T noise levels, index round(f*T) - 1 (0.5 -> T/2 - 1,
    1.0 -> T - 1), the convention of the SDEdit code (t0 = 500 levels noises with abar[499])."""
    if isinstance(t0, bool):
        raise ValueError(f"t0 must be an int index or a float fraction of T, got {t0!r}")
    if isinstance(t0, float):
        if not (math.isfinite(t0) and 0.0 < t0 <= 1.0):
            raise ValueError(f"a float t0 is a fraction of T and must lie in (0, 1], got {t0}")
        return max(int(round(t0 * T)) - 1, 0)
    if isinstance(t0, int) or (torch.is_tensor(t0) and t0.numel() == 1):
        t0 = int(t0)
        if not 0 <= t0 < T:
            raise ValueError(f"t0 = {t0} is out of range: use an index in [0, {T - 1}] or a fraction in (0, 1]")
        return t0
    raise ValueError(f"t0 must be an int index or a float fraction of T, got {t0!r}")


def sdedit_trajectory(schedule: Schedule | int, t0: int | float, steps: int,
                      kind: str | Sequence[int] = "even") -> list[int]:
    """Descending time indices from t0 down to 0 (the sampler then steps to data).

    Named kinds are :func:`gms_kernels.trajectory` on the schedule truncated to its first t0+1
    steps, so "even"/"linear"/"quad"/"trailing"/"linspace" start at t0; "leading" (which does
    not) is shifted up to start at t0, like diffusers' ``steps_offset``. An explicit list must
    start at t0.
    """
    T = schedule if isinstance(schedule, int) else schedule.T
    t0 = resolve_t0(t0, T)
    if not isinstance(kind, str):
        ts = make_trajectory(T, 0, kind)
        if ts[0] != t0:
            raise ValueError(f"an explicit SDEdit trajectory must start at t0 = {t0}, got {ts[0]}")
        return ts
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= t0 + 1:
        raise ValueError(f"steps must be an integer in [1, t0 + 1 = {t0 + 1}], got {steps!r}")
    ts = make_trajectory(t0 + 1, steps, kind)
    return [t + t0 - ts[0] for t in ts]


def noise_guide(guide: torch.Tensor, t0: int | float, schedule: Schedule, generator: GeneratorLike = None,
                first_index: int = 0) -> torch.Tensor:
    """x_t0 = a_t0 guide + sigma_t0 eps, eps from Philox stream ``STREAM_SDEDIT`` at time t0
    (computed in float64, returned in the guide's dtype)."""
    _check_guide(guide)
    t = resolve_t0(t0, schedule.T)
    src = SampleNoise.create(generator, guide.shape[0], first_index)
    eps = src.normal(STREAM_SDEDIT, t, guide.shape[1:]).to(device=guide.device, dtype=torch.float64)
    x = schedule.add_noise(guide.to(torch.float64), eps, t)
    return x.to(guide.dtype)


def _check_guide(guide: torch.Tensor) -> None:
    if not torch.is_tensor(guide) or guide.dim() < 2 or not guide.is_floating_point():
        raise ValueError("guide must be a floating-point tensor [N, C, ...] of images in the data range")
    if not torch.isfinite(guide).all():
        raise ValueError("guide has non-finite values (NaN or inf)")


@torch.no_grad()
def sdedit(model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], guide: torch.Tensor, t0: int | float,
           steps: int, solver: str = "gms", schedule: Schedule | None = None,
           trajectory: str | Sequence[int] = "even", generator: GeneratorLike = None,
           data_range: DataRange = (-1.0, 1.0), progress: bool = True, *, first_index: int = 0,
           time_input: str | None = None, backend: str = "auto", **solver_options: Any) -> SDEditResult:
    """Edit ``guide`` [N, C, ...]: lift it to t0 and solve back to data with ``solver``.

    ``t0``: int index or float fraction of T (see :func:`resolve_t0`); ``steps``: reverse steps
    from t0 (the trajectory is :func:`sdedit_trajectory`; ``steps`` is not used when ``trajectory``
    is an explicit list, which must start at t0); ``generator``: int seed,
    torch.Generator, None, or one per image; sample i depends only on (seed, first_index + i).
    Other arguments as in :func:`gms_kernels.sample` (e.g. ``fit``, ``select``, ``eta``,
    ``gamma`` for analytic-dpm, whose table must cover this trajectory).
    Returns ``SDEditResult(images, l2)`` with l2 the per-image L2 distance to the guide.
    """
    _check_guide(guide)
    data_range = check_data_range(data_range)
    schedule = schedule_for(model, schedule)
    t = resolve_t0(t0, schedule.T)
    ts = sdedit_trajectory(schedule, t, steps, trajectory)
    seeds = fixed_seeds(generator, draw_global=True)  # (the lift and the solver share the same keys)
    x_t0 = noise_guide(guide, t, schedule, seeds, first_index)
    images = sample(model, x_T=x_t0, steps=len(ts), solver=solver, schedule=schedule, trajectory=ts,
                    generator=seeds, progress=progress, data_range=data_range, time_input=time_input,
                    first_index=first_index, backend=backend, **solver_options)
    l2 = (images.to(torch.float64) - guide.to(torch.float64)).flatten(1).norm(dim=1).cpu()
    return SDEditResult(images=images, l2=l2, t0=t, trajectory=ts)


def stroke_guide(images: torch.Tensor, block: int = 4, colors: int = 6,
                 data_range: DataRange = (-1.0, 1.0)) -> torch.Tensor:
    """Stroke-style guides from images [N, C, H, W] in ``data_range``: average each block x block
    patch, quantise every channel to ``colors`` evenly spaced levels spanning the data range, and
    upsample back (nearest). Edges that do not fill a block are averaged over what they hold."""
    if not torch.is_tensor(images) or images.dim() != 4 or not images.is_floating_point():
        raise ValueError("images must be a floating-point tensor [N, C, H, W]")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    if isinstance(colors, bool) or not isinstance(colors, int) or colors < 2:
        raise ValueError(f"colors must be an integer >= 2, got {colors!r}")
    lo, hi = check_data_range(data_range) or (-1.0, 1.0)
    N, C, H, W = images.shape
    x = images.to(torch.float64)
    pooled = F.avg_pool2d(x, block, stride=block, ceil_mode=True, count_include_pad=False)
    u = ((pooled - lo) / (hi - lo)).clamp(0.0, 1.0)
    levels = torch.round(u * (colors - 1)) / (colors - 1)
    q = lo + (hi - lo) * levels
    up = q.repeat_interleave(block, dim=2).repeat_interleave(block, dim=3)[:, :, :H, :W]
    return up.to(images.dtype)
