"""``gms-kernels oracle``: every solver on Gaussian-mixture data with exact heads, scored against fresh data.

With exact heads (:class:`gk.GaussianMixtureOracle`) the only error left is the solver's: the Gaussian (or
fitted-mixture) shape of each reverse step. The exact sampler, which has none, is the floor. The data are the
paper's Fig. 1 mixture in one dimension and eight Gaussians on a circle (GMS: https://arxiv.org/abs/2311.00941).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..core.devices import machine_note
from ..core.extras import require
from ..core.images import save_figure
from ..core.schedule import Schedule
from ..sampling import sample
from . import metrics
from .oracle import GaussianMixtureOracle

DEFAULT_STEPS = (2, 5, 10, 20, 50)
PLOT_STEPS = (5, 10, 20)
KDE_POINTS = 5000  # fresh points at which the KDE of the samples is evaluated (cost grows as n * points)

# (label, solver, options). The GMS rows fit and sample a mixture at every step, as the paper's sampling algorithm
# does; "gms-closed-gausslast" keeps the official code's Gaussian step into s = 0 (the library default).
_MIX = {"gaussian_last_step": False}
SOLVER_ROWS: tuple[tuple[str, str, dict], ...] = (
    ("exact", "exact", {}),
    ("ddpm", "ddpm", {}),
    ("ddpm-large", "ddpm-large", {}),
    ("sn-ddpm", "sn-ddpm", {}),
    ("gms-adan-25", "gms", {"fit": "adan", "fit_iters": 25, **_MIX}),
    ("gms-adan-70", "gms", {"fit": "adan", "fit_iters": 70, **_MIX}),
    ("gms-closed", "gms", {"fit": "closed", "select": "sample", **_MIX}),
    ("gms-closed-pixel", "gms", {"fit": "closed", "select": "pixel", **_MIX}),
    ("gms-closed-gausslast", "gms", {"fit": "closed"}),
    # SDE solvers: K steps cost K (seeds-1), 2K - 1 (seeds-2, edm-sde) or 3K - 2 (seeds-3) network calls; SEEDS
    # in its noise-prediction form and, "(data)", in its data-prediction form
    ("seeds-1", "seeds-1", {}),
    ("seeds-2", "seeds-2", {}),
    ("seeds-2 (data)", "seeds-2", {"prediction": "data"}),
    ("seeds-3", "seeds-3", {}),
    ("seeds-3 (data)", "seeds-3", {"prediction": "data"}),
    ("edm-sde", "edm-sde", {}),
)
# the rows the paired differences compare against: every solver that is neither GMS nor the exact sampler
BASELINES = ("ddpm", "ddpm-large", "sn-ddpm", "seeds-1", "seeds-2", "seeds-2 (data)", "seeds-3", "seeds-3 (data)",
             "edm-sde")
# Gotta Go Fast chooses its own steps: it runs at these (noise, eps_rel, eps_abs) and reports its calls;
# "brownian" is the solver's default (one Brownian path per sample), "redraw" a fresh noise per proposal
GGF_SETTINGS = (("brownian", 0.1, 0.0078), ("redraw", 0.1, 0.0078))


def paper_1d(schedule: Schedule) -> GaussianMixtureOracle:
    """The paper's Fig. 1 data: 0.4 N(-0.4, 0.12^2) + 0.6 N(0.3, 0.05^2)."""
    return GaussianMixtureOracle([0.4, 0.6], [[-0.4], [0.3]], [0.12, 0.05], schedule)


def eight_gaussians(schedule: Schedule, radius: float = 0.8, std: float = 0.05) -> GaussianMixtureOracle:
    """8 equally weighted Gaussians with centres on a circle."""
    angles = torch.arange(8, dtype=torch.float64) * (2 * math.pi / 8)
    means = radius * torch.stack([angles.cos(), angles.sin()], dim=1)
    return GaussianMixtureOracle(torch.full((8,), 1 / 8), means, torch.full((8,), std), schedule)


DATASETS: dict[str, tuple[str, Callable[[Schedule], GaussianMixtureOracle]]] = {
    "1d": ("(a) 1-D mixture 0.4 N(-0.4, 0.12^2) + 0.6 N(0.3, 0.05^2)", paper_1d),
    "8gauss": ("(b) 8 Gaussians on a circle of radius 0.8, std 0.05", eight_gaussians)}
METRICS = {"w1": "W1 (sliced in 2-D), lower is better",
           "kde": f"KDE log-likelihood of {KDE_POINTS} fresh data points under the samples (bandwidth 1.05 std L^-1/4), "
                  "higher is better",
           "energy": "energy distance (5,000-point subsets), lower is better"}


