"""What a Study keeps in memory: compact index rows, features computed on demand for large
candidate sets, one candidate set shared by the studies of one space (the figures are in
docs/benchmarks.md, from `fleettune bench memory`)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from conftest import evaluate
from fleettune.optimize import Study, problem
from fleettune.optimize import study as study_module
from fleettune.optimize.features import FeatureMap, model_features
from fleettune.optimize.problem import Candidates, LazyFeatures
from fleettune.space import SearchSpace
from fleettune_job.protocol import Outcome

# 6^6 x 4 = 186 624 configurations, 6 numeric and 4 one-hot features: each float64 feature
# matrix would take 14.2 MiB, the index rows 1.3 MiB as int32.
BIG = [{"name": f"p{i}", "type": "ordinal", "values": [1, 2, 4, 8, 16, 32]} for i in range(6)]
BIG.append({"name": "layout", "type": "categorical", "values": ["a", "b", "c", "d"]})
FAST = {"fit_iter": 20}  # tuning knobs (the development hook): fewer L-BFGS iterations


def _arrays(obj: object) -> dict[int, int]:
    """Bytes of the distinct numpy/torch buffers reachable from a study (not its space)."""
    from fleettune_dev.bench.memory import _buffers

    return dict(_buffers(obj))


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch):
    """No candidate set shared with an earlier test's studies."""
    monkeypatch.setattr(study_module, "_SHARED", type(study_module._SHARED)())
    return monkeypatch


def test_a_large_study_keeps_byte_rows_and_no_feature_matrix(fresh):
    fresh.setattr(problem, "MATERIALISE_BYTES", 4 << 20)
    space = SearchSpace.from_spec(BIG, [])
    n, d = space.count(), len(BIG)
    study = Study(space, seed=0, tuning=FAST)
    c = study.candidates
    assert len(c) == n == 186_624
    assert c.rows.dtype == np.uint8 and c.rows.nbytes == n * d and not c.rows.flags.writeable
    assert isinstance(c.x, LazyFeatures) and isinstance(c.xf, LazyFeatures)
    assert c._keys is not None and c._keys.nbytes == 8 * n
    assert c._order is None or c._order.nbytes == 4 * n  # int32 (none when the rows come sorted)
    # Everything the study holds: rows, keys and their order, the observed mask; nothing of
    # size N x features.
    budget = n * (d + 8 + 4 + 1) + (64 << 10)
    held = _arrays(study)
    assert sum(held.values()) <= budget, sorted(held.values())[-4:]
    assert max(held.values()) == 8 * n  # the lookup keys
    for config in study.suggest(4):
        study.observe(config, Outcome.OK, 1.0 + sum(config[f"p{i}"] for i in range(6)) / 100)
    assert sum(_arrays(study).values()) <= budget


def test_lazy_features_are_the_materialised_matrix(space):
    rows = space.enumerate()
    x, xf, _ = model_features(space, rows)
    c = Candidates(rows, None, [], None, features=FeatureMap(space))
    lazy = Candidates(rows, LazyFeatures(c.rows, lambda r: c.features(r), x.shape[1]))
    assert isinstance(c.x, np.ndarray) and np.array_equal(c.x, x) and np.array_equal(c.xf, xf)
    idx = np.array([5, 0, 17, 5])
    mask = np.zeros(len(rows), dtype=bool)
    mask[[1, 3, 8]] = True
    assert isinstance(lazy.x, LazyFeatures) and lazy.x.shape == x.shape
    for key in (7, np.int64(-1), slice(3, 40, 2), idx, mask, (idx, slice(0, 2)), (4, 1)):
        assert np.array_equal(lazy.x[key], x[key]), key
    assert np.array_equal(np.asarray(lazy.x), x)


