"""GMS per-step cost on this CPU, every backend side by side in one run, as ratios to baseline (i).

    python benchmarks/run_cpu.py [--runs 3]   # writes benchmarks/results/cpu.md
    python benchmarks/run_cpu.py --targets [--out-tag TAG]  # only the CPU targets side by side: writes
                                # benchmarks/results/cpu-targets[-TAG].md and cpu-avx2[-TAG].md
    python benchmarks/run_cpu.py --adan-loop avx2   # one target's ADAN loop alone: time, instruction mix, bounds

The C++ extension holds the kernels compiled for several CPU targets (x86-64: avx512, avx2, sse2)
and runs the best one this CPU has; the targets section runs each one in turn on the same inputs
(gk.kernels.set_cpu_target), interleaved with (i), and states each target's FMA roofline.

(i) the official code's loop re-implemented (autograd + ADAN optimizer object + mean loss, fp32);
(ii) the torch reference (float64); (iii) the C++ extension; (iv) Triton (GPU only: see benchmarks/gpu).
The official code has no closed-form fit, so closed-form rows are compared with (i) at 25 iterations.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gms_kernels as gk  # noqa: E402
from gms_kernels.kernels.dispatch import backend_available  # noqa: E402
from cases import FITS, SIZES, interleaved_seconds, make_inputs, median_seconds, runner  # noqa: E402

# Floating-point work per element of the fused C++ step, counted operation by operation in the code
# (csrc/step_target.cpp: moments_vec for the data range [-1, 1], closed_fit_w with cbrt_w, adan_fit and
# the ADAN loop, box_muller and mix_vec): an FMA counts as 2; a multiply, add, compare, min, max, square
# root or division as 1 (a division as 1 also where it is a reciprocal estimate and Newton steps); selects,
# absolute values, signs, conversions and the integer Philox work as 0. Recounted on 2026-11-29: before,
# moments 60, closed 30 and sampling 30 were estimates and the ADAN iteration was counted as 96 (its
# numerator as 3 flops, from the form before the state was rescaled: m' + rho v' is one FMA).
FLOPS_MOMENTS = 64        # x^2 1, x0 mean 7 / var 3 / m2 10 / m3 14, clamps 9, M1 3, Var 2, M3 15 (double)
FLOPS_ADAN_ITER = 93      # residuals 22, gradients 18, three ADAN updates 51, beta clamp 2 (float)
FLOPS_ADAN_SETUP = 18     # kappa3 6, float32 range check 4, initial state 5, the mixture's parameters 3
FLOPS_CLOSED = 52         # var clamp 1, kappa3 6, kappa3 / denom 5, knee line 2, cube root 24, knee choice 2,
#                           s2 and its floor 5, sqrt 1, delta and sd 2, mu1 mu2 4 (double; recounted 2026-11-29:
#                           67 before the knee's division and the regular cube root)
FLOPS_SAMPLING = 31       # per normal: uniforms 2, log 9, cos / sin 14, radius 2; the draw 4 (uniform, compare, sd z, add)


# What was learnt about the ADAN loop on each machine it was measured on (the VM's processor differs
# from one machine to the next). Throw-away variants of benchmarks/cpp/adan_loop_bench.cpp, not kept; one
# thread, each against the unchanged loop in the same minute (single runs vary by about 5%).
ROOFLINE_NOTES = {
    "Intel Xeon @ 2.80GHz (AVX-512 on two 512-bit FMA units), 2026-11-25/26": (
        "The VM exposes no hardware counters, so the gap between the loop and its bounds was narrowed "
        "down with variants: dropping the 3 square roots, the 3 divisions, or both, changed nothing; "
        "dropping the 12 stores of the optimizer state made it about 10% faster, dropping them and the "
        "square roots and divisions about 35%; adding one independent Philox4x32-10 vector (8 lanes, about "
        "58 integer vector instructions) per 16 lanes made it slower by that code's full stand-alone cost. "
        "So the vector ports have no idle cycles to lend (which also rules out hiding the normals' Philox "
        "work inside the fit): they are busier than the instruction count at the FMA rate suggests (square "
        "roots and reciprocal estimates are several micro-ops each on these cores, and register copies take "
        "issue slots), and the state stores add to it. One thing did help: the loop read the 13 iteration "
        "constants through a reference, and since the state stores might alias them the compiler reloaded "
        "them from memory on every vector; reading them from a local copy keeps them in registers and made "
        "the loop about 14% faster, with bit-identical results. Also measured and not faster: two vectors "
        "per pack (statement-level interleaving), an array-of-structures layout of the state, true "
        "divisions for one, two or three of the parameters, -funroll-loops, -mtune=icelake-server, "
        "64-element blocks; and earlier: the vectorised per-element loop with true divisions, "
        "register-resident state over all iterations (spills, or a single latency-bound chain), deeper "
        "software pipelining (two vectors of lag), blocks of 128 or 512 elements, rsqrt14 plus Newton "
        "instead of vsqrtps. The loop kept issues the square roots and divisions of vector i-1 after the "
        "FMA work of vector i."),
    "AMD EPYC (Zen 4: 512-bit instructions on 256-bit units; GCC 12 targets it as znver3), 2026-11-26": (
        "Its divider is twice as fast as the Intel core's per instruction (vdivps zmm above) while a "
        "512-bit FMA issues at half the rate, so there the three divisions are true divisions "
        "(GMS_TRUE_DIVISION in csrc/gms_step.cpp): 5% faster, three runs of three (10.1 against 10.6 ms). "
        "Not faster there: two ADAN iterations per pass over a block (state kept in registers between them; "
        "33% slower: each vector's work becomes one long dependency chain), -fschedule-insns "
        "-fsched-pressure, -funroll-loops (16% slower), blocks of 128 or 512 elements, the portable loop "
        "vectorised by GCC at 512 bits (4% slower) or 256 bits (31% slower), the software-pipelined loop on "
        "256-bit vectors (14% slower), square roots from vrsqrt14ps and a Newton step (12% slower: that moves "
        "divider work onto the FMA units, the tighter of the two). Without its square roots the loop was 14% "
        "faster, so it is not bound by them either. The torch ops of (i) run about 1.8x faster "
        "on this machine than on the Intel one (157 / 210 ms per step, fastest / median call, against "
        "287 / 406 ms), while the fused loop takes about the same time per element (10.1-12.0 against "
        "11.2 ms on one thread): the ratio to (i) is that much lower here. Even at its throughput bound "
        "(the sentence above) the loop would leave ADAN-25 short of 50x on this machine."),
    "AMD EPYC (Zen 3, family 25 model 1: AVX2 and FMA, no AVX-512), 2026-11-28": (
        "The avx2 target runs natively. Its divider is fast (0.94 vdivps ymm and 0.59 vsqrtps ymm per ns, "
        "against 5.7-5.9 vfmadd ymm), and the loop's 57 FP instructions per 8 lanes would take 9.9 ns on the "
        "two FMA pipes (less, since two FP-add pipes take the adds), but the loop takes 15.6-17.7 ns "
        "(`--adan-loop avx2`, three runs): 56-63% of that bound. One vector's iteration is a dependent chain "
        "of FMAs, a square root and a division, and the 116-instruction loop body lets the out-of-order "
        "window hold about two of them: most likely the loop is bound by that latency, not by a unit (an "
        "inference; the VM has no counters). No variant was tried on this machine (cpu-avx2-amd-epyc-zen3.md)."),
    "AMD EPYC (Zen 4, family 25 model 17), the avx2 target forced, 2026-11-29": (
        "The two-stage loop (`--adan-loop avx2`) took 12.2 ns per 8 lanes and iteration against 7.8 ns for "
        "its 57 FMA-unit instructions and 6.5 ns for its divider work: 64% of its throughput bound. Each "
        "variant of it, three runs against it in the same minute (11.7 ms, one thread): the divider stage "
        "of vector i-1 issued before the FMA work of vector i 9% slower (12.8 ms); the divisions as vrcpps "
        "and a Newton step 9% slower (12.8 ms); two vectors per loop pass 3% slower (12.1 ms); two "
        "vectors of lag 4% slower (12.3 ms). As on Zen 3 the loop looks bound by its dependency chain "
        "(about 90 cycles from a parameter to its update) and by how many 116-instruction bodies the "
        "out-of-order window holds. What did pay (11.3 ns, 69% of the bound): a third pipeline stage (gradients of vector i, moment "
        "updates of i-1, square roots and divisions of i-2; 5496c9f), 8-9% faster on avx2 (10.8-11.0 ms), "
        "4-5% on avx512, 5% on sse2; and in the closed fit 8 vectors per pass instead of 4 (c561460), 10-11% "
        "faster on avx2 and sse2. Slower than the three stages: their other orders (4-11%), a fourth stage "
        "for the square roots (7%) or for the residuals apart from the gradients (7%), the moment updates read back from the state arrays (3%). "
        "Later (2f4e10f): the normals' log, cos and sin as float32 polynomials instead of double ones made the ddpm step 26% and "
        "the closed step 8% faster on avx2 (one thread). Not faster: 2 M1 and 3 M1 formed in the loop instead of read from "
        "their arrays (bit-identical; 11.4-14.5 against 11.0-11.6 ms, the ADAN loop alone, one thread), the closed fit's double square root as a float32 "
        "square root and reciprocal plus one Newton step in double (0.98-1.00 against 0.94-0.95 ms for the fit alone). "
        "Not faster either (2026-11-29): the three stages run across iterations as one pipeline "
        "(the last two vectors of iteration k finished in the first passes of k + 1, so it never drains; bit-identical, "
        "11.03-11.26 against 11.06-11.30 ms, three alternating runs): the out-of-order core already overlaps the drain. "
        "What did pay (2026-11-29): the compiled avx2 loop spilled 39 of its 128 instructions' "
        "operands to the stack, 18 of them because GCC's predictive commoning kept the parameters loaded in the first "
        "stage in registers (rotated through stack slots) until the third instead of loading them again; built with "
        "-fno-predictive-commoning (setup.py) the loop has 21 stack operands and ADAN-25 is 3-4% faster on avx2 and "
        "2-3% on avx512, the closed and sn-ddpm steps unchanged (`python benchmarks/compare_build.py --without-flag="
        "-fno-predictive-commoning --target avx2`, two runs; avx512 one). Then the third stage reading its numerators and "
        "n' back from the state arrays instead of carrying them from the second (kAdanReadBack: 107 instructions, 10 "
        "stack operands): 2% faster on avx2 (10.34-10.38 against 10.53-10.59 ms, one thread, three alternating runs), "
        "1-2% on avx512, 12% slower on sse2, so only the 256- and 512-bit targets read back. Then GCC's "
        "pre-register-allocation scheduling with register pressure (-fschedule-insns -fsched-pressure, off by default "
        "on x86) for the float32 ADAN loop alone on avx2 (GMS_ADAN_SCHEDULE, a function attribute; bit-identical): 3% "
        "faster (9.92-10.05 against 10.22-10.38 ms, one thread, three alternating runs; ADAN-25 5.33-5.37 against "
        "5.49-5.54 ms in compare_build.py, two runs). As flags for the whole file it also made the sn-ddpm step 4% "
        "slower; on avx512 it was no faster and on sse2 6% slower; on the closed fit (its own attribute) 3-4% slower."),
}
ROOFLINE_TAIL = (
    "The part of the step outside the fit (moments, normals, mixture draw; measured in the section above) "
    "is bound by the double-precision moments, Philox/Box-Muller and the first touch of the inputs in memory.")

# How adan_loop_bench.cpp is compiled for each vector target, as setup.py builds the extension's
# target: (float32 lanes, register name, g++ flags).
ADAN_LOOP_TARGETS = {
    "avx512": (16, "zmm", ["-march=x86-64-v4", "-mprefer-vector-width=512", "-DGMS_TARGET_NS=avx512",
                           "-DGMS_VBYTES=64"]),
    "avx2": (8, "ymm", ["-march=x86-64-v3", "-DGMS_TARGET_NS=avx2", "-DGMS_VBYTES=32"]),
}


def adan_loop_flags(target: str) -> list[str]:
    return ["-O3", *ADAN_LOOP_TARGETS[target][2], "-mtune=native", "-fno-math-errno", "-fno-wrapv",
            "-fno-predictive-commoning", "-fopenmp"]


# The mnemonics of the compiled ADAN loop by unit: square roots and divisions on the divider, the
# other arithmetic on the FMA / FP-add units.
DIVIDER = ("vsqrtps", "vdivps")


def adan_loop_mix(target: str) -> dict[str, int] | None:
    """Instructions per vector and iteration in the ADAN loop of one target as g++ compiles it here
    (adan_iteration<false> of csrc/step_target.cpp, from the assembly of adan_loop_bench.cpp):
    {'vsqrtps': .., 'vdivps': .., 'fma-unit': .., 'memory': ..}; None without g++ or that loop."""
    if shutil.which("g++") is None:
        return None
    lanes, reg, _ = ADAN_LOOP_TARGETS[target]
    src = Path(__file__).parent / "cpp" / "adan_loop_bench.cpp"
    asm = subprocess.run(["g++", *adan_loop_flags(target), "-std=c++17", "-S", str(src), "-o", "-"], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    name = (f"_ZN3gms{len(target)}{target}14adan_iterationILb0EEEvRNS0_9AdanBlockIfEEiRKNS0_9AdanPacksIDv{lanes}_fEE:")
    if name not in asm:
        return None
    labels, body = {}, None
    for i in range(asm.index(name), len(asm)):
        if (m := re.match(r"^(\.L\d+):", asm[i])):
            labels[m.group(1)] = i
        if (m := re.match(r"\s+jne\s+(\.L\d+)", asm[i])) and m.group(1) in labels:
            body = [line.split(None, 1) for line in asm[labels[m.group(1)] + 1:i] if line.strip()]
            break
    if body is None:
        return None
    vector = [op for op in body if op[0].startswith("v") and reg in op[-1]]
    mix = {d: sum(op[0] == d for op in vector) for d in DIVIDER}
    mix["memory"] = sum("(" in op[-1] for op in vector)
    # (vmov*: register copies, loads and stores, whatever the element type g++ names them by)
    mix["fma-unit"] = sum(op[0] not in DIVIDER and not op[0].startswith("vmov") for op in vector)
    return mix


def instruction_rates(ceilings: str) -> dict[str, float]:
    """vector_ceilings.cpp's line as {'vfmadd zmm': instructions per ns, ...}."""
    return {k: float(v) for k, v in re.findall(r"(v\w+ [xyz]mm) ([\d.]+)", ceilings)}


