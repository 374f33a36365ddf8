"""FID's InceptionV3 (the TensorFlow 2015-12-05 graph) in plain torch: no torchvision, no download.

Weights: the FID Inception weights file that pytorch-fid uses,
``pt_inception-2015-12-05-6726825d.pth`` (about 96 MB), from
https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth
(torch-fidelity's ``weights-inception-2015-12-05-6726825d.pth`` has the same key layout and loads
too). Download it once on a machine with network access and pass its path; nothing here downloads.

Use::

    import gms_kernels as gk
    d = gk.metrics.fid(samples, real_images, weights_path="pt_inception-2015-12-05-6726825d.pth")
    d = gk.metrics.fid(samples, "fid_stats_cifar10_train.npz", weights_path=...)  # pytorch-fid stats
    # (images in [-1, 1] by default: data_range=; preprocess="torch-fidelity" for TF-style resizing)

    from gms_kernels.eval.inception import load_fid_inception
    net = load_fid_inception("pt_inception-2015-12-05-6726825d.pth")     # device=, dtype= too
    feats = net(uint8_images)        # [N, 3, H, W] uint8 in [0, 255] or float in [0, 1] -> [N, 2048]
    # also a feature module for torchmetrics: FrechetInceptionDistance(feature=net)

``preprocess`` picks how images reach 299x299 and [-1, 1]: ``"pytorch-fid"`` (default) resizes with
torch's bilinear interpolation (half-pixel centres) and maps [0, 1] to 2x - 1, as pytorch-fid does;
``"torch-fidelity"`` resizes like TensorFlow 1.x's resize_bilinear (no half-pixel centres, float32
source coordinates) and maps [0, 255] to (x - 128) / 128, as torch-fidelity does (which documents
that as matching the original TensorFlow FID graph). Both were checked against those packages on
random weights (python/make_inception_fixture.py, tests/eval/test_inception.py).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal, Union

import torch
import torch.nn.functional as F
from torch import nn

WEIGHTS_FILE = "pt_inception-2015-12-05-6726825d.pth"
WEIGHTS_URL = f"https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/{WEIGHTS_FILE}"
TORCH_FIDELITY_WEIGHTS_FILE = "weights-inception-2015-12-05-6726825d.pth"
INPUT_SIZE = 299
NUM_FEATURES = 2048
PREPROCESSING = ("pytorch-fid", "torch-fidelity")

Preprocess = Literal["pytorch-fid", "torch-fidelity"]
PathLike = Union[str, "os.PathLike[str]"]


class _ConvBNReLU(nn.Module):
    """Convolution without bias, batch norm with TF's epsilon 1e-3, ReLU (keys ``conv.*``, ``bn.*``)."""

    def __init__(self, cin: int, cout: int, kernel, stride: int = 1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class _Mixed(nn.Module):
    """One Inception "Mixed" block, described as data.

    ``convs``: name -> (cin, cout, kernel, stride, padding), registered under those names so the
    state-dict keys are the weights file's. ``chains``: each a list of conv names applied in turn;
    an entry that is a tuple forks: each conv of the tuple is applied to the same input and the
    results are concatenated. ``pool``: "avg" (3x3, stride 1, padding not counted, as in TF),
    "max" (3x3, stride 1: the FID graph's last block, where torchvision has avg) or "reduce"
    (3x3 max, stride 2, no conv). The outputs of the chains, then the pool branch, are concatenated.
    """

    def __init__(self, convs: dict, chains: list, pool: str):
        super().__init__()
        for name, (cin, cout, k, s, p) in convs.items():
            self.add_module(name, _ConvBNReLU(cin, cout, k, s, p))
        self.chains = chains
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for chain in self.chains:
            y = x
            for step in chain:
                if isinstance(step, tuple):
                    y = torch.cat([getattr(self, name)(y) for name in step], 1)
                else:
                    y = getattr(self, step)(y)
            outs.append(y)
        if self.pool == "avg":
            outs.append(self.branch_pool(F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)))
        elif self.pool == "max":
            outs.append(self.branch_pool(F.max_pool2d(x, 3, 1, 1)))
        else:
            outs.append(F.max_pool2d(x, 3, 2))
        return torch.cat(outs, 1)


