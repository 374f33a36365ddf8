"""Baselines, variance controls and GMS variants on the digits and patches testbeds, chosen on
validation and reported on test (studies.quality_study).

    # measure cells (cached in gms_out/quality-<testbed>-<run>.json; runs resume; parallel runs take their own --run):
    nice -n 5 python python/quality_benchmark.py measure --testbed digits --labels ddpm "sn-ddpm c=0.5" --seeds 5
    # per-step diagnostics of GMS rows and of the heads:
    python python/quality_benchmark.py diagnose --testbed patches --labels "gms closed/pixel" --steps 10
    # the tables from the cache (no sampling): mean and 95% interval over seeds, significance vs the best baseline
    python python/quality_benchmark.py report --testbed digits --labels ... --out FILE
    # the defaults' choice: mean rank of the candidates on validation over both testbeds and K = 5, 10, 20
    python python/quality_benchmark.py choose --labels "gms closed/pixel" ... --alias-digits central=FILE ...
    # paired per-seed differences of rows against other rows (and the best variance-scaled Gaussian), per K:
    python python/quality_benchmark.py paired --testbed digits --seeds 3 --splits validation --labels ... --versus ...
    # the heads' skew against exact heads of the train data, per step: writes the skew tables rows 'skew=lam' read
    python python/quality_benchmark.py shrinkage --testbed patches --samples 2000
    # rows with the heads' excess variance shrunk (modifier exvar=, this file's ExcessVarianceShrink):
    nice -n 5 python python/quality_benchmark.py measure --testbed digits --seeds 3 --run exvar \
        --labels "sn-ddpm exvar=lam" "gms closed/sample exvar=0.5"
    # how far two models' kappa3 agree, or the exact kappa3 against the mean heads of several (no table written):
    python python/quality_benchmark.py shrinkage --testbed digits --samples 1079 --against OTHER.pt
    python python/quality_benchmark.py shrinkage --testbed digits --samples 1079 --heads-mean SEED1.pt SEED2.pt
    # the heads' c2 / k3 against the exact ones shifted by the backbone's mean error:
    python python/quality_benchmark.py mean-error --testbed digits --samples 1079 --times 50 200 600 950

``--model FILE`` runs the testbed's architecture with other weights (an embedded-format file); the cache keys
name the weights' hash, so every model keeps its own cells.
"""
from __future__ import annotations

import argparse
import functools
import json
import re
import shlex
import sys
from pathlib import Path

import torch

from gms_kernels.core.devices import cpu_description
from studies import quality_study as study
from studies.controls import EXVAR_SOLVERS, exvar_factor_at, shrink_excess_variance
from studies.digits_study import ResultCache
from gms_kernels.eval.metrics import paired_difference, seed_interval
from gms_kernels.model_io import time_indices
from gms_kernels.models.moment_net import raw_from_central
from gms_kernels.core.moments import central_moments, central_third_moment, transition_moments
from gms_kernels.core.schedule import schedule_for
from gms_kernels.eval.tuning import mean_ranks


# -- a shrinkage of the heads' excess variance -----------------------------------------------------------
# Two row modifiers, read here (not by quality_study.row_options), the rest of the label being an ordinary row;
# each takes a number in [0, 100] or a table name ("lam" / "lamval": the regression factor lambda_var(t) of the
# exact excess variance Var - lam2 on the heads', that ``shrinkage`` stores per K, :func:`exvar_tables`):
# - ``exvar=f``: each step's transition moments, as the sampler forms them (clamps included), become
#   (M1, lam2 + f (Var - lam2), M3') with kappa3 kept (controls.shrink_excess_variance), in the study solvers
#   ``sn-ddpm-exvar`` and ``gms-exvar`` (studies.controls: the library's sn-ddpm and gms steps on the changed
#   moments; the float64 torch path);
# - ``exvarpre=f``: the network wrapped in :class:`ExcessVarianceShrink` (the heads' c2 = e2 - e1^2 times f before
#   the sampler's clamps; where the clamp on Var[x0|x_t] binds, as it does at large t on the shipped models, the
#   shrinkage is lost: ``exvar-check`` measures it).
EXVAR_TABLES = ("lam", "lamval")
EXVAR_KEYS = ("exvar", "exvarpre")
_EXVAR = re.compile(r" (?P<key>exvar|exvarpre)=(?P<value>[^ ]+)")


def split_exvar(label: str) -> tuple[str, str | None, float | str | None]:
    """'gms closed/sample exvar=lam' -> ('gms closed/sample', 'exvar', 'lam'); 'sn-ddpm exvarpre=0.5' ->
    ('sn-ddpm', 'exvarpre', 0.5); a label without either modifier -> (label, None, None)."""
    found = list(_EXVAR.finditer(label))
    if not found:
        return label, None, None
    if len(found) > 1:
        raise ValueError(f"row label {label!r} has more than one exvar=/exvarpre= modifier")
    key, raw = found[0]["key"], found[0]["value"]
    row = label[:found[0].start()] + label[found[0].end():]
    try:
        value: float | str = float(raw)
    except ValueError:
        if raw not in EXVAR_TABLES:
            raise ValueError(f"{key}={raw!r} in {label!r} is neither a number nor one of "
                             f"{', '.join(EXVAR_TABLES)}") from None
        return row, key, raw
    if not 0.0 <= value <= 100.0:
        raise ValueError(f"{key}={raw} in {label!r} is outside [0, 100]")
    return row, key, value


