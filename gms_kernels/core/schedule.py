"""Noise schedules and sampling trajectories (step 1 of the pipeline).

Forward process (Eq. (1) of the GMS paper, https://arxiv.org/abs/2311.00941):
q(x_t | x_0) = N(a_t x_0, sigma_t^2 I) with
a_t = sqrt(abar_t), sigma_t = sqrt(1 - abar_t), abar_t = prod_{i<=t} (1 - beta_i).
Time indices are 0-based, t in [0, T-1]; the pseudo-index ``DATA = -1`` stands for clean data
(a = 1, sigma = 0), so the final "denoise" step is the ordinary step t -> DATA.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Sequence

import torch

from .devices import as_tensor_on
from .user_warnings import warn_user

DATA = -1  # pseudo time index of the clean data (a = 1, sigma = 0)

TRAJECTORY_KINDS = ("even", "linear", "quad", "leading", "trailing", "linspace")


def time_index(value: object, name: str = "time index") -> int:
    """``value`` as an integer time index; a fractional one (999.7) is refused rather than truncated."""
    if torch.is_tensor(value) and value.numel() == 1:
        value = value.item()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
        return int(value)
    raise ValueError(f"{name} must be an integer time index (0 <= t < T, or -1 for data), got {value!r}")


@dataclass(frozen=True)
class StepCoefficients:
    """Exact fp64 scalars of one reverse step t -> s.

    q(x_s | x_t, x_0) = N(c1 x_t + c2 x_0, lam2), with a_{t|s} = a_t / a_s and
    beta_{t|s} = sigma_t^2 - a_{t|s}^2 sigma_s^2.
    """

    t: int
    s: int
    a_t: float
    sigma_t: float
    a_s: float
    sigma_s: float
    a_ts: float
    beta_ts: float
    c1: float
    c2: float
    lam2: float


class Schedule:
    """A discrete variance-preserving noise schedule, float64 inside.

    Build with :meth:`linear`, :meth:`cosine` or :meth:`from_betas`.
    """

    def __init__(self, betas: torch.Tensor | Sequence[float]):
        try:
            betas = as_tensor_on(betas, torch.float64).flatten().cpu()
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"a Schedule is built from betas, a 1-D sequence of numbers in (0, 1), got "
                            f"{type(betas).__name__} {betas!r:.60}; or use gk.Schedule.linear() / .cosine()") from None
        if betas.numel() < 1:
            raise ValueError("a schedule needs at least one beta")
        if not torch.isfinite(betas).all() or (betas <= 0).any() or (betas >= 1).any():
            raise ValueError("betas must be finite and lie in the open interval (0, 1)")
        if betas.numel() >= 2**16:
            raise ValueError(f"T = {betas.numel()} is too large: at most 65535 time steps are supported")
        self.betas = betas
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        # a_t and sigma_t as Python floats: a step reads four of them (tensor indexing costs ~us each)
        self._a = self.alphas_cumprod.sqrt().tolist()
        self._sigma = (1.0 - self.alphas_cumprod).sqrt().tolist()
        # the same values as tensors, with DATA's (1, 0) last, so that index -1 reads them
        self._a_table = torch.tensor(self._a + [1.0], dtype=torch.float64, device="cpu")
        self._sigma_table = torch.tensor(self._sigma + [0.0], dtype=torch.float64, device="cpu")
        # the VE grid once, here: index_of_ve_sigma searches it at every call
        self._ve_sigmas = ((1.0 - self.alphas_cumprod) / self.alphas_cumprod).sqrt()
        self._coefficients: dict[tuple[int, int], StepCoefficients] = {}  # (frozen values, so shareable)

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def linear(cls, T: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02) -> "Schedule":
        """DDPM's linear betas (Ho et al. 2020)."""
        return cls(torch.linspace(beta_start, beta_end, T, dtype=torch.float64, device="cpu"))

    @classmethod
    def cosine(cls, T: int = 1000, s: float = 0.008, max_beta: float = 0.999) -> "Schedule":
        """improved-diffusion's cosine schedule: abar(u) = cos((u + s)/(1 + s) * pi/2)^2, beta capped."""

        def abar(u: float) -> float:
            return math.cos((u + s) / (1 + s) * math.pi / 2) ** 2

        betas = [min(1 - abar((i + 1) / T) / abar(i / T), max_beta) for i in range(T)]
        return cls(betas)

    @classmethod
    def from_betas(cls, betas: torch.Tensor | Sequence[float]) -> "Schedule":
        return cls(betas)

    # -- exact per-time quantities ---------------------------------------------------------------
    @property
    def T(self) -> int:
        return self.betas.numel()

    def _check(self, t: int) -> int:
        t = time_index(t)
        if not DATA <= t < self.T:
            raise ValueError(f"time index {t} is out of range: use 0 <= t < T = {self.T} (or -1 for data)")
        return t

    def alpha(self, t: int) -> float:
        """a_t = sqrt(abar_t); a = 1 at t = DATA."""
        t = self._check(t)
        return 1.0 if t == DATA else self._a[t]

    def sigma(self, t: int) -> float:
        """sigma_t = sqrt(1 - abar_t); sigma = 0 at t = DATA."""
        t = self._check(t)
        return 0.0 if t == DATA else self._sigma[t]

    def coefficients(self, t: int, s: int) -> StepCoefficients:
        """Step quantities of t -> s (s < t), as in the paper's appendix B (Eq. (26))."""
        t, s = time_index(t, "t"), time_index(s, "s")
        cached = self._coefficients.get((t, s))
        if cached is not None:
            return cached
        t, s = self._check(t), self._check(s)
        if t == DATA:
            raise ValueError("t must be a time index in [0, T); -1 (data) is only valid for s")
        if s >= t:
            raise ValueError(f"a reverse step needs s < t, got t={t}, s={s}")
        a_t, sig_t, a_s, sig_s = self.alpha(t), self.sigma(t), self.alpha(s), self.sigma(s)
        a_ts = a_t / a_s
        beta_ts = sig_t**2 - a_ts**2 * sig_s**2
        k = StepCoefficients(
            t=t, s=s, a_t=a_t, sigma_t=sig_t, a_s=a_s, sigma_s=sig_s, a_ts=a_ts, beta_ts=beta_ts,
            c1=a_ts * sig_s**2 / sig_t**2,
            c2=a_s * beta_ts / sig_t**2,
            lam2=sig_s**2 * beta_ts / sig_t**2,
        )
        self._coefficients[(t, s)] = k
        return k

    # -- the sigma (variance-exploding) view, for samplers written in sigma (EDM, SEEDS, GGF) -----
    def ve_sigma(self, t: int) -> float:
        """sigma_t / a_t = sqrt(1 - abar_t) / sqrt(abar_t): the noise level of x_t / a_t = x_0 + (sigma_t / a_t) eps
        (EDM's sigma; exp(-lambda_t) with lambda_t the half log-SNR of DPM-Solver/SEEDS); 0 at t = DATA."""
        t = self._check(t)
        return 0.0 if t == DATA else self._sigma[t] / self._a[t]

    @property
    def ve_sigmas(self) -> torch.Tensor:
        """:meth:`ve_sigma` of every index 0 .. T-1 (float64, increasing)."""
        return self._ve_sigmas.clone()

    def index_of_ve_sigma(self, sigma: torch.Tensor | float) -> torch.Tensor:
        """The time index whose :meth:`ve_sigma` is nearest to ``sigma`` (absolute distance), per element.

        This is how EDM evaluates a discrete-time VP model at an arbitrary noise level (its
        ``round_sigma`` for iDDPM/ADM models): the noise level is rounded to the nearest one the network
        was trained on, never interpolated. Levels above the grid give T-1, below it 0.
        """
        sigma = as_tensor_on(sigma, torch.float64)
        grid = self.ve_sigmas
        hi = torch.searchsorted(grid, sigma.reshape(-1).contiguous()).clamp(1, self.T - 1)
        lo = hi - 1
        flat = sigma.reshape(-1)
        nearest = torch.where((flat - grid[lo]).abs() <= (grid[hi] - flat).abs(), lo, hi)
        if self.T == 1:
            nearest = torch.zeros_like(hi)
        return nearest.reshape(sigma.shape)

    def log_alpha_bar_at(self, u: torch.Tensor) -> torch.Tensor:
        """log abar at continuous time u in [0, 1]: index t sits at u = (t + 1) / T and data at u = 0, with log abar
        linear in between (so the continuous VP SDE's beta(u) = -d log abar / du is constant on each interval,
        -T log(1 - beta_t) on ((t) / T, (t + 1) / T]). Used by the adaptive GGF sampler."""
        u = as_tensor_on(u, torch.float64)
        # at u = 0, 1/T, ..., 1
        knots = torch.cat([self.alphas_cumprod.new_zeros(1), self.alphas_cumprod.log()])
        pos = u.clamp(0.0, 1.0) * self.T
        left = pos.floor().long().clamp(max=self.T - 1)  # (u = 1 is the last interval's right end)
        frac = pos - left
        return knots[left] + frac * (knots[left + 1] - knots[left])

    def beta_at(self, u: torch.Tensor) -> torch.Tensor:
        """beta(u) = -d log abar / du of :meth:`log_alpha_bar_at` (the left limit at a knot: the interval below u)."""
        u = as_tensor_on(u, torch.float64)
        # a knot counts as below; u <= 0 is the first interval, u >= 1 the last
        interval = (u.clamp(max=1.0) * self.T - 1e-9).ceil().clamp_min(1).long() - 1
        return -self.T * torch.log1p(-self.betas[interval])

    def index_at(self, u: torch.Tensor) -> torch.Tensor:
        """The time index at which to evaluate the network for continuous time u: the index whose noise level is
        nearest to abar(u)'s (:meth:`index_of_ve_sigma`, EDM's rounding)."""
        log_abar = self.log_alpha_bar_at(u)
        return self.index_of_ve_sigma(torch.expm1(-log_abar).clamp_min(0.0).sqrt())

    def alpha_sigma(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(a_t, sigma_t) of a tensor of integer time indices, element by element: float64 tensors of t's shape
        on t's device, the values of :meth:`alpha` and :meth:`sigma` (a = 1, sigma = 0 at DATA)."""
        if not torch.is_tensor(t) or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"time indices must be an integer tensor (e.g. torch.long), got "
                            f"{t.dtype if torch.is_tensor(t) else type(t).__name__}")
        if t.numel() and not (DATA <= int(t.min()) and int(t.max()) < self.T):
            raise ValueError(f"time indices must lie in [0, T = {self.T}) (or be -1 for data), got "
                             f"{int(t.min())} .. {int(t.max())}")
        index = t.long().cpu()
        return self._a_table[index].to(t.device), self._sigma_table[index].to(t.device)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: int | torch.Tensor) -> torch.Tensor:
        """x_t = a_t x_0 + sigma_t eps (Eq. (1)). ``t``: one time index for the whole batch, or an integer tensor
        [N] of one index per sample (x0: [N, ...]); either way a_t and sigma_t are the float64 values of
        :meth:`alpha` and :meth:`sigma`, applied in the dtype of x0 and noise."""
        if not torch.is_tensor(t) or t.dim() == 0:
            return self.alpha(t) * x0 + self.sigma(t) * noise
        if t.dim() != 1 or t.shape[0] != x0.shape[0]:
            raise ValueError(f"t must be one time index or a tensor [N] of one per sample, N = {x0.shape[0]} (the "
                             f"first dimension of x0 {tuple(x0.shape)}), got shape {tuple(t.shape)}")
        a, sigma = (v.to(device=x0.device, dtype=torch.promote_types(x0.dtype, noise.dtype))
                    .reshape(-1, *[1] * (x0.dim() - 1)) for v in self.alpha_sigma(t))
        return a * x0 + sigma * noise

    def __repr__(self) -> str:
        return f"Schedule(T={self.T}, beta[0]={float(self.betas[0]):.3g}, beta[-1]={float(self.betas[-1]):.3g})"


