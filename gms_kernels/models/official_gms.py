"""Checkpoints written by the official GMS code (Guohanzhong/GMS), merged into one network.

The official sampler keeps three networks (eps, eps^2, eps^3) and runs all three at every step. The
eps^2 and eps^3 networks are the eps network's backbone, frozen, plus one head (``out2`` for
improved-diffusion's UNetModel, ``norm_out2``/``conv_out2`` with an optional ``before_out`` for the
DDIM repository's Model). When the backbones agree, :func:`load_official` returns a :class:`MomentNet`
on the eps network's backbone with the two official heads: ``forward(x, t) = cat([e1, e2, e3], 1)`` from
one backbone pass (Eq. (13) of the GMS paper, https://arxiv.org/abs/2311.00941). ``shared_backbone=False`` runs
the networks as they are (:class:`SeparateNets`, one backbone pass per file).

Each file is ``{'net_model', 'ema_model', 'optim', 'step'}`` (``ema_model`` is read, as the official
sample.py does) or a raw state dict. Schedule: linear betas 1e-4..0.02 over T = 1000, as the official code trains them.
"""
from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..model_io import check_time_input, time_values
from ..core.schedule import Schedule
from ..core.user_warnings import warn_user
from ._common import check_state_dict, meta_model, materialize, read_torch_file, strip_prefix
from .iddpm import IDDPMUNet
from ._checkpoints import (DDIM_ARGS, IDDPM_ARGS, IDDPM_DEFAULTS, build_checked, build_ddim, check_holds_weights,
                           is_state_dict, set_schedule, warn_head_count)
from .moment_net import MomentNet
from .official_heads import DDIM_MODES, IDDPM_MODES, build_official_head

PathLike = str | os.PathLike
FAMILIES = ("improved-diffusion", "ddim")
# Head key prefixes of each family's *4Pretrained class (the rest of a file is the backbone)
HEAD_PREFIXES = {"improved-diffusion": ("out2.",), "ddim": ("before_out.", "norm_out2.", "conv_out2.")}
HEAD_MODES = {"improved-diffusion": IDDPM_MODES, "ddim": DDIM_MODES}
HEAD_FAMILY = {"improved-diffusion": "iddpm", "ddim": "ddim"}

# Official constructor arguments that do not change the network here (checked where they could)
IDDPM_IGNORED = ("dims", "num_classes", "use_checkpoint", "use_fp16", "image_size")
HEAD_ARGS = ("mode", "head_out_channels", "head_out_ch")
LOADER_ARGS = ("shared_backbone", "backbone_rtol", "use_ema", "schedule", "time_input")


def gms_schedule() -> Schedule:
    """The official GMS training schedule of every released model: linear betas 1e-4..0.02, T = 1000."""
    with torch.device("cpu"):
        return Schedule.linear(1000, 1e-4, 0.02)


# -- reading the files ----------------------------------------------------------------------------
def read_state(path: PathLike, data: Any = None, use_ema: bool = True, map_location: Any = "cpu") -> tuple[dict, str]:
    """(state dict, where) of an official file: its ``ema_model`` (``net_model`` with use_ema=False), a raw
    state dict, or a DDIM-repository list [model, optimizer, epoch, step, ema] (its last entry with EMA)."""
    path = os.fspath(path)
    data = read_torch_file(path, map_location) if data is None else data
    check_holds_weights(path, data, "gms-official")
    where = path
    if isinstance(data, Mapping) and ("ema_model" in data or "net_model" in data):
        key = "ema_model" if use_ema else "net_model"
        if key not in data:
            other = "net_model" if use_ema else "ema_model"
            raise ValueError(f"{path}: the checkpoint has no {key!r} (found {list(data)[:8]}); pass "
                             f"use_ema={not use_ema} to load {other!r}")
        state, where = data[key], f"{path} [{key}]"
    elif isinstance(data, (list, tuple)) and data and is_state_dict(data[0]):
        use_last = use_ema and len(data) > 1 and is_state_dict(data[-1])
        state, where = (data[-1], f"{path} [EMA, last entry]") if use_last else (data[0], f"{path} [model, entry 0]")
    else:
        state = data
    if not is_state_dict(state):
        raise ValueError(f"{where}: expected an official GMS checkpoint ({{'ema_model': state_dict, 'net_model': ...}}) "
                         f"or a raw state dict of tensors, found {type(state).__name__}")
    return strip_prefix(state), where


