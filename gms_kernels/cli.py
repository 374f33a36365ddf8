"""The ``gms-kernels`` command line (also ``python -m gms_kernels``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence


class UsageError(Exception):
    """A mistake in the command line or its inputs: reported in one line, exit status 2."""


# what the library raises on bad input (ValueError, TypeError from its checks; missing files)
USER_ERRORS = (UsageError, ValueError, TypeError, FileNotFoundError, IsADirectoryError, PermissionError)


def _check_counts(args: argparse.Namespace, *names: str) -> None:
    """Each named argument (an int, or a list of ints) is positive: a count of zero would fail deep in the
    run, or worse, succeed with nothing done."""
    for name in names:
        value = getattr(args, name)
        for v in value if isinstance(value, list) else [value]:
            if v < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {v}")


def _check_seed(args: argparse.Namespace) -> None:
    """--seed: the first sampling seed, in the range every seed must lie in."""
    if not 0 <= args.seed < 2**63:
        raise UsageError(f"--seed must lie in [0, 2^63), got {args.seed}")


def _check_output(path: str | None, flag: str, folder: bool) -> None:
    """Refuse, before any work, an output path that cannot be written: one below an existing file, a folder
    over an existing file, or a file over an existing folder."""
    if path is None:
        return
    p = Path(path)
    for parent in p.parents:  # (the nearest existing one decides)
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {path}: {parent} is a file, not a folder")
            break
    if folder and p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {path} is a file; name a folder (new or existing)")
    if not folder and p.is_dir():
        raise UsageError(f"{flag} {path} is a folder; name a file")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: ...)" to an option's help once: not where the help text already says its default,
    nor for a default of None or False (no value to show)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _oracle(args: argparse.Namespace) -> int:
    from .eval import oracle_job as job

    _check_output(args.out, "--out", folder=True)
    _check_counts(args, "samples", "steps")
    _check_seed(args)
    command = "gms-kernels " + " ".join(args.argv) if args.argv else "gms-kernels"
    print(f"Oracle study: {args.samples} samples, K in {args.steps}, datasets {args.datasets}")
    res = job.run_oracle_job(args.samples, args.steps, args.datasets, seeds=(args.seed,),
                             log=None if args.quiet else print)
    text = job.report(res, command)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "oracle.md").write_text(text + "\n")
    print(text)
    if "1d" in args.datasets:
        png = job.plot_fig1(res, out / "oracle_fig1.png")
        print(f"\nwrote {out / 'oracle.md'} and {png}")
    return 0


def _t0_arg(text: str) -> int | float:
    """--t0: an integer index (e.g. 400) or a fraction of T with a decimal point (e.g. 0.4)."""
    try:
        return float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"t0 must be an integer index or a fraction like 0.5, got {text!r}") from None


def _is_torchscript(path: str) -> bool:
    """True for a torch.jit.save archive (a zip holding <name>/constants.pkl and <name>/code/)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("/constants.pkl") for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _load_model(path: str, kind: str):
    """TorchScript archives (--kind torchscript, or auto-detected) with torch.jit.load; every other
    format with gms_kernels.models.load(path, kind=kind)."""
    import os

    import torch

    if kind == "torchscript" or (kind == "auto" and os.path.isfile(path) and _is_torchscript(path)):
        return torch.jit.load(path, map_location="cpu")
    try:
        from . import models
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.models":
            raise
        raise UsageError(f"--kind {kind} needs gms_kernels.models, which is not available here; save the "
                         "network as TorchScript (torch.jit.save) and use --kind torchscript") from None
    return models.load(path, kind=kind)


def _read_images(paths: Sequence[str], data_range: tuple[float, float]):
    """Images [N, C, H, W] in data_range from .png/.jpg files (uint8) and .npy arrays: uint8 arrays
    are read as pixels in [0, 255], float arrays are taken to be in data_range already; arrays may
    be [H, W, C], [N, H, W, C] or [N, C, H, W]."""
    import numpy as np
    import torch

    lo, hi = data_range
    batches = []
    for path in paths:
        if path.lower().endswith(".npy"):
            arr = np.load(path)
        else:
            from PIL import Image

            with Image.open(path) as im:
                arr = np.asarray(im.convert("L" if im.mode in ("L", "I", "1") else "RGB"))
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if arr.ndim == 3:
            arr = arr[None]
        if arr.ndim != 4:
            raise UsageError(f"{path}: expected an image or an array of images, got shape {arr.shape}")
        channels_first = arr.shape[1] in (1, 3) and arr.shape[-1] not in (1, 3)
        x = torch.from_numpy(np.array(arr))  # a writable copy
        x = x if channels_first else x.permute(0, 3, 1, 2)
        if x.dtype == torch.uint8:
            x = lo + (hi - lo) * x.to(torch.float32) / 255.0
        batches.append(x.to(torch.float32))
    shapes = {tuple(b.shape[1:]) for b in batches}
    if len(shapes) != 1:
        raise UsageError(f"all inputs must have the same [C, H, W], got {sorted(shapes)}")
    return torch.cat(batches)