BETA_SCHEDULES = ("linear", "scaled_linear", "cosine", "squaredcos_cap_v2", "sigmoid")


def make_betas(num_train_timesteps: int, beta_start: float, beta_end: float, beta_schedule: str,
               trained_betas: Sequence[float] | None = None) -> torch.Tensor:
    """float64 betas for a diffusers-style schedule name.

    ``linear`` (DDPM), ``scaled_linear`` (linear in sqrt(beta), latent diffusion), ``cosine`` =
    ``squaredcos_cap_v2`` (improved-diffusion's cosine, beta capped at 0.999; beta_start/end unused),
    ``sigmoid`` (GeoDiff). ``trained_betas`` overrides all of them.
    """
    if trained_betas is not None:
        return torch.tensor(list(trained_betas), dtype=torch.float64, device="cpu")
    T = int(num_train_timesteps)
    if T < 1:
        raise ValueError(f"num_train_timesteps must be >= 1, got {num_train_timesteps}")
    if beta_schedule == "linear":
        return Schedule.linear(T, beta_start, beta_end).betas
    if beta_schedule == "scaled_linear":
        return torch.linspace(beta_start**0.5, beta_end**0.5, T, dtype=torch.float64, device="cpu") ** 2
    if beta_schedule in ("cosine", "squaredcos_cap_v2"):
        return Schedule.cosine(T).betas
    if beta_schedule == "sigmoid":
        return torch.sigmoid(torch.linspace(-6.0, 6.0, T, dtype=torch.float64, device="cpu")) * (beta_end - beta_start) + beta_start
    raise ValueError(f"unknown beta_schedule {beta_schedule!r}; valid: {', '.join(BETA_SCHEDULES)} "
                     "(or pass trained_betas)")