def family_of(state: Mapping[str, Any]) -> str | None:
    """``"improved-diffusion"``, ``"ddim"`` or None, from the backbone's first keys."""
    if "time_embed.0.weight" in state or "input_blocks.0.0.weight" in state:
        return "improved-diffusion"
    if "temb.dense.0.weight" in state or ("conv_in.weight" in state and "mid.block_1.conv1.weight" in state):
        return "ddim"
    return None


def split_head(state: Mapping[str, Any], family: str) -> tuple[dict, dict]:
    """(backbone entries, head entries) of a state dict; head keys keep their names except ``out2.``'s prefix."""
    prefixes = HEAD_PREFIXES[family]
    backbone = {k: v for k, v in state.items() if not k.startswith(prefixes)}
    head = {(k[len("out2."):] if family == "improved-diffusion" else k): v
            for k, v in state.items() if k.startswith(prefixes)}
    return backbone, head


# -- backbone -------------------------------------------------------------------------------------
def build_backbone(family: str, state: Mapping[str, Any], where: str, config: Mapping[str, Any],
                   device: Any) -> nn.Module:
    """The backbone of ``state`` (head entries removed), its shape read from the weights and the rest
    from ``config`` (the official constructor's arguments), checked key by key."""
    if family == "improved-diffusion":
        args = {k: v for k, v in config.items() if k in IDDPM_ARGS}
        if config.get("dims", 2) != 2:
            raise ValueError(f"dims={config['dims']!r}: only 2-D improved-diffusion networks (images) are supported")
        if config.get("num_classes") is not None:
            raise ValueError(f"num_classes={config['num_classes']!r}: class-conditional networks are not supported")
        inferred = IDDPMUNet.infer_config(state)
        cfg = {**IDDPM_DEFAULTS, **(inferred or {}), **args}
        model = build_checked(IDDPMUNet, cfg, state, where, "gms-official", inferred, device)
        model.eps_only = True  # (UNetModel3OutChannels keeps eps of a learned-sigma output)
        return model
    return build_ddim(state, {k: v for k, v in config.items() if k in DDIM_ARGS}, where, "gms-official", device)


def first_difference(reference: Mapping[str, torch.Tensor], other: Mapping[str, torch.Tensor],
                     rtol: float) -> tuple[str, str] | None:
    """(key, what differs) of the first entry of ``reference`` that ``other`` lacks or that differs by more
    than rtol * max|reference entry| (rtol = 0: bit-exact), or an extra key of ``other``; None when equal."""
    for key, ref in reference.items():
        if key not in other:
            return key, "missing"
        val = other[key]
        if val.shape != ref.shape:
            return key, f"shape {list(val.shape)} vs {list(ref.shape)}"
        if torch.equal(val, ref):  # (the usual case: a frozen backbone copied bit for bit)
            continue
        if not ref.is_floating_point():
            return key, "values differ"
        diff = (val.double() - ref.double()).abs().max().item()
        scale = ref.double().abs().max().item()
        if rtol == 0 or not diff <= rtol * max(scale, 1e-12):  # (NaN differences count as differences)
            return key, f"max |difference| {diff:.3g} (largest |value| {scale:.3g})"
    extra = [k for k in other if k not in reference]
    return (extra[0], "not in the eps network") if extra else None


# -- heads ----------------------------------------------------------------------------------------
def detect_mode(family: str, head: Mapping[str, Any], backbone: nn.Module, where: str) -> str:
    """The head mode whose layout has exactly the file's head keys (every mode is tried, none is assumed)."""
    found = set(head)
    for mode in HEAD_MODES[family]:
        kind = f"{HEAD_FAMILY[family]}-{mode}"
        built = meta_model(lambda: build_official_head(kind, backbone, backbone.eps_channels, 0.0))
        if set(built.state_dict()) == found:
            return kind
    prefix = "out2." if family == "improved-diffusion" else ""
    shown = ", ".join(sorted(prefix + k for k in found)[:10])
    raise ValueError(f"{where}: the head keys match no official {family} head mode "
                     f"({', '.join(HEAD_MODES[family])}); found {len(found)}: {shown}")


def load_head(kind: str, backbone: nn.Module, head: Mapping[str, Any], where: str, dropout: float) -> nn.Module:
    module = meta_model(lambda: build_official_head(kind, backbone, backbone.eps_channels, dropout))
    check_state_dict(module, head, where, f"the official head {kind!r} on a backbone with "
                     f"{backbone.feature_channels} feature channels")
    return materialize(module, head, next(backbone.parameters()).device)


