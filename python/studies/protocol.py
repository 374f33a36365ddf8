"""Equal tuning: every sampler gets the same variance-scale grid, chosen on validation seeds against a validation
reference and reported on test seeds against a test reference, both held-out data of the model's training
distribution.

- Families (:data:`FAMILIES`), each run at every variance scale c of :data:`GRID`: SN-DDPM, GMS with per-pixel and
  with per-image component selection (the closed fit; GMS: https://arxiv.org/abs/2311.00941), and the
  rank-one covariance control (``studies.controls``). Fixed rows (:data:`FIXED`) take no c. The model's own GMS
  options (``gms`` with its ``solver_defaults``) coincide with one cell of the grid (:func:`default_label`): that cell
  is shared, not sampled twice.
- Validation: every cell on the validation seeds; per family and K the c with the lowest validation mean of the
  primary metric; "the best validated Gaussian" (DDPM or SN-DDPM at its c) and "the best validated baseline" (DDPM,
  DDIM, DPM-Solver++(2M) SDE, Euler ancestral or SN-DDPM at its c) likewise (:func:`choose`).
- Test: each family at its chosen c, each fixed row and the default on the test seeds, which enter no choice; each
  row's mean with its 95% Student-t interval, its paired per-seed difference to the best validated Gaussian, and the
  default's paired difference to every row (:func:`test_summary`).

Testbeds (:func:`protocol_testbed`): ``smooth`` (exact heads of a smooth density, :mod:`studies.smooth_density`),
``digits`` and ``patches`` (the shipped models). The patches references are held-out positions of the training
photos, two disjoint sets (:func:`heldout_positions`); the other photos' score is kept as ``generalisation``.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from gms_kernels.eval.metrics import SeedInterval, dct_matrix, paired_difference, seed_interval, wasserstein1
from .quality_study import GMS_BASES, Testbed, draw, measure, row_options, testbed
from .digits_study import ResultCache

STEPS = (5, 10, 20)
GRID = (1.0, 1.25, 1.5, 2.0)
FAMILIES = ("sn-ddpm", "gms closed/pixel", "gms closed/sample", "control-rank1")
FIXED = ("ddpm", "ddim", "dpmpp-2m-sde", "euler-ancestral")
GAUSSIANS = ("ddpm", "sn-ddpm")  # the candidates for "the best validated Gaussian" (sn-ddpm at its chosen c)
BASELINES = ("ddpm", "ddim", "dpmpp-2m-sde", "euler-ancestral", "sn-ddpm")
TEST_SEEDS = (0, 1, 2, 3, 4)
DEFAULT = "default"  # the default row's name in tables and summaries


def family_label(family: str, c: float) -> str:
    """The row label of ``family`` at variance scale c (``"sn-ddpm c=1.25"``)."""
    return f"{family} c={c:g}"


@dataclass(frozen=True)
class Protocol:
    """The grid, the seeds and the references of one testbed's run. ``default`` is the label of the family cell the
    model's own GMS options equal (:func:`default_label`)."""

    default: str
    validation_seeds: tuple[int, ...]
    n_samples: int
    primary: str  # the metric every choice is made on (lower is better)
    steps: tuple[int, ...] = STEPS
    test_seeds: tuple[int, ...] = TEST_SEEDS
    grid: tuple[float, ...] = GRID
    families: tuple[str, ...] = FAMILIES
    fixed: tuple[str, ...] = FIXED

    def __post_init__(self) -> None:
        if set(self.validation_seeds) & set(self.test_seeds):
            raise ValueError(f"validation seeds {self.validation_seeds} and test seeds {self.test_seeds} overlap")
        if len(self.test_seeds) < 5 or len(self.validation_seeds) < 2:
            raise ValueError("the protocol needs at least 5 test seeds and 2 validation seeds")
        if self.default not in self.grid_labels():
            raise ValueError(f"the default {self.default!r} is no cell of the grid")

    def grid_labels(self) -> list[str]:
        return [family_label(f, c) for f in self.families for c in self.grid]

    def validation_labels(self) -> list[str]:
        return [*self.grid_labels(), *self.fixed]


@dataclass(frozen=True)
class Choice:
    """What validation chose at one K: the c of every family, the best validated Gaussian and baseline (labels),
    and every label's validation mean."""

    c: dict[str, float]
    gaussian: str
    baseline: str
    validation_means: dict[str, float]

    def rows(self, protocol: Protocol) -> dict[str, str]:
        """{row name: label} of the test table: the default, each family at its c, each fixed row."""
        return {DEFAULT: protocol.default, **{f: family_label(f, self.c[f]) for f in protocol.families},
                **{f: f for f in protocol.fixed}}


