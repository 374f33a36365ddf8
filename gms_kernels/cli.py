"""The ``gms-kernels`` command line (also ``python -m gms_kernels``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence


def _oracle(args: argparse.Namespace) -> int:
    from .experiments import oracle_study as study

    command = "gms-kernels " + " ".join(args.argv) if args.argv else "gms-kernels"
    print(f"Oracle study: {args.samples} samples, K in {args.steps}, datasets {args.datasets}")
    res = study.run_study(args.samples, args.steps, args.datasets, seed=args.seed, progress=not args.quiet)
    text = study.report(res, command)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "oracle.md").write_text(text + "\n")
    print(text)
    if "1d" in args.datasets:
        png = study.plot_fig1(res, out / "oracle_fig1.png")
        print(f"\nwrote {out / 'oracle.md'} and {png}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gms-kernels", description="Gaussian Mixture Solvers for diffusion models.")
    sub = p.add_subparsers(dest="command")
    o = sub.add_parser("oracle", help="solver study with exact heads on Gaussian-mixture data (the default job)")
    o.add_argument("--samples", type=int, default=20000)
    o.add_argument("--steps", type=int, nargs="+", default=[2, 5, 10, 20, 50])
    o.add_argument("--datasets", nargs="+", default=["1d", "8gauss"], choices=["1d", "8gauss"])
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--out", default="gms_out")
    o.add_argument("--quiet", action="store_true")
    o.set_defaults(func=_oracle)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv or ["oracle"])
    args.argv = argv
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
