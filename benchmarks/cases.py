"""Shared inputs and runners for the GMS per-step benchmarks."""
from __future__ import annotations

import time
from typing import Callable, Hashable

import torch

import gms_kernels as gk
from reference_loop import reference_step

SIZES = {"cifar10-b100": (100, 3, 32, 32), "imagenet64-b100": (100, 3, 64, 64)}
FITS = {"closed": {"fit": "closed"}, "adan-25": {"fit": "adan", "fit_iters": 25},
        "adan-70": {"fit": "adan", "fit_iters": 70}}
STEP = (500, 400)  # t -> s


def make_inputs(shape, device="cpu", seed=0):
    """x_t and plausible heads (e2 >= e1^2, mildly skewed e3) in float32."""
    g = torch.Generator().manual_seed(seed)
    x_t = torch.randn(shape, generator=g)
    e1 = 0.5 * torch.randn(shape, generator=g)
    var = 0.1 + 0.4 * torch.rand(shape, generator=g)
    e3 = e1**3 + 3 * e1 * var + 0.05 * torch.randn(shape, generator=g)
    out = torch.cat([e1, e1**2 + var, e3], dim=1)
    return x_t.to(device), out.to(device)


def runner(backend: str, fit: str, x_t: torch.Tensor, out: torch.Tensor, schedule: gk.Schedule,
           options: dict | None = None, solver: str = "gms") -> Callable[[], torch.Tensor]:
    """A zero-argument callable doing one step of ``solver`` with ``backend`` ('reference-loop' =
    baseline (i), GMS only); ``options``: the fit's options (default FITS[fit]; none for sn-ddpm)."""
    t, s = STEP
    options = (FITS[fit] if solver == "gms" else {}) if options is None else options
    if backend == "reference-loop":
        k = schedule.coefficients(t, s)
        c = x_t.shape[1]
        iters = options.get("fit_iters", 25)  # no closed form in the official code: compare to its 25-step fit
        g = torch.Generator(device=x_t.device).manual_seed(0)
        return lambda: reference_step(x_t, out[:, :c], out[:, c:2 * c], out[:, 2 * c:], k, iters, generator=g)
    if backend in ("cpp-kernel", "triton-kernel"):  # the fused kernel alone, without gk.step's checks and dispatch
        from gms_kernels.kernels.dispatch import fused_step
        from gms_kernels.core.random import SampleNoise
        from gms_kernels.solvers import SOLVERS, fused_config, resolve_options

        k = schedule.coefficients(t, s)
        c, n = x_t.shape[1], x_t.shape[0]
        cfg = fused_config(solver, resolve_options(SOLVERS[solver], options), k, (-1.0, 1.0), schedule.T, n,
                          x_t[0].numel())
        noise = SampleNoise.create(0, n)
        seeds, indices = noise.seeds.to(x_t.device), noise.indices.to(x_t.device)
        heads = [out[:, i * c:(i + 1) * c] for i in range(3)]
        if backend == "triton-kernel":  # the finite flag left unread: a read syncs, which a CUDA graph cannot hold
            from gms_kernels.kernels import triton_gms

            flag = torch.zeros(1, dtype=torch.int32, device=x_t.device)
            return lambda: triton_gms.fused_step(x_t, *heads, seeds, indices, cfg, nonfinite_flag=flag)
        return lambda: fused_step("cpp", x_t, *heads, seeds, indices, cfg, False)
    return lambda: gk.step(x_t, out, t, s, schedule, solver, generator=0, backend=backend, **options)


def interleaved_seconds(fns: dict[Hashable, Callable[[], object]], rounds: int, calls: dict[Hashable, int],
                        warmup: int = 1, groups: list[list[Hashable]] | None = None) -> dict[Hashable, list[float]]:
    """Wall times of every call of each fn, measured in turns: each round runs every fn ``calls[name]``
    times, so that a slow phase of a shared machine hits all of them alike. The order rotates from
    round to round: the fn that follows a long one (which evicts the caches) starts cold, and that
    should not always be the same fn. With ``groups`` (lists of names that together hold every name
    once), the groups run one after another and both the groups' order and the order within each
    group rotate."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[Hashable, list[float]] = {name: [] for name in fns}
    groups = [[name] for name in fns] if groups is None else groups
    listed = [name for group in groups for name in group]
    if len(listed) != len(fns) or set(listed) != set(fns):
        raise ValueError("groups must hold every name of fns once")
    rotate = lambda seq, r: seq[r % len(seq):] + seq[:r % len(seq)]
    for r in range(rounds):
        for group in rotate(groups, r):
            for name in rotate(group, r):
                fn = fns[name]
                for _ in range(calls[name]):
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
    return times


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, sync=None) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if sync:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