def _block_a(cin: int, pool_features: int) -> _Mixed:
    convs = {"branch1x1": (cin, 64, 1, 1, 0),
             "branch5x5_1": (cin, 48, 1, 1, 0), "branch5x5_2": (48, 64, 5, 1, 2),
             "branch3x3dbl_1": (cin, 64, 1, 1, 0), "branch3x3dbl_2": (64, 96, 3, 1, 1),
             "branch3x3dbl_3": (96, 96, 3, 1, 1),
             "branch_pool": (cin, pool_features, 1, 1, 0)}
    chains = [["branch1x1"], ["branch5x5_1", "branch5x5_2"],
              ["branch3x3dbl_1", "branch3x3dbl_2", "branch3x3dbl_3"]]
    return _Mixed(convs, chains, "avg")


def _block_b(cin: int) -> _Mixed:  # 35x35 -> 17x17
    convs = {"branch3x3": (cin, 384, 3, 2, 0),
             "branch3x3dbl_1": (cin, 64, 1, 1, 0), "branch3x3dbl_2": (64, 96, 3, 1, 1),
             "branch3x3dbl_3": (96, 96, 3, 2, 0)}
    return _Mixed(convs, [["branch3x3"], ["branch3x3dbl_1", "branch3x3dbl_2", "branch3x3dbl_3"]], "reduce")


def _block_c(cin: int, c7: int) -> _Mixed:
    row, col = ((1, 7), (0, 3)), ((7, 1), (3, 0))  # factorised 7x7: (kernel, padding)
    convs = {"branch1x1": (cin, 192, 1, 1, 0),
             "branch7x7_1": (cin, c7, 1, 1, 0), "branch7x7_2": (c7, c7, row[0], 1, row[1]),
             "branch7x7_3": (c7, 192, col[0], 1, col[1]),
             "branch7x7dbl_1": (cin, c7, 1, 1, 0), "branch7x7dbl_2": (c7, c7, col[0], 1, col[1]),
             "branch7x7dbl_3": (c7, c7, row[0], 1, row[1]), "branch7x7dbl_4": (c7, c7, col[0], 1, col[1]),
             "branch7x7dbl_5": (c7, 192, row[0], 1, row[1]),
             "branch_pool": (cin, 192, 1, 1, 0)}
    chains = [["branch1x1"], ["branch7x7_1", "branch7x7_2", "branch7x7_3"],
              [f"branch7x7dbl_{i}" for i in range(1, 6)]]
    return _Mixed(convs, chains, "avg")


def _block_d(cin: int) -> _Mixed:  # 17x17 -> 8x8
    convs = {"branch3x3_1": (cin, 192, 1, 1, 0), "branch3x3_2": (192, 320, 3, 2, 0),
             "branch7x7x3_1": (cin, 192, 1, 1, 0), "branch7x7x3_2": (192, 192, (1, 7), 1, (0, 3)),
             "branch7x7x3_3": (192, 192, (7, 1), 1, (3, 0)), "branch7x7x3_4": (192, 192, 3, 2, 0)}
    chains = [["branch3x3_1", "branch3x3_2"], [f"branch7x7x3_{i}" for i in range(1, 5)]]
    return _Mixed(convs, chains, "reduce")


def _block_e(cin: int, pool: str) -> _Mixed:
    convs = {"branch1x1": (cin, 320, 1, 1, 0),
             "branch3x3_1": (cin, 384, 1, 1, 0), "branch3x3_2a": (384, 384, (1, 3), 1, (0, 1)),
             "branch3x3_2b": (384, 384, (3, 1), 1, (1, 0)),
             "branch3x3dbl_1": (cin, 448, 1, 1, 0), "branch3x3dbl_2": (448, 384, 3, 1, 1),
             "branch3x3dbl_3a": (384, 384, (1, 3), 1, (0, 1)), "branch3x3dbl_3b": (384, 384, (3, 1), 1, (1, 0)),
             "branch_pool": (cin, 192, 1, 1, 0)}
    chains = [["branch1x1"], ["branch3x3_1", ("branch3x3_2a", "branch3x3_2b")],
              ["branch3x3dbl_1", "branch3x3dbl_2", ("branch3x3dbl_3a", "branch3x3dbl_3b")]]
    return _Mixed(convs, chains, pool)