def loop_bounds(ceilings: str, loop: str, mix: dict[str, int], target: str) -> str:
    """Sentences comparing the measured ADAN loop of one target with its FMA-unit and divider bounds."""
    lanes, reg, _ = ADAN_LOOP_TARGETS[target]
    rate = instruction_rates(ceilings)
    ms = float(re.search(r"one thread: ([\d.]+) ms", loop).group(1))
    elements, iters = (int(v) for v in re.search(r"ADAN fit, (\d+) elements, (\d+) iterations", loop).groups())
    loop_ns = ms * 1e6 / (elements / lanes * iters)
    fma_ns = mix["fma-unit"] / rate[f"vfmadd {reg}"]
    div_ns = mix["vsqrtps"] / rate[f"vsqrtps {reg}"] + mix["vdivps"] / rate[f"vdivps {reg}"]
    return (f"Per {lanes} lanes ({target}) and iteration the compiled loop issues {mix['fma-unit']} arithmetic "
            f"instructions on the FMA and FP-add units, {mix['vsqrtps']} square roots and {mix['vdivps']} divisions "
            f"on the divider (which runs beside them; where there are no divisions they are reciprocal estimates "
            f"plus a Newton step, FMA-unit work), and {mix['memory']} instructions with a memory operand (loads, "
            f"stores and loads folded into arithmetic, all in L1). The loop takes "
            f"{loop_ns:.1f} ns; the FMA units need {fma_ns:.1f} ns at the measured FMA rate and the divider "
            f"{div_ns:.1f} ns, so the loop runs at {100 * max(fma_ns, div_ns) / loop_ns:.0f}% of its "
            "throughput bound.")


