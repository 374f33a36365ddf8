"""MomentNet: a frozen eps-network plus heads for E[eps^2] and E[eps^3] that share its single pass.

The assembled network of the GMS paper (https://arxiv.org/abs/2311.00941, Eq. (13) and Table 6): the heads
read the backbone's last decoder feature h (the tensor entering the backbone's final GroupNorm/SiLU/conv
block) and return per-pixel E[eps^n | x_t]. ``forward(x, t)`` returns cat([e1, e2, e3], dim=1), e1 being the
backbone's own eps.
"""
from __future__ import annotations

import json
import os
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..core.extras import require
from ..core.files import json_ready
from ..model_io import time_indices
from ..core.moments import raw_moments
from ..core.schedule import Schedule
from ._common import (GroupNorm32, check_map_location, check_state_dict, format_call, group_count, materialize,
                      read_location, read_torch_file)
from .ddim_model import DDIMModel
from .diffusers_unet import DiffusersUNet, is_diffusers_unet
from .iddpm import IDDPMUNet
from .official_heads import OFFICIAL_HEAD_KINDS, build_official_head
from .pytorch_ddpm import PytorchDDPMUNet

HEADS_FORMAT = "gms_kernels.moment_heads"
NET_FORMAT = "gms_kernels.moment_net"
FORMAT_VERSION = 1
TRAINABLE_HEAD_KINDS = ("conv", "res_conv")  # the heads a MomentNet builds fresh for gk.train_heads
HEAD_KINDS = TRAINABLE_HEAD_KINDS + OFFICIAL_HEAD_KINDS  # the official GMS heads: see official_heads.py
ORDERS = ((2,), (2, 3))


def as_backbone(model: nn.Module) -> nn.Module:
    """The model itself when it exposes ``forward_features`` (this package's UNets), a
    :class:`DiffusersUNet` around a diffusers UNet2DModel; TypeError otherwise."""
    if is_diffusers_unet(model):
        return DiffusersUNet(model)
    needed = ("forward_features", "feature_channels", "temb_channels", "eps_channels")
    if isinstance(model, nn.Module) and all(hasattr(model, a) for a in needed):
        return model
    raise TypeError(f"MomentNet cannot read features from a {type(model).__name__}: use gk.models.PytorchDDPMUNet, "
                    "gk.models.IDDPMUNet, gk.models.DDIMModel, a diffusers UNet2DModel (or gk.models.DiffusersUNet), or a module with "
                    "forward_features(x, t) -> (h, temb, output) and feature_channels, temb_channels, eps_channels")


class ConvHead(nn.Module):
    """GroupNorm -> SiLU -> zero-initialised 3x3 conv to the data channels."""

    def __init__(self, channels: int, out_channels: int):
        super().__init__()
        self.norm = GroupNorm32(group_count(channels), channels)
        self.conv = nn.Conv2d(channels, out_channels, 3, padding=1)
        nn.init.zeros_(self.conv.weight)
        nn.init.zeros_(self.conv.bias)

    def forward(self, h: torch.Tensor, temb: torch.Tensor | None = None) -> torch.Tensor:
        return self.conv(F.silu(self.norm(h)))


