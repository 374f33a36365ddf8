"""Are the digits heads' variance and skew calibrated, per t and per head variant, and what do the clamps do to it?

    python python/calibration_report.py                     # every variant below, then the results file
    python python/calibration_report.py --variants central  # some of them (the file then lists only those)

For each head variant the project can train on the shipped digits backbone, :func:`gk.calibrate_heads` regresses
the realised r^2 on c2 and r^3 on c3 (r = eps - e1; through the origin, percentile bootstrap intervals over the
images) on the held-out validation digits, ``--draws`` noise draws per image and t, for the heads' own moments
("heads") and for the moments the GMS solver fits on the step t -> t - 100 (gk.sample's default 10 steps) with the
x_0 moments bounded for data in [-1, 1]: by the official clamps ("clamped", the solver's default) or made jointly
feasible ("feasible"). The variants other than the shipped model are trained first,
each with 1200 head steps (the script's default, as the shipped model) on its frozen backbone:

    python python/train_digits_model.py --heads-on gms_kernels/assets/digits_gms.pt --targets raw \\
        --work gms_out/cal_raw --out gms_out/digits_heads_raw.pt
    ... --targets central --head-loss normalized --work gms_out/cal_normalized --out gms_out/digits_heads_normalized.pt
    ... --targets central --head-loss rms --work gms_out/cal_rms --out gms_out/digits_heads_rms.pt
    ... --targets central --head res_conv --work gms_out/cal_res_conv --out gms_out/digits_heads_res_conv.pt
    ... --targets central --head-loss normalized --head-scale --work gms_out/cal_scaled \\
        --out gms_out/digits_heads_scaled.pt

Each variant's rows are cached in gms_out/calibration/ under its weight file's hash and the settings, so a rerun
only computes what is missing. Writes python/results/calibration.md; its closing answer, read off the table by
hand, is kept from the file it replaces.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
from dataclasses import asdict
from pathlib import Path

import torch

import gms_kernels as gk
from gms_kernels.core.data import digits
from gms_kernels.core.devices import machine_note
from gms_kernels.eval.calibration import MOMENTS, CalibrationRow
from gms_kernels.models.embedded import DIGITS_MODEL, default_model, file_tag

# name, weight file, what its heads are
VARIANTS = (
    ("raw", "gms_out/digits_heads_raw.pt", "conv heads, raw targets E[eps^n|x_t], uniform loss"),
    ("central", str(DIGITS_MODEL), "the shipped model: conv heads, central targets, uniform loss"),
    ("normalized", "gms_out/digits_heads_normalized.pt", "conv, central, t-normalised loss"),
    ("rms", "gms_out/digits_heads_rms.pt", "conv, central, rms-normalised loss"),
    ("res_conv", "gms_out/digits_heads_res_conv.pt", "Res+Conv heads, central, uniform loss"),
    ("scaled", "gms_out/digits_heads_scaled.pt", "conv, central, normalised loss, output scaled by the target's RMS"),
)
TIMESTEPS = (50, 99, 199, 299, 399, 499, 599, 799, 999)
DATA_RANGE = (-1.0, 1.0)
STEP = 100  # the bounded moments are those of the step t -> t - STEP: gk.sample's default 10 steps on T = 1000
CACHE = Path("gms_out/calibration")


class SharedCalls(torch.nn.Module):
    """``net`` with its outputs remembered by input: the three regressions draw the same x_t (the same seed), so
    the network runs once per x_t."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net, self.schedule, self.time_input, self.memory = net, net.schedule, net.time_input, {}

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        key = (hashlib.sha256(x_t.numpy().tobytes()).hexdigest(), tuple(x_t.shape), t.tolist().__repr__())
        if key not in self.memory:
            self.memory[key] = self.net(x_t, t)
        return self.memory[key]


def calibrate(path: str, draws: int, seed: int, n_boot: int) -> dict[str, list[dict]]:
    """{moments: rows as dicts} for one weight file, from the cache or computed (and cached)."""
    key = f"{file_tag(path)}_d{draws}_s{seed}_b{n_boot}_step{STEP}_t{'-'.join(map(str, TIMESTEPS))}"
    cached = CACHE / f"{key}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    net = SharedCalls(default_model(path))
    x_val, _ = digits("validation")
    out = {}
    for moments in MOMENTS:
        cal = gk.calibrate_heads(net, x_val, timesteps=TIMESTEPS, draws=draws, seed=seed, n_boot=n_boot,
                                 moments=moments, data_range=DATA_RANGE, step=STEP)
        out[moments] = [asdict(r) for r in cal.rows]
        print(f"{path} {moments}:\n{cal.markdown()}", flush=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(out))
    return out