def fma_peak_gflops(ceilings: str, threads: int) -> float:
    """fp32 FMA peak in GFLOP/s: the better of the 512- and 256-bit FMA rates (instructions per ns),
    times their lanes, 2 flops per FMA and the threads."""
    rate = instruction_rates(ceilings)
    return max(rate.get("vfmadd zmm", 0.0) * 16, rate["vfmadd ymm"] * 8) * 2 * threads


def nominal_ghz() -> float:
    """The clock the cycle counts are quoted at: the model name's, else the kernel's 'cpu MHz'."""
    if (m := re.search(r"@ ([\d.]+)GHz", cpu_name())):
        return float(m.group(1))
    try:
        mhz = re.search(r"cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text())
    except OSError:
        mhz = None
    return round(float(mhz.group(1)) / 1000, 2) if mhz else 2.8


def flops_per_element(fit: str, options: dict | None = None) -> int:
    iters = (FITS[fit] if options is None else options).get("fit_iters", 0)
    fit_flops = FLOPS_CLOSED if fit == "closed" else FLOPS_ADAN_SETUP + iters * FLOPS_ADAN_ITER
    return FLOPS_MOMENTS + fit_flops + FLOPS_SAMPLING


def flop_floor(elements: int, flops: int, peak_gflops: float, peak_name: str, baseline_s: list[float],
               target: float = 50.0) -> str:
    """A sentence comparing the time the step's flops take at the peak with what target x (i) allows
    (baseline_s: (i)'s fastest and median call in seconds)."""
    floor_ms = flops * elements / peak_gflops / 1e6
    allowed = [b / target * 1e3 for b in baseline_s]
    return (f"At the {peak_name} ({peak_gflops:.0f} GFLOP/s, every flop inside an FMA) the adan-25 step's "
            f"{flops * elements / 1e6:.0f} MFLOP for {elements:,} elements take {floor_ms:.2f} ms; {target:.0f}x of (i) "
            f"allows {allowed[0]:.2f} ms (fastest call) and {allowed[1]:.2f} ms (median call) for the whole step, "
            f"that is {100 * floor_ms / allowed[0]:.0f}% and {100 * floor_ms / allowed[1]:.0f}% of the peak's rate.")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def measured_ceilings() -> tuple[float, float]:
    """(fp32 GFLOP/s of a large torch sgemm, GB/s of a large torch copy) on this machine."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    sec = median_seconds(lambda: a @ b, repeats=5)
    gflops = 2 * 2048**3 / sec / 1e9
    src = torch.randn(64 * 2**20 // 4)
    dst = torch.empty_like(src)
    sec = median_seconds(lambda: dst.copy_(src), repeats=5)
    return gflops, 2 * src.numel() * 4 / sec / 1e9


ROUNDS = 8  # interleaved rounds per size: a multiple of the 4 backends, whose order rotates
CALLS = {"reference-loop": 1, "torch": 1, "cpp": 5, "cpp-kernel": 5}  # calls per backend and round
STATS = (("fastest call", min), ("median call", statistics.median))


def vector_ceilings() -> str | None:
    """benchmarks/cpp/vector_ceilings.cpp's line for this CPU (None without g++)."""
    return run_cpp_bench("vector_ceilings.cpp", ["-O2", "-march=native"])


def run_cpp_bench(source: str, flags: list[str], *args: str) -> str | None:
    """Compiles benchmarks/cpp/<source> with g++ and returns its output line (None without g++)."""
    if shutil.which("g++") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "bench")
        src = Path(__file__).parent / "cpp" / source
        subprocess.run(["g++", *flags, "-std=c++17", str(src), "-o", exe], check=True)
        return subprocess.run([exe, *args], check=True, capture_output=True, text=True).stdout.strip()


