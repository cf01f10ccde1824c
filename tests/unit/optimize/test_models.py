"""The parts of the Bayesian optimiser: features, GP posterior, LogEI, feasibility."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from conftest import hidden_infeasible
from fleettune.optimize.acquisition import Believers, log_ei
from fleettune.optimize.design import maximin
from fleettune.optimize.feasibility import FeasibilityModel, fit_feasibility
from fleettune.optimize.features import FeatureMap, alignment, model_features, odd_part
from fleettune.optimize.fitchain import checkpoints
from fleettune.optimize.gp import Hyper, Posterior, fit_hyper
from fleettune.space import SearchSpace


def test_features_expand_categoricals_and_log_sizes(space):
    rows = space.enumerate()
    x, xf, groups = model_features(space, rows)
    kinds = [k for k, _ in groups]
    assert kinds.count("categorical") == 2  # layout, unroll: one-hot, compared for equality only
    cat = next(cols for k, cols in groups if k == "categorical")
    block = x[:, cat]
    assert block.shape[1] == 3 and np.allclose((block**2).sum(axis=1), 0.5)  # Hamming distance 1
    assert x.min() >= 0 and x.max() <= 1 and x.shape == xf.shape
    # tile is linear 1..8 for the surrogate, logarithmic for the feasibility model
    configs = space.to_configs(rows)
    tile = np.array([c["tile"] for c in configs])
    j = [c for c in range(x.shape[1]) if not np.allclose(x[:, c], xf[:, c])]
    assert len(j) == 1 and np.allclose(xf[tile == 2, j[0]], np.log(2) / np.log(8))


def test_warp_sized_widths_get_a_divisibility_column_for_the_surrogate_only():
    space = SearchSpace.from_spec(
        [
            {"name": "width", "type": "integer", "range": {"min": 16, "max": 256, "step": 16}},
            {"name": "tile", "type": "integer", "range": {"min": 1, "max": 8}},
        ],
        [],
    )
    rows = space.enumerate()
    x, xf, groups = model_features(space, rows)
    # width, its divisibility, tile (a small factor: none); the feasibility model has none
    assert len(groups) == 3 and x.shape[1] == 3 and xf.shape[1] == 2
    width = np.array([c["width"] for c in space.to_configs(rows)])
    assert np.allclose(x[:, 1], (np.log2(width & -width) - 4) / 4)  # 16, 48 -> 0; 256 -> 1


def test_alignment_tells_multiples_of_large_powers_of_two_apart():
    widths = np.arange(16, 257, 16, dtype=np.float64)
    a = alignment(widths)
    assert a is not None and a[0] == a[2] == 0.0 and a[-1] == 1.0  # 16, 48 | 256
    assert a[1] == a[5] and a[1] < a[3] < a[7]  # 32 = 96 < 64 < 128
    assert alignment(np.arange(1.0, 9.0)) is None  # a small factor: smooth in its value
    assert alignment(np.array([8.0, 16.0, 32.0, 64.0])) is None  # powers of two: the log says it
    assert alignment(np.array([0.0, 32.0, 64.0, 96.0])) is None  # zero is no size
    assert alignment(np.array([16.5, 33.0, 48.0])) is None  # not integers
    assert alignment(np.array([33.0, 35.0, 37.0])) is None  # all odd: nothing to tell apart


def test_odd_part_tells_three_from_two_and_four_for_the_slow_regime_model_only():
    tiles = odd_part(np.array([1.0, 2.0, 3.0, 4.0]))
    assert tiles is not None and list(tiles) == [0.0, 0.0, 1.0, 0.0]
    widths = odd_part(np.arange(16, 257, 16, dtype=np.float64))  # 16 .. 256
    assert widths is not None and widths[0] == widths[1] == widths[3] == widths[7] == widths[15] == 0.0
    assert 0.0 < widths[2] < widths[4]  # 48 = 16 * 3 < 80 = 16 * 5
    assert odd_part(np.array([1.0, 2.0, 4.0, 8.0])) is None  # all powers of two
    assert odd_part(np.array([0.0, 1.0])) is None  # a 0/1 flag is no size
    assert odd_part(np.array([1.5, 3.0])) is None  # not integers
    assert odd_part(np.array([3.0, 6.0, 12.0])) is None  # one odd part: nothing to tell apart
    space = SearchSpace.from_spec(
        [
            {"name": "tile", "type": "integer", "range": {"min": 1, "max": 4}},
            {"name": "block", "type": "ordinal", "values": [32, 64, 128]},
            {"name": "flag", "type": "integer", "range": {"min": 0, "max": 1}},
        ],
        [],
    )
    rows = space.enumerate()
    fmap = FeatureMap(space)
    odd = fmap.odd_parts(rows)
    assert odd.shape == (len(rows), 1)  # the tile only
    tile = np.array([c["tile"] for c in space.to_configs(rows)])
    assert np.array_equal(odd[:, 0], (tile == 3).astype(float))
    x, xf, _ = model_features(space, rows)
    assert x.shape[1] == 3 and xf.shape[1] == 3  # neither the GP nor the feasibility model gets it


def test_posterior_matches_gpytorch():
    from botorch.models import SingleTaskGP
    from gpytorch.kernels import MaternKernel, ScaleKernel

    rng = np.random.default_rng(1)
    x = rng.random((30, 3))
    y = np.sin(6 * x[:, 0]) + x[:, 1]
    hyper = Hyper(np.array([0.3, 0.5, 2.0]), 1.3, 0.1, 1e-3)
    post = Posterior(x, y, np.zeros(30), hyper)
    xc = rng.random((50, 3))
    mean, var = post.predict(xc, fast=False)
    covar = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=3))
    model = SingleTaskGP(
        torch.as_tensor(x),
        torch.as_tensor(y).unsqueeze(-1),
        torch.full((30, 1), 1e-3, dtype=torch.float64),
        covar_module=covar,
        outcome_transform=None,
    )
    covar.base_kernel.lengthscale = torch.as_tensor(hyper.lengthscale)
    covar.outputscale = torch.tensor(1.3)
    model.mean_module.constant.data.fill_(0.1)
    model.eval()
    ref = model.posterior(torch.as_tensor(xc))
    assert torch.allclose(mean, ref.mean.squeeze(-1), atol=1e-6)
    assert torch.allclose(var, ref.variance.squeeze(-1), atol=1e-6)
    _, var32 = post.predict(xc, fast=True)
    assert torch.allclose(var, var32, atol=1e-4)


def test_fit_recovers_relevant_dimensions():
    rng = np.random.default_rng(2)
    x = rng.random((60, 3))
    y = np.sin(5 * x[:, 0])  # only the first feature matters
    y = (y - y.mean()) / y.std()
    hyper = fit_hyper(x, y, np.zeros(60))
    assert hyper.lengthscale[0] < hyper.lengthscale[1] and hyper.lengthscale[0] < hyper.lengthscale[2]
    again = fit_hyper(x, y, np.zeros(60))  # deterministic: same data, same fit
    assert np.array_equal(again.lengthscale, hyper.lengthscale) and again.noise == hyper.noise


def test_a_fit_that_l_bfgs_ends_abnormally_is_kept_and_warns_no_one(monkeypatch: pytest.MonkeyPatch):
    import botorch.optim.fit
    from botorch.exceptions.warnings import OptimizationWarning

    real = botorch.optim.fit.fit_gpytorch_mll_scipy

    def abnormal(mll, **kw):  # what BoTorch does when L-BFGS's line search fails
        result = real(mll, **kw)
        warnings.warn("`scipy_minimize` terminated with status FAILURE: ABNORMAL", OptimizationWarning, stacklevel=2)
        return result

    rng = np.random.default_rng(2)
    x = rng.random((60, 3))
    y = np.sin(5 * x[:, 0])
    y = (y - y.mean()) / y.std()
    fitted = fit_hyper(x, y, np.zeros(60))
    monkeypatch.setattr(botorch.optim.fit, "fit_gpytorch_mll_scipy", abnormal)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        hyper = fit_hyper(x, y, np.zeros(60))
    assert not [w for w in seen if issubclass(w.category, OptimizationWarning)]
    assert np.array_equal(hyper.lengthscale, fitted.lengthscale)  # the fit, not the start point


def test_the_first_fit_of_a_process_warns_nothing_a_user_cannot_act_on():
    """The first fit imports BoTorch, whose linear_operator applies the deprecated
    torch.jit.script at import: that FutureWarning would be the operator's first log line
    about the optimiser. A fresh interpreter, since this one has imported BoTorch."""
    code = ("import numpy as np; from fleettune.optimize.gp import fit_hyper; "
            "x = np.random.default_rng(0).random((8, 2)); fit_hyper(x, np.linspace(-1, 1, 8), np.zeros(8))")
    proc = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_log_ei_is_exact_and_finite_in_the_tail():
    mean = torch.tensor([0.0, 1.0, 3.0, 40.0], dtype=torch.float64)
    var = torch.ones(4, dtype=torch.float64)
    got = log_ei(mean, var, best=0.5)
    u = (0.5 - mean)
    naive = torch.log(torch.exp(-0.5 * u**2) / math.sqrt(2 * math.pi) + u * torch.special.ndtr(u))
    assert torch.allclose(got[:3], naive[:3], rtol=1e-6)
    assert torch.isfinite(got).all() and got[3] < got[2] < got[1] < got[0]


def test_believers_shrink_variance_near_the_believed_point():
    x = np.array([[0.0], [1.0]])
    post = Posterior(x, np.array([0.0, 1.0]), np.zeros(2), Hyper(np.array([0.2]), 1.0, 0.0, 1e-4))
    xc = torch.linspace(0, 1, 11, dtype=torch.float64).unsqueeze(-1)
    _, var = post.predict(xc, fast=False)
    b = Believers(var, 1e-4)
    b.add(5, post.cov_with(xc, xc[5:6]).squeeze(-1))
    assert b.var[5] < 1e-3 < var[5]
    assert b.var[0] == var[0] or abs(float(b.var[0] - var[0])) < 1e-6


def test_feasibility_model_learns_planted_region(space):
    rows = space.enumerate()
    _, xf, _ = model_features(space, rows)
    bad = np.array([hidden_infeasible(c) for c in space.to_configs(rows)])
    rng = np.random.default_rng(0)
    train = rng.choice(len(rows), 80, replace=False)
    test = np.setdiff1d(np.arange(len(rows)), train)
    hyper = fit_feasibility(xf[train], ~bad[train], None, 60)
    p = FeasibilityModel(xf[train], ~bad[train], hyper).prob(xf[test]).numpy()
    assert p[bad[test]].mean() < 0.3
    assert p[~bad[test]].mean() > 0.8
    accuracy = ((p > 0.5) == ~bad[test]).mean()
    assert accuracy > 0.9


def test_maximin_spreads_and_avoids_chosen_points():
    rng = np.random.default_rng(0)
    grid = np.array([[i / 9, j / 9] for i in range(10) for j in range(10)])
    avail = np.ones(100, dtype=bool)
    picks = maximin(grid, avail, np.zeros((0, 2)), 4, rng)
    assert len(set(picks.tolist())) == 4
    d = np.sqrt(((grid[picks][:, None] - grid[picks][None]) ** 2).sum(-1)) + np.eye(4) * 9
    assert d.min() > 0.5  # spread over the square, not clustered
    more = maximin(grid, avail, grid[picks], 1, rng)
    assert np.sqrt(((grid[picks] - grid[more[0]]) ** 2).sum(-1)).min() > 0.4


def test_refit_checkpoints_depend_on_history_length_only():
    marks = checkpoints(220, 0.25)
    assert marks[0] == 1 and marks[-1] <= 220 and len(marks) < 30
    assert checkpoints(100, 0.25) == [m for m in marks if m <= 100]
