"""Samples of every solver on the shipped models, for fixed seeds, equal the stored ones bit for bit.

The stored file pins what a seed means: a refactoring that changes one draw, one rounding or one step
of any solver fails here. Bit equality holds on a machine like the one that stored them (same best
vector target, same torch version: the network's float32 convolutions round by the CPU's vector width);
elsewhere the samples must agree to float32 rounding. Regenerate it only for an intended change of samples:
``python tests/sampling/test_embedded_samples.py`` adds the cases of new solvers and refuses to change a stored
case unless given ``--replace`` (then say in the commit why the samples changed).
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

import gms_kernels as gk
from gms_kernels.kernels.cpp import cpu_info
from gms_kernels.models.embedded import default_model, patches_model

STORED = Path(__file__).resolve().parents[1] / "data" / "embedded_samples.pt"
STEPS = 6
SEED = 7
BATCH = 5


# option variants beyond each solver's defaults: key -> (solver, options)
VARIANTS = {"gms[official]": ("gms", {"preset": "official"}),
            "gms[adan,sample]": ("gms", {"fit": "adan", "select": "sample"}),
            "ggf": ("ggf", {"eps_abs": 0.05, "eps_rel": 0.1})}  # (looser tolerances: fewer adaptive calls)


@functools.lru_cache(maxsize=None)
def _gamma(model_name: str) -> torch.Tensor:
    """analytic-dpm's Gamma table of one model, estimated once for all its cases (torch and auto)."""
    model = default_model() if model_name == "digits" else patches_model()
    x0 = gk.data.digits("train")[0][:64] if model_name == "digits" else gk.data.patches("train")[:64]
    schedule = gk.Schedule.linear(1000)
    times = gk.trajectory(schedule.T, STEPS)
    return gk.estimate_gamma(model, x0, schedule, times, generator=torch.Generator().manual_seed(0))


def _solver_options(name: str, model_name: str) -> dict:
    return {"gamma": _gamma(model_name)} if name == "analytic-dpm" else {}


def cases() -> list[tuple[str, str, str]]:
    """(model, solver or variant, backend); 'exact' needs exact heads and has its own tests."""
    names = sorted(set(gk.SOLVERS) - {"exact"} | set(VARIANTS))
    return [(model, name, backend) for model in ("digits", "patches") for name in names
            for backend in ("torch", "auto")]


def draw(model_name: str, name: str, backend: str) -> torch.Tensor:
    model = default_model() if model_name == "digits" else patches_model()
    schedule = gk.Schedule.linear(1000)
    solver, options = VARIANTS.get(name, (name, {}))
    options = {**_solver_options(solver, model_name), **options}
    # one thread: the network's float32 sums then have one order, whatever the machine's core count
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return gk.sample(model, (BATCH, 1, 8, 8), steps=STEPS, solver=solver, schedule=schedule,
                         generator=SEED, progress=False, backend=backend, **options)
    finally:
        torch.set_num_threads(threads)


def machine() -> str:
    return f"{cpu_info()['best']} torch {torch.__version__}"


@functools.lru_cache(maxsize=None)
def _stored() -> dict:
    return torch.load(STORED, weights_only=True)


def stored_cases() -> list[tuple[str, str, str]]:
    """The cases of the stored file: every solver there when it was stored (one added since has its own tests, and
    no samples from before to keep)."""
    keys = [key.split("/") for key in torch.load(STORED, weights_only=True) if key != "machine"]
    return sorted((model, name, backend) for model, name, backend in keys)


@pytest.mark.parametrize("model_name,solver,backend", stored_cases())
def test_samples_equal_the_stored_ones_bit_for_bit(model_name, solver, backend):
    key = f"{model_name}/{solver}/{backend}"
    stored = _stored()
    assert key in stored, f"no stored samples for {key}: regenerate {STORED.name} (see this module's docstring)"
    samples = draw(model_name, solver, backend)
    if stored["machine"] == machine():
        assert torch.equal(samples, stored[key])
    else:
        torch.testing.assert_close(samples, stored[key], rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    # adds the cases of solvers registered since; a stored case whose samples changed is an error unless
    # --replace says the change is intended
    previous = torch.load(STORED, weights_only=True) if STORED.exists() else {}
    samples, changed = {"machine": machine()}, []
    for model_name, solver, backend in cases():
        key = f"{model_name}/{solver}/{backend}"
        samples[key] = draw(model_name, solver, backend)
        if key in previous and not torch.equal(samples[key], previous[key]):
            changed.append(key)
        print(key, tuple(samples[key].shape), "changed" if key in changed else "", file=sys.stderr)
    if changed and "--replace" not in sys.argv:
        sys.exit(f"samples changed for {', '.join(changed)}: nothing written (pass --replace if that is intended)")
    torch.save(samples, STORED)