class ExcessVarianceShrink(torch.nn.Module):
    """A noise-head network whose central second moment of the noise is scaled per time index: with
    c2 = e2 - e1^2 and c3 = e3 - 3 e1 e2 + 2 e1^3 (the network's Var[eps|x_t] and E[(eps - e1)^3|x_t]), the
    heads become (e1, e1^2 + f c2, c3 + 3 e1 e2' - 2 e1^3): e1 and c3 as they were, c2 times f = ``factors``
    (one number, or {t: f} looked up by the time index the sampler calls the network with; a t with no entry
    is refused). Since Var[x0|x_t] = (sigma_t/a_t)^2 c2 and kappa3[x0|x_t] = -(sigma_t/a_t)^3 c3, every step's
    transition gets Var' = lam2 + f (Var - lam2) with kappa3 kept *before* the sampler's clamps on the x0 moments
    (which then act on the shrunk moments: row modifier ``exvarpre``).

    For a MomentNet with ``targets="central"`` (the shipped models) the heads' own outputs (c2, c3) are scaled
    before the network's raw_from_central, so f = 1 returns exactly the network's output and no c2 is recovered
    by cancellation; for raw heads the transform runs in float64 (f = 1: the output untouched)."""

    def __init__(self, net: torch.nn.Module, factors: float | dict[int, float]):
        super().__init__()
        self.net = net
        self.factors = {int(t): float(f) for t, f in factors.items()} if isinstance(factors, dict) else float(factors)

    @property
    def time_input(self) -> str:
        return getattr(self.net, "time_input", "index")

    @property
    def schedule(self):
        return getattr(self.net, "schedule", None)

    @property
    def output_heads(self) -> int | None:
        return getattr(self.net, "output_heads", None)

    def factor_at(self, t: torch.Tensor | int | float) -> float:
        """The factor for the network's time argument ``t`` (as the network takes it: see ``time_input``)."""
        if not isinstance(self.factors, dict):
            return self.factors
        idx = time_indices(torch.as_tensor(t).reshape(-1), schedule_for(self.net).T, self.time_input)
        if idx.numel() == 0 or not bool((idx == idx[0]).all()) or float(idx[0]) != round(float(idx[0])):
            raise ValueError(f"exvar factors per t need one integer time index per call, got {idx.tolist()[:4]}")
        return exvar_factor_at(self.factors, int(round(float(idx[0]))))

    def forward(self, x: torch.Tensor, t: torch.Tensor | int | float) -> torch.Tensor:
        f = self.factor_at(t)
        C = x.shape[1]
        if getattr(self.net, "targets", "raw") == "central":
            out = self.net(x, t, head_outputs=True)
            e1, central = out[:, :C], [out[:, (j + 1) * C:(j + 2) * C] for j in range(out.shape[1] // C - 1)]
            central[0] = central[0] * f
            return torch.cat([e1, *raw_from_central(e1, central)], dim=1)
        out = self.net(x, t)
        if f == 1.0 or out.shape[1] < 2 * C:
            return out
        e = out.double()
        e1, e2 = e[:, :C], e[:, C:2 * C]
        new_e2 = e1 * e1 + f * (e2 - e1 * e1)
        heads = [new_e2]
        if out.shape[1] >= 3 * C:
            c3 = e[:, 2 * C:3 * C] - 3 * e1 * e2 + 2 * e1**3
            heads.append(c3 + 3 * e1 * new_e2 - 2 * e1**3)
        return torch.cat([out[:, :C], *[h.to(out.dtype) for h in heads], out[:, len(heads) * C + C:]], dim=1)


def exvar_tables(bed) -> dict[str, dict[int, dict[int, float]]]:
    """{name: {K: {t: factor}}}: lambda_var of every step of each K's trajectory from the testbed's table file
    (``shrinkage`` stores it per K in its runs, beside the skew tables), clipped to [0, 100], and 1.0 for t = 0,
    where the sampler calls the network only for the final denoising step, which reads e1 alone."""
    path = study.skew_table_path(bed)
    if not path.exists():
        raise ValueError(f"no shrinkage tables for {bed.name} ({path}); make them with python "
                         f"python/quality_benchmark.py shrinkage --testbed {bed.name}")
    runs = json.loads(path.read_text())["runs"]
    return {name: {int(k): {0: 1.0, **{int(r["t"]): min(max(float(r["lam_var"]), 0.0), 100.0) for r in rows}}
                   for k, rows in run["rows"].items()} for name, run in runs.items()}


def exvar_factors(value: float | str, steps: int, tables: dict | None) -> float | dict[int, float]:
    """The factor (or {t: factor}) of a row with ``exvar=value`` / ``exvarpre=value`` in column K = ``steps``."""
    if isinstance(value, str):
        if not tables or value not in tables or steps not in tables[value]:
            raise ValueError(f"exvar={value} needs the table {value!r} for K={steps} (python "
                             "python/quality_benchmark.py shrinkage --testbed ... writes it)")
        return dict(tables[value][steps])
    return float(value)


def draw_exvar(model, shape, label: str, steps: int, n: int, seed: int, tables: dict | None = None,
               skew_tables: dict | None = None, batch: int = 1000, **extra) -> torch.Tensor:
    """study.draw for a row with ``exvar=`` or ``exvarpre=`` (and the factors of K = ``steps``)."""
    row, key, value = split_exvar(label)
    if key is None:
        return study.draw(model, shape, row, steps, n, seed, batch, skew_tables, **extra)
    factors = exvar_factors(value, steps, tables)
    if key == "exvarpre":
        return study.draw(ExcessVarianceShrink(model, factors), shape, row, steps, n, seed, batch, skew_tables,
                          **extra)
    solver = study.row_options(row)[0]
    if solver not in EXVAR_SOLVERS:
        raise ValueError(f"exvar= needs a row of {', '.join(EXVAR_SOLVERS)}, got {label!r}")
    return study.draw(model, shape, row, steps, n, seed, batch, skew_tables, solver=EXVAR_SOLVERS[solver],
                      exvar=factors, **extra)


def measure_exvar(bed, labels, steps, seeds, n_samples: int, cache: ResultCache, log=print) -> dict:
    """study.measure for rows with ``exvar=`` / ``exvarpre=`` (:func:`draw_exvar`), cached under the full label."""
    parsed = [split_exvar(label) for label in labels]
    tables = exvar_tables(bed) if any(isinstance(v, str) for _, _, v in parsed) else None
    skew = (study.load_skew_tables(bed) if any(isinstance(study.row_options(row)[1].get("skew_scale"), str)
                                               for row, _, _ in parsed) else None)
    return study.measure(bed, labels, steps, seeds, n_samples, cache, log,
                         draw_row=functools.partial(draw_exvar, tables=tables, skew_tables=skew))


@torch.no_grad()
def exvar_check(net, factors: float | dict[int, float], data: torch.Tensor, steps: int, seed: int = 0,
                data_range=(-1.0, 1.0)) -> list[dict]:
    """What the fits see under ``exvar`` and ``exvarpre`` with ``factors``, per step t -> s of K = ``steps`` (the
    denoising step left out), on x_t = a_t x0 + sigma_t eps of the images ``data`` (one eps each, from ``seed``;
    the network in float32 as the sampler calls it, the moments in float64 with the sampler's clamps), over all
    elements: ``var_at_max``: the share whose heads' Var[x0|x_t] exceeds the clamp's maximum (half the range,
    squared); ``m3_clamped``: the share whose E[x0^3|x_t] the clamp |E[y^3]| <= |E[y]| replaces; for ``exvarpre``
    (the wrapped network), ``pre_var_ratio`` = mean(Var' - lam2) / mean(Var - lam2) (the factor where no clamp
    binds) and ``pre_k3_change`` = RMS(kappa3' - kappa3) / RMS(kappa3) (0 where no clamp binds); and the mean
    standardized skewness |kappa3| / Var^1.5 of the heads (``skew``), under ``exvar`` (``skew_exvar``: kappa3 kept,
    Var' = lam2 + f (Var - lam2)) and under ``exvarpre`` (``skew_pre``)."""
    from gms_kernels.core.moments import x0_moments
    from gms_kernels.core.schedule import DATA, trajectory

    schedule = schedule_for(net)
    wrapped = ExcessVarianceShrink(net, factors)
    eps = torch.randn(data.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    data, C = data.double(), data.shape[1]
    c, h = sum(data_range) / 2, (data_range[1] - data_range[0]) / 2
    ts = trajectory(schedule, steps)
    rows = []
    for i, t in enumerate(ts):
        s = ts[i + 1] if i + 1 < len(ts) else DATA
        if s == DATA:
            continue
        x_t = schedule.add_noise(data, eps, t)
        tt = torch.full((x_t.shape[0],), t)
        k = schedule.coefficients(t, s)
        f = exvar_factor_at(factors, t)

        def skew(m):
            var = m.var.clamp_min(0.0)
            k3 = central_third_moment(m.m1, var, m.m3)
            return k3, float((k3.abs() / var.clamp_min(1e-30) ** 1.5).mean())
        heads = net(x_t.float(), tt).double().split(C, dim=1)
        mom = transition_moments(x_t, *heads, k, data_range)
        x0 = x0_moments(x_t, *heads, k.a_t, k.sigma_t)  # (before the clamps)
        raw_m3_y = (x0.m3 - 3 * c * x0.m2 + 3 * c * c * x0.mean - c**3) / h**3
        pre = transition_moments(x_t, *wrapped(x_t.float(), tt).double().split(C, dim=1), k, data_range)
        (k3, sk), (k3_pre, sk_pre) = skew(mom), skew(pre)
        rows.append({"t": t, "s": s, "factor": f, "var_at_max": float((x0.var > h * h).double().mean()),
                     "m3_clamped": float((raw_m3_y.abs() > ((x0.mean - c) / h).clamp(-1, 1).abs()).double().mean()),
                     "pre_var_ratio": float((pre.var - k.lam2).mean() / (mom.var - k.lam2).mean()),
                     "pre_k3_change": float((k3_pre - k3).pow(2).mean().sqrt() / k3.pow(2).mean().sqrt()),
                     "skew": sk, "skew_exvar": skew(shrink_excess_variance(mom, k, f))[1], "skew_pre": sk_pre})
    return rows


def check(args) -> None:
    """exvar_check of each --labels' exvar= / exvarpre= value (a number or a table) on --samples validation
    images (a seeded subset), per K."""
    bed = study.testbed(args.testbed, args.model)
    refs = bed.references()["validation"]
    pick = torch.randperm(refs.shape[0], generator=torch.Generator().manual_seed(0))[:args.samples].sort().values
    net = bed.model()
    for label in args.labels:
        value = split_exvar(label)[2]
        tables = exvar_tables(bed) if isinstance(value, str) else None
        for k in args.steps:
            print(f"## {bed.name}: factor {value}, K={k}, {len(pick)} validation images\n\n"
                  "| t -> s | factor | heads' Var[x0\\|x_t] above the clamp | E[x0^3] clamped | exvarpre: "
                  "mean(Var' - lam2) / mean(Var - lam2) | exvarpre: RMS kappa3 change / RMS kappa3 | mean abs "
                  "skewness: heads / exvar / exvarpre |\n|---|---|---|---|---|---|---|")
            for r in exvar_check(net, exvar_factors(value, k, tables), refs[pick], k):
                print(f"| {r['t']} -> {r['s']} | {r['factor']:.3f} | {r['var_at_max']:.3f} | {r['m3_clamped']:.3f} | "
                      f"{r['pre_var_ratio']:.3f} | {r['pre_k3_change']:.2g} | {r['skew']:.3g} / "
                      f"{r['skew_exvar']:.3g} / {r['skew_pre']:.3g} |")
            print()


def _cache(args) -> ResultCache:
    """Writes gms_out/quality-<testbed>-<run>.json; reads every run's file of that testbed (runs side by side
    must each write their own file)."""
    runs = sorted(Path("gms_out").glob(f"quality-{args.testbed}-*.json"))
    return ResultCache(f"gms_out/quality-{args.testbed}-{args.run}.json", also_read=runs)


def measure(args) -> None:
    bed = study.testbed(args.testbed, args.model)
    for label in args.labels:  # (every label is read before any sampling)
        row, key, _ = split_exvar(label)
        if study.row_options(row)[0] not in EXVAR_SOLVERS and key == "exvar":
            sys.exit(f"exvar= needs a row of {', '.join(EXVAR_SOLVERS)}, got {label!r}")
    plain = [label for label in args.labels if split_exvar(label)[1] is None]
    shrunk = [label for label in args.labels if split_exvar(label)[1] is not None]
    cache = _cache(args)
    if plain:
        study.measure(bed, plain, args.steps, range(args.seeds), args.samples, cache)
    if shrunk:
        measure_exvar(bed, shrunk, args.steps, range(args.seeds), args.samples, cache)


def diagnose(args) -> None:
    bed = study.testbed(args.testbed, args.model)
    model = bed.model()
    for label in args.labels:
        for k in args.steps:
            print(f"## {label}, K={k}\n\n| t -> s | mean abs(mu1 - mu2) / sd | mean s2 / Var | at floor / bounds | "
                  "mean abs skewness | sent to Gaussian |\n|---|---|---|---|---|---|")
            for r in study.fit_diagnostics(model, bed.shape, label, k, n=args.samples):
                print(f"| {r['t']} -> {r['s']} | {r['gap_sd']:.3f} | {r['s2_var']:.3f} | {r['at_floor']:.3f} | "
                      f"{r['skew']:.3f} | {r['gaussian']:.3f} |")
            print()
    data = bed.references()["validation"][:args.samples]
    heads = study.head_diagnostics(model, data, args.times)
    print("| t | mean e2 - e1^2 | MC mean (eps - e1)^2 | mean kappa3 (heads) | MC mean (eps - e1)^3 | "
          "mean abs kappa3 (heads) | share e2 - e1^2 < 0 |\n|---|---|---|---|---|---|---|")
    for t, r in heads.items():
        print(f"| {t} | {r['var_head']:.4f} | {r['var_mc']:.4f} | {r['kappa3_head']:+.5f} | {r['kappa3_mc']:+.5f} | "
              f"{r['abs_kappa3_head']:.5f} | {r['negative']:.3f} |")


def _split_label(label: str, aliases: dict[str, str]) -> tuple[str | None, str]:
    """'central: gms closed/pixel' -> (the weights file of alias 'central', 'gms closed/pixel')."""
    if ": " in label:
        alias, row = label.split(": ", 1)
        if alias not in aliases:
            sys.exit(f"label {label!r} names model {alias!r}; pass --alias {alias}=FILE")
        return aliases[alias], row
    return None, label


def collect(args) -> dict:
    """{(label, K, seed): cell} from the caches, for every label (an unmeasured cell stops the report)."""
    aliases = dict(a.split("=", 1) for a in args.alias)
    cache = _cache(args).data
    results = {}
    for label in args.labels:
        model_file, row = _split_label(label, aliases)
        bed = study.testbed(args.testbed, model_file)
        tag = bed.tag
        study.row_options(split_exvar(row)[0])
        for k in args.steps:
            for s in range(args.seeds):
                key = f"{bed.name}|{tag}|{row}|{k}|{s}|{args.samples}"
                if key not in cache:
                    sys.exit(f"not measured: {key} (run the measure command first)")
                results[(label, k, s)] = cache[key]
    return results


def table(results: dict, metric: str, args) -> list[str]:
    seeds = list(range(args.seeds))
    summary = study.summarise(results, metric, args.labels, args.steps, seeds, baseline=study.is_main_baseline)
    lines = ["| row | " + " | ".join(f"K={k}" for k in args.steps) + " |", "|---|" + "---|" * len(args.steps)]
    for label in args.labels:
        cells = []
        for k in args.steps:
            r = summary[(label, k)]
            iv, mark = r["interval"], "**" if r["best_baseline"] == label else ""
            sig = (" +" if r["diff"].mean < 0 else " -") if r.get("significant") else ""
            cells.append(f"{mark}{iv.mean:.{args.digits}f} ± {iv.half_width:.{args.digits}f}{mark}{sig}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def acceptance(results: dict, metric: str, args) -> list[str]:
    """The acceptance cells: the default row against each named baseline and against the best of the
    variance-scaled Gaussians (lowest mean among the baseline rows with c= or v=), per K: both 95% intervals, whether they are
    disjoint with the default below, and the paired difference."""
    seeds = list(range(args.seeds))
    lines = [f"### acceptance: `{args.default_row}` against the baselines ({metric})", "",
             "| K | baseline | default | baseline's | intervals disjoint, default lower | default - baseline, paired |",
             "|---|---|---|---|---|---|"]
    for k in args.steps:
        vals = {label: [results[(label, k, s)][metric] for s in seeds] for label in args.labels}
        scaled = [label for label in args.labels if study.is_variance_scaled(label)]
        best_scaled = min(scaled, key=lambda lb: sum(vals[lb])) if scaled else None
        mine = seed_interval(vals[args.default_row])
        for base in [*args.versus, *([best_scaled] if best_scaled else [])]:
            other = seed_interval(vals[base])
            diff, significant = paired_difference(vals[args.default_row], vals[base])
            name = f"{base} (best variance-scaled)" if base == best_scaled else base
            lines.append(f"| {k} | {name} | {mine.mean:.{args.digits}f} [{mine.low:.{args.digits}f}, "
                         f"{mine.high:.{args.digits}f}] | {other.mean:.{args.digits}f} [{other.low:.{args.digits}f}, "
                         f"{other.high:.{args.digits}f}] | {'yes' if mine.high < other.low else 'no'} | "
                         f"{diff.mean:+.{args.digits}f} [{diff.low:+.{args.digits}f}, {diff.high:+.{args.digits}f}]"
                         f"{' *' if significant else ''} |")
    return lines + [""]


def report(args) -> None:
    results = collect(args)
    bed = study.testbed(args.testbed)
    metrics = args.metrics or [bed.primary]
    cmd = "python python/quality_benchmark.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    lines = [f"Command (tables from the cached cells): `{cmd}`", "",
             f"Machine: {cpu_description()}; torch {torch.__version__}, 1 torch thread. {args.samples} samples per cell; "
             f"seeds 0..{args.seeds - 1} (the same initial noise for every row at a seed). Cells: mean ± half-width "
             "of the 95% Student-t interval over seeds (gk.metrics.seed_interval). **Bold**: the best baseline at "
             "that K (lowest mean of the baseline rows: ddpm, sn-ddpm, ddim, their variance-scaled variants and the SDE "
             "solvers, which run the most steps whose network calls fit in K + 1; rows of other weights, `NAME: row`, "
             "are compared against it but never chosen as it). "
             "`+` / `-`: significantly better / worse than it (paired per-seed difference, 95% interval excludes "
             "0: gk.metrics.paired_difference). Lower is better.", ""]
    for split in args.splits:
        for metric in metrics:
            lines += [f"### {split} / {metric}", "", *table(results, f"{split}/{metric}", args), ""]
    if args.default_row:
        lines += acceptance(results, f"{args.splits[0]}/{metrics[0]}", args)
    text = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


def ggf(args) -> None:
    """Gotta Go Fast on a testbed: its calls are adaptive, so one row per tolerance with the mean network calls
    per sample (NFE), over seeds, against every reference set."""
    import time

    from gms_kernels.sampling import sample

    bed = study.testbed(args.testbed, args.model)
    model, refs = bed.model(), bed.references()
    cache = _cache(args)
    tag = bed.tag
    cells = []
    for seed in range(args.seeds):
        def run(seed=seed):
            seen: list[dict] = []
            t0 = time.perf_counter()
            x = sample(model, shape=(args.samples, *bed.shape), solver="ggf", generator=seed, progress=False,
                       callback=seen.append, eps_rel=args.ggf_tol)
            nfe = float(torch.as_tensor(seen[-1]["nfe"], dtype=torch.float64).mean())
            scores = {f"{r}/{m}": fn(x, ref) for r, ref in refs.items() for m, fn in bed.metrics.items()}
            return {**scores, "nfe": nfe, "seconds": time.perf_counter() - t0}
        cells.append(cache.get_or_compute(f"{bed.name}|{tag}|ggf eps_rel={args.ggf_tol:g}|adaptive|{seed}|"
                                          f"{args.samples}", run))
    names = [n for n in cells[0] if "/" in n]
    print(f"| ggf eps_rel={args.ggf_tol:g} | NFE | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    nfe = seed_interval([c["nfe"] for c in cells])
    row = [f"{seed_interval([c[n] for c in cells]).mean:.3f} ± {seed_interval([c[n] for c in cells]).half_width:.3f}"
           for n in names]
    print(f"| {args.seeds} seeds x {args.samples} | {nfe.mean:.1f} | " + " | ".join(row) + " |")


def shrinkage(args) -> None:
    """lambda(t) per K: the heads' kappa3 regressed on exact heads of the train data (study.skew_shrinkage), on x_t
    of --samples images (all, if fewer) of --x-split; writes the table rows 'skew=lam' (x_t of train images) or
    'skew=lamval' (of validation images) read, factors clipped to [0, 100], into the testbed's table file."""
    import json

    from gms_kernels.core.data import digits, patches

    if args.testbed not in ("digits", "patches"):
        sys.exit("shrinkage needs a testbed with a network: digits or patches")
    bed = study.testbed(args.testbed, args.model)
    split = {"train": "train", "validation": "validation"}[args.x_split]
    images = (lambda sp: digits(sp)[0]) if args.testbed == "digits" else patches
    train, source = images("train"), images(split)
    pick = torch.randperm(source.shape[0], generator=torch.Generator().manual_seed(0))[:args.samples].sort().values
    if args.heads_mean or args.against:
        return shrinkage_across_models(args, bed, study.data_oracle(train), source[pick])
    rows = study.skew_shrinkage(bed.model(), study.data_oracle(train), source[pick], args.steps)
    name = "lam" if split == "train" else "lamval"
    path = study.skew_table_path(bed)
    stored = json.loads(path.read_text()) if path.exists() else {"tables": {}, "runs": {}}
    stored["tables"][name] = {k: {r["t"]: min(max(r["lam"], 0.0), 100.0) for r in rs} for k, rs in rows.items()}
    stored["runs"][name] = {"rows": rows, "x_t_images": len(pick), "x_t_split": split,
                            "exact_components": train.shape[0], "blur": study.ORACLE_BLUR}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stored, indent=1))
    print(f"wrote table {name!r} to {path}\n")
    print_shrinkage(rows, "exact")


def print_shrinkage(rows: dict[int, list[dict]], reference: str) -> None:
    """study.skew_shrinkage's rows as a Markdown table (``reference``: what the heads were regressed on)."""
    print(f"| K | t -> s | lambda (kappa3) | corr | RMS kappa3 heads / {reference} | lambda (Var - lam2) | corr |\n"
          "|---|---|---|---|---|---|---|")
    for k, rs in rows.items():
        for r in rs:
            print(f"| {k} | {r['t']} -> {r['s']} | {r['lam']:.4f} | {r['corr']:.3f} | {r['rms_head']:.3g} / "
                  f"{r['rms_exact']:.3g} | {r['lam_var']:.4f} | {r['corr_var']:.3f} |")


class HeadsMean(torch.nn.Module):
    """The mean of several noise-head networks' outputs (E[eps], E[eps^2], E[eps^3]): with one shared backbone,
    an ensemble of heads trained with different seeds, whose noise averages out as far as it is seed-specific."""

    def __init__(self, nets: list[torch.nn.Module]):
        super().__init__()
        self.nets = torch.nn.ModuleList(nets)

    def forward(self, x: torch.Tensor, t) -> torch.Tensor:
        return torch.stack([net(x, t) for net in self.nets]).mean(dim=0)


class AsExactHeads(torch.nn.Module):
    """A network called as study.skew_shrinkage calls its exact heads (float64 x_t, an int t)."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, t: int) -> torch.Tensor:
        return self.net(x.float(), torch.full((x.shape[0],), t)).double()


def shrinkage_across_models(args, bed, exact, x0) -> None:
    """shrinkage with --heads-mean (the exact kappa3 regressed on the mean heads of the testbed's model and those
    files) or --against FILE (the testbed's model's kappa3 regressed on that model's: how far two head-training
    seeds agree); prints the table, writes none."""
    net = bed.model()
    others = [study.testbed(args.testbed, f).model() for f in (args.heads_mean or [args.against])]
    if args.heads_mean:
        net, what = HeadsMean([net, *others]), f"the mean heads of {1 + len(others)} models against the exact ones"
    else:
        exact, what = AsExactHeads(others[0]), f"the heads against those of {args.against}"
    rows = study.skew_shrinkage(net, exact, x0, args.steps)
    print(f"{bed.name}: {what}, x_t of {len(x0)} {args.x_split} images\n")
    print_shrinkage(rows, "reference")


@torch.no_grad()
def mean_error_moments(net, exact, x0: torch.Tensor, times, seed: int = 0, batch: int = 250) -> list[dict]:
    """Whether the heads' central moments are the backbone's mean error: with m = E[eps|x_t] and the exact central
    moments c2, k3 of eps (``exact``: e.g. study.data_oracle of the train images), and the backbone's e1 off by
    d = m - e1, heads trained on (eps - e1)^n learn at best c2 + d^2 and k3 + 3 d c2 + d^3 (expand
    ((eps - m) + d)^n). Per t, over all elements of x_t = a_t x0 + sigma_t eps of ``x0`` (one eps each, from
    ``seed``): the correlation of the heads' c2 / k3 with the exact ones and with these d-shifted ones, and RMSs."""
    from gms_kernels.core.schedule import Schedule

    schedule = Schedule.linear()
    eps = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x0, C = x0.double(), x0.shape[1]

    def central(e):
        e1 = e[:, :C]
        return e1, *central_moments(e1, e[:, C:2 * C], e[:, 2 * C:3 * C])

    def corr(a, b):
        return float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])

    rows = []
    for t in times:
        x_t = schedule.add_noise(x0, eps, t)
        tt = torch.full((x_t.shape[0],), t)
        head = torch.cat([net(x_t[i:i + batch].float(), tt[i:i + batch]).double() for i in range(0, len(x_t), batch)])
        true = torch.cat([exact(x_t[i:i + batch], t).double() for i in range(0, len(x_t), batch)])
        (e1, c2h, k3h), (m, c2, k3) = central(head), central(true)
        d = m - e1
        rows.append({"t": t, "rms_d": float(d.pow(2).mean().sqrt()), "rms_c2": float(c2.pow(2).mean().sqrt()),
                     "corr_c2": corr(c2h, c2), "corr_c2_d": corr(c2h, c2 + d * d),
                     "rms_k3h": float(k3h.pow(2).mean().sqrt()), "rms_k3": float(k3.pow(2).mean().sqrt()),
                     "rms_k3_d": float((k3 + 3 * d * c2 + d**3).pow(2).mean().sqrt()),
                     "corr_k3": corr(k3h, k3), "corr_k3_d": corr(k3h, k3 + 3 * d * c2 + d**3)})
    return rows


