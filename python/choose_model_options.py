"""Choose a shipped model's own GMS options on its validation split with gk.choose_options (as a user would for
their own model), and print the table, the winner and the line that makes it the model's default.

Run from the repository root after `pip install .`:

    OMP_NUM_THREADS=1 python python/choose_model_options.py --testbed digits

The shipped models' options (gms_kernels.models.embedded.SOLVER_DEFAULTS) were chosen with the same rule from the cached
runs of python/quality_benchmark.py (python/results/model_options.md); this reruns the choice end to end
through the library.
"""
import argparse
import time

import torch

import gms_kernels as gk
from gms_kernels.core.devices import cpu_description
from studies.quality_study import testbed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--testbed", choices=("digits", "patches"), default="digits")
    p.add_argument("--steps", type=int, nargs="+", default=[5, 10, 20])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--samples", type=int, default=1000)
    args = p.parse_args()
    torch.set_num_threads(1)
    bed = testbed(args.testbed)
    t0 = time.perf_counter()
    choice = gk.choose_options(bed.model(), bed.references()["validation"], bed.metrics[bed.primary],
                               steps=args.steps, seeds=args.seeds, n_samples=args.samples)
    print(f"Command: `python python/choose_model_options.py --testbed {args.testbed} --steps "
          f"{' '.join(map(str, args.steps))} --seeds {args.seeds} --samples {args.samples}` "
          f"({cpu_description()}, one torch thread, {time.perf_counter() - t0:.0f} s)\n")
    print(f"{args.testbed}, validation split, {bed.primary} (lower is better), mean ± 95% half-width over seeds:\n")
    print(choice.table())
    print(f"\nChosen: {choice.best}: model.solver_defaults = {{'gms': {choice.options}}}")
    print(f"Shipped: {bed.model().solver_defaults}")


if __name__ == "__main__":
    main()
