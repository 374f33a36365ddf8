"""Training the higher-order heads (Algorithm 1 of the GMS paper, https://arxiv.org/abs/2311.00941) and small
backbones, resumable.

- :func:`train_heads`: backbone frozen in eval mode, targets eps^n, MSE per order (the
  paper's Eq. (11); ``loss_weighting`` can divide it by the targets' size at each t), EMA of the head
  weights, grad-norm clip, ADAN or Adam.
- :func:`train_backbone`: the usual eps-prediction loss, for small data sets (toy data, digits).

The training data (:data:`TrainingData`) is a tensor [N, C, ...] held in memory, or read batch by batch: a
map-style ``Dataset`` (items a tensor [C, ...] or a (tensor, label, ...) tuple: the labels are left aside, or
given to a conditional network by :func:`train_heads`), a
``DataLoader`` over one (its dataset and loading settings are used: workers, collate_fn, pin_memory; its
sampler and batch size are not), or a folder of PNG / JPEG images (:class:`gms_kernels.core.data.ImageFolder`, in
the model's channel count, scaled to [-1, 1]). Read batch by batch, memory does not grow with the data set but
for its index: a file name per image, and with ``sampling="epochs"`` one permutation of N indices.

``sampling`` says which examples make each global batch: ``"replacement"`` (the default) draws them uniformly
with replacement from the training generator, as the tensor path always has; ``"epochs"`` reads each epoch's
own seeded permutation in order, so every example is seen once per epoch. Either way the order depends on the
seed alone: a folder holding exactly a tensor's images, in order, trains to the same weights bit for bit.

Both write a checkpoint every ``checkpoint_every`` steps (atomically) and resume from it with
nothing lost: batches, times and noise come from a generator whose state is checkpointed with the data
position (the sampling, N, and with ``"epochs"`` the seed, epoch and index in that epoch's order), so an
interrupted run, even one killed outright, continues exactly as the uninterrupted one would have. Dropout
draws from torch's global RNG: its state (each rank's, and the CUDA device's where the model runs there) is
checkpointed too. (Not so the random numbers of a Dataset's own augmentations, drawn in its workers.)

Multi-process: when a torch.distributed process group is initialised (``torchrun --nproc_per_node N``,
then :func:`gms_kernels.integrations.distributed.init_from_env`), the module is wrapped in DistributedDataParallel.
``batch_size`` stays the global batch: every rank draws the same global batch (indices, times, noise)
from the shared seeded generator and trains on its own contiguous 1/N of the rows, so N processes follow
the one-process run up to the order of float reductions; read from a Dataset, each rank reads only the
examples of its own rows. Rank 0 alone writes checkpoints and shows the progress bar; every rank resumes from
the same checkpoint file; logged losses are averaged over ranks.
"""
from __future__ import annotations

import inspect
import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Union

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from ..integrations import distributed
from ..core.data import ImageFolder
from ..core.files import save_atomically
from ..model_io import time_values
from .optim import Adan
from ..core.progress import progress_bar
from ..core.schedule import Schedule, schedule_for

CHECKPOINT_FORMAT = "gms_kernels.train/1"
OPTIMIZERS = ("adan", "adam")
SAMPLINGS = ("replacement", "epochs")
# what train_heads / train_backbone read: a tensor [N, C, ...], a map-style Dataset, a DataLoader, an image folder
TrainingData = Union[torch.Tensor, Dataset, DataLoader, str, os.PathLike]
HEAD_LOSS_WEIGHTINGS = ("uniform", "normalized", "rms")
# loss_weighting="normalized" / "rms": the per-t scale of each head's target is estimated once, before
# training, in SCALE_BUCKETS equal bands of t (at least SCALE_VALUES scalar targets per band, between
# SCALE_MIN_ROWS and SCALE_MAX_ROWS examples), interpolated in log between the band centres and floored at
# SCALE_FLOOR times its largest value over t. The floor only guards against an estimate that is zero or
# underflows (an exact backbone); it lies below the spread of real targets: on the shipped digits and patches
# models E[r^6 | t] falls to 3e-9 - 6e-9 of its value at t = 0, E[r^4 | t] to 2e-6 - 3e-6.
SCALE_BUCKETS = 50
SCALE_VALUES = 16384
SCALE_MIN_ROWS, SCALE_MAX_ROWS = 32, 1024
SCALE_FLOOR = 1e-10
# the estimate's forward passes (no gradients kept) take up to this many input values at once, or one batch
SCALE_CHUNK_VALUES = 2**17
_SCALE_POWERS = {"normalized": 1.0, "rms": 0.5}  # the loss divides by s_n(t) ** power


@dataclass
class TrainResult:
    steps: int
    history: list[dict] = field(default_factory=list)  # one dict of losses per logged step
    # train_heads(loss_weighting="normalized" or "rms"): {order n: s_n(t), the estimate of E[y_n^2 | t] whose
    # power divides the loss (1 or 1/2), a float64 tensor [T]}
    loss_scales: dict[int, torch.Tensor] | None = None


