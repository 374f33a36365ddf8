"""Sample-quality metrics against data: Wasserstein-1, sliced W1, KDE log-likelihood, energy distance,
Fréchet distances (FD-digits, FD-|DCT| for image patches, and FID with the torch-only InceptionV3 of
gms_kernels.eval.inception)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence

import torch

from ..core.extras import require


def _flat2d(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to(torch.float64).reshape(x.shape[0], -1).cpu()


def wasserstein1(x: torch.Tensor, y: torch.Tensor) -> float:
    """Exact W1 between two 1-D empirical distributions (any sizes): the integral of |F_x - F_y|."""
    if x.numel() == 0 or y.numel() == 0:
        raise ValueError("W1 needs non-empty samples")
    x, y = _flat2d(x).flatten(), _flat2d(y).flatten()
    if x.numel() == y.numel():  # equal sizes: the mean gap between order statistics
        return float((x.sort().values - y.sort().values).abs().mean())
    points = torch.cat([x, y]).sort().values
    # the CDFs in float64 (integer counts divided by an int would give torch's default float32)
    f_x = torch.searchsorted(x.sort().values, points[:-1], right=True).double() / x.numel()
    f_y = torch.searchsorted(y.sort().values, points[:-1], right=True).double() / y.numel()
    return float(((f_x - f_y).abs() * points.diff()).sum())


def sliced_wasserstein1(x: torch.Tensor, y: torch.Tensor, n_projections: int = 128, seed: int = 0) -> float:
    """Mean W1 of the projections on ``n_projections`` random unit directions (seeded); exact W1 in 1-D."""
    x, y = _flat2d(x), _flat2d(y)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"dimension mismatch: {x.shape[1]} vs {y.shape[1]}")
    if x.shape[1] == 1:
        return wasserstein1(x, y)
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(x.shape[1], n_projections, generator=g, dtype=torch.float64, device="cpu").to(x.device)
    dirs = dirs / dirs.norm(dim=0, keepdim=True)
    px, py = x @ dirs, y @ dirs
    if px.shape[0] == py.shape[0]:  # equal sizes: W1 is the mean gap between sorted projections
        return float((px.sort(dim=0).values - py.sort(dim=0).values).abs().mean())
    return sum(wasserstein1(px[:, i], py[:, i]) for i in range(n_projections)) / n_projections


def kde_bandwidth(data: torch.Tensor, n_samples: int) -> float:
    """The GMS paper's bandwidth 1.05 * std(data) * L^-0.25 (its appendix D.1, https://arxiv.org/abs/2311.00941)."""
    return 1.05 * float(_flat2d(data).std()) * n_samples ** -0.25


def kde_log_likelihood(samples: torch.Tensor, data: torch.Tensor, bandwidth: float | None = None,
                       chunk: int = 2048) -> float:
    """Mean log density of ``data`` under a Gaussian KDE of ``samples`` (isotropic kernel).

    The bandwidth defaults to the paper's 1.05 * std(data) * L^-0.25 with L = len(samples).
    Distances are summed in float32 (the log-sum-exp is stable; the result agrees with fp64 to ~1e-6).
    """
    s, d = _flat2d(samples), _flat2d(data)
    h = kde_bandwidth(d, s.shape[0]) if bandwidth is None else float(bandwidth)
    if not h > 0:
        raise ValueError(f"the KDE bandwidth must be positive, got {h}")
    dim = s.shape[1]
    norm = math.log(s.shape[0]) + 0.5 * dim * math.log(2 * math.pi * h * h)
    s32 = (s / h).float()
    total = 0.0
    for rows in (d / h).float().split(chunk):
        total += float(torch.logsumexp(-0.5 * torch.cdist(rows, s32).pow(2), dim=1).double().sum())
    return total / d.shape[0] - norm


def energy_distance(x: torch.Tensor, y: torch.Tensor, max_points: int = 5000, seed: int = 0) -> float:
    """Energy distance 2E|X-Y| - E|X-X'| - E|Y-Y'| on at most ``max_points`` of each (seeded subsets)."""
    g = torch.Generator().manual_seed(seed)

    def subset(z: torch.Tensor) -> torch.Tensor:
        z = _flat2d(z)
        if z.shape[0] <= max_points:
            return z
        return z[torch.randperm(z.shape[0], generator=g, device="cpu")[:max_points].to(z.device)]

    x, y = subset(x), subset(y)

    def mean_dist(a: torch.Tensor, b: torch.Tensor) -> float:
        return sum(float(torch.cdist(r, b).sum()) for r in a.split(1024)) / (a.shape[0] * b.shape[0])

    return 2 * mean_dist(x, y) - mean_dist(x, x) - mean_dist(y, y)