def diffusers_schedule(config: Mapping) -> Schedule:
    """The training schedule of a diffusers scheduler config (DDPMScheduler, DDIMScheduler, GMSScheduler, ...):
    its ``trained_betas``, else ``beta_schedule`` on ``num_train_timesteps`` as diffusers computes it (float64)."""
    if config.get("rescale_betas_zero_snr"):
        raise ValueError("the diffusers scheduler config has rescale_betas_zero_snr=True: a zero terminal SNR "
                         "(a_T = 0) leaves E[x0 | x_T] undefined, so gms_kernels cannot sample with it; use its config "
                         "with rescale_betas_zero_snr=False, or pass a gk.Schedule")
    return Schedule(make_betas(config.get("num_train_timesteps", 1000), config.get("beta_start", 1e-4),
                               config.get("beta_end", 0.02), config.get("beta_schedule", "linear"),
                               config.get("trained_betas")))


def schedule_for(model: object, schedule: object = None) -> Schedule:
    """The schedule a sampler or trainer uses: ``schedule`` if given (see :func:`check_schedule`), else the
    model's own (its ``schedule`` attribute, as the loaders set it), else the linear DDPM schedule, with a
    warning when the model says its schedule was looked for and not found (``schedule_note``: a diffusers
    UNet2DModel without its pipeline's scheduler config)."""
    if schedule is not None:
        return check_schedule(schedule)
    own = getattr(model, "schedule", None)
    if own is not None:
        return own
    note = getattr(model, "schedule_note", None)
    if note:
        warn_user(f"the model's training schedule is unknown ({note}): assuming DDPM's linear betas (1e-4 to "
                  "0.02, T = 1000). Pass schedule= (a gk.Schedule, the pipeline's diffusers scheduler or its "
                  "config) if it was trained with another")
    return Schedule.linear()


