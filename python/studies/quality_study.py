"""What makes GMS win, on two real testbeds, chosen on a validation split and reported on a test split.

Testbeds (:func:`testbed`):
- ``digits``: the embedded digits model (trained on ``gk.data.digits("train")``), FD-digits against the
  validation and the test split;
- ``digits-oracle`` / ``patches-oracle``: exact heads instead of a network, for the train digits (or
  ORACLE_PATCHES seeded train patches) each blurred by N(0, ORACLE_BLUR^2) (:class:`gk.GaussianMixtureOracle`
  with one component per image), scored against those images: every solver's error with no head error;
- ``patches``: the embedded 8x8 natural-image patches model (trained on the train photos), FD-|DCT| and
  sliced W1 against the validation photos, the test photos, and held-out positions of the train photos.

Rows (:func:`row_options`) are labelled option sets: the baselines, the variance controls (SN-DDPM with its
variance times c, DDPM with its variance interpolated towards beta_{t|s}) and GMS variants. One draw per
(row, K, seed) is scored against every reference, so choosing on validation and reporting on test cost one
sampling run. Every cell is cached (digits_study.ResultCache) under a key that names the model's tag (its file's
hash), so a retrained model never reads another model's numbers.
"""
from __future__ import annotations

import functools
import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from gms_kernels.eval.metrics import fd_digits, frechet_distance_dct, paired_difference, seed_interval, sliced_wasserstein1
from gms_kernels.core.moments import central_moments, central_third_moment, transition_moments
from gms_kernels.sampling import sample
from gms_kernels.core.schedule import Schedule
from gms_kernels.solvers import Solver, get_solver
from .controls import CONTROLS
from .digits_study import ResultCache

STEPS = (5, 10, 20)
# the std of the blur around each image of the oracle testbeds (digit pixels are 17 levels 0.125 apart)
ORACLE_BLUR = 0.05
ORACLE_PATCHES = 5000  # train patches in the patches-oracle testbed (a seeded subset of the 49,000)
# the baselines: every Gaussian row (the variance-scaled controls included) and the SDE solvers
BASELINE_PREFIXES = ("ddpm", "sn-ddpm", "ddim", "edm-sde", "seeds-1", "seeds-2", "seeds-3")


@dataclass(frozen=True)
class Testbed:
    name: str
    model: Callable[[], torch.nn.Module]
    tag: str  # names the model in cache keys: its file's hash
    shape: tuple[int, ...]
    references: Callable[[], dict[str, torch.Tensor]]
    metrics: dict[str, Callable[[torch.Tensor, torch.Tensor], float]]
    primary: str  # the metric settings are chosen by (lower is better)


def _digits_refs() -> dict[str, torch.Tensor]:
    from gms_kernels.core.data import digits

    return {"validation": digits("validation")[0], "test": digits("test")[0]}


