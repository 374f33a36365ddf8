"""The head-stage options that python/train_digits_model.py and python/train_patches_model.py share, and the
tag that keeps each kind of head run in checkpoints of its own."""
from __future__ import annotations

import argparse

from gms_kernels.models.moment_net import TRAINABLE_HEAD_KINDS
from gms_kernels.train.training import HEAD_LOSS_WEIGHTINGS


def add_head_options(p: argparse.ArgumentParser, heads_on_help: str) -> None:
    """--targets, --heads-on, --head and --head-loss (defaults: what the shipped models were trained with)."""
    p.add_argument("--targets", choices=("raw", "central"), default="raw",
                   help="what the heads learn: E[eps^n|x_t] (raw, the paper) or E[(eps - e1)^n|x_t] (central)")
    p.add_argument("--heads-on", metavar="MODEL", default=None, help=heads_on_help)
    p.add_argument("--head", choices=TRAINABLE_HEAD_KINDS, default="conv",
                   help="head architecture (MomentNet head=): conv (the shipped models) or res_conv (a residual "
                        "block conditioned on the time embedding, then the conv head; the paper's Res+Conv)")
    p.add_argument("--head-loss", choices=HEAD_LOSS_WEIGHTINGS, default="uniform",
                   help="the heads' loss over t (train_heads' loss_weighting): plain MSE (uniform, the shipped "
                        "models), or each squared error divided by an estimate of E[target^2 | t] (normalized) "
                        "or by its square root (rms)")
    p.add_argument("--head-scale", action="store_true",
                   help="scale each head's output by its target's RMS at t (train_heads(output_scale=True): a fixed "
                        "per-t table saved with the model; best with --head-loss normalized, where the heads then "
                        "regress targets of size about 1 at every t). Off: the shipped models")


def head_run_tag(args: argparse.Namespace) -> str:
    """'' for the shipped kind of run (conv heads, uniform loss, no output scale), else '_res_conv', '_rms',
    '_res_conv_rms', '_normalized_scaled', ...: put into the checkpoint names, so that a run never resumes the
    checkpoint of another kind of head, loss or output scale."""
    head = "" if args.head == "conv" else f"_{args.head}"
    tag = head + ("" if args.head_loss == "uniform" else f"_{args.head_loss}")
    return tag + ("_scaled" if getattr(args, "head_scale", False) else "")
