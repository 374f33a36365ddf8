"""Oracle benchmark: every solver with exact heads on Gaussian-mixture data.

Run from the repository root after `pip install .`:

    OMP_NUM_THREADS=1 python python/oracle_benchmark.py

Every row runs with 5 seeds (mean and 95% interval over them). Writes python/results/oracle.md (the tables,
with this command) and python/results/oracle_fig1.png.
"""
import argparse
import os
from pathlib import Path

import torch

from gms_kernels.eval import oracle_job as job
from studies import oracle_study as study


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=5000, help="samples per run (per solver, K and seed)")
    p.add_argument("--steps", type=int, nargs="+", default=list(job.DEFAULT_STEPS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="the intervals are over these")
    p.add_argument("--ggf", choices=["full", "fast"], default="full",
                   help="GGF's grid: full (also eps_abs 1e-4) or fast (eps_abs 0.0078 only)")
    p.add_argument("--datasets", nargs="+", default=list(job.DATASETS), choices=list(job.DATASETS))
    p.add_argument("--save", help="save the results (a .pt) instead of writing the report, e.g. one data set per run")
    p.add_argument("--merge", nargs="+", help="write the report from these saved results (one per data set)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    grid = study.GGF_GRID if args.ggf == "full" else tuple(g for g in study.GGF_GRID if g[2] == 0.0078)
    if args.merge:
        parts = [torch.load(path, weights_only=False) for path in args.merge]
        res = parts[0]
        for part in parts[1:]:
            res.results.update(part.results)
            res.ggf.update(part.ggf)
            res.samples.update(part.samples)
    else:
        res = job.run_oracle_job(args.samples, args.steps, args.datasets, seeds=args.seeds, ggf_settings=grid)
        if args.save:
            torch.save(res, args.save)
            print(f"saved {args.save}")
            return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = "" if res.n_samples == 5000 else f" --samples {res.n_samples}"
    extra += "" if list(res.steps) == list(job.DEFAULT_STEPS) else f" --steps {' '.join(map(str, res.steps))}"
    extra += "" if list(res.seeds) == [0, 1, 2, 3, 4] else f" --seeds {' '.join(map(str, res.seeds))}"
    fast = all(entry[2] == 0.0078 for rows in res.ggf.values() for entry in rows)
    extra += " --ggf fast" if fast else ""
    command = "OMP_NUM_THREADS=1 python python/oracle_benchmark.py" + extra
    if args.merge:
        command = (f"{command} --datasets 1d --save 1d.pt; {command} --datasets 8gauss --save 8gauss.pt; "
                   f"python python/oracle_benchmark.py --merge 1d.pt 8gauss.pt (one data set per process, in parallel)")
    (out / "oracle.md").write_text(study.report(res, command) + "\n")
    job.plot_fig1(res, out / "oracle_fig1.png")
    print(f"wrote {out / 'oracle.md'} and {out / 'oracle_fig1.png'}")


if __name__ == "__main__":
    main()
