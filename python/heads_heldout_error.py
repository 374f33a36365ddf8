"""The held-out error of central e2/e3 heads, for models that share one backbone.

    python python/heads_heldout_error.py --testbed digits gms_out/digits_central.pt gms_out/digits_central_long.pt

For each model (a MomentNet with ``targets="central"``, embedded format) and each t, the validation images are
noised to x_t with ``--draws`` seeded noise draws eps (the same draws for every model), r = eps - e1 is the
backbone's residual, and the heads' outputs c2, c3 are scored against r^2 and r^3 (what they were trained on):

    mse_c2 = mean (c2 - r^2)^2,   mse_c3 = mean (c3 - r^3)^2.

Each is E[(c_n - E[r^n | x_t])^2] plus the irreducible Var[r^n | x_t], and the second part is the same for every
model on one backbone (same x_t, same r), so differences between models are differences of the heads' own error
against the true conditional central moments. The row ``all`` draws t uniformly from 0..T-1 per image (the
training loss's weighting). Data: the digits validation split, or --patches patches evenly spaced over the
validation photos' patches (or, --split train-photos, over held-out positions of the train photos).
"""
from __future__ import annotations

import argparse

import torch

from gms_kernels.core.data import digits, patch_photos, patches
from gms_kernels.models.embedded import default_model, patches_model
from gms_kernels.core.schedule import Schedule


def errors(net, data: torch.Tensor, ts: list[int | None], draws: int, seed: int = 0) -> dict:
    schedule = Schedule.linear()
    C, out = data.shape[1], {}
    for t in ts:
        sums, n = {"mse_c2": 0.0, "mse_c3": 0.0}, 0
        for d in range(draws):
            g = torch.Generator().manual_seed(seed * 1000 + d)
            eps = torch.randn(data.shape, generator=g)
            tt = torch.randint(0, schedule.T, (data.shape[0],), generator=g) if t is None else \
                torch.full((data.shape[0],), t)
            x_t = schedule.add_noise(data, eps, tt)
            with torch.no_grad():
                pred = net(x_t, tt, head_outputs=True).double()
            r = eps.double() - pred[:, :C]
            sums["mse_c2"] += float((pred[:, C:2 * C] - r**2).pow(2).sum())
            sums["mse_c3"] += float((pred[:, 2 * C:3 * C] - r**3).pow(2).sum())
            n += r.numel()
        out["all" if t is None else t] = {k: v / n for k, v in sums.items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--testbed", choices=("digits", "patches"), default="digits")
    p.add_argument("--times", type=int, nargs="+", default=[50, 100, 200, 400, 700, 900])
    p.add_argument("--draws", type=int, default=8)
    p.add_argument("--patches", type=int, default=2000, help="how many patches")
    p.add_argument("--split", choices=("validation", "train-photos"), default="validation",
                   help="patches: the validation photos, or held-out positions of the train photos (the quality "
                        "testbed's train-photos reference set)")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.testbed == "digits":
        data, load = digits("validation")[0], default_model
    else:
        data = patches("validation") if args.split == "validation" else \
            patches("train", per_photo=-(-10000 // len(patch_photos("train"))), seed=1000)
        keep = torch.linspace(0, data.shape[0] - 1, min(args.patches, data.shape[0])).long()  # all photos
        data, load = data[keep], patches_model
    ts = [None, *args.times]
    results = {m: errors(load(m).eval(), data, ts, args.draws) for m in args.models}
    split = "validation" if args.testbed == "digits" else args.split
    print(f"{args.testbed}: {data.shape[0]} {split} images x {args.draws} noise draws per t\n")
    print("| t | " + " | ".join(f"mse_c2 {m} | mse_c3 {m}" for m in args.models) + " |")
    print("|---|" + "---|---|" * len(args.models))
    for t in ["all", *args.times]:
        cells = " | ".join(f"{results[m][t]['mse_c2']:.5f} | {results[m][t]['mse_c3']:.5f}" for m in args.models)
        print(f"| {t} | {cells} |")


if __name__ == "__main__":
    main()
