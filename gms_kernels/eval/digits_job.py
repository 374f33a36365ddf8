"""The command line's default job (``gms-kernels``, ``gms-kernels digits``): digits from the embedded model with
GMS and the Gaussian baselines over several seeds, scored against the held-out test digits, as a table with
95% intervals and a grid of samples."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch

from ..core.data import digits
from ..core.images import save_panels
from ..models.embedded import DIGITS_SHAPE, default_model
from ..sampling import sample
from .metrics import fd_digits, paired_difference, seed_interval

# (label, solver, options). "gms": the embedded model's own options (closed fit, one component per pixel, as the
# library's defaults); "gms closed/sample": one component per image, as the official code draws;
# "gms preset=official": what the official GMS code runs
ROWS: tuple[tuple[str, str, dict], ...] = (
    ("gms", "gms", {}),
    ("gms closed/sample", "gms", {"fit": "closed", "select": "sample"}),
    ("gms preset=official", "gms", {"preset": "official"}),
    ("sn-ddpm", "sn-ddpm", {}),
    ("ddpm", "ddpm", {}),
    ("ddim", "ddim", {}),
)
GRID_ROWS = ("gms", "sn-ddpm")  # the grid's panels: the first 100 samples of the first seed
BATCH = 1000  # samples per call; the seeded noise does not depend on it (first_index)


def draw(model: torch.nn.Module, solver: str, options: dict, steps: int, n: int, seed: int) -> torch.Tensor:
    """``n`` digits of one row at K = ``steps``, in batches of :data:`BATCH`."""
    return torch.cat([sample(model, shape=(min(BATCH, n - i), *DIGITS_SHAPE), steps=steps, solver=solver,
                             generator=seed, first_index=i, progress=False, **options) for i in range(0, n, BATCH)])


def run_digits_job(out_dir: str | Path = "gms_out", steps: int = 10, n_samples: int = 1000, seeds: int = 5,
                   first_seed: int = 0, log: Callable[[str], None] | None = print) -> str:
    """Every row of :data:`ROWS` at K = ``steps`` for seeds ``first_seed .. first_seed + seeds - 1``, FD-digits
    against the test split; returns the Markdown report and writes ``digits_K{steps}.png`` into ``out_dir``.
    ``log`` gets one line per row as it finishes (None: silent)."""
    model, reference = default_model(), digits("test")[0]
    fd: dict[str, list[float]] = {}
    panels = []
    for label, solver, options in ROWS:
        t0 = time.perf_counter()
        fd[label] = []
        for seed in range(first_seed, first_seed + seeds):
            x = draw(model, solver, options, steps, n_samples, seed)
            fd[label].append(fd_digits(x, reference))
            if seed == first_seed and label in GRID_ROWS:
                panels.append((f"{label.upper()} K={steps}", x[:100]))
        if log:
            value = seed_interval(fd[label]) if seeds > 1 else f"{fd[label][0]:.2f}"
            log(f"{label:22s} K={steps}: FD-digits {value} ({time.perf_counter() - t0:.1f} s)")
    png = save_panels(panels, Path(out_dir) / f"digits_K{steps}.png")
    default = ROWS[0][0]
    rows = []
    for label, _, _ in ROWS:
        if seeds == 1:
            rows.append(f"| {label} | {fd[label][0]:.2f} | - |")
            continue
        iv = seed_interval(fd[label])
        vs = "(this row)"
        if label != default:
            diff, significant = paired_difference(fd[default], fd[label])
            vs = f"{diff.mean:+.2f} [{diff.low:+.2f}, {diff.high:+.2f}]" + (" *" if significant else "")
        rows.append(f"| {label} | {iv.mean:.2f} ± {iv.half_width:.2f} | {vs} |")
    test_digits = reference.shape[0]
    return "\n".join([
        f"Embedded digits model (8x8, trained on the train split; linear schedule T=1000, even trajectory), "
        f"K={steps}, {n_samples} samples per run, seeds {first_seed}..{first_seed + seeds - 1}. FD-digits: Frechet "
        "distance between the 128-d features of the shipped digits classifier (gk.metrics.fd_digits) for the "
        f"samples and for the {test_digits} held-out test digits; lower is better. Mean ± half-width of the 95% "
        "interval over seeds; last column: default GMS minus that row, paired over seeds, with its 95% interval "
        "(* = significant). gms: the model's default GMS (closed fit, one mixture component per pixel: the "
        "embedded model's own options, chosen on its validation split, and the library's default); gms "
        "closed/sample: one component per image, as the official code draws.",
        "",
        "| solver | FD-digits | default GMS minus this row |",
        "|---|---|---|",
        *rows,
        "",
        f"Grid (first 100 samples of seed {first_seed}): {png}",
    ])