class EMA:
    """Exponential moving average of the trainable parameters, kept by torch's
    :class:`~torch.optim.swa_utils.AveragedModel`; the decay warms up as min(decay, (1+n)/(10+n)) at
    the n-th update, and the average starts at the weights the EMA is built from.

    Only the given parameters are copied (a frozen backbone is not). ``shadow`` maps each name to its
    averaged tensor; :meth:`state_dict` / :meth:`load_state_dict` keep the checkpoint format
    ``{"decay", "updates", "shadow": {name: tensor}}``.
    """

    def __init__(self, params: dict[str, torch.Tensor], decay: float):
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"ema_decay must lie in [0, 1], got {decay}")
        self.decay = decay
        self.updates = 0
        self._names = list(params)
        self._live = nn.ParameterList([p if isinstance(p, nn.Parameter) else nn.Parameter(p, requires_grad=False)
                                       for p in params.values()])  # the live tensors themselves, not copies
        # deep-copies the live tensors; its step count is made where they are, not on torch's default device
        device = self._live[0].device if len(self._live) else None
        self._average = AveragedModel(self._live, device=device, multi_avg_fn=self._lerp)
        self._average.requires_grad_(False)
        self._average.update_parameters(self._live)  # the first update copies: the average starts here

    @torch.no_grad()
    def _lerp(self, averaged: list[torch.Tensor], current: list[torch.Tensor], _n_averaged) -> None:
        # (the count is kept on the host: AveragedModel hands n_averaged over on the parameters' device)
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(averaged, current, 1 - d)

    @property
    def shadow(self) -> dict[str, torch.Tensor]:
        return {k: p.detach() for k, p in zip(self._names, self._average.module.parameters())}

    def update(self, params: dict[str, torch.Tensor] | None = None) -> None:
        """One EMA step towards the live parameters (those given at construction; ``params``, if
        given, must be the same tensors)."""
        if params is not None and any(a is not b for a, b in zip(params.values(), self._live)):
            raise ValueError("EMA.update: pass the parameters the EMA was built from")
        self.updates += 1
        self._average.update_parameters(self._live)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates, "shadow": dict(self.shadow)}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        shadow = self.shadow
        if set(state["shadow"]) != set(shadow):
            raise ValueError(f"EMA state holds {sorted(set(state['shadow']) ^ set(shadow))[:5]}, which do not "
                             "match the parameters of this EMA")
        self.decay, self.updates = state["decay"], int(state["updates"])
        for k, v in state["shadow"].items():
            shadow[k].copy_(v)
        self._average.n_averaged.fill_(self.updates + 1)  # the initial copy counts as one


def _trainable(module: nn.Module) -> dict[str, nn.Parameter]:
    params = {k: p for k, p in module.named_parameters() if p.requires_grad}
    if not params:
        raise ValueError("the model has no trainable parameters")
    return params


def _wrap_ddp(module: nn.Module, device: torch.device) -> DistributedDataParallel:
    """DDP over the module's trainable parameters (frozen ones, requires_grad=False, are not reduced).

    ``static_graph=True``: the loss uses the same parameters every step, so DDP finds any trainable
    parameter the loss never reaches on the first step and leaves it out, without a per-step search.
    Building it broadcasts rank 0's parameters and buffers, so every rank starts from the same weights.
    """
    if dist.get_backend() == "nccl" and device.type != "cuda":
        raise ValueError("the process group uses nccl but the model is on the CPU: move it to this rank's GPU "
                         "(torch.device('cuda', LOCAL_RANK)) before training")
    return DistributedDataParallel(module, device_ids=[device] if device.type == "cuda" else None,
                                   static_graph=True)