def mean_error(args) -> None:
    """mean_error_moments of the testbed's model on --samples images of --x-split at --times (exact heads: the
    train images), as a Markdown table."""
    from gms_kernels.core.data import digits, patches

    bed = study.testbed(args.testbed, args.model)
    images = (lambda sp: digits(sp)[0]) if args.testbed == "digits" else patches
    train, source = images("train"), images(args.x_split)
    pick = torch.randperm(source.shape[0], generator=torch.Generator().manual_seed(0))[:args.samples].sort().values
    rows = mean_error_moments(bed.model(), study.data_oracle(train), source[pick], args.times)
    print(f"{bed.name}: x_t of {len(pick)} {args.x_split} images; d = E[eps|x_t] (exact) - e1 (backbone)\n")
    print("| t | RMS d | RMS c2 exact | corr c2 heads: exact / exact + d^2 | RMS k3: heads / exact / exact + 3 d c2 + d^3 "
          "| corr k3 heads: exact / exact + 3 d c2 + d^3 |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['t']} | {r['rms_d']:.3g} | {r['rms_c2']:.3g} | {r['corr_c2']:.3f} / {r['corr_c2_d']:.3f} | "
              f"{r['rms_k3h']:.3g} / {r['rms_k3']:.3g} / {r['rms_k3_d']:.3g} | {r['corr_k3']:.3f} / "
              f"{r['corr_k3_d']:.3f} |")


