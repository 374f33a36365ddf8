"""On the embedded digits model: GMS against the SDE baselines (EDM-SDE, SEEDS-1/2, GGF) and the
existing rows, at equal network calls (NFE), over several seeds, with 95% intervals and paired tests.

A solver's steps K are chosen per NFE budget B on the even trajectory: the largest K whose network calls
(the solver's ``network_calls``) fit in B, so one-call solvers get about twice the steps of the
two-call ones (EDM-SDE's Heun correction, SEEDS-2's intermediate point). GGF's calls are adaptive and cannot
be set: it runs at a tolerance and its mean NFE is reported (a separate block, against the one-call rows
at a matching budget).
"""
from __future__ import annotations

import json
import time
from typing import Sequence

import torch

from gms_kernels.models.embedded import DIGITS_SHAPE
from gms_kernels.eval.metrics import fd_digits, paired_difference, seed_interval
from gms_kernels.sampling import sample
from gms_kernels.core.schedule import Schedule, karras_trajectory, trajectory as make_trajectory
from gms_kernels.solvers import get_solver
from .digits_study import ResultCache

# (label, solver, options); 'gms' is the library default (closed fit, one component per image, Gaussian last step)
ROWS: list[tuple[str, str, dict]] = [
    ("ddpm", "ddpm", {}),
    ("sn-ddpm", "sn-ddpm", {}),
    ("ddim", "ddim", {}),
    ("gms (default)", "gms", {}),
    ("gms-adan / pixel", "gms", {"fit": "adan", "fit_iters": 25, "select": "pixel"}),
    ("seeds-1", "seeds-1", {}),
    ("seeds-2", "seeds-2", {}),
    ("seeds-2 (data)", "seeds-2", {"prediction": "data"}),
    ("edm-sde", "edm-sde", {}),
    # EDM on its own time grid (Eq. 5, rho = 7): "karras" is resolved per K by sampling_options
    ("edm-sde (rho 7)", "edm-sde", {"trajectory": "karras"}),
]
GMS_LABELS = ("gms (default)", "gms-adan / pixel")
ROW_OPTIONS = {label: (solver, options) for label, solver, options in ROWS}


def steps_for_budget(solver: str, budget: int, T: int = 1000) -> tuple[int, int]:
    """(K, NFE): the largest K of the even trajectory whose network calls fit in ``budget``."""
    best = None
    for K in range(1, budget + 1):
        nfe = get_solver(solver).network_calls(len(make_trajectory(T, K, "even")))
        if nfe <= budget:
            best = (K, nfe)
    if best is None:
        raise ValueError(f"no K of solver {solver!r} fits {budget} network calls")
    return best


def sampling_options(options: dict, steps: int, schedule: Schedule) -> dict:
    """A row's options for gk.sample at ``steps``: ``trajectory="karras"`` becomes EDM's grid
    (:func:`gms_kernels.core.schedule.karras_trajectory`) for that many steps."""
    if options.get("trajectory") == "karras":
        return {**options, "trajectory": karras_trajectory(schedule, steps)}
    return options


def _draw(model, solver: str, options: dict, steps: int, n: int, seed: int, batch: int) -> tuple[torch.Tensor, float]:
    """n samples (in batches; sample i is the same whatever the batch) and the mean NFE per sample."""
    options = sampling_options(options, steps, Schedule.linear())  # (the embedded model's schedule)
    parts, nfe = [], []
    for first in range(0, n, batch):
        seen: list[dict] = []
        parts.append(sample(model, shape=(min(batch, n - first), *DIGITS_SHAPE), steps=steps, solver=solver,
                            generator=seed, first_index=first, progress=False, callback=seen.append, **options))
        last = seen[-1].get("nfe")
        nfe.append(float(torch.as_tensor(last, dtype=torch.float64).mean()) if last is not None else float(len(seen)))
    return torch.cat(parts), sum(nfe) / len(nfe)


def run_cells(model, reference: torch.Tensor, cells: Sequence[tuple[str, str, dict, int]], seeds: Sequence[int],
              n_samples: int, cache: ResultCache, batch: int = 500, log=print) -> dict:
    """cells: (label, solver, options, steps K); returns {(label, K): [per-seed {"fd", "nfe", "seconds"}]}."""
    out = {}
    for label, solver, options, K in cells:
        for seed in seeds:
            def compute(solver=solver, options=options, K=K, seed=seed):
                t0 = time.perf_counter()
                x, nfe = _draw(model, solver, options, K, n_samples, seed, batch)
                return {"fd": fd_digits(x, reference), "nfe": nfe, "seconds": time.perf_counter() - t0}
            key = f"{label}|{solver}|{json.dumps(options, sort_keys=True)}|K={K}|n={n_samples}|seed={seed}"
            r = cache.get_or_compute(key, compute)
            out.setdefault((label, K), []).append(r)
            if log:
                log(f"{label:22s} K={K:3d} seed={seed}: FD {r['fd']:7.2f}  NFE {r['nfe']:6.1f}  ({r['seconds']:.0f} s)")
    return out


def budget_cells(budget: int) -> list[tuple[str, str, dict, int]]:
    return [(label, solver, options, steps_for_budget(solver, budget)[0]) for label, solver, options in ROWS]


def table(results: dict, cells: Sequence[tuple[str, str, dict, int]], gms_labels: Sequence[str] = GMS_LABELS,
          deterministic: Sequence[str] = ("ddim",)) -> list[str]:
    """Markdown rows: mean FD ± 95% half-width, NFE, K, and the paired differences to the best baseline (the lowest
    mean among the rows not in ``gms_labels``) and to the best stochastic one (not in ``deterministic`` either),
    * where significant at 95%."""
    fds = {(label, K): [r["fd"] for r in results[(label, K)]] for label, _, _, K in cells}
    means = {key: sum(v) / len(v) for key, v in fds.items()}
    base = min((key for key in fds if key[0] not in gms_labels), key=means.get)
    sto = min((key for key in fds if key[0] not in (*gms_labels, *deterministic)), key=means.get, default=base)

    def versus(key: tuple, ref: tuple) -> str:
        if key == ref:
            return "(this row)"
        diff, sig = paired_difference(fds[key], fds[ref])
        return f"{diff.mean:+.2f} [{diff.low:+.2f}, {diff.high:+.2f}]" + (" *" if sig else "")

    lines = [f"| solver | K | NFE | FD-digits (mean ± 95% CI) | vs best baseline ({base[0]}) | vs best stochastic "
             f"baseline ({sto[0]}) |", "|---|---|---|---|---|---|"]
    for label, solver, _, K in sorted(cells, key=lambda c: means[(c[0], c[3])]):
        key = (label, K)
        ci = seed_interval(fds[key])
        nfe = sum(r["nfe"] for r in results[key]) / len(results[key])
        steps = "adaptive" if solver == "ggf" else K
        lines.append(f"| {label} | {steps} | {nfe:.1f} | {ci.mean:.2f} ± {ci.half_width:.2f} | {versus(key, base)} | "
                     f"{versus(key, sto)} |")
    return lines
