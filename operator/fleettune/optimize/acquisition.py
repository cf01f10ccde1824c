"""Acquisition: log expected improvement (minimisation) plus log probability of
feasibility, and the Kriging-believer variance updates that make batches spread out."""

from __future__ import annotations

import math

import torch

# Acquisition = LogEI + FEAS_POWER x log P(feasible) (``feas_power``): the fastest
# configurations often sit next to a resource limit; a weight of 3 was a wash on the replay.
FEAS_POWER = 6.0
# BaCO's randomised feasibility threshold: candidates predicted less likely to run than
# tau ~ U(0, TAU_MAX), redrawn at every suggestion, are not chosen (``tau_max``).
TAU_MAX = 1.0

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT_HALF_PI = math.sqrt(0.5 * math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def log_h(u: torch.Tensor) -> torch.Tensor:
    """log(phi(u) + u Phi(u)), accurate far into the tail (u -> -inf), where plain EI
    underflows to zero and stops ranking candidates (the point of LogEI, Ament et al. 2023)."""
    u = u.to(torch.float64)
    out = torch.empty_like(u)
    hi = u > -1.0
    uh = u[hi]
    out[hi] = torch.log(torch.exp(-0.5 * uh * uh - _LOG_SQRT_2PI) + uh * torch.special.ndtr(uh))
    ul = u[~hi]
    # phi(u) * (1 + u * Phi(u)/phi(u)), with Phi/phi = sqrt(pi/2) erfcx(-u/sqrt2).
    w = torch.log1p(ul * _SQRT_HALF_PI * torch.special.erfcx(-ul * _INV_SQRT2))
    far = ul < -1e4  # 1 + u*m(u) ~ 1/u^2 drowns in rounding there
    w = torch.where(far, -2.0 * torch.log(-ul), w)
    out[~hi] = -0.5 * ul * ul - _LOG_SQRT_2PI + w
    return out


def log_ei(mean: torch.Tensor, var: torch.Tensor, best: float) -> torch.Tensor:
    """log E[max(best - f, 0)] for f ~ N(mean, var)."""
    sigma = var.clamp_min(1e-18).sqrt()
    return log_h((best - mean) / sigma) + torch.log(sigma)


def prob_feasible(d_mean: torch.Tensor, d_var: torch.Tensor) -> torch.Tensor:
    """E[sigmoid(d)] for d ~ N(d_mean, d_var) (probit approximation, MacKay 1992)."""
    return torch.sigmoid(d_mean / torch.sqrt(1.0 + (math.pi / 8.0) * d_var))


class Believers:
    """Sequential conditioning on points whose outcome is not known yet.

    With a Kriging believer the posterior mean does not move; the variance drops by
    cov(x, b)^2 / (var(b) + noise) for each believed point b. ``cov0`` gives the
    covariances under the original posterior; earlier believers are projected out here.
    """

    def __init__(self, var: torch.Tensor, noise: float) -> None:
        self.var = var.clone()
        self.noise = noise
        self._u: list[torch.Tensor] = []

    def add(self, j: int, cov0_col: torch.Tensor) -> None:
        c = cov0_col.to(torch.float64).clone()
        for u in self._u:
            c -= u * u[j]
        denom = float(self.var[j]) + self.noise
        if denom <= 0.0:
            return
        u = c / math.sqrt(denom)
        self._u.append(u)
        self.var = (self.var - u * u).clamp_min_(1e-12)
