"""GMS per-step cost on a CUDA GPU: (i) the official loop, (ii) the torch reference, (iv) the Triton kernel.

    python benchmarks/gpu/bench_gpu.py --out benchmarks/results
    TRITON_INTERPRET=1 python benchmarks/gpu/bench_gpu.py --smoke --out /tmp/x   # CPU dry run (tests)

``--smoke`` runs every part of the script at tiny sizes, once each, on the GPU if there is one and
otherwise on the CPU through the Triton interpreter: a check that the script works before device
time is spent on it, not a measurement.

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


class Setup:
    """Where and how much to run: the real benchmark on CUDA, or --smoke (tiny, once each)."""

    def __init__(self, smoke: bool):
        self.smoke = smoke
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cpu" and not smoke:
            raise SystemExit("bench_gpu.py needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1 for a dry run)")
        self.sync = torch.cuda.synchronize if self.device == "cuda" else None
        # batch 2 instead of 100 in a dry run, same image sizes
        self.sizes = {k: ((2,) + v[1:] if smoke else v) for k, v in SIZES.items()}
        self.fits = {k: (dict(v, fit_iters=2) if smoke and "fit_iters" in v else v) for k, v in FITS.items()}

    def seconds(self, fn, repeats: int, warmup: int) -> float:
        return median_seconds(fn, repeats=1 if self.smoke else repeats, warmup=0 if self.smoke else warmup,
                              sync=self.sync)


def ceilings(env: Setup) -> tuple[float, float]:
    """(GB/s of a 1 GiB device copy counting read + write, fp32 TFLOP/s of an 8192^3 matmul, TF32 off)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    n, m = (2**20, 256) if env.smoke else (2**28, 8192)
    src = torch.empty(n, device=env.device)
    dst = torch.empty_like(src)
    sec = env.seconds(lambda: dst.copy_(src), repeats=10, warmup=3)
    gbs = 2 * src.numel() * 4 / sec / 1e9
    a = torch.randn(m, m, device=env.device)
    sec = env.seconds(lambda: a @ a, repeats=5, warmup=2)
    return gbs, 2 * m**3 / sec / 1e12


def network_call_seconds(env: Setup) -> dict[str, float]:
    """One forward pass (batch 100; 1 in a dry run) of the paper's backbones, random weights."""
    from gms_kernels import models

    out = {}
    nets = {"cifar10-b100": models.PytorchDDPMUNet, "imagenet64-b100": models.IDDPMUNet.imagenet64}
    for size, make in nets.items():
        net = make().to(env.device).eval()
        shape = (1,) + SIZES[size][1:] if env.smoke else SIZES[size]
        x = torch.randn(shape, device=env.device)
        t = torch.full((x.shape[0],), 500, device=env.device)
        t = t if getattr(net, "time_input", "index") != "scaled" else t.float() * 1000 / net.schedule.T
        with torch.no_grad():
            out[size] = env.seconds(lambda: net(x, t), repeats=5, warmup=2)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"))
    p.add_argument("--smoke", action="store_true", help="tiny sizes, once each, CPU allowed: a dry run")
    args = p.parse_args()
    env = Setup(args.smoke)
    card = torch.cuda.get_device_name() if env.device == "cuda" else "cpu"
    if env.smoke:
        card += "-smoke"
    schedule = gk.Schedule.linear()
    gbs_peak, tflops_peak = ceilings(env)
    nets = network_call_seconds(env)
    rows, perf = [], []
    for size, shape in env.sizes.items():
        x_t, out = make_inputs(shape, env.device)
        n = x_t.numel()
        for fit, options in env.fits.items():
            t = {b: env.seconds(runner(b, fit, x_t, out, schedule, options),
                                repeats=3 if b in ("reference-loop", "torch") else 20, warmup=2)
                 for b in ("reference-loop", "torch", "triton", "triton-kernel")}
            base, kernel = t["reference-loop"], t["triton-kernel"]
            rows.append(f"| {size} ({n:,}) | {fit} | {base * 1e3:.2f} ms | {t['torch'] * 1e3:.2f} ms "
                        f"({base / t['torch']:.1f}x) | {t['triton'] * 1e6:.0f} us ({base / t['triton']:.0f}x) | "
                        f"{kernel * 1e6:.0f} us ({base / kernel:.0f}x) | {100 * t['triton'] / nets[size]:.2f}% | "
                        f"{100 * kernel / nets[size]:.2f}% |")
            gb = 20 * n / kernel / 1e9
            gf = flops_per_element(fit, options) * n / kernel / 1e9
            perf.append(f"| {size} | {fit} | {gb:.0f} GB/s ({100 * gb / gbs_peak:.0f}%) | "
                        f"{gf:.0f} GFLOP/s ({100 * gf / (tflops_peak * 1e3):.1f}%) |")
            print(rows[-1], flush=True)
    lines = [f"# GMS per-step cost on {card}", "", "Command: `bash benchmarks/gpu/run_gpu.sh`", "",
             f"{card}, torch {torch.__version__}, {datetime.date.today().isoformat()}.", "",
             "| elements | fit | (i) reference loop | (ii) torch reference (fp64) | (iv) triton via gk.step | "
             "(iv) triton kernel alone | gk.step / one network call | kernel / one network call |",
             "|---|---|---|---|---|---|---|---|", *rows, "",
             "Times are medians (device synchronised around each call). The inputs of one size fit in the "
             "card's L2 cache, so the kernel-alone figures are an upper bound on the step's speed inside a "
             "sampler, where the network's activations pass through the cache in between.", "",
             f"Measured ceilings: device copy {gbs_peak:.0f} GB/s (read + write), fp32 matmul {tflops_peak:.1f} TFLOP/s "
             "(TF32 off).", "",
             "| elements | fit | achieved bandwidth (20 B / element; kernel alone) | achieved fp32 arithmetic |",
             "|---|---|---|---|", *perf]
    lines += ["", "One network call at batch 100 (random weights): "
              + ", ".join(f"{k}: {v * 1e3:.1f} ms" for k, v in nets.items()) + "."]
    if env.smoke:
        lines[0] += " (dry run at tiny sizes: not a measurement)"
    name = f"gpu-{card.replace(' ', '_')}-{datetime.date.today().isoformat()}.md"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / name).write_text("\n".join(lines) + "\n")
    print(f"wrote {Path(args.out) / name}")


if __name__ == "__main__":
    main()