Results = dict[tuple[str, int, int], dict[str, float]]  # (label, K, seed) -> {"<reference>/<metric>": value}


def choose(results: Results, protocol: Protocol, reference: str = "validation") -> dict[int, Choice]:
    """Per K, the choices of the module docstring, from the validation seeds' scores against ``reference`` only."""
    key = f"{reference}/{protocol.primary}"
    out = {}
    for k in protocol.steps:
        means = {label: sum(results[(label, k, s)][key] for s in protocol.validation_seeds)
                 / len(protocol.validation_seeds) for label in protocol.validation_labels()}
        c = {f: min(protocol.grid, key=lambda c: means[family_label(f, c)]) for f in protocol.families}
        chosen = {f: family_label(f, c[f]) for f in protocol.families}

        def best(names: Sequence[str]) -> str:
            return min((chosen.get(n, n) for n in names), key=lambda label: means[label])

        out[k] = Choice(c, best(GAUSSIANS), best(BASELINES), means)
    return out


@dataclass(frozen=True)
class TestRow:
    """One row at one K on the test seeds: its label, interval, paired difference to the best validated Gaussian
    (None for that row itself) and the default's paired difference to it (None for the default's own cell)."""

    label: str
    interval: SeedInterval
    minus_gaussian: tuple[SeedInterval, bool] | None
    default_minus: tuple[SeedInterval, bool] | None


def test_summary(results: Results, protocol: Protocol, choices: dict[int, Choice], metric: str,
                 reference: str = "test") -> dict[tuple[str, int], TestRow]:
    """{(row name, K): TestRow} for ``metric`` against ``reference`` on the test seeds."""
    key = f"{reference}/{metric}"
    out = {}
    for k, choice in choices.items():
        def values(label: str) -> list[float]:
            return [results[(label, k, s)][key] for s in protocol.test_seeds]

        gaussian, default = values(choice.gaussian), values(protocol.default)
        for name, label in choice.rows(protocol).items():
            v = values(label)
            out[(name, k)] = TestRow(label, seed_interval(v),
                                     None if label == choice.gaussian else paired_difference(v, gaussian),
                                     None if label == protocol.default else paired_difference(default, v))
    return out


def verdict(diff: tuple[SeedInterval, bool] | None) -> str:
    """"better" / "worse" (significant at 95%; lower is better) or "ties" for a paired difference; "is" for the
    row itself (no difference)."""
    if diff is None:
        return "is"
    interval, significant = diff
    return "ties" if not significant else "better" if interval.mean < 0 else "worse"


# -- testbeds -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProtocolBed:
    """A testbed as the protocol runs it: references ``validation`` and ``test`` (and any others, e.g.
    ``generalisation``), the sampling's ``data_range``, the validation seeds and samples per cell."""

    bed: Testbed
    data_range: tuple[float, float] | None
    validation_seeds: tuple[int, ...]
    n_samples: int
    notes: str  # what the references are, for the results file


def default_label(model: torch.nn.Module) -> str:
    """The grid cell that equals ``gms`` with the model's own options (its ``solver_defaults`` over the library's
    defaults)."""
    from gms_kernels.solvers import get_solver

    own = {**get_solver("gms").options, **(getattr(model, "solver_defaults", None) or {}).get("gms", {})}
    for base in GMS_BASES:
        for c in GRID:
            label = family_label(base, c)
            if base in FAMILIES and {**get_solver("gms").options, **row_options(label)[1]} == own:
                return label
    raise ValueError(f"the model's GMS options {own} equal no cell of the grid; add that family")


