"""The main job: sample digits from the embedded model with GMS and the baselines, grid + quality table."""
from __future__ import annotations

import time
from pathlib import Path

from ..data import digits
from ..embedded import DIGITS_SHAPE, default_model
from ..images import save_panels
from ..metrics import fd_digits
from ..sampling import sample
from .digits_study import SOLVER_OPTIONS

# GMS in its best configuration on digits (ADAN fit, a component per pixel; see python/results/digits_fd.md),
# the library's default GMS (closed form, a component per image), and the baselines
JOB_SOLVERS = ("gms-adan / pixel", "gms-closed / sample", "sn-ddpm", "ddpm", "ddim")
GRID_SOLVERS = ("gms-adan / pixel", "sn-ddpm")


def run_digits_job(out_dir: str | Path = "gms_out", steps: int = 10, n_samples: int = 2000, seed: int = 0,
                   progress: bool = True, log=print) -> str:
    """Returns the Markdown report; writes ``digits_K{steps}.png`` (GMS | SN-DDPM) into ``out_dir``."""
    model = default_model()
    reference, _ = digits("all")
    rows, grids = [], []
    for label in JOB_SOLVERS:
        solver, options = SOLVER_OPTIONS[label]
        t0 = time.perf_counter()
        x = sample(model, shape=(n_samples, *DIGITS_SHAPE), steps=steps, solver=solver, generator=seed,
                   progress=progress, **options)
        seconds = time.perf_counter() - t0
        fd = fd_digits(x, reference)
        rows.append(f"| {label} | {steps} | {fd:.2f} | {seconds:.1f} s |")
        log(f"{label:20s} K={steps}: FD-digits {fd:.2f} ({seconds:.1f} s)")
        if label in GRID_SOLVERS:
            grids.append((f"{label.upper()} K={steps}", x[:100]))
    png = save_panels(grids, Path(out_dir) / f"digits_K{steps}.png")
    return "\n".join([
        f"Embedded digits model (8x8, linear schedule T=1000, even trajectory), {n_samples} samples per solver, "
        f"seed {seed}. FD-digits: Frechet distance between the 128-d features of the shipped digits classifier "
        "(gk.metrics.fd_digits) for the samples and for all 1797 scikit-learn digits; lower is better.",
        "",
        "| solver | K | FD-digits | time |",
        "|---|---|---|---|",
        *rows,
        "",
        f"Grid (first 100 samples, same seed): {png}",
    ])
