"""The studies' own solvers: controls that tell one effect of GMS apart from another. They are passed to gk.sample
and gk.step as Solver objects (``solver=CONTROLS["control-rank1"]``) and never enter the library's registry.

- ``control-rank1``: the Gaussian with the mean and covariance of GMS's per-image mixture draw, to tell its gain
  from skewness apart from its gain in covariance;
- ``sn-ddpm-exvar``, ``gms-exvar``: the library's SN-DDPM and GMS steps on transition moments whose excess variance
  Var - lam2 is scaled by ``exvar`` (a number, or a factor per time index), kappa3 kept.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch

from gms_kernels.core.fit import DEFAULT_WEIGHTS, check_var_floor, check_weights, fit_closed
from gms_kernels.core.moments import TransitionMoments, central_third_moment, scale_spread, transition_moments
from gms_kernels.solvers import LastStepOptions, Solver
from gms_kernels.solvers.base import learned_gaussian, real
from gms_kernels.solvers.gms import GMS, GMSOptions, gms_from_moments
from gms_kernels.solvers.sn_ddpm import SNDDPM, SNDDPMOptions, sn_ddpm_from_moments


# -- the rank-one covariance control --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankOneOptions(LastStepOptions):
    """The closed fit's mixture ``weights`` and ``var_floor``, and the variance scale c (as GMS's)."""

    weights: tuple[float, float] = DEFAULT_WEIGHTS
    var_floor: float = 0.1
    variance_scale: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("weights", check_weights(self.weights))
        self._set("var_floor", check_var_floor(self.var_floor))
        self._set("variance_scale", real(self.variance_scale, "variance_scale", 0.0, 100.0, "the factor on Var",
                                         open_low=True))


class RankOneControl(Solver):
    """The per-image draw mu_c + s z (mu1 = M1 + w2 delta, mu2 = M1 - w1 delta, delta = mu1 - mu2, one component
    per image) has mean M1 and covariance diag(s2) + w1 w2 delta delta^T. This step samples that Gaussian as
    M1 + sqrt(w1 w2) delta xi + s z with one xi ~ N(0, 1) per image, xi = Phi^-1(u) from the same per-image uniform
    the mixture draw would use."""

    name, heads, Options = "control-rank1", 3, RankOneOptions

    def step(self, x_t: torch.Tensor, heads: list[torch.Tensor], k, rand, o: RankOneOptions, data_range,
             T: int) -> tuple[torch.Tensor, dict]:
        mom = scale_spread(transition_moments(x_t, heads[0], heads[1], heads[2], k, data_range), o.variance_scale)
        if k.s == 0 and o.gaussian_last_step:
            return learned_gaussian(mom, k, rand, o, data_range)
        w1, w2 = float(o.weights[0]), float(o.weights[1])
        p = fit_closed(mom, o.weights, o.var_floor)
        u = rand.uniform(False).to(torch.float64).clamp(1e-12, 1.0 - 1e-12)
        xi = torch.special.ndtri(u).reshape(-1, *[1] * (x_t.dim() - 1))  # Phi^-1(u)
        x_s = mom.m1 + math.sqrt(w1 * w2) * (p.mu1 - p.mu2) * xi + p.s2.clamp_min(0.0).sqrt() * rand.normal()
        return x_s, {"m1": mom.m1, "mu1": p.mu1, "mu2": p.mu2, "s2": p.s2}

    def heads_read(self, k, o: RankOneOptions) -> int:
        """The Gaussian last step reads e1 and e2."""
        return 2 if k.s == 0 and o.gaussian_last_step else super().heads_read(k, o)


# -- the excess-variance shrinkage ----------------------------------------------------------------------------------
def check_exvar(value: Any) -> float | dict[int, float]:
    """``exvar``: a factor in [0, 100], or a mapping {time index: factor}."""
    if isinstance(value, dict):
        if not value or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0 for t in value):
            raise ValueError(f"exvar as a mapping needs time indices (non-negative integers) as keys, got {value!r}")
        return {int(t): real(v, f"exvar[{t}]", 0.0, 100.0, "the factor on the excess variance")
                for t, v in value.items()}
    return real(value, "exvar", 0.0, 100.0, "the factor on the excess variance (or a mapping {t: factor})")


def exvar_factor_at(factors: float | dict[int, float], t: int) -> float:
    """``factors`` itself, or its entry for the time index t (a t with no entry is refused)."""
    if not isinstance(factors, dict):
        return float(factors)
    if t not in factors:
        raise ValueError(f"no exvar factor for t={t} (the table has t = {', '.join(map(str, sorted(factors)))})")
    return factors[t]


def shrink_excess_variance(mom: TransitionMoments, k, f: float) -> TransitionMoments:
    """(M1, lam2 + f (Var - lam2), M3') whose central third moment, with Var clamped at 0 as the fits take it, is
    the original one; f = 1 returns ``mom``."""
    if f == 1.0 or mom.var is None:
        return mom
    var = k.lam2 + f * (mom.var - k.lam2)
    m3 = None
    if mom.m3 is not None:
        kappa3 = central_third_moment(mom.m1, mom.var.clamp_min(0.0), mom.m3)
        m3 = kappa3 + 3 * mom.m1 * var.clamp_min(0.0) + mom.m1**3
    return TransitionMoments(mom.m1, var, m3)


@dataclass(frozen=True)
class SNDDPMExvarOptions(SNDDPMOptions):
    exvar: float | dict[int, float] = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("exvar", check_exvar(self.exvar))


@dataclass(frozen=True)
class GMSExvarOptions(GMSOptions):
    exvar: float | dict[int, float] = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("exvar", check_exvar(self.exvar))


class SNDDPMExvar(SNDDPM):
    """The library's SN-DDPM step with the excess variance times ``exvar``; the float64 torch path only."""

    name, Options, label, in_paper = "sn-ddpm-exvar", SNDDPMExvarOptions, "", False
    fused_config = Solver.fused_config

    def step(self, x_t, heads, k, rand, o: SNDDPMExvarOptions, data_range, T: int) -> tuple[torch.Tensor, dict]:
        mom = transition_moments(x_t, heads[0], heads[1], None, k, data_range)
        return sn_ddpm_from_moments(shrink_excess_variance(mom, k, exvar_factor_at(o.exvar, k.t)), k, rand, o,
                                    data_range)


class GMSExvar(GMS):
    """The library's GMS step (every option) with the transition's excess variance times ``exvar`` and its kappa3
    kept, before the variance scale, the Gaussian last step and the skew scale; the float64 torch path only."""

    name, Options, label, in_paper = "gms-exvar", GMSExvarOptions, "", False
    fused_config = Solver.fused_config

    def step(self, x_t, heads, k, rand, o: GMSExvarOptions, data_range, T: int) -> tuple[torch.Tensor, dict]:
        mom = transition_moments(x_t, heads[0], heads[1], heads[2], k, data_range)
        return gms_from_moments(shrink_excess_variance(mom, k, exvar_factor_at(o.exvar, k.t)), k, rand, o,
                                data_range, T)


RANK_ONE_CONTROL = RankOneControl()
# the exvar solver of each library solver it changes
EXVAR_SOLVERS: dict[str, Solver] = {"sn-ddpm": SNDDPMExvar(), "gms": GMSExvar()}
# every study solver by name: the row labels' solver names (quality_study.row_options)
CONTROLS: dict[str, Solver] = {s.name: s for s in (RANK_ONE_CONTROL, *EXVAR_SOLVERS.values())}
