"""The paper's evaluation protocol for a set of checkpoints: FID per (solver, K), as in its CIFAR10 table.

For every checkpoint (one network, from one file or several, e.g. the official eps / eps^2 / eps^3
files), every seed, solver and K, :func:`reproduce` draws ``num_samples`` samples through the
sharded, resumable :func:`gms_kernels.integrations.distributed.sample_shards` (under ``torchrun`` the shards are
spread over the processes), then measures FID against the dataset's statistics (pytorch-fid ``.npz``
with ``mu``, ``sigma``) with the FID InceptionV3 read from a local weights file, or with any feature
extractor passed in its place. Each run's FID is kept next to its shards (``fid.json``, with the
hashes of the statistics and of the extractor), so a rerun skips finished shards and finished FIDs.
The result is a Markdown table laid out like the GMS paper's Table 1 (rows: solvers, columns: K), headed
by the command line, the machine and the sha256 of every checkpoint file.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from ..integrations import distributed
from ..core.files import write_atomically
from ..model_io import check_positive_ints
from ..sampling import check_sample_args
from ..solvers import SOLVERS, get_solver

PAPER_STEPS = (10, 20, 25, 40, 50, 100, 200, 1000)
# the rows of the paper's FID tables
PAPER_SOLVERS = tuple(name for name, spec in SOLVERS.items() if spec.in_paper)


def row_label(solver: str) -> str:
    """The table's name of ``solver``: the paper's where it has one, else the solver's name in capitals
    (DDIM, SEEDS-1, EDM-SDE, GGF), so that no row is named in lower case beside the others."""
    return get_solver(solver).table_label
FID_FORMAT = "gms_kernels.fid/1"
GMS_PAPER_OPTIONS = {"fit": "adan", "select": "sample", "fit_iters": 25}  # the paper's optimiser, 25 iterations


@dataclass
class ReproduceResult:
    """``fids[(checkpoint label, solver, K)]``: the FID of each seed; ``table``: the Markdown report
    (written to ``path``; on ranks other than 0 of a torchrun job, empty and None)."""

    fids: dict[tuple[str, str, int], list[float]] = field(default_factory=dict)
    table: str = ""
    path: Path | None = None


# -- inputs --------------------------------------------------------------------------------------------
def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file; of a directory (a diffusers model), of its files' relative paths and contents."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def module_sha256(module: nn.Module) -> str:
    """sha256 of a module's state (names, dtypes, shapes, values): identifies a feature extractor."""
    digest = hashlib.sha256()
    for name, value in module.state_dict().items():
        t = value.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def _checkpoint_groups(checkpoints: Sequence[str | os.PathLike | Sequence[str | os.PathLike]]) -> list[list[str]]:
    """Each entry: one path, or a list of paths that make one network (official eps/eps^2/eps^3 files)."""
    if isinstance(checkpoints, (str, os.PathLike)):
        checkpoints = [checkpoints]
    groups = [[os.fspath(p)] if isinstance(p, (str, os.PathLike)) else [os.fspath(q) for q in p] for p in checkpoints]
    if not groups or any(not g for g in groups):
        raise ValueError("reproduce needs at least one checkpoint (a path, or a list of paths for one network)")
    for path in (p for g in groups for p in g):
        if not os.path.exists(path):
            raise FileNotFoundError(f"checkpoint {path}: no such file or directory")
    return groups


# the table's possible rows: every solver that needs nothing but the network (not the oracle's exact sampler, nor
# analytic-dpm, whose Gamma table needs training data)
REPRODUCIBLE_SOLVERS = tuple(name for name, spec in SOLVERS.items() if not spec.requires)


def _check_request(solvers: Sequence[str], steps: Sequence[int], num_samples: int, seeds: Sequence[int],
                   shape: Sequence[int] | None) -> None:
    unknown = [s for s in solvers if s not in REPRODUCIBLE_SOLVERS]
    if "analytic-dpm" in solvers:
        raise ValueError("analytic-dpm needs a Gamma table per network, estimated on its training data, which "
                         "reproduce does not take: sample it with gms-kernels sample --solver analytic-dpm "
                         "--gamma TABLE.pt (or gk.sample(..., gamma=gk.estimate_gamma(...))) and score the "
                         "samples with gk.metrics")
    if not solvers or unknown:
        raise ValueError(f"unknown solver(s) {unknown or '(none given)'}; valid: {', '.join(REPRODUCIBLE_SOLVERS)}")
    check_positive_ints(tuple(steps) or (0,), "steps (the K values)")
    check_positive_ints((num_samples,), "num_samples")
    if num_samples < 2:
        raise ValueError(f"FID needs at least 2 samples, got num_samples={num_samples}")
    if not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct non-negative integers, got {list(seeds)}")
    if shape is not None:
        check_positive_ints(tuple(shape), "shape (C, H, W)")