def gaussian_stats(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance (float64) of features [N, d]."""
    f = _flat2d(features)
    if f.shape[0] < 2:
        raise ValueError("need at least two feature vectors for a covariance")
    return f.mean(0), torch.cov(f.T).reshape(f.shape[1], f.shape[1])


def _frechet(mu1: torch.Tensor, factor1: torch.Tensor, trace1: torch.Tensor, mu2: torch.Tensor,
             s2: torch.Tensor) -> float:
    """||mu1 - mu2||^2 + tr S1 + tr S2 - 2 tr (S1 S2)^1/2 for S1 = F F^T (F = ``factor1`` [d, k], float64).
    The eigenvalues of S1 S2 are those of S1^1/2 S2 S1^1/2, and their nonzero ones those of the symmetric PSD
    k x k matrix F^T S2 F, so tr (S1 S2)^1/2 = sum sqrt(eig(F^T S2 F))."""
    m = factor1.T @ ((s2 + s2.T) / 2) @ factor1
    tr_sqrt = torch.linalg.eigvalsh((m + m.T) / 2).clamp_min(0).sqrt().sum()
    return float((mu1 - mu2).pow(2).sum() + trace1 + torch.trace(s2) - 2 * tr_sqrt)


def frechet_distance(mu1: torch.Tensor, sigma1: torch.Tensor, mu2: torch.Tensor, sigma2: torch.Tensor) -> float:
    """||mu1 - mu2||^2 + tr(S1 + S2 - 2 (S1 S2)^1/2), with tr (S1 S2)^1/2 computed stably as
    sum sqrt(eig(S1^1/2 S2 S1^1/2)) on symmetric PSD matrices (float64)."""
    mu1, mu2 = mu1.double().flatten(), mu2.double().flatten()
    s1, s2 = sigma1.double(), sigma2.double()
    if mu1.shape != mu2.shape or s1.shape != s2.shape or s1.shape != (mu1.numel(), mu1.numel()):
        raise ValueError(f"mismatched statistics: mu {tuple(mu1.shape)} / {tuple(mu2.shape)}, "
                         f"sigma {tuple(s1.shape)} / {tuple(s2.shape)}")
    vals, vecs = torch.linalg.eigh((s1 + s1.T) / 2)
    keep = vals > 0  # (S1 = F F^T with F = V diag(sqrt vals); the directions with vals <= 0 add nothing)
    return _frechet(mu1, vecs[:, keep] * vals[keep].sqrt(), torch.trace(s1), mu2, s2)


def frechet_distance_features(features: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor) -> float:
    """``frechet_distance(*gaussian_stats(features), mu, sigma)`` for features [n, d], computed from the
    features themselves when n <= d (a few samples in the 2048-d Inception space): with X the centred
    features, S1 = X^T X / (n - 1), so tr S1 = ||X||^2 / (n - 1) and tr (S1 S2)^1/2 comes from the n x n
    matrix X S2 X^T / (n - 1), with no d x d eigendecomposition."""
    f = _flat2d(features)
    n, d = f.shape
    if n > d:
        return frechet_distance(*gaussian_stats(f), mu, sigma)
    if n < 2:
        raise ValueError("need at least two feature vectors for a covariance")
    mu1, mu2, s2 = f.mean(0), mu.double().flatten().cpu(), sigma.double().cpu()
    if mu2.shape != (d,) or s2.shape != (d, d):
        raise ValueError(f"mismatched statistics: features of dimension {d}, mu {tuple(mu2.shape)}, "
                         f"sigma {tuple(s2.shape)}")
    x = (f - mu1) / math.sqrt(n - 1)
    return _frechet(mu1, x.T, x.pow(2).sum(), mu2, s2)


def dct_matrix(n: int) -> torch.Tensor:
    """The orthonormal DCT-II matrix [n, n] (float64): row k is sqrt(2/n) c_k cos(pi (2j+1) k / 2n), c_0 = 1/sqrt 2."""
    j = torch.arange(n, dtype=torch.float64, device="cpu")
    m = torch.cos(torch.pi * (2 * j[None, :] + 1) * j[:, None] / (2 * n)) * (2.0 / n) ** 0.5
    m[0] /= 2**0.5
    return m


def dct_features(images: torch.Tensor) -> torch.Tensor:
    """Patch features [N, C*H*W] (float64): the DC coefficient of the orthonormal 2-D DCT of each channel,
    and the absolute values of its AC coefficients.

    Why magnitudes: the Fréchet distance is unchanged by any orthonormal transform of the data, so
    raw DCT coefficients would compare only the pixel mean and covariance. The magnitudes of the AC
    coefficients carry what natural patches add beyond those: sparse, heavy-tailed marginals (a
    smaller E|c| for the same variance) and energy that switches on jointly across frequencies at
    edges (correlated |c|). A Gaussian with the right pixel covariance misses both."""
    if images.dim() != 4:
        raise ValueError(f"dct_features takes images [N, C, H, W], got shape {tuple(images.shape)}")
    x = images.detach().to(torch.float64).cpu()
    dh, dw = dct_matrix(x.shape[2]), dct_matrix(x.shape[3])
    c = dh @ x @ dw.T
    mags = c.abs()
    mags[:, :, 0, 0] = c[:, :, 0, 0]  # the DC coefficient (patch mean) keeps its sign
    return mags.reshape(x.shape[0], -1)


def frechet_distance_dct(samples: torch.Tensor, reference: torch.Tensor) -> float:
    """Fréchet distance between image patches in the DCT-magnitude features of :func:`dct_features`
    ("FD-|DCT|"; fixed and data-independent: no trained network)."""
    return frechet_distance(*gaussian_stats(dct_features(samples)), *gaussian_stats(dct_features(reference)))


def fd_digits(samples: torch.Tensor, reference: torch.Tensor) -> float:
    """Fréchet distance between digits images in the shipped classifier's feature space ("FD-digits")."""
    from .features import digits_features, load_digits_classifier

    net = load_digits_classifier()
    return frechet_distance(*gaussian_stats(digits_features(samples, net)),
                            *gaussian_stats(digits_features(reference, net)))


@torch.no_grad()
def moment_discrepancy(model, x_t: torch.Tensor, t: int, s: int, schedule, data_range=(-1.0, 1.0),
                       time_input: str | None = None) -> torch.Tensor:
    """The GMS paper's Figure 2: per sample, the l2 norm of M3 - M3^(G), the gap between the third moment of
    q(x_s|x_t) from the heads and the one a Gaussian with the same M1 and Var would have
    (M1^3 + 3 M1 Var), i.e. the norm of the central third moment. Returns float64 [N]."""
    from ..model_io import adapt_model, call_model, split_heads
    from ..core.moments import central_third_moment, check_data_range, transition_moments

    model = adapt_model(model)
    time_input = time_input or getattr(model, "time_input", "index")
    heads = [h.double() for h in split_heads(call_model(model, x_t, t, schedule.T, time_input), x_t, 3, "gms")]
    mom = transition_moments(x_t.double(), *heads, schedule.coefficients(t, s), check_data_range(data_range))
    gap = central_third_moment(mom.m1, mom.var, mom.m3)
    return gap.reshape(gap.shape[0], -1).norm(dim=1)


def save_stats(path, mu: torch.Tensor, sigma: torch.Tensor) -> None:
    """Write pytorch-fid statistics (.npz with mu, sigma)."""
    import numpy as np

    np.savez(path, mu=mu.double().cpu().numpy(), sigma=sigma.double().cpu().numpy())


def load_stats(path) -> tuple[torch.Tensor, torch.Tensor]:
    """Read pytorch-fid statistics (.npz with mu, sigma)."""
    import numpy as np

    with np.load(path, allow_pickle=False) as f:
        if "mu" not in f or "sigma" not in f:
            raise ValueError(f"{path} is not a pytorch-fid statistics file (needs arrays mu and sigma)")
        return torch.from_numpy(f["mu"]).double(), torch.from_numpy(f["sigma"]).double()


def fid(samples: torch.Tensor, reference: torch.Tensor | str | os.PathLike | None = None, *,
        weights_path: str | os.PathLike | None = None, inception: torch.nn.Module | None = None,
        data_range: tuple[float, float] = (-1.0, 1.0), batch_size: int = 200,
        preprocess: str = "pytorch-fid", device: str | torch.device | None = None) -> float:
    """FID with the FID InceptionV3 of ``gms_kernels.eval.inception`` (torch only, nothing downloaded).

    ``samples``: images [N, C, H, W] (C = 1 or 3) in ``data_range``, rounded to 8 bits as saved
    images are. ``reference``: images likewise, the path of a pytorch-fid .npz statistics file, or
    statistics (mu, sigma) from :func:`fid_statistics` (to score many runs against one reference).
    The network comes from ``weights_path``, the local file pt_inception-2015-12-05-6726825d.pth
    (see gms_kernels.eval.inception for where to get it), loaded on ``device`` (default: the samples'),
    or is passed ready-made as ``inception`` (e.g. ``load_fid_inception(path, device="cuda")``).
    ``preprocess`` (for the network loaded from ``weights_path``): "pytorch-fid" (default) or
    "torch-fidelity" (TF 1.x resize), to compare with statistics made by either. A distance is never
    negative: for (nearly) identical sets the rounding of the matrix square root can leave it a little
    below 0, which is clamped to 0.
    """
    from .inception import inception_features, load_fid_inception, WEIGHTS_FILE, WEIGHTS_URL

    if inception is None and weights_path is None:
        raise ValueError(f"FID needs InceptionV3 weights and nothing is downloaded: pass weights_path= the local "
                         f"file {WEIGHTS_FILE} (from {WEIGHTS_URL})")
    from_file = isinstance(reference, (str, bytes)) or hasattr(reference, "__fspath__")
    given = isinstance(reference, tuple) and len(reference) == 2 and all(torch.is_tensor(r) for r in reference)
    if not (from_file or given or torch.is_tensor(reference)):
        raise ValueError("reference must be images [N, C, H, W], a pytorch-fid .npz statistics path or "
                         "statistics (mu, sigma)")
    net = inception if inception is not None else load_fid_inception(
        weights_path, preprocess, device=samples.device if device is None else device)
    if from_file:
        ref = load_stats(reference)
    else:
        ref = reference if given else fid_statistics(reference, net, data_range, batch_size)
    return max(0.0, frechet_distance_features(inception_features(samples, net, data_range, batch_size), *ref))


def fid_statistics(images: torch.Tensor, inception: torch.nn.Module, data_range: tuple[float, float] = (-1.0, 1.0),
                   batch_size: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """The (mu, sigma) of the FID Inception features of images [N, C, H, W] in ``data_range`` (what
    :func:`fid` compares; also what pytorch-fid's .npz files hold)."""
    from .inception import inception_features

    return gaussian_stats(inception_features(images, inception, data_range, batch_size))


# -- confidence over seeds ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeedInterval:
    """Mean of a metric over seeds and its two-sided Student-t confidence interval [low, high]."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def __str__(self) -> str:
        return f"{self.mean:.2f} ± {self.half_width:.2f}"


def seed_interval(values: Sequence[float], level: float = 0.95) -> SeedInterval:
    """Mean of ``values`` (one per seed) with its ``level`` Student-t interval, mean ± t_{n-1} sd / sqrt(n).
    Needs at least two values."""
    student_t = require("scipy.stats", "gk.metrics.seed_interval").t

    v = torch.tensor([float(x) for x in values], dtype=torch.float64, device="cpu")
    if v.numel() < 2 or not torch.isfinite(v).all():
        raise ValueError(f"a confidence interval needs at least two finite values, got {v.tolist()}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    n, mean = v.numel(), float(v.mean())
    half = float(student_t.ppf(0.5 + level / 2, n - 1)) * float(v.std()) / math.sqrt(n)
    return SeedInterval(mean, mean - half, mean + half, n)


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[SeedInterval, bool]:
    """The per-seed differences a_i - b_i of two rows measured with the same seeds: their mean with its
    Student-t interval, and whether the difference is significant at ``level`` (the interval excludes 0;
    equivalently a two-sided paired t-test at 1 - level). Pairing removes what the seeds share (the
    same initial noise), so it is sharper than comparing the two intervals."""
    if len(a) != len(b):
        raise ValueError(f"paired rows need one value per seed each, got {len(a)} and {len(b)}")
    diff = seed_interval([float(x) - float(y) for x, y in zip(a, b)], level)
    return diff, not diff.low <= 0.0 <= diff.high