@dataclass
class OracleResult:
    n_samples: int
    steps: tuple[int, ...]
    seeds: tuple[int, ...] = (0,)
    # results[dataset][label][K] = {"w1":..., "kde":..., "energy":..., "seconds":...} (means over the seeds)
    # and "per_seed": {metric: [one value per seed]}
    results: dict = field(default_factory=dict)
    # ggf[dataset][(noise, eps_rel, eps_abs)] = {metrics (means)..., "nfe": mean, "nfe_max": max, "per_seed": ...}
    ggf: dict = field(default_factory=dict)
    samples: dict = field(default_factory=dict)  # (dataset, label, K) -> samples kept for the figure (first seed)


def mean_row(rows: Sequence[dict]) -> dict:
    """One row per seed -> their means, with the per-seed values kept under "per_seed"."""
    keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float))]
    out = {k: sum(float(r[k]) for r in rows) / len(rows) for k in keys}
    out["per_seed"] = {k: [float(r[k]) for r in rows] for k in keys}
    return out


def seed_summary(values: dict[str, Sequence[float]], baselines: Sequence[str], higher_is_better: bool = False,
                 level: float = 0.95) -> dict[str, dict]:
    """Per row (label -> one value per seed, the same seeds for every row): its mean and Student-t interval over
    the seeds (gk.metrics.seed_interval) and, against the best baseline (the best mean among ``baselines``
    present), the paired per-seed difference row - best and whether it is significant (gk.metrics.paired_difference:
    its interval excludes 0). With one seed only the mean is given."""
    present = [b for b in baselines if b in values]
    mean = {lab: sum(v) / len(v) for lab, v in values.items()}
    best = (max if higher_is_better else min)(present, key=mean.get) if present else None
    out = {}
    for lab, v in values.items():
        entry = {"mean": mean[lab], "interval": None, "diff": None, "significant": False, "best": best}
        if len(v) >= 2:
            entry["interval"] = metrics.seed_interval(v, level)
            if best is not None and lab != best:
                entry["diff"], entry["significant"] = metrics.paired_difference(v, values[best], level)
        out[lab] = entry
    return out


def interval_cell(entry: dict, digits: int = 4) -> str:
    """``mean ± half-width``, then ``[difference to the best baseline]`` with ``*`` when significant; the best
    baseline itself is marked ``(best baseline)``."""
    iv = entry["interval"]
    text = f"{entry['mean']:.{digits}f}" + ("" if iv is None else f" ± {iv.half_width:.{digits}f}")
    if entry["diff"] is not None:
        text += f" [{entry['diff'].mean:+.{digits}f}{'*' if entry['significant'] else ''}]"
    elif iv is not None and entry["best"] is not None:
        text += " (best baseline)"
    return text


def fresh_data(oracle: GaussianMixtureOracle, n: int, seed: int = 0) -> torch.Tensor:
    """The held-out data a run is scored against (a seed apart from the sampler's)."""
    return oracle.sample_data(n, torch.Generator().manual_seed(seed + 12345))


def score_samples(x: torch.Tensor, fresh: torch.Tensor, which: Sequence[str] = tuple(METRICS)) -> dict[str, float]:
    """The job's metrics of samples ``x`` against fresh data (the KDE at its first KDE_POINTS points)."""
    fns = {"w1": lambda: metrics.sliced_wasserstein1(x, fresh),
           "kde": lambda: metrics.kde_log_likelihood(x, fresh[:KDE_POINTS]),
           "energy": lambda: metrics.energy_distance(x, fresh)}
    return {m: fns[m]() for m in which}