def paired(args) -> None:
    """Paired per-seed differences (gk.metrics.paired_difference, 95%) of each --labels row minus each --versus row,
    per K, on --splits[0] / the primary metric (or --metrics[0]); then minus the best variance-scaled Gaussian and
    minus the best baseline among the --versus rows (lowest mean at that K, named in the cell)."""
    labels = list(dict.fromkeys([*args.labels, *args.versus]))
    results = collect(argparse.Namespace(**{**vars(args), "labels": labels}))
    metric = f"{args.splits[0]}/{(args.metrics or [study.testbed(args.testbed).primary])[0]}"
    d = args.digits

    def values(label, k):
        return [results[(label, k, s)][metric] for s in range(args.seeds)]

    def cell(a, b):
        diff, significant = paired_difference(a, b)
        return f"{diff.mean:+.{d}f} [{diff.low:+.{d}f}, {diff.high:+.{d}f}]{' *' if significant else ''}"

    head = ["| row | " + " | ".join(f"K={k}" for k in args.steps) + " |", "|---|" + "---|" * len(args.steps)]
    scaled = [v for v in args.versus if study.is_variance_scaled(v)]
    base = [v for v in args.versus if study.is_baseline(v)]
    lines = []
    groups = [(f"minus {v}", lambda k, v=v: v) for v in args.versus]
    for name, pool in (("the best variance-scaled Gaussian", scaled), ("the best baseline", base)):
        if pool:
            groups.append((f"minus {name} of {', '.join(pool)} (per K)",
                           lambda k, pool=pool: min(pool, key=lambda b: sum(values(b, k)))))
    for title, against in groups:
        lines += [f"### {metric}: {title}, paired", "", *head]
        for label in args.labels:
            cells = []
            for k in args.steps:
                b = against(k)
                cells.append("-" if b == label else cell(values(label, k), values(b, k))
                             + (f" ({b})" if title.endswith("(per K)") else ""))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    print("\n".join(lines))