def _feature_extractor(inception_weights: str | os.PathLike | None, feature_extractor: nn.Module | None,
                       device: Any) -> tuple[nn.Module, str]:
    """(the network, its identity for fid.json) from a weights file or a ready module."""
    if (inception_weights is None) == (feature_extractor is None):
        raise ValueError("pass exactly one of inception_weights (the local file pt_inception-2015-12-05-6726825d.pth) "
                         "or feature_extractor (a module mapping uint8 images [N, 3, H, W] to features [N, d])")
    if feature_extractor is not None:
        return feature_extractor.to(device).eval(), "module:" + module_sha256(feature_extractor)
    from .inception import load_fid_inception

    return load_fid_inception(inception_weights, device=device), "inception:" + file_sha256(inception_weights)


def _check_features(extractor: nn.Module, mu: torch.Tensor, shape: tuple[int, ...], data_range: tuple[float, float],
                    stats: str | os.PathLike) -> None:
    """The extractor's feature size must be the statistics' (two blank images through it)."""
    from .inception import inception_features

    device = next((p.device for p in extractor.parameters()), torch.device("cpu"))
    blank = torch.full((2, *shape), float(data_range[0]), device=device)
    d = inception_features(blank, extractor, data_range).shape[1]
    if d != mu.numel():
        raise ValueError(f"{stats} holds statistics of {mu.numel()}-d features, but the feature extractor gives {d}: "
                         "use the statistics made with this extractor (FID Inception: 2048)")


def model_shape(model: nn.Module) -> tuple[int, int, int] | None:
    """(C, H, W) that a diffusers UNet was built for (its config), else None."""
    config = getattr(getattr(model, "backbone", model), "config", None)
    if isinstance(config, dict) and "sample_size" in config and "in_channels" in config:
        size = config["sample_size"]
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        return int(config["in_channels"]), int(h), int(w)
    return None


def dataset_stats(images: torch.Tensor, path: str | os.PathLike, *, inception_weights: str | os.PathLike | None = None,
                  feature_extractor: nn.Module | None = None, data_range: tuple[float, float] = (-1.0, 1.0),
                  batch_size: int = 200, device: Any = "cpu") -> Path:
    """Write the FID statistics (pytorch-fid .npz: mu, sigma) of ``images`` [N, C, H, W] in ``data_range``,
    with the same extractor and 8-bit rounding :func:`reproduce` applies to the samples."""
    from .inception import inception_features
    from .metrics import gaussian_stats, save_stats

    net, _ = _feature_extractor(inception_weights, feature_extractor, device)
    save_stats(path, *gaussian_stats(inception_features(images, net, data_range, batch_size)))
    return Path(path)