def run_oracle_job(n_samples: int = 20000, steps: Sequence[int] = DEFAULT_STEPS,
                   datasets: Sequence[str] = tuple(DATASETS), seeds: Sequence[int] = (0,),
                   ggf_settings: Sequence[tuple[str, float, float]] = GGF_SETTINGS,
                   log: Callable[[str], None] | None = print) -> OracleResult:
    """Every row of :data:`SOLVER_ROWS` at every K and GGF at every ``ggf_settings`` entry, once per seed: the
    sampler's seed, and fresh data drawn with a seed derived from it. ``log`` gets a line per run (None: silent)."""
    seeds = tuple(seeds)
    schedule = Schedule.linear(1000)
    out = OracleResult(n_samples, tuple(steps), seeds)
    for name in datasets:
        oracle = DATASETS[name][1](schedule)
        shape = (n_samples, *oracle.data_shape)
        runs: dict = {}  # (label, K) or ("ggf", entry) -> one row per seed
        for sd in seeds:
            fresh = fresh_data(oracle, n_samples, sd)
            for label, solver, options in SOLVER_ROWS:
                for K in steps:
                    t0 = time.perf_counter()
                    x = sample(oracle, shape=shape, steps=K, solver=solver, generator=sd, progress=False,
                               data_range=None, dtype=torch.float64, backend="torch", **options)
                    seconds = time.perf_counter() - t0
                    row = {**score_samples(x, fresh), "seconds": seconds}
                    runs.setdefault((label, K), []).append(row)
                    if name == "1d" and K in PLOT_STEPS and sd == seeds[0]:
                        out.samples[(name, label, K)] = x.flatten()
                    if log:
                        log(f"  {name:6s} seed {sd} {label:20s} K={K:3d}  W1={row['w1']:.4f}  KDE={row['kde']:.4f}  "
                            f"energy={row['energy']:.5f}  ({seconds:.1f}s)")
            for entry in ggf_settings:
                noise, tol, tol_abs = entry
                seen: list[dict] = []
                t0 = time.perf_counter()
                x = sample(oracle, shape=shape, steps=1, solver="ggf", generator=sd, progress=False, data_range=None,
                           dtype=torch.float64, callback=seen.append, eps_rel=tol, eps_abs=tol_abs, noise=noise)
                nfe = seen[-1]["nfe"].double()
                row = {**score_samples(x, fresh), "nfe": float(nfe.mean()), "nfe_max": float(nfe.max()),
                       "seconds": time.perf_counter() - t0}
                runs.setdefault(("ggf", entry), []).append(row)
                if log:
                    log(f"  {name:6s} seed {sd} ggf {noise} eps_rel={tol:<5g} eps_abs={tol_abs:<6g} "
                        f"W1={row['w1']:.4f}  NFE={row['nfe']:.1f}  ({row['seconds']:.1f}s)")
        out.results[name] = {label: {K: mean_row(runs[(label, K)]) for K in steps} for label, _, _ in SOLVER_ROWS}
        out.ggf[name] = {entry: mean_row(runs[("ggf", entry)]) for entry in ggf_settings}
    return out


def ggf_table(res: OracleResult) -> list[str]:
    """GGF's W1 and calls per (noise, tolerance), next to the exact sampler's W1 at every K."""
    entries = list(next(iter(res.ggf.values())))
    lines = ["### Gotta Go Fast (adaptive steps)\n",
             "W1 as in the tables below (mean ± 95% interval over the seeds); NFE = network calls per sample "
             "(mean over samples and seeds; max), the final denoising call included. `brownian`: one fixed "
             "Brownian path per sample (the solver's default); `redraw`: a fresh noise for every proposal, whose "
             "rejections select small increments. The exact sampler's W1 over K is the floor at this sample size.\n",
             "| data | noise | eps_rel | eps_abs | W1 | NFE mean / max |", "|---|---|---|---|---|---|"]
    for name, rows in res.ggf.items():
        tag = DATASETS[name][0].split(" ")[0]
        for noise, tol, tol_abs in entries:
            r = rows[(noise, tol, tol_abs)]
            cell = interval_cell(seed_summary({"x": r["per_seed"]["w1"]}, ())["x"])
            lines.append(f"| {tag} | {noise} | {tol:g} | {tol_abs:g} | {cell} | {r['nfe']:.0f} / {r['nfe_max']:.0f} |")
        exact = res.results[name]["exact"]
        lines.append(f"| {tag} | exact sampler | | | " + ", ".join(
            f"K={K}: {exact[K]['w1']:.4f}" for K in res.steps) + " | |")
    return lines + [""]


def _best(table: dict, metric: str, K: int) -> str:
    """The best non-exact solver at K (bold in the tables)."""
    rows = {label: r[K][metric] for label, r in table.items() if label != "exact"}
    return (max if metric == "kde" else min)(rows, key=rows.get)


def markdown_tables(res: OracleResult) -> str:
    """Per data set and metric: every row at every K as mean ± 95% interval over the seeds, with the paired
    difference to the best baseline at that K (* = significant); the best mean of the non-exact rows in bold."""
    lines = []
    for name, table in res.results.items():
        lines.append(f"### {DATASETS[name][0]}\n")
        for metric, desc in METRICS.items():
            lines.append(f"**{desc}**\n")
            lines.append("| solver | " + " | ".join(f"K={K}" for K in res.steps) + " |")
            lines.append("|---|" + "---|" * len(res.steps))
            summary = {K: seed_summary({lab: r[K]["per_seed"][metric] for lab, r in table.items()}, BASELINES,
                                       higher_is_better=metric == "kde") for K in res.steps}
            digits = 5 if metric == "energy" else 4
            best = {K: _best(table, metric, K) for K in res.steps}
            for label in table:
                cells = [interval_cell(summary[K][label], digits) for K in res.steps]
                cells = [f"**{c}**" if label == best[K] else c for c, K in zip(cells, res.steps)]
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def rankings(res: OracleResult) -> list[str]:
    """Per data set and K, the non-exact rows in order of W1."""
    out = []
    for name, table in res.results.items():
        tag = DATASETS[name][0].split(" ")[0]
        for K in res.steps:
            w1 = {lab: r[K]["w1"] for lab, r in table.items() if lab != "exact"}
            out.append(f"{tag} K={K}: W1 ranks " + " < ".join(f"{lab} {w1[lab]:.4f}" for lab in sorted(w1, key=w1.get))
                       + ".")
    return out