def protocol_testbed(name: str) -> ProtocolBed:
    """``smooth``, ``digits`` or ``patches`` as the protocol runs them (module docstring)."""
    if name == "smooth":
        from gms_kernels.eval.metrics import fd_digits
        from gms_kernels.models.embedded import DIGITS_SHAPE
        from .smooth_density import REFERENCE_DRAWS, REFERENCE_SEEDS, fit_smooth_density

        density = fit_smooth_density()
        refs = functools.partial(lambda d: {s: d.draws(REFERENCE_DRAWS, seed) for s, seed in REFERENCE_SEEDS.items()},
                                 density)
        bed = Testbed("smooth", density.oracle, density.tag, DIGITS_SHAPE, refs,
                      {"fd": fd_digits, "pixel_w1": pixel_w1}, "fd")
        loglik = ", ".join(f"{k}: {v:.2f}" for k, v in density.validation_loglik.items())
        return ProtocolBed(bed, None, (100, 101, 102), 1000,
                           f"a diagonal Gaussian mixture of {density.components} components fitted to the train digits "
                           f"(components chosen by validation log-likelihood per digit, {loglik}); references: "
                           f"{REFERENCE_DRAWS} fresh draws each for validation and test (seeds "
                           f"{REFERENCE_SEEDS['validation']} and {REFERENCE_SEEDS['test']})")
    if name == "digits":
        return ProtocolBed(testbed("digits"), (-1.0, 1.0), (100, 101), 500,
                           'gk.data.digits("validation") and gk.data.digits("test") (359 digits each)')
    if name == "patches":
        from gms_kernels.eval.metrics import frechet_distance_dct

        bed = dataclasses.replace(testbed("patches"), references=patches_references,
                                  metrics={"fd_dct": frechet_distance_dct, "pixel_w1": pixel_w1, "dct_w1": dct_w1})
        return ProtocolBed(bed, (-1.0, 1.0), (100, 101), 500,
                           f"held-out positions of the 7 training photos, {HELDOUT_PER_PHOTO} per photo and set, "
                           "two disjoint sets (validation, test) that share no position with each other or with "
                           'the training patches; generalisation: gk.data.patches("test") (other photos)')
    raise ValueError(f"unknown testbed {name!r}; valid: smooth, digits, patches")


# -- metrics that see marginals -------------------------------------------------------------------------------
def _marginal_w1(x: torch.Tensor, y: torch.Tensor) -> float:
    """The mean over columns of the W1 between the columns' empirical distributions ([N, D] and [M, D])."""
    return sum(wasserstein1(x[:, d], y[:, d]) for d in range(x.shape[1])) / x.shape[1]


def pixel_w1(samples: torch.Tensor, reference: torch.Tensor) -> float:
    """The mean over pixels of the W1 between the per-pixel marginals of two image sets."""
    return _marginal_w1(samples.double().flatten(1), reference.double().flatten(1))


