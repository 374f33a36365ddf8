"""Train the shipped patches model: a small UNet on 8x8 grey natural-image patches plus e2/e3 heads.

    nice -n 5 python python/train_patches_model.py       # ~19 min on 1 thread of a shared 2-core CPU, seeded

Data: ``gk.data.patches`` (scikit-image's bundled photos, split by photo). Stage 1 trains the eps
backbone on the train split; its EMA weights are kept every --eval-every steps and scored on the
validation split (eps MSE at a fixed seeded draw of t and noise); the best one is kept (the choice of
the number of backbone steps). Stage 2 rounds that backbone to fp16 (the weights that ship), freezes
it and trains conv heads for eps^2 and eps^3 (paper Alg. learning); their validation losses are
printed. The MomentNet is saved in fp16 to gms_kernels/assets/patches_gms.pt (< 5 MB).

Checkpoints and the validation record live in --work, so an interrupted run resumes where it stopped.
The shipped model: this command with its defaults (2400 backbone steps, Adam 5e-4, batch 128, EMA 0.999;
validation eps MSE 0.0329 / 0.0315 / 0.0309 / 0.0303 at 600 / 1200 / 1800 / 2400 steps, so 2400 was kept,
still improving slowly; then 800 ADAN head steps at batch 256, lr 1e-3: validation MSE e2 0.609 against 2.006
for the trivial e2 = 1).

    python python/train_patches_model.py --heads-on gms_kernels/assets/patches_gms.pt --targets central --out FILE

trains central-moment heads (MomentNet targets="central") with the same head recipe on a model's backbone;
``--head-loss normalized`` trains them with the t-normalised loss (gk.training.train_heads(loss_weighting=
"normalized")) instead of the plain MSE (``uniform``, the default, which every shipped model used).
``--head res_conv`` builds Res+Conv heads (a time-conditioned residual block before the conv head) instead of
the plain conv heads (``conv``, the default and the shipped models). ``--head-scale`` multiplies each head's output
by its target's RMS at t (train_heads(output_scale=True), a per-t table saved in the model file; use it with
``--head-loss normalized``); the shipped models have no such table.
The shipped model: this command on the raw-heads model described above (the stage-1 command's output).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from gms_kernels.core.data import patches
from gms_kernels.models.embedded import PATCHES_CONFIG, PATCHES_MODEL, build_patches_backbone, patches_model, save_embedded
from studies.head_training import add_head_options, head_run_tag
from studies.patches_study import eps_losses
from gms_kernels.core.files import save_atomically
from gms_kernels.models import MomentNet
from gms_kernels.train.training import train_backbone, train_heads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbone-steps", type=int, default=2400)
    p.add_argument("--eval-every", type=int, default=600, help="validation of the backbone every this many steps")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--head-steps", type=int, default=800)
    p.add_argument("--head-batch-size", type=int, default=256)
    p.add_argument("--head-lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (more than the free cores slows training down many times over)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default="gms_out/patches_training")
    p.add_argument("--out", default=str(PATCHES_MODEL))
    add_head_options(p, "skip stage 1: train new heads on the backbone of this embedded model file")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train, val = patches("train"), patches("validation")
    print(f"patches: train {tuple(train.shape)}, validation {tuple(val.shape)}")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    record_path = work / "validation.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"backbone": {}}

    if args.heads_on:  # the same head stage on an existing (already fp16-rounded) backbone
        net = MomentNet(patches_model(args.heads_on).backbone, orders=(2, 3), head=args.head, targets=args.targets)
        t0 = time.perf_counter()
        train_heads(net, train, steps=args.head_steps, batch_size=args.head_batch_size, lr=args.head_lr,
                    optimizer="adan", ema_decay=0.999,
                    checkpoint=work / f"heads_{args.targets}{head_run_tag(args)}_on_model.pt", seed=args.seed + 1,
                    progress=False, loss_weighting=args.head_loss, output_scale=args.head_scale)
        print(f"heads: {args.head_steps} steps in {time.perf_counter() - t0:.0f} s")
        size = save_embedded(net.eval(), args.out, PATCHES_CONFIG)
        print(f"wrote {args.out} ({size / 1e6:.2f} MB)")
        return
    backbone = build_patches_backbone()
    print(f"backbone {PATCHES_CONFIG}: {sum(q.numel() for q in backbone.parameters()):,} parameters")
    for stop in range(args.eval_every, args.backbone_steps + 1, args.eval_every):
        snapshot = work / f"backbone_ema_{stop}.pt"
        if str(stop) not in record["backbone"] or not snapshot.exists():
            t0 = time.perf_counter()
            train_backbone(backbone, train, steps=stop, batch_size=args.batch_size, lr=args.lr, optimizer="adam",
                           ema_decay=0.999, checkpoint=work / "backbone.pt", seed=args.seed, progress=False)
            backbone.eval()  # train_backbone left the EMA weights in the module
            save_atomically(backbone.state_dict(), snapshot)
            losses = eps_losses(backbone, val, seed=args.seed)
            record["backbone"][str(stop)] = {"val_mse_e1": losses["mse_e1"], "trivial": losses["trivial_e1"],
                                             "seconds": time.perf_counter() - t0}
            record_path.write_text(json.dumps(record, indent=1))
        r = record["backbone"][str(stop)]
        print(f"backbone step {stop}: validation eps MSE {r['val_mse_e1']:.4f} (trivial {r['trivial']:.4f})")
    best = min(record["backbone"], key=lambda s: record["backbone"][s]["val_mse_e1"])
    print(f"chosen: the EMA backbone after {best} steps")
    backbone.load_state_dict(torch.load(work / f"backbone_ema_{best}.pt", map_location="cpu", weights_only=True))
    with torch.no_grad():  # ship fp16 weights: train the heads on exactly those
        for prm in backbone.parameters():
            prm.copy_(prm.half().float())
    net = MomentNet(backbone, orders=(2, 3), head=args.head, targets=args.targets)
    t0 = time.perf_counter()
    train_heads(net, train, steps=args.head_steps, batch_size=args.head_batch_size, lr=args.head_lr,
                optimizer="adan", ema_decay=0.999, checkpoint=work / f"heads{head_run_tag(args)}_from_{best}.pt",
                seed=args.seed + 1, progress=False, loss_weighting=args.head_loss, output_scale=args.head_scale)
    net.eval()
    losses = eps_losses(net, val, seed=args.seed)
    record["chosen_backbone_steps"] = int(best)
    record["heads"] = {**losses, "seconds": time.perf_counter() - t0}
    record_path.write_text(json.dumps(record, indent=1))
    print("validation losses of the MomentNet: " + ", ".join(f"{k} {v:.4f}" for k, v in losses.items()))
    size = save_embedded(net, args.out, PATCHES_CONFIG)
    print(f"wrote {args.out} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
