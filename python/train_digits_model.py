"""Train the embedded default model: a small UNet on scikit-learn's digits (8x8, [-1, 1]) plus e2/e3 heads.

    python python/train_digits_model.py            # ~10-20 min on 2 CPU cores, seeded

Stage 1 trains the eps backbone (train-backbone), stage 2 freezes it and trains the conv heads for
eps^2 and eps^3 (paper Alg. learning). The backbone is rounded to fp16 before stage 2, so the heads
are trained on exactly the weights that ship; the whole MomentNet is saved (fp16 storage) to
gms_kernels/assets/digits_gms.pt (< 5 MB). Checkpoints in --work make the run resumable.

    python python/train_digits_model.py --more-head-steps 4000 --head-batch-size 256 --head-lr 5e-4

continues training only the heads of the shipped model (the backbone is untouched) and saves it again.

    python python/train_digits_model.py --heads-on gms_kernels/assets/digits_gms.pt --targets central \
        --head-loss normalized --work gms_out/digits_training_norm --out gms_out/digits_central_norm.pt

trains new heads (fresh weights, the same head recipe) on the backbone of an existing model file, here with the
t-normalised head loss (gk.training.train_heads(loss_weighting="normalized"); the default --head-loss uniform
is the plain MSE every shipped model was trained with).
``--head res_conv`` builds Res+Conv heads (a time-conditioned residual block before the conv head) instead of
the plain conv heads (``conv``, the default and the shipped models). ``--head-scale`` multiplies each head's output
by its target's RMS at t (train_heads(output_scale=True), a per-t table saved in the model file; use it with
``--head-loss normalized``); the shipped models have no such table. Each kind of run keeps checkpoints of its own.
The shipped model: ``python python/train_digits_model.py --targets central`` (3000 backbone steps, then 1200
central-moment head steps, on the train split of gk.data.digits: 60% of the images; validation and test are held
out for choosing and reporting). The raw-heads model it was chosen against: the same command without --targets.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from gms_kernels.core.data import digits
from gms_kernels.models.embedded import DIGITS_CONFIG, DIGITS_MODEL, build_digits_backbone, default_model, save_embedded
from studies.head_training import add_head_options, head_run_tag
from gms_kernels.models import MomentNet
from gms_kernels.train.training import train_backbone, train_heads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbone-steps", type=int, default=3000)
    p.add_argument("--head-steps", type=int, default=1200)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="train", choices=("train", "all"),
                   help="digits split to train on (the shipped model: train; validation and test stay unseen)")
    p.add_argument("--more-head-steps", type=int, default=0,
                   help="only continue training the heads of the model at --out for this many steps")
    p.add_argument("--head-batch-size", type=int, default=128)
    p.add_argument("--head-lr", type=float, default=1e-3)
    add_head_options(p, "skip the backbone stage: train new heads on the backbone of this embedded model file")
    p.add_argument("--work", default="gms_out/digits_training")
    p.add_argument("--out", default=str(DIGITS_MODEL))
    args = p.parse_args()

    torch.manual_seed(args.seed)
    data, _ = digits(args.split)
    work = Path(args.work)
    heads_file = f"heads{head_run_tag(args)}.pt"
    if args.more_head_steps:
        net = default_model(args.out)
        train_heads(net, data, steps=args.more_head_steps, batch_size=args.head_batch_size, lr=args.head_lr,
                    optimizer="adan", ema_decay=0.999, checkpoint=work / f"more_{heads_file}", seed=args.seed + 2,
                    loss_weighting=args.head_loss, output_scale=args.head_scale)
        size = save_embedded(net.eval(), args.out)
        print(f"wrote {args.out} ({size / 1e6:.2f} MB)")
        return
    if args.heads_on:  # the head stage alone, on an existing (already fp16-rounded) backbone
        net = MomentNet(default_model(args.heads_on).backbone, orders=(2, 3), head=args.head, targets=args.targets)
        t0 = time.perf_counter()
        train_heads(net, data, steps=args.head_steps, batch_size=args.head_batch_size, lr=args.head_lr,
                    optimizer="adan", ema_decay=0.999, checkpoint=work / f"on_model_{args.targets}_{heads_file}",
                    seed=args.seed + 1, loss_weighting=args.head_loss, output_scale=args.head_scale)
        print(f"heads: {args.head_steps} steps in {time.perf_counter() - t0:.0f} s")
        size = save_embedded(net.eval(), args.out)
        print(f"wrote {args.out} ({size / 1e6:.2f} MB)")
        return
    backbone = build_digits_backbone()
    print(f"backbone {DIGITS_CONFIG}: {sum(p.numel() for p in backbone.parameters()):,} parameters")
    train_backbone(backbone, data, steps=args.backbone_steps, batch_size=args.batch_size, lr=2e-4,
                   optimizer="adam", ema_decay=0.999, checkpoint=work / "backbone.pt", seed=args.seed)
    with torch.no_grad():  # ship fp16 weights: train the heads on exactly those
        for prm in backbone.parameters():
            prm.copy_(prm.half().float())
    net = MomentNet(backbone, orders=(2, 3), head=args.head, targets=args.targets)
    train_heads(net, data, steps=args.head_steps, batch_size=args.head_batch_size, lr=args.head_lr, optimizer="adan",
                ema_decay=0.999, checkpoint=work / heads_file, seed=args.seed + 1, loss_weighting=args.head_loss,
                output_scale=args.head_scale)
    size = save_embedded(net, args.out)
    print(f"wrote {args.out} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