class HeadResBlock(nn.Module):
    """h + conv(drop(SiLU(GN(conv(SiLU(GN(h))) + W SiLU(temb))))); the second conv starts at zero."""

    def __init__(self, channels: int, temb_channels: int, dropout: float = 0.0):
        super().__init__()
        g = group_count(channels)
        self.norm1 = GroupNorm32(g, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.temb_proj = nn.Linear(temb_channels, channels)
        self.norm2 = GroupNorm32(g, channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        nn.init.zeros_(self.conv2.weight)
        nn.init.zeros_(self.conv2.bias)

    def forward(self, h: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        r = self.conv1(F.silu(self.norm1(h)))
        r = r + self.temb_proj(F.silu(temb)).to(r.dtype)[:, :, None, None]
        r = self.conv2(self.dropout(F.silu(self.norm2(r))))
        return h + r


class ResConvHead(nn.Module):
    """One time-conditioned residual block on h, then the :class:`ConvHead`."""

    def __init__(self, channels: int, temb_channels: int, out_channels: int, dropout: float = 0.0):
        super().__init__()
        self.res = HeadResBlock(channels, temb_channels, dropout)
        self.out = ConvHead(channels, out_channels)

    def forward(self, h: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        return self.out(self.res(h, temb))


def _make_head(kind: str, backbone: nn.Module, channels: int, dropout: float) -> nn.Module:
    f, e = int(backbone.feature_channels), int(backbone.temb_channels)
    if kind == "conv":
        return ConvHead(f, channels)
    if kind == "res_conv":
        return ResConvHead(f, e, channels, dropout)
    return build_official_head(kind, backbone, channels, dropout)


HEAD_TARGETS = ("raw", "central")


def raw_from_central(e1: torch.Tensor, central: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """[e2, e3] (or [e2]) from e1 and the residual's central moments [c2, c3] (or [c2]):
    :func:`~gms_kernels.core.moments.raw_moments`, e2 = e1^2 + c2 and e3 = e1^3 + 3 e1 c2 + c3."""
    e2, e3 = raw_moments(e1, central[0], central[1] if len(central) > 1 else None)
    return [e2] if e3 is None else [e2, e3]


class MomentNet(nn.Module):
    """Frozen backbone + heads: ``forward(x, t) = cat([e1, e2, e3], dim=1)`` from one backbone pass.

    - ``backbone``: :class:`PytorchDDPMUNet`, :class:`IDDPMUNet`, a diffusers ``UNet2DModel`` (wrapped in
      :class:`DiffusersUNet`), or any module with ``forward_features``. Its parameters are frozen and it
      stays in eval mode even when ``.train()`` is called on the MomentNet; it runs under no_grad.
    - ``orders``: (2, 3) for [e1, e2, e3] (GMS) or (2,) for [e1, e2] (SN-DDPM).
    - ``head``: ``"conv"`` (GroupNorm -> SiLU -> zero-init 3x3 conv) or ``"res_conv"`` (a residual block
      conditioned on the backbone's time embedding, then the conv head); one head per order. The official
      GMS heads (``"iddpm-simple"``, ``"iddpm-complex"``, ``"iddpm-complex2"``, ``"ddim-simple"``,
      ``"ddim-complex"``, see :mod:`.official_heads`) are kinds too; a sequence gives one kind per order.
    - ``targets``: what the heads learn. ``"raw"`` (the paper's Algorithm 1): head n predicts E[eps^n | x_t].
      ``"central"``: head n predicts E[r^n | x_t] of the backbone's residual r = eps - e1(x_t), the noise
      prediction residual that SN-DDPM's NPR variant regresses (Bao et al. 2022, "Estimating the optimal
      covariance with imperfect mean"), taken to the third order here. ``forward`` still returns raw moments,
      e2 = e1^2 + c2 and e3 = e1^3 + 3 e1 c2 + c3 (E[r | x_t] = 0 for the MSE-optimal e1), so every solver reads
      the same thing. Why: the target eps^3 has variance 15 whatever t is, while r^3 has about 15 Var[eps|x_t]^3,
      so at large t the raw heads' regression noise swamps the tiny central moments they have to resolve.
    - ``output_scale``: None (the default, and every model trained before it existed) or a fixed table
      [len(orders), T] of positive numbers, one row per head, one column per time index t = 0..T-1: head n's
      output becomes ``output_scale[n - 2, t] * h_n(x_t, t)``, so that a head whose targets span many orders of
      magnitude over t (central heads: E[r^4 | t] on the shipped models falls to ~1e-6 of its size at t = 0) can
      keep its own output O(1). The table is a registered buffer (saved with the weights, never trained); see
      :meth:`set_output_scale` and ``gk.training.train_heads(output_scale=True)``, which sets it to the targets'
      RMS at each t.
    ``time_input`` and ``schedule`` are the backbone's. :func:`gms_kernels.train.training.train_heads` trains either kind.
    A conditional backbone (a class-conditional UNet2DModel) takes its condition through ``forward(x, t,
    class_labels=y)``: keyword arguments go to the backbone's pass, whose feature and time embedding the heads read.
    """

    def __init__(self, backbone: nn.Module, orders: Sequence[int] = (2, 3), head: str | Sequence[str] = "conv",
                 dropout: float = 0.0, targets: str = "raw", output_scale: torch.Tensor | None = None):
        super().__init__()
        if targets not in HEAD_TARGETS:
            raise ValueError(f"targets must be one of {', '.join(HEAD_TARGETS)}, got {targets!r}")
        self.targets = targets
        orders = tuple(int(n) for n in orders)
        if orders not in ORDERS:
            raise ValueError(f"orders must be (2, 3) (heads e2, e3) or (2,) (head e2), got {orders}")
        kinds = (head,) * len(orders) if isinstance(head, str) else tuple(head)
        if len(kinds) != len(orders):
            raise ValueError(f"head names {len(kinds)} kind(s) {list(kinds)} for {len(orders)} order(s) {orders}")
        for kind in kinds:
            if kind not in HEAD_KINDS:
                raise ValueError(f"unknown head {kind!r}; valid: {', '.join(HEAD_KINDS)}")
        backbone = as_backbone(backbone)
        backbone.requires_grad_(False)
        backbone.eval()
        self.backbone = backbone
        self.orders, self.dropout = orders, float(dropout)
        self.head = kinds[0] if len(set(kinds)) == 1 else list(kinds)  # (a list: what the saved config holds)
        self.channels = int(backbone.eps_channels)
        self.heads = nn.ModuleDict({str(n): _make_head(kind, backbone, self.channels, dropout)
                                    for n, kind in zip(orders, kinds)})
        self.register_buffer("output_scale", None)  # (a None buffer is not in the state dict: old files load as before)
        if output_scale is not None:
            self.set_output_scale(output_scale)

    # -- the per-t output scale of the heads ------------------------------------------------------------
    def set_output_scale(self, table: torch.Tensor | None) -> "MomentNet":
        """Set (or, with None, remove) the fixed per-t scale of the heads' outputs: a tensor [len(orders), T]
        (or [T] for one head) of finite positive numbers, row i for head ``orders[i]``, column t for the time
        index t. T must be the backbone schedule's T when it has one. Stored as a float32 buffer named
        ``output_scale`` (in the state dict only when set). ValueError for a table of another shape, or with a
        value that is not finite or not positive."""
        if table is None:
            self.output_scale = None
            return self
        if not torch.is_tensor(table):
            raise ValueError(f"output_scale must be a tensor [{len(self.orders)}, T], got {type(table).__name__}")
        if table.dim() == 1 and len(self.orders) == 1:
            table = table[None]
        schedule = self.schedule
        T = getattr(schedule, "T", None)
        if table.dim() != 2 or table.shape[0] != len(self.orders) or table.shape[1] < 1 or \
                (T is not None and table.shape[1] != int(T)):
            want = f"[{len(self.orders)}, {T if T is not None else 'T'}]"
            raise ValueError(f"output_scale must have shape {want} (one row per head {list(self.orders)}, one "
                             f"column per time index), got {tuple(table.shape)}")
        if not (table.is_floating_point() or table.dtype in (torch.int32, torch.int64)):
            raise ValueError(f"output_scale must hold real numbers, got {table.dtype}")
        if table.device.type != "meta":  # (a meta table, as MomentNet.load builds first, has no values to check)
            values = table.detach().to(torch.float64)
            if not torch.isfinite(values).all():
                raise ValueError("output_scale has non-finite values (NaN or inf)")
            if not (values > 0).all():
                raise ValueError(f"output_scale must be positive at every t, got a smallest value of "
                                 f"{values.min().item()}")
        device = next((p.device for p in self.heads.parameters()), table.device)
        self.output_scale = table.detach().to(device=device if table.device.type != "meta" else table.device,
                                              dtype=torch.float32).clone()
        return self

    def output_scale_from_file(self, table: torch.Tensor | None, path: str | os.PathLike) -> "MomentNet":
        """:meth:`set_output_scale` with a table read from ``path`` (None: the file has none), its errors naming
        the file."""
        try:
            return self.set_output_scale(table)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def _scale_at(self, t: torch.Tensor | int | float, batch: int, device: torch.device) -> torch.Tensor:
        """The table's columns at the time argument ``t`` (as the backbone takes it: see time_input), [heads, B]:
        the time index t; between two indices the scale is interpolated in log, and held
        at the table's ends beyond them."""
        table = self.output_scale
        T = table.shape[1]
        tt = time_indices(torch.as_tensor(t, device=device).reshape(-1).expand(batch), T, self.time_input)
        tt = tt.clamp(0, T - 1)
        lo = tt.floor().long().clamp(0, T - 1)
        hi = (lo + 1).clamp(max=T - 1)
        w = (tt - lo.to(tt.dtype)).to(torch.float32)
        table = table.to(device)
        logs = table.log()
        between = (logs[:, lo] + w * (logs[:, hi] - logs[:, lo])).exp()
        return torch.where(w == 0, table[:, lo], between)  # (at an index: the table's own value)

    # -- what gk.sample reads ------------------------------------------------------------------------
    @property
    def time_input(self) -> str:
        return getattr(self.backbone, "time_input", "index")

    @property
    def schedule(self) -> Schedule | None:
        return getattr(self.backbone, "schedule", None)

    @schedule.setter
    def schedule(self, value: Schedule | None) -> None:
        self.backbone.schedule = value

    def train(self, mode: bool = True) -> "MomentNet":
        super().train(mode)
        self.backbone.eval()
        return self

    # -- forward -------------------------------------------------------------------------------------
    def features(self, x: torch.Tensor, t: torch.Tensor | int | float,
                 **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(h, temb, eps) from one backbone pass, without gradients; ``kwargs`` (a condition, e.g.
        ``class_labels``) go to the backbone's ``forward_features``."""
        with torch.no_grad():
            h, temb, out = self.backbone.forward_features(x, t, **kwargs)
        if out.shape[1] < self.channels:
            raise ValueError(f"the backbone returned {out.shape[1]} channels, fewer than its {self.channels} eps channels")
        return h, temb, out[:, :self.channels]

    def forward(self, x: torch.Tensor, t: torch.Tensor | int | float, head_outputs: bool = False,
                **kwargs: Any) -> torch.Tensor:
        """cat([e1, e2, e3]): the raw moments E[eps^n | x_t]. ``head_outputs=True`` returns what the heads
        themselves predict instead (for ``targets="central"`` the central moments c2, c3; what training fits).
        ``kwargs``: the condition of a conditional backbone (e.g. ``class_labels``), passed to it; the heads
        read it through the backbone's feature and time embedding."""
        h, temb, eps = self.features(x, t, **kwargs)
        outs = [self.heads[str(n)](h, temb).to(eps.dtype) for n in self.orders]
        if self.output_scale is not None:
            scale = self._scale_at(t, eps.shape[0], eps.device).to(eps.dtype)
            shape = (-1,) + (1,) * (eps.dim() - 1)
            outs = [o * scale[i].reshape(shape) for i, o in enumerate(outs)]
        if self.targets == "central" and not head_outputs:
            outs = raw_from_central(eps, outs)
        return torch.cat([eps] + outs, dim=1)

    # -- heads alone ---------------------------------------------------------------------------------
    @property
    def head_config(self) -> dict[str, Any]:
        config = {"orders": list(self.orders), "head": self.head, "dropout": self.dropout, "targets": self.targets,
                  "family": getattr(self.backbone, "family", type(self.backbone).__name__),
                  "feature_channels": int(self.backbone.feature_channels),
                  "temb_channels": int(self.backbone.temb_channels), "channels": self.channels}
        if self.output_scale is not None:  # (only then: the config of a model without the table is as before)
            config["output_scale"] = list(self.output_scale.shape)
        return config

    def save_heads(self, path: str | os.PathLike) -> None:
        """Save the heads alone: {format, version, config, state_dict} (a few MB), plus ``output_scale`` (the
        per-t table) when the heads have one."""
        data = {"format": HEADS_FORMAT, "version": FORMAT_VERSION, "config": self.head_config,
                "state_dict": {k: v.detach().cpu() for k, v in self.heads.state_dict().items()}}
        if self.output_scale is not None:
            data["output_scale"] = self.output_scale.detach().cpu()
        torch.save(data, path)

    def load_heads(self, path: str | os.PathLike, data: dict | None = None) -> "MomentNet":
        """Load heads saved by :meth:`save_heads`; their config must match this MomentNet."""
        path = os.fspath(path)
        data = read_torch_file(path) if data is None else data
        cfg = _check_format(data, path, HEADS_FORMAT, "a heads file (MomentNet.save_heads)")
        ours = self.head_config
        cfg = {"targets": "raw", **cfg}  # (heads files from before ``targets`` existed are raw)
        diff = [k for k in ("orders", "head", "targets", "feature_channels", "temb_channels", "channels")
                if k in cfg and cfg[k] != ours[k]]
        if diff:
            found = ", ".join(f"{k}: this MomentNet has {ours[k]!r}, the file {cfg[k]!r}" for k in diff)
            raise ValueError(f"{path}: the heads were saved for another configuration ({found}). Fix: build "
                             f"MomentNet(backbone, orders={tuple(cfg.get('orders', ()))}, head={cfg.get('head')!r}, "
                             f"targets={cfg['targets']!r}) "
                             f"on a backbone with {cfg.get('feature_channels')} feature / {cfg.get('temb_channels')} "
                             f"time-embedding channels (family {cfg.get('family')!r}), or use "
                             "MomentNet.from_heads(backbone, path)")
        state = data.get("state_dict")
        if not isinstance(state, dict):
            raise ValueError(f"{path}: the heads file has no 'state_dict' dict; save it again with save_heads")
        check_state_dict(self.heads, state, path, f"the heads of MomentNet(orders={self.orders}, head={self.head!r})")
        self.output_scale_from_file(data.get("output_scale"), path)  # (heads saved without one are used without)
        self.heads.load_state_dict(state, strict=True)
        return self

    @classmethod
    def from_heads(cls, backbone: nn.Module, path: str | os.PathLike, data: dict | None = None) -> "MomentNet":
        """A MomentNet on ``backbone`` with the orders/head kind and weights stored in a heads file."""
        path = os.fspath(path)
        data = read_torch_file(path) if data is None else data
        cfg = _check_format(data, path, HEADS_FORMAT, "a heads file (MomentNet.save_heads)")
        try:
            net = cls(backbone, orders=cfg["orders"], head=cfg["head"], dropout=cfg.get("dropout", 0.0),
                      targets=cfg.get("targets", "raw"))
        except KeyError as e:
            raise ValueError(f"{path}: the heads config lacks {e}; save the heads again with save_heads") from None
        return net.load_heads(path, data)

    # -- the whole network ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Save backbone config + all weights + head config, loadable by :meth:`load` / gk.models.load."""
        family = getattr(self.backbone, "family", None)
        if family not in BACKBONES:
            raise ValueError(f"save() knows the backbone families {', '.join(BACKBONES)}, not "
                             f"{type(self.backbone).__name__}: save the heads with save_heads and the backbone yourself")
        config = self.backbone.config
        if family == "diffusers":  # the UNet2DModel config as JSON (private entries such as paths dropped)
            config = json.dumps({k: v for k, v in config.items() if not k.startswith("_") or k == "_class_name"},
                                default=lambda v: list(v) if isinstance(v, (tuple, set)) else str(v))
        schedule = getattr(self.backbone, "schedule", None)
        backbone = {"family": family, "config": config,
                    "schedule_betas": None if schedule is None else schedule.betas.clone()}
        if family == "diffusers":
            backbone["eps_only"] = self.backbone.eps_only
        extra = {}
        if getattr(self, "solver_defaults", None):  # (its own solver options: gk.solvers.with_model_defaults)
            extra["solver_defaults"] = json_ready(self.solver_defaults, "solver_defaults")
        torch.save({"format": NET_FORMAT, "version": FORMAT_VERSION, "backbone": backbone, "heads": self.head_config,
                    "state_dict": {k: v.detach().cpu() for k, v in self.state_dict().items()}, **extra}, path)

    @property
    def output_heads(self) -> int:
        """How many heads [e1, e2, e3] forward returns (read by gk.sample's checks)."""
        return 1 + len(self.orders)

    @classmethod
    def load(cls, path: str | os.PathLike, data: dict | None = None, map_location: Any = "cpu") -> "MomentNet":
        """Rebuild a MomentNet saved with :meth:`save` (offline, weights_only)."""
        path = os.fspath(path)
        check_map_location(map_location)
        data = read_torch_file(path, read_location(map_location)) if data is None else data
        heads = _check_format(data, path, NET_FORMAT, "a MomentNet file (MomentNet.save)", config_key="heads")
        spec, state = data.get("backbone"), data.get("state_dict")
        if not isinstance(spec, dict) or spec.get("family") not in BACKBONES or not isinstance(state, dict):
            raise ValueError(f"{path}: the MomentNet file lacks a valid 'backbone' (family one of "
                             f"{', '.join(BACKBONES)}) or 'state_dict'; save it again with MomentNet.save")
        try:
            backbone, on_meta = BACKBONES[spec["family"]](spec)
            with torch.device("meta" if on_meta else "cpu"):
                net = cls(backbone, orders=heads["orders"], head=heads["head"], dropout=heads.get("dropout", 0.0),
                          targets=heads.get("targets", "raw"))
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"{path}: cannot rebuild the network from its stored config ({type(e).__name__}: {e})") from None
        if "output_scale" in state:  # (the table's buffer exists only when set: make it before the check)
            net.output_scale_from_file(state["output_scale"], path)
        described = format_call(f"MomentNet[{spec['family']}]", {"orders": heads.get("orders"), "head": heads.get("head")})
        check_state_dict(net, state, path, described)
        if on_meta:
            materialize(net, state, map_location)
        else:
            net.load_state_dict(state, strict=True)
            if isinstance(map_location, (str, torch.device)):
                net.to(map_location)
        betas = spec.get("schedule_betas")
        if betas is not None:
            net.schedule = Schedule.from_betas(betas)
        if data.get("solver_defaults"):
            net.solver_defaults = data["solver_defaults"]
        return net.eval()


def _check_format(data: Any, path: str, fmt: str, what: str, config_key: str = "config") -> dict:
    if not isinstance(data, dict) or data.get("format") != fmt:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: not {what}: expected format tag {fmt!r}, found {found!r}. "
                         "Pick the loader that matches the file (gk.models.load(path) detects it)")
    if data.get("version", FORMAT_VERSION) > FORMAT_VERSION:
        raise ValueError(f"{path}: format version {data.get('version')} is newer than this gms_kernels "
                         f"understands ({FORMAT_VERSION}); upgrade gms_kernels")
    cfg = data.get(config_key)
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: {what} without its {config_key!r} dict; save it again")
    return cfg


def _build_pytorch_ddpm(spec: dict) -> tuple[nn.Module, bool]:
    with torch.device("meta"):
        return PytorchDDPMUNet(**spec["config"]), True


def _build_iddpm(spec: dict) -> tuple[nn.Module, bool]:
    with torch.device("meta"):
        return IDDPMUNet(**spec["config"]), True


def _build_ddim(spec: dict) -> tuple[nn.Module, bool]:
    with torch.device("meta"):
        return DDIMModel(**spec["config"]), True


def _build_diffusers(spec: dict) -> tuple[nn.Module, bool]:
    UNet2DModel = require("diffusers", "a MomentNet with a diffusers backbone").UNet2DModel

    config = spec["config"]
    config = json.loads(config) if isinstance(config, str) else dict(config)
    return DiffusersUNet(UNet2DModel.from_config(config), eps_only=spec.get("eps_only")), False


def _build_diffusers_condition(spec: dict) -> tuple[nn.Module, bool]:
    UNet2DConditionModel = require("diffusers", "a MomentNet with a diffusers backbone").UNet2DConditionModel

    from .diffusers_conditional import DiffusersConditionalUNet

    config = spec["config"]
    config = json.loads(config) if isinstance(config, str) else dict(config)
    return DiffusersConditionalUNet(UNet2DConditionModel.from_config(config), eps_only=spec.get("eps_only")), False


BACKBONES = {"pytorch-ddpm": _build_pytorch_ddpm, "improved-diffusion": _build_iddpm, "ddim": _build_ddim,
             "diffusers": _build_diffusers, "diffusers-condition": _build_diffusers_condition}