def _resize_tf1(x: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize as TF 1.x resize_bilinear(align_corners=False): source = dest * in/out,
    computed in float32 as TF does, edge-clamped; interpolate along width, then height."""

    def axis(n_in: int):
        scale = torch.tensor(n_in / size, dtype=torch.float32)
        src = torch.arange(size, dtype=torch.float32) * scale
        lo = src.floor().long()
        frac = (src - lo.float()).to(x.dtype).to(x.device)
        return lo.to(x.device), (lo + 1).clamp_max(n_in - 1).to(x.device), frac

    ylo, yhi, fy = axis(x.shape[2])
    xlo, xhi, fx = axis(x.shape[3])
    left, right = x[..., xlo], x[..., xhi]
    rows = left + (right - left) * fx
    top, bottom = rows[:, :, ylo], rows[:, :, yhi]
    return top + (bottom - top) * fy[:, None]


class FIDInceptionV3(nn.Module):
    """The FID InceptionV3 up to its 2048-d average pool (``fc`` is kept for the weights layout only).

    ``forward`` takes [N, 3, H, W] images, uint8 in [0, 255] or floating point in [0, 1] (torchmetrics
    passes either, depending on its ``normalize``), and returns [N, 2048] pool features in the
    network's dtype. Build with ``load_fid_inception(path)``; a bare instance has untrained weights.
    """

    num_features = NUM_FEATURES  # read by torchmetrics' FrechetInceptionDistance(feature=...)

    def __init__(self, preprocess: Preprocess = "pytorch-fid"):
        super().__init__()
        if preprocess not in PREPROCESSING:
            raise ValueError(f"preprocess must be one of {PREPROCESSING}, got {preprocess!r}")
        self.preprocess = preprocess
        self.Conv2d_1a_3x3 = _ConvBNReLU(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = _ConvBNReLU(32, 32, 3)
        self.Conv2d_2b_3x3 = _ConvBNReLU(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = _ConvBNReLU(64, 80, 1)
        self.Conv2d_4a_3x3 = _ConvBNReLU(80, 192, 3)
        self.Mixed_5b = _block_a(192, 32)
        self.Mixed_5c = _block_a(256, 64)
        self.Mixed_5d = _block_a(288, 64)
        self.Mixed_6a = _block_b(288)
        self.Mixed_6b = _block_c(768, 128)
        self.Mixed_6c = _block_c(768, 160)
        self.Mixed_6d = _block_c(768, 160)
        self.Mixed_6e = _block_c(768, 192)
        self.Mixed_7a = _block_d(768)
        self.Mixed_7b = _block_e(1280, "avg")
        self.Mixed_7c = _block_e(2048, "max")
        self.fc = nn.Linear(NUM_FEATURES, 1008)  # the 1008 TF classes; unused for features
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> "FIDInceptionV3":
        return super().train(False)  # frozen: batch norm always uses the running statistics

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """Images -> [N, 3, 299, 299] in [-1, 1], in the network's dtype and on its device."""
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"FID Inception takes [N, 3, H, W] images, got {tuple(images.shape)}")
        w = self.Conv2d_1a_3x3.conv.weight
        x = images.to(device=w.device)
        integer = not x.is_floating_point()
        x = x.to(w.dtype)
        if self.preprocess == "pytorch-fid":  # works on [0, 1]: resize, then 2x - 1
            if integer:
                x = x / 255
            x = F.interpolate(x, size=(INPUT_SIZE, INPUT_SIZE), mode="bilinear", align_corners=False)
            return 2 * x - 1
        if not integer:  # torch-fidelity works on [0, 255]: TF resize, then (x - 128) / 128
            x = x * 255
        return (_resize_tf1(x, INPUT_SIZE) - 128) / 128

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.pool_features(self.prepare(images))

    def pool_features(self, x: torch.Tensor) -> torch.Tensor:
        """[N, 3, 299, 299] prepared input in [-1, 1] -> [N, 2048] average-pool features."""
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, 3, 2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, 3, 2)
        for name in ("Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d",
                     "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c"):
            x = getattr(self, name)(x)
        return x.mean(dim=(2, 3))


def _is_counter(key: str) -> bool:
    # batch norm's step counter: absent from older files, never used in eval mode
    return key.endswith("num_batches_tracked")


def weights_layout() -> dict[str, tuple[int, ...]]:
    """Key -> shape of the FID Inception weights file (batch-norm step counters left out)."""
    with torch.device("meta"):  # shapes only: no memory, no random init
        net = FIDInceptionV3()
    return {k: tuple(v.shape) for k, v in net.state_dict().items() if not _is_counter(k)}


