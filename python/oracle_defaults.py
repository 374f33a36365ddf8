"""The oracle benchmark's own GMS options: chosen on a validation split with gk.choose_options (as for the shipped
models), then tested against SN-DDPM, DDPM and the library's defaults on the oracle benchmark's test seeds.

Run from the repository root after `pip install .`:

    OMP_NUM_THREADS=1 python python/oracle_defaults.py

Writes python/results/oracle_defaults.md. Exact heads (gk.GaussianMixtureOracle), W1 against fresh data; validation:
sampler seeds 100-102 and fresh data of seed 100 (studies.oracle_study.VALIDATION_SEEDS); test: seeds
0-4 with the fresh data of python/results/oracle.md.
"""
import argparse
import time
from pathlib import Path

import torch

from gms_kernels.core.devices import cpu_description
from gms_kernels.eval.oracle_job import DATASETS
from studies import oracle_study as study


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--steps", type=int, nargs="+", default=[5, 10, 20])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "oracle_defaults.md"))
    args = p.parse_args()
    torch.set_num_threads(1)
    command = "OMP_NUM_THREADS=1 python python/oracle_defaults.py" + (
        f" --samples {args.samples}" if args.samples != 1000 else "") + (
        f" --steps {' '.join(map(str, args.steps))}" if args.steps != [5, 10, 20] else "") + (
        f" --datasets {' '.join(args.datasets)}" if args.datasets != list(DATASETS) else "")
    t0 = time.perf_counter()
    parts = []
    for name in args.datasets:
        oracle, choice = study.choose_oracle_defaults(name, args.samples, args.steps)
        oracle.solver_defaults = {"gms": choice.options}
        values = study.measure_oracle_defaults(oracle, args.samples, args.steps)
        parts.append(f"## {DATASETS[name][0]}\n\n"
                     f"Validation (seeds {', '.join(map(str, study.VALIDATION_SEEDS))}), W1, mean ± 95% half-width "
                     f"over seeds; candidates `studies.candidates.SHIPPED_MODEL_CANDIDATES`, best mean rank first:\n\n{choice.table()}\n\n"
                     f"Chosen: **{choice.best}** (`oracle.solver_defaults = {{'gms': {choice.options}}}`).\n\n"
                     f"Test (seeds 0-4, {args.samples} samples each), W1; in brackets the chosen default minus the "
                     f"row, paired over seeds, with its 95% interval (`*`: significant):\n\n"
                     f"{study.defaults_test_table(values, args.steps)}\n")
        print(parts[-1], flush=True)
    text = (f"# The oracle benchmark's own GMS options\n\nCommand: `{command}` ({cpu_description()}, one "
            f"torch thread, {time.perf_counter() - t0:.0f} s).\n\n{__doc__.split(chr(10) + chr(10))[0]} In one "
            "dimension one component per image and per pixel are the same sampler: their rows tie, and the tie goes "
            "to the candidate listed first.\n\n"
            + "\n".join(parts))
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