def choose(args) -> None:
    """The defaults' choice on validation: mean rank of each candidate over (testbed, K), on ``--testbeds`` (both:
    the library's defaults; one: that shipped model's own ``solver_defaults``)."""
    scores, lines = {}, []
    for bed_name in args.testbeds:
        sub = argparse.Namespace(**{**vars(args), "testbed": bed_name,
                                    "alias": getattr(args, f"alias_{bed_name}")})
        results = collect(sub)
        metric = f"validation/{study.testbed(bed_name).primary}"
        for label in args.labels:
            for k in args.steps:
                scores[(bed_name, label, k)] = sum(results[(label, k, s)][metric] for s in range(args.seeds)) / args.seeds
    ranks = mean_ranks(scores, args.labels)
    cols = [(b, k) for b in args.testbeds for k in args.steps]
    lines += ["| candidate | " + " | ".join(f"{b} K={k}" for b, k in cols) + " | mean rank |",
              "|---|" + "---|" * (len(cols) + 1)]
    for label in sorted(args.labels, key=ranks.get):
        lines.append(f"| {label} | " + " | ".join(f"{scores[(b, label, k)]:.2f}" for b, k in cols)
                     + f" | {ranks[label]:.2f} |")
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("measure", "diagnose", "report", "choose", "ggf", "shrinkage", "paired",
                                    "exvar-check", "mean-error"))
    p.add_argument("--testbed", choices=("digits", "digits-oracle", "patches", "patches-oracle"), default="digits")
    p.add_argument("--model", default=None, help="other weights for the testbed's architecture (embedded format)")
    p.add_argument("--labels", nargs="+", default=None, help="the rows (every part but ggf)")
    p.add_argument("--steps", type=int, nargs="+", default=list(study.STEPS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--times", type=int, nargs="+", default=[50, 100, 200, 400, 700, 900],
                   help="diagnose: the t of the heads' check")
    p.add_argument("--splits", nargs="+", default=["validation", "test"], help="report: the reference sets")
    p.add_argument("--alias", nargs="*", default=[], metavar="NAME=FILE",
                   help="report: rows labelled 'NAME: row' use these weights (embedded format)")
    p.add_argument("--default-row", default=None, help="report: the acceptance table of this row (first split/metric)")
    p.add_argument("--versus", nargs="*", default=["sn-ddpm", "ddpm"],
                   help="report: the acceptance's baselines; paired: the rows every --labels row is compared with")
    p.add_argument("--testbeds", nargs="+", choices=("digits", "patches"), default=["digits", "patches"],
                   help="choose: the testbeds whose validation cells rank the candidates")
    p.add_argument("--alias-digits", nargs="*", default=[], metavar="NAME=FILE", help="choose: the digits aliases")
    p.add_argument("--alias-patches", nargs="*", default=[], metavar="NAME=FILE", help="choose: the patches aliases")
    p.add_argument("--metrics", nargs="+", default=None)
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--ggf-tol", type=float, default=0.5, help="ggf: GGF's relative tolerance eps_rel")
    p.add_argument("--x-split", choices=("train", "validation"), default="train",
                   help="shrinkage: the images whose x_t the heads are compared on (exact heads: the train images)")
    p.add_argument("--heads-mean", nargs="*", default=[], metavar="FILE",
                   help="shrinkage: regress on the mean heads of the model and these (same backbone); writes no table")
    p.add_argument("--against", default=None, metavar="FILE",
                   help="shrinkage: regress the model's kappa3 on this model's instead of the exact one; writes no table")
    p.add_argument("--run", default="main", help="this run's cache file name (parallel runs need their own)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.part not in ("ggf", "shrinkage", "mean-error") and not args.labels:
        p.error(f"{args.part} needs --labels")
    torch.set_num_threads(1)
    print("command: python python/quality_benchmark.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
          file=sys.stderr)
    {"measure": measure, "diagnose": diagnose, "report": report, "choose": choose, "ggf": ggf,
     "shrinkage": shrinkage, "paired": paired, "exvar-check": check, "mean-error": mean_error}[args.part](args)


if __name__ == "__main__":
    main()
