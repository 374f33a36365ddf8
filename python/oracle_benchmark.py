"""Oracle benchmark: every solver with exact heads on Gaussian-mixture data (foundation issue).

Run from the repository root after `pip install .`:

    OMP_NUM_THREADS=1 python python/oracle_benchmark.py

Every row runs with 5 seeds (mean and 95% interval over them). Writes python/results/oracle.md (the tables,
with this command) and python/results/oracle_fig1.png.
"""
import argparse
import os
from pathlib import Path

import torch

from gms_kernels.experiments import oracle_study as study


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=5000, help="samples per run (per solver, K and seed)")
    p.add_argument("--steps", type=int, nargs="+", default=list(study.DEFAULT_STEPS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="the intervals are over these")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    res = study.run_study(args.samples, args.steps, seeds=args.seeds, ggf_grid=study.GGF_GRID)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = "" if args.samples == 5000 else f" --samples {args.samples}"
    extra += "" if args.steps == list(study.DEFAULT_STEPS) else f" --steps {' '.join(map(str, args.steps))}"
    extra += "" if args.seeds == [0, 1, 2, 3, 4] else f" --seeds {' '.join(map(str, args.seeds))}"
    command = "OMP_NUM_THREADS=1 python python/oracle_benchmark.py" + extra
    (out / "oracle.md").write_text(study.report(res, command) + "\n")
    study.plot_fig1(res, out / "oracle_fig1.png")
    print(f"wrote {out / 'oracle.md'} and {out / 'oracle_fig1.png'}")


if __name__ == "__main__":
    main()
