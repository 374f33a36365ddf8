"""The natural-image patches testbed: held-out losses of the shipped patches model, and
sample quality of every solver on the test split (sliced W1 in pixel space, Fréchet distance of the
2-D DCT coefficients), over seeds, with mean, 95% interval and significance against the best baseline.

Every (solver, K, seed) result is cached in a JSON file as soon as it is measured (digits_study.ResultCache),
so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch

from gms_kernels.models.embedded import PATCHES_SHAPE
from gms_kernels.eval.metrics import frechet_distance_dct, sliced_wasserstein1
from gms_kernels.sampling import sample
from gms_kernels.core.moments import central_moments
from gms_kernels.core.schedule import Schedule
from .digits_study import ResultCache

STEPS = (5, 10, 20)
BASELINES = ("ddpm", "ddpm-large", "sn-ddpm", "ddim", "edm-sde", "seeds-2 (data)", "edm-sde (rho 7)")
# (label, solver, options); "gms" alone keeps every library default
SOLVERS: list[tuple[str, str, dict]] = [
    ("ddpm", "ddpm", {}),
    ("ddpm-large", "ddpm-large", {}),
    ("sn-ddpm", "sn-ddpm", {}),
    ("ddim", "ddim", {}),
    ("gms (defaults)", "gms", {}),
    ("gms-adan-25 / pixel", "gms", {"fit": "adan", "fit_iters": 25, "select": "pixel"}),
    ("gms-closed / pixel", "gms", {"fit": "closed", "select": "pixel"}),
    # the SDE baselines with two calls per step, run at the K + 1 network calls of the one-call rows
    # (SEEDS in the noise prediction diverges at these step sizes; GGF needs ~45 calls)
    ("edm-sde", "edm-sde", {}),
    ("seeds-2 (data)", "seeds-2", {"prediction": "data"}),
    ("edm-sde (rho 7)", "edm-sde", {"trajectory": "karras"}),  # on EDM's own time grid (Eq. 5)
]
SOLVER_OPTIONS = {label: (solver, options) for label, solver, options in SOLVERS}


@torch.no_grad()
def eps_losses(net, data: torch.Tensor, seed: int = 0, batch_size: int = 1000,
               schedule: Schedule | None = None) -> dict[str, float]:
    """Held-out losses of a MomentNet at one fixed draw of (t, eps) per example (seeded): the MSE of
    e1 against eps, of e2 against eps^2, of e3 against eps^3 (as many heads as the net has), and the
    trivial predictors' MSEs (e1 = 0 gives E[eps^2] = 1; e2 = 1 gives Var(eps^2) = 2)."""
    schedule = schedule or Schedule.linear()
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, schedule.T, (data.shape[0],), generator=g)
    eps = torch.randn(data.shape, generator=g)
    x_t = schedule.add_noise(data, eps, t)
    C, sums, n = data.shape[1], {}, data.shape[0]
    for i in range(0, n, batch_size):
        xb, tb, eb = x_t[i:i + batch_size], t[i:i + batch_size], eps[i:i + batch_size]
        out = net(xb, tb)
        for k in range(1, out.shape[1] // C + 1):
            err = (out[:, (k - 1) * C:k * C] - eb**k).pow(2).sum().item()
            sums[f"mse_e{k}"] = sums.get(f"mse_e{k}", 0.0) + err
        sums["trivial_e1"] = sums.get("trivial_e1", 0.0) + eb.pow(2).sum().item()
        sums["trivial_e2"] = sums.get("trivial_e2", 0.0) + (eb**2 - 1).pow(2).sum().item()
    return {k: v / data.numel() for k, v in sums.items()}


def resolved_options(label: str) -> dict:
    """The solver options a label runs with: the library's defaults at this moment, then the label's own."""
    from gms_kernels.solvers import get_solver

    solver, options = SOLVER_OPTIONS[label]
    merged = {**get_solver(solver).options, **options}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in merged.items()}


def solver_steps(solver: str, K: int) -> int:
    """The steps a solver runs in column K: K, or for a solver with two calls per step the most steps that fit in
    the K + 1 network calls a one-call solver makes there (equal network calls, not equal K)."""
    from gms_kernels.solvers import get_solver
    from .sde_baselines_study import steps_for_budget

    return steps_for_budget(solver, K + 1)[0] if get_solver(solver).calls_per_step != 1 else K


def draw(model, label: str, steps: int, n: int, seed: int, batch_size: int = 1000) -> torch.Tensor:
    """``n`` samples of one solver in column ``steps`` (:func:`solver_steps`; row i is the same whatever the
    batch size: first_index)."""
    from .sde_baselines_study import sampling_options

    solver, options = SOLVER_OPTIONS[label]
    steps = solver_steps(solver, steps)
    options = sampling_options(options, steps, Schedule.linear())  # (the patches model's schedule)
    parts = [sample(model, shape=(min(batch_size, n - i), *PATCHES_SHAPE), steps=steps, solver=solver,
                    generator=seed, first_index=i, progress=False, **options) for i in range(0, n, batch_size)]
    return torch.cat(parts)