def check_schedule(schedule: object) -> Schedule:
    """``schedule`` as a :class:`Schedule`: itself, the ``schedule`` of a gk.GMSScheduler, or the betas of a
    diffusers scheduler (DDPMScheduler, DDIMScheduler, ...) or of its config (``trained_betas``, else
    ``beta_schedule`` on ``num_train_timesteps``, in float64 as GMSScheduler computes them); else a TypeError
    that says how to make one."""
    if isinstance(schedule, Schedule):
        return schedule
    own = getattr(schedule, "schedule", None)
    if isinstance(own, Schedule) and hasattr(schedule, "set_timesteps"):  # a GMSScheduler
        return own
    config = getattr(schedule, "config", schedule)
    if isinstance(config, Mapping) and "beta_schedule" in config and "num_train_timesteps" in config:
        return diffusers_schedule(config)
    raise TypeError(f"schedule must be a gk.Schedule, a diffusers scheduler (e.g. DDPMScheduler.from_pretrained(DIR, "
                    f"subfolder='scheduler')) or its config, got {type(schedule).__name__} {schedule!r:.60}: or build "
                    "one with gk.Schedule.linear(T), gk.Schedule.cosine(T) or gk.Schedule.from_betas(betas)")


def trajectory(schedule: Schedule | int, steps: int, kind: str | Sequence[int] = "even") -> list[int]:
    """Descending time indices visited by a sampler; the sampler then steps from the last one to data.

    kinds: ``"even"`` (the official GMS list: t_i = max(int(T-1-i*T/K), 0), then 0 appended if
    missing), ``"linear"`` and ``"quad"`` (Analytic-DPM family: K+1 points from T-1 to 0, evenly
    spaced in t or in sqrt(t)), ``"leading"``, ``"trailing"`` and ``"linspace"`` (diffusers'
    timestep spacings), or an explicit descending list of indices.
    """
    T = schedule if isinstance(schedule, int) else schedule.T
    if not isinstance(kind, str):
        if torch.is_tensor(kind):
            kind = kind.reshape(-1).tolist()
        if not hasattr(kind, "__iter__"):
            raise TypeError(f"trajectory must be a kind ({', '.join(TRAJECTORY_KINDS)}) or a descending list of "
                            f"integer time indices, got {type(kind).__name__} {kind!r}")
        ts = [time_index(t, "every trajectory entry") for t in kind]
        if not ts:
            raise ValueError("an explicit trajectory needs at least one time index")
        if any(not 0 <= t < T for t in ts):
            raise ValueError(f"explicit trajectory indices must lie in [0, {T - 1}], got {ts}")
        if any(a <= b for a, b in zip(ts, ts[1:])):
            raise ValueError(f"an explicit trajectory must be strictly descending, got {ts}")
        return ts
    if kind not in TRAJECTORY_KINDS:
        raise ValueError(f"unknown trajectory kind {kind!r}; valid kinds: {', '.join(TRAJECTORY_KINDS)} "
                         "or an explicit descending list of time indices")
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or not 1 <= steps <= T:
        raise ValueError(f"steps must be an integer in [1, T = {T}], got {steps!r}")
    K = int(steps)
    if kind == "even":
        r = T / K
        ts = [max(int(T - 1 - r * i), 0) for i in range(K)]
        if ts[-1] != 0:
            ts.append(0)
    elif kind == "linear":
        ts = [round((T - 1) * (K - i) / K) for i in range(K + 1)]
    elif kind == "quad":
        ts = [round((math.sqrt(T - 1) * (K - i) / K) ** 2) for i in range(K + 1)]
    elif kind == "leading":
        ratio = T // K
        ts = [i * ratio for i in reversed(range(K))]
    elif kind == "trailing":
        ts = [round(T - i * T / K) - 1 for i in range(K)]
    else:  # "linspace"
        ts = [round((T - 1) * (K - 1 - i) / max(K - 1, 1)) for i in range(K)]
    return _strictly_descending(ts, T)


