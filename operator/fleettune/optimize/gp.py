"""Gaussian-process surrogate: BoTorch/GPyTorch for the model and its hyperparameters,
a hand-written posterior for scoring.

Scoring thousands to millions of candidates through GPyTorch's generic posterior costs
seconds per suggestion; with the hyperparameters fixed, the posterior is two matrix
products against a cached Cholesky factor, which is what :class:`Posterior` does in
chunks (float32 where the cancellation in the variance cannot hurt).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

SQRT5 = math.sqrt(5.0)
MIN_LENGTHSCALE = 0.025  # as BoTorch's dim-scaled prior: below this, 0/1 features look independent
MIN_NOISE = 1e-6
PREDICT_CHUNK = 16384  # candidates per block in `Posterior.predict`
# L-BFGS iterations per hyperparameter fit of the Bayesian strategy, each fit started from
# the previous checkpoint's (the tuning knob ``fit_iter``).
FIT_ITER = 40


@dataclass(frozen=True)
class Hyper:
    """Fitted hyperparameters of a constant-mean, scaled Matérn-5/2 ARD GP."""

    lengthscale: np.ndarray  # (f,)
    outputscale: float
    mean: float
    noise: float  # homoskedastic noise learned on top of the per-point (repeat) noise

    @staticmethod
    def default(n_features: int) -> Hyper:
        return Hyper(
            lengthscale=np.full(n_features, _lengthscale_prior_mode(n_features)),
            outputscale=1.0,
            mean=0.0,
            noise=1e-3,
        )


def _lengthscale_prior_loc(n_features: int) -> float:
    # Hvarfner et al. (2024), BoTorch's default: the prior median grows with sqrt(d), so
    # that many features do not make every point look unrelated to every other one.
    return math.sqrt(2.0) + 0.5 * math.log(max(n_features, 1))


def _lengthscale_prior_mode(n_features: int) -> float:
    return math.exp(_lengthscale_prior_loc(n_features) - 3.0)


def matern52(a: torch.Tensor, b: torch.Tensor, lengthscale: torch.Tensor) -> torch.Tensor:
    """Unit-variance Matérn-5/2 ARD kernel matrix between the rows of ``a`` and ``b``
    (in the dtype of ``a``; inputs should be centred, see :meth:`Posterior.cross`)."""
    za = a / lengthscale.to(a.dtype)
    zb = (b / lengthscale.to(b.dtype)).to(a.dtype)
    # |a-b|^2 through one matrix product: the N x n x f difference tensor would not fit.
    d2 = torch.addmm((za * za).sum(-1, keepdim=True), za, zb.T, alpha=-2.0)
    d2.add_((zb * zb).sum(-1))
    r = d2.clamp_min_(0.0).sqrt_().mul_(SQRT5)
    # (1 + r + r^2/3) exp(-r), in place: this runs on N x n elements per suggestion.
    out = torch.exp(-r)
    r.mul_(r.div(3.0).add_(1.0)).add_(1.0)
    return out.mul_(r)


def fit_hyper(
    x: np.ndarray,
    y: np.ndarray,
    noise: np.ndarray,
    *,
    init: Hyper | None = None,
    max_iter: int = 60,
    outputscale_prior: tuple[float, float] | None = (2.0, 1.0),
) -> Hyper:
    """Maximum a-posteriori hyperparameters for standardised targets ``y``.

    ``noise`` is each point's known variance (from its repeats); a homoskedastic noise on
    top of it is learned, because model misfit on real kernels dwarfs timing noise.
    Deterministic: fixed start, L-BFGS-B without random restarts.
    ``outputscale_prior`` is a Gamma(shape, rate) prior on the signal variance (targets
    are standardised, so it sits around 1: a loose prior lets the fit trade tiny
    length-scales for a huge variance and interpolate every point independently);
    None fixes the variance at 1.
    """
    with warnings.catch_warnings():
        # linear_operator (under gpytorch) applies torch.jit.script at import, which torch
        # deprecates: a FutureWarning in the operator's log that no user can act on.
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script", category=FutureWarning)
        from botorch.exceptions.warnings import OptimizationWarning
        from botorch.models import SingleTaskGP
        from botorch.optim.fit import fit_gpytorch_mll_scipy
        from gpytorch.constraints import GreaterThan
        from gpytorch.kernels import MaternKernel, ScaleKernel
        from gpytorch.likelihoods import FixedNoiseGaussianLikelihood
        from gpytorch.means import ConstantMean
        from gpytorch.mlls import ExactMarginalLogLikelihood
        from gpytorch.priors import GammaPrior, LogNormalPrior

    n_features = x.shape[1]
    tx = torch.as_tensor(x, dtype=torch.float64)
    ty = torch.as_tensor(y, dtype=torch.float64).unsqueeze(-1)
    tn = torch.as_tensor(np.maximum(noise, MIN_NOISE), dtype=torch.float64)
    base = MaternKernel(
        nu=2.5,
        ard_num_dims=n_features,
        lengthscale_prior=LogNormalPrior(_lengthscale_prior_loc(n_features), math.sqrt(3.0)),
        lengthscale_constraint=GreaterThan(MIN_LENGTHSCALE, transform=None),
    )
    covar = ScaleKernel(base, outputscale_prior=GammaPrior(*outputscale_prior) if outputscale_prior else None)
    if outputscale_prior is None:
        covar.raw_outputscale.requires_grad_(False)
    likelihood = FixedNoiseGaussianLikelihood(noise=tn, learn_additional_noise=True)
    likelihood.second_noise_covar.register_prior(
        "noise_prior", GammaPrior(1.1, 0.05), lambda m: m.noise, lambda m, v: m._set_noise(v)
    )
    model = SingleTaskGP(
        tx, ty, likelihood=likelihood, covar_module=covar, mean_module=ConstantMean(), outcome_transform=None
    ).to(torch.float64)
    start = init or Hyper.default(n_features)
    with torch.no_grad():
        base.lengthscale = torch.as_tensor(np.maximum(start.lengthscale, MIN_LENGTHSCALE * 1.01))
        covar.outputscale = torch.tensor(float(start.outputscale) if outputscale_prior else 1.0)
        model.mean_module.constant.fill_(float(start.mean))
        likelihood.second_noise_covar.noise = torch.tensor(max(float(start.noise), 2 * MIN_NOISE))
    mll = ExactMarginalLogLikelihood(likelihood, model)
    mll.train()
    try:
        with warnings.catch_warnings():
            # L-BFGS stopping on a failed line search ("ABNORMAL") is routine on these
            # flat, noisy likelihoods and its end point is used as any other: a warning for
            # each would fill the operator's log with nothing a user can act on.
            warnings.simplefilter("ignore", OptimizationWarning)
            fit_gpytorch_mll_scipy(mll, options={"maxiter": max_iter})
    except Exception:  # a failed fit keeps its start point: a stale model beats no model
        return start
    mll.eval()
    ls = base.lengthscale.detach().reshape(-1).numpy().astype(np.float64)
    hyper = Hyper(
        lengthscale=ls,
        outputscale=float(covar.outputscale.detach()),
        mean=float(model.mean_module.constant.detach()),
        noise=float(likelihood.second_noise_covar.noise.detach().reshape(-1)[0]),
    )
    finite = [hyper.outputscale, hyper.mean, hyper.noise]
    if not (np.all(np.isfinite(hyper.lengthscale)) and all(math.isfinite(v) for v in finite)):
        return start  # L-BFGS can step into NaN on near-singular data; keep the last good fit
    return hyper


class Posterior:
    """Exact GP posterior for fixed hyperparameters, with a cached Cholesky factor.

    ``add_believer`` conditions on pending points at their posterior mean (Kriging
    believer): the mean does not move, the variance shrinks around them, so a batch
    spreads out instead of clustering on one optimum.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, noise: np.ndarray, hyper: Hyper) -> None:
        self.hyper = hyper
        x64 = torch.as_tensor(x, dtype=torch.float64)
        # Centring keeps |z|^2 small, so float32 distances lose little to cancellation.
        self.center = x64.mean(dim=0) if len(x64) else torch.zeros(x64.shape[1], dtype=torch.float64)
        self.x = x64 - self.center
        self.x32 = self.x.to(torch.float32)
        self.ls = torch.as_tensor(hyper.lengthscale, dtype=torch.float64)
        self.s2 = float(hyper.outputscale)
        self.noise_extra = max(float(hyper.noise), MIN_NOISE)
        resid = torch.as_tensor(y, dtype=torch.float64) - hyper.mean
        k = self.s2 * matern52(self.x, self.x, self.ls)
        k.diagonal().add_(torch.as_tensor(noise, dtype=torch.float64) + self.noise_extra)
        self.chol = _robust_cholesky(k)
        self.alpha = torch.cholesky_solve(resid.unsqueeze(-1), self.chol).squeeze(-1)
        eye = torch.eye(k.shape[0], dtype=torch.float64)
        self.k_inv = torch.cholesky_solve(eye, self.chol)
        self._k_inv32 = self.k_inv.to(torch.float32)
        # alpha as an unevaluated float32 sum hi + lo: two float32 products then give the
        # mean to about float32 precision of the kernel values, without an N x n copy to float64.
        hi = self.alpha.to(torch.float32)
        self._alpha32 = torch.stack([hi, (self.alpha - hi.to(torch.float64)).to(torch.float32)], dim=1)

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    def cross(self, xc: torch.Tensor, *, fast: bool = False) -> torch.Tensor:
        """Prior covariance between new points and the training points."""
        if fast:
            xc32 = xc.to(torch.float32) - self.center.to(torch.float32)
            return matern52(xc32, self.x32, self.ls).mul_(self.s2)
        return matern52(xc.to(torch.float64) - self.center, self.x, self.ls).mul_(self.s2)

    def predict(
        self, xc: np.ndarray | torch.Tensor, *, chunk: int = PREDICT_CHUNK, fast: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and variance (latent, without noise) at the rows of ``xc``.

        ``fast``: the cross-covariances and the quadratic form in float32 (the two
        N x n products that dominate); the mean's dot product and the subtraction in
        the variance stay in float64.
        """
        xc = torch.as_tensor(xc)
        means, variances = [], []
        for start in range(0, xc.shape[0], chunk):
            ks = self.cross(xc[start : start + chunk], fast=fast)
            if fast:
                means.append(self.hyper.mean + (ks @ self._alpha32).to(torch.float64).sum(-1))
                quad = ((ks @ self._k_inv32).mul_(ks)).sum(-1).to(torch.float64)
            else:
                means.append(self.hyper.mean + ks @ self.alpha)
                quad = ((ks @ self.k_inv) * ks).sum(-1)
            variances.append((self.s2 - quad).clamp_min_(1e-12))
        return torch.cat(means), torch.cat(variances)

    def cov_with(self, xc: torch.Tensor, xp: torch.Tensor) -> torch.Tensor:
        """Posterior covariance between rows of ``xc`` and rows of ``xp`` (small)."""
        kcp = self.s2 * matern52(xc.to(torch.float64), xp.to(torch.float64), self.ls)
        return kcp - self.cross(xc) @ (self.k_inv @ self.cross(xp).T)


def _robust_cholesky(k: torch.Tensor) -> torch.Tensor:
    jitter = 0.0
    scale = float(k.diagonal().mean())
    for _ in range(8):
        kj = k if jitter == 0.0 else k + jitter * torch.eye(k.shape[0], dtype=k.dtype)
        chol, info = torch.linalg.cholesky_ex(kj)
        if int(info) == 0:
            return chol
        jitter = max(jitter * 10.0, 1e-8 * scale)
    raise np.linalg.LinAlgError("covariance matrix is not positive definite, even with jitter")