# -- the whole network ----------------------------------------------------------------------------
class SeparateNets(nn.Module):
    """The official networks run one by one (``shared_backbone=False``): e1 from the eps network, e_n from
    network n's own backbone and head. ``forward(x, t) = cat([e1, e2, e3], 1)`` costs one backbone pass per
    network, as in the official sampler."""

    def __init__(self, eps_net: nn.Module, head_nets: Sequence[MomentNet]):
        super().__init__()
        self.eps_net = eps_net
        self.head_nets = nn.ModuleList(head_nets)
        self.channels = int(eps_net.eps_channels)
        self.requires_grad_(False)

    @property
    def time_input(self) -> str:
        return self.eps_net.time_input

    @property
    def output_heads(self) -> int:
        """How many heads [e1, e2, e3] forward returns."""
        return 1 + len(self.head_nets)

    @property
    def schedule(self) -> Schedule | None:
        return self.eps_net.schedule

    @schedule.setter
    def schedule(self, value: Schedule | None) -> None:
        for net in [self.eps_net, *self.head_nets]:
            net.schedule = value

    def forward(self, x: torch.Tensor, t: torch.Tensor | int | float) -> torch.Tensor:
        c = self.channels
        outs = [self.eps_net(x, t)[:, :c]] + [net(x, t)[:, c:2 * c] for net in self.head_nets]
        return torch.cat(outs, dim=1)


def load_official(paths: PathLike | Sequence[PathLike], *, shared_backbone: bool = True, backbone_rtol: float = 1e-4,
                  use_ema: bool = True, schedule: Schedule | None = None, time_input: str | None = None,
                  map_location: Any = "cpu", **config: Any) -> nn.Module:
    """Official GMS checkpoints [eps, eps^2, eps^3] (or [eps, eps^2] for SN-DDPM, or [eps]) as one network.

    ``config``: the official constructor's arguments (improved-diffusion ``UNetModel``: in_channels,
    model_channels, out_channels, num_res_blocks, attention_resolutions, dropout, channel_mult,
    conv_resample, dims, num_classes, use_checkpoint, num_heads, num_heads_upsample,
    use_scale_shift_norm; DDIM ``Model``: ch, out_ch, ch_mult, num_res_blocks, attn_resolutions, dropout,
    resamp_with_conv, in_channels, resolution; and the heads' ``mode``, ``head_out_channels`` /
    ``head_out_ch``). What the weights tell (widths, blocks, attention levels, head mode) is read from
    them; the config fills the rest (num_heads, default 4; dropout; the DDIM ``resolution``) and is
    checked against them.

    The backbones of files 2 and 3 must equal the eps network's (each entry within ``backbone_rtol`` times
    its largest value; 0 = bit-exact: an EMA of frozen weights may drift by rounding); else a ValueError
    names the first differing key. ``shared_backbone=False`` skips the check and runs the networks
    separately (:class:`SeparateNets`). Returns the eps network alone for one file, else a
    :class:`MomentNet` with orders (2,) or (2, 3), carrying ``schedule`` (default: linear 1e-4..0.02, T=1000).

    The files carry no order: files 2 and 3 with identical heads are refused, and a probe batch checks that
    the second network behaves as the eps^2 one (a UserWarning otherwise, see :func:`_check_order`). Without
    ``num_heads``, an improved-diffusion network gets 4 attention heads, with a warning (the weights cannot tell).
    """
    files = [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else list(paths))]
    _check_options(files, config, backbone_rtol)
    states = [read_state(f, use_ema=use_ema, map_location=map_location) for f in files]
    family = family_of(states[0][0])
    if family is None:
        raise ValueError(f"{states[0][1]}: not an improved-diffusion UNetModel nor a DDIM Model state dict "
                         f"(first keys: {list(states[0][0])[:6]}); kind='gms-official' reads those two families")
    _check_family_options(family, config, states[0][1])
    parts = _split_files(states, family)
    _check_distinct_heads(parts)
    eps_net = build_backbone(family, parts[0][0], parts[0][2], config, map_location)
    if family == "improved-diffusion" and "num_heads" not in config:
        warn_head_count(parts[0][2], eps_net.num_heads)  # (once, however many backbones are built)
    _with_schedule(eps_net, schedule, time_input)
    if len(files) == 1:
        return eps_net.eval()
    dropout = float(getattr(eps_net, "dropout", 0.0))
    if not shared_backbone:
        nets = [_head_net(build_backbone(family, backbone_state, where, config, map_location), [(head, where)],
                          family, config, dropout) for backbone_state, head, where in parts[1:]]
        net = SeparateNets(eps_net, nets)
        for m in [net.eps_net, *(h.backbone for h in net.head_nets)]:
            _with_schedule(m, eps_net.schedule, time_input)
    else:
        _check_shared(parts, float(backbone_rtol))
        net = _head_net(eps_net, [(head, where) for _, head, where in parts[1:]], family, config, dropout)
    net.eval()
    _check_order(net, [where for _, _, where in parts[1:]], eps_net, config.get("image_size"))
    return net


