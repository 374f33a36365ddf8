"""GMS per-step cost on a CUDA GPU: (i) the official loop, (ii) the torch reference, (iv) the Triton kernel.

    python benchmarks/gpu/bench_gpu.py --out benchmarks/results
    TRITON_INTERPRET=1 python benchmarks/gpu/bench_gpu.py --smoke --out /tmp/x   # CPU dry run (tests)

``--smoke`` runs every part of the script at tiny sizes, once each, on the GPU if there is one and
otherwise on the CPU through the Triton interpreter: a check that the script works before device
time is spent on it, not a measurement.

Two times per Triton row:
- ``gk.step`` per call, back to back on one stream: what a sampling loop pays per step, the Python
  launch cost included (the larger of host and device time per call);
- the kernel's device time, from a CUDA graph that runs it over enough input sets to be read from
  HBM rather than the L2 (the graph removes the launch gaps).
Then achieved GB/s and GFLOP/s of the kernel against ceilings measured on the card, a sweep of the
kernel's (BLOCK, num_warps), ADAN's loop in fp64 against the default fp32, and the step's cost as a fraction of
one network call (gms_kernels.models backbones at batch 100, random weights, fp32 and bf16 autocast).
"""
from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
from pathlib import Path
from typing import Callable
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gms_kernels as gk  # noqa: E402
from cases import FITS, SIZES, STEP, make_inputs, median_seconds, runner  # noqa: E402
from gms_kernels.kernels import MODE_ADAN, MODE_CLOSED  # noqa: E402
from gms_kernels.kernels import triton_gms as tg  # noqa: E402
from gms_kernels.model_io import check_inputs_finite  # noqa: E402
from gms_kernels.core.random import SampleNoise  # noqa: E402
from gms_kernels.sampling import DeferredFiniteCheck  # noqa: E402
from gms_kernels.solvers import SOLVERS, fused_config, resolve_options  # noqa: E402
from run_cpu import flops_per_element  # noqa: E402

import triton  # noqa: E402  (after gms_kernels, which does not import it)
import triton.language as tl  # noqa: E402

BYTES_PER_ELEMENT = 20  # reads x_t, e1, e2, e3 and writes x_s, fp32
SWEEP = ((128, 4), (256, 4), (256, 8), (512, 4), (512, 8), (1024, 8))  # (BLOCK, num_warps)
BASELINE_SOLVERS = ("sn-ddpm", "ddpm", "ddim")  # (each in its own mode of the kernel: GAUSSIAN, FIXED, DDIM)