def _sdedit(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from .core.images import image_grid
    from .core.schedule import Schedule
    from .sdedit import sdedit, stroke_guide

    _check_output(args.out, "--out", folder=True)
    data_range = (args.data_range[0], args.data_range[1])
    model = _load_model(args.model, args.kind)
    if hasattr(model, "eval"):
        model.eval()
    if hasattr(model, "to"):
        model = model.to(args.device)
    schedule = getattr(model, "schedule", None)
    if not isinstance(schedule, Schedule):
        schedule = Schedule.cosine(args.T) if args.schedule == "cosine" else Schedule.linear(args.T)
    images = _read_images(args.input, data_range).to(args.device)
    guide = stroke_guide(images, args.stroke, args.colors, data_range) if args.stroke else images
    options = _solver_options(args)
    res = sdedit(model, guide, args.t0, args.steps, solver=args.solver, schedule=schedule,
                 trajectory=args.trajectory, generator=args.seed, data_range=data_range,
                 progress=not args.quiet, time_input=args.time_input, backend=args.backend, **options)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    columns = ([images] if args.stroke else []) + [guide, res.images]
    rows = torch.stack([c.detach().cpu().float() for c in columns], dim=1).flatten(0, 1)  # image i's columns in a row
    image_grid(rows, nrow=len(columns), gap=2, data_range=data_range).save(out / "sdedit_grid.png")
    np.save(out / "sdedit_images.npy", res.images.detach().cpu().float().numpy())
    header = "input | guide | edited" if args.stroke else "guide | edited"
    print(f"SDEdit: {len(guide)} image(s), solver {args.solver}, t0 index {res.t0}, "
          f"{len(res.trajectory)} network evaluations (trajectory {args.trajectory}, {args.steps} steps)")
    for i, v in enumerate(res.l2.tolist()):
        print(f"  image {i}: L2 to guide {v:.4f}")
    print(f"mean L2 to guide (per-image ||edit - guide||_2 over all pixels): {res.l2.mean().item():.4f}")
    print(f"wrote {out / 'sdedit_grid.png'} ({header}) and {out / 'sdedit_images.npy'}")
    return 0


def _digits(args: argparse.Namespace) -> int:
    from .eval.digits_job import run_digits_job

    _check_output(args.out, "--out", folder=True)
    _check_counts(args, "steps", "samples", "seeds")
    _check_seed(args)
    report = run_digits_job(args.out, steps=args.steps, n_samples=args.samples, seeds=args.seeds,
                            first_seed=args.seed, log=None if args.quiet else print)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"digits_K{args.steps}.md").write_text(report + "\n")
    print()
    print(report)
    return 0


def _sample(args: argparse.Namespace) -> int:
    import torch

    from .integrations import distributed
    from .models.embedded import DIGITS_SHAPE, default_model
    from .core.files import write_atomically
    from .core.images import image_grid
    from .eval.reproduce import model_shape

    _check_output(args.out, "--out", folder=True)
    _check_output(args.npz, "--npz", folder=False)
    _check_counts(args, "num_samples", "batch_size", "shard_size")
    _check_seed(args)
    if args.npz and not args.npz.endswith(".npz"):
        raise UsageError(f"--npz must name a .npz file, got {args.npz!r}")
    if not args.model and args.shape is not None and tuple(args.shape) != DIGITS_SHAPE:
        raise UsageError(f"--shape {' '.join(map(str, args.shape))}: the embedded digits model samples "
                         f"{' '.join(map(str, DIGITS_SHAPE))}; pass --model for other shapes")
    model = _load_model(args.model, args.kind) if args.model else default_model()
    shape = DIGITS_SHAPE if not args.model else tuple(args.shape) if args.shape else model_shape(model)
    if shape is None:
        raise UsageError(f"--shape C H W is required: {args.model} records no image size (a diffusers UNet's config "
                         "does, as sample_size and in_channels)")
    if args.fd and shape != DIGITS_SHAPE:
        raise UsageError("--fd measures digits (1x8x8) samples; use gk.metrics for other data")
    started = distributed.init_from_env()
    rank, world = distributed.world()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device)
    options = _solver_options(args)
    if args.gamma and args.solver != "analytic-dpm":
        raise UsageError(f"--gamma is analytic-dpm's table, but --solver is {args.solver}")
    if args.solver == "analytic-dpm" and "gamma" not in options:
        options["gamma"] = _analytic_gamma(args, model)
    paths = distributed.sample_shards(model, args.out, args.num_samples, shape, shard_size=args.shard_size,
                                      batch_size=args.batch_size, seed=args.seed, progress=not args.quiet,
                                      device=device, steps=args.steps, solver=args.solver,
                                      trajectory=args.trajectory, backend=args.backend, **options)
    if rank == 0:
        images = distributed.load_shards(args.out)
        grid = Path(args.out) / "samples.png"
        # (atomically: a run sharing the folder may write the same files at the same time)
        write_atomically(grid, lambda tmp: image_grid(images[:100], nrow=10, scale=4).save(tmp, format="PNG"))
        print(f"{images.shape[0]} samples in {len(paths)} shard(s) in {args.out}; grid: {grid}")
        if args.npz:
            import numpy as np

            from .core.images import to_uint8

            def save_npz(tmp: Path) -> None:
                with open(tmp, "wb") as f:  # (a file object: np.savez would add .npz to the temporary name)
                    np.savez(f, arr_0=to_uint8(images))  # guided-diffusion's layout: uint8 [N, H, W, C]

            write_atomically(args.npz, save_npz)
            print(f"wrote {args.npz} (arr_0: uint8 [N, H, W, C], as the FID tools read)")
        if args.fd:
            from .core.data import digits
            from .eval.metrics import fd_digits

            print(f"FD-digits: {fd_digits(images, digits('all')[0]):.3f}")
    if started:
        torch.distributed.destroy_process_group()
    return 0


