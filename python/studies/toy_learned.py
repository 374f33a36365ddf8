"""Toy data with LEARNED heads: small MLP noise networks trained on CPU, measured next to the oracle.

The oracle job (``gms-kernels oracle``) removes every network error by using exact heads. Here the
same two data sets are learned the paper's way (two stages): an eps-network first
(:func:`gms_kernels.train.training.train_backbone`), then, with that network frozen, small heads for
E[eps^2 | x_t] and E[eps^3 | x_t] on its last hidden features (:func:`gms_kernels.train.training.train_heads`).
Every solver then runs twice with the same seed, once on the learned heads and once on the exact
ones, so the difference between the two rows is the heads' error alone.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gms_kernels.core.devices import machine_note
from gms_kernels.core.files import save_atomically
from gms_kernels.core.images import save_figure
from gms_kernels.eval.oracle import GaussianMixtureOracle
from gms_kernels.sampling import sample
from gms_kernels.core.schedule import Schedule
from gms_kernels.train.training import train_backbone, train_heads
from gms_kernels.eval import oracle_job as job

DEFAULT_STEPS = (5, 10, 20, 40)  # the K of paper Tab. toyresult
PLOT_K = 10
# where the heads are compared with the oracle's; 24 and 49 are the last steps before data at K = 40, 20
HEAD_TIMES = (0, 24, 49, 99, 199, 399, 599, 799, 999)
CACHE_FORMAT = "gms_kernels.toy_learned/1"
# the solver rows, by their labels in the oracle study's grid (same options); per-pixel selection
# only differs from per-sample selection in more than one dimension
LABELS = {"1d": ("ddpm", "sn-ddpm", "gms-adan-25", "gms-closed"),
          "8gauss": ("ddpm", "sn-ddpm", "gms-adan-25", "gms-closed", "gms-closed-pixel")}
GRID = {label: (solver, options) for label, solver, options in job.SOLVER_ROWS}
TABLE_METRICS = {"kde": job.METRICS["kde"], "w1": job.METRICS["w1"]}
FAR = 2.0  # a sample with a coordinate beyond +-FAR is far from both data sets (they lie within +-1)
E23 = ("sn-ddpm", "gms-adan-25", "gms-closed", "gms-closed-pixel")  # the solvers that read e2 (and e3)


@dataclass(frozen=True)
class ToyConfig:
    """Network sizes and the two training stages (the same for both data sets)."""

    hidden: int = 128  # width of the backbone's residual MLP
    blocks: int = 3  # residual blocks, two linear layers each
    emb_dim: int = 64  # sinusoidal time features before the embedding MLP
    head_hidden: int = 128  # width of each head's MLP
    n_train: int = 100_000  # training points drawn from the oracle
    backbone_steps: int = 5000
    heads_steps: int = 4000
    batch_size: int = 1024
    lr: float = 1e-3
    heads_lr: float = 1e-3
    optimizer: str = "adam"
    ema_decay: float = 0.999
    seed: int = 0


# -- networks --------------------------------------------------------------------------------------

def sinusoidal_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[N, dim] sin/cos features of the time index t (geometric frequencies 1 .. 1/10000)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    angles = t.to(torch.float32).reshape(-1, 1) * freqs
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class _ResBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.lin1 = nn.Linear(hidden, hidden)
        self.time = nn.Linear(hidden, hidden)
        self.lin2 = nn.Linear(hidden, hidden)

    def forward(self, h: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        r = self.lin1(F.silu(h)) + self.time(F.silu(temb))
        return h + self.lin2(F.silu(r))


class ToyEpsNet(nn.Module):
    """eps-prediction MLP for vector data [N, D] with integer time indices (``time_input="index"``).

    ``forward_features(x, t)`` returns (h, temb, eps): the last hidden features, the time embedding
    and the output, so heads can share the single pass.
    """

    time_input = "index"

    def __init__(self, dim: int, hidden: int = 256, blocks: int = 3, emb_dim: int = 64,
                 schedule: Schedule | None = None):
        super().__init__()
        self.dim, self.emb_dim = dim, emb_dim
        self.embed = nn.Sequential(nn.Linear(emb_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.inp = nn.Linear(dim, hidden)
        self.blocks = nn.ModuleList(_ResBlock(hidden) for _ in range(blocks))
        self.out = nn.Linear(hidden, dim)
        self.schedule = schedule

    def forward_features(self, x: torch.Tensor, t: torch.Tensor | int):
        t = torch.as_tensor(t, device=x.device).reshape(-1).expand(x.shape[0])
        temb = self.embed(sinusoidal_embedding(t, self.emb_dim))
        h = self.inp(x.to(self.out.weight.dtype))
        for block in self.blocks:
            h = block(h, temb)
        h = F.silu(h)
        return h, temb, self.out(h)

    def forward(self, x: torch.Tensor, t: torch.Tensor | int) -> torch.Tensor:
        return self.forward_features(x, t)[2].to(x.dtype)


class ToyMomentNet(nn.Module):
    """A frozen :class:`ToyEpsNet` plus MLP heads for E[eps^2] and E[eps^3]; returns cat([e1, e2, e3], 1).

    Each head reads the backbone's last hidden features and its time embedding, and outputs its moment
    directly (the paper's heads). Its last layer starts at zero, with bias 1 for e2 (E[eps^2] = 1 far
    from the data), so training starts from N(0, 1) noise.
    """

    time_input = "index"

    def __init__(self, backbone: ToyEpsNet, head_hidden: int = 128):
        super().__init__()
        backbone.requires_grad_(False)
        backbone.eval()
        self.backbone = backbone
        width = backbone.out.in_features
        self.heads = nn.ModuleDict()
        for n in ("2", "3"):
            head = nn.Sequential(nn.Linear(2 * width, head_hidden), nn.SiLU(), nn.Linear(head_hidden, head_hidden),
                                 nn.SiLU(), nn.Linear(head_hidden, backbone.dim))
            nn.init.zeros_(head[-1].weight)
            nn.init.constant_(head[-1].bias, 1.0 if n == "2" else 0.0)
            self.heads[n] = head

    @property
    def schedule(self) -> Schedule | None:
        return self.backbone.schedule

    def train(self, mode: bool = True) -> "ToyMomentNet":
        super().train(mode)
        self.backbone.eval()
        return self

    def forward(self, x: torch.Tensor, t: torch.Tensor | int) -> torch.Tensor:
        with torch.no_grad():
            h, temb, e1 = self.backbone.forward_features(x, t)
        z = torch.cat([h, F.silu(temb)], dim=1)
        return torch.cat([e1, self.heads["2"](z), self.heads["3"](z)], dim=1).to(x.dtype)


# -- training (cached) -----------------------------------------------------------------------------

@dataclass
class Trained:
    net: ToyMomentNet
    info: dict  # seconds and final losses of both stages, and whether the net came from the cache


def _tail_mean(history: list[dict], key: str, n: int = 200) -> float:
    vals = [r[key] for r in history[-n:] if key in r]
    return sum(vals) / max(len(vals), 1)


def build_backbone(dim: int, cfg: ToyConfig, schedule: Schedule) -> ToyEpsNet:
    """A freshly initialised eps-network (seeded, without touching the global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return ToyEpsNet(dim, cfg.hidden, cfg.blocks, cfg.emb_dim, schedule)


def add_heads(backbone: ToyEpsNet, cfg: ToyConfig) -> ToyMomentNet:
    """Freeze ``backbone`` and put freshly initialised heads on it (seeded)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 10)
        return ToyMomentNet(backbone, cfg.head_hidden)


def train_toy(name: str, cfg: ToyConfig, schedule: Schedule | None = None, cache_dir: str | Path | None = None,
              skip_training: bool = False, progress: bool = True, log=print) -> Trained:
    """Stage 1 (backbone, eps MSE) then stage 2 (heads, eps^2 / eps^3 MSE) on data set ``name``.

    With ``cache_dir`` the trained net is saved as ``{cache_dir}/{name}.pt`` and loaded from there when its
    config matches; ``skip_training`` requires the cached net (no training).
    """
    schedule = schedule or Schedule.linear(1000)
    oracle = job.DATASETS[name][1](schedule)
    dim = oracle.data_shape[0]
    backbone = build_backbone(dim, cfg, schedule)
    path = Path(cache_dir) / f"{name}.pt" if cache_dir is not None else None
    if path is not None and path.exists():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if saved.get("format") == CACHE_FORMAT and saved.get("config") == asdict(cfg):
            net = add_heads(backbone, cfg)
            net.load_state_dict(saved["state_dict"])
            log(f"{name}: loaded the trained net from {path}")
            return Trained(net.eval(), {**saved["info"], "cached": True})
        if skip_training:
            raise ValueError(f"{path} was trained with another configuration; rerun without --skip-training")
    elif skip_training:
        raise FileNotFoundError(f"no trained net at {path}; rerun without --skip-training")

    data = oracle.sample_data(cfg.n_train, torch.Generator().manual_seed(cfg.seed + 1)).float()
    common = dict(batch_size=cfg.batch_size, optimizer=cfg.optimizer, ema_decay=cfg.ema_decay,
                  progress=progress, checkpoint=None)
    t0 = time.perf_counter()
    hist1 = train_backbone(backbone, data, schedule, steps=cfg.backbone_steps, lr=cfg.lr,
                           seed=cfg.seed + 2, **common).history
    net = add_heads(backbone, cfg)
    t1 = time.perf_counter()
    hist2 = train_heads(net, data, schedule, steps=cfg.heads_steps, lr=cfg.heads_lr, seed=cfg.seed + 3,
                        **common).history
    t2 = time.perf_counter()
    net.eval()
    info = {"backbone_seconds": t1 - t0, "heads_seconds": t2 - t1,
            "loss_e1": _tail_mean(hist1, "mse_e1"), "loss_e2": _tail_mean(hist2, "mse_e2"),
            "loss_e3": _tail_mean(hist2, "mse_e3"),
            "params_backbone": sum(p.numel() for p in net.backbone.parameters()),
            "params_heads": sum(p.numel() for p in net.heads.parameters())}
    log(f"{name}: trained backbone in {info['backbone_seconds']:.0f}s (mse_e1 {info['loss_e1']:.4f}), heads in "
        f"{info['heads_seconds']:.0f}s (mse_e2 {info['loss_e2']:.4f}, mse_e3 {info['loss_e3']:.4f})")
    if path is not None:
        save_atomically({"format": CACHE_FORMAT, "config": asdict(cfg), "info": info,
                         "state_dict": {k: v.detach().clone() for k, v in net.state_dict().items()}}, path)
    return Trained(net, {**info, "cached": False})


# -- evaluation ------------------------------------------------------------------------------------

@torch.no_grad()
def heads_error(net: nn.Module, oracle: GaussianMixtureOracle, times: Sequence[int] = HEAD_TIMES, n: int = 20000,
                seed: int = 0) -> dict[int, dict[str, list[float]]]:
    """RMSE of the learned [e1, e2, e3] against the oracle's on x_t ~ q(x_t), and the oracle heads' std.

    Returns {t: {"rmse": [e1, e2, e3], "std": [e1, e2, e3]}}; the std (over x_t) is the scale of each head.
    """
    g = torch.Generator().manual_seed(seed + 777)
    x0 = oracle.sample_data(n, g)
    out = {}
    for t in times:
        x_t = oracle.schedule.add_noise(x0, torch.randn(x0.shape, generator=g, dtype=x0.dtype), t)
        tt = torch.full((n,), t, dtype=torch.long)
        learned = net(x_t.float(), tt).double().chunk(3, dim=1)
        exact = oracle(x_t, tt).chunk(3, dim=1)
        out[t] = {"rmse": [float((a - b).pow(2).mean().sqrt()) for a, b in zip(learned, exact)],
                  "std": [float(b.std()) for b in exact]}
    return out


@dataclass
class ToyResult:
    config: ToyConfig
    n_samples: int
    steps: tuple[int, ...]
    seeds: tuple[int, ...] = (0,)  # sampling seeds (the networks are trained once, with config.seed)
    training: dict = field(default_factory=dict)  # name -> Trained.info
    # scores[name][(label, heads)][K] = {"kde":..., "w1":..., "seconds":...} (means over the seeds; "max_abs" the
    # max and "n_far" the sum) with "per_seed": {metric: [one per seed]}; heads "learned" | "oracle" | "-"
    scores: dict = field(default_factory=dict)
    heads: dict = field(default_factory=dict)  # name -> heads_error(...)
    samples: dict = field(default_factory=dict)  # (name, label, heads) -> samples at K = PLOT_K
    eval_seconds: float = 0.0


def evaluate(name: str, net: nn.Module, res: ToyResult, seed: int | None = None, progress: bool = True,
             log=print) -> None:
    """Every solver of LABELS[name] on learned and on exact heads, plus the exact sampler, once per seed of
    ``res.seeds`` (or ``seed`` alone): the sampler's seed and the fresh data's; fills ``res``."""
    schedule = net.schedule
    oracle = job.DATASETS[name][1](schedule)
    shape = (res.n_samples, *oracle.data_shape)
    seeds = res.seeds if seed is None else (seed,)
    rows = [("exact", "-", oracle)] + [(lab, h, m) for lab in LABELS[name]
                                       for h, m in (("learned", net), ("oracle", oracle))]
    runs: dict = {}
    for sd in seeds:
        fresh = job.fresh_data(oracle, res.n_samples, sd)
        for label, heads, model in rows:
            solver, options = GRID[label]
            if solver == "exact":
                options = {**options, "oracle": oracle}
            for K in res.steps:
                t0 = time.perf_counter()
                x = sample(model, shape=shape, steps=K, solver=solver, schedule=schedule, generator=sd,
                           progress=False, data_range=None, dtype=torch.float64, backend="torch", **options)
                seconds = time.perf_counter() - t0
                far = x.abs().amax(dim=1)
                row = {**job.score_samples(x, fresh, TABLE_METRICS), "seconds": seconds,
                       "max_abs": float(far.max()), "n_far": int((far > FAR).sum())}
                runs.setdefault((label, heads, K), []).append(row)
                if K == PLOT_K and sd == seeds[0]:
                    res.samples[(name, label, heads)] = x
                if progress:
                    log(f"  {name:6s} seed {sd} {label:17s} {heads:7s} K={K:3d}  KDE={row['kde']:.4f}  "
                        f"W1={row['w1']:.4f}  ({seconds:.1f}s)")
        if PLOT_K in res.steps and sd == seeds[0]:
            res.samples[(name, "data", "-")] = fresh
    table = res.scores.setdefault(name, {})
    for label, heads, _ in rows:
        for K in res.steps:
            row = job.mean_row(runs[(label, heads, K)])
            row["max_abs"] = max(row["per_seed"]["max_abs"])
            row["n_far"] = int(sum(row["per_seed"]["n_far"]))
            table.setdefault((label, heads), {})[K] = row


def run(cfg: ToyConfig = ToyConfig(), steps: Sequence[int] = DEFAULT_STEPS, n_samples: int = 20000,
        datasets: Sequence[str] = tuple(job.DATASETS), cache_dir: str | Path | None = None,
        skip_training: bool = False, head_points: int = 20000, progress: bool = True, log=print,
        seeds: Sequence[int] | None = None) -> ToyResult:
    """Train (or load) each data set's nets, check the heads, and sample every row once per sampling seed
    (``seeds``; default: the training seed alone)."""
    schedule = Schedule.linear(1000)
    res = ToyResult(cfg, n_samples, tuple(steps), tuple(seeds) if seeds is not None else (cfg.seed,))
    for name in datasets:
        trained = train_toy(name, cfg, schedule, cache_dir, skip_training, progress, log)
        res.training[name] = trained.info
        t0 = time.perf_counter()
        oracle = job.DATASETS[name][1](schedule)
        res.heads[name] = heads_error(trained.net, oracle, n=head_points, seed=cfg.seed)
        evaluate(name, trained.net, res, progress=progress, log=log)
        res.eval_seconds += time.perf_counter() - t0
    return res


# -- report ----------------------------------------------------------------------------------------

def _gms_label(name: str) -> str:
    """The GMS row the findings and the figure use: per-pixel selection where it is a distinct variant."""
    return "gms-closed-pixel" if "gms-closed-pixel" in LABELS[name] else "gms-closed"


def _ks(res: ToyResult, name: str, metric: str, a: tuple[str, str], b: tuple[str, str]) -> list[int]:
    """The K at which row a is better than row b."""
    t = res.scores[name]
    sign = 1 if metric == "kde" else -1
    return [K for K in res.steps if sign * (t[a][K][metric] - t[b][K][metric]) > 0]


def findings(res: ToyResult) -> list[str]:
    """Statements computed from the numbers, so they stay true when the script is rerun."""
    out = []
    for name, t in res.scores.items():
        tag = job.DATASETS[name][0].split(" ")[0]
        gms = _gms_label(name)
        for heads in ("learned", "oracle"):
            ks = _ks(res, name, "kde", (gms, heads), ("sn-ddpm", heads))
            diffs = ", ".join(f"K={K}: {t[(gms, heads)][K]['kde'] - t[('sn-ddpm', heads)][K]['kde']:+.3f}"
                              for K in res.steps)
            out.append(f"{tag} {heads} heads: {gms} has a higher KDE log-likelihood than sn-ddpm at K = "
                       f"{ks or 'none'} ({diffs}).")
        ks = _ks(res, name, "w1", (gms, "learned"), ("sn-ddpm", "learned"))
        out.append(f"{tag} learned heads: {gms} has a lower W1 than sn-ddpm at K = {ks or 'none'}.")
        adan = {h: max(abs(t[("gms-adan-25", h)][K]["kde"] - t[("sn-ddpm", h)][K]["kde"]) for K in res.steps)
                for h in ("learned", "oracle")}
        out.append(f"{tag}: gms-adan-25 stays within {adan['learned']:.3f} nats of sn-ddpm's KDE with learned heads "
                   f"and within {adan['oracle']:.3f} with exact heads: started at the Gaussian, 25 ADAN iterations "
                   "move the components little.")
        for K in res.steps:
            best = _best(t, "kde", K)
            out.append(f"{tag} K={K}: best learned-heads KDE {best[0]} {t[best][K]['kde']:.4f}; best with exact "
                       f"heads {_best(t, 'kde', K, 'oracle')[0]}; exact sampler {t[('exact', '-')][K]['kde']:.4f}.")
        far = {h: {K: sum(t[(lab, h)][K]["n_far"] for lab in LABELS[name]) for K in res.steps}
               for h in ("learned", "oracle")}
        out.append(f"{tag}: samples with a coordinate beyond +-{FAR:g} (summed over the {len(LABELS[name])} solvers, "
                   f"of {res.n_samples} x {len(res.seeds)} seeds each), learned / exact heads: "
                   + ", ".join(f"K={K}: {far['learned'][K]} / {far['oracle'][K]}" for K in res.steps) + ".")
        gaps = {lab: [t[(lab, "oracle")][K]["kde"] - t[(lab, "learned")][K]["kde"] for K in res.steps]
                for lab in LABELS[name]}
        out.append(f"{tag}: KDE lost by learning the heads (oracle minus learned, K = "
                   f"{', '.join(map(str, res.steps))}): "
                   + "; ".join(f"{lab} " + " ".join(f"{g:+.3f}" for g in v) for lab, v in gaps.items()) + ".")
    return out


def reading(res: ToyResult) -> list[str]:
    """A few sentences on what the learned heads change, with their numbers computed from the tables."""
    out = []
    for name, t in res.scores.items():
        tag = job.DATASETS[name][0].split(" ")[0]
        gms = _gms_label(name)
        e23 = [lab for lab in E23 if lab in LABELS[name]]
        gap = {K: max(t[(lab, "oracle")][K]["kde"] - t[(lab, "learned")][K]["kde"] for lab in e23) for K in res.steps}
        worst = max(gap, key=gap.get)
        margin = {h: [t[(gms, h)][K]["kde"] - t[("sn-ddpm", h)][K]["kde"] for K in res.steps]
                  for h in ("learned", "oracle")}
        wins = _ks(res, name, "kde", (gms, "learned"), ("sn-ddpm", "learned"))
        loses = [K for K in res.steps if K not in wins]
        # e2 and e3 at t = 0 feed no step (the step into data uses e1 only), so look at t > 0
        heads = {tt: r for tt, r in res.heads.get(name, {}).items() if tt > 0}
        err = ""
        if heads:
            tw = max(heads, key=lambda tt: heads[tt]["rmse"][1] / heads[tt]["std"][1])
            err = (f" Relative to its spread over x_t the learned e2 is worst at t={tw} (RMSE "
                   f"{heads[tw]['rmse'][1]:.3f} against a spread of {heads[tw]['std'][1]:.3f}).")
        out.append(
            f"{tag}: learning the heads costs the solvers that read e2/e3 at most {gap[worst]:.3f} nats of KDE "
            f"(at K={worst}).{err} With learned heads {gms} "
            + ("beats sn-ddpm at every K" if not loses else f"beats sn-ddpm at K = {wins or 'none'} and loses at "
               f"K = {loses}")
            + f"; its mean margin over K is {sum(margin['learned']) / len(res.steps):+.3f} nats against "
            f"{sum(margin['oracle']) / len(res.steps):+.3f} with exact heads.")
        far = {h: {K: sum(t[(lab, h)][K]["n_far"] for lab in LABELS[name]) for K in res.steps}
               for h in ("learned", "oracle")}
        extra = [K for K in res.steps if far["learned"][K] > far["oracle"][K]]
        if extra:
            top = max(t[(lab, "learned")][K]["max_abs"] for lab in LABELS[name] for K in extra)
            out.append(f"{tag}: with learned heads a few samples land far from the data (coordinates beyond "
                       f"+-{FAR:g}: " + ", ".join(f"{far['learned'][K]} at K={K}" for K in extra)
                       + f" over all solvers, up to |x| = {top:.0f}; with exact heads "
                       + ", ".join(str(far["oracle"][K]) for K in extra)
                       + "). Nothing clamps them (`data_range=None`); they weigh on W1 more than on the KDE.")
        ddpm_best = [K for K in res.steps if _best(t, "kde", K)[0] == "ddpm"]
        if ddpm_best:
            out.append(f"{tag}: ddpm, which reads e1 only, has the best learned-heads KDE at K = {ddpm_best} (with "
                       f"exact heads at K = {[K for K in res.steps if _best(t, 'kde', K, 'oracle')[0] == 'ddpm']}).")
    return out


def _best(table: dict, metric: str, K: int, heads: str = "learned") -> tuple[str, str]:
    rows = {key: r[K][metric] for key, r in table.items() if key[1] == heads}
    return (max if metric == "kde" else min)(rows, key=rows.get)


BASELINES = ("ddpm", "sn-ddpm")  # the rows the significance marks compare against (with the same heads)


def score_table(res: ToyResult, name: str, metric: str) -> str:
    """Rows as mean ± 95% interval over the seeds, each with its paired difference to the best baseline with
    the same heads (learned or oracle; the exact sampler against the oracle-heads one), * = significant."""
    table = res.scores[name]
    lines = ["| solver | heads | " + " | ".join(f"K={K}" for K in res.steps) + " |",
             "|---|---|" + "---|" * len(res.steps)]
    best = {K: _best(table, metric, K) for K in res.steps}
    summary = {}
    for heads in ("learned", "oracle"):
        keys = [key for key in table if key[1] == heads or (heads == "oracle" and key[1] == "-")]
        for K in res.steps:
            got = job.seed_summary({key: table[key][K]["per_seed"][metric] for key in keys},
                                     [key for key in keys if key[0] in BASELINES], higher_is_better=metric == "kde")
            summary.update({(key, K): entry for key, entry in got.items()})
    for key, row in table.items():
        cells = [job.interval_cell(summary[(key, K)]) for K in res.steps]
        cells = [f"**{c}**" if key == best[K] else c for c, K in zip(cells, res.steps)]
        label = "exact sampler (ceiling)" if key[0] == "exact" else key[0]
        lines.append(f"| {label} | {key[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def heads_table(res: ToyResult, name: str) -> str:
    lines = ["| t | RMSE e1 | RMSE e2 | RMSE e3 | oracle std e1 | oracle std e2 | oracle std e3 |",
             "|---|---|---|---|---|---|---|"]
    for t, r in res.heads[name].items():
        lines.append(f"| {t} | " + " | ".join(f"{v:.4f}" for v in r["rmse"] + r["std"]) + " |")
    return "\n".join(lines)


def report(res: ToyResult, command: str, total_seconds: float | None = None) -> str:
    cfg = res.config
    train_rows = []
    for name, info in res.training.items():
        cached = " (loaded from the cache; time of the original training)" if info.get("cached") else ""
        train_rows.append(f"| {name} | {info['params_backbone']:,} | {info['params_heads']:,} | "
                          f"{info['backbone_seconds']:.0f} s | {info['heads_seconds']:.0f} s{cached} | "
                          f"{info['loss_e1']:.4f} | {info['loss_e2']:.4f} | {info['loss_e3']:.4f} |")
    train_total = sum(i["backbone_seconds"] + i["heads_seconds"] for i in res.training.values())
    parts = [
        "# Toy data with learned MLP heads (CPU-trained), next to the oracle heads\n",
        f"Command: `{command}`\n",
        f"Machine: {machine_note()}.\n",
        "Data sets and evaluation as in the oracle study (`python/results/oracle.md`): linear schedule T=1000, "
        f"even trajectory, {res.n_samples} samples per run, `data_range=None` (no clamps), fp64 sampling with the "
        f"torch backend, sampling seeds {', '.join(map(str, res.seeds))} (each also seeds the fresh data the samples "
        "are scored against; the networks are trained once). "
        + (f"Every cell is the mean over the {len(res.seeds)} seeds ± the half-width of its 95% Student-t interval "
           "(`gk.metrics.seed_interval`); in brackets the paired per-seed difference to the best baseline "
           f"({' or '.join(BASELINES)}, best mean) with the same heads (`gk.metrics.paired_difference`), `*` where "
           "its 95% interval excludes 0; the exact sampler is compared with the best oracle-heads baseline. "
           if len(res.seeds) > 1 else "One seed: no intervals. ")
        + "The GMS rows are labelled by their options: they fit and sample a mixture at every step "
        "(`gaussian_last_step=False`, paper Alg. sampling); `gms-closed` = fit closed, select sample; "
        "`gms-closed-pixel` = fit closed, select pixel; `gms-adan-25` = fit adan, 25 iterations. Each solver runs "
        "with the "
        "LEARNED heads and, with the same seed and so the same random numbers, with the ORACLE (exact) heads: the "
        "difference between the two rows is the heads' error alone. `gms-closed-pixel` (component chosen per "
        "coordinate) is listed for 8-Gaussians only: in 1-D it is the same sampler as `gms-closed`. "
        "Best learned-heads value per column in bold.\n",
        "## Training\n",
        f"Two stages per data set, as in the paper: (1) an eps-network, a residual MLP ({cfg.blocks} blocks of two "
        f"{cfg.hidden}-wide linear layers, SiLU, sinusoidal time features ({cfg.emb_dim}) through a 2-layer "
        "embedding MLP added in every block), trained with `gk.train_backbone` (eps MSE); (2) that network frozen, "
        f"heads for E[eps^2|x_t] and E[eps^3|x_t], each an MLP (2 hidden layers of {cfg.head_hidden}, SiLU) on the "
        "backbone's last hidden features and time embedding, trained with `gk.train_heads` (MSE to eps^2, eps^3). "
        f"{cfg.n_train:,} training points drawn from the oracle (seed {cfg.seed + 1}), uniform t, batch "
        f"{cfg.batch_size}, {cfg.optimizer} lr {cfg.lr:g} / {cfg.heads_lr:g}, EMA {cfg.ema_decay}, "
        f"{cfg.backbone_steps} + {cfg.heads_steps} steps, seed {cfg.seed}. Losses are the mean of the last 200 "
        "steps (the e2/e3 losses include the irreducible variance of eps^2 and eps^3 given x_t).\n",
        "| data | backbone params | head params | stage 1 time | stage 2 time | mse e1 | mse e2 | mse e3 |",
        "|---|---|---|---|---|---|---|---|",
        *train_rows,
        "",
        f"Training time in all: {train_total:.0f} s; evaluation (heads check, sampling, metrics): "
        f"{res.eval_seconds:.0f} s" + ("" if total_seconds is None else f"; the whole command: {total_seconds:.0f} s")
        + ".\n",
        "## Reading\n",
        " ".join(reading(res)) + "\n",
        "## Details\n",
        *[f"- {line}" for line in findings(res)],
        "",
    ]
    for name in res.scores:
        parts += [f"## {job.DATASETS[name][0]}\n"]
        for metric, desc in TABLE_METRICS.items():
            parts += [f"**{desc}**\n", score_table(res, name, metric), ""]
        parts += ["**Learned heads vs the oracle heads** (RMSE over x_t ~ q(x_t) for fresh data and noise, at "
                  "the time indices t; the oracle heads' std over x_t gives each head's scale)\n",
                  heads_table(res, name), ""]
    parts.append("Figure: `python/results/toy_learned_fig1.png` (samples at K=10, learned heads).")
    return "\n".join(parts)


def plot_fig1(res: ToyResult, path: str | Path) -> Path:
    """Fig. 1 analogue at K = PLOT_K: 1-D histograms (learned heads, with the oracle-heads histogram outlined)
    and 8-Gaussian scatter plots (learned and oracle heads), against the data."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schedule = Schedule.linear(1000)
    cols = ["data", "ddpm", "sn-ddpm", "gms"]
    rows = []
    if ("1d", "data", "-") in res.samples:
        rows.append(("1d", "learned"))
    if ("8gauss", "data", "-") in res.samples:
        rows += [("8gauss", "learned"), ("8gauss", "oracle")]
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(2.8 * len(cols), 2.6 * len(rows)), squeeze=False)
    for i, (name, heads) in enumerate(rows):
        oracle = job.DATASETS[name][1](schedule)
        for j, col in enumerate(cols):
            ax = axes[i][j]
            label = _gms_label(name) if col == "gms" else col
            if name == "1d":
                grid = torch.linspace(-1.0, 1.0, 400, dtype=torch.float64)
                density = oracle.log_prob(grid[:, None]).exp()
                x = res.samples.get((name, label, "-" if col == "data" else heads))
                job.density_panel(ax, x, grid, density)
                ref = res.samples.get((name, label, "oracle"))
                if ref is not None:
                    ax.hist(ref.flatten().clamp(-1, 1).numpy(), bins=120, range=(-1, 1), density=True,
                            histtype="step", color="tab:orange", lw=0.8)
            else:
                key = (name, "exact", "-") if (col == "data" and heads == "oracle") else \
                    (name, label, "-" if col == "data" else heads)
                x = res.samples.get(key)
                g = torch.linspace(-1.3, 1.3, 200, dtype=torch.float64)
                gx, gy = torch.meshgrid(g, g, indexing="xy")
                dens = oracle.log_prob(torch.stack([gx.flatten(), gy.flatten()], 1)).exp().reshape(gx.shape)
                ax.contour(gx.numpy(), gy.numpy(), dens.numpy(), levels=4, colors="black", linewidths=0.5)
                if x is not None:
                    pts = x[:4000].numpy()
                    ax.scatter(pts[:, 0], pts[:, 1], s=1, alpha=0.4, color="tab:blue", rasterized=True)
                ax.set_xlim(-1.3, 1.3)
                ax.set_ylim(-1.3, 1.3)
                ax.set_aspect("equal")
                ax.set_xticks([])
                ax.set_yticks([])
                label = "exact sampler" if key[1] == "exact" else label
            kde = None if col == "data" else res.scores[name][(label, heads)][PLOT_K]["kde"]
            title = ("data" if label == "data" else label) + ("" if kde is None else f"\nKDE {kde:.3f}")
            ax.set_title(title, fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{name}, {heads} heads" if name != "1d" else "1d, learned heads\n(orange: oracle)",
                              fontsize=8)
    fig.suptitle(f"Samples at K={PLOT_K} (linear schedule, even trajectory) with heads learned on CPU; "
                 "black: the true density", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