def ratios(c: dict, closed: dict) -> dict[str, float]:
    """The two acceptance ratios, through gk.step ('cpp') and for the kernel alone ('cpp-kernel')."""
    out = {}
    for b in ("cpp", "cpp-kernel"):
        out[f"speedup {b}"] = c["reference-loop"] / c[b]
        out[f"closed {b}"] = c[b] / closed[b]
    return out


def acceptance(stat: str, r: dict[str, float]) -> list[str]:
    lines = []
    for b, what in (("cpp", "through gk.step"), ("cpp-kernel", "kernel alone")):
        speedup, closed = r[f"speedup {b}"], r[f"closed {b}"]
        lines.append(f"- {stat}, {what}: cpp adan-25 vs (i) **{speedup:.1f}x** (target >= 50x: "
                     f"{'met' if speedup >= 50 else 'NOT met'}); cpp closed vs cpp adan-25 **{closed:.2f}x** "
                     f"(target >= 5x: {'met' if closed >= 5 else 'NOT met'}).")
    return lines


def measure(schedule: gk.Schedule, backends: list[str]) -> dict:
    """One pass over both sizes: {(size, fit): {backend: [seconds of each call]}}.

    Every fit of a size takes turns in the same rounds, so that the ratios between fits (closed vs
    adan-25) compare calls made in the same minutes, as the ratios between backends do: this VM's
    slow phases last minutes, and fits measured one after the other would land in different ones.
    (i) runs once per round at 25 and 70 iterations; the closed row's (i) is the 25-iteration one."""
    times = {}
    for size, shape in SIZES.items():
        x_t, out = make_inputs(shape)
        fns, calls, groups = {}, {}, {}
        for b in backends:
            for fit in FITS:
                if b == "reference-loop" and fit == "closed":
                    continue  # (the official code has no closed form)
                fns[(b, fit)] = runner(b, fit, x_t, out, schedule)
                calls[(b, fit)] = CALLS[b]
                groups.setdefault(b, []).append((b, fit))
        per_call = interleaved_seconds(fns, ROUNDS, calls, groups=list(groups.values()))
        for fit in FITS:
            times[(size, fit)] = {b: per_call[(b, fit if (b, fit) in fns else "adan-25")] for b in backends}
            print(f"{size:16s} {fit:8s} " + "  ".join(
                f"{b} {min(v) * 1e3:.2f}/{statistics.median(v) * 1e3:.2f} ms"
                for b, v in times[(size, fit)].items()), flush=True)
    return times


# Variants of the 307,200-element step run through the C++ kernel alone, to split the adan-25 step's
# time: the Gaussian step (sn-ddpm: moments and one normal per element, no fit), the closed form, and
# ADAN at 1, 5 and 25 iterations (the slope between 5 and 25 is the cost of one iteration).
BREAKDOWN = {  # name: (solver, options, what the kernel does)
    "sn-ddpm": ("sn-ddpm", {}, "moments and one Gaussian draw per element (no fit)"),
    "closed": ("gms", FITS["closed"], "moments, closed-form fit, mixture draw"),
    "adan-1": ("gms", {"fit": "adan", "fit_iters": 1}, "moments, 1 ADAN iteration, mixture draw"),
    "adan-5": ("gms", {"fit": "adan", "fit_iters": 5}, "moments, 5 ADAN iterations, mixture draw"),
    "adan-25": ("gms", FITS["adan-25"], "moments, 25 ADAN iterations, mixture draw"),
}


def breakdown(schedule: gk.Schedule, rounds: int = 20) -> tuple[list[str], dict[str, list[float]]]:
    """Markdown lines: the kernel-alone time of each BREAKDOWN variant and what follows from them;
    and those times in ms, (fastest, median) per variant."""
    x_t, out = make_inputs(SIZES["cifar10-b100"])
    fns = {name: runner("cpp-kernel", name, x_t, out, schedule, options, solver)
           for name, (solver, options, _) in BREAKDOWN.items()}
    times = interleaved_seconds(fns, rounds, {name: 5 for name in fns})
    t = {name: [f(v) * 1e3 for _, f in STATS] for name, v in times.items()}
    per_iter = [(t["adan-25"][i] - t["adan-5"][i]) / 20 for i in range(len(STATS))]
    rest = [t["adan-25"][i] - 25 * per_iter[i] for i in range(len(STATS))]
    fmt = lambda v: " / ".join(f"{x:.2f} ms" for x in v)
    lines = ["## Where the adan-25 step's time goes (C++ kernel alone, 307,200 elements)", "",
             f"Measured in turns, {rounds} rounds of 5 calls each; fastest / median call.", "",
             "| variant | what it does | time |", "|---|---|---|"]
    lines += [f"| {name} | {BREAKDOWN[name][2]} | {fmt(v)} |" for name, v in t.items()]
    lines += ["", f"- One ADAN iteration ((adan-25 - adan-5) / 20): {fmt(per_iter)}.",
              f"- Everything but the fit (adan-25 - 25 iterations): {fmt(rest)}, that is "
              f"{100 * rest[0] / t['adan-25'][0]:.0f}% / {100 * rest[1] / t['adan-25'][1]:.0f}% of adan-25; "
              f"the Gaussian step alone (moments and normals) takes {fmt(t['sn-ddpm'])}."]
    return lines, t