CHOOSE_METRICS = ("fd-digits", "fd-dct", "swd", "fid")


def _choice_score(metric: str, inception: str | None, reference):
    """choose-options' score(samples, reference), lower is better."""
    from .eval import metrics

    if metric == "fd-digits":
        return metrics.fd_digits
    if metric == "fd-dct":
        return metrics.frechet_distance_dct
    if metric == "swd":
        return lambda x, y: metrics.sliced_wasserstein1(x, y, n_projections=256)
    from .eval.inception import load_fid_inception  # (fid: _choose_options has checked that inception is given)

    net = load_fid_inception(inception)
    reference_stats = metrics.fid_statistics(reference, net)  # (once, not once per run)
    return lambda x, _reference: metrics.fid(x, reference_stats, inception=net)


def _choose_options(args: argparse.Namespace) -> int:
    """Choose the model's own GMS options on held-out data (gk.choose_options) and print them; --out saves the
    network with them as its defaults."""
    from .models.embedded import default_model
    from .eval.tuning import choose_options

    _check_output(args.out, "--out", folder=False)
    _check_counts(args, "steps", "seeds", "samples")
    if args.model is None:
        model = default_model()
        reference = args.reference or "digits"
        metric = args.metric or "fd-digits"
    else:
        if args.reference is None or args.metric is None:
            raise UsageError("--model needs --reference (held-out data, not the training data) and --metric")
        model, reference, metric = _load_model(args.model, args.kind), args.reference, args.metric
    from .models import MomentNet

    if args.out is not None and not isinstance(model, MomentNet):  # (e.g. TorchScript: its save() would drop them)
        raise UsageError(f"--out saves a gk.models.MomentNet (its save() keeps the chosen options); this model is a "
                         f"{type(model).__name__}: leave --out out and set model.solver_defaults yourself")
    if metric == "fid" and args.inception is None:
        raise UsageError("--metric fid needs --inception FILE (pt_inception-2015-12-05-6726825d.pth)")
    if args.first_seed < 0:
        raise UsageError(f"--first-seed must be >= 0, got {args.first_seed}")
    if reference == "digits":
        from .core.data import digits

        x_ref = digits("validation")[0]
    else:
        x_ref = _training_data(reference)
    score = _choice_score(metric, args.inception, x_ref)
    choice = choose_options(model, x_ref, score, steps=args.steps, seeds=args.seeds, n_samples=args.samples,
                            first_seed=args.first_seed, trajectory=args.trajectory, backend=args.backend,
                            progress=not args.quiet)
    name = "the validation digits" if reference == "digits" else reference
    print(f"{metric} against {name} ({x_ref.shape[0]} images), lower is better; mean ± 95% half-width over "
          f"{args.seeds} seed(s) of {args.samples} samples:\n")
    print(choice.table())
    print(f"\nchosen: {choice.best}: solver_defaults = {{'gms': {choice.options}}}")
    if args.out is not None:
        model.solver_defaults = {"gms": choice.options}
        model.save(args.out)
        print(f"wrote {args.out} (gk.models.load gives the network with these defaults)")
    return 0


