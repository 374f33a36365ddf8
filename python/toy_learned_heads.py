"""Toy data with learned MLP heads, trained on CPU, next to the oracle heads (paper Tab. toyresult, Fig. 1).

Run from the repository root after `pip install .` (one thread is enough and is what was timed):

    OMP_NUM_THREADS=1 python python/toy_learned_heads.py

Trains, per data set (the 1-D mixture and 8 Gaussians of the oracle study), an MLP eps-network and then
its e2/e3 heads, caches them in gms_out/toy_models/ (`--skip-training` reuses them), samples every row with
5 seeds of 5000 samples (mean and 95% interval over the seeds), and writes
python/results/toy_learned.md (tables, with this command) and python/results/toy_learned_fig1.png.
"""
import argparse
import os
import time
from dataclasses import fields
from pathlib import Path

import torch

from studies import toy_learned as toy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=5000, help="samples per solver run and seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                   help="sampling seeds (the intervals are over these; the nets are trained once, with --seed)")
    p.add_argument("--steps", type=int, nargs="+", default=list(toy.DEFAULT_STEPS), help="the K to evaluate")
    p.add_argument("--datasets", nargs="+", default=list(toy.job.DATASETS), choices=list(toy.job.DATASETS))
    p.add_argument("--backbone-steps", type=int, default=toy.ToyConfig.backbone_steps)
    p.add_argument("--heads-steps", type=int, default=toy.ToyConfig.heads_steps)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", default="gms_out/toy_models", help="where the trained nets are kept")
    p.add_argument("--skip-training", action="store_true", help="use the cached nets (fail if there are none)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    cfg = toy.ToyConfig(backbone_steps=args.backbone_steps, heads_steps=args.heads_steps, seed=args.seed)
    t0 = time.perf_counter()
    res = toy.run(cfg, args.steps, args.samples, args.datasets, cache_dir=args.cache,
                  skip_training=args.skip_training, progress=not args.quiet, seeds=args.seeds)
    total = time.perf_counter() - t0

    defaults = {f.name: f.default for f in fields(toy.ToyConfig)}
    extra = [f"--{k.replace('_', '-')} {v}" for k, v in (("backbone_steps", cfg.backbone_steps),
                                                         ("heads_steps", cfg.heads_steps), ("seed", cfg.seed))
             if v != defaults[k]]
    if args.samples != 5000:
        extra.append(f"--samples {args.samples}")
    if args.seeds != [0, 1, 2, 3, 4]:
        extra.append("--seeds " + " ".join(map(str, args.seeds)))
    if tuple(args.steps) != toy.DEFAULT_STEPS:
        extra.append("--steps " + " ".join(map(str, args.steps)))
    if list(args.datasets) != list(toy.job.DATASETS):
        extra.append("--datasets " + " ".join(args.datasets))
    if args.skip_training:
        extra.append("--skip-training")
    command = " ".join(["OMP_NUM_THREADS=1 python python/toy_learned_heads.py", *extra])

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "toy_learned.md").write_text(toy.report(res, command, total) + "\n")
    toy.plot_fig1(res, out / "toy_learned_fig1.png")
    print(f"wrote {out / 'toy_learned.md'} and {out / 'toy_learned_fig1.png'} ({total:.0f} s)")


if __name__ == "__main__":
    main()