def test_studies_of_one_space_share_their_candidates(space, fresh):
    a = Study(space, seed=0, tuning=FAST)
    b = Study(SearchSpace.from_spec(*_spec(space)), strategy="random", seed=5)
    assert a.candidates is b.candidates
    other = Study(space, seed=0, candidates=space.enumerate()[:100], tuning=FAST)
    assert other.candidates is not a.candidates and len(other.candidates) == 100
    # Shared, but each study has its own observations.
    (config,) = a.suggest(1)
    a.observe(config, *evaluate(config))
    assert a.n_observed == 1 and b.n_observed == 0 and b._observed.sum() == 0
    del a, b, other
    gc.collect()
    assert len(study_module._SHARED) == 0  # the last study gone, its candidates go too


def _spec(space: SearchSpace) -> tuple[list, list]:
    return [p.spec for p in space.parameters], [c.text for c in space.constraints]


def test_lazy_and_materialised_features_suggest_the_same(space, fresh):
    """Large candidate sets compute features per request; the decisions are the same as
    with the whole matrix in memory (subset scoring, local search, warm start included)."""
    configs = space.to_configs(space.enumerate())
    rng = np.random.default_rng(4)
    prior = [(c, *evaluate(c)) for c in (configs[i] for i in rng.choice(len(configs), 30, replace=False))]
    settings = {"options": {"initial": 4}, "tuning": {**FAST, "max_pool": 200}}
    fresh.setattr("fleettune.optimize.warm.PREDICT_CHUNK", 100)  # the prior mean in several chunks
    runs = []
    for limit in (problem.MATERIALISE_BYTES, 0):
        fresh.setattr(problem, "MATERIALISE_BYTES", limit)
        fresh.setattr(study_module, "_SHARED", type(study_module._SHARED)())
        study = Study(space, seed=1, prior=prior, **settings)
        assert isinstance(study.candidates.x, LazyFeatures) == (limit == 0)
        picks = []
        for _ in range(8):
            batch = study.suggest(2)
            picks.append(batch)
            for c in batch:
                study.observe(c, *evaluate(c))
        runs.append(picks)
    assert runs[0] == runs[1]


def test_bayes_holds_no_tensor_of_all_candidates(space, fresh):
    fresh.setattr(problem, "MATERIALISE_BYTES", 0)
    study = Study(space, seed=0, tuning=FAST)
    for _ in range(12):
        (c,) = study.suggest(1)
        study.observe(c, *evaluate(c))
    n = len(study.candidates)
    tensors = [v for v in vars(study.strategy).values() if isinstance(v, torch.Tensor)]
    assert all(t.numel() < n * study.candidates.n_features for t in tensors)


def test_lookup_beyond_integer_keys_uses_the_rows_bytes():
    """20 parameters of 10 values: the mixed-radix key overflows int64, so each byte row is
    its own key (a dictionary of 2 million byte strings took hundreds of MiB)."""
    rng = np.random.default_rng(0)
    rows = np.unique(rng.integers(0, 10, size=(500, 20)), axis=0)[rng.permutation(500)]
    c = Candidates(rows, np.zeros((len(rows), 1)))
    assert c._bytes is not None and c.rows.dtype == np.uint8
    assert np.array_equal(c.lookup(rows[[7, 0, 499]]), [7, 0, 499])
    other = rows[3].copy()
    other[0] = (other[0] + 1) % 10
    if not (rows == other).all(axis=1).any():
        assert c.lookup(other)[0] == -1
    assert c.lookup(np.full(20, 300))[0] == -1 and c.lookup(np.full(20, -1))[0] == -1


def test_finished_runs_keep_no_candidate_arrays():
    """`fleettune bench memory finished-runs`: what a finished run keeps until it is deleted
    (the planner's `drop_finished_studies`) holds no array of its candidates; keeping the
    studies, as the operator did, grows by a candidate set per run."""
    from fleettune_dev.bench.memory import finished_runs

    kept = finished_runs(2, 2, 2, "random", keep_studies=True)
    dropped = finished_runs(2, 2, 2, "random", keep_studies=False)
    assert kept[1]["arrays"] > kept[0]["arrays"] > 10 * 2**20
    assert [p["arrays"] for p in dropped] == [0, 0]