def references(n_per_split: int = 10000) -> dict[str, torch.Tensor]:
    """The reference patches: ``test`` = gk.data.patches("test") (the test split itself), and ``train`` =
    ``n_per_split`` patches of the train photos at other positions than the training set's (seed 1000):
    the distribution the model learned, to read the test numbers against (the photo sets differ)."""
    from gms_kernels.core.data import patch_photos, patches

    return {"test": patches("test"),
            "train": patches("train", per_photo=-(-n_per_split // len(patch_photos("train"))), seed=1000)}


def _scores(x: torch.Tensor, refs: dict[str, torch.Tensor]) -> dict[str, float]:
    out = {}
    for name, ref in refs.items():
        out[f"{name}/swd"] = sliced_wasserstein1(x, ref, n_projections=256)
        out[f"{name}/fd_dct"] = frechet_distance_dct(x, ref)
    return out


def measure(model, refs: dict[str, torch.Tensor], labels: Sequence[str] = tuple(SOLVER_OPTIONS),
            steps: Sequence[int] = STEPS, seeds: Sequence[int] = range(5), n_samples: int = 2000,
            cache: ResultCache | None = None, log=print) -> dict[tuple[str, int, int], dict]:
    """{(label, K, seed): {"<ref>/swd": sliced W1 (pixels), "<ref>/fd_dct": Fréchet distance of DCT
    magnitudes, for each reference set in ``refs``; "seconds": sampling wall time, "n": n_samples,
    "options": the solver options used}}."""
    cache = cache or ResultCache(None)
    out = {}
    for k in steps:
        for label in labels:
            for seed in seeds:
                def run(label=label, k=k, seed=seed):
                    t0 = time.perf_counter()
                    x = draw(model, label, k, n_samples, seed)
                    seconds = time.perf_counter() - t0
                    return {**_scores(x, refs), "seconds": seconds, "n": n_samples, "options": resolved_options(label)}
                key = f"{label}|{k}|{seed}|{n_samples}|" + ",".join(refs)
                out[(label, k, seed)] = r = cache.get_or_compute(key, run)
                if log:
                    log(f"{label:22s} K={k:3d} seed {seed}: " + "  ".join(
                        f"{name} SW1 {r[name + '/swd']:.4f} FD-DCT {r[name + '/fd_dct']:.4f}" for name in refs)
                        + f" ({r['seconds']:.0f} s)")
    return out


def data_rows(refs: dict[str, torch.Tensor], seeds: Sequence[int], n_samples: int) -> dict[tuple[str, int], dict]:
    """The metrics' floors at the same sample size: ``n_samples`` real patches per seed, cut at other
    positions (seed 2000 + seed) of the test photos and of the train photos, scored like the samples."""
    from gms_kernels.core.data import patch_photos, patches

    out = {}
    for seed in seeds:
        for split in ("test", "train"):
            x = patches(split, per_photo=-(-n_samples // len(patch_photos(split))), seed=2000 + seed)
            x = x[torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))[:n_samples]]
            out[(f"data: {split} photos, other patches", seed)] = _scores(x, refs)
    return out


def summarise(results: dict[tuple[str, int, int], dict], metric: str, labels: Sequence[str], steps: Sequence[int],
              seeds: Sequence[int]) -> dict[tuple[str, int], dict]:
    """:func:`studies.quality_study.summarise` with the best baseline taken among BASELINES."""
    from .quality_study import summarise as summarise_rows

    return summarise_rows(results, metric, labels, steps, seeds, baseline=lambda label: label in BASELINES)


@torch.no_grad()
def head_variance(net, data: torch.Tensor, ts: Sequence[int] = (50, 100, 200, 300, 500, 700, 900), seed: int = 0,
                  schedule: Schedule | None = None) -> dict[int, dict]:
    """Per t, on x_t ~ q(x_t | x_0) of ``data``: the share of elements whose predicted variance e2 - e1^2 is
    negative (clamped to 0 by the solvers), its mean, and the Monte-Carlo mean of (eps - e1)^2 (an
    upper bound of the true mean variance E Var(eps | x_t), tight when e1 is exact)."""
    schedule = schedule or Schedule.linear()
    eps = torch.randn(data.shape, generator=torch.Generator().manual_seed(seed))
    C, out = data.shape[1], {}
    for t in ts:
        pred = net(schedule.add_noise(data, eps, t), torch.full((data.shape[0],), t))
        e1 = pred[:, :C]
        var, _ = central_moments(e1, pred[:, C:2 * C])
        out[t] = {"negative": float((var < 0).float().mean()), "mean_var": float(var.mean()),
                  "mc_var": float((eps - e1).pow(2).mean())}
    return out


def pixel_stats(x: torch.Tensor) -> dict[str, float]:
    """Brightness and contrast of a set of patches: pixel mean and sd, and the share of pixels with
    |x| > 0.95 (near the ends of [-1, 1])."""
    f = x.detach().double().flatten(1)
    return {"mean": float(f.mean()), "sd": float(f.std()), "saturated": float((f.abs() > 0.95).double().mean())}