def number(x: float) -> str:
    """Two decimals, or two significant digits below 0.1 (so a slope of 0.004 does not read as 0)."""
    return "undefined" if math.isnan(x) else f"{x:.2f}" if abs(x) >= 0.1 or x == 0 else f"{x:.2g}"


def cell(r: CalibrationRow) -> str:
    if math.isnan(r.slope3):
        return "undefined"
    return f"{number(r.slope3)} [{number(r.interval3[0])}, {number(r.interval3[1])}]"


def table(results: dict[str, dict[str, list[CalibrationRow]]]) -> str:
    lines = ["| variant | t | slope3 heads [95%] | slope3 clamped [95%] | slope3 feasible [95%] | "
             "slope2 heads / clamped / feasible | rms c3 heads |",
             "|---|---|---|---|---|---|---|"]
    for name, by_moments in results.items():
        for i, t in enumerate(TIMESTEPS):
            rows = [by_moments[m][i] for m in MOMENTS]
            slope2 = " / ".join(number(r.slope2) for r in rows)
            lines.append(f"| {name} | {t} | {' | '.join(cell(r) for r in rows)} | {slope2} | "
                         f"{rows[0].rms_c3:.2g} |")
    return "\n".join(lines)


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip()


def previous_answer(path: Path) -> str:
    """The answer paragraph of an earlier results file at ``path`` (written by hand from its table), else a note."""
    old = path.read_text().partition("**Answer.** ")[2].strip() if path.exists() else ""
    return old or "(read it off the table above.)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", choices=[v[0] for v in VARIANTS], default=[v[0] for v in VARIANTS])
    p.add_argument("--draws", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--out", default="python/results/calibration.md")
    args = p.parse_args()
    torch.set_num_threads(1)
    results, described = {}, []
    for name, path, what in VARIANTS:
        if name not in args.variants:
            continue
        if not Path(path).exists():
            raise SystemExit(f"{path} is missing: train it first (see this script's docstring)")
        raw = calibrate(path, args.draws, args.seed, args.n_boot)
        results[name] = {m: [CalibrationRow(**{**r, "interval2": tuple(r["interval2"]),
                                               "interval3": tuple(r["interval3"])}) for r in raw[m]]
                         for m in MOMENTS}
        described.append(f"- `{name}`: {what} (weights {file_tag(path)})")
    command = "python python/calibration_report.py" + ("" if len(results) == len(VARIANTS) else
                                                       " --variants " + " ".join(results))
    n_images = digits("validation")[0].shape[0]
    text = f"""# Calibration of the digits heads, per t and head variant, before and after the clamps

**Question.** Are the heads' variance c2 and third central moment c3 of eps given x_t calibrated, per t and per head
variant, and what do the official clamps (and the jointly feasible moments) do to it?

**Protocol.** `gk.calibrate_heads` on the held-out validation digits (`gk.data.digits("validation")`, {n_images}
images the models never saw), {args.draws} noise draws per image and t, seed {args.seed}. With r = eps - e1, the
least-squares slopes through the origin of r^3 on c3 (slope3) and of r^2 on c2 (slope2), over every pixel, draw
and image; 95% percentile bootstrap intervals over the images ({args.n_boot} resamples). Exact heads give 1;
a slope below 1 means the regressor over-states the moment (slope = the shrinkage that makes it the best linear
predictor), near 0 that it is noise. Regressors: the heads' own moments ("heads"), and the moments the GMS solver
fits on the step t -> t - {STEP} (the step of `gk.sample`'s default 10; t = 50 steps to the data), mapped back to
eps, with the x_0 moments bounded for data in [-1, 1] by the official clamps ("clamped", `clamp_x0_moments`, the
solver's default) or made jointly feasible ("feasible", `feasible_x0_moments`). The clamped skew of a step is
c2^3 times the clamped skew of x_0 plus 3 c1 c2^2 x_t (E[x_0^2] - E1^2 - Var), non-zero where the separate
clamps of E[x_0^2] and of the variance disagree. "undefined": c3 no larger than the float32 rounding of forming it.
Variants, all on the shipped frozen backbone, every trained one with 1200 head steps (as the shipped model):

{chr(10).join(described)}

{table(results)}

**Command.** `{command}` (after the training commands in its docstring). Machine: {machine_note()}.
Commit: {commit()}.

**Answer.** {previous_answer(Path(args.out))}
"""
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