def check_state_dict(state: object, source: str = "state dict") -> None:
    """Raise ValueError naming the first missing key, unexpected key or wrong shape."""
    if not isinstance(state, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()):
        raise ValueError(f"{source} is not a state dict of tensors (the FID Inception weights file "
                         f"{WEIGHTS_FILE} is one)")
    layout = weights_layout()
    given = {k: v for k, v in state.items() if not _is_counter(k)}
    missing = [k for k in layout if k not in given]
    unexpected = [k for k in given if k not in layout]
    problems = []
    if missing:
        problems.append(f"missing key {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if unexpected:
        problems.append(f"unexpected key {unexpected[0]!r}"
                        + (f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""))
    wrong = [k for k in layout if k in given and tuple(given[k].shape) != layout[k]]
    if wrong:
        k = wrong[0]
        problems.append(f"{k!r} has shape {tuple(given[k].shape)}, expected {layout[k]}")
    if problems:
        raise ValueError(f"{source} does not match the FID InceptionV3 layout ({WEIGHTS_FILE}): "
                         + "; ".join(problems))


def load_fid_inception(path: PathLike, preprocess: Preprocess = "pytorch-fid",
                       device: str | torch.device | None = None,
                       dtype: torch.dtype = torch.float32) -> FIDInceptionV3:
    """The FID InceptionV3 with weights from a local file (read with ``torch.load(weights_only=True)``,
    so only tensors are ever unpickled), frozen, in eval mode."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"FID Inception weights not found at {path}: download {WEIGHTS_FILE} from "
                                f"{WEIGHTS_URL} (or torch-fidelity's {TORCH_FIDELITY_WEIGHTS_FILE}) and pass its path")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"cannot read FID Inception weights {path} as a plain state dict: {exc}") from exc
    check_state_dict(state, str(path))
    net = FIDInceptionV3(preprocess)
    # the step counters may be absent from the file: load the rest strictly (checked above)
    net.load_state_dict({k: v for k, v in state.items() if not _is_counter(k)}, strict=False)
    return net.to(device=device, dtype=dtype)


@torch.no_grad()
def inception_features(images: torch.Tensor, net: nn.Module, data_range: tuple[float, float] = (-1.0, 1.0),
                       batch_size: int = 200, quantize: bool = True) -> torch.Tensor:
    """float64 [N, d] features of images [N, C, H, W] in ``data_range`` (grey images repeated to RGB).

    With ``quantize`` (default) images are first rounded to 8 bits, as if saved to PNG and read
    back, so that features agree with those pytorch-fid computes from image files.
    """
    lo, hi = data_range
    if images.dim() != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"images must be [N, 1 or 3, H, W], got {tuple(images.shape)}")
    feats = []
    for b in images.split(batch_size):
        u = (b.detach().float() - lo) / (hi - lo)
        x = (u * 255).round().clamp(0, 255).to(torch.uint8) if quantize else u.clamp(0, 1)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        feats.append(net(x).double().cpu())
    return torch.cat(feats)


def random_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic random weights in the weights file's layout, for tests only (not a trained network).

    Keys in sorted order each draw from one float64 ``torch.rand`` stream seeded with ``seed``:
    conv weights uniform with He variance 2 / fan_in, batch-norm weight in [0.8, 1.2], bias and
    running mean in [-0.1, 0.1], running variance in [0.5, 1.5] (activations keep their scale
    through the 94 layers), fc in [-0.01, 0.01]; step counters 0. Stored as float32.
    """
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape in sorted(weights_layout().items()):
        u = torch.rand(shape, generator=g, dtype=torch.float64)
        if key.endswith("conv.weight"):
            fan_in = shape[1] * shape[2] * shape[3]
            v = (2 * u - 1) * math.sqrt(6 / fan_in)
        elif key.endswith("bn.weight"):
            v = 0.8 + 0.4 * u
        elif key.endswith("bn.running_var"):
            v = 0.5 + u
        elif key.endswith(("bn.bias", "bn.running_mean")):
            v = 0.2 * u - 0.1
        else:  # fc
            v = 0.02 * u - 0.01
        out[key] = v.float()
        if key.endswith("bn.running_var"):
            out[key[: -len("running_var")] + "num_batches_tracked"] = torch.tensor(0)
    return out
