"""How well the fused kernels' fp32 ADAN loop (the default) fits, against the fp64 torch reference.

    python benchmarks/adan_precision.py [--out benchmarks/results/adan-precision.md]

For each number of iterations and step t -> s, one batch of data-like moments (means in
[-1.3, 1.3], variances from 5e-6 to 0.5, skews inside and far outside what the mixture can match,
the data range [-1, 1]) goes through gk.step with each backend. The table gives, per element, how far
the fitted mixture's mean is from M1 and its variance from Var (in units of sqrt(Var) and Var): the
fit's own accuracy, which is what an fp32 loop may cost. Runs on CPU (Triton through its interpreter).
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU tensors, interpreter

import torch  # noqa: E402

import gms_kernels as gk  # noqa: E402
from gms_kernels.kernels.dispatch import backend_available  # noqa: E402

CASES = [(25, 900, 800), (25, 200, 100), (40, 200, 100), (70, 900, 800), (70, 500, 400), (70, 200, 100),
         (70, 60, 30)]  # (iterations, t, s)
SHAPE = (4, 3, 16, 16)
WEIGHTS = (1.0 / 3.0, 2.0 / 3.0)


def data_like_step_inputs(t: int, schedule: gk.Schedule, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x_t and the heads (E[eps], E[eps^2], E[eps^3]) of x0 distributions with the moments above."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda: torch.rand(SHAPE, generator=g, dtype=torch.float64)
    mean0 = rand() * 2.6 - 1.3
    var0 = torch.exp(rand() * math.log(1e-5)) * 0.5
    k3_0 = (rand() * 2 - 1) * torch.where(rand() < 0.3, 40.0, 1.5) * var0**1.5
    a, s = schedule.alpha(t), schedule.sigma(t)
    x_t = a * (mean0 + var0.sqrt() * torch.randn(SHAPE, generator=g, dtype=torch.float64))
    x_t = x_t + s * torch.randn(SHAPE, generator=g, dtype=torch.float64)
    dev = x_t - a * mean0  # eps = (x_t - a x0) / s
    e1 = dev / s
    e2 = (dev**2 + a**2 * var0) / s**2
    e3 = (dev**3 + 3 * dev * a**2 * var0 - a**3 * k3_0) / s**3
    return x_t.float(), torch.cat([e1, e2, e3], dim=1).float()


def fit_errors(info: dict, m1: torch.Tensor, var: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """|mixture mean - M1| / sqrt(Var) and |mixture variance - Var| / Var per element."""
    mu1, mu2, s2 = (info[k].double() for k in ("mu1", "mu2", "s2"))
    mean = WEIGHTS[0] * mu1 + WEIGHTS[1] * mu2
    mix_var = WEIGHTS[0] * mu1**2 + WEIGHTS[1] * mu2**2 - mean**2 + s2
    return (mean - m1).abs() / var.sqrt(), (mix_var - var).abs() / var


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/adan-precision.md")
    args = ap.parse_args()
    schedule = gk.Schedule.linear()
    backends = [b for b in ("cpp", "triton") if backend_available(b)]
    columns = [("torch", None)] + [(b, p) for b in backends for p in ("float32", "float64")]
    rows = []
    for iters, t, s in CASES:
        x_t, out = data_like_step_inputs(t, schedule, seed=iters * 1000 + t)
        opts = dict(fit="adan", fit_iters=iters, data_range=(-1.0, 1.0))
        _, ref = gk.step(x_t.double(), out.double(), t, s, schedule, "gms", generator=0, return_info=True,
                         backend="torch", **opts)
        m1, var = ref["m1"], ref["var"]
        cells = []
        for backend, precision in columns:
            info = ref if backend == "torch" else gk.step(x_t, out, t, s, schedule, "gms", generator=0,
                                                          return_info=True, backend=backend,
                                                          adan_precision=precision, **opts)[1]
            mean_err, var_err = fit_errors(info, m1, var)
            cells.append(f"{float(mean_err.median()):.1e} / {float(mean_err.max()):.2g} ; "
                         f"{float(var_err.median()):.1e} / {float(var_err.max()):.2g}")
        rows.append(f"| {iters} | {t} -> {s} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    names = ["fp64 torch reference"] + [f"{b} {p}{' (default)' if p == 'float32' else ''}" for b, p in columns[1:]]
    lines = ["# The fp32 ADAN loop against the fp64 reference", "",
             f"Command: `python benchmarks/adan_precision.py`. {platform.processor() or platform.machine()}, "
             f"torch {torch.__version__}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}.", "",
             f"One step on {math.prod(SHAPE):,} data-like elements per row (data range [-1, 1], "
             "lr 0.06). Each cell: the fitted mixture's |mean - M1| / sqrt(Var), median / max ; "
             "|variance - Var| / Var, median / max.", "",
             "| iterations | step | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names), *rows, ""]
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("wrote", args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
