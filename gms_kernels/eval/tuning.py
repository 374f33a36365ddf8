"""Choosing a model's own solver options on held-out data.

Which GMS variant samples best depends on the data (one mixture component per image can win on natural-image patches
and lose on digits), so a model can carry its own options (``solver_defaults``, see
:func:`gms_kernels.solvers.with_model_defaults`). :func:`choose_options` picks them the way the shipped models' were
picked: every candidate samples at each K over a few seeds (the same initial noise for every candidate at a seed), a
score against held-out data is averaged over the seeds, and the candidate with the lowest mean rank over the K wins.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from .metrics import seed_interval
from ..core.progress import progress_bar
from ..sampling import sample
from ..solvers import get_solver, resolve_options

def mean_ranks(scores: Mapping[tuple[Any, str, int], float], candidates: Sequence[str]) -> dict[str, float]:
    """The choice rule: ``scores[(cell, candidate, K)]`` are mean scores (lower is better; ``cell`` names a data set,
    or anything else the ranks are taken apart for). Each candidate's rank (1 = best) is taken in every (cell, K)
    among the candidates and averaged over them."""
    cells = sorted({(cell, k) for cell, _, k in scores}, key=repr)
    ranks: dict[str, list[int]] = {c: [] for c in candidates}
    for cell, k in cells:
        order = sorted(candidates, key=lambda c: scores[(cell, c, k)])
        for place, c in enumerate(order, start=1):
            ranks[c].append(place)
    return {c: sum(r) / len(r) for c, r in ranks.items()}


@dataclass
class OptionChoice:
    """What :func:`choose_options` measured: ``values[(candidate, K)]`` the score of each seed, ``ranks`` the mean
    ranks, ``best`` the winner's name and ``options`` its options (what to put in ``solver_defaults``)."""

    solver: str
    candidates: dict[str, dict[str, Any]]
    steps: tuple[int, ...]
    values: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    ranks: dict[str, float] = field(default_factory=dict)

    def _order(self) -> list[str]:
        """The candidates by mean rank, ties in the order they were given."""
        return sorted(self.candidates, key=lambda c: (self.ranks[c], list(self.candidates).index(c)))

    @property
    def best(self) -> str:
        return self._order()[0]

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.candidates[self.best])

    def table(self) -> str:
        """Markdown: mean ± 95% half-width over seeds per K, and the mean rank; best first."""
        lines = ["| candidate | " + " | ".join(f"K={k}" for k in self.steps) + " | mean rank |",
                 "|---|" + "---|" * (len(self.steps) + 1)]
        for c in self._order():
            cells = []
            for k in self.steps:
                v = self.values[(c, k)]
                iv = seed_interval(v) if len(v) > 1 else None
                cells.append(f"{iv.mean:.4g} ± {iv.half_width:.2g}" if iv else f"{v[0]:.4g}")
            lines.append(f"| {c} | " + " | ".join(cells) + f" | {self.ranks[c]:.2f} |")
        return "\n".join(lines)


def choose_options(model: Any, reference: torch.Tensor, score: Callable[[torch.Tensor, torch.Tensor], float], *,
                   shape: Sequence[int] | None = None, candidates: Mapping[str, Mapping[str, Any]] | None = None,
                   solver: str = "gms", steps: Sequence[int] = (5, 10, 20), seeds: int = 3, n_samples: int = 1000,
                   first_seed: int = 0, progress: bool = True, **sample_kwargs: Any) -> OptionChoice:
    """Sample ``model`` with each candidate option set at every K in ``steps`` over ``seeds`` seeds (``n_samples``
    each, seeds ``first_seed``, ``first_seed`` + 1, ...: the same initial noise for every candidate at a seed; keep
    them apart from the seeds a test will use), score each run with
    ``score(samples, reference)`` (lower is better, e.g. ``gk.metrics.fd_digits`` or a Frechet distance on
    held-out data that the model was not trained on), and rank the candidates by their mean rank over the K.

    ``candidates``: {name: options} (default: the solver's own, :attr:`gms_kernels.solvers.Solver.candidates`);
    each runs on the library's defaults, never on the model's own ``solver_defaults``, so that the choice does not
    depend on an earlier one. ``shape``: one
    sample's shape (default: ``reference``'s). ``sample_kwargs`` go to every :func:`gms_kernels.sample` call
    (e.g. ``trajectory``, ``backend``, ``data_range``). Then ``model.solver_defaults = {solver: choice.options}``
    makes the winner the model's default. Every option set is checked before any sampling."""
    spec = get_solver(solver)
    candidates = {name: dict(o) for name, o in (spec.candidates if candidates is None else candidates).items()}
    if not candidates:
        raise ValueError(f"choose_options needs at least one candidate (solver {spec.name!r} has none of its own): "
                         "pass candidates={name: options}")
    if seeds < 1 or n_samples < 1 or not steps:
        raise ValueError(f"seeds and n_samples must be >= 1 and steps not empty, got {seeds}, {n_samples}, {steps}")
    if first_seed < 0:
        raise ValueError(f"first_seed must be >= 0, got {first_seed}")
    clash = sorted(set(sample_kwargs) & set(spec.options))
    if clash:
        raise ValueError(f"{', '.join(clash)}: {solver} options go in the candidates, not in choose_options' "
                         "keyword arguments")
    # every option named, so that the model's own defaults cannot fill any in
    full = {name: resolve_options(spec, o) for name, o in candidates.items()}
    shape = tuple(reference.shape[1:] if shape is None else shape)
    choice = OptionChoice(solver, candidates, tuple(steps))
    runs = [(name, k, seed) for k in steps for name in candidates for seed in range(first_seed, first_seed + seeds)]
    for name, k, seed in progress_bar(runs, progress, desc="choose_options"):
        x = sample(model, shape=(n_samples, *shape), steps=k, solver=solver, generator=seed, progress=False,
                   **sample_kwargs, **full[name].as_dict())
        choice.values.setdefault((name, k), []).append(float(score(x, reference)))
    means = {(None, name, k): sum(v) / len(v) for (name, k), v in choice.values.items()}
    choice.ranks = mean_ranks(means, list(candidates))
    return choice
