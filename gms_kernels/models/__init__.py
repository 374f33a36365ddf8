"""Networks for gms_kernels: pretrained-backbone architectures, the diffusers adapter, MomentNet, loaders.

- :class:`PytorchDDPMUNet`: pytorch-ddpm's CIFAR10 UNet (key-for-key; ``time_input = "index"``).
- :class:`IDDPMUNet`: improved-diffusion's UNetModel (raw state dicts; ``time_input = "scaled"``).
- :class:`DDIMModel`: the DDIM repository's Model, i.e. the DDPM CIFAR10/CelebA/LSUN networks (``time_input = "index"``).
- :class:`DiffusersUNet`: a diffusers ``UNet2DModel`` as a gk model (``time_input = "index"``).
- :class:`MomentNet`: frozen backbone + E[eps^2], E[eps^3] heads, one backbone pass per call.
- :func:`load`: every supported checkpoint format, offline, ``weights_only=True``; official GMS
  [eps, eps^2, eps^3] files become one MomentNet (``kind="gms-official"``, :mod:`.official_gms`).
- :func:`export_diffusers`: a network as a ``DDPMPipeline`` directory (:class:`GMSDiffusersModel` + GMSScheduler).
"""
from .ddim_model import DDIMModel
from .diffusers_unet import DiffusersUNet
from .iddpm import IDDPMUNet
from .loading import KINDS, load
from .moment_net import HEAD_KINDS, ConvHead, MomentNet, ResConvHead, as_backbone
from .pytorch_ddpm import PytorchDDPMUNet

__all__ = ["PytorchDDPMUNet", "IDDPMUNet", "DDIMModel", "DiffusersUNet", "MomentNet", "ConvHead", "ResConvHead",
           "as_backbone", "load", "KINDS", "HEAD_KINDS", "export_diffusers", "GMSDiffusersModel"]


def __getattr__(name: str):
    """The diffusers export loads diffusers, so it is imported on first use."""
    if name in ("export_diffusers", "GMSDiffusersModel"):
        from . import diffusers_export

        return getattr(diffusers_export, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