@triton.jit
def _fma_chains(X, OUT, n, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    """Four independent multiply-add chains per element: the card's vector FMA rate (8 flops/iter)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(X + offs, mask=mask, other=1.0)
    b, c, d = a + 1.0, a - 1.0, a * 0.5
    for _ in range(ITERS):
        a = a * 0.9999 + 0.0001
        b = b * 0.9999 + 0.0001
        c = c * 0.9999 + 0.0001
        d = d * 0.9999 + 0.0001
    tl.store(OUT + offs, a + b + c + d, mask=mask)


class Setup:
    """Where and how much to run: the real benchmark on CUDA, or --smoke (tiny, once each)."""

    def __init__(self, smoke: bool):
        self.smoke = smoke
        self.cuda = torch.cuda.is_available()
        self.device = "cuda" if self.cuda else "cpu"
        if not self.cuda and not smoke:
            raise SystemExit("bench_gpu.py needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1 for a dry run)")
        # batch 1 instead of 100 in a dry run, same image sizes (the interpreted Triton kernel's time grows with it)
        self.sizes = {k: ((1,) + v[1:] if smoke else v) for k, v in SIZES.items()}
        self.fits = {k: (dict(v, fit_iters=2) if smoke and "fit_iters" in v else v) for k, v in FITS.items()}
        self.l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size if self.cuda else 2**20

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def seconds(self, fn: Callable[[], object], repeats: int, warmup: int) -> float:
        """Median host time of one synchronised call (for the long baselines)."""
        return median_seconds(fn, repeats=1 if self.smoke else repeats, warmup=0 if self.smoke else warmup,
                              sync=self.sync if self.cuda else None)

    def per_call_seconds(self, fn: Callable[[], object], calls: int = 50, repeats: int = 7) -> float:
        """Seconds per call of ``calls`` back-to-back calls, timed with device events (median of repeats)."""
        if not self.cuda:
            return self.seconds(fn, 1, 0)
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / calls)
        return statistics.median(times)

    def graph_seconds(self, calls: list[Callable[[], object]], replays: int = 20) -> float:
        """Device seconds per call: a CUDA graph runs every call in turn and is replayed; median replay
        time over len(calls). Each call reads its own inputs, so together they are not L2-resident."""
        if not self.cuda:
            return self.seconds(calls[0], 1, 0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile and cache the device tables outside the capture
            for fn in calls:
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in calls:
                fn()
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / len(calls))
        del graph
        return statistics.median(times)

    def input_sets(self, shape) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Enough (x_t, model output) sets that their bytes are 4x the L2 (one set in a dry run)."""
        per_set = BYTES_PER_ELEMENT * math.prod(shape)
        count = 1 if self.smoke else max(2, math.ceil(4 * self.l2_bytes / per_set))
        return [make_inputs(shape, self.device, seed=i) for i in range(count)]


def ceilings(env: Setup) -> dict[str, float]:
    """The card's measured ceilings: device copy GB/s (read + write), fp32 matmul TFLOP/s (TF32 off),
    fp32 and fp64 vector FMA TFLOP/s."""
    out = {}
    n = 2**20 if env.smoke else 2**28  # 1 GiB of fp32
    src = torch.randn(n, device=env.device)
    dst = torch.empty_like(src)
    out["copy GB/s"] = 2 * n * 4 / env.seconds(lambda: dst.copy_(src), repeats=10, warmup=3) / 1e9
    m = 256 if env.smoke else 8192
    a = torch.randn(m, m, device=env.device)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        out["fp32 matmul TFLOP/s"] = 2 * m**3 / env.seconds(lambda: a @ a, repeats=5, warmup=2) / 1e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    iters, block = (4, 128) if env.smoke else (4096, 256)
    count = block * 8 if env.smoke else torch.cuda.get_device_properties(0).multi_processor_count * 2048 * 8
    for dtype in (torch.float32, torch.float64):
        x = torch.rand(count, device=env.device, dtype=dtype)
        y = torch.empty_like(x)
        grid = (triton.cdiv(count, block),)
        fn = lambda: _fma_chains[grid](x, y, count, ITERS=iters, BLOCK=block)
        sec = env.seconds(fn, repeats=5, warmup=1)
        out[f"{str(dtype)[6:]} FMA TFLOP/s"] = 8 * iters * count / sec / 1e12
    return out


def networks(env: Setup) -> dict[str, tuple[torch.nn.Module, torch.Tensor, torch.Tensor]]:
    """The paper's backbones with random weights, and an input batch (100; 1 in a dry run) for each."""
    from gms_kernels import models

    out = {}
    for size, make in {"cifar10-b100": models.PytorchDDPMUNet, "imagenet64-b100": models.IDDPMUNet.imagenet64}.items():
        net = make().to(env.device).eval()
        shape = (1,) + SIZES[size][1:] if env.smoke else SIZES[size]
        x = torch.randn(shape, device=env.device)
        t = torch.full((x.shape[0],), 500, device=env.device)
        t = t if getattr(net, "time_input", "index") != "scaled" else t.float() * 1000 / net.schedule.T
        out[size] = (net, x, t)
    return out


@torch.no_grad()
def network_call_seconds(env: Setup, nets) -> dict[str, dict[str, float]]:
    """One forward pass of each backbone in fp32 (torch's default TF32 settings) and under bf16 autocast."""
    out = {}
    for size, (net, x, t) in nets.items():
        for _ in range(0 if env.smoke else 10):  # the card's clocks up from idle
            net(x, t)
        out[size] = {"fp32": env.per_call_seconds(lambda: net(x, t), calls=3, repeats=5)}
        with torch.autocast(env.device, dtype=torch.bfloat16):
            out[size]["bf16"] = env.per_call_seconds(lambda: net(x, t), calls=3, repeats=5)
    return out


@torch.no_grad()
def loop_overhead(env: Setup, nets, schedule: gk.Schedule, turns: int = 7) -> list[str]:
    """What GMS adds to a sampling loop (gk.sample with 10 steps: 11 network calls) with an fp32
    backbone whose heads are its eps and fixed e2, e3: (a) the model and gk.step by hand (gk.step
    reads the finite flag at once: a sync per step), (b) gk.sample (reads each step's flag after the
    next network call is queued), (c) gk.step by hand with its flag read likewise, against the model
    calls alone. In turns (each turn starts one later in the order, so that no variant always follows
    the same one), ``turns`` of each; medians; per network call. Every timing is printed."""
    rows = []
    steps = 1 if env.smoke else 10
    calls = len(gk.trajectory(schedule, steps, "even"))  # network calls of gk.sample (steps + 1: the last goes to data)
    for size, (net, x, _) in nets.items():
        x_t, out = make_inputs(env.sizes[size][:1] + x.shape[1:] if env.smoke else env.sizes[size], env.device)
        c = x_t.shape[1]
        time_input = getattr(net, "time_input", "index")
        model = lambda x_in, t_in: torch.cat([net(x_in, t_in)[:, :c], out[:, c:]], 1)  # e1 of the net, e2, e3
        t_in = torch.full((x_t.shape[0],), 500, device=env.device)
        t_in = t_in if time_input != "scaled" else t_in.float() * 1000 / schedule.T
        for fit in ("closed", "adan-25"):
            options = env.fits[fit]

            def alone():
                for _ in range(calls):
                    model(x_t, t_in)

            def by_hand():
                for _ in range(calls):
                    gk.step(x_t, model(x_t, t_in), *STEP, schedule, "gms", generator=0, backend="triton", **options)

            def by_hand_deferred():  # as GMSScheduler does: each step's flag read after the next network call
                pending = None
                for _ in range(calls):
                    output = model(x_t, t_in)
                    if pending is not None:
                        pending.raise_if_set()
                    pending = DeferredFiniteCheck(x_t, [], "")
                    gk.step(x_t, output, *STEP, schedule, "gms", generator=0, backend="triton",
                            nonfinite_flag=pending.flag, **options)
                    pending.launched()
                pending.raise_if_set()

            def sampled():
                gk.sample(model, x_T=x_t, steps=steps, schedule=schedule, generator=0, progress=False,
                          time_input=time_input, backend="triton", **options)
            fns = {"alone": alone, "by hand": by_hand, "by hand, deferred": by_hand_deferred, "gk.sample": sampled}
            times = {name: [] for name in fns}
            names = list(fns)
            for turn in range(1 if env.smoke else turns):  # in turns, so that clock changes hit all alike
                for name in names[turn % len(names):] + names[:turn % len(names)]:
                    times[name].append(env.per_call_seconds(fns[name], calls=1, repeats=1) / calls)
            print(f"{size} {fit}, ms per network call, every turn:",
                  {name: [round(v * 1e3, 2) for v in times[name]] for name in fns}, flush=True)
            base, *others = (statistics.median(times[name]) for name in fns)
            rows.append(f"| {size} | {fit} | {base * 1e3:.2f} ms | " + " | ".join(
                f"{v * 1e3:.2f} ms: {(v - base) * 1e6:+.0f} us ({100 * (v - base) / base:+.2f}%)" for v in others) + " |")
            print(rows[-1], flush=True)
    return rows


@torch.no_grad()
def sde_loop(env: Setup, nets, schedule: gk.Schedule, turns: int = 5) -> list[str]:
    """EDM-SDE (10 steps: 19 network calls) with the backbones at batch 100 (cifar10 also at 8): the NaN/inf check
    of each network output read at once (a sync per call, as before EpsFunction deferred it) against
    read once at the end (gk.sample), and the model calls alone; medians of ``turns``, per network call."""
    from gms_kernels.sampling import _plan
    from gms_kernels.solvers import EpsFunction
    rows = []
    cases = ([("cifar10-b100", 1)] if env.smoke
             else [("cifar10-b100", 100), ("cifar10-b100", 8), ("imagenet64-b100", 100)])
    for size, batch in cases:
        net, x, t = nets[size]
        x_t = torch.randn((batch,) + x.shape[1:], device=env.device)
        spec, options, data_range, _, time_input, ts = _plan(net, 1 if env.smoke else 10, "edm-sde", schedule,
                                                             "even", (-1.0, 1.0), None, {})
        calls = spec.network_calls(len(ts))
        t_in = t[:batch]

        def run(defer: bool):
            e1 = EpsFunction(net, schedule.T, time_input, "edm-sde", x_t.dtype, defer)
            spec.loop(e1, x_t, ts, schedule, SampleNoise.create(0, batch), data_range, options)
            e1.raise_if_nonfinite()

        fns = {"alone": lambda: [net(x_t, t_in) for _ in range(calls)],
               "read per call": lambda: run(False), "read at the end": lambda: run(True)}
        times = {name: [] for name in fns}
        for _ in range(1 if env.smoke else turns):
            for name, fn in fns.items():
                times[name].append(env.per_call_seconds(fn, calls=1, repeats=1) / calls)
        base, per_call, deferred = (statistics.median(times[name]) for name in fns)
        rows.append(f"| {size.split('-')[0]} | {batch} | {base * 1e3:.2f} ms | {per_call * 1e3:.2f} ms | "
                    f"{deferred * 1e3:.2f} ms ({100 * (per_call - deferred) / per_call:+.1f}% against read per call) |")
        print(rows[-1], flush=True)
    return rows


def step_breakdown(env: Setup, schedule: gk.Schedule) -> list[str]:
    """Per-call time of the parts of gk.step at the CIFAR10 size, closed fit, calls back to back."""
    x_t, out = make_inputs(env.sizes["cifar10-b100"], env.device)
    n, c = x_t.shape[0], x_t.shape[1]
    heads = [out[:, i * c:(i + 1) * c] for i in range(3)]
    cfg = fused_config("gms", resolve_options(SOLVERS["gms"], FITS["closed"]), schedule.coefficients(*STEP), (-1.0, 1.0),
                       schedule.T, n, x_t[0].numel())
    noise = SampleNoise.create(0, n)
    seeds, indices = noise.seeds.to(env.device), noise.indices.to(env.device)
    flag = torch.zeros(1, dtype=torch.int32, device=env.device)
    parts = {
        "gk.step (all of it: its flag read is one sync)": runner("triton", "closed", x_t, out, schedule),
        "gk.step given a nonfinite_flag (no sync)": lambda: gk.step(
            x_t, out, STEP[0], STEP[1], schedule, "gms", generator=0, nonfinite_flag=flag, **FITS["closed"]),
        "launcher + kernel + finite flag read (one sync)": lambda: tg.fused_step(
            x_t, *heads, seeds, indices, cfg),
        "launcher + kernel, flag left unread (no sync)": lambda: tg.fused_step(
            x_t, *heads, seeds, indices, cfg, nonfinite_flag=flag),
        "launcher + kernel, flag unread, seeds and indices copied from the host (pinned, no sync)": lambda: tg.fused_step(
            x_t, *heads, noise.seeds, noise.indices, cfg, nonfinite_flag=flag),
        "SampleNoise.create (host only)": lambda: SampleNoise.create(0, n),
        "separate finite check of x_t and 3 heads (4 reductions, 4 syncs)": lambda: check_inputs_finite(x_t, heads),
    }
    rows = []
    for name, fn in parts.items():
        rows.append(f"| {name} | {env.per_call_seconds(fn) * 1e6:.1f} us |")
        print(rows[-1], flush=True)
    return rows


def kernel_calls(sets, fit: str, options: dict, schedule: gk.Schedule) -> list[Callable[[], object]]:
    return [runner("triton-kernel", fit, x_t, out, schedule, options) for x_t, out in sets]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"))
    p.add_argument("--smoke", action="store_true", help="tiny sizes, once each, CPU allowed: a dry run")
    p.add_argument("--loop-only", type=int, metavar="TURNS", default=0,
                   help="only the network calls and the sampling-loop table, with TURNS turns; printed, not written")
    p.add_argument("--sde-only", type=int, metavar="TURNS", default=0,
                   help="only the network calls and the EDM-SDE check table, with TURNS turns; printed, not written")
    args = p.parse_args()
    env = Setup(args.smoke)
    card = torch.cuda.get_device_name() if env.cuda else "cpu"
    if env.smoke:
        card += "-smoke"
    schedule = gk.Schedule.linear()
    models = networks(env)
    nets = network_call_seconds(env, models)
    print("network calls:", nets, flush=True)
    if args.sde_only:
        print("\n".join(sde_loop(env, models, schedule, turns=args.sde_only)))
        return
    if args.loop_only:
        print("\n".join(loop_overhead(env, models, schedule, turns=args.loop_only)))
        return
    loop = loop_overhead(env, models, schedule)
    sde_rows = sde_loop(env, models, schedule)
    breakdown = step_breakdown(env, schedule)
    peaks = ceilings(env)
    print("ceilings:", peaks, flush=True)
    rows, perf, sweep, precision_rows, baseline_rows = [], [], [], [], []
    for size, shape in env.sizes.items():
        sets = env.input_sets(shape)
        x_t, out = sets[0]
        n = x_t.numel()
        net32, net16 = nets[size]["fp32"], nets[size]["bf16"]
        kernel_of = {}
        for fit, options in env.fits.items():
            base = env.seconds(runner("reference-loop", fit, x_t, out, schedule, options), repeats=3, warmup=1)
            ref = env.seconds(runner("torch", fit, x_t, out, schedule, options), repeats=3, warmup=1)
            step = env.per_call_seconds(runner("triton", fit, x_t, out, schedule, options))
            kernel = kernel_of[fit] = env.graph_seconds(kernel_calls(sets, fit, options, schedule))
            rows.append(f"| {size} ({n:,}) | {fit} | {base * 1e3:.2f} ms | {ref * 1e3:.2f} ms ({base / ref:.1f}x) | "
                        f"{step * 1e6:.1f} us ({base / step:.0f}x) | {kernel * 1e6:.1f} us ({base / kernel:.0f}x) | "
                        f"{100 * step / net32:.3f}% / {100 * step / net16:.3f}% | "
                        f"{100 * kernel / net32:.3f}% / {100 * kernel / net16:.3f}% |")
            print(rows[-1], flush=True)
            gb = BYTES_PER_ELEMENT * n / kernel / 1e9
            gf = flops_per_element(fit, options) * n / kernel / 1e9
            perf.append(f"| {size} | {fit} | {kernel * 1e6:.1f} us | {gb:.0f} GB/s ({100 * gb / peaks['copy GB/s']:.0f}%) | "
                        f"{gf:.0f} GFLOP/s ({100 * gf / (peaks['float64 FMA TFLOP/s'] * 1e3):.0f}% of fp64, "
                        f"{100 * gf / (peaks['float32 FMA TFLOP/s'] * 1e3):.0f}% of fp32) |")
            if fit != "closed":  # the ADAN loop in fp64 instead of the default fp32
                wide = env.graph_seconds(kernel_calls(sets, fit, dict(options, adan_precision="float64"), schedule))
                precision_rows.append(f"| {size} | {fit} | {kernel * 1e6:.1f} us | {wide * 1e6:.1f} us | {wide / kernel:.2f}x |")
                print(precision_rows[-1], flush=True)
        # the baselines in the same kernel (their own modes), against the closed-form GMS step
        cells = []
        for solver in BASELINE_SOLVERS:
            sec = env.graph_seconds([runner("triton-kernel", "closed", x, o, schedule, {}, solver=solver) for x, o in sets])
            cells.append(f"{sec * 1e6:.1f} us ({sec / kernel_of['closed']:.2f}x)")
        baseline_rows.append(f"| {size} | {kernel_of['closed'] * 1e6:.1f} us | " + " | ".join(cells) + " |")
        print(baseline_rows[-1], flush=True)
        if size == "imagenet64-b100":  # launch configurations of the two fits, at the larger size
            for fit in ("closed", "adan-25"):
                mode = MODE_CLOSED if fit == "closed" else MODE_ADAN
                default = tg.GPU_CONFIGS[mode]
                calls = kernel_calls(sets, fit, env.fits[fit], schedule)  # (they read the settings at launch)
                cells = []
                for config in (SWEEP[:1] if env.smoke else SWEEP + (default,)):  # the default twice: the spread
                    with mock.patch.dict(tg.GPU_CONFIGS, {mode: config}):
                        sec = env.graph_seconds(calls)
                    mark = " (default)" if config == default else ""
                    cells.append(f"{config[0]}x{config[1]}{mark}: {sec * 1e6:.1f} us")
                sweep.append(f"| {fit} | " + " | ".join(cells) + " |")
                print(sweep[-1], flush=True)
        del sets
        if env.cuda:
            torch.cuda.empty_cache()

    date = datetime.date.today().isoformat()
    props = (f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs, "
             f"{env.l2_bytes / 2**20:.0f} MiB L2, " if env.cuda else "")
    lines = [f"# GMS per-step cost on {card}", "", "Command: `bash benchmarks/gpu/run_gpu.sh`", "",
             f"{card} ({props}torch {torch.__version__}, triton {triton.__version__}), {date}.", "",
             "## Per-step cost, as ratios to (i)", "",
             "| elements | fit | (i) reference loop | (ii) torch reference (fp64) | (iv) triton via gk.step, per call | "
             "(iv) triton kernel, device time | gk.step / one network call (fp32 / bf16) | "
             "kernel / one network call (fp32 / bf16) |",
             "|---|---|---|---|---|---|---|---|", *rows, "",
             "(i) and (ii): median of synchronised calls. gk.step: 50 calls back to back on one stream, timed "
             "with device events (median of 7), so the Python launch cost is in it. Kernel: a CUDA graph of the "
             "kernel over input sets totalling 4x the L2, replayed (median of 20), so inputs come from HBM "
             "and no launch gap is counted. The closed-form rows compare with (i) at 25 iterations, since "
             "the official code has no closed form.", "",
             "One network call at batch 100 (random weights; "
             + ", ".join(f"{k}: {type(v[0]).__name__}, {sum(q.numel() for q in v[0].parameters() if q.requires_grad) / 1e6:.1f}M trained parameters"
                         for k, v in models.items())
             + "; events around 3 back-to-back calls, median of 5): "
             + ", ".join(f"{k}: {v['fp32'] * 1e3:.2f} ms fp32, {v['bf16'] * 1e3:.2f} ms bf16 autocast"
                         for k, v in nets.items()) + ".", "",
             "## In a sampling loop", "",
             "`gk.sample` with 10 steps (11 network calls: the last step goes to data) and an fp32 backbone "
             "whose output is its eps and fixed e2, e3 heads (one `torch.cat`); per network call: the model "
             "alone; the model and `gk.step` by hand (gk.step reads the kernel's NaN/inf flag at once: one sync "
             "per step); the same with `nonfinite_flag=` read once the next network call is queued (as "
             "`GMSScheduler` does); `gk.sample` (which defers the same way). 7 of each, in turns; medians.", "",
             "| size | fit | model alone | model + gk.step (added, share) | model + gk.step, flag read a step later "
             "(added, share) | gk.sample (added, share) |",
             "|---|---|---|---|---|---|", *loop, "",
             "## EDM-SDE's NaN/inf check: read per network call, or once at the end", "",
             "`gk.sample(solver=\"edm-sde\")`'s loop, 10 steps (19 network calls), fp32 backbones (random "
             "weights); per network call, median of 5 turns.", "",
             "| backbone | batch | model alone | read per call | read at the end (gk.sample) |", "|---|---|---|---|---|",
             *sde_rows, "",
             "## Where gk.step's time goes (cifar10-b100, closed, calls back to back)", "",
             "| part | per call |", "|---|---|", *breakdown, "",
             "## Against the card's measured ceilings", "",
             "Ceilings: " + ", ".join(f"{k} {v:,.1f}" for k, v in peaks.items())
             + " (copy of 1 GiB counting read + write; 8192^3 matmul with TF32 off; a Triton kernel of four "
               "independent FMA chains per thread).", "",
             f"| elements | fit | kernel device time | achieved bandwidth ({BYTES_PER_ELEMENT} B / element) | "
             "achieved arithmetic (flops per element as in cpu.md) |",
             "|---|---|---|---|---|", *perf, "",
             "## ADAN's loop in fp32 (the default) and fp64 (`adan_precision=\"float64\"`)", "",
             "| elements | fit | fp32 loop | fp64 loop | fp64 / fp32 |", "|---|---|---|---|---|", *precision_rows, "",
             "## The baselines in the same kernel (device time; ratio to the closed-form GMS step)", "",
             "| size | gms, closed | " + " | ".join(BASELINE_SOLVERS) + " |",
             "|---|---|" + "---|" * len(BASELINE_SOLVERS), *baseline_rows, "",
             "## Launch configurations (BLOCK x num_warps), kernel device time, imagenet64-b100", "",
             "(ADAN's register cap: benchmarks/gpu/sweep_registers.py, which run_gpu.sh runs next.)", "",
             "The default is timed twice: the difference between them is the noise.", "",
             "| fit | configurations |", "|---|---|", *sweep]
    if env.smoke:
        lines[0] += " (dry run at tiny sizes: not a measurement)"
    name = f"gpu-{card.replace(' ', '_')}-{date}.md"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {Path(args.out) / name}")


if __name__ == "__main__":
    main()
