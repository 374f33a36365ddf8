"""Sampling many images into shards, across processes with torch.distributed (torchrun), resumable.

Sample i is a function of (seed, i) only (per-sample Philox streams), so the images do not depend on
the number of processes or the batch size. Shard k holds samples [k*S, (k+1)*S); rank r writes the
shards k with k % world_size == r, each atomically (temporary file, then rename). A rerun skips
complete shards, so a killed run resumes with nothing lost and nothing duplicated.

Runs may share a folder: a second run with the same settings joins the first (both may write a
shard, with the same bytes, each under its own temporary name), one with other settings is refused
while the folder holds a shard or another run is active (the lock files ``.lock`` and ``.active``).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..core.files import FileLock, json_ready, save_atomically, write_atomically
from ..model_io import batch_rows, check_positive_ints, make_conditioning
from ..core.progress import progress_bar
from ..sampling import check_sample_args, sample, sampled_model
from ..core.schedule import schedule_for, trajectory as make_trajectory

SHARD_FORMAT = "gms_kernels.shard/1"
_NOT_RECORDED = ("callback",)  # sampling arguments that do not change the samples
_PER_SAMPLE = ("model_kwargs", "null_kwargs")  # sampling arguments whose tensors may hold a row per sample


@dataclass
class ShardPlan:
    num_samples: int
    shard_size: int

    @property
    def num_shards(self) -> int:
        return -(-self.num_samples // self.shard_size)

    def bounds(self, k: int) -> tuple[int, int]:
        return k * self.shard_size, min((k + 1) * self.shard_size, self.num_samples)


def shard_path(out_dir: Path, k: int) -> Path:
    return out_dir / f"shard_{k:06d}.pt"


def read_shard(path: Path) -> dict | None:
    """The shard's content, or None when the file is missing, partial or corrupted."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return None
    ok = isinstance(data, dict) and data.get("format") == SHARD_FORMAT and \
        data["images"].shape[0] == data["stop"] - data["start"]
    return data if ok else None


def world() -> tuple[int, int]:
    """(rank, world size) of an initialised process group, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_from_env() -> bool:
    """Initialise torch.distributed when launched by torchrun (gloo on CPU, nccl on CUDA)."""
    if "RANK" not in os.environ or (dist.is_available() and dist.is_initialized()):
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return True


def solver_settings(sample_kwargs: dict[str, Any], model: Any = None) -> dict[str, Any]:
    """Every option the solver will run with (the model's and the library's defaults filled in), so that a
    resumed run whose defaults changed is refused instead of mixing shards of two samplers."""
    import inspect

    from ..solvers import get_solver, resolve_options, with_model_defaults

    own = inspect.signature(sample).parameters
    named = {k: v for k, v in sample_kwargs.items() if k not in own}
    spec = get_solver(sample_kwargs.get("solver", own["solver"].default))
    resolved = resolve_options(spec, with_model_defaults(spec, named, sampled_model(model)))
    return {k: v for k, v in resolved.as_dict().items() if k != "oracle"}  # (an object: its weights are the model's)


def sample_shards(model: Callable, out_dir: str | Path, num_samples: int, sample_shape: tuple[int, ...], *,
                  shard_size: int = 1000, batch_size: int = 250, seed: int = 0, progress: bool = True,
                  progress_label: str = "shards", device: torch.device | str | None = None,
                  **sample_kwargs: Any) -> list[Path]:
    """Write ``num_samples`` samples of ``sample_shape`` as shards in ``out_dir``; returns all shard paths.
    ``progress_label`` names the run on its progress bar (with the rank), e.g. the cell of a table it fills.

    ``sample_kwargs`` go to :func:`gms_kernels.sample` (steps, solver, schedule, options...). In its
    ``model_kwargs`` and ``null_kwargs`` a tensor whose first dimension is ``num_samples`` holds one row per
    sample (row i for sample i: each batch [first, first + n) gets its rows), so the samples still depend
    only on (seed, i); the manifest records such tensors by shape, dtype and SHA-256.
    Collective: every rank of the process group must call it; it returns after all ranks finished.
    """
    check_positive_ints((num_samples, shard_size, batch_size), "(num_samples, shard_size, batch_size)")
    check_positive_ints(sample_shape, "sample_shape (C, ...)")
    check_sample_args(model, device=device, **sample_kwargs)  # a bad request writes nothing
    make_conditioning(sample_kwargs.get("model_kwargs"), sample_kwargs.get("guidance_scale"),
                      sample_kwargs.get("null_kwargs"), batch=num_samples, what="the run (num_samples)")
    meta = {"num_samples": num_samples, "shard_size": shard_size, "seed": seed, "shape": list(sample_shape),
            "options": {k: json_ready(_recorded(v) if k in _PER_SAMPLE else v, k) for k, v in sample_kwargs.items()
                        if k not in _NOT_RECORDED},
            "solver_options": json_ready(solver_settings(sample_kwargs, model), "solver options")}
    trial_run(model, sample_shape, seed=seed, device=device,
              **_rows_of(sample_kwargs, slice(0, 1), num_samples))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = ShardPlan(num_samples, shard_size)
    rank, size = world()
    active = claim(out, meta) if rank == 0 else None
    try:
        if size > 1:
            dist.barrier()
        _write_shards(model, out, plan, sample_shape, batch_size, seed, progress, progress_label, device, rank, size,
                      sample_kwargs)
        if size > 1:
            dist.barrier()
    finally:
        if active is not None:
            active.release()
    return [shard_path(out, k) for k in range(plan.num_shards)]


def _write_shards(model: Callable, out: Path, plan: ShardPlan, sample_shape: tuple[int, ...], batch_size: int,
                  seed: int, progress: bool, label: str, device: torch.device | str | None, rank: int, size: int,
                  sample_kwargs: dict[str, Any]) -> None:
    """This rank's missing shards (the ones another run finished meanwhile are skipped as they come)."""
    mine = [k for k in range(plan.num_shards) if k % size == rank and read_shard(shard_path(out, k)) is None]
    for k in progress_bar(mine, progress, desc=f"{label} (rank {rank})"):
        if read_shard(shard_path(out, k)) is not None:  # (written by a run sharing the folder)
            continue
        start, stop = plan.bounds(k)
        parts = []
        for first in range(start, stop, batch_size):
            n = min(batch_size, stop - first)
            kwargs = _rows_of(sample_kwargs, slice(first, first + n), plan.num_samples)
            parts.append(sample(model, shape=(n, *sample_shape), generator=seed, first_index=first,
                                progress=False, device=device, **kwargs).cpu())
        save_atomically({"format": SHARD_FORMAT, "start": start, "stop": stop, "images": torch.cat(parts)},
                        shard_path(out, k), tag=str(rank))