def header(res: OracleResult, command: str) -> list[str]:
    """The report's title, command, machine and protocol."""
    seeds = res.seeds
    stats = (f"Every cell is the mean over {len(seeds)} seeds ({', '.join(map(str, seeds))}; each seeds the sampler "
             f"and the fresh data) ± the half-width of its 95% Student-t interval (`gk.metrics.seed_interval`), "
             f"{res.n_samples} samples per seed. In brackets: the paired per-seed difference to the best baseline at "
             f"that K (the best mean among {', '.join(BASELINES)}; `gk.metrics.paired_difference`), `*` where its "
             "95% interval excludes 0." if len(seeds) > 1 else
             f"One seed ({seeds[0]}), {res.n_samples} samples: no intervals.")
    return [
        "# Solvers with exact heads on Gaussian-mixture data\n",
        f"Command: `{command}`\n",
        f"Machine: {machine_note()}.\n",
        f"Linear schedule (T=1000), even trajectory, `data_range=None` (no clamps), fp64. {stats} Metrics against "
        "fresh data drawn with another seed. Heads are exact (`gk.GaussianMixtureOracle`), so every difference is "
        "the solver's. Every solver ends with the denoised mean at t=0, as in the official code. The GMS rows fit "
        "and sample a mixture at every step, as the paper's sampling algorithm does (`gaussian_last_step=False`); "
        "`gms-closed` = fit closed, select sample; `gms-closed-pixel` = fit closed, select pixel; `gms-adan-25/70` "
        "= fit adan with 25/70 iterations, select sample; `gms-closed-gausslast` = fit closed with the official "
        "Gaussian step into s=0. Best non-exact mean per column in bold. SDE solvers: `seeds-1` (one call per "
        "step), `seeds-2` and `edm-sde` (two calls per step), `seeds-3` (three calls per step), SEEDS in its noise- "
        "and, `(data)`, its data-prediction form: K steps cost K, 2K-1 and 3K-2 calls (the step into data is one "
        "call), so compare them with the one-call rows at two or three times their K; GGF has its own table.\n",
    ]


def report(res: OracleResult, command: str) -> str:
    """The Markdown report: protocol, W1 rankings, GGF's table and every metric's table."""
    return "\n".join([*header(res, command), "## W1 rankings\n", *[f"- {line}" for line in rankings(res)], "",
                      *(ggf_table(res) if res.ggf else []), markdown_tables(res)])


def density_panel(ax, x: torch.Tensor | None, grid: torch.Tensor, density: torch.Tensor, bins: int = 120,
                  color: str = "tab:blue") -> None:
    """A histogram of 1-D samples on [-1, 1] (clamped) under the true density curve."""
    if x is not None:
        ax.hist(x.flatten().clamp(-1, 1).numpy(), bins=bins, range=(-1, 1), density=True, color=color, alpha=0.6)
    ax.plot(grid.numpy(), density.numpy(), color="black", lw=1)
    ax.set_yticks([])


def plot_fig1(res: OracleResult, path: str | Path, schedule: Schedule | None = None) -> Path:
    """The paper's Fig. 1 in kind: histograms of the 1-D samples against the true density, a panel per solver
    and K."""
    matplotlib = require("matplotlib", "the oracle job's figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    oracle = paper_1d(schedule or Schedule.linear(1000))
    labels = [lab for lab, _, _ in SOLVER_ROWS]
    ks = [K for K in PLOT_STEPS if any(key[2] == K for key in res.samples)]
    fig, axes = plt.subplots(len(ks), len(labels), figsize=(2.2 * len(labels), 2.0 * len(ks)),
                             sharex=True, squeeze=False)
    grid = torch.linspace(-1.0, 1.0, 400, dtype=torch.float64)
    density = oracle.log_prob(grid[:, None]).exp()
    for i, K in enumerate(ks):
        for j, lab in enumerate(labels):
            ax = axes[i][j]
            density_panel(ax, res.samples.get(("1d", lab, K)), grid, density)
            if i == 0:
                ax.set_title(lab, fontsize=8)
            if j == 0:
                ax.set_ylabel(f"K={K}")
    fig.suptitle("Samples (histogram) vs the true density of q(x0) = 0.4 N(-0.4, 0.12^2) + 0.6 N(0.3, 0.05^2)",
                 fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)
