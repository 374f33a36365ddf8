"""GMS per-step cost on this CPU, every backend side by side in one run, as ratios to baseline (i).

    python benchmarks/run_cpu.py            # writes benchmarks/results/cpu.md

(i) the official code's loop re-implemented (autograd + ADAN optimizer object + mean loss, fp32);
(ii) the torch reference (float64); (iii) the C++ extension; (iv) Triton (GPU only: see benchmarks/gpu).
The official code has no closed-form fit, so closed-form rows are compared with (i) at 25 iterations.
"""
from __future__ import annotations

import datetime
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gms_kernels as gk  # noqa: E402
from gms_kernels.backends import backend_available  # noqa: E402
from cases import FITS, SIZES, make_inputs, median_seconds, runner  # noqa: E402

# Floating-point work per element of the fused C++ step (an FMA counts as 2; sqrt, divide, min and
# max as 1 each). The ADAN iteration is counted operation by operation in csrc/gms_step.cpp; the
# other three are estimates from the formulas (moments.py, fit.py, random.py).
FLOPS_MOMENTS = 60        # x0 moments, clamps, M1/Var/M3, kappa3 (double)
FLOPS_ADAN_ITER = 96      # residuals 22, gradients 18, three ADAN updates 54, clamp 2 (float)
FLOPS_CLOSED = 30         # cube root, floor, means (double)
FLOPS_SAMPLING = 40       # Box-Muller + select (integer Philox work not counted)


def flops_per_element(fit: str) -> int:
    iters = FITS[fit].get("fit_iters", 0)
    return FLOPS_MOMENTS + FLOPS_SAMPLING + (FLOPS_CLOSED if fit == "closed" else iters * FLOPS_ADAN_ITER)


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


def main() -> None:
    schedule = gk.Schedule.linear()
    have_cpp = backend_available("cpp")
    rows, timings = [], {}
    for size, shape in SIZES.items():
        x_t, out = make_inputs(shape)
        n = x_t.numel()
        for fit in FITS:
            t = {}
            for backend in ("reference-loop", "torch", "cpp", "cpp-kernel"):
                if backend.startswith("cpp") and not have_cpp:
                    continue
                repeats = 3 if backend in ("reference-loop", "torch") else 15
                t[backend] = median_seconds(runner(backend, fit, x_t, out, schedule), repeats=repeats)
                print(f"{size:16s} {fit:8s} {backend:15s} {t[backend] * 1e3:9.2f} ms", flush=True)
            timings[(size, fit)] = t
            base = t["reference-loop"]
            cells = [f"{base * 1e3:.1f} ms (1x)"]
            for backend in ("torch", "cpp", "cpp-kernel"):
                cells.append(f"{t[backend] * 1e3:.2f} ms ({base / t[backend]:.1f}x)" if backend in t else "not built")
            cells.append("GPU only")
            rows.append(f"| {size} ({n:,}) | {fit} | " + " | ".join(cells) + " |")

    gflops_peak, gbs_peak = measured_ceilings()
    lines = [
        "# GMS per-step cost on CPU",
        "",
        "Command: `python benchmarks/run_cpu.py`",
        "",
        f"Machine: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"Python {platform.python_version()}, {datetime.date.today().isoformat()}.",
        "",
        "One GMS step t=500 -> s=400 (moments, fit, mixture sampling) on batch-100 inputs; median wall time. "
        "Ratios are speed-ups over (i) in the same run. The official code has no closed form, so closed-form "
        "rows are compared with (i) at 25 ADAN iterations (the paper's setting).",
        "",
        "| elements | fit | (i) reference loop | (ii) torch reference (fp64) | (iii) cpp via gk.step | "
        "(iii) cpp kernel alone | (iv) triton |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    if have_cpp:
        c = timings[("cifar10-b100", "adan-25")]
        lines += ["## Acceptance (307,200 elements)", ""]
        for b, what in (("cpp", "through gk.step"), ("cpp-kernel", "kernel alone")):
            speedup = c["reference-loop"] / c[b]
            closed = c[b] / timings[("cifar10-b100", "closed")][b]
            lines += [f"- {what}: cpp adan-25 vs (i) **{speedup:.0f}x** (target >= 50x: "
                      f"{'met' if speedup >= 50 else 'NOT met'}); cpp closed vs cpp adan-25 **{closed:.1f}x** "
                      f"(target >= 5x: {'met' if closed >= 5 else 'NOT met'})."]
        lines += [
            "",
            "## Roofline",
            "",
            f"Measured ceilings on this machine: fp32 sgemm {gflops_peak:.0f} GFLOP/s (2048x2048 torch matmul), "
            f"memory copy {gbs_peak:.1f} GB/s (64 MiB torch copy, read + write).",
            "",
            "| elements | fit | flops / element | cpp kernel GFLOP/s | % of sgemm ceiling | cpp kernel GB/s (20 B / element) | % of copy ceiling |",
            "|---|---|---|---|---|---|---|",
        ]
        for (size, fit), t in timings.items():
            n = 1
            for d in SIZES[size]:
                n *= d
            f = flops_per_element(fit)
            gf = f * n / t["cpp-kernel"] / 1e9
            gb = 20 * n / t["cpp-kernel"] / 1e9
            lines.append(f"| {n:,} | {fit} | {f} | {gf:.1f} | {100 * gf / gflops_peak:.0f}% | {gb:.2f} | "
                         f"{100 * gb / gbs_peak:.0f}% |")
        lines += ["", "Flops per element: ADAN's 96 per iteration are counted in csrc/gms_step.cpp; moments (60), "
                  "closed fit (30) and sampling (40) are estimates. The sgemm figure is the practical fp32 "
                  "ceiling of these 2 cores; ADAN's loop also carries 3 sqrt and 3 divides per iteration, "
                  "about 100 vector instructions per 16 elements in all (35 with a memory operand, in the "
                  "compiled loop). One thread runs the loop at 65-90 cycles "
                  "per 16 elements per iteration (benchmarks/cpp/adan_loop_bench.cpp; the spread is this "
                  "shared VM), 1.1-1.5 vector instructions per cycle. Measured alternatives, none faster by "
                  "more than ~10%: the 14-bit estimates (vrsqrt14ps, vrcp14ps) plus a Newton step instead of "
                  "sqrt and divide (80 cycles), one shared division for the three parameters (71 vs 71), a "
                  "two-pass split of gradients and updates, and 2-4-way interleaving of independent vectors. "
                  "So neither the divide unit nor the FMA ports alone bound it; the long dependency chain "
                  "from the parameters through the square root and division to their update leaves the core "
                  "half busy. With both cores busy each runs the loop ~25% slower than alone. The closed form "
                  "is bound by Philox/Box-Muller and the double-precision moments, not by memory."]
    out = Path(__file__).parent / "results" / "cpu.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