# What the first calls of a C++ step cost after other work, against calls back to back: this VM runs
# the first few milliseconds after a change of load slowly (idle or not), which weighs on a 1.5 ms
# step five times as much as on a 7.5 ms one.
BEFORE = {  # name: what runs before each burst of calls
    "back to back": None,
    "after 50 ms idle": lambda: time.sleep(0.05),
    "after 40 ms of torch matmuls (like a network call)": "matmul",
    "after one call of (ii)": "reference",
}


def warm_up(schedule: gk.Schedule, rounds: int = 10, calls: int = 5) -> list[str]:
    """Markdown lines: median time of the k-th call of closed and adan-25 (C++ kernel alone) after
    each BEFORE condition, and their ratio."""
    x_t, out = make_inputs(SIZES["cifar10-b100"])
    fns = {fit: runner("cpp-kernel", fit, x_t, out, schedule) for fit in ("closed", "adan-25")}
    a = torch.randn(512, 512)
    reference = runner("torch", "closed", x_t, out, schedule)

    def matmuls():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.04:
            a @ a

    before = {name: {"matmul": matmuls, "reference": reference}.get(f, f) for name, f in BEFORE.items()}
    for fn in fns.values():
        fn()
    times = {(name, fit): [[] for _ in range(calls)] for name in before for fit in fns}
    for _ in range(rounds):
        for name, pre in before.items():
            for fit, fn in fns.items():
                if pre is not None:
                    pre()
                for k in range(calls):
                    t0 = time.perf_counter()
                    fn()
                    times[(name, fit)][k].append(time.perf_counter() - t0)
    med = {key: [statistics.median(v) * 1e3 for v in per_call] for key, per_call in times.items()}
    lines = ["## The first calls after other work (C++ kernel alone, 307,200 elements)", "",
             f"Median time of the k-th call in a burst of {calls}, over {rounds} rounds; each burst follows the "
             "condition named (back to back: the previous burst). Cells: closed / adan-25 = ratio.", "",
             "| before the burst | " + " | ".join(f"call {k + 1}" for k in range(calls)) + " |",
             "|---|" + "---|" * calls]
    for name in before:
        c, d = med[(name, "closed")], med[(name, "adan-25")]
        lines.append(f"| {name} | " + " | ".join(f"{c[k]:.2f} / {d[k]:.2f} ms = {d[k] / c[k]:.2f}x"
                                                for k in range(calls)) + " |")
    return lines


# The targets section: the fits and the one-Gaussian solvers, every supported target in turn.
TARGET_VARIANTS = {  # name: (solver, options)
    "closed": ("gms", FITS["closed"]),
    "adan-25": ("gms", FITS["adan-25"]),
    "adan-70": ("gms", FITS["adan-70"]),
    "sn-ddpm": ("sn-ddpm", {}),
    "ddpm": ("ddpm", {}),
    "ddim": ("ddim", {}),
}
# The rows of the per-call table: whole `gk.step` calls (checks, dispatch, the chosen target) as a
# user makes them. label: (backend, solver, options)
API_STEPS = {
    "`gk.step` gms, closed form, cpp": ("cpp", "gms", FITS["closed"]),
    "`gk.step` gms, ADAN-25, cpp": ("cpp", "gms", FITS["adan-25"]),
    "`gk.step` sn-ddpm, cpp": ("cpp", "sn-ddpm", {}),
    "`gk.step` ddpm, auto backend": ("auto", "ddpm", {}),
}
TARGET_LANES = {"avx512": 16, "avx2": 8, "sse2": 4, "baseline": 4}  # float32 lanes per vector


def target_rooflines(ceilings: str | None, threads: int, ghz: float) -> dict[str, tuple[float, str]]:
    """{target: (fp32 GFLOP/s, how it is made)}: lanes x 2 flops x FMA instructions per ns (the
    measured rate of that width, i.e. FMA units x clock) x threads. SSE2 has no FMA instruction: one
    flop per lane at the 256-bit FMA ports' rate."""
    if not ceilings:
        return {}
    rate = instruction_rates(ceilings)
    out = {}
    for target, lanes in TARGET_LANES.items():
        if target == "avx512" and "vfmadd zmm" not in rate:  # vector_ceilings.cpp built without AVX-512
            continue
        if target == "avx512":
            r, flops, what = rate["vfmadd zmm"], 2, "vfmadd zmm"
        elif target == "avx2":
            r, flops, what = rate["vfmadd ymm"], 2, "vfmadd ymm"
        else:
            r, flops, what = rate["vfmadd ymm"], 1, "no FMA: one flop per lane at the vfmadd ymm rate"
        units = r / ghz
        out[target] = (lanes * flops * r * threads,
                       f"{lanes} lanes x {flops} flops x {r:.2f} {what} per ns (= {units:.2f} units x {ghz:.2f} GHz) "
                       f"x {threads} threads")
    return out


def targets_side_by_side(schedule: gk.Schedule, rounds: int) -> tuple[dict, dict]:
    """Kernel-alone times of every TARGET_VARIANTS step on every supported target, of the API_STEPS
    (target chosen at import) and of (i) at 25 and 70 iterations, in turns (rounds of 5 calls per
    variant and target, one call of (i)); returns ({(target or "gk.step", variant): [seconds]},
    {25: [...], 70: [...]})."""
    from gms_kernels.kernels import cpu_info, set_cpu_target

    x_t, out = make_inputs(SIZES["cifar10-b100"])
    fns, calls = {}, {}
    for target in cpu_info()["supported"]:
        for name, (solver, options) in TARGET_VARIANTS.items():
            f = runner("cpp-kernel", name, x_t, out, schedule, options, solver)
            fns[(target, name)] = lambda f=f, target=target: (set_cpu_target(target), f())
            calls[(target, name)] = 5
    for label, (backend, solver, options) in API_STEPS.items():
        f = runner(backend, "closed", x_t, out, schedule, options, solver)
        fns[("gk.step", label)] = lambda f=f: (set_cpu_target(None), f())
        calls[("gk.step", label)] = 5
    for iters in (25, 70):
        fns[("(i)", iters)] = runner("reference-loop", "adan-25" if iters == 25 else "adan-70", x_t, out, schedule)
        calls[("(i)", iters)] = 1
    try:
        times = interleaved_seconds(fns, rounds, calls)
    finally:
        set_cpu_target(None)
    return ({k: v for k, v in times.items() if k[0] != "(i)"}, {k[1]: v for k, v in times.items() if k[0] == "(i)"})


