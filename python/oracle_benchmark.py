"""Oracle benchmark: every solver with exact heads on Gaussian-mixture data (foundation issue).

Run from the repository root after `pip install .`:

    python python/oracle_benchmark.py

Writes python/results/oracle.md (the tables, with this command) and python/results/oracle_fig1.png.
"""
import argparse
from pathlib import Path

from gms_kernels.experiments import oracle_study as study


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--steps", type=int, nargs="+", default=list(study.DEFAULT_STEPS))
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args()
    res = study.run_study(args.samples, args.steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = "" if args.samples == 20000 and args.steps == list(study.DEFAULT_STEPS) else \
        f" --samples {args.samples} --steps {' '.join(map(str, args.steps))}"
    (out / "oracle.md").write_text(study.report(res, "python python/oracle_benchmark.py" + extra) + "\n")
    study.plot_fig1(res, out / "oracle_fig1.png")
    print(f"wrote {out / 'oracle.md'} and {out / 'oracle_fig1.png'}")


if __name__ == "__main__":
    main()