def karras_trajectory(schedule: Schedule, steps: int, rho: float = 7.0) -> list[int]:
    """EDM's time discretisation (Karras et al. 2022, Eq. 5) on a discrete schedule: K+1 noise levels from
    index T-1's to index 0's, evenly spaced in sigma^(1/rho) (sigma = :meth:`Schedule.ve_sigma`), each
    rounded to the nearest index as EDM does for discrete models. Pass it as ``trajectory=`` (an explicit
    list) to run EDM-SDE on its own grid: its steps shrink toward the data, where the even grid's first
    step jumps from sigma 157 to 3.4 at K = 2 (linear schedule)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= schedule.T:
        raise ValueError(f"steps must be an integer in [1, T = {schedule.T}], got {steps!r}")
    if not (isinstance(rho, (int, float)) and math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be a positive number, got {rho!r}")
    top, bottom = schedule.ve_sigma(schedule.T - 1) ** (1 / rho), schedule.ve_sigma(0) ** (1 / rho)
    levels = torch.tensor([(top + i / steps * (bottom - top)) ** rho for i in range(steps + 1)],
                          dtype=torch.float64, device="cpu")
    return _strictly_descending([int(t) for t in schedule.index_of_ve_sigma(levels)], schedule.T)


def _strictly_descending(ts: list[int], T: int) -> list[int]:
    """Resolve collisions from rounding (dense quad/linear lists) by nudging later points up."""
    out: list[int] = []
    for t in reversed(ts):  # ascending
        out.append(t if not out else max(t, out[-1] + 1))
    return sorted({min(t, T - 1) for t in out}, reverse=True)