def _patches_refs() -> dict[str, torch.Tensor]:
    from gms_kernels.core.data import patch_photos, patches

    # held-out positions of the train photos: the distribution the model learned (the photo splits differ)
    return {"validation": patches("validation"), "test": patches("test"),
            "train-photos": patches("train", per_photo=-(-10000 // len(patch_photos("train"))), seed=1000)}


def testbed(name: str, model_file: str | Path | None = None) -> Testbed:
    """The ``digits`` or ``patches`` testbed with its shipped model, or the same architecture's weights in
    ``model_file`` (an embedded-format file: e.g. the same backbone with other heads); ``digits-oracle`` and
    ``patches-oracle``: their data with exact heads."""
    from gms_kernels.models import embedded as e

    if name == "digits":
        path = Path(model_file or e.DIGITS_MODEL)
        return Testbed("digits", lambda: e.default_model(path), e.file_tag(path), e.DIGITS_SHAPE, _digits_refs,
                       {"fd": fd_digits}, "fd")
    if name in ("digits-oracle", "patches-oracle"):
        if model_file is not None:
            raise ValueError(f"the {name} testbed has exact heads, not a model file")
        images = _oracle_images(name)
        tag = f"blur{ORACLE_BLUR}-" + hashlib.sha256(images.numpy().tobytes()).hexdigest()[:12]
        base = testbed(name.removesuffix("-oracle"))  # (its shape, metrics and primary metric)
        return Testbed(name, lambda: data_oracle(images), tag, base.shape, lambda: {"train": images.float()},
                       base.metrics, base.primary)
    if name == "patches":
        path = Path(model_file or e.PATCHES_MODEL)
        return Testbed("patches", lambda: e.patches_model(path), e.file_tag(path), e.PATCHES_SHAPE, _patches_refs,
                       {"fd_dct": frechet_distance_dct,
                        "swd": lambda x, y: sliced_wasserstein1(x, y, n_projections=256)}, "fd_dct")
    raise ValueError(f"unknown testbed {name!r}; valid: digits, digits-oracle, patches, patches-oracle")


def _oracle_images(name: str) -> torch.Tensor:
    from gms_kernels.core.data import digits, patches

    if name == "digits-oracle":
        return digits("train")[0].double()
    train = patches("train")
    pick = torch.randperm(train.shape[0], generator=torch.Generator().manual_seed(0))[:ORACLE_PATCHES]
    return train[pick.sort().values].double()


def data_oracle(images: torch.Tensor) -> torch.nn.Module:
    """Exact heads for ``images`` [N, *shape], each blurred by N(0, ORACLE_BLUR^2), equally weighted."""
    from gms_kernels.eval.oracle import GaussianMixtureOracle

    n = images.shape[0]
    return GaussianMixtureOracle(torch.ones(n, dtype=torch.float64), images.double(),
                                 torch.full((n,), ORACLE_BLUR, dtype=torch.float64))


# -- rows ------------------------------------------------------------------------------------------------------
_ROW = re.compile(r"^(?P<base>[a-z0-9-]+(?: [a-z0-9/-]+)?)(?P<mods>(?: [a-z_]+=[^ ]+)*)$")
# short names of the GMS variants: fit and component selection
GMS_BASES = {
    "gms closed/pixel": {"fit": "closed", "select": "pixel"},
    "gms closed/sample": {"fit": "closed", "select": "sample"},
    "gms adan/pixel": {"fit": "adan", "select": "pixel"},
    "gms adan/sample": {"fit": "adan", "select": "sample"},
}
MODIFIERS = {"c": "variance_scale", "v": "variance_interp", "iters": "fit_iters", "tau": "skew_threshold",
             "floor": "var_floor", "glast": "gaussian_last_step", "eta": "eta", "preset": "preset",
             "pred": "prediction", "lr": "lr", "skew": "skew_scale", "levels": "pixel_levels"}
STRING_MODIFIERS = ("preset", "pred")
# modifiers whose value is a number or a name: lr (ADAN's constant rate or one of the paper's tables) and skew
# (GMS's skew_scale: a constant, or a per-step table measured for the testbed's model, :func:`skew_shrinkage`)
NUMBER_OR_NAME_MODIFIERS = ("lr", "skew")
# the skew tables a row can name: the Wiener factor lambda(t) = E[k3_exact k3_head] / E[k3_head^2] on x_t of the
# train images ("lam") or of the validation images ("lamval"), the exact heads being those of the train images;
# "cal": gk.calibrate_heads' slope of the realised r^3 on the fitted skew, on held-out data
# (studies.protocol.calibrated_skew_tables)
SKEW_TABLES = ("lam", "lamval", "cal")


def row_options(label: str) -> tuple[str | Solver, dict]:
    """(solver, options) of a row label: a solver name (a library solver's, or a study control's from
    :data:`studies.controls.CONTROLS`, returned as its Solver object) or a GMS base (:data:`GMS_BASES`), then ``key=value``
    modifiers (:data:`MODIFIERS`), e.g. ``"sn-ddpm c=0.5"``, ``"ddpm v=0.25"``, ``"gms adan/pixel iters=70 c=0.8"``,
    ``"gms closed/pixel glast=0"``, ``"sn-ddpm levels=17"`` (``pixel_levels``: an integer, or ``none`` for no
    cap on the last step's variance), ``"gms preset=official"``, ``"gms adan/pixel lr=paper"`` (``lr``: a number
    or a name of ``gk.fit.PAPER_LR_TABLES``), ``"gms closed/sample skew=lam"`` (``skew``: skew_scale, a number or
    a name of :data:`SKEW_TABLES`, which :func:`measure` reads from the testbed's table file);
    ``"gms"`` alone is the model's defaults (its ``solver_defaults``, else the library's)."""
    m = _ROW.match(label)
    if m is None:
        raise ValueError(f"cannot read row label {label!r}")
    base = m["base"]
    solver, options = ("gms", dict(GMS_BASES[base])) if base in GMS_BASES else (CONTROLS.get(base, base), {})
    for mod in m["mods"].split():
        key, value = mod.split("=", 1)
        if key not in MODIFIERS:
            raise ValueError(f"unknown modifier {key!r} in {label!r}; valid: {', '.join(MODIFIERS)}")
        if key in NUMBER_OR_NAME_MODIFIERS:
            options[MODIFIERS[key]] = _number_or_name(key, value, label)
            continue
        options[MODIFIERS[key]] = (bool(int(value)) if key == "glast" else int(value) if key == "iters"
                                   else (None if value == "none" else int(value)) if key == "levels"
                                   else value if key in STRING_MODIFIERS else float(value))
    return solver, options


def _number_or_name(key: str, value: str, label: str) -> float | str:
    """A modifier's value as a float, else as one of the names it accepts (refused otherwise, before sampling)."""
    try:
        return float(value)
    except ValueError:
        pass
    from gms_kernels.core.fit import PAPER_LR_TABLES

    names = {"lr": PAPER_LR_TABLES, "skew": SKEW_TABLES}[key]
    if value not in names:
        raise ValueError(f"{key}={value!r} in {label!r} is neither a number nor one of {', '.join(names)}")
    return value


def is_baseline(label: str) -> bool:
    """A baseline row (ddpm, sn-ddpm, ddim, their variance controls, the SDE solvers), aliased (``NAME: row``,
    another model's weights) or not."""
    return label.split(": ")[-1].split()[0] in BASELINE_PREFIXES


def is_main_baseline(label: str) -> bool:
    """A baseline row of the report's own model (not aliased): the rows a report's per-K best baseline is chosen
    from, so that rows of other weights are compared against that model's best, not against each other's."""
    return ": " not in label and is_baseline(label)


def is_variance_scaled(label: str) -> bool:
    """A baseline with a variance scale or interpolation (``c=`` / ``v=``), aliased (``NAME: row``) or not: the
    rows the acceptance's "best variance-scaled Gaussian" is chosen from."""
    row = label.split(": ")[-1]
    return is_baseline(row) and (" c=" in row or " v=" in row)


# -- measuring -------------------------------------------------------------------------------------------------
def draw(model, shape: Sequence[int], label: str, steps: int, n: int, seed: int, batch: int = 1000,
         skew_tables: dict | None = None, solver: Solver | None = None, **extra) -> torch.Tensor:
    """``n`` samples of a row in column K = ``steps``: K steps (K + 1 network calls); a solver with several calls
    per step (edm-sde, seeds-2, seeds-3) runs the most steps whose calls fit in those K + 1 (equal network calls).
    A row with a named skew table (``skew=lam``) takes its factors for K from ``skew_tables[name][K]`` ({t: factor}).
    ``solver`` runs a variant of the row's solver (a study control, :mod:`studies.controls`; its own options in
    ``extra``) with the row's options."""
    row_solver, options = row_options(label)
    solver = solver or row_solver
    if isinstance(options.get("skew_scale"), str):
        name = options["skew_scale"]
        if not skew_tables or name not in skew_tables or steps not in skew_tables[name]:
            raise ValueError(f"row {label!r} needs the skew table {name!r} for K={steps} (python "
                             "python/quality_benchmark.py shrinkage --testbed ... writes it)")
        options["skew_scale"] = dict(skew_tables[name][steps])
    if get_solver(solver).calls_per_step != 1:
        from .sde_baselines_study import steps_for_budget

        steps = steps_for_budget(solver, steps + 1)[0]
    return torch.cat([sample(model, shape=(min(batch, n - i), *shape), steps=steps, solver=solver, generator=seed,
                             first_index=i, progress=False, **options, **extra) for i in range(0, n, batch)])


def measure(bed: Testbed, labels: Sequence[str], steps: Sequence[int] = STEPS, seeds: Sequence[int] = range(5),
            n_samples: int = 1000, cache: ResultCache | None = None, log=print,
            draw_row: Callable[..., torch.Tensor] | None = None) -> dict[tuple[str, int, int], dict]:
    """{(label, K, seed): {"<reference>/<metric>": value, ..., "seconds": sampling time}}. ``draw_row(model, shape,
    label, K, n, seed)`` draws rows of an experiment's own kind instead of :func:`draw` (it reads its tables and
    checks its labels itself: python/quality_benchmark.py's exvar= rows)."""
    cache = cache or ResultCache(None)
    model, refs, tag = bed.model(), bed.references(), bed.tag
    out = {}
    if draw_row is None:
        tables = None
        for label in labels:
            if isinstance(row_options(label)[1].get("skew_scale"), str):  # (a bad label is refused before sampling)
                tables = tables or load_skew_tables(bed)
        draw_row = functools.partial(draw, skew_tables=tables)
    for k in steps:
        for label in labels:
            for seed in seeds:
                def run(label=label, k=k, seed=seed):
                    t0 = time.perf_counter()
                    x = draw_row(model, bed.shape, label, k, n_samples, seed)
                    seconds = time.perf_counter() - t0
                    scores = {f"{r}/{m}": fn(x, ref) for r, ref in refs.items() for m, fn in bed.metrics.items()}
                    return {**scores, "seconds": seconds}
                key = f"{bed.name}|{tag}|{label}|{k}|{seed}|{n_samples}"
                out[(label, k, seed)] = r = cache.get_or_compute(key, run)
                if log:
                    log(f"{bed.name} {label:34s} K={k:3d} seed {seed}: "
                        + " ".join(f"{name} {v:.4f}" for name, v in r.items() if name != "seconds")
                        + f" ({r['seconds']:.0f} s)")
    return out


def summarise(results: dict[tuple[str, int, int], dict], metric: str, labels: Sequence[str], steps: Sequence[int],
              seeds: Sequence[int], baseline: Callable[[str], bool] = is_baseline) -> dict[tuple[str, int], dict]:
    """Per (label, K): the seed interval of ``metric`` (gk.metrics.seed_interval) and the paired per-seed
    difference to the best baseline at that K (the lowest mean among the rows ``baseline`` accepts), with its
    significance (gk.metrics.paired_difference, 95%); the best baseline's own row has no difference."""
    out = {}
    for k in steps:
        values = {label: [results[(label, k, s)][metric] for s in seeds] for label in labels}
        intervals = {label: seed_interval(v) for label, v in values.items()}
        baselines = [label for label in labels if baseline(label)]
        best = min(baselines, key=lambda lb: intervals[lb].mean) if baselines else None
        for label in labels:
            row = {"interval": intervals[label], "best_baseline": best, "significant": False}
            if best is not None and label != best:
                row["diff"], row["significant"] = paired_difference(values[label], values[best])
            out[(label, k)] = row
    return out


# -- diagnostics -----------------------------------------------------------------------------------------------
@torch.no_grad()
def fit_diagnostics(model, shape: Sequence[int], label: str, steps: int, n: int = 500, seed: int = 0,
                    schedule: Schedule | None = None) -> list[dict]:
    """Per step of one GMS row, from the fitted mixtures (float64 torch reference): the mean of |mu1 - mu2| / sd
    and of s2 / Var (sd^2 = Var, the transition's variance), the share of elements whose s2 sits at the closed
    fit's floor (s2 = var_floor Var) or at ADAN's beta bounds (s2 / Var = 0.1 or 1.2), the share the threshold
    sent to a Gaussian, and the mean |standardized skewness| |kappa3| / Var^1.5 of the moments."""
    from gms_kernels.core.fit import ADAN_BETA_BOUNDS
    from gms_kernels.core.moments import central_third_moment

    solver, options = row_options(label)
    if solver != "gms":
        raise ValueError(f"fit diagnostics need a GMS row, got {label!r}")
    floor = options.get("var_floor", 0.1)
    rows: list[dict] = []

    def record(info: dict) -> None:
        if "mu1" not in info or "var" not in info:
            return  # the Gaussian last step, the denoising step
        var = info["var"].clamp_min(1e-30)
        ratio = info["s2"] / var
        row = {"t": info["t"], "s": info["s"], "gap_sd": float(((info["mu1"] - info["mu2"]).abs() / var.sqrt()).mean()),
               "s2_var": float(ratio.mean()),
               "at_floor": float((ratio <= floor * (1 + 1e-9)).double().mean()) if options.get("fit") == "closed"
               else float(((ratio <= ADAN_BETA_BOUNDS[0] * (1 + 1e-9)) | (ratio >= ADAN_BETA_BOUNDS[1] * (1 - 1e-9)))
                          .double().mean()),
               "skew": float((central_third_moment(info["m1"], info["var"].clamp_min(0.0), info["m3"]).abs()
                              / var**1.5).mean()),
               "gaussian": float(info["gaussian"].double().mean()) if "gaussian" in info else 0.0}
        rows.append(row)

    sample(model, shape=(n, *shape), steps=steps, solver=solver, generator=seed, progress=False, callback=record,
           backend="torch", schedule=schedule, **options)
    return rows


@torch.no_grad()
def head_diagnostics(net, data: torch.Tensor, ts: Sequence[int], seed: int = 0,
                     schedule: Schedule | None = None) -> dict[int, dict]:
    """The heads against Monte-Carlo moments of the noise, per t, on x_t ~ q(x_t | x_0) of held-out ``data``
    (one noise draw eps per image). With r = eps - e1, averages over elements:

    - ``var_head`` = mean of e2 - e1^2 (the heads' Var[eps | x_t]) against ``var_mc`` = mean of r^2, which equals
      the true mean Var[eps | x_t] plus e1's own squared error (so ``var_mc`` >= the truth);
    - ``kappa3_head`` = mean of e3 - 3 e1 e2 + 2 e1^3 (the heads' central third moment) against ``kappa3_mc`` =
      mean of r^3 (the true mean kappa3 when e1 is exact); and ``abs_kappa3_head``, the mean of its size;
    - ``negative``: the share of elements with e2 - e1^2 < 0 (the solvers clamp Var[x0 | x_t] to 0 there).
    Per-element moments of the true posterior cannot be computed for real data; these aggregate checks can.
    """
    schedule = schedule or Schedule.linear()
    eps = torch.randn(data.shape, generator=torch.Generator().manual_seed(seed), dtype=data.dtype)
    C, out = data.shape[1], {}
    for t in ts:
        pred = net(schedule.add_noise(data, eps, t), torch.full((data.shape[0],), t)).double()
        e1 = pred[:, :C]
        r = eps.double() - e1
        var, kappa3 = central_moments(e1, pred[:, C:2 * C], pred[:, 2 * C:3 * C])
        out[t] = {"var_head": float(var.mean()), "var_mc": float(r.pow(2).mean()),
                  "kappa3_head": float(kappa3.mean()), "kappa3_mc": float(r.pow(3).mean()),
                  "abs_kappa3_head": float(kappa3.abs().mean()), "negative": float((var < 0).double().mean())}
    return out


# -- the heads' noise in the skew: a per-step shrinkage factor (a fit that accounts for the heads' noise)
def skew_table_path(bed: Testbed) -> Path:
    return Path("gms_out") / f"skew-tables-{bed.name}-{bed.tag}.json"


def load_skew_tables(bed: Testbed) -> dict[str, dict[int, dict[int, float]]]:
    """{name: {K: {t: factor}}} from :func:`skew_table_path` (written by :func:`skew_shrinkage`'s caller)."""
    import json

    path = skew_table_path(bed)
    if not path.exists():
        raise ValueError(f"no skew tables for {bed.name} ({path}); make them with python "
                         f"python/quality_benchmark.py shrinkage --testbed {bed.name}")
    raw = json.loads(path.read_text())["tables"]
    return {name: {int(k): {int(t): float(v) for t, v in steps.items()} for k, steps in per_k.items()}
            for name, per_k in raw.items()}


def _transition_stats(x_t, heads, k, data_range):
    """(kappa3 as the fits take it, Var - lam2 = c2^2 Var[x0|x_t]) of the step ``k``, in float64."""
    e1, e2, e3 = heads
    mom = transition_moments(x_t, e1, e2, e3, k, data_range)
    return central_third_moment(mom.m1, mom.var.clamp_min(0.0), mom.m3), mom.var - k.lam2


@torch.no_grad()
def skew_shrinkage(net, exact, data: torch.Tensor, steps: Sequence[int] = STEPS, seed: int = 0, batch: int = 250,
                   schedule: Schedule | None = None, data_range=(-1.0, 1.0)) -> dict[int, list[dict]]:
    """Per K and per step t -> s of the sampler's trajectory (``gk.schedule.trajectory``, "even"): how much of the
    heads' skew is signal. x_t = a_t x0 + sigma_t eps for every image x0 of ``data`` (one eps each, from ``seed``);
    both the network ``net`` and the exact heads ``exact`` (e.g. :func:`data_oracle` of the train images) are
    turned into the step's transition moments (the clamps included), and over all elements

    - ``lam`` = E[k3_exact k3_head] / E[k3_head^2]: the least-squares factor on the heads' kappa3 (the fits'
      central third moment) that best predicts the exact one (the Wiener-optimal scalar shrinkage at that t);
    - ``corr``: their correlation; ``rms_head`` / ``rms_exact``: the RMS of each kappa3;
    - ``lam_var``, ``corr_var``: the same for the excess variance Var - lam2 = c2^2 Var[x0|x_t].
    The heads depend on t only, so each t's heads are computed once and shared by every K that visits it."""
    from gms_kernels.core.schedule import DATA, trajectory

    schedule = schedule or Schedule.linear()
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn(data.shape, generator=gen, dtype=torch.float64)
    data = data.double()
    C = data.shape[1]
    pairs = {k: [(t, ts[i + 1] if i + 1 < len(ts) else DATA) for i, t in enumerate(ts)]
             for k in steps for ts in [trajectory(schedule, k)]}
    heads: dict[int, tuple] = {}

    def heads_at(t):
        if t not in heads:
            x_t = schedule.add_noise(data, eps, t)
            tt = torch.full((x_t.shape[0],), t)
            learned = torch.cat([net(x_t[i:i + batch].float(), tt[i:i + batch]).double()
                                 for i in range(0, len(x_t), batch)])
            true = torch.cat([exact(x_t[i:i + batch], t).double() for i in range(0, len(x_t), batch)])
            heads[t] = (x_t, [learned[:, j * C:(j + 1) * C] for j in range(3)],
                        [true[:, j * C:(j + 1) * C] for j in range(3)])
        return heads[t]

    out = {}
    for K, steps_k in pairs.items():
        rows = []
        for t, s in steps_k:
            if s == DATA:
                continue  # the denoising step: no transition to fit
            x_t, learned, true = heads_at(t)
            k = schedule.coefficients(t, s)
            k3_l, v_l = _transition_stats(x_t, learned, k, data_range)
            k3_e, v_e = _transition_stats(x_t, true, k, data_range)
            rows.append({"t": t, "s": s, **_regression(k3_e, k3_l), **{f"{n}_var": v for n, v in
                                                                        _regression(v_e, v_l).items()}})
        out[K] = rows
    return out


def _regression(exact: torch.Tensor, head: torch.Tensor) -> dict[str, float]:
    """Least squares through 0 of ``exact`` on ``head`` over all elements, with the correlation and both RMS."""
    e, h = exact.flatten(), head.flatten()
    hh = float((h * h).mean())
    lam = float((e * h).mean()) / hh if hh > 0 else 0.0
    corr = float(torch.corrcoef(torch.stack([e, h]))[0, 1]) if hh > 0 and float(e.std()) > 0 else 0.0
    return {"lam": lam, "corr": corr, "rms_head": hh**0.5, "rms_exact": float((e * e).mean()) ** 0.5}
