"""Reproductions on the embedded digits model (CPU-scale analogues of the paper's experiments).

(b) FD-digits against the number of steps K for every solver, GMS with per-sample and per-pixel
    component selection, and the same comparison at equal wall time (paper: "same computation cost");
(c) the moment discrepancy D_{s|t} against K (paper Fig. 2);
(d) SDEdit on digit strokes: L2 faithfulness against FD realism (paper Fig. 5a).

Every (solver, K) result is cached in a JSON file as soon as it is measured, so an interrupted run
resumes where it stopped; delete the file to measure again.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from gms_kernels.models.embedded import DIGITS_SHAPE
from gms_kernels.core.files import write_atomically
from gms_kernels.eval.metrics import fd_digits, moment_discrepancy
from gms_kernels.sampling import sample
from gms_kernels.core.schedule import DATA, Schedule, trajectory as make_trajectory
from gms_kernels.sdedit import sdedit, stroke_guide

STEPS = (5, 10, 20, 50, 100)
_ADAN = {"fit": "adan", "fit_iters": 25}
# (label, solver, options); GMS keeps the library defaults otherwise (official Gaussian last step)
SOLVERS: list[tuple[str, str, dict]] = [
    ("ddpm", "ddpm", {}),
    ("ddpm-large", "ddpm-large", {}),
    ("sn-ddpm", "sn-ddpm", {}),
    ("ddim", "ddim", {}),
    ("gms-adan / sample", "gms", {**_ADAN, "select": "sample"}),
    ("gms-adan / pixel", "gms", {**_ADAN, "select": "pixel"}),
    ("gms-closed / sample", "gms", {"fit": "closed", "select": "sample"}),
    ("gms-closed / pixel", "gms", {"fit": "closed", "select": "pixel"}),
]
SOLVER_OPTIONS = {label: (solver, options) for label, solver, options in SOLVERS}
SDEDIT_SOLVERS = ("ddim", "sn-ddpm", "gms-adan / pixel")


class ResultCache:
    """A JSON dict of measured results, written after every new entry (an interrupted run resumes).

    Writes to ``path``; reads it and ``also_read`` (the caches of other runs of the same cells, side by side)."""

    def __init__(self, path: str | Path | None, also_read: Sequence[str | Path] = ()):
        self.path = Path(path) if path else None
        self.data: dict = {}
        for p in [*also_read, *([self.path] if self.path is not None else [])]:
            if Path(p).exists():
                self.data.update(json.loads(Path(p).read_text()))

    def get_or_compute(self, key: str, compute: Callable[[], dict]) -> dict:
        if key not in self.data:
            self.data[key] = compute()
            if self.path is not None:
                text = json.dumps(self.data, indent=1)
                write_atomically(self.path, lambda tmp: tmp.write_text(text))
        return self.data[key]


def _sample(model, label: str, steps: int, n: int, seed: int, batch_size: int) -> torch.Tensor:
    solver, options = SOLVER_OPTIONS[label]
    parts = [sample(model, shape=(min(batch_size, n - i), *DIGITS_SHAPE), steps=steps, solver=solver, generator=seed,
                    first_index=i, progress=False, **options) for i in range(0, n, batch_size)]
    return torch.cat(parts)


def fd_vs_steps(model, reference: torch.Tensor, labels: Sequence[str] = tuple(SOLVER_OPTIONS),
                steps: Sequence[int] = STEPS, n_samples: int = 1000, seed: int = 0, batch_size: int = 500,
                cache: ResultCache | None = None, log=print) -> dict[tuple[str, int], dict]:
    """(b): {(label, K): {"fd": FD-digits, "seconds": wall time of the sampling}}."""
    cache = cache or ResultCache(None)
    out = {}
    for label in labels:
        for k in steps:
            def run(label=label, k=k):
                t0 = time.perf_counter()
                x = _sample(model, label, k, n_samples, seed, batch_size)
                seconds = time.perf_counter() - t0
                return {"fd": fd_digits(x, reference), "seconds": seconds, "n": n_samples}
            out[(label, k)] = r = cache.get_or_compute(f"fd|{label}|{k}|{n_samples}|{seed}", run)
            if log:
                log(f"{label:20s} K={k:4d}: FD-digits {r['fd']:8.3f} ({r['seconds']:.1f} s)")
    return out


def step_costs(model, labels: Sequence[str], n: int = 500, steps: int = 5, rounds: int = 5) -> dict[str, float]:
    """Wall time of one sampling step (network call + solver step) of each solver at batch ``n``:
    the solvers take turns for ``rounds`` rounds and each keeps its fastest, so that load from other
    processes, which only ever adds time, weighs on all of them alike."""
    best = {label: float("inf") for label in labels}
    for _ in range(rounds):
        for label in labels:
            t0 = time.perf_counter()
            _sample(model, label, steps, n, 0, n)
            best[label] = min(best[label], (time.perf_counter() - t0) / (steps + 1))  # K+1 network calls
    return best


def equal_time_steps(costs: dict[str, float], gms_label: str, gms_steps: int) -> dict[str, int]:
    """For each solver, the number of steps whose cost matches ``gms_steps`` steps of ``gms_label``."""
    budget = costs[gms_label] * gms_steps
    return {label: max(1, round(budget / c)) for label, c in costs.items()}


@torch.no_grad()
def discrepancy_vs_steps(model, data: torch.Tensor, steps: Sequence[int] = (2, 5, 10, 20, 50, 100, 200),
                         schedule: Schedule | None = None, seed: int = 0) -> dict[int, dict]:
    """(c): for each K, D_{s|t} (metrics.moment_discrepancy, per image) at every step t -> s of the
    even trajectory, with x_t ~ q(x_t | x_0) for the data images; mean over images, then the mean
    and the maximum over the K steps."""
    schedule = schedule or Schedule.linear()
    g = torch.Generator().manual_seed(seed)
    eps = torch.randn(data.shape, generator=g)
    out = {}
    for k in steps:
        ts = make_trajectory(schedule, k, "even")
        per_step = []
        for i, t in enumerate(ts):
            s = ts[i + 1] if i + 1 < len(ts) else DATA
            x_t = schedule.add_noise(data, eps, t).float()
            per_step.append(float(moment_discrepancy(model, x_t, t, s, schedule).mean()))
        out[k] = {"mean": sum(per_step) / len(per_step), "max": max(per_step), "per_step": per_step, "t": list(ts)}
    return out


def sdedit_grid(model, guides: torch.Tensor, reference: torch.Tensor, labels: Sequence[str] = SDEDIT_SOLVERS,
                t0s: Sequence[float] = (0.3, 0.4, 0.5), steps: Sequence[int] = (50, 100), seed: int = 0,
                cache: ResultCache | None = None, log=print) -> tuple[dict, dict]:
    """(d): {(label, t0, K): {"l2": mean per-image L2 to the guide, "fd": FD-digits}} and the edits
    of the first 10 guides per (label, t0) at the largest K (for a figure)."""
    cache = cache or ResultCache(None)
    out, edits = {}, {}
    for label in labels:
        solver, options = SOLVER_OPTIONS[label]
        for t0 in t0s:
            for k in steps:
                images = []

                def run(t0=t0, k=k):
                    res = sdedit(model, guides, t0, k, solver=solver, generator=seed, progress=False, **options)
                    images.append(res.images[:10])
                    return {"l2": float(res.l2.mean()), "fd": fd_digits(res.images, reference)}
                r = cache.get_or_compute(f"sdedit|{label}|{t0}|{k}|{guides.shape[0]}|{seed}", run)
                out[(label, t0, k)] = r
                if k == max(steps):
                    edits[(label, t0)] = images[0] if images else sdedit(
                        model, guides[:10], t0, k, solver=solver, generator=seed, progress=False, **options).images
                if log:
                    log(f"sdedit {label:20s} t0={t0} K={k:4d}: L2 {r['l2']:.3f}  FD-digits {r['fd']:.3f}")
    return out, edits


def strokes(images: torch.Tensor) -> torch.Tensor:
    """Stroke guides for 8x8 digits: 2x2 blocks averaged, 4 grey levels."""
    return stroke_guide(images, block=2, colors=4)