def _check_options(files: list[str], config: Mapping[str, Any], backbone_rtol: Any) -> None:
    if not 1 <= len(files) <= 3:
        raise ValueError(f"kind='gms-official' takes 1 to 3 files [eps, eps^2, eps^3], got {len(files)}")
    known = tuple(dict.fromkeys(IDDPM_ARGS + IDDPM_IGNORED + DDIM_ARGS + HEAD_ARGS))
    bad = [k for k in config if k not in known]
    if bad:
        raise ValueError(f"unknown option(s) for kind 'gms-official': {', '.join(bad)}; valid: the official "
                         f"constructor arguments ({', '.join(known)}) and {', '.join(LOADER_ARGS)}")
    if not (isinstance(backbone_rtol, (int, float)) and backbone_rtol >= 0):
        raise ValueError(f"backbone_rtol must be a number >= 0, got {backbone_rtol!r}")


def _check_family_options(family: str, config: Mapping[str, Any], where: str) -> None:
    """Refuse the other family's constructor arguments (they would be ignored)."""
    own = (IDDPM_ARGS + IDDPM_IGNORED if family == "improved-diffusion" else DDIM_ARGS) + HEAD_ARGS
    foreign = [k for k in config if k not in own]
    if foreign:
        article, other = ("an", "DDIM Model") if family == "improved-diffusion" else ("a", "improved-diffusion UNetModel")
        raise ValueError(f"{where}: holds {article} {family} network, but the option(s) {', '.join(foreign)} are "
                         f"the {other}'s; pass this family's constructor arguments ({', '.join(own)})")


def _split_files(states: list[tuple[dict, str]], family: str) -> list[tuple[dict, dict, str]]:
    """(backbone entries, head entries, where) per file; the first file has no head, the others one each."""
    parts = []
    for n, (state, where) in enumerate(states):
        if family_of(state) != family:
            raise ValueError(f"{where}: holds a {family_of(state) or 'unknown'} network, but {states[0][1]} holds "
                             f"a {family} one; all files must come from one family")
        backbone_state, head = split_head(state, family)
        if n == 0 and head:
            raise ValueError(f"{where}: the first file must be the eps network, but it has head entries "
                             f"({', '.join(sorted(head)[:4])}, ...): pass the files in the order [eps, eps^2, eps^3]")
        if n > 0 and not head:
            raise ValueError(f"{where}: file {n + 1} should be the eps^{n + 1} network, but it has no head "
                             f"({' / '.join(HEAD_PREFIXES[family])}*): pass the files in the order [eps, eps^2, eps^3]")
        parts.append((backbone_state, head, where))
    return parts


def _check_distinct_heads(parts: list[tuple[dict, dict, str]]) -> None:
    """Files 2 and 3 with equal head weights are one network given twice (e.g. [eps1, eps2, eps2])."""
    if len(parts) < 3:
        return
    (_, a, where_a), (_, b, where_b) = parts[1], parts[2]
    if set(a) == set(b) and all(a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a):
        raise ValueError(f"{where_a} and {where_b} hold identical head weights: one network given twice, where the "
                         "eps^2 and eps^3 networks were expected. Pass three different files in the order "
                         "[eps1, eps2, eps3] (the eps, eps^2 and eps^3 networks)")


# The order check's steps, as fractions of T: middle to late steps, where x_t has about the scale of the
# N(0, I) probe and e1^2 is large
PROBE_TIMES = (0.3, 0.5, 0.7, 0.9)