def dct_w1(samples: torch.Tensor, reference: torch.Tensor) -> float:
    """The mean over coefficients of the W1 between the marginals of the signed orthonormal 2-D DCT coefficients of
    two sets of patches [N, C, H, W] (per channel)."""
    def coefficients(x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        return (dct_matrix(x.shape[2]) @ x @ dct_matrix(x.shape[3]).T).flatten(1)

    return _marginal_w1(coefficients(samples), coefficients(reference))


# -- the patches references: held-out positions of the training photos ---------------------------------------
PATCH = 8
HELDOUT_PER_PHOTO = -(-10_000 // 7)  # per photo and per set: about 10,000 patches per reference
HELDOUT_SETS = ("validation", "test")


def train_positions(name: str) -> torch.Tensor:
    """The (top, left) corners [7000, 2] of the training patches of train photo ``name``: the positions
    ``gk.data.patches("train")`` draws (its seed 0, the photo's generator, ``top`` then ``left``)."""
    from gms_kernels.core.data import PATCH_PHOTOS, PATCHES_PER_PHOTO, photo_grey

    h, w = photo_grey(name).shape
    g = torch.Generator().manual_seed(list(PATCH_PHOTOS).index(name))
    top = torch.randint(0, h - PATCH + 1, (PATCHES_PER_PHOTO["train"],), generator=g)
    left = torch.randint(0, w - PATCH + 1, (PATCHES_PER_PHOTO["train"],), generator=g)
    return torch.stack([top, left], 1)


def heldout_positions(name: str, per_set: int = HELDOUT_PER_PHOTO) -> dict[str, torch.Tensor]:
    """{set: (top, left) corners [per_set, 2]} for the sets of :data:`HELDOUT_SETS`: distinct positions of train
    photo ``name`` that no training patch has, drawn without replacement (one seeded permutation), so the sets are
    disjoint from each other and from the training positions."""
    from gms_kernels.core.data import PATCH_PHOTOS, photo_grey

    h, w = photo_grey(name).shape
    cols = w - PATCH + 1
    free = torch.ones((h - PATCH + 1) * cols, dtype=torch.bool)
    taken = train_positions(name)
    free[taken[:, 0] * cols + taken[:, 1]] = False
    index = free.nonzero().flatten()
    if index.numel() < len(HELDOUT_SETS) * per_set:
        raise ValueError(f"photo {name} has {index.numel()} free positions, fewer than {len(HELDOUT_SETS) * per_set}")
    g = torch.Generator().manual_seed(1000 + list(PATCH_PHOTOS).index(name))
    pick = index[torch.randperm(index.numel(), generator=g)[:len(HELDOUT_SETS) * per_set]]
    return {s: torch.stack([p // cols, p % cols], 1) for s, p in zip(HELDOUT_SETS, pick.split(per_set))}


def cut_patches(name: str, positions: torch.Tensor) -> torch.Tensor:
    """The patches of photo ``name`` at ``positions`` [N, 2], scaled as ``gk.data.patches`` scales them."""
    from gms_kernels.core.data import photo_grey

    rows = (positions[:, 0, None] + torch.arange(PATCH))[:, :, None]
    cols = (positions[:, 1, None] + torch.arange(PATCH))[:, None, :]
    return (2.0 * photo_grey(name)[rows, cols] - 1.0).to(torch.float32).unsqueeze(1)


def patches_references() -> dict[str, torch.Tensor]:
    """{"validation", "test"}: held-out positions of the training photos (:func:`heldout_positions`);
    "generalisation": ``gk.data.patches("test")``, the test photos."""
    from gms_kernels.core.data import patch_photos, patches

    sets = {name: heldout_positions(name) for name in patch_photos("train")}
    return {**{s: torch.cat([cut_patches(n, p[s]) for n, p in sets.items()]) for s in HELDOUT_SETS},
            "generalisation": patches("test")}


# -- running --------------------------------------------------------------------------------------------------
def cache_path(pbed: ProtocolBed) -> Path:
    """The cells' cache file: names the testbed and, for FD-digits, the classifier's weights (a retrained
    classifier gives new numbers)."""
    from gms_kernels.models.embedded import file_tag

    name = pbed.bed.name
    if pbed.bed.primary == "fd":
        from gms_kernels.eval.features import DIGITS_CLASSIFIER

        name += "-clf" + file_tag(DIGITS_CLASSIFIER)
    return Path("gms_out") / f"equal-tuning-{name}.json"


def _not_cached(model, shape, label: str, k: int, n: int, seed: int) -> torch.Tensor:
    raise ValueError(f"cell ({label!r}, K={k}, seed {seed}) is not in the cache; run without --report-only")


def run(pbed: ProtocolBed, steps: Sequence[int] = STEPS, log=print,
        sample: bool = True) -> tuple[Protocol, dict[int, Choice], Results]:
    """Per K in turn: validation, the choices, then the test cells (all cached; a rerun resumes). With ``sample``
    False every cell must be cached already (the tables of a run still going on elsewhere)."""
    model = pbed.bed.model()
    protocol = Protocol(default_label(model), pbed.validation_seeds, pbed.n_samples, pbed.bed.primary,
                        steps=tuple(steps))
    cache = ResultCache(cache_path(pbed) if sample else None, also_read=[cache_path(pbed)])
    draw_row = functools.partial(draw, data_range=pbed.data_range) if sample else _not_cached
    results: Results = {}
    choices = {}
    for k in protocol.steps:
        results.update(measure(pbed.bed, protocol.validation_labels(), [k], protocol.validation_seeds,
                               protocol.n_samples, cache, log, draw_row))
        choices[k] = choose(results, dataclasses.replace(protocol, steps=(k,)))[k]
        results.update(measure(pbed.bed, list(dict.fromkeys(choices[k].rows(protocol).values())), [k],
                               protocol.test_seeds, protocol.n_samples, cache, log, draw_row))
    return protocol, choices, results


# -- the last-step control ------------------------------------------------------------------------------------
LAST_STEP_FAMILIES = ("sn-ddpm", "gms closed/pixel")
LAST_STEP_LEVELS = (256, 17, None)  # the Gaussian last step's variance cap: 8-bit levels, the digits' 17, none
MIXTURE_LAST_STEP = "mixture last step"


def last_step_rows(choice: Choice) -> dict[str, tuple[str, str]]:
    """{row name: (label, label it is paired against)}: SN-DDPM and GMS per pixel at their validated c with the
    Gaussian last step capped at each of :data:`LAST_STEP_LEVELS` (paired against the 256-level cap, the library's
    default and so the family's own test cell), and GMS per pixel with the mixture last step (``glast=0``: no
    Gaussian, no cap), paired against the same family's uncapped Gaussian last step, the control that differs from
    it in the last step's distribution alone."""
    rows = {}
    for family in LAST_STEP_FAMILIES:
        base = family_label(family, choice.c[family])
        for levels in LAST_STEP_LEVELS:
            label = base if levels == 256 else f"{base} levels={'none' if levels is None else levels}"
            rows[f"{family}, cap {'none' if levels is None else f'at {levels} levels'}"] = (label, base)
    gms = family_label("gms closed/pixel", choice.c["gms closed/pixel"])
    rows[f"gms closed/pixel, {MIXTURE_LAST_STEP}"] = (f"{gms} glast=0", f"{gms} levels=none")
    return rows


def run_last_step(pbed: ProtocolBed, protocol: Protocol, choices: dict[int, Choice],
                  log=print) -> Results:
    """The test cells of :func:`last_step_rows` at every K (cached with the protocol's cells)."""
    cache = ResultCache(cache_path(pbed))
    draw_row = functools.partial(draw, data_range=pbed.data_range)
    results: Results = {}
    for k, choice in choices.items():
        labels = list(dict.fromkeys(label for label, _ in last_step_rows(choice).values()))
        results.update(measure(pbed.bed, labels, [k], protocol.test_seeds, protocol.n_samples, cache, log, draw_row))
    return results


# -- the calibrated skew shrinkage ----------------------------------------------------------------------------
SKEW_FAMILY = "gms closed/pixel skew=cal"  # GMS per pixel with kappa3 times lambda(t) (quality_study.SKEW_TABLES)


def calibrated_skew_tables(pbed: ProtocolBed, steps: Sequence[int], draws: int = 8,
                           seed: int = 0) -> dict[int, dict[int, float]]:
    """{K: {t: lambda(t)}} for every step of K's trajectory but the data step: ``gk.calibrate_heads`` of the
    testbed's model on its validation reference (held-out data of the training distribution), regressing the
    realised r^3 on the skew of the moments the solver fits (``moments="clamped"``, the step t -> t - T / K),
    each slope clipped to [0, 1] and an undefined one taken as 0 (``HeadCalibration.skew_scale``). Deterministic
    in the model, the reference, ``draws`` and ``seed``, so the cells of :data:`SKEW_FAMILY` are cached by label."""
    from gms_kernels.core.schedule import trajectory
    from gms_kernels.eval.calibration import calibrate_heads

    model, reference = pbed.bed.model(), pbed.bed.references()["validation"]
    schedule = model.schedule
    tables = {}
    for k in steps:
        ts = trajectory(schedule, k)[:-1]  # (the last index, 0, steps to the data: no fit)
        cal = calibrate_heads(model, reference, schedule, ts, draws=draws, seed=seed, moments="clamped",
                              data_range=pbed.data_range, step=schedule.T // k)
        tables[k] = cal.skew_scale()
    return tables


def run_skew_shrinkage(pbed: ProtocolBed, protocol: Protocol, tables: dict[int, dict[int, float]],
                       log=print) -> tuple[dict[int, float], Results]:
    """:data:`SKEW_FAMILY` tuned as every family is: each c of the grid on the validation seeds, the lowest
    validation mean chosen per K, that cell on the test seeds. Returns ({K: chosen c}, the cells)."""
    cache = ResultCache(cache_path(pbed))
    draw_row = functools.partial(draw, data_range=pbed.data_range, skew_tables={"cal": tables})
    key = f"validation/{protocol.primary}"
    chosen: dict[int, float] = {}
    results: Results = {}
    for k in protocol.steps:
        labels = [family_label(SKEW_FAMILY, c) for c in protocol.grid]
        results.update(measure(pbed.bed, labels, [k], protocol.validation_seeds, protocol.n_samples, cache, log,
                               draw_row))
        chosen[k] = min(protocol.grid, key=lambda c: sum(results[(family_label(SKEW_FAMILY, c), k, s)][key]
                                                         for s in protocol.validation_seeds))
        results.update(measure(pbed.bed, [family_label(SKEW_FAMILY, chosen[k])], [k], protocol.test_seeds,
                               protocol.n_samples, cache, log, draw_row))
    return chosen, results