def _same_on_all_ranks(step: int, device: torch.device, path: Path | None) -> None:
    """A clear error, raised on every rank, when the ranks resumed from different checkpoints."""
    both = torch.tensor([step, -step], dtype=torch.int64, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    high, low = int(both[0]), -int(both[1])
    if high != low:
        raise ValueError(f"the processes resumed from different states of the checkpoint {path} (steps {low} to "
                         f"{high}): it must be one file that every process can read (a shared file system)")


def _check_sampling(sampling: str) -> None:
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; valid: {', '.join(SAMPLINGS)}")


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")


def _model_channels(module: nn.Module) -> int | None:
    """The channel count the model takes, where it says (None: an image folder then keeps the images' own)."""
    for name in ("channels", "eps_channels", "in_channels"):
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _labels_of(batch: Any) -> Any:
    """The labels of a collated (tensor, label, ...) batch or item; ValueError when it has none."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        got = f"a {len(batch)}-tuple" if isinstance(batch, (list, tuple)) else type(batch).__name__
        raise ValueError(f"conditional head training reads (image, label) items, but the data gives {got}: pass a "
                         "Dataset of (image, label) pairs, e.g. torch.utils.data.TensorDataset(images, labels), or "
                         "train an unconditional network")
    return batch[1]


def _without_labels(batch: Any) -> torch.Tensor:
    """The examples of an item or batch: a tensor (or array), or the first element of a (tensor, label, ...)."""
    if isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    if isinstance(batch, np.ndarray):
        batch = torch.from_numpy(batch)
    if not torch.is_tensor(batch):
        raise TypeError(f"a training item must be a tensor or a (tensor, label, ...) tuple, got {type(batch).__name__}")
    return batch


@dataclass
class _Source:
    """The training examples: a tensor held whole, or a map-style Dataset read one batch at a time."""
    size: int
    shape: tuple[int, ...]  # one example's
    tensor: torch.Tensor | None = None
    dataset: Any = None
    collate: Callable = default_collate
    loading: dict = field(default_factory=dict)  # DataLoader settings kept from the caller's loader

    def examples(self, batch: Any) -> torch.Tensor:
        """A collated batch read from the dataset, checked (it has no labels, the first example's shape)."""
        x = _without_labels(batch)
        if tuple(x.shape[1:]) != self.shape:
            raise ValueError(f"a batch of training examples has shape {tuple(x.shape)}; every example must have the "
                             f"first one's shape {self.shape}")
        if not torch.isfinite(x).all():
            raise ValueError("training data has non-finite values")
        return x

    def rows(self, idx: torch.Tensor) -> torch.Tensor:
        """The examples at ``idx``, read at once (a few: the output scale estimate)."""
        if self.tensor is not None:
            return self.tensor[idx]
        return self.examples(self.collate([self.dataset[i] for i in idx.tolist()]))

    def labelled_rows(self, idx: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(the examples, their labels) at ``idx`` (a labelled Dataset only)."""
        batch = self.collate([self.dataset[i] for i in idx.tolist()])
        return self.examples(batch), _labels_of(batch)


def _source(data: TrainingData, channels: int | None) -> _Source:
    """``data`` checked, an image folder opened in ``channels`` (None: the images' own)."""
    if torch.is_tensor(data):
        if data.dim() < 2 or data.shape[0] < 1:
            raise ValueError("data must be a tensor [N, C, ...] of training examples in the model's data range")
        if not torch.isfinite(data).all():
            raise ValueError("training data has non-finite values")
        return _Source(data.shape[0], tuple(data.shape[1:]), tensor=data)
    collate, loading = default_collate, {}
    if isinstance(data, (str, os.PathLike)):
        data = ImageFolder(data, channels)
    elif isinstance(data, DataLoader):
        loader, data = data, data.dataset
        if loader.batch_sampler is not None:  # (without batching its collate_fn only converts one item)
            collate = loader.collate_fn
        loading = dict(num_workers=loader.num_workers, pin_memory=loader.pin_memory, timeout=loader.timeout,
                       worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context)
        if loader.num_workers:
            loading["prefetch_factor"] = loader.prefetch_factor
    if isinstance(data, IterableDataset) or not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        raise TypeError(f"data must be a tensor [N, C, ...], a map-style Dataset (indexable, with a length), a "
                        f"DataLoader over one, or a folder of images; got {type(data).__name__}")
    if len(data) < 1:
        raise ValueError("the training data set is empty")
    first = _without_labels(data[0])
    if first.dim() < 1 or not first.is_floating_point():
        raise ValueError(f"a training example must be a floating-point tensor [C, ...] in the model's data range; "
                         f"the first is {first.dtype} of shape {tuple(first.shape)}")
    if channels is not None and first.shape[0] != channels:
        raise ValueError(f"the training examples have {first.shape[0]} channels (shape {tuple(first.shape)}), the "
                         f"model takes {channels}")
    return _Source(len(data), tuple(first.shape), dataset=data, collate=collate, loading=loading)


def _epoch_order(size: int, seed: int, epoch: int) -> torch.Tensor:
    """The order of the examples in ``epoch``: a permutation from a generator of its own, made from (seed, epoch)
    alone, so that a resumed run remakes it from the checkpoint's data position."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch + 1) % 2**63)
    return torch.randperm(size, generator=g, device="cpu")


@dataclass
class _Step:
    idx: torch.Tensor  # this rank's rows of the global batch: example indices
    t: torch.Tensor
    eps: torch.Tensor
    state: dict  # what the checkpoint holds once this step is done: {"rng", "data"}
    drop: torch.Tensor | None = None  # this rank's rows whose label becomes the null label (condition dropout)


class _Draws:
    """Each step's draws, made in step order: the global batch's example indices, times and noise, of which this
    rank keeps its rows ``mine``. Times and noise come from ``gen``, and so do the indices with ``"replacement"``;
    with ``"epochs"`` they are the next ones of the current epoch's order (running on into the next epoch)."""

    def __init__(self, gen: torch.Generator, source: _Source, T: int, batch_size: int, mine: slice, sampling: str,
                 seed: int, drop_p: float = 0.0):
        self.gen, self.size, self.shape, self.T, self.drop_p = gen, source.size, source.shape, T, drop_p
        self.batch_size, self.mine, self.sampling, self.seed = batch_size, mine, sampling, seed
        self.epoch, self.index = 0, 0  # the data position ("epochs")
        self._order: torch.Tensor | None = None
        self._order_epoch = -1

    def data_state(self) -> dict:
        state = {"sampling": self.sampling, "size": self.size}
        if self.sampling == "epochs":
            state.update(seed=self.seed, epoch=self.epoch, index=self.index)
        if self.drop_p:  # (it draws from the generator too)
            state["condition_dropout"] = self.drop_p
        return state

    def resume(self, state: dict, path: Path) -> None:
        """Continue from a checkpoint's data position (checkpoints written before it was stored drew with
        replacement)."""
        state = state or {"sampling": "replacement", "size": self.size}
        if state["sampling"] != self.sampling or state["size"] != self.size:
            raise ValueError(f"checkpoint {path} was written for {state['size']} examples with sampling "
                             f"{state['sampling']!r}, this run has {self.size} with {self.sampling!r}: resume with "
                             "the same data and sampling, or use another checkpoint path")
        if state.get("condition_dropout", 0.0) != self.drop_p:
            raise ValueError(f"checkpoint {path} was written with condition_dropout="
                             f"{state.get('condition_dropout', 0.0)}, this run has {self.drop_p}: resume with the same "
                             "condition_dropout, or use another checkpoint path")
        if self.sampling == "epochs":
            self.seed, self.epoch, self.index = int(state["seed"]), int(state["epoch"]), int(state["index"])

    def _indices(self) -> torch.Tensor:
        if self.sampling == "replacement":
            return torch.randint(0, self.size, (self.batch_size,), generator=self.gen, device=self.gen.device)
        parts, need = [], self.batch_size
        while need:
            if self._order_epoch != self.epoch:
                self._order, self._order_epoch = _epoch_order(self.size, self.seed, self.epoch), self.epoch
            take = min(need, self.size - self.index)
            parts.append(self._order[self.index:self.index + take])
            self.index, need = self.index + take, need - take
            if self.index == self.size:
                self.epoch, self.index = self.epoch + 1, 0
        return torch.cat(parts)

    def __call__(self) -> _Step:
        # (on the generator's device, the CPU, whatever torch's default device is)
        idx = self._indices()[self.mine]
        t = torch.randint(0, self.T, (self.batch_size,), generator=self.gen, device=self.gen.device)[self.mine]
        eps = torch.randn((self.batch_size, *self.shape), generator=self.gen, device=self.gen.device)[self.mine]
        drop = None
        if self.drop_p:  # (drawn for the global batch, after the noise: a run without dropout draws as before)
            drop = (torch.rand(self.batch_size, generator=self.gen, device=self.gen.device) < self.drop_p)[self.mine]
        return _Step(idx, t, eps, {"rng": self.gen.get_state(), "data": self.data_state()}, drop)


class _StepIndices:
    """A DataLoader's ``batch_sampler``: this rank's example indices for each of ``count`` steps. The loader may ask
    for a few steps ahead (its workers' prefetch): each step's draws wait in ``pending`` until its batch arrives."""

    def __init__(self, draws: _Draws, count: int):
        self.draws, self.count = draws, count
        self.pending: deque[_Step] = deque()

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.count):
            step = self.draws()
            self.pending.append(step)
            yield step.idx.tolist()


# batches must come back in step order (torch >= 2.6 can be told otherwise; it is the default)
_IN_ORDER = {"in_order": True} if "in_order" in inspect.signature(DataLoader).parameters else {}


def _batches(source: _Source, draws: _Draws, count: int, seed: int,
             labelled: bool = False) -> Iterator[tuple[torch.Tensor, Any, _Step]]:
    """``count`` steps of (this rank's examples, their labels if ``labelled`` else None, the step's draws)."""
    if source.tensor is not None:
        for _ in range(count):
            step = draws()
            yield source.tensor[step.idx], None, step
        return
    if count < 1:  # (no loader, no workers started for nothing)
        return
    plan = _StepIndices(draws, count)
    # a generator of its own seeds the workers: the loader would otherwise draw from the global RNG (dropout's)
    loader = DataLoader(source.dataset, batch_sampler=plan, collate_fn=source.collate,
                        generator=torch.Generator().manual_seed(seed), **source.loading, **_IN_ORDER)
    for batch in loader:
        yield source.examples(batch), _labels_of(batch) if labelled else None, plan.pending.popleft()


@dataclass
class _Condition:
    """How the labels of a labelled data set reach a conditional network: as the keyword argument ``key``, each
    replaced by ``null`` where the step's dropout mask says (classifier-free guidance's unconditional branch)."""
    key: str
    dropout: float
    null: Any

    def kwargs(self, labels: Any, drop: torch.Tensor | None, device: torch.device) -> dict[str, Any]:
        labels = torch.as_tensor(labels)
        if drop is not None:
            mask = drop.to(labels.device).reshape(-1, *[1] * (labels.dim() - 1))
            labels = torch.where(mask, torch.as_tensor(self.null, dtype=labels.dtype, device=labels.device), labels)
        return {self.key: labels.to(device)}


def _loop(module: nn.Module, loss_terms: Callable, source: _Source, schedule: Schedule, kind: str, *,
          steps: int, batch_size: int, lr: float, optimizer: str, ema_decay: float, grad_clip: float,
          checkpoint: str | Path | None, checkpoint_every: int, seed: int, progress: bool,
          log: Callable[[dict], None] | None, sampling: str, condition: _Condition | None = None) -> TrainResult:
    """``loss_terms(model, x_t, t, eps, **condition)`` -> {name: scalar loss}; ``model`` is the module or its DDP
    wrapper; ``condition``: the labels' keyword argument (None: no keyword arguments)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    _check_batch_size(batch_size)
    rank, world = distributed.world()
    if batch_size % world:
        raise ValueError(f"batch_size {batch_size} is the global batch, split evenly over the {world} processes: "
                         f"it must be a multiple of {world} (e.g. {max(1, round(batch_size / world)) * world})")
    params = _trainable(module)
    device = next(iter(params.values())).device
    model = _wrap_ddp(module, device) if world > 1 else module
    opt = (Adan if optimizer == "adan" else torch.optim.Adam)(params.values(), lr=lr)
    ema = EMA(params, ema_decay)
    gen = torch.Generator().manual_seed(seed)
    local = batch_size // world
    draws = _Draws(gen, source, schedule.T, batch_size, slice(rank * local, (rank + 1) * local), sampling, seed,
                   condition.dropout if condition is not None else 0.0)
    result = TrainResult(0)
    path = Path(checkpoint) if checkpoint else None
    if path is not None and path.exists():
        state = _load_checkpoint(path, kind)
        if set(state["trainable"]) != set(params):
            raise ValueError(f"checkpoint {path} holds parameters {sorted(set(state['trainable']) ^ set(params))[:5]} "
                             "that do not match this model's trainable parameters; use another path")
        module.load_state_dict(state["trainable"], strict=False)
        opt.load_state_dict(state["optimizer"])
        ema.load_state_dict(state["ema"])
        draws.resume(state.get("data"), path)
        gen.set_state(state["rng"])
        _set_global_rng(state.get("global_rng"), rank, world, device)
        result = TrainResult(state["step"], state["history"])
    if world > 1:
        _same_on_all_ranks(result.steps, device, path)
    # the state after the last step done (the loader may have drawn a few steps ahead of it)
    done = {"rng": gen.get_state(), "data": draws.data_state(), "global_rng": _global_rng(device)}

    def save() -> None:
        if path is None:
            return
        global_rngs = [done["global_rng"]]
        if world > 1:  # (each rank's dropout masks come from its own global RNG)
            global_rngs = [None] * world
            dist.all_gather_object(global_rngs, done["global_rng"])
        if rank == 0:
            save_atomically({"format": CHECKPOINT_FORMAT, "kind": kind, "step": result.steps,
                              "trainable": {k: p.detach().clone() for k, p in params.items()},
                              "optimizer": opt.state_dict(), "ema": ema.state_dict(), "rng": done["rng"],
                              "data": done["data"], "global_rng": global_rngs, "history": result.history}, path)

    bar = progress_bar(total=steps, initial=result.steps, desc=f"train {kind}", enabled=progress and rank == 0)
    # the global batch is drawn on every rank (same generator, same state), each keeps (and reads) its rows
    batches = _batches(source, draws, max(0, steps - result.steps), seed, condition is not None)
    try:
        for x0, labels, step in batches:
            t, eps = step.t, step.eps.to(device)
            kwargs = {} if condition is None else condition.kwargs(labels, step.drop, device)
            losses = loss_terms(model, schedule.add_noise(x0.to(device), eps, t), t.to(device), eps, **kwargs)
            total = sum(losses.values())
            opt.zero_grad(set_to_none=True)
            total.backward()  # under DDP the gradients come back averaged over the ranks
            torch.nn.utils.clip_grad_norm_(list(params.values()), grad_clip)
            opt.step()
            ema.update(params)
            result.steps += 1
            done = dict(step.state, global_rng=_global_rng(device))
            values = torch.stack([v.detach() for v in losses.values()]).to(torch.float64)
            if world > 1:  # the global-batch losses: the mean of the ranks' equal-sized slice means
                dist.all_reduce(values)
                values /= world
            record = {"step": result.steps, **dict(zip(losses, values.tolist()))}
            result.history.append(record)
            bar.update(1)
            bar.set_postfix({k: f"{v:.4f}" for k, v in record.items() if k != "step"})
            if log is not None:
                log(record)
            if result.steps % checkpoint_every == 0:
                save()
    except KeyboardInterrupt:
        save()
        raise
    finally:
        batches.close()  # (stops the loader's workers)
        bar.close()
    save()
    if world > 1:
        del model  # drop DDP's hooks; the caller gets the plain module
        dist.barrier()  # the final checkpoint is complete before any rank returns (and may read it again)
    with torch.no_grad():  # the trained model is the EMA one
        shadow = ema.shadow
        for k, p in params.items():
            p.copy_(shadow[k])
    return result


def _global_rng(device: torch.device) -> dict[str, torch.Tensor | None]:
    """torch's global RNG states that a training step draws from (dropout): the CPU's, and the CUDA device's."""
    device = torch.device(device)
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def _set_global_rng(states: list[dict] | None, rank: int, world: int, device: torch.device) -> None:
    """Restore this rank's global RNG from a checkpoint's per-rank states (absent in older checkpoints, or
    written by another number of processes: then the dropout masks differ from an uninterrupted run's)."""
    if not states or len(states) != world:
        return
    torch.set_rng_state(states[rank]["cpu"])
    if states[rank]["cuda"] is not None and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(states[rank]["cuda"], torch.device(device))


def _load_checkpoint(path: Path, kind: str) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated or foreign file
        raise ValueError(f"cannot read training checkpoint {path}: {exc}. Delete it to start over.") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT or state.get("kind") != kind:
        raise ValueError(f"{path} is not a gms_kernels {kind} training checkpoint; delete it or pass another path")
    return state


def _head_targets(net: nn.Module, x_t: torch.Tensor, tv: torch.Tensor, eps: torch.Tensor, C: int,
                  central: bool, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(the heads' outputs [B, (orders - 1) * C, ...], the base whose powers they fit, the number of orders);
    ``kwargs``: the network's condition."""
    out = net(x_t, tv, head_outputs=True, **kwargs) if central else net(x_t, tv, **kwargs)
    orders = out.shape[1] // C
    if orders < 2:
        raise ValueError(f"train_heads needs a network with higher-order heads; it returned {out.shape[1]} "
                         f"channels for {C}-channel data")
    # raw heads fit eps^n; central heads fit r^n, r = eps - e1 (the frozen backbone's residual)
    base = eps - out[:, :C].detach() if central else eps
    return out[:, C:], base, orders


@torch.no_grad()
def _target_scales(net: nn.Module, source: _Source, schedule: Schedule, time_input: str, central: bool,
                   batch_size: int, seed: int, label_key: str | None = None) -> dict[int, torch.Tensor]:
    """{n: s_n(t), float64 [T]}: an estimate of E[(y_n)^2 | t], y_n the target of head n (eps^n, or r^n for
    central heads), from the frozen backbone on the training data, with a generator of its own (so the
    training draws are untouched, and every process of a multi-process run computes the same table).
    It reads a bounded number of examples whatever N: at most SCALE_MAX_ROWS per band of t. The draws are
    made batch_size rows at a time (the table depends on the seed and batch size only) and run through the
    network in chunks of a whole number of batches, up to SCALE_CHUNK_VALUES input values.

    The mean of y_n^2 over examples, noise and elements is taken in SCALE_BUCKETS equal bands of t; log s is
    interpolated linearly between the band centres (held flat beyond the first and last). Each s_n is then
    floored at SCALE_FLOOR times its largest value, so no t gets more than 1 / SCALE_FLOOR times the weight
    of the t with the largest targets, and a target that is zero to float precision cannot blow up the loss.
    (The band means are heavy-tailed where the targets are small: on the shipped digits and patches models,
    two seeds of this estimate differ in single bands at t >= 700 by up to 3x for r^4 and 20x for r^6, where a
    few large residuals dominate a band. The weights are right there in order of magnitude only, against the
    5-9 orders by which the uniform loss underweights those t.)
    """
    T, C = schedule.T, source.shape[0]
    device = next(p.device for p in net.parameters())
    per_row = max(1, math.prod(source.shape))
    rows = min(SCALE_MAX_ROWS, max(SCALE_MIN_ROWS, -(-SCALE_VALUES // per_row)))
    edges = torch.linspace(0, T, SCALE_BUCKETS + 1).round().long()
    chunk = max(1, min(rows, SCALE_CHUNK_VALUES // per_row) // batch_size) * batch_size
    gen = torch.Generator().manual_seed(seed)
    sums: dict[int, list[float]] = {}
    for b in range(SCALE_BUCKETS):
        lo, hi = int(edges[b]), max(int(edges[b + 1]), int(edges[b]) + 1)
        acc: dict[int, float] = {}
        for first in range(0, rows, chunk):
            draws = []
            for start in range(first, min(first + chunk, rows), batch_size):
                m = min(batch_size, rows - start)
                draws.append((torch.randint(0, source.size, (m,), generator=gen),
                              torch.randint(lo, hi, (m,), generator=gen),
                              torch.randn((m, *source.shape), generator=gen)))
            idx, t, eps = (torch.cat(d) for d in zip(*draws))
            eps = eps.to(device)
            kwargs = {}
            if label_key is None:
                x0 = source.rows(idx)
            else:  # (each example's own label: the targets of the conditional model)
                x0, y = source.labelled_rows(idx)
                kwargs[label_key] = torch.as_tensor(y).to(device)
            x_t = schedule.add_noise(x0.to(device), eps, t)
            _, base, orders = _head_targets(net, x_t, time_values(t, T, time_input).to(device), eps, C, central,
                                            **kwargs)
            for n in range(2, orders + 1):
                acc[n] = acc.get(n, 0.0) + float(base.double().pow(2 * n).sum())
        for n, v in acc.items():
            sums.setdefault(n, []).append(v / (rows * per_row))
    centres = (edges[:-1] + edges[1:]).double() / 2 - 0.5  # the mean t of each band
    grid = torch.arange(T, dtype=torch.float64)
    scales = {}
    for n, values in sums.items():
        v = torch.tensor(values, dtype=torch.float64)
        if not torch.isfinite(v).all() or float(v.max()) <= 0:
            raise ValueError(f"a t-weighted head loss: the targets of head e{n} are zero or not finite ("
                             f"largest band mean {v.max().item()}); use loss_weighting='uniform'")
        logv = v.clamp_min(float(v.max()) * SCALE_FLOOR).log()
        pos = torch.bucketize(grid, centres).clamp(1, len(centres) - 1)  # the bands left and right of each t
        w = ((grid - centres[pos - 1]) / (centres[pos] - centres[pos - 1])).clamp(0, 1)
        s = (logv[pos - 1] + w * (logv[pos] - logv[pos - 1])).exp()
        scales[n] = s.clamp_min(float(s.max()) * SCALE_FLOOR)
    return scales


def _is_conditional(net: nn.Module) -> bool:
    """Whether a network says it takes a condition (``conditional``: a class-conditional diffusers UNet's
    wrapper, or a MomentNet on one)."""
    return bool(getattr(net, "conditional", False) or getattr(getattr(net, "backbone", None), "conditional", False))


def _head_condition(net: nn.Module, label_key: str | None, dropout: float, null_label: Any) -> _Condition | None:
    """train_heads' label arguments checked: None when the labels are left aside."""
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= float(dropout) <= 1.0:
        raise ValueError(f"condition_dropout must be a probability in [0, 1] (the share of labels replaced by "
                         f"null_label), got {dropout!r}")
    dropout = float(dropout)
    if dropout > 0 and null_label is None:
        raise ValueError(f"condition_dropout={dropout} replaces labels by null_label: give it (e.g. null_label="
                         "num_classes for a UNet2DModel built with num_class_embeds=num_classes + 1)")
    if null_label is not None and not (torch.is_tensor(null_label) or (isinstance(null_label, int)
                                                                       and not isinstance(null_label, bool))):
        raise TypeError(f"null_label must be an int label or a tensor, got {type(null_label).__name__}")
    if label_key is not None and not (isinstance(label_key, str) and label_key.isidentifier()):
        raise ValueError(f"label_key must be the name of the network's keyword argument (e.g. 'class_labels'), "
                         f"got {label_key!r}")
    if label_key is None and not (_is_conditional(net) or dropout > 0 or null_label is not None):
        return None
    return _Condition(label_key or "class_labels", dropout, null_label)


def train_heads(net: nn.Module, data: TrainingData, schedule: Schedule | None = None, *, steps: int = 1000,
                batch_size: int = 128, lr: float = 2e-4, optimizer: str = "adan", ema_decay: float = 0.9999,
                grad_clip: float = 1.0, checkpoint: str | Path | None = None, checkpoint_every: int = 500,
                seed: int = 0, time_input: str | None = None, progress: bool = True,
                log: Callable[[dict], None] | None = None, loss_weighting: str = "uniform",
                output_scale: bool = False, sampling: str = "replacement", label_key: str | None = None,
                condition_dropout: float = 0.0, null_label: Any = None) -> TrainResult:
    """The paper's Algorithm 1: fit the heads e^n (n >= 2) of a ``MomentNet`` to eps^n with MSE (to (eps - e1)^n
    for a MomentNet with ``targets="central"``).

    ``net(x_t, t)`` returns [e1, e2, ...] along dim 1; only its trainable parameters (the heads) learn.
    The backbone stays frozen in eval mode. Losses are logged per order as ``mse_e2``, ``mse_e3``.
    On return ``net`` holds the EMA weights.

    ``data``: a tensor [N, C, ...] in the model's data range, a map-style ``Dataset`` of such examples (or of
    (example, label) tuples), a ``DataLoader`` over one, or a folder of PNG / JPEG images (read in the
    network's channel count, ``net.channels``, scaled to [-1, 1]); all but the tensor are read batch by batch.
    ``sampling``: ``"replacement"`` or ``"epochs"`` (see the module's docstring).

    Conditional networks (e.g. a MomentNet on a class-conditional diffusers UNet2DModel): ``data`` gives
    (image, label) items (``TensorDataset(images, labels)``), and each batch's labels are passed to the network
    as the keyword argument ``label_key``. ``label_key`` None: ``"class_labels"`` for a network that says it is
    conditional (``conditional``, its backbone's too) or when ``condition_dropout`` / ``null_label`` is given;
    otherwise the labels are left aside, as for an unconditional network. ``condition_dropout`` p: each label is
    replaced by ``null_label`` with probability p, so that the heads learn the unconditional branch of
    classifier-free guidance as well (``gk.sample(..., guidance_scale=w, null_kwargs={"class_labels":
    null_label})``); the draws come from the training generator, so a resumed run drops the same labels.
    With p = 0 nothing is drawn, and data without labels trains exactly as before.

    ``loss_weighting``:

    - ``"uniform"`` (the default, the paper's loss): the plain MSE of head n against its target y_n (eps^n or
      r^n = (eps - e1)^n), averaged over the batch with t uniform over 0..T-1. Every t counts by the size of
      its errors, so where the targets are small (central heads at large t: r is the backbone's residual,
      r^2 ~ 1e-3 there against ~0.3 at small t) the heads get almost no training signal.
    - ``"normalized"``: each example's squared error of head n is divided by s_n(t), an estimate of
      E[y_n^2 | t] (the loss of predicting zero at that t), so the loss is a relative error and every t
      contributes comparably to the loss (about 1 per t for a head that predicts zero). The per-example
      gradient then scales as 1 / sqrt(s_n(t)): where the targets span 1e6 over t (central heads of the
      shipped digits and patches models: E[r^4 | t]) the smallest-target t dominate every step; in the
      shipped recipes' 1200 / 800 steps the heads' mean c2 settled at 1e-3 - 3e-3 at every t, against
      0.05 - 0.35 at t = 50.
    - ``"rms"``: the squared error is divided by sqrt(s_n(t)), the target's RMS at t. Each example's gradient
      is then 2 (h - y) / RMS, its error relative to the size of its target, so every t pushes the heads
      with a comparable force (the loss itself still grows with the targets, as sqrt(s_n)): the middle
      between the uniform loss (gradients scaling with the target) and ``"normalized"``. In the same
      recipes it too left c2 far too small at small t (mean 0.006 - 0.03 at t = 50).

    For both, s_n is estimated once before the first step, from the frozen backbone on ``data`` with a
    generator of its own (seeded from ``seed``; a resumed or multi-process run computes the same table):
    means over SCALE_BUCKETS bands of t, interpolated in log, floored at SCALE_FLOOR times the largest so that
    a near-zero estimate cannot dominate the loss. The weighted losses are logged as ``wmse_e2``,
    ``wmse_e3``; the table is returned as ``TrainResult.loss_scales``. For raw heads E[eps^(2n) | t] is the
    same at every t (3, 15), so these mainly rescale the orders against each other. Their checkpoints are of
    kind ``heads-normalized`` / ``heads-rms``: a checkpoint of another weighting does not resume under them.

    ``output_scale=True`` (a ``MomentNet`` only) sets the heads' per-t output scale before the first step:
    ``net.set_output_scale`` with sqrt(s_n(t)), the targets' RMS at each t from the same estimate as above (made
    for this even with ``loss_weighting="uniform"``), so head n returns sqrt(s_n(t)) h_n(x_t, t). With
    ``"normalized"`` the loss of head n is then (h_n - y_n / sqrt(s_n(t)))^2: the network regresses a target of
    size about 1 at every t, however small y_n is there. A table the net already holds is replaced. Its
    checkpoints are of kind ``heads-<weighting>-scaled`` and resume only such a run. The default (False) leaves
    the net's table as it is (none for every model trained before this option), and training unchanged.

    Multi-process (DDP): launch with ``torchrun --nproc_per_node N``, call
    ``gk.distributed.init_from_env()`` (gloo on CPU, nccl on CUDA; put ``net`` on this rank's GPU), then
    this function on every rank with the same arguments; ``batch_size`` is the global batch and must be a
    multiple of N. Rank 0 writes ``checkpoint``; ``log`` is called on every rank with the same
    (rank-averaged) losses; every rank returns the same weights. ``gms-kernels train-heads`` does all this.
    """
    if loss_weighting not in HEAD_LOSS_WEIGHTINGS:
        raise ValueError(f"unknown loss_weighting {loss_weighting!r}; valid: {', '.join(HEAD_LOSS_WEIGHTINGS)}")
    _check_sampling(sampling)
    condition = _head_condition(net, label_key, condition_dropout, null_label)
    schedule = schedule or getattr(net, "schedule", None) or Schedule.linear()
    time_input = time_input or getattr(net, "time_input", "index")
    source = _source(data, _model_channels(net))
    if condition is not None:
        if source.tensor is not None:
            raise ValueError(f"the network is trained with labels (as {condition.key!r}) but data is a tensor without "
                             "them: pass torch.utils.data.TensorDataset(images, labels), or train_heads(..., "
                             "label_key=None) for an unconditional network")
        _labels_of(source.dataset[0])  # (refused before any work when the items have no label)
    C = source.shape[0]
    net.train()

    central = getattr(net, "targets", "raw") == "central"
    scales, power = None, _SCALE_POWERS.get(loss_weighting)
    if output_scale and not callable(getattr(net, "set_output_scale", None)):
        raise ValueError(f"output_scale=True needs a gk.models.MomentNet (it sets the heads' per-t output scale), "
                         f"not a {type(net).__name__}")
    if loss_weighting != "uniform" or output_scale:
        _check_batch_size(batch_size)  # (before the scales are estimated from data)
        estimate = _target_scales(net, source, schedule, time_input, central, batch_size, seed + 7919,
                                  None if condition is None else condition.key)
        if output_scale:
            orders = getattr(net, "orders", tuple(sorted(estimate)))
            net.set_output_scale(torch.stack([estimate[n].sqrt() for n in orders]))
        if loss_weighting != "uniform":
            scales = estimate
    weights = None if scales is None else {n: s.pow(-power) for n, s in scales.items()}  # (float64 [T], per order)
    placed: dict[tuple, torch.Tensor] = {}  # the weights moved to the loss's device and dtype once, not every step

    def weight_at(n: int, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        key = (n, like.device, like.dtype)
        if key not in placed:
            placed[key] = weights[n].to(device=like.device, dtype=like.dtype)
        return placed[key][t.to(like.device)]

    def loss_terms(wrapped, x_t, t, eps, **kwargs):
        tv = time_values(t, schedule.T, time_input)
        heads, base, orders = _head_targets(wrapped, x_t, tv, eps, C, central, **kwargs)
        terms = {}
        for n in range(2, orders + 1):
            err = (heads[:, (n - 2) * C:(n - 1) * C] - base**n).pow(2)
            if weights is None:
                terms[f"mse_e{n}"] = err.mean()
            else:
                w = weight_at(n, t, err)
                terms[f"wmse_e{n}"] = (err * w.reshape(-1, *[1] * (err.dim() - 1))).mean()
        return terms

    kind = "heads" if scales is None else f"heads-{loss_weighting}"
    if output_scale:
        kind = f"heads-{loss_weighting}-scaled"
    result = _loop(net, loss_terms, source, schedule, kind, steps=steps, batch_size=batch_size, lr=lr,
                   optimizer=optimizer, ema_decay=ema_decay, grad_clip=grad_clip, checkpoint=checkpoint,
                   checkpoint_every=checkpoint_every, seed=seed, progress=progress, log=log, sampling=sampling,
                   condition=condition)
    result.loss_scales = scales
    return result


def train_backbone(model: nn.Module, data: TrainingData, schedule: Schedule | None = None, *, steps: int = 1000,
                   batch_size: int = 128, lr: float = 2e-4, optimizer: str = "adam", ema_decay: float = 0.9999,
                   grad_clip: float = 1.0, checkpoint: str | Path | None = None, checkpoint_every: int = 500,
                   seed: int = 0, time_input: str | None = None, progress: bool = True,
                   log: Callable[[dict], None] | None = None, sampling: str = "replacement") -> TrainResult:
    """Train an eps-prediction network (its first C output channels) with the DDPM loss.

    ``data`` and ``sampling`` as for :func:`train_heads` (an image folder is read in the model's channel count,
    its ``in_channels``, or else the images' own: 1 if the first is grey, else 3).

    Runs multi-process with DDP exactly as :func:`train_heads` does (``torchrun --nproc_per_node N``, then
    ``gk.distributed.init_from_env()``; ``batch_size`` is the global batch, a multiple of N); the
    ``gms-kernels train-backbone`` command does this under torchrun.
    """
    _check_sampling(sampling)
    schedule = schedule_for(model, schedule)
    time_input = time_input or getattr(model, "time_input", "index")
    source = _source(data, _model_channels(model))
    C = source.shape[0]
    model.train()

    def loss_terms(wrapped, x_t, t, eps):
        return {"mse_e1": (wrapped(x_t, time_values(t, schedule.T, time_input))[:, :C] - eps).pow(2).mean()}

    return _loop(model, loss_terms, source, schedule, "backbone", steps=steps, batch_size=batch_size, lr=lr,
                 optimizer=optimizer, ema_decay=ema_decay, grad_clip=grad_clip, checkpoint=checkpoint,
                 checkpoint_every=checkpoint_every, seed=seed, progress=progress, log=log, sampling=sampling)