# -- the protocol ----------------------------------------------------------------------------------------
def reproduce(checkpoints: Sequence[str | os.PathLike | Sequence[str | os.PathLike]], stats: str | os.PathLike,
              out_dir: str | os.PathLike, *, inception_weights: str | os.PathLike | None = None,
              feature_extractor: nn.Module | None = None, steps: Sequence[int] = PAPER_STEPS,
              solvers: Sequence[str] = PAPER_SOLVERS, num_samples: int = 50_000, seeds: Sequence[int] = (0,),
              shape: Sequence[int] | None = None, kind: str = "auto", load_options: dict[str, Any] | None = None,
              gms_options: dict[str, Any] | None = None, trajectory: str = "even",
              data_range: tuple[float, float] = (-1.0, 1.0), batch_size: int = 250, shard_size: int = 1000,
              fid_batch_size: int = 200, backend: str = "auto", device: Any = None, progress: bool = True,
              command: str | None = None) -> ReproduceResult:
    """FID of every checkpoint x seed x solver x K (see the module docstring); writes
    ``out_dir/fid_table.md`` and returns a :class:`ReproduceResult`.

    ``checkpoints``: paths that ``gk.models.load`` reads (``kind``, ``load_options`` passed on), an entry
    being a list of paths for a network made of several files. ``stats``: the dataset's pytorch-fid
    .npz. ``inception_weights`` (the local FID Inception file) or ``feature_extractor`` (a module taking
    uint8 images [N, 3, H, W] to features [N, d], e.g. for tests): exactly one. ``gms_options``: the
    GMS solver's options (default: the paper's ADAN fit, 25 iterations, one component draw per sample).
    ``shape``: (C, H, W), needed unless the network is a diffusers UNet with a sample size.
    Collective under torchrun: every rank calls it; sampling and FIDs are split over the ranks.
    """
    from .metrics import load_stats

    groups = _checkpoint_groups(checkpoints)
    _check_request(solvers, steps, num_samples, seeds, shape)
    if not os.path.isfile(stats):
        raise FileNotFoundError(f"FID statistics {stats}: no such file (a pytorch-fid .npz with mu and sigma)")
    ref = load_stats(stats)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    extractor, extractor_id = _feature_extractor(inception_weights, feature_extractor, device)
    gms = {**GMS_PAPER_OPTIONS, **(gms_options or {})}
    sampling = dict(trajectory=trajectory, data_range=data_range, backend=backend, device=device)
    labels = _labels(groups)
    networks = _load_networks(groups, labels, kind, load_options, shape, solvers, steps, gms, sampling)
    _check_features(extractor, ref[0], networks[0][2], data_range, stats)

    out = Path(out_dir)
    runs = []  # (label, seed, solver, K, run directory)
    for label, model, sample_shape in networks:
        for seed in seeds:
            for solver in solvers:
                for k in steps:
                    run = out / label / f"seed{seed}" / solver / f"K{k}"
                    distributed.sample_shards(model, run, num_samples, sample_shape, shard_size=shard_size,
                                              batch_size=batch_size, seed=seed, progress=progress,
                                              progress_label=f"{label} seed {seed} {row_label(solver)} K={k}", steps=k,
                                              solver=solver, **sampling, **(gms if solver == "gms" else {}))
                    runs.append((label, seed, solver, k, run))
    del networks

    key = {"stats_sha256": file_sha256(stats), "extractor": extractor_id}
    _measure_fids([run for *_, run in runs], extractor, ref, key, data_range, fid_batch_size)
    result = ReproduceResult()
    for label, seed, solver, k, run in runs:
        result.fids.setdefault((label, solver, k), []).append(_read_fid(run, key)["fid"])
    if distributed.world()[0] == 0:
        hashes = {label: [(p, file_sha256(p)) for p in group] for group, label in zip(groups, labels)}
        result.table = report(result.fids, labels, solvers, steps, hashes=hashes, stats=(os.fspath(stats),
                              key["stats_sha256"]), extractor=extractor_id, num_samples=num_samples, seeds=seeds,
                              trajectory=trajectory, gms_options=gms if "gms" in solvers else None, command=command)
        result.path = write_atomically(out / "fid_table.md", lambda tmp: tmp.write_text(result.table + "\n"))
    return result


def _load_networks(groups: list[list[str]], labels: list[str], kind: str, load_options: dict[str, Any] | None,
                   shape: Sequence[int] | None, solvers: Sequence[str], steps: Sequence[int], gms: dict[str, Any],
                   sampling: dict[str, Any]) -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    """(label, network, sample shape) per checkpoint group, every (solver, K) request checked on it,
    so that a bad input is refused before anything is written."""
    from ..models import load

    networks = []
    for group, label in zip(groups, labels):
        model = load(group[0] if len(group) == 1 else group, kind=kind, **(load_options or {}))
        model = model.to(sampling["device"]).eval()
        sample_shape = tuple(shape) if shape is not None else model_shape(model)
        if sample_shape is None:
            raise ValueError(f"{label}: pass shape=(C, H, W) (--shape C H W): the network does not record its "
                             "image size")
        for solver in solvers:
            for k in steps:
                check_sample_args(model, steps=k, solver=solver, **sampling, **(gms if solver == "gms" else {}))
        networks.append((label, model, sample_shape))
    return networks


def _measure_fids(runs: list[Path], extractor: nn.Module, ref: tuple[torch.Tensor, torch.Tensor], key: dict[str, str],
                  data_range: tuple[float, float], batch_size: int) -> None:
    """Write each run's fid.json unless a valid one is there; the runs are spread over the ranks."""
    from .inception import inception_features
    from .metrics import frechet_distance, gaussian_stats

    rank, size = distributed.world()
    for i, run in enumerate(runs):
        if i % size != rank or _read_fid(run, key) is not None:
            continue
        images = distributed.load_shards(run)
        value = frechet_distance(*gaussian_stats(inception_features(images, extractor, data_range, batch_size)), *ref)
        record = {"format": FID_FORMAT, "fid": value, "num_samples": int(images.shape[0]), **key,
                  "shards": _shard_signature(run)}
        write_atomically(run / "fid.json", lambda tmp: tmp.write_text(json.dumps(record, indent=1)), str(rank))
    if size > 1:
        torch.distributed.barrier()


