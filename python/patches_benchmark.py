"""Natural-image patches: every solver on the shipped patches model, on the TEST split, over seeds.

    nice -n 5 python python/patches_benchmark.py                          # measure every cell, then write the table
    nice -n 5 python python/patches_benchmark.py --labels ddpm ddim --no-report   # a share of the cells (parallel runs)

Metrics against the test patches (gk.data.patches("test"): 10,000 8x8 patches of the test photos), and, to
read those against, against 10,003 patches of the train photos at other positions than the training set's:
sliced W1 in pixel space (256 random directions) and FD-|DCT| (gk.metrics.frechet_distance_dct). Each
(solver, K, seed) cell is cached as it is measured (one JSON per solver in --cache-dir), so runs resume and
several processes can share the cells. Writes gms_out/patches_solvers.md (python/results/equal_tuning_patches.md
is the equally tuned comparison on this model).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import shlex
import sys
from pathlib import Path

import torch

from gms_kernels.core.data import PATCH_PHOTOS, patches
from gms_kernels.core.devices import cpu_description
from gms_kernels.models.embedded import PATCHES_CONFIG, PATCHES_MODEL, patches_model
from studies import patches_study as study
from studies.digits_study import ResultCache
from gms_kernels.core.images import save_panels
from gms_kernels.eval.metrics import seed_interval
from gms_kernels.core.random import STREAM_VERSION

READING = "## Reading (written by hand"  # kept when the tables are written again
METRICS = (("test/fd_dct", "FD-|DCT| against the test photos", 3),
           ("test/swd", "sliced W1 (pixels) against the test photos", 4),
           ("train/fd_dct", "FD-|DCT| against the train photos (other patches)", 3),
           ("train/swd", "sliced W1 (pixels) against the train photos (other patches)", 4))


def cell(iv, digits: int) -> str:
    return f"{iv.mean:.{digits}f} [{iv.low:.{digits}f}, {iv.high:.{digits}f}]"


def report(results: dict, floors: dict, args, training: dict | None, heads: dict | None = None,
           stats: dict | None = None) -> str:
    labels, steps, seeds = args.labels, args.steps, list(range(args.seeds))
    cmd = "nice -n 5 python python/patches_benchmark.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    split = {s: [n for n, (sp, _) in PATCH_PHOTOS.items() if sp == s] for s in ("train", "validation", "test")}
    lines = ["# Natural-image patches: solvers on the test split", "",
             f"Command: `{cmd.strip()}` (cells measured by the same command with `--labels ... --no-report` in "
             "parallel processes, then this command read them back from the cache)."
             + (f" {args.samples} samples per cell instead of the default 2000: the default would not have finished "
                "in the time available on a shared 2-core machine." if args.samples < 2000 else ""), "",
             f"Machine: {cpu_description()}; torch {torch.__version__}, 1 torch thread per process; "
             f"{datetime.date.today()}.", "",
             "Data (`gk.data.patches`, split by photo): 8x8 grey patches of scikit-image's bundled photos, grey "
             "intensity v in [0, 1] -> 2v - 1 (fixed, no per-patch normalisation), cut at seeded random positions. "
             f"Train: {', '.join(split['train'])} (7000 each); validation: {', '.join(split['validation'])} (3000 "
             f"each); test: {', '.join(split['test'])} (5000 each, the reference: 10,000 patches). Licences (from the "
             "skimage.data docstrings): " + "; ".join(f"{n}: {lic}" for n, (_, lic) in PATCH_PHOTOS.items()) + ".", "",
             f"Model: gms_kernels/assets/patches_gms.pt (`gk.embedded.patches_model()`), PytorchDDPMUNet "
             f"{PATCHES_CONFIG} with conv heads for E[eps^2], E[eps^3], trained on the train split by "
             "python/train_patches_model.py; linear schedule T=1000, even trajectory."]
    if training:
        val = training.get("backbone", {})
        lines += ["", "Validation (eps MSE of the EMA backbone at a fixed draw of t and noise, trivial predictor "
                  f"{next(iter(val.values()))['trivial']:.3f}): "
                  + ", ".join(f"{s} steps {r['val_mse_e1']:.4f}" for s, r in val.items())
                  + f"; chosen: {training['chosen_backbone_steps']} steps. Heads on validation: MSE e2 "
                  f"{training['heads']['mse_e2']:.3f} (trivial e2 = 1: {training['heads']['trivial_e2']:.3f}), "
                  f"MSE e3 {training['heads']['mse_e3']:.3f}."]
    if heads:
        lines += ["", "Heads on noised test patches (400 patches, one noise draw; `patches_study.head_variance`): "
                  "share of elements with e2 - e1^2 < 0 (the solvers clamp it to 0), mean e2 - e1^2, and the "
                  "Monte-Carlo mean of (eps - e1)^2:", "", "| t | " + " | ".join(str(t) for t in heads) + " |",
                  "|---" * (len(heads) + 1) + "|",
                  "| share < 0 | " + " | ".join(f"{r['negative']:.2f}" for r in heads.values()) + " |",
                  "| mean e2 - e1^2 | " + " | ".join(f"{r['mean_var']:.3f}" for r in heads.values()) + " |",
                  "| mean (eps - e1)^2 | " + " | ".join(f"{r['mc_var']:.3f}" for r in heads.values()) + " |"]
    lines += ["", f"Each cell: mean over {len(seeds)} seeds (0..{len(seeds) - 1}) and the 95% Student-t interval "
              f"(gk.metrics.seed_interval), {args.samples} samples per seed against the 10,000 test patches (the "
              "reported result) or 10,003 patches of the train photos at positions other than the training set's "
              "(seed 1000: how close the samples are to what the model learned). "
              "Lower is better. **Bold**: the best baseline (lowest mean of " + ", ".join(study.BASELINES) + ") at "
              "that K. Columns are network calls: K steps (K + 1 calls) for the one-call solvers; edm-sde and "
              "seeds-2 (two calls per step) run the most steps that fit in those calls (" + ", ".join(
                  f"K={k}: {study.solver_steps('edm-sde', k)}" for k in steps) + "). `+` / `-`: significantly better / worse than that baseline (paired per-seed difference, "
              "95% interval excludes 0: gk.metrics.paired_difference; the seeds share the initial noise across "
              "solvers). `gms (defaults)` is `gk.sample(..., solver='gms')` with no option, as the library "
              "ships it at the time of this run.", "",
              "FD-|DCT|: the Fréchet distance of the patches' orthonormal 2-D DCT coefficients, the DC one "
              "as it is and the 63 AC ones as magnitudes. A fixed, data-independent transform: the DCT is close "
              "to the principal components of natural patches, and the Fréchet distance of any orthonormal "
              "transform equals the pixel one, so the magnitudes are what adds information: their means "
              "measure how sparse (heavy-tailed) each frequency is, their covariance how edge energy switches "
              "on jointly across frequencies. A Gaussian with the data's own pixel covariance scores near 0 "
              "in pixel FD but clearly above the data floor here (tests/core/test_patches.py)."]
    for key, name, digits in METRICS:
        summary = study.summarise(results, key, labels, steps, seeds)
        lines += ["", f"## {name}", "", "| solver | " + " | ".join(f"K={k}" for k in steps) + " |",
                  "|---" * (len(steps) + 1) + "|"]
        for label in labels:
            cells = []
            for k in steps:
                r = summary[(label, k)]
                text = cell(r["interval"], digits)
                if label == r["best_baseline"]:
                    text = f"**{text}**"
                elif r["significant"]:
                    text += " +" if r["diff"].mean < 0 else " -"
                cells.append(text)
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        for label in dict.fromkeys(lb for lb, _ in floors):
            iv = seed_interval([floors[(label, s)][key] for s in seeds])
            lines.append(f"| *{label}* | " + " | ".join(cell(iv, digits) for _ in steps) + " |")
    if "gms (defaults)" in labels:
        used = {json.dumps(results[("gms (defaults)", k, s)].get("options"), sort_keys=True)
                for k in steps for s in seeds}
        lines += ["", "`gms (defaults)` ran with: " + "; ".join(f"`{u}`" for u in sorted(used)) + "."]
    if stats:
        lines += ["", "Brightness and contrast (`patches_study.pixel_stats`; solvers: K=10, seed 0, "
                  f"{args.samples} samples):", "",
                  "| set | pixel mean | pixel sd | share of pixels with abs value > 0.95 |",
                  "|---|---|---|---|"]
        lines += [f"| {name} | {r['mean']:.3f} | {r['sd']:.3f} | {r['saturated']:.3f} |" for name, r in stats.items()]
    lines += ["", "Samples at K=10 (first 40, seed 0) next to random test patches: `patches_grid.png`."]
    seconds = {label: sum(results[(label, k, s)]["seconds"] for k in steps for s in seeds) for label in labels}
    lines += ["", "Sampling wall time per solver, all K and seeds together (shared machine, several processes: "
              "indicative only): " + ", ".join(f"{lb} {v / 60:.0f} min" for lb, v in seconds.items()) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--steps", type=int, nargs="+", default=list(study.STEPS))
    p.add_argument("--labels", nargs="+", default=list(study.SOLVER_OPTIONS), choices=list(study.SOLVER_OPTIONS))
    p.add_argument("--model", default=str(PATCHES_MODEL))
    p.add_argument("--no-report", action="store_true", help="only measure (and cache) the cells")
    p.add_argument("--cache-dir", default=None,
                   help="default: gms_out/patches_study-<model file hash>-rng<random-stream version>/")
    p.add_argument("--training-record", default="gms_out/patches_training/validation.json")
    p.add_argument("--out", default="gms_out/patches_solvers.md")
    args = p.parse_args()
    if args.seeds < 2:
        p.error("--seeds must be at least 2 (a confidence interval)")
    torch.set_num_threads(1)
    model = patches_model(args.model)
    refs = study.references()
    reference = refs["test"]
    digest = hashlib.sha256(Path(args.model).read_bytes()).hexdigest()[:12]
    cache_dir = Path(args.cache_dir or f"gms_out/patches_study-{digest}-rng{STREAM_VERSION}")
    seeds = range(args.seeds)
    results = {}
    for label in args.labels:
        cache = ResultCache(cache_dir / f"{label.replace(' ', '_').replace('/', '-')}.json")
        results.update(study.measure(model, refs, [label], args.steps, seeds, args.samples, cache))
    if args.no_report:
        return
    floors = study.data_rows(refs, seeds, args.samples)
    record = Path(args.training_record)
    training = json.loads(record.read_text()) if record.exists() else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    heads = study.head_variance(model, patches("test", per_photo=200))
    grid_labels = ("ddpm", "sn-ddpm", "ddim", "gms (defaults)", "gms-closed / pixel")
    panels = [("test patches", reference[torch.randperm(reference.shape[0],
                                                        generator=torch.Generator().manual_seed(0))[:40]])]
    panels += [(f"{label} K=10", study.draw(model, label, 10, 40, 0)) for label in grid_labels]
    save_panels(panels, out.parent / "patches_grid.png", nrow=8, scale=5)
    stats = {f"{split} photos": study.pixel_stats(ref) for split, ref in refs.items()}
    stats.update({label: study.pixel_stats(study.draw(model, label, 10, args.samples, 0)) for label in args.labels})
    reading = out.read_text().partition(READING)[2] if out.exists() else ""
    out.write_text(report(results, floors, args, training, heads, stats) + (f"\n{READING}{reading}" if reading else ""))
    print(out.read_text())


if __name__ == "__main__":
    main()