def targets_report(schedule: gk.Schedule, rounds: int) -> tuple[list[str], list[str], str | None]:
    """Markdown lines of the targets section (all targets) and of the AVX2 target alone, and the
    vector_ceilings.cpp line measured for them."""
    from gms_kernels.kernels import cpu_info

    info = cpu_info()
    times, ref = targets_side_by_side(schedule, rounds)
    threads = torch.get_num_threads()
    ghz = nominal_ghz()
    ceilings = vector_ceilings()
    roofs = target_rooflines(ceilings, threads, ghz)
    targets = info["supported"]
    n = x_numel("cifar10-b100")
    flops_adan25 = flops_per_element("adan-25")
    st = {key: [f(v) for _, f in STATS] for key, v in times.items()}
    rf = {k: [f(v) for _, f in STATS] for k, v in ref.items()}
    fmt = lambda v: f"{v[0] * 1e3:.2f} / {v[1] * 1e3:.2f} ms"
    lines = ["## CPU targets side by side (C++ kernel alone, 307,200 elements)", "",
             f"Target chosen at import on this machine: **{info['best']}** (`gk.kernels.cpu_info()`: compiled "
             f"{', '.join(info['compiled'])}; this CPU runs {', '.join(targets)}). Each target was forced in turn "
             "(`gk.kernels.set_cpu_target`) on the same inputs, in rounds that also run (i) once at 25 and 70 "
             f"iterations: {rounds} rounds, 5 calls per target and step; fastest / median call.", "",
             "| step | " + " | ".join(targets) + " |", "|---|" + "---|" * len(targets)]
    for name in TARGET_VARIANTS:
        lines.append(f"| {name} | " + " | ".join(fmt(st[(t, name)]) for t in targets) + " |")
    lines.append(f"| (i) reference loop, 25 / 70 iterations | {fmt(rf[25])} / {fmt(rf[70])} |" + " |" * (len(targets) - 1))
    lines += ["", f"Whole `gk.step` calls (target {info['best']}, chosen at import; same rounds): "
              + "; ".join(f"{label} {fmt(st[('gk.step', label)])}" for label in API_STEPS) + "."]
    lines += ["", "Ratios (fastest call / median call):", "",
              "| ratio | " + " | ".join(targets) + " |", "|---|" + "---|" * len(targets)]
    ratio_rows = {
        "adan-25 vs (i) (speed-up)": lambda t, i: rf[25][i] / st[(t, "adan-25")][i],
        "adan-70 vs (i) at 70 (speed-up)": lambda t, i: rf[70][i] / st[(t, "adan-70")][i],
        "closed vs adan-25 (speed-up)": lambda t, i: st[(t, "adan-25")][i] / st[(t, "closed")][i],
        "sn-ddpm / closed (cost)": lambda t, i: st[(t, "sn-ddpm")][i] / st[(t, "closed")][i],
        "ddpm / closed (cost)": lambda t, i: st[(t, "ddpm")][i] / st[(t, "closed")][i],
        "ddim / closed (cost)": lambda t, i: st[(t, "ddim")][i] / st[(t, "closed")][i],
    }
    for label, fn in ratio_rows.items():
        lines.append(f"| {label} | " + " | ".join(f"{fn(t, 0):.2f}x / {fn(t, 1):.2f}x" for t in targets) + " |")
    if roofs:
        lines.append(f"| adan-25 step, % of the target's FMA roofline ({flops_adan25} flops / element) | " + " | ".join(
            f"{100 * flops_adan25 * n / st[(t, 'adan-25')][i] / 1e9 / roofs[t][0]:.0f}%" if t in roofs else "-"
            for t in targets for i in (0,)) + " |")
        lines += ["", "FMA rooflines (fp32 GFLOP/s: lanes x flops per instruction x the FMA instruction rate of that "
                  "width measured by benchmarks/cpp/vector_ceilings.cpp in the same run, which is FMA units x clock; the "
                  f"clock quoted is the kernel's nominal one, {ghz:.2f} GHz from /proc/cpuinfo, so the units column is "
                  "what the measured rate implies at that clock; on a shared VM the measured rate falls when other "
                  "work runs):", ""]
        lines += [f"- {t}: {roofs[t][0]:.0f} GFLOP/s = {roofs[t][1]}" for t in targets if t in roofs]
        lines += ["", f"- `benchmarks/cpp/vector_ceilings.cpp`: {ceilings}"]
    lines += ["", f"Flops per element of the adan-25 step: {flops_adan25} (moments {FLOPS_MOMENTS}, ADAN set-up "
              f"{FLOPS_ADAN_SETUP}, 25 iterations of {FLOPS_ADAN_ITER}, sampling {FLOPS_SAMPLING}; counted "
              "operation by operation, see FLOPS_MOMENTS in benchmarks/run_cpu.py)."]
    avx2 = []
    if "avx2" in targets:
        t = "avx2"
        if "avx512" in info["supported"]:
            how = ("run on this AVX-512 machine by forcing the target (`GMS_KERNELS_CPU_TARGET=avx2` / "
                   "`gk.kernels.set_cpu_target('avx2')`): the code an AVX2 machine (without AVX-512) runs")
        else:
            how = "chosen at import on this machine, which has AVX2 and FMA but no AVX-512: the native AVX2 case"
        avx2 = ["# GMS per-step cost, the AVX2 target (C++ kernel alone, 307,200 elements)", "",
                f"The kernels compiled for AVX2 + FMA (x86-64-v3), {how}. Same run as the side-by-side table of "
                "the targets file.", "",
                "| step | fastest call | median call |", "|---|---|---|"]
        avx2 += [f"| {name} | {st[(t, name)][0] * 1e3:.2f} ms | {st[(t, name)][1] * 1e3:.2f} ms |" for name in TARGET_VARIANTS]
        avx2 += [f"| (i) reference loop, 25 iterations | {rf[25][0] * 1e3:.1f} ms | {rf[25][1] * 1e3:.1f} ms |",
                 f"| (i) reference loop, 70 iterations | {rf[70][0] * 1e3:.1f} ms | {rf[70][1] * 1e3:.1f} ms |", "",
                 "| acceptance | fastest call | median call | target |", "|---|---|---|---|"]
        checks = [("adan-25 vs (i)", ratio_rows["adan-25 vs (i) (speed-up)"], ">= 100x", lambda v: v >= 100),
                  ("closed vs adan-25", ratio_rows["closed vs adan-25 (speed-up)"], ">= 5x", lambda v: v >= 5)]
        checks += [(f"{s} / closed", ratio_rows[f"{s} / closed (cost)"], "<= 1.5x", lambda v: v <= 1.5)
                   for s in ("sn-ddpm", "ddpm", "ddim")]
        for label, fn, goal, ok in checks:
            a, b = fn(t, 0), fn(t, 1)
            avx2.append(f"| {label} | {a:.2f}x | {b:.2f}x | {goal}: {'met' if ok(a) else 'NOT met'} (fastest), "
                        f"{'met' if ok(b) else 'NOT met'} (median) |")
        if t in roofs:
            pct = [100 * flops_adan25 * n / st[(t, "adan-25")][i] / 1e9 / roofs[t][0] for i in (0, 1)]
            avx2.append(f"| adan-25, % of the AVX2 FMA roofline ({roofs[t][0]:.0f} GFLOP/s) | {pct[0]:.0f}% | {pct[1]:.0f}% | "
                        f">= 60%: {'met' if pct[0] >= 60 else 'NOT met'} (fastest) |")
            avx2 += ["", f"Roofline: {roofs[t][1]}."]
        if info["best"] == t:
            avx2 += ["", "Whole `gk.step` calls on this machine (the chosen target, with the API's checks and "
                     "dispatch; same run):", "",
                     "| step | fastest call | median call |", "|---|---|---|"]
            avx2 += [f"| {label} | " + " | ".join(f"{v * 1e3:.2f} ms" for v in st[("gk.step", label)]) + " |"
                     for label in API_STEPS]
        avx2.append("")
    return lines, avx2, ceilings