def _shard_signature(run: Path) -> list:
    """Name, size and modification time of each shard: a resampled shard invalidates the stored FID."""
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(run.glob("shard_*.pt"))]


def _labels(groups: list[list[str]]) -> list[str]:
    """A folder name per network: the file (or directory) name, made unique."""
    labels = []
    for group in groups:
        base = "+".join(Path(p).name for p in group)
        base = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in base) or "model"
        label, n = base, 2
        while label in labels:
            label, n = f"{base}-{n}", n + 1
        labels.append(label)
    return labels


def _read_fid(run: Path, key: dict[str, str]) -> dict | None:
    """The run's stored FID when it was measured on these very shards, against these statistics, with
    this extractor (``key``); else None."""
    try:
        record = json.loads((run / "fid.json").read_text())
    except (OSError, ValueError):
        return None
    same = record.get("format") == FID_FORMAT and all(record.get(k) == v for k, v in key.items()) \
        and record.get("shards") == _shard_signature(run)
    return record if same else None


# -- the report -------------------------------------------------------------------------------------------
def _interval(values: list[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% Student-t interval (None for one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    from scipy.stats import t as student_t

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(student_t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def _machine() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    from ..core.devices import cpu_description

    return f"{cpu_description()} (torch {torch.__version__})"


def report(fids: dict[tuple[str, str, int], list[float]], labels: Sequence[str], solvers: Sequence[str],
           steps: Sequence[int], *, hashes: dict[str, list[tuple[str, str]]], stats: tuple[str, str], extractor: str,
           num_samples: int, seeds: Sequence[int], trajectory: str, gms_options: dict | None,
           command: str | None) -> str:
    """The Markdown report: one table per checkpoint, rows solvers and columns K as in the paper's
    CIFAR10 table, the lowest FID of each column in bold."""
    command = command or "gms_kernels.eval.reproduce.reproduce(...)"
    lines = [f"# FID: {', '.join(labels)}", "",
             f"Command: `{command}`", "",
             f"Machine: {_machine()}, {distributed.world()[1]} process(es); {datetime.date.today().isoformat()}.",
             f"FID of {num_samples} samples per cell against `{stats[0]}` (sha256 {stats[1][:16]}...), "
             f"features: {extractor[:26]}...; trajectory `{trajectory}` (K steps)"
             + (f"; GMS options {json.dumps(gms_options)}" if gms_options else "") + ".",
             ("One seed (" + str(seeds[0]) + ") per cell, as the paper reports." if len(seeds) == 1 else
              f"Mean ± half-width of the 95% Student-t interval over {len(seeds)} seeds {list(seeds)}."), ""]
    for label in labels:
        lines += [f"## {label}", "", "Checkpoint files (sha256):", ""]
        lines += [f"- `{path}`: `{digest}`" for path, digest in hashes.get(label, [])]
        lines += ["", "| # timesteps K | " + " | ".join(str(k) for k in steps) + " |",
                  "|---|" + "---:|" * len(steps)]
        cells = {(s, k): _interval(fids[(label, s, k)]) for s in solvers for k in steps}
        best = {k: min(round(cells[(s, k)][0], 2) for s in solvers) for k in steps}  # (ties as printed)
        for solver in solvers:
            row = []
            for k in steps:
                mean, half = cells[(solver, k)]
                text = f"{mean:.2f}" + (f" ± {half:.2f}" if half is not None else "")
                row.append(f"**{text}**" if len(solvers) > 1 and round(mean, 2) == best[k] else text)
            lines.append(f"| {row_label(solver)} | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


def command_line(argv: Sequence[str]) -> str:
    """The command as typed (for the report): program name and quoted arguments."""
    prog = "torchrun ... -m gms_kernels" if "RANK" in os.environ else "gms-kernels"
    return prog + " " + " ".join(shlex.quote(a) for a in argv) if argv else prog


__all__ = ["reproduce", "dataset_stats", "report", "ReproduceResult", "file_sha256", "module_sha256",
           "PAPER_STEPS", "PAPER_SOLVERS", "GMS_PAPER_OPTIONS"]