def _check_order(net: nn.Module, wheres: list[str], eps_net: nn.Module, image_size: Any = None) -> None:
    """Warn when the second network fails E[eps^2] >= E[eps]^2 on a probe batch.

    The files carry no order and the eps^2 and eps^3 heads share one layout, so only their outputs can tell
    them apart. The official heads learn raw moments: an eps^2 head gives mean(e2) >= mean(e1^2) up to its
    error, while an eps^3 head averages near 0 (e1^3 + 3 e1 Var + skew: odd in e1). Below half of mean(e1^2)
    is far outside the first and typical of the second. The files are named "swapped" when the third one
    passes instead, with a mean above the second's size.
    """
    param = next(net.parameters(), None)
    if param is None or param.device.type == "meta":
        return
    size = getattr(eps_net, "resolution", None)  # (the DDIM Model's own; improved-diffusion takes any size that
    if size is None:                             # halves once per level: the training size when given)
        step = 2 ** (len(eps_net.config["channel_mult"]) - 1)
        size = -(-int(image_size or 32) // step) * step
    T = net.schedule.T
    steps = torch.tensor([min(int(f * T), T - 1) for f in PROBE_TIMES])
    x = torch.randn(len(steps), eps_net.in_channels, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = net(x.to(param.device, param.dtype), time_values(steps, T, net.time_input).to(param.device)).double()
    c = eps_net.eps_channels
    e1_sq = out[:, :c].square().mean().item()
    means = [out[:, c * n:c * (n + 1)].mean().item() for n in range(1, out.shape[1] // c)]
    if not all(math.isfinite(v) for v in [e1_sq, *means]) or means[0] >= 0.5 * e1_sq:
        return
    text = (f"{wheres[0]}: as the eps^2 network, its output fails E[eps^2] >= E[eps]^2 on a probe batch (mean e2 "
            f"{means[0]:.3g}, mean e1^2 {e1_sq:.3g})")
    if len(means) > 1 and means[1] >= e1_sq and means[1] > abs(means[0]):  # (an eps^2 average outweighs an eps^3 one)
        text += (f", which the third file {wheres[1]} passes (its mean {means[1]:.3g}): the eps^2 and eps^3 files "
                 "look swapped")
    warn_user(text + ". Pass the files in the order [eps1, eps2, eps3] (the eps, eps^2 and eps^3 networks); in "
              "that order, this warning means the eps^2 network is untrained or broken")


def _check_shared(parts: list[tuple[dict, dict, str]], rtol: float) -> None:
    """The backbones of files 2, 3 must be the eps network's (else one pass cannot serve all heads)."""
    for backbone_state, _, where in parts[1:]:
        diff = first_difference(parts[0][0], backbone_state, rtol)
        if diff is not None:
            key, what = diff
            raise ValueError(f"{where}: its backbone differs from the eps network's ({parts[0][2]}) at {key!r}: "
                             f"{what}. These heads were not trained on this eps network's frozen backbone. Pass "
                             "shared_backbone=False to run the networks separately (one backbone pass each), or "
                             "backbone_rtol= to accept larger differences")


def _head_net(backbone: nn.Module, heads: list[tuple[dict, str]], family: str, config: Mapping[str, Any],
              dropout: float) -> MomentNet:
    """A MomentNet on ``backbone`` whose heads are the official ones read from ``heads`` (one per order)."""
    kinds = [detect_mode(family, head, backbone, where) for head, where in heads]
    want = config.get("mode")
    for kind, (_, where) in zip(kinds, heads):
        if want is not None and kind != f"{HEAD_FAMILY[family]}-{want}":
            raise ValueError(f"{where}: mode={want!r} was passed, but the head's keys are those of mode "
                             f"{kind.partition('-')[2]!r}; leave mode out (it is read from the weights)")
    out = config.get("head_out_channels", config.get("head_out_ch"))
    if out is not None and int(out) != backbone.eps_channels:
        raise ValueError(f"head_out_channels={out!r}: the heads must return the {backbone.eps_channels} data "
                         "channels of the eps network")
    orders = (2, 3)[:len(heads)]
    with torch.device("meta"):
        net = MomentNet(backbone, orders=orders, head=kinds, dropout=dropout)
    for n, (head, where) in zip(orders, heads):
        net.heads[str(n)] = load_head(kinds[n - 2], backbone, head, where, dropout)
    return net


def _with_schedule(model: nn.Module, schedule: Schedule | None, time_input: str | None) -> nn.Module:
    set_schedule(model, schedule or gms_schedule())
    if time_input is not None:
        model.time_input = check_time_input(time_input)
    return model