def adan_loop_view(target: str, ceilings: str) -> list[str]:
    """Markdown lines: the ADAN loop of one target timed alone on one thread, its instruction mix and
    the bounds they imply; nothing for a target without such a loop or without g++."""
    if target not in ADAN_LOOP_TARGETS:
        return []
    loop = run_cpp_bench("adan_loop_bench.cpp", adan_loop_flags(target), str(nominal_ghz()))
    if not loop:
        return []
    lines = [f"Instruction-level view of the {target} ADAN loop, one thread, same run:", "",
             f"- `benchmarks/cpp/vector_ceilings.cpp`: {ceilings}",
             f"- `benchmarks/cpp/adan_loop_bench.cpp`: {loop}", ""]
    if (mix := adan_loop_mix(target)):
        lines += [loop_bounds(ceilings, loop, mix, target), ""]
    return lines


def summarise(times: dict) -> dict:
    """{(size, fit): {backend: (fastest, median) seconds}}."""
    return {key: {b: tuple(f(v) for _, f in STATS) for b, v in per.items()} for key, per in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="independent passes over all sizes and fits")
    p.add_argument("--targets", action="store_true", help="only the CPU targets side by side (cpu-targets.md, cpu-avx2.md)")
    p.add_argument("--target-rounds", type=int, default=8, help="rounds of the targets section")
    p.add_argument("--out-tag", default="", help="with --targets: write cpu-targets-TAG.md and cpu-avx2-TAG.md, "
                   "keeping another machine's files")
    p.add_argument("--adan-loop", metavar="TARGET", choices=sorted(ADAN_LOOP_TARGETS),
                   help="only print the instruction-level view of one target's ADAN loop (one thread)")
    args = p.parse_args()
    if args.adan_loop:
        print(f"Command: `python benchmarks/run_cpu.py --adan-loop {args.adan_loop}`\n\n{machine_line()}\n")
        print("\n".join(adan_loop_view(args.adan_loop, vector_ceilings())))
        return
    schedule = gk.Schedule.linear()
    if args.targets:
        write_targets(schedule, args)
        return
    have_cpp = backend_available("cpp")
    backends = ["reference-loop", "torch"] + (["cpp", "cpp-kernel"] if have_cpp else [])
    runs = []
    for run in range(args.runs):
        print(f"run {run + 1} of {args.runs}", flush=True)
        runs.append(measure(schedule, backends))
    pooled = {key: {b: [x for r in runs for x in r[key][b]] for b in backends} for key in runs[0]}
    stats = summarise(pooled)

    gflops_peak, gbs_peak = measured_ceilings()
    lines = [
        "# GMS per-step cost on CPU",
        "",
        f"Command: `python benchmarks/run_cpu.py --runs {args.runs}`",
        "",
        machine_line() + f" C++ kernels' CPU target: {gk.kernels.cpu_info()['target'] if have_cpp else 'not built'}.",
        "",
        "One GMS step t=500 -> s=400 (moments, fit, mixture sampling) on batch-100 inputs. The backends and "
        f"fits take turns: {args.runs} runs of {ROUNDS} rounds per size, each round running (i) once at 25 and "
        f"at 70 iterations, (ii) once per fit and (iii) {CALLS['cpp']} times per fit, backend after backend, in "
        "orders that rotate from round to round (whichever runs right after (i) or (ii) starts with cold "
        "caches); the tables pool all runs. So the closed and adan-25 rows come from the same minutes, as "
        "the ratio between them requires. This is a "
        "shared 2-vCPU VM whose speed drifts by 30% or more from minute to minute, so both the fastest call "
        "(the least disturbed one) and the median call are given. Ratios are speed-ups over (i) under the "
        "same statistic. The official code has no closed form, so closed-form rows are compared with (i) at "
        "25 ADAN iterations (the paper's setting).",
        "",
    ]
    for i, (stat, _) in enumerate(STATS):
        lines += [f"## {stat[0].upper() + stat[1:]}", "",
                  "| elements | fit | (i) reference loop | (ii) torch reference (fp64) | (iii) cpp via gk.step | "
                  "(iii) cpp kernel alone | (iv) triton |",
                  "|---|---|---|---|---|---|---|"]
        for (size, fit), t in stats.items():
            n = x_numel(size)
            base = t["reference-loop"][i]
            cells = [f"{base * 1e3:.1f} ms (1x)"]
            for b in ("torch", "cpp", "cpp-kernel"):
                cells.append(f"{t[b][i] * 1e3:.2f} ms ({base / t[b][i]:.1f}x)" if b in t else "not built")
            cells.append("GPU only")
            lines.append(f"| {size} ({n:,}) | {fit} | " + " | ".join(cells) + " |")
        lines.append("")
    if have_cpp:
        def cifar_ratios(st: dict, i: int) -> dict[str, float]:
            pick = lambda fit: {b: v[i] for b, v in st[("cifar10-b100", fit)].items()}
            return ratios(pick("adan-25"), pick("closed"))

        lines += ["## Acceptance (307,200 elements)", "", f"All {args.runs} runs pooled:", ""]
        for i, (stat, _) in enumerate(STATS):
            lines += acceptance(stat, cifar_ratios(stats, i))
        lines += ["", "Each run alone (targets: >= 50x and >= 5x):", "",
                  "| run | statistic | adan-25 vs (i), gk.step | adan-25 vs (i), kernel | closed vs adan-25, gk.step "
                  "| closed vs adan-25, kernel |", "|---|---|---|---|---|---|"]
        for k, r in enumerate(runs):
            for i, (stat, _) in enumerate(STATS):
                q = cifar_ratios(summarise(r), i)
                lines.append(f"| {k + 1} | {stat} | {q['speedup cpp']:.1f}x | {q['speedup cpp-kernel']:.1f}x | "
                             f"{q['closed cpp']:.2f}x | {q['closed cpp-kernel']:.2f}x |")
        parts, t = breakdown(schedule)
        lines += ["", "The two C++ kernels alone, in turns with each other and the other variants of the "
                  "breakdown below (20 rounds of 5 calls; no torch work in between): cpp closed vs cpp adan-25 "
                  + " / ".join(f"**{t['adan-25'][i] / t['closed'][i]:.2f}x** ({stat})" for i, (stat, _) in
                               enumerate(STATS)) + ". The tables above put (i) and (ii) between the bursts; the "
                  "warm-up table below shows what that does to the first calls of a burst."]
        lines += [""] + parts + [""] + warm_up(schedule)
        target_lines, _, ceilings = targets_report(schedule, args.target_rounds)
        lines += [""] + target_lines
        threads = torch.get_num_threads()
        fma_peak = fma_peak_gflops(ceilings, threads) if ceilings else None
        peak, peak_name = (fma_peak, "FMA peak") if fma_peak else (gflops_peak, "sgemm ceiling")
        lines += [
            "",
            "## Roofline",
            "",
            f"Measured ceilings on this machine: fp32 sgemm {gflops_peak:.0f} GFLOP/s (2048x2048 torch matmul, "
            f"{threads} threads), memory copy {gbs_peak:.1f} GB/s (64 MiB torch copy, read + write)"
            + (f", fp32 FMA peak {fma_peak:.0f} GFLOP/s (vector_ceilings.cpp's FMA rate below, the better of "
               f"512 and 256 bits, times the lanes, 2 flops and {threads} threads)" if fma_peak else "") + ".",
            "",
            f"| elements | fit | flops / element | cpp kernel GFLOP/s (fastest call) | % of {peak_name} | "
            "cpp kernel GB/s (20 B / element) | % of copy ceiling |",
            "|---|---|---|---|---|---|---|",
        ]
        for (size, fit), t in stats.items():
            n = x_numel(size)
            f = flops_per_element(fit)
            gf = f * n / t["cpp-kernel"][0] / 1e9
            gb = 20 * n / t["cpp-kernel"][0] / 1e9
            lines.append(f"| {n:,} | {fit} | {f} | {gf:.1f} | {100 * gf / peak:.0f}% | {gb:.2f} | "
                         f"{100 * gb / gbs_peak:.0f}% |")
        lines += ["", f"Flops per element, counted operation by operation in csrc/step_target.cpp (see FLOPS_MOMENTS in "
                  f"benchmarks/run_cpu.py): moments {FLOPS_MOMENTS}, closed fit {FLOPS_CLOSED}, ADAN set-up "
                  f"{FLOPS_ADAN_SETUP} and {FLOPS_ADAN_ITER} per iteration, sampling {FLOPS_SAMPLING}.", ""]
        cifar = stats[("cifar10-b100", "adan-25")]["reference-loop"]
        lines += [flop_floor(x_numel("cifar10-b100"), flops_per_element("adan-25"), peak, peak_name, list(cifar)), ""]
        if ceilings:
            lines += adan_loop_view(gk.kernels.cpu_info()["best"], ceilings)  # the loop this machine runs
        lines += ["What else was tried on the ADAN loop, by machine:", ""]
        lines += [f"- {machine}: {notes}" for machine, notes in ROOFLINE_NOTES.items()]
        lines += ["", ROOFLINE_TAIL]
    out = Path(__file__).parent / "results" / "cpu.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


