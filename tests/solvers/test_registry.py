"""The solver registry: one entry per solver, every other list read from it, options checked once, and solvers of
one's own run without registering."""
from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

import gms_kernels as gk
from gms_kernels.core.moments import transition_moments
from gms_kernels.solvers import SOLVERS, LastStepOptions, Solver, get_solver, resolve_options
from gms_kernels.solvers.base import real

SCHED = gk.Schedule.linear(100)


@dataclass(frozen=True)
class HalfNoiseOptions(LastStepOptions):
    scale: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        self._set("scale", real(self.scale, "scale", 0.0, 1.0, "the factor on the noise"))


class HalfNoise(Solver):
    """DDPM's mean with ``scale`` times its noise: the documented way to build a solver of one's own."""

    name, heads, Options = "half-noise", 1, HalfNoiseOptions

    def step(self, x_t, heads, k, rand, o, data_range, T):
        m1 = transition_moments(x_t, heads[0], None, None, k, data_range).m1
        return m1 + o.scale * math.sqrt(k.lam2) * rand.normal(), {"m1": m1}


def test_a_solver_of_ones_own_runs_without_registering():
    mine = HalfNoise()
    assert mine.name not in SOLVERS and get_solver(mine) is mine
    model = lambda x, t: 0.1 * x  # noqa: E731
    x = gk.sample(model, shape=(3, 1, 2, 2), steps=4, solver=mine, generator=0, progress=False, schedule=SCHED)
    assert torch.isfinite(x).all() and "half-noise" not in gk.SOLVERS
    # scale = 0 is DDPM without its noise, scale = 1 DDPM itself (same stream)
    x_t, e1, z = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3)
    ddpm = gk.step(x_t, e1, 50, 40, SCHED, "ddpm", noise=z)
    torch.testing.assert_close(gk.step(x_t, e1, 50, 40, SCHED, mine, noise=z, scale=1.0), ddpm, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match=r"scale must be a number in \[0, 1\]"):
        gk.step(x_t, e1, 50, 40, SCHED, mine, noise=z, scale=2.0)


def test_options_are_a_checked_frozen_object():
    o = resolve_options("gms", {"weights": [0.25, 0.75], "fit": "adan"}, SCHED.T)
    assert o.weights == (0.25, 0.75) and o.fit == "adan" and o.fit_iters == 25
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.fit = "closed"
    assert resolve_options("gms", o) is o  # resolved once, passed on as it is
    with pytest.raises(ValueError, match="unknown option"):
        resolve_options("ddim", {"fit": "closed"})
    with pytest.raises(ValueError, match="unknown preset"):
        resolve_options("gms", {"preset": "fast"})


def test_gk_step_takes_options_resolved_once():
    x_t, out = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 9, dtype=torch.float64)
    o = get_solver("gms").resolve({"select": "pixel"}, SCHED.T)
    by_name = gk.step(x_t, out, 50, 40, SCHED, "gms", 3, backend="torch", select="pixel")
    assert torch.equal(gk.step(x_t, out, 50, 40, SCHED, "gms", 3, backend="torch", options=o), by_name)
    with pytest.raises(ValueError, match="not both"):
        gk.step(x_t, out, 50, 40, SCHED, "gms", 3, options=o, select="pixel")


def test_the_lists_are_read_from_the_registry():
    from gms_kernels.cli import build_parser
    from gms_kernels.eval.reproduce import PAPER_SOLVERS, REPRODUCIBLE_SOLVERS
    from gms_kernels.integrations.scheduler import SCHEDULER_SOLVERS

    per_step = {name for name, spec in SOLVERS.items() if spec.per_step}
    own_loop = set(SOLVERS) - per_step
    assert {"edm-sde", "seeds-2", "seeds-3", "ggf"} <= own_loop and "seeds-1" in per_step
    assert set(SCHEDULER_SOLVERS) == per_step - {"exact"}
    assert PAPER_SOLVERS == ("ddpm", "ddpm-large", "sn-ddpm", "gms")
    assert set(REPRODUCIBLE_SOLVERS) == set(SOLVERS) - {"exact", "analytic-dpm"}
    choices = {a.dest: a.choices for a in build_parser()._subparsers._group_actions[0].choices["sample"]._actions}
    assert set(choices["solver"]) == set(SOLVERS) - {"exact"}
    fusable = {name for name, spec in SOLVERS.items() if spec.fusable}
    assert fusable == {"gms", "sn-ddpm", "ddpm", "ddpm-large", "ddim", "analytic-dpm"}
    for name, spec in SOLVERS.items():
        assert spec.name == name and spec.heads in (0, 1, 2, 3)
        if spec.calls_per_step is not None:
            assert spec.network_calls(5) == spec.calls_per_step * 5 - (spec.calls_per_step - 1)


def test_the_layers_import_downwards_only():
    """The kernels import no solver, and the sampling loop no model (its default model is installed from above)."""
    code = ("import sys, gms_kernels.kernels, gms_kernels.solvers; "
            "assert not any(m.startswith('gms_kernels.models') for m in sys.modules), sorted(sys.modules); "
            "import gms_kernels.sampling; "
            "assert not any(m.startswith('gms_kernels.models') for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
    import ast
    import inspect

    import gms_kernels.kernels as kernels
    import gms_kernels.sampling as sampling

    for module, banned in ((kernels, "solvers"), (sampling, "models")):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.ImportFrom):
                assert banned not in (node.module or ""), (module.__name__, node.module)
