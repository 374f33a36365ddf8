"""The exact reverse kernel of Gaussian-mixture data (:class:`gms_kernels.eval.oracle.GaussianMixtureOracle`): the
reference every solver's error is measured against. It calls no network."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..core.moments import DataRange
from ..core.schedule import StepCoefficients
from .base import Solver, SolverOptions, StepRandomness, register


@dataclass(frozen=True)
class ExactOptions(SolverOptions):
    """``oracle``: an object with ``exact_step(x_t, k, uniform, noise)`` (gk.sample passes the model when it is one)."""

    oracle: Any = None


class Exact(Solver):
    name, heads, Options = "exact", 0, ExactOptions
    label, requires = "Exact", ("oracle",)

    def step(self, x_t: torch.Tensor, heads: list[torch.Tensor], k: StepCoefficients, rand: StepRandomness,
             o: ExactOptions, data_range: DataRange, T: int) -> tuple[torch.Tensor, dict]:
        if o.oracle is None or not hasattr(o.oracle, "exact_step"):
            raise ValueError("solver 'exact' needs oracle=<gk.GaussianMixtureOracle> (gk.sample passes the "
                             "model when it is one)")
        return o.oracle.exact_step(x_t, k, rand.uniform(False), rand.normal()), {}


register(Exact())