def machine_line() -> str:
    return (f"Machine: {cpu_name()} ({cpu_model()}), {torch.get_num_threads()} threads, torch {torch.__version__}, "
            f"Python {platform.python_version()}, {datetime.date.today().isoformat()}; load average before the run: "
            f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}.")


def cpu_model() -> str:
    """'family F model M' from /proc/cpuinfo: the model name of a cloud VM often omits the generation."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "family ? model ?"
    found = [re.search(rf"^{key}\s*:\s*(\d+)", text, re.M) for key in ("cpu family", "model")]
    return "family {} model {}".format(*(m.group(1) if m else "?" for m in found))


def write_targets(schedule: gk.Schedule, args) -> None:
    head = machine_line()
    lines, avx2, ceilings = targets_report(schedule, args.target_rounds)
    if avx2 and ceilings:
        avx2 += adan_loop_view("avx2", ceilings)
    results = Path(__file__).parent / "results"
    tag = f"-{args.out_tag}" if args.out_tag else ""
    cmd = (f"Command: `python benchmarks/run_cpu.py --targets --target-rounds {args.target_rounds}"
           + (f" --out-tag {args.out_tag}`" if tag else "`"))
    (results / f"cpu-targets{tag}.md").write_text("\n".join(["# GMS per-step cost on CPU: every target", "", cmd, "",
                                                            head, ""]
                                                     + lines) + "\n")
    print(f"wrote {results / f'cpu-targets{tag}.md'}")
    if avx2:
        (results / f"cpu-avx2{tag}.md").write_text("\n".join(avx2[:2] + [cmd, "", head, ""] + avx2[2:]) + "\n")
        print(f"wrote {results / f'cpu-avx2{tag}.md'}")


def x_numel(size: str) -> int:
    n = 1
    for d in SIZES[size]:
        n *= d
    return n


if __name__ == "__main__":
    main()