def _key_values(pairs: Sequence[str] | None, flag: str = "--load-option") -> dict:
    """``flag`` KEY=VALUE pairs: VALUE read as JSON (numbers, lists, true/false), else as text."""
    import json

    options = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} takes KEY=VALUE, got {pair!r}")
        if key in options:  # (a repeated key is a typo or a conflict: not silently the last one)
            raise UsageError(f"{flag} {key} given twice")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def _reproduce(args: argparse.Namespace) -> int:
    import os

    import torch

    from .integrations import distributed
    from .eval.reproduce import command_line, reproduce

    _check_output(args.out, "--out", folder=True)
    if (args.inception is None) == (args.feature_extractor is None):
        raise UsageError("pass --inception FILE (the FID Inception weights, pt_inception-2015-12-05-6726825d.pth) "
                         "or --feature-extractor FILE (a TorchScript module), not both")
    extractor = None
    if args.feature_extractor is not None:
        if not os.path.isfile(args.feature_extractor) or not _is_torchscript(args.feature_extractor):
            raise UsageError(f"--feature-extractor {args.feature_extractor}: not a TorchScript file (torch.jit.save)")
        extractor = torch.jit.load(args.feature_extractor, map_location="cpu")
    gms = _gms_options(args)
    started = distributed.init_from_env()
    try:
        res = reproduce(args.model, args.stats, args.out, inception_weights=args.inception, feature_extractor=extractor,
                        steps=args.steps, solvers=args.solvers, num_samples=args.num_samples, seeds=args.seeds,
                        shape=args.shape, kind=args.kind, load_options=_key_values(args.load_option),
                        gms_options=gms, trajectory=args.trajectory, batch_size=args.batch_size,
                        shard_size=args.shard_size, backend=args.backend, progress=not args.quiet,
                        command=command_line(args.argv))
        if res.path is not None:
            print(res.table)
            print(f"\nwrote {res.path}")
    finally:
        if started:
            torch.distributed.destroy_process_group()
    return 0


def _training_data(spec: str, stream: bool = False):
    """--data: 'digits' (scikit-learn, [-1, 1]), a .npy / .pt tensor [N, C, H, W] already in the data range, or a
    folder of PNG / JPEG images: with ``stream`` its Path (training reads it batch by batch, in the model's channel
    count), else all its images as one tensor (gk.data.ImageFolder: scaled to [-1, 1])."""
    import numpy as np
    import torch

    if spec == "digits":
        from .core.data import digits

        return digits("all")[0]
    if Path(spec).is_dir():
        if stream:
            return Path(spec)
        from .core.data import ImageFolder

        folder = ImageFolder(spec)
        return torch.stack([folder[i] for i in range(len(folder))])
    if spec.endswith(".npy"):
        return torch.from_numpy(np.load(spec)).float()
    data = torch.load(spec, map_location="cpu", weights_only=True)
    if not torch.is_tensor(data):
        raise UsageError(f"{spec}: expected a tensor [N, C, H, W]")
    return data.float()


def _training_setup(seed: int):
    """Process group (under torchrun), device and seeded RNG for the train-* commands.

    Returns (started, rank, device). The global RNG is seeded before the network is built, so its
    initial weights do not depend on the process (DDP also broadcasts rank 0's).
    """
    import torch

    from .integrations import distributed

    started = distributed.init_from_env()
    rank, _ = distributed.world()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(seed)
    return started, rank, device


def _reseed_per_rank(seed: int, rank: int) -> None:
    """After the network is built: a distinct global RNG stream per rank (dropout masks)."""
    import torch

    torch.manual_seed(seed + 1_000_003 * (rank + 1))


def _train_backbone(args: argparse.Namespace) -> int:
    import torch
    from torch.utils.data import DataLoader

    from .core.data import ImageFolder
    from .core.files import save_atomically
    from .models import PytorchDDPMUNet
    from .train.training import train_backbone

    _check_training_args(args)
    _check_counts(args, "T", "ch", "ch_mult", "num_res_blocks")
    started, rank, device = _training_setup(args.seed)
    try:
        data = _training_data(args.data, stream=True)
        if isinstance(data, Path):
            data = ImageFolder(data, channels=args.channels)
        elif args.channels not in (None, data.shape[1]):
            raise UsageError(f"--channels {args.channels}: it sets how a --data folder's images are read; this "
                             f"data is a tensor with {data.shape[1]} channels")
        channels = data.channels if isinstance(data, ImageFolder) else data.shape[1]
        net = PytorchDDPMUNet(T=args.T, ch=args.ch, ch_mult=tuple(args.ch_mult), attn=tuple(args.attn),
                              num_res_blocks=args.num_res_blocks, dropout=args.dropout, in_channels=channels).to(device)
        _reseed_per_rank(args.seed, rank)
        if isinstance(data, ImageFolder) and args.workers:
            data = DataLoader(data, num_workers=args.workers)  # (only its dataset and loading settings are used)
        train_backbone(net, data, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                       optimizer=args.optimizer, ema_decay=args.ema, checkpoint=args.checkpoint, seed=args.seed,
                       progress=not args.quiet, sampling=args.sampling)
        if rank == 0:
            state = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
            save_atomically({"ema_model": state, "net_model": state, "step": args.steps}, args.out)  # pytorch-ddpm layout
            print(f"wrote {args.out} (load with gk.models.load)")
    finally:
        if started:
            torch.distributed.destroy_process_group()
    return 0


