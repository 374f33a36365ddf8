"""GMS per-step cost on a CUDA GPU: (i) the official loop, (ii) the torch reference, (iv) the Triton kernel.

    python benchmarks/gpu/bench_gpu.py --out benchmarks/results

Reports times as ratios to (i), achieved GB/s and GFLOP/s of the fused kernel against the card's
measured ceilings (device copy, fp32 matmul without TF32), and the step's overhead as a fraction of
one network call when the real-model classes (gms_kernels.models) are available.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gms_kernels as gk  # noqa: E402
from cases import FITS, SIZES, make_inputs, median_seconds, runner  # noqa: E402
from run_cpu import flops_per_element  # noqa: E402


def ceilings() -> tuple[float, float]:
    """(GB/s of a 1 GiB device copy counting read + write, fp32 TFLOP/s of an 8192^3 matmul, TF32 off)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    src = torch.empty(2**28, device="cuda")
    dst = torch.empty_like(src)
    sec = median_seconds(lambda: dst.copy_(src), repeats=10, warmup=3, sync=torch.cuda.synchronize)
    gbs = 2 * src.numel() * 4 / sec / 1e9
    a = torch.randn(8192, 8192, device="cuda")
    sec = median_seconds(lambda: a @ a, repeats=5, warmup=2, sync=torch.cuda.synchronize)
    return gbs, 2 * 8192**3 / sec / 1e12


def network_call_seconds() -> dict[str, float]:
    """One forward pass at batch 100 of the paper's backbones (random weights), if the classes exist."""
    try:
        from gms_kernels import models  # lands with the real-models issue
    except ImportError:
        return {}
    out = {}
    nets = {"cifar10-b100": models.PytorchDDPMUNet, "imagenet64-b100": models.IDDPMUNet.imagenet64}
    for size, make in nets.items():
        net = make().cuda().eval()
        x = torch.randn(SIZES[size], device="cuda")
        t = torch.full((x.shape[0],), 500, device="cuda")
        t = t if getattr(net, "time_input", "index") != "scaled" else t.float() * 1000 / net.schedule.T
        with torch.no_grad():
            out[size] = median_seconds(lambda: net(x, t), repeats=5, warmup=2, sync=torch.cuda.synchronize)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"))
    args = p.parse_args()
    card = torch.cuda.get_device_name()
    schedule = gk.Schedule.linear()
    gbs_peak, tflops_peak = ceilings()
    nets = network_call_seconds()
    rows, perf = [], []
    for size, shape in SIZES.items():
        x_t, out = make_inputs(shape, "cuda")
        n = x_t.numel()
        for fit in FITS:
            t = {b: median_seconds(runner(b, fit, x_t, out, schedule), repeats=5 if b == "triton" else 3,
                                   warmup=2, sync=torch.cuda.synchronize)
                 for b in ("reference-loop", "torch", "triton")}
            base = t["reference-loop"]
            net = nets.get(size)
            overhead = f"{100 * t['triton'] / net:.2f}%" if net else "n/a"
            rows.append(f"| {size} ({n:,}) | {fit} | {base * 1e3:.2f} ms | {t['torch'] * 1e3:.2f} ms "
                        f"({base / t['torch']:.1f}x) | {t['triton'] * 1e6:.0f} us ({base / t['triton']:.0f}x) | {overhead} |")
            gb = 20 * n / t["triton"] / 1e9
            gf = flops_per_element(fit) * n / t["triton"] / 1e9
            perf.append(f"| {size} | {fit} | {gb:.0f} GB/s ({100 * gb / gbs_peak:.0f}%) | "
                        f"{gf:.0f} GFLOP/s ({100 * gf / (tflops_peak * 1e3):.1f}%) |")
            print(rows[-1], flush=True)
    lines = [f"# GMS per-step cost on {card}", "", "Command: `bash benchmarks/gpu/run_gpu.sh`", "",
             f"{card}, torch {torch.__version__}, {datetime.date.today().isoformat()}.", "",
             "| elements | fit | (i) reference loop | (ii) torch reference (fp64) | (iv) triton | triton / one network call |",
             "|---|---|---|---|---|---|", *rows, "",
             f"Measured ceilings: device copy {gbs_peak:.0f} GB/s (read + write), fp32 matmul {tflops_peak:.1f} TFLOP/s "
             "(TF32 off).", "",
             "| elements | fit | achieved bandwidth (20 B / element) | achieved fp32 arithmetic |", "|---|---|---|---|", *perf]
    if nets:
        lines += ["", "One network call at batch 100 (random weights): "
                  + ", ".join(f"{k}: {v * 1e3:.1f} ms" for k, v in nets.items()) + "."]
    else:
        lines += ["", "Network-call timing needs gms_kernels.models (the real-models issue); not measured here."]
    name = f"gpu-{card.replace(' ', '_')}-{datetime.date.today().isoformat()}.md"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / name).write_text("\n".join(lines) + "\n")
    print(f"wrote {Path(args.out) / name}")


if __name__ == "__main__":
    main()
