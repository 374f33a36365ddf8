"""Training the higher-order heads (paper Alg. learning) and small backbones, resumable.

- :func:`train_heads`: backbone frozen in eval mode, targets eps^n, MSE per order (paper
  Eq. objectivehigh; ``loss_weighting`` can divide it by the targets' size at each t), EMA of the head
  weights, grad-norm clip, ADAN or Adam.
- :func:`train_backbone`: the usual eps-prediction loss, for small data sets (toy data, digits).

Both write a checkpoint every ``checkpoint_every`` steps (atomically) and resume from it with
nothing lost: batches, times and noise come from a generator whose state is checkpointed, so an
interrupted run continues exactly as the uninterrupted one would have.

Multi-process: when a torch.distributed process group is initialised (``torchrun --nproc_per_node N``,
then :func:`gms_kernels.distributed.init_from_env`), the module is wrapped in DistributedDataParallel.
``batch_size`` stays the global batch: every rank draws the same global batch (indices, times, noise)
from the shared seeded generator and trains on its own contiguous 1/N of the rows, so N processes follow
the one-process run up to the order of float reductions. Rank 0 alone writes checkpoints and shows the
progress bar; every rank resumes from the same checkpoint file; logged losses are averaged over ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel

from . import distributed
from .files import save_atomically
from .model_io import time_values
from .optim import Adan
from .progress import progress_bar
from .schedule import Schedule, schedule_for

CHECKPOINT_FORMAT = "gms_kernels.train/1"
OPTIMIZERS = ("adan", "adam")
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


def _noised(schedule: Schedule, x0: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps, per example (t: one index per row of x0)."""
    abar = schedule.alphas_cumprod[t].to(device=x0.device, dtype=x0.dtype).reshape(-1, *[1] * (x0.dim() - 1))
    return abar.sqrt() * x0 + (1 - abar).sqrt() * eps


def _check_data_and_batch(data: torch.Tensor, batch_size: int) -> None:
    if not torch.is_tensor(data) or data.dim() < 2 or data.shape[0] < 1:
        raise ValueError("data must be a tensor [N, C, ...] of training examples in the model's data range")
    if not torch.isfinite(data).all():
        raise ValueError("training data has non-finite values")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")


def _loop(module: nn.Module, loss_terms: Callable, data: torch.Tensor, schedule: Schedule, kind: str, *,
          steps: int, batch_size: int, lr: float, optimizer: str, ema_decay: float, grad_clip: float,
          checkpoint: str | Path | None, checkpoint_every: int, seed: int, progress: bool,
          log: Callable[[dict], None] | None) -> TrainResult:
    """``loss_terms(model, x_t, t, eps)`` -> {name: scalar loss}; ``model`` is the module or its DDP wrapper."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    _check_data_and_batch(data, batch_size)
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
        gen.set_state(state["rng"])
        result = TrainResult(state["step"], state["history"])
    if world > 1:
        _same_on_all_ranks(result.steps, device, path)

    def save() -> None:
        if path is not None and rank == 0:
            save_atomically({"format": CHECKPOINT_FORMAT, "kind": kind, "step": result.steps,
                              "trainable": {k: p.detach().clone() for k, p in params.items()},
                              "optimizer": opt.state_dict(), "ema": ema.state_dict(), "rng": gen.get_state(),
                              "history": result.history}, path)

    local = batch_size // world
    mine = slice(rank * local, (rank + 1) * local)  # this rank's rows of the global batch
    bar = progress_bar(total=steps, initial=result.steps, desc=f"train {kind}", enabled=progress and rank == 0)
    try:
        while result.steps < steps:
            # the global batch is drawn on every rank (same generator, same state), each keeps its rows
            # (on the generator's device, the CPU, whatever torch's default device is)
            idx = torch.randint(0, data.shape[0], (batch_size,), generator=gen, device=gen.device)[mine]
            t = torch.randint(0, schedule.T, (batch_size,), generator=gen, device=gen.device)[mine]
            eps = torch.randn((batch_size, *data.shape[1:]), generator=gen, device=gen.device)[mine].to(device)
            losses = loss_terms(model, _noised(schedule, data[idx].to(device), t, eps), t.to(device), eps)
            total = sum(losses.values())
            opt.zero_grad(set_to_none=True)
            total.backward()  # under DDP the gradients come back averaged over the ranks
            torch.nn.utils.clip_grad_norm_(list(params.values()), grad_clip)
            opt.step()
            ema.update(params)
            result.steps += 1
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


def _load_checkpoint(path: Path, kind: str) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated or foreign file
        raise ValueError(f"cannot read training checkpoint {path}: {exc}. Delete it to start over.") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT or state.get("kind") != kind:
        raise ValueError(f"{path} is not a gms_kernels {kind} training checkpoint; delete it or pass another path")
    return state


def _head_targets(net: nn.Module, x_t: torch.Tensor, tv: torch.Tensor, eps: torch.Tensor, C: int,
                  central: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(the heads' outputs [B, (orders - 1) * C, ...], the base whose powers they fit, the number of orders)."""
    out = net(x_t, tv, head_outputs=True) if central else net(x_t, tv)
    orders = out.shape[1] // C
    if orders < 2:
        raise ValueError(f"train_heads needs a network with higher-order heads; it returned {out.shape[1]} "
                         f"channels for {C}-channel data")
    # raw heads fit eps^n; central heads fit r^n, r = eps - e1 (the frozen backbone's residual)
    base = eps - out[:, :C].detach() if central else eps
    return out[:, C:], base, orders