def _train_heads(args: argparse.Namespace) -> int:
    import torch
    from torch.utils.data import DataLoader

    from .core.data import ImageFolder
    from .core.files import write_atomically
    from .models import MomentNet
    from .train.training import train_heads

    _check_training_args(args)
    started, rank, device = _training_setup(args.seed)
    try:
        data = _training_data(args.data, stream=True)
        net = MomentNet(_load_model(args.model, args.kind), orders=tuple(args.orders), head=args.head,
                        targets=args.targets).to(device)
        _reseed_per_rank(args.seed, rank)
        if isinstance(data, Path):  # (the images in the backbone's channel count)
            data = ImageFolder(data, channels=net.channels)
            if args.workers:
                data = DataLoader(data, num_workers=args.workers)  # (only its dataset and loading settings are used)
        res = train_heads(net, data, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                          optimizer=args.optimizer, ema_decay=args.ema, checkpoint=args.checkpoint, seed=args.seed,
                          progress=not args.quiet, loss_weighting=args.head_loss,
                          output_scale=args.head_scale, sampling=args.sampling)
        if rank == 0:
            write_atomically(args.out, net.save)
            last = {k: v for k, v in res.history[-1].items() if k != "step"} if res.history else {}
            print(f"wrote {args.out} after {res.steps} steps; last losses {last}")
    finally:
        if started:
            torch.distributed.destroy_process_group()
    return 0


def _check_training_args(args: argparse.Namespace) -> None:
    """The train-* commands' shared arguments, before the network is built (or the data read)."""
    _check_output(args.out, "--out", folder=False)
    _check_output(args.checkpoint, "--checkpoint", folder=False)
    _check_counts(args, "steps", "batch_size")
    if args.workers < 0:
        raise UsageError(f"--workers must be >= 0, got {args.workers}")


def _add_training_args(p: argparse.ArgumentParser, out: str, optimizer: str) -> None:
    from .train.training import SAMPLINGS

    p.add_argument("--data", default="digits",
                   help="'digits', a .npy/.pt tensor [N, C, H, W] in [-1, 1], or a folder of PNG/JPEG images (read "
                        "batch by batch, scaled to [-1, 1]; subfolders included, in sorted order)")
    p.add_argument("--sampling", choices=SAMPLINGS, default="replacement",
                   help="replacement: each batch's examples drawn uniformly, with replacement; epochs: a seeded "
                        "permutation per epoch, read in order")
    p.add_argument("--workers", type=int, default=0,
                   help="processes reading an image folder (per training process; 0: the training process itself)")
    p.add_argument("--steps", type=int, default=2000, help="optimiser steps")
    p.add_argument("--batch-size", type=int, default=128,
                   help="the global batch; under torchrun it is split evenly over the processes (a multiple of N)")
    p.add_argument("--lr", type=float, default=2e-4, help="learning rate")
    p.add_argument("--optimizer", choices=["adan", "adam"], default=optimizer, help="optimiser")
    p.add_argument("--ema", type=float, default=0.9999, help="EMA decay of the saved weights")
    p.add_argument("--checkpoint", default=None, help="resumable training state (written every 500 steps; "
                                                      "under torchrun by rank 0, on a file system all ranks read)")
    _add_common(p, out)


def _add_common(p: argparse.ArgumentParser, out: str) -> None:
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--out", default=out, help="output path")
    p.add_argument("--quiet", action="store_true", help="no progress bars (TQDM_DISABLE=1 also works)")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the full traceback of an error")


def _add_gms_args(p: argparse.ArgumentParser) -> None:
    """GMS's options; left out, each takes the model's own (its solver_defaults: the embedded digits model samples
    per pixel), else the library's default (gms_kernels.solvers.gms.GMSOptions)."""
    from .solvers.gms import GMS

    p.add_argument("--preset", choices=sorted(GMS.presets), default=None,
                   help="GMS: a named option set (official: what the official GMS code runs); options below override it")
    p.add_argument("--fit", default=None, choices=["closed", "adan"], help="GMS: the mixture fit")
    p.add_argument("--select", default=None, choices=["sample", "pixel"],
                   help="GMS: one mixture component per sample or per pixel (default: the model's choice, else sample)")
    p.add_argument("--fit-iters", type=int, default=None, help="GMS with --fit adan: ADAN iterations per step")


def _gms_options(args: argparse.Namespace) -> dict:
    """The GMS options named on the command line (the model's and the library's defaults fill in the rest): those
    with a flag of their own, and ``sample``'s --adan-precision."""
    from .solvers.gms import ARGUMENT_OPTIONS

    names = ARGUMENT_OPTIONS + ("adan_precision",)
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _solver_options(args: argparse.Namespace) -> dict:
    """gk.sample's solver options from the command line: the GMS flags, --eta and any --option KEY=VALUE, each for
    a solver that has that option (the values are checked by the library, like every option)."""
    from .solvers import get_solver

    named = _gms_options(args)
    if args.eta is not None:
        named["eta"] = args.eta
    valid = get_solver(args.solver).options
    foreign = [n for n in named if n not in valid]
    if foreign:
        flags = ", ".join("--" + n.replace("_", "-") for n in foreign)
        raise UsageError(f"{flags}: not an option of --solver {args.solver} (it takes {', '.join(valid) or 'none'})")
    options = _key_values(args.option, "--option")
    twice = sorted(set(options) & set(named))
    if twice:
        raise UsageError(f"{', '.join(twice)} given both as a flag and as --option")
    return {**options, **named}