def _rows_of(sample_kwargs: dict[str, Any], index: slice, num_samples: int) -> dict[str, Any]:
    """``sample_kwargs`` for the samples ``index`` of the run: model_kwargs' and null_kwargs' per-sample rows."""
    return {k: batch_rows(v, index, num_samples) if k in _PER_SAMPLE and isinstance(v, dict) else v
            for k, v in sample_kwargs.items()}


def _recorded(value: Any) -> Any:
    """model_kwargs / null_kwargs for the manifest: a tensor as its shape, dtype and SHA-256 (a run with other
    labels or embeddings is another run; the values themselves could be large)."""
    if isinstance(value, dict):
        return {k: _recorded(v) for k, v in value.items()}
    if not torch.is_tensor(value):
        return value
    data = value.detach().cpu().contiguous().reshape(-1)
    return {"tensor": {"shape": list(value.shape), "dtype": str(value.dtype),
                       "sha256": hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()}}


def trial_run(model: Callable, sample_shape: tuple[int, ...], *, seed: int = 0,
              device: torch.device | str | None = None, **sample_kwargs: Any) -> None:
    """Sample one image over the trajectory's first step alone, to raise before anything is written what
    the run would raise at its first network call or step: a shape or channel count the network cannot
    take, too few heads for the solver, a bad seed, an option that fails in the step."""
    import inspect

    defaults = inspect.signature(sample).parameters
    kwargs = {k: v for k, v in sample_kwargs.items() if k != "callback"}  # (the trial is not the run's)
    schedule = schedule_for(sampled_model(model), kwargs.get("schedule"))
    first = make_trajectory(schedule, kwargs.get("steps", defaults["steps"].default),
                            kwargs.get("trajectory", defaults["trajectory"].default))[0]
    kwargs["trajectory"] = [first]
    sample(model, shape=(1, *sample_shape), generator=seed, progress=False, device=device, **kwargs)


def claim(out: Path, meta: dict[str, Any]) -> FileLock:
    """Join or start the run ``meta`` in the folder ``out``; returns the shared lock that marks the run
    active (release it when done). The folder's manifest is decided under an exclusive lock: it is written
    when missing, and replaced when it names other settings but the folder holds no shard and no run is
    active (a run that failed before its first shard binds nobody); otherwise other settings are refused."""
    manifest = out / "manifest.json"
    active = FileLock(out / ".active")
    with FileLock(out / ".lock"):  # (held for moments: runs wait here only for each other's decision)
        alone = active.acquire(blocking=False)  # (exclusive: granted only when no run holds it shared)
        try:
            if alone:
                for stale in out.glob("shard_*.pt.tmp*"):  # left by a killed run
                    stale.unlink(missing_ok=True)
            old = json.loads(manifest.read_text()) if manifest.exists() else None
            if old is not None and old != meta:
                if any(out.glob("shard_*.pt")):
                    raise ValueError(f"{out} holds shards of another run ({manifest}); use a new --out directory")
                if not alone:
                    raise ValueError(f"another run with other settings is writing to {out} ({manifest}); wait for "
                                     "it to finish or use a new --out directory")
            if old != meta:
                write_atomically(manifest, lambda tmp: tmp.write_text(json.dumps(meta, indent=1)))
            active.acquire(shared=True)  # (from exclusive to shared: no other process can take it meanwhile)
        except BaseException:
            active.release()
            raise
    return active


def load_shards(out_dir: str | Path) -> torch.Tensor:
    """All samples of a finished run, in sample order; a clear error names missing or broken shards."""
    out = Path(out_dir)
    meta = json.loads((out / "manifest.json").read_text())
    plan = ShardPlan(meta["num_samples"], meta["shard_size"])
    images, bad = [], []
    for k in range(plan.num_shards):
        data = read_shard(shard_path(out, k))
        if data is None or (data["start"], data["stop"]) != plan.bounds(k):
            bad.append(shard_path(out, k).name)
        else:
            images.append(data["images"])
    if bad:
        raise ValueError(f"{len(bad)} shard(s) missing or incomplete in {out}: {', '.join(bad[:5])}; "
                         "rerun the same command to finish them")
    return torch.cat(images)
