"""Back into diffusers: a gms_kernels network saved as a diffusers model + GMSScheduler pipeline directory.

:func:`export_diffusers` writes a ``DDPMPipeline`` directory (``model_index.json``, ``unet/`` with
``config.json`` + ``diffusion_pytorch_model.safetensors``, ``scheduler/scheduler_config.json``) that
loads offline with this package and diffusers alone::

    pipe = DDPMPipeline.from_pretrained(directory)          # unet: GMSDiffusersModel, scheduler: GMSScheduler
    images = pipe(batch_size=16, num_inference_steps=10).images

The unet is a :class:`GMSDiffusersModel` (``ModelMixin`` + ``ConfigMixin``): its config holds the
network's own description (backbone family + constructor arguments, head kind and orders, time
input, training betas) and its weights file the network's state dict, unchanged. ``forward(sample,
timestep)`` returns ``UNet2DOutput(sample=cat([e1, e2, e3], 1))`` (3C channels for GMS heads, 2C for
SN-DDPM heads, C for a bare eps network), from one backbone pass, with ``timestep`` the 0-based
training index that diffusers' pipelines pass; it is converted to the network's own time input.
A bare diffusers UNet2DModel trained to output the heads (out_channels = 3C, or 2C with ``heads=2``)
is exported with them (:func:`bare_heads`).

Conditional networks: a class-conditional UNet2DModel (``num_class_embeds`` / ``class_embed_type``), bare
or as a MomentNet's backbone, and a bare ``UNet2DConditionModel`` export too; ``forward(sample, timestep,
class_labels=y)`` (and ``encoder_hidden_states=``, or any other keyword argument the UNet takes) passes the
condition to the network, so a hand-written loop of ``unet(x, t, class_labels=y).sample`` and
``GMSScheduler.step`` samples it (``DDPMPipeline`` itself passes no condition).

``model_index.json`` names both classes ``["gms_kernels", class name]`` (they are ``gk.GMSDiffusersModel``
and ``gk.GMSScheduler``), so that ``import gms_kernels`` before ``from_pretrained`` is all a new process
needs: diffusers imports a library it does not know only when the process has imported it.

(diffusers logs "Expected types for unet: UNet2DModel" when it loads the pipeline: ``DDPMPipeline``
annotates its unet so; the pipeline only calls ``unet(sample, t).sample`` and reads ``unet.config``.)

Why a wrapper and not a ``UNet2DModel``: the heads read the backbone's last decoder feature through
their own GroupNorm (or a residual block), which a single ``UNet2DModel`` output conv cannot hold,
and most backbones (pytorch-ddpm, improved-diffusion, ...) are not UNet2DModels at all.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from ..core.extras import require

require("diffusers", "gk.models.export_diffusers and gk.GMSDiffusersModel")
from diffusers import ModelMixin, SchedulerMixin  # (SchedulerMixin: diffusers' pipeline loader looks it up here)
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.unets.unet_2d import UNet2DOutput
from torch import nn

from ..core.files import json_ready
from ..model_io import HEAD_NAMES, check_time_input, time_values
from ..core.schedule import Schedule
from .diffusers_conditional import DiffusersConditionalUNet, is_conditional_unet
from .diffusers_unet import DiffusersUNet, is_diffusers_unet
from .moment_net import BACKBONES, MomentNet

__all__ = ["GMSDiffusersModel", "export_diffusers", "network_spec", "bare_heads", "build_network", "ModelMixin",
           "SchedulerMixin"]


def _backbone_spec(backbone: nn.Module) -> dict[str, Any]:
    family = getattr(backbone, "family", None)
    if family not in BACKBONES:
        raise ValueError(f"export_diffusers knows the backbone families {', '.join(BACKBONES)}, not "
                         f"{type(backbone).__name__}; wrap the network in one of gk.models' backbones")
    config = backbone.config
    diffusers = family in ("diffusers", "diffusers-condition")
    if diffusers:  # the UNet config without diffusers' private entries
        config = {k: v for k, v in config.items() if not k.startswith("_")}
    spec = {"family": family, "config": json_ready(config, f"the {family} backbone config")}
    if diffusers:
        spec["eps_only"] = bool(backbone.eps_only)
    return spec


def network_spec(net: nn.Module, heads: int | None = None) -> dict[str, Any]:
    """A JSON description from which :func:`build_network` rebuilds ``net``'s architecture: a
    MomentNet (backbone + heads) or a bare backbone with the heads of :func:`bare_heads` (an eps network,
    C channels, unless a UNet2DModel gives more heads)."""
    if isinstance(net, MomentNet):
        gives = 1 + len(net.orders)
        if heads is not None and heads != gives:
            raise ValueError(f"heads={heads!r} but the MomentNet gives {gives} heads ({', '.join(HEAD_NAMES[:gives])}; "
                             f"orders {tuple(net.orders)}): leave heads out for a MomentNet")
        config = {k: v for k, v in net.head_config.items() if k in ("orders", "head", "dropout", "targets")}
        return {"type": "moment-net", "backbone": _backbone_spec(net.backbone), "heads": json_ready(config)}
    backbone = as_gk_backbone(net)
    spec = {"type": "backbone", "backbone": _backbone_spec(backbone), "heads": bare_heads(backbone, heads)}
    return spec


def bare_heads(backbone: nn.Module, heads: int | None = None) -> int:
    """How many heads [e1, e2, e3] a bare backbone is exported with. The backbones of gk.models give eps
    (channels after it are a learned variance): 1. A diffusers UNet2DModel gives out_channels / in_channels
    groups: 1 or 3 are the heads; 2 is also diffusers' learned-variance layout [eps, variance], so it needs
    ``heads`` (1: eps alone; 2: [E[eps], E[eps^2]]) unless its wrapper or pipeline says which."""
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int) or not 1 <= heads <= 3):
        raise ValueError(f"heads must be 1, 2 or 3 (how many heads [e1, e2, e3] the network's output holds), "
                         f"got {heads!r}")
    if isinstance(backbone, DiffusersConditionalUNet):  # (a UNet2DConditionModel: its wrapper says what it gives)
        gives = backbone.output_heads
        if heads not in (None, 1, gives):
            raise ValueError(f"heads={heads} but the {type(backbone.unet).__name__} gives {gives} (out_channels = "
                             f"{backbone.out_channels}, in_channels = {backbone.in_channels}); pass heads=1 (eps "
                             f"alone) or heads={gives}, or leave it out")
        return gives if heads is None else heads
    if not isinstance(backbone, DiffusersUNet):
        if heads not in (None, 1):
            raise ValueError(f"heads={heads}: a {type(backbone).__name__} gives eps alone (channels after it are a "
                             "learned variance); export it with heads=1, or add heads: gk.models.MomentNet(net) "
                             "trained with gms-kernels train-heads")
        return 1
    c, out = backbone.in_channels, backbone.out_channels
    if out % c or not 1 <= out // c <= 3:
        raise ValueError(f"the UNet2DModel has out_channels = {out} for in_channels = {c}: export_diffusers reads 1, 2 "
                         f"or 3 groups of {c} channels ([e1, e2, e3])")
    gives = out // c
    known_variance = backbone.variance_type is not None and backbone.learned_variance
    if heads is None:
        if backbone.eps_only_given is not None:  # the wrapper was told
            return 1 if backbone.eps_only else gives
        if gives == 2 and not known_variance:
            raise ValueError(f"the UNet2DModel has out_channels = {out} = 2 x in_channels ({c}): diffusers' layout for "
                             "a learned variance [eps, variance], or two heads [E[eps], E[eps^2]]. Say which: "
                             "heads=1 exports eps alone (solver ddpm, ddpm-large or ddim), heads=2 exports both as "
                             "heads (solver sn-ddpm)")
        return 1 if known_variance else gives
    if heads == 1:
        return 1
    if heads != gives:
        raise ValueError(f"heads={heads} but the UNet2DModel gives {gives} (out_channels = {out} = {gives} x "
                         f"in_channels {c}); pass heads=1 (eps alone) or heads={gives}")
    if known_variance:
        raise ValueError(f"heads={heads}: its scheduler has variance_type={backbone.variance_type!r}, so channels "
                         f"{c}..{out - 1} are a learned variance, not E[eps^2]; export it with heads=1")
    return heads


def as_gk_backbone(net: nn.Module) -> nn.Module:
    """A bare diffusers UNet in its gms_kernels wrapper (a UNet2DModel, class-conditional or not, in
    DiffusersUNet; a UNet2DConditionModel in DiffusersConditionalUNet); anything else as it is."""
    if is_diffusers_unet(net):
        return DiffusersUNet(net)
    return DiffusersConditionalUNet(net) if is_conditional_unet(net) else net


def build_network(spec: dict[str, Any]) -> nn.Module:
    """The network described by :func:`network_spec`, with uninitialised weights (load them next)."""
    kind, backbone_spec = spec.get("type"), spec.get("backbone")
    if kind not in ("moment-net", "backbone") or not isinstance(backbone_spec, dict) \
            or backbone_spec.get("family") not in BACKBONES:
        raise ValueError(f"not a gms_kernels network description: {json.dumps(spec)[:200]}; export it again "
                         "with gk.models.export_diffusers")
    backbone, on_meta = BACKBONES[backbone_spec["family"]](backbone_spec)
    if on_meta:
        backbone = backbone.to_empty(device="cpu")
    if kind == "backbone":
        if hasattr(backbone, "eps_only"):  # eps alone (never a learned-variance channel), unless exported as heads
            backbone.eps_only = spec.get("heads", 1) == 1
        return backbone.eval()
    heads = spec.get("heads") or {}
    return MomentNet(backbone, orders=heads.get("orders", (2, 3)), head=heads.get("head", "conv"),
                     dropout=heads.get("dropout", 0.0), targets=heads.get("targets", "raw")).eval()


def _output_channels(net: nn.Module, spec: dict[str, Any], channels: int) -> int:
    return channels * (1 + len(net.orders) if isinstance(net, MomentNet) else spec.get("heads", 1))


class GMSDiffusersModel(ModelMixin, ConfigMixin):
    """A gms_kernels network as a diffusers model: ``forward(sample, timestep)`` returns
    ``UNet2DOutput(sample=cat([e1, e2, e3], dim=1))`` (see the module docstring).

    Config: ``network`` (:func:`network_spec`), ``in_channels``, ``out_channels``, ``sample_size``
    (read by ``DDPMPipeline`` to size the noise), ``num_train_timesteps`` and ``time_input`` (how the
    0-based index ``timestep`` becomes the network's time argument), ``trained_betas`` (the training
    schedule, so that ``gk.sample`` on the reloaded network uses it; None if the network had none),
    ``solver_defaults`` (the network's own solver options, ``gk.solvers.with_model_defaults``; None if none).
    ``self.net`` is the gms_kernels network; ``gk.sample`` and ``gk.models.load`` use it directly.
    """

    @register_to_config
    def __init__(self, network: dict | None = None, in_channels: int = 3, out_channels: int = 9,
                 sample_size: int | Sequence[int] = 32, num_train_timesteps: int = 1000, time_input: str = "index",
                 trained_betas: Sequence[float] | None = None, solver_defaults: dict | None = None):
        super().__init__()
        if network is None:
            raise ValueError("GMSDiffusersModel needs the network description (config 'network'); build it with "
                             "gk.models.export_diffusers or GMSDiffusersModel.from_network")
        self.net = build_network(network)
        self._time_input = check_time_input(time_input)
        if trained_betas is not None:
            self.net.schedule = Schedule.from_betas(trained_betas)
        if solver_defaults:
            self.net.solver_defaults = solver_defaults
        self.__module__ = "gms_kernels"  # model_index.json: ["gms_kernels", "GMSDiffusersModel"] (GMSScheduler: why)

    @classmethod
    def from_network(cls, net: nn.Module, sample_size: int | Sequence[int] | None = None,
                     heads: int | None = None) -> "GMSDiffusersModel":
        """Wrap ``net`` (a MomentNet or a backbone of gk.models; its weights are copied exactly); ``heads``:
        see :func:`bare_heads`."""
        if getattr(net, "output_scale", None) is not None:  # (the network description has no place for it yet)
            raise ValueError("the diffusers export does not carry heads with a per-t output scale (output_scale); "
                             "save the model with save() or gk.embedded.save_embedded instead")
        spec = network_spec(net, heads)
        backbone = net.backbone if isinstance(net, MomentNet) else as_gk_backbone(net)
        channels = int(backbone.eps_channels)
        if sample_size is None:
            if backbone_family(net) not in ("diffusers", "diffusers-condition"):
                raise ValueError("pass sample_size= (the image height, or (height, width)): the network does not "
                                 "record the resolution it was trained at, and DDPMPipeline needs it")
            sample_size = backbone.config["sample_size"]
        sample_size = sample_size if isinstance(sample_size, int) else [int(s) for s in sample_size]
        schedule = getattr(net, "schedule", None)
        T = schedule.T if schedule is not None else int(getattr(backbone, "T", 1000))
        model = cls(network=spec, in_channels=channels, out_channels=_output_channels(net, spec, channels),
                    sample_size=sample_size, num_train_timesteps=T, time_input=getattr(net, "time_input", "index"),
                    trained_betas=None if schedule is None else schedule.betas.tolist(),
                    solver_defaults=json_ready(getattr(net, "solver_defaults", None) or None, "solver_defaults"))
        # (a bare UNet2DModel is wrapped by as_gk_backbone: its weights are copied from the wrapper, whose keys
        # the rebuilt network has)
        source = net if isinstance(net, MomentNet) else backbone
        state = {k: v.detach().cpu() for k, v in source.state_dict().items()}
        model.net.load_state_dict(state, strict=True)
        return model.eval()

    @property
    def conditional(self) -> bool:
        """Whether the network takes a condition (a class-conditional UNet2DModel or a UNet2DConditionModel
        backbone): ``forward`` then passes ``class_labels`` / ``encoder_hidden_states`` and the like to it."""
        backbone = self.net.backbone if isinstance(self.net, MomentNet) else self.net
        return bool(getattr(backbone, "conditional", False)) or isinstance(backbone, DiffusersConditionalUNet)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor | int, class_labels: Any = None,
                return_dict: bool = True, **kwargs: Any) -> UNet2DOutput | tuple:
        """The heads at the 0-based training index ``timestep``; ``class_labels`` and the other keyword
        arguments (``encoder_hidden_states``, ...) go to a conditional network as they are."""
        if class_labels is not None:
            kwargs["class_labels"] = class_labels
        if kwargs and not self.conditional:
            raise ValueError(f"this GMSDiffusersModel's network is unconditional, so it takes no "
                             f"{', '.join(sorted(kwargs))}: call it as unet(sample, timestep), or export a "
                             "class-conditional UNet2DModel (num_class_embeds) or a UNet2DConditionModel")
        t = torch.as_tensor(timestep, device=sample.device)
        if t.dim() == 0:
            t = t.expand(sample.shape[0])
        if t.is_floating_point() and not torch.equal(t, t.round()):
            raise ValueError("GMSDiffusersModel takes the 0-based integer training index as timestep (as diffusers' "
                             f"pipelines pass it), got {t.tolist()}")
        out = self.net(sample, time_values(t, self.config.num_train_timesteps, self._time_input), **kwargs)
        return UNet2DOutput(sample=out) if return_dict else (out,)


def backbone_family(net: nn.Module) -> str | None:
    backbone = net.backbone if isinstance(net, MomentNet) else as_gk_backbone(net)
    return getattr(backbone, "family", None)


def _scheduler_for(net: nn.Module, **scheduler_kwargs: Any):
    """GMSScheduler on the network's training betas (the named linear schedule when they are exactly it), with the
    network's own solver options (``solver_defaults``) under the ones ``scheduler_kwargs`` name."""
    from ..integrations.scheduler import ARGUMENT_KEYS, GMSScheduler
    from ..solvers import get_solver, with_model_defaults

    schedule = getattr(net, "schedule", None) or Schedule.linear()
    kwargs: dict[str, Any] = {"num_train_timesteps": schedule.T}
    if not torch.equal(schedule.betas, Schedule.linear(schedule.T).betas):
        kwargs["trained_betas"] = schedule.betas.tolist()
    # the network's own options under the ones the caller names, split as GMSScheduler takes them
    as_arguments = ARGUMENT_KEYS
    caller = {k: v for k, v in scheduler_kwargs.items() if not (k in as_arguments and v is None)}
    extra = dict(caller.pop("solver_options", None) or {})
    named = {**{k: v for k, v in caller.items() if k in as_arguments}, **extra}
    for key, value in with_model_defaults(get_solver(caller.get("solver", "gms")), named, net).items():
        if key not in named:
            (kwargs if key in as_arguments else extra)[key] = value
    if extra:
        kwargs["solver_options"] = extra
    return GMSScheduler(**{**kwargs, **caller})


def export_diffusers(net: nn.Module, directory: str | os.PathLike, *, sample_size: int | Sequence[int] | None = None,
                     heads: int | None = None, scheduler: Any = None, **scheduler_kwargs: Any) -> Path:
    """Write ``net`` (a MomentNet, or a bare backbone of gk.models or diffusers UNet2DModel) as a
    ``DDPMPipeline`` directory with a :class:`GMSDiffusersModel` unet and a ``GMSScheduler`` (``scheduler``,
    or one built on the network's training betas with ``scheduler_kwargs``, e.g. ``solver="sn-ddpm"``),
    whose ``model_heads`` says how many heads the unet gives. Returns the path.

    ``sample_size``: the image size for ``DDPMPipeline`` (needed unless the backbone is a UNet2DModel).
    ``heads``: for a bare UNet2DModel, how many heads its output channels hold (:func:`bare_heads`; needed
    for out_channels = 2 * in_channels, which is also diffusers' learned-variance layout).
    Reload with ``DDPMPipeline.from_pretrained(directory)`` (after ``import gms_kernels``),
    ``GMSDiffusersModel.from_pretrained(directory, subfolder="unet")`` or ``gk.models.load(directory)``
    (the gms_kernels network itself).
    """
    from diffusers import DDPMPipeline

    from ..integrations.scheduler import GMSScheduler
    from ..solvers import get_solver

    if scheduler is not None and scheduler_kwargs:
        raise ValueError("pass either scheduler= or scheduler options, not both")
    if scheduler is not None and not isinstance(scheduler, GMSScheduler):
        raise TypeError(f"scheduler must be a gk.GMSScheduler, got {type(scheduler).__name__}")
    model = GMSDiffusersModel.from_network(net, sample_size, heads)
    gives = model.config.out_channels // model.config.in_channels
    solver = scheduler.config.solver if scheduler is not None else scheduler_kwargs.get("solver", "gms")
    needed = get_solver(solver).heads * model.config.in_channels
    if model.config.out_channels < needed:
        raise ValueError(f"the scheduler's solver {solver!r} reads {needed} channels but the network gives "
                         f"{model.config.out_channels}; pick a solver for its heads (ddpm, ddim: 1 head; "
                         "sn-ddpm: 2; gms: 3) or add heads (gms-kernels train-heads)")
    if scheduler is None:
        scheduler = _scheduler_for(net, **{"model_heads": gives, **scheduler_kwargs})
    elif scheduler.config.model_heads is None:
        scheduler = scheduler.with_model_heads(gives)
    if scheduler.config.model_heads != gives:
        raise ValueError(f"the scheduler has model_heads={scheduler.config.model_heads} but the network gives {gives} "
                         f"heads ({model.config.out_channels} channels); leave model_heads out")
    DDPMPipeline(unet=model, scheduler=scheduler).save_pretrained(directory, safe_serialization=True)
    return Path(directory)


def load_exported(model_dir: str | os.PathLike, schedule: Schedule | None = None, variant: str | None = None,
                  eps_only: bool | None = None) -> nn.Module:
    """The gms_kernels network inside a :class:`GMSDiffusersModel` directory (config.json + weights);
    ``schedule`` replaces the stored training betas."""
    if eps_only is not None:
        raise ValueError(f"{model_dir}: eps_only does not apply to an exported gms_kernels network (its outputs are "
                         "the heads it was exported with)")
    if schedule is not None and not isinstance(schedule, Schedule):
        raise ValueError(f"schedule must be a gk.Schedule, got {type(schedule).__name__}")
    model = GMSDiffusersModel.from_pretrained(os.fspath(model_dir), variant=variant, local_files_only=True,
                                              low_cpu_mem_usage=False)
    if schedule is not None:
        model.net.schedule = schedule
    return model.net.eval()