GAMMA_DIGITS = 256  # training digits that estimate the embedded model's Gamma (a mean over 256 x 64 numbers)


def _analytic_gamma(args: argparse.Namespace, model):
    """analytic-dpm's Gamma table: --gamma's file, or, for the embedded digits model, estimated on 256 of its
    training digits at the trajectory's timesteps (seeded by --seed)."""
    import os

    import torch

    if args.gamma:
        if not os.path.isfile(args.gamma):
            raise UsageError(f"--gamma {args.gamma}: no such file")
        from .models._common import read_torch_file

        gamma = read_torch_file(args.gamma)  # (weights_only, with an unreadable file as a ValueError)
        if not torch.is_tensor(gamma) or gamma.dim() != 1:
            raise UsageError(f"--gamma {args.gamma}: expected a 1-d tensor (torch.save of gk.estimate_gamma's table)")
        return gamma
    if args.model:
        raise UsageError("--solver analytic-dpm needs --gamma TABLE.pt with --model: save one with "
                         "torch.save(gk.estimate_gamma(model, x0, schedule, timesteps), 'TABLE.pt')")
    from .core.data import digits
    from .sampling import estimate_gamma
    from .core.schedule import schedule_for, trajectory

    schedule = schedule_for(model)  # (the one gk.sample uses)
    return estimate_gamma(model, digits("train")[0][:GAMMA_DIGITS], schedule,
                          timesteps=trajectory(schedule, args.steps, args.trajectory),
                          generator=torch.Generator().manual_seed(args.seed))