@torch.no_grad()
def _target_scales(net: nn.Module, data: torch.Tensor, schedule: Schedule, time_input: str, central: bool,
                   batch_size: int, seed: int) -> dict[int, torch.Tensor]:
    """{n: s_n(t), float64 [T]}: an estimate of E[(y_n)^2 | t], y_n the target of head n (eps^n, or r^n for
    central heads), from the frozen backbone on the training data, with a generator of its own (so the
    training draws are untouched, and every process of a multi-process run computes the same table).

    The mean of y_n^2 over examples, noise and elements is taken in SCALE_BUCKETS equal bands of t; log s is
    interpolated linearly between the band centres (held flat beyond the first and last). Each s_n is then
    floored at SCALE_FLOOR times its largest value, so no t gets more than 1 / SCALE_FLOOR times the weight
    of the t with the largest targets, and a target that is zero to float precision cannot blow up the loss.
    (The band means are heavy-tailed where the targets are small: on the shipped digits and patches models,
    two seeds of this estimate differ in single bands at t >= 700 by up to 3x for r^4 and 20x for r^6, where a
    few large residuals dominate a band. The weights are right there in order of magnitude only, against the
    5-9 orders by which the uniform loss underweights those t.)
    """
    T, C = schedule.T, data.shape[1]
    device = next(p.device for p in net.parameters())
    per_row = max(1, data[0].numel())
    rows = min(SCALE_MAX_ROWS, max(SCALE_MIN_ROWS, -(-SCALE_VALUES // per_row)))
    edges = torch.linspace(0, T, SCALE_BUCKETS + 1).round().long()
    gen = torch.Generator().manual_seed(seed)
    sums: dict[int, list[float]] = {}
    for b in range(SCALE_BUCKETS):
        lo, hi = int(edges[b]), max(int(edges[b + 1]), int(edges[b]) + 1)
        acc: dict[int, float] = {}
        for start in range(0, rows, batch_size):
            m = min(batch_size, rows - start)
            idx = torch.randint(0, data.shape[0], (m,), generator=gen)
            t = torch.randint(lo, hi, (m,), generator=gen)
            eps = torch.randn((m, *data.shape[1:]), generator=gen).to(device)
            x_t = _noised(schedule, data[idx].to(device), t, eps)
            _, base, orders = _head_targets(net, x_t, time_values(t, T, time_input).to(device), eps, C, central)
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


def train_heads(net: nn.Module, data: torch.Tensor, schedule: Schedule | None = None, *, steps: int = 1000,
                batch_size: int = 128, lr: float = 2e-4, optimizer: str = "adan", ema_decay: float = 0.9999,
                grad_clip: float = 1.0, checkpoint: str | Path | None = None, checkpoint_every: int = 500,
                seed: int = 0, time_input: str | None = None, progress: bool = True,
                log: Callable[[dict], None] | None = None, loss_weighting: str = "uniform",
                output_scale: bool = False) -> TrainResult:
    """Paper Alg. learning: fit the heads e^n (n >= 2) of a ``MomentNet`` to eps^n with MSE (to (eps - e1)^n
    for a MomentNet with ``targets="central"``).

    ``net(x_t, t)`` returns [e1, e2, ...] along dim 1; only its trainable parameters (the heads) learn.
    The backbone stays frozen in eval mode. Losses are logged per order as ``mse_e2``, ``mse_e3``.
    On return ``net`` holds the EMA weights.

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
      0.05 - 0.35 at t = 50 (python/results/quality.md, section 5f).
    - ``"rms"``: the squared error is divided by sqrt(s_n(t)), the target's RMS at t. Each example's gradient
      is then 2 (h - y) / RMS, its error relative to the size of its target, so every t pushes the heads
      with a comparable force (the loss itself still grows with the targets, as sqrt(s_n)): the middle
      between the uniform loss (gradients scaling with the target) and ``"normalized"``. In the same
      recipes it too left c2 far too small at small t (mean 0.006 - 0.03 at t = 50; section 5f).

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
    schedule = schedule or getattr(net, "schedule", None) or Schedule.linear()
    time_input = time_input or getattr(net, "time_input", "index")
    C = data.shape[1]
    net.train()

    central = getattr(net, "targets", "raw") == "central"
    scales, power = None, _SCALE_POWERS.get(loss_weighting)
    if output_scale and not callable(getattr(net, "set_output_scale", None)):
        raise ValueError(f"output_scale=True needs a gk.models.MomentNet (it sets the heads' per-t output scale), "
                         f"not a {type(net).__name__}")
    if loss_weighting != "uniform" or output_scale:
        _check_data_and_batch(data, batch_size)  # (before the scales are estimated from data)
        estimate = _target_scales(net, data, schedule, time_input, central, batch_size, seed + 7919)
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

    def loss_terms(wrapped, x_t, t, eps):
        tv = time_values(t, schedule.T, time_input)
        heads, base, orders = _head_targets(wrapped, x_t, tv, eps, C, central)
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
    result = _loop(net, loss_terms, data, schedule, kind, steps=steps, batch_size=batch_size, lr=lr,
                   optimizer=optimizer, ema_decay=ema_decay, grad_clip=grad_clip, checkpoint=checkpoint,
                   checkpoint_every=checkpoint_every, seed=seed, progress=progress, log=log)
    result.loss_scales = scales
    return result


def train_backbone(model: nn.Module, data: torch.Tensor, schedule: Schedule | None = None, *, steps: int = 1000,
                   batch_size: int = 128, lr: float = 2e-4, optimizer: str = "adam", ema_decay: float = 0.9999,
                   grad_clip: float = 1.0, checkpoint: str | Path | None = None, checkpoint_every: int = 500,
                   seed: int = 0, time_input: str | None = None, progress: bool = True,
                   log: Callable[[dict], None] | None = None) -> TrainResult:
    """Train an eps-prediction network (its first C output channels) with the DDPM loss.

    Runs multi-process with DDP exactly as :func:`train_heads` does (``torchrun --nproc_per_node N``, then
    ``gk.distributed.init_from_env()``; ``batch_size`` is the global batch, a multiple of N); the
    ``gms-kernels train-backbone`` command does this under torchrun.
    """
    schedule = schedule_for(model, schedule)
    time_input = time_input or getattr(model, "time_input", "index")
    C = data.shape[1]
    model.train()

    def loss_terms(wrapped, x_t, t, eps):
        return {"mse_e1": (wrapped(x_t, time_values(t, schedule.T, time_input))[:, :C] - eps).pow(2).mean()}

    return _loop(model, loss_terms, data, schedule, "backbone", steps=steps, batch_size=batch_size, lr=lr,
                 optimizer=optimizer, ema_decay=ema_decay, grad_clip=grad_clip, checkpoint=checkpoint,
                 checkpoint_every=checkpoint_every, seed=seed, progress=progress, log=log)