def _add_sampler_args(p: argparse.ArgumentParser, steps: int, solvers: Sequence[str]) -> None:
    from .kernels.dispatch import BACKENDS
    from .core.schedule import TRAJECTORY_KINDS

    p.add_argument("--steps", type=int, default=steps, help="sampling steps K")
    p.add_argument("--solver", default="gms", choices=solvers, help="the reverse-step solver")
    p.add_argument("--trajectory", default="even", choices=TRAJECTORY_KINDS, help="which time indices are visited")
    _add_gms_args(p)
    p.add_argument("--eta", type=float, default=None, help="DDIM's eta (0: deterministic)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="any other solver option, VALUE read as JSON, e.g. var_floor=0.2 (gms), eps_rel=0.05 "
                        "(ggf), s_churn=10 (edm-sde); repeatable")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="where the fused GMS step runs")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .kernels.dispatch import BACKENDS
    from .eval.reproduce import PAPER_SOLVERS, REPRODUCIBLE_SOLVERS
    from .core.schedule import TRAJECTORY_KINDS
    from .solvers import SOLVERS

    # every solver that needs no oracle object (analytic-dpm's Gamma table comes from --gamma or the embedded model);
    # SDEdit has no --gamma
    sampling_solvers = [name for name, spec in SOLVERS.items() if "oracle" not in spec.requires]
    sdedit_solvers = [name for name, spec in SOLVERS.items() if not spec.requires]

    formatter = _HelpFormatter
    p = argparse.ArgumentParser(prog="gms-kernels", description="Gaussian Mixture Solvers for diffusion models. "
                                "Without a command: the digits job.", formatter_class=formatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, text: str, func) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=text, description=text, formatter_class=formatter)
        c.set_defaults(func=func)
        return c

    d = command("digits", "the default job: digits from the embedded model, GMS and the baselines at K steps, "
                          "FD table + grid", _digits)
    d.add_argument("--steps", type=int, default=10, help="sampling steps K")
    d.add_argument("--samples", type=int, default=1000, help="samples per solver and seed")
    d.add_argument("--seeds", type=int, default=5, help="runs per solver (seeds --seed, --seed + 1, ...): the 95%% "
                                                        "intervals need two or more")
    _add_common(d, "gms_out")

    s = command("sample", "sample to resumable shards (the embedded digits model by default); runs under "
                          "torchrun --nproc_per_node N", _sample)
    s.add_argument("--model", help="a checkpoint for gk.models.load (default: the embedded digits model)")
    s.add_argument("--kind", default="auto", help="the checkpoint's format (see gk.models.load), or torchscript")
    s.add_argument("--shape", type=int, nargs=3, metavar=("C", "H", "W"), help="sample shape (with --model, unless the "
                   "network records it, as a diffusers UNet's config does; the embedded model's is 1 8 8)")
    s.add_argument("--num-samples", type=int, default=100, help="how many samples")
    s.add_argument("--batch-size", type=int, default=250, help="samples per network call")
    s.add_argument("--shard-size", type=int, default=1000, help="samples per shard file")
    _add_sampler_args(s, 10, sampling_solvers)
    s.add_argument("--gamma", metavar="TABLE.pt", help="analytic-dpm's Gamma table (torch.save of gk.estimate_gamma's "
                   "result); default with the embedded model: estimated on 256 of its training digits")
    s.add_argument("--adan-precision", choices=["float32", "float64"], default=None,
                   help="the fused kernels' ADAN loop (float64 follows the reference's fit exactly; default: float32 "
                        "up to 40 iterations, float64 for longer loops)")
    s.add_argument("--fd", action="store_true", help="report FD-digits of the samples at the end")
    s.add_argument("--npz", metavar="FILE.npz", help="also write all samples to this .npz (arr_0: uint8 [N, H, W, C])")
    _add_common(s, "gms_out/samples")

    r = command("reproduce", "the paper's FID protocol for checkpoints: samples per (solver, K) through the resumable "
                             "sharded sampler, FID against dataset statistics, a Markdown table like the paper's; "
                             "runs under torchrun --nproc_per_node N -m gms_kernels reproduce ...", _reproduce)
    r.add_argument("--model", action="append", nargs="+", required=True, metavar="CHECKPOINT",
                   help="a checkpoint for gk.models.load; several files after one --model make one network "
                        "(e.g. the official eps eps2 eps3 files with --kind gms-official); repeat --model for more "
                        "networks")
    r.add_argument("--kind", default="auto", help="the checkpoints' format (see gk.models.load)")
    r.add_argument("--load-option", action="append", metavar="KEY=VALUE",
                   help="a gk.models.load option (VALUE as JSON, else text), e.g. num_heads=4; repeatable")
    r.add_argument("--stats", required=True, help="the dataset's FID statistics (pytorch-fid .npz with mu, sigma)")
    r.add_argument("--inception", help="the local FID Inception weights file (pt_inception-2015-12-05-6726825d.pth)")
    r.add_argument("--feature-extractor", help="instead of --inception: a TorchScript module, uint8 [N, 3, H, W] -> "
                                               "features [N, d] (the statistics must come from it)")
    r.add_argument("--steps", type=int, nargs="+", default=[10, 20, 25, 40, 50, 100, 200, 1000], help="the K values")
    r.add_argument("--solvers", nargs="+", default=list(PAPER_SOLVERS),
                   choices=REPRODUCIBLE_SOLVERS, help="the table's rows")
    r.add_argument("--num-samples", type=int, default=50000, help="samples per (solver, K, seed)")
    r.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (several: mean and 95%% interval)")
    r.add_argument("--shape", type=int, nargs=3, metavar=("C", "H", "W"),
                   help="sample shape (needed unless the model is a diffusers UNet with a sample size)")
    r.add_argument("--batch-size", type=int, default=250, help="samples per network call")
    r.add_argument("--shard-size", type=int, default=1000, help="samples per shard file")
    r.add_argument("--trajectory", default="even", choices=TRAJECTORY_KINDS, help="which time indices are visited")
    _add_gms_args(r)
    r.add_argument("--backend", default="auto", choices=BACKENDS, help="where the fused GMS step runs")
    r.add_argument("--out", default="gms_out/reproduce", help="output folder (shards, fid.json per run, fid_table.md)")
    r.add_argument("--quiet", action="store_true", help="no progress bars (TQDM_DISABLE=1 also works)")
    r.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the full traceback of an error")

    ddp = "; multi-process (DDP, --batch-size is the global batch): torchrun --nproc_per_node N -m gms_kernels "
    tb = command("train-backbone", "train a small eps UNet (pytorch-ddpm layout) on small data" + ddp
                 + "train-backbone ...", _train_backbone)
    _add_training_args(tb, "gms_out/backbone.pt", "adam")
    tb.add_argument("--T", type=int, default=1000, help="diffusion steps of the linear schedule")
    tb.add_argument("--ch", type=int, default=32, help="base channels")
    tb.add_argument("--ch-mult", type=int, nargs="+", default=[1, 2, 2], help="channel multiplier per level")
    tb.add_argument("--attn", type=int, nargs="*", default=[1], help="levels with attention")
    tb.add_argument("--num-res-blocks", type=int, default=2, help="residual blocks per level")
    tb.add_argument("--dropout", type=float, default=0.1, help="dropout rate")
    tb.add_argument("--channels", type=int, choices=[1, 3], default=None,
                    help="a --data folder's images read as grey (1) or RGB (3) (default: 1 if the first is grey, "
                         "else 3)")

    from .models.moment_net import TRAINABLE_HEAD_KINDS
    from .train.training import HEAD_LOSS_WEIGHTINGS

    th = command("train-heads", "train the e2/e3 heads on a frozen backbone (the GMS paper's Algorithm 1)" + ddp
                 + "train-heads ...", _train_heads)
    _add_training_args(th, "gms_out/moment_net.pt", "adan")
    th.add_argument("--model", required=True, help="the backbone checkpoint (gk.models.load)")
    th.add_argument("--kind", default="auto", help="the checkpoint's format (see gk.models.load)")
    th.add_argument("--head", choices=TRAINABLE_HEAD_KINDS, default="conv", help="head architecture")
    th.add_argument("--orders", type=int, nargs="+", default=[2, 3], help="moment orders of the extra heads")
    th.add_argument("--targets", choices=["raw", "central"], default="raw",
                    help="raw: heads learn E[eps^n|x_t] (the paper); central: E[(eps - e1)^n|x_t] (less noisy targets)")
    th.add_argument("--head-loss", choices=list(HEAD_LOSS_WEIGHTINGS), default="uniform",
                    help="uniform: the paper's MSE; normalized / rms: the error divided by the target's mean square "
                         "/ RMS at each t (gk.train_heads' loss_weighting)")
    th.add_argument("--head-scale", action="store_true",
                    help="scale each head's output by its target's RMS at t (gk.train_heads(output_scale=True): a "
                         "per-t table saved with the model; use with --head-loss normalized)")

    o = command("oracle", "solver study with exact heads on Gaussian-mixture data", _oracle)
    o.add_argument("--samples", type=int, default=20000, help="samples per solver and K")
    o.add_argument("--steps", type=int, nargs="+", default=[2, 5, 10, 20, 50], help="the K values")
    o.add_argument("--datasets", nargs="+", default=["1d", "8gauss"], choices=["1d", "8gauss"], help="data sets")
    _add_common(o, "gms_out")

    co = command("choose-options", "choose a model's own GMS options on held-out data (gk.choose_options: each "
                                   "candidate at every K over seeds, the lowest mean rank of the metric wins)",
                 _choose_options)
    co.add_argument("--model", help="a checkpoint for gk.models.load (default: the embedded digits model)")
    co.add_argument("--kind", default="auto", help="the checkpoint's format (see gk.models.load), or torchscript")
    co.add_argument("--reference", help="held-out data: a .npy / .pt tensor [N, C, H, W] in the data range, or "
                                        "'digits' (the validation digits; the default without --model)")
    co.add_argument("--metric", choices=CHOOSE_METRICS, default=None,
                    help="the score, lower is better (default without --model: fd-digits)")
    co.add_argument("--inception", help="--metric fid: the local FID Inception weights file")
    co.add_argument("--steps", type=int, nargs="+", default=[5, 10, 20], help="the K values")
    co.add_argument("--seeds", type=int, default=3, help="seeds per (candidate, K)")
    co.add_argument("--first-seed", type=int, default=0,
                    help="the first of those seeds (keep them apart from the seeds you will test with)")
    co.add_argument("--samples", type=int, default=1000, help="samples per run")
    co.add_argument("--trajectory", default="even", choices=TRAJECTORY_KINDS, help="which time indices are visited")
    co.add_argument("--backend", default="auto", choices=BACKENDS, help="where the fused GMS step runs")
    co.add_argument("--out", default=None, help="save the network (a MomentNet) with the chosen options here")
    co.add_argument("--quiet", action="store_true", help="no progress bar")

    e = command("sdedit", "stroke-based editing (SDEdit) of images with any solver", _sdedit)
    e.add_argument("--model", required=True, help="network returning the heads [e1, e2, e3] along dim 1")
    e.add_argument("--kind", default="auto",
                   help="model format: auto, torchscript, or a kind of gms_kernels.models.load "
                        "(pytorch-ddpm, improved-diffusion, diffusers, gms-heads, moment-net)")
    e.add_argument("--input", nargs="+", required=True, help=".png/.jpg images or .npy arrays")
    e.add_argument("--t0", type=_t0_arg, default=0.5, help="start index (e.g. 400) or fraction of T (e.g. 0.4)")
    _add_sampler_args(e, 50, sdedit_solvers)
    e.add_argument("--stroke", type=int, default=0, metavar="BLOCK",
                   help="make stroke guides from the inputs with this block size (0: inputs are the guides)")
    e.add_argument("--colors", type=int, default=6, help="colour levels per channel of --stroke guides")
    e.add_argument("--schedule", default="linear", choices=["linear", "cosine"],
                   help="noise schedule when the model does not carry one")
    e.add_argument("--T", type=int, default=1000, help="number of training steps for --schedule")
    e.add_argument("--time-input", default=None, choices=["index", "index+1", "scaled"],
                   help="the network's time input (default: the model's own, else index)")
    e.add_argument("--data-range", type=float, nargs=2, default=[-1.0, 1.0], help="the data's range LOW HIGH")
    e.add_argument("--device", default="cpu", help="torch device")
    _add_common(e, "gms_out/sdedit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; a user error prints one line (``--debug``: the traceback) and exits 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    no_command = all(a == "--debug" for a in argv)  # then the digits job
    args = parser.parse_args(argv + ["digits"] if no_command else argv)
    args.argv = argv
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        if args.debug:
            raise
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        parser.exit(2, f"{parser.prog} {args.command}: error: {message}\n")


if __name__ == "__main__":
    raise SystemExit(main())
