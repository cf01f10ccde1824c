"""SearchSpace core behaviour: building, counting, enumeration, conversions, encodings."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

from fleettune.space import SearchSpace, SpaceError, lookup_device


def small_space() -> SearchSpace:
    return SearchSpace.from_spec(
        [
            {"name": "bx", "type": "ordinal", "values": [16, 32, 64, 128], "default": 32},
            {"name": "by", "type": "integer", "range": {"min": 1, "max": 4}, "default": 1},
            {"name": "layout", "type": "categorical", "values": ["row", "col"], "default": "row"},
            {"name": "unroll", "type": "boolean", "default": False},
        ],
        ["bx * by <= 256", "layout == 'row' or not unroll"],
    )


def test_clblast_gemm_count_matches_kernel_tuner(gemm_params, gemm_restrictions):
    space = SearchSpace.from_spec(gemm_params, gemm_restrictions)
    assert space.cartesian_size == 82944
    assert space.count() == 17956
    rows = space.enumerate()
    assert rows.shape == (17956, 15) and rows.dtype == np.int32
    assert len(np.unique(rows, axis=0)) == 17956
    assert space.is_valid(rows).all()


def test_enumerate_matches_brute_force_on_small_space():
    space = small_space()
    expected = set()
    for combo in itertools.product(*[range(n) for n in space.sizes]):
        cfg = space.to_configs(np.array([combo]))[0]
        if cfg["bx"] * cfg["by"] <= 256 and (cfg["layout"] == "row" or not cfg["unroll"]):
            expected.add(combo)
    rows = space.enumerate()
    assert {tuple(r) for r in rows.tolist()} == expected
    assert space.count() == len(expected)
    assert space.enumerate(limit=3).shape == (3, 4)


def test_config_round_trip_and_key():
    space = small_space()
    rows = space.enumerate()
    configs = space.to_configs(rows)
    assert np.array_equal(space.to_rows(configs), rows)
    assert configs[0] == {"bx": 16, "by": 1, "layout": "row", "unroll": False}
    assert space.key(configs[0]) == "16,1,row,False"
    assert space.key(rows[0]) == space.key(configs[0])
    assert type(configs[0]["bx"]) is int and type(configs[0]["unroll"]) is bool


def test_to_rows_rejects_values_outside_the_space():
    space = small_space()
    with pytest.raises(SpaceError) as err:
        space.to_rows([{"bx": 48, "by": 1, "layout": "row", "unroll": False}])
    assert err.value.field == "configs[0].bx"
    with pytest.raises(SpaceError, match="missing parameter 'unroll'"):
        space.to_rows([{"bx": 16, "by": 1, "layout": "row"}])
    with pytest.raises(SpaceError, match="not a value"):
        space.to_rows([{"bx": True, "by": 1, "layout": "row", "unroll": False}])


def test_default_row_and_neighbours():
    space = small_space()
    row = space.default_row()
    assert row is not None
    assert space.to_configs(row)[0] == {"bx": 32, "by": 1, "layout": "row", "unroll": False}
    neigh = space.to_configs(space.neighbours(row))
    assert {"bx": 16, "by": 1, "layout": "row", "unroll": False} in neigh
    assert {"bx": 64, "by": 1, "layout": "row", "unroll": False} in neigh
    assert {"bx": 32, "by": 2, "layout": "row", "unroll": False} in neigh
    assert {"bx": 32, "by": 1, "layout": "col", "unroll": False} in neigh
    assert {"bx": 32, "by": 1, "layout": "row", "unroll": True} in neigh
    assert len(neigh) == 5
    assert space.is_valid(space.neighbours(row)).all()


def test_encode_ranges_and_groups():
    space = small_space()
    feats = space.encode(space.enumerate())
    assert feats.dtype == np.float64 and feats.shape[1] == 4
    assert feats.min() >= 0.0 and feats.max() <= 1.0
    assert space.feature_groups == [("numeric", slice(0, 2)), ("categorical", slice(2, 4))]
    # bx is powers of two → log scale: 16, 32, 64, 128 are evenly spaced
    bx = space.encode(space.to_rows([{"bx": v, "by": 1, "layout": "row", "unroll": False}
                                     for v in (16, 32, 64, 128)]))[:, 0]
    assert np.allclose(np.diff(bx), 1 / 3)


def test_permutation_parameter_rank_encoding_and_swaps():
    space = SearchSpace.from_spec([{"name": "order", "type": "permutation", "size": 3}],
                                  ["order[0] != 2", "order not in ((1, 0, 2),)"])
    configs = space.to_configs(space.enumerate())
    orders = sorted(tuple(c["order"]) for c in configs)
    assert orders == [(0, 1, 2), (0, 2, 1), (1, 2, 0)]
    row = space.to_rows([{"order": [0, 1, 2]}])
    ranks = space.encode(row)[0]
    assert np.allclose(ranks, [0, 0.5, 1])
    assert space.feature_groups == [("permutation", slice(0, 3))]
    swaps = {tuple(c["order"]) for c in space.to_configs(space.neighbours(row[0]))}
    assert swaps == {(0, 2, 1)}  # (1,0,2) is excluded, (2,1,0) starts with 2


def test_device_constraint_uses_target_limits():
    params = [{"name": "bx", "type": "ordinal", "values": [32, 64, 128, 256, 512, 1024]},
              {"name": "by", "type": "ordinal", "values": [1, 2, 4, 8]},
              {"name": "tile", "type": "integer", "range": {"min": 1, "max": 4}}]
    cons = ["bx * by <= device.max_threads_per_block",
            "(bx * tile + 2) * (by * tile + 2) * 4 <= device.shared_memory_per_block_optin"]
    a100 = SearchSpace.from_spec(params, cons, lookup_device(product="NVIDIA-A100-SXM4-40GB"))
    t4 = SearchSpace.from_spec(params, cons, lookup_device(product="Tesla-T4"))
    assert a100.count() > t4.count() > 0
    with pytest.raises(SpaceError, match="no device"):
        SearchSpace.from_spec(params, cons)


def test_sample_is_valid_and_distinct():
    space = small_space()
    rng = np.random.default_rng(1)
    rows = space.sample(5, rng)
    assert rows.shape == (5, 4) and space.is_valid(rows).all()
    assert len({tuple(r) for r in rows.tolist()}) == 5
    everything = space.sample(10_000, rng)
    assert len(everything) == space.count()
    many = space.sample(50, rng, distinct=False)
    assert many.shape == (50, 4) and space.is_valid(many).all()


def test_pickle_round_trip():
    space = small_space()
    again = pickle.loads(pickle.dumps(space))
    assert again.count() == space.count()
    assert np.array_equal(again.enumerate(), space.enumerate())


def test_huge_cartesian_counts_exactly_and_enumerates_with_limit():
    params = [{"name": f"p{i}", "type": "integer", "range": {"min": 0, "max": 9}} for i in range(20)]
    space = SearchSpace.from_spec(params, ["p0 + p1 <= 9", "p2 != p3", "p4 * p5 % 3 == 0"])
    # 55 * 90 * 64 of the 10**6 combinations of p0..p5, times 10**14 free combinations
    assert space.count() == 55 * 90 * 64 * 10**14
    first = space.enumerate(limit=4)
    assert first.shape == (4, 20) and space.is_valid(first).all()
    with pytest.raises(SpaceError, match="too many"):
        space.enumerate()
    draws = space.sample(200, np.random.default_rng(3))
    assert space.is_valid(draws).all() and len({r.tobytes() for r in draws}) == 200


def test_device_only_constraints():
    params = [{"name": "a", "type": "integer", "range": {"min": 0, "max": 3}}]
    t4 = lookup_device(product="Tesla-T4")
    assert SearchSpace.from_spec(params, ["device.max_threads_per_multiprocessor == 1024"], t4).count() == 4
    with pytest.raises(SpaceError, match="NVIDIA T4 does not satisfy") as info:
        SearchSpace.from_spec(params, ["a >= 0", "device.compute_capability >= 80"], t4)
    assert info.value.field == "constraints[1]"


def test_enumerate_into_a_narrow_index_type():
    """Studies enumerate large spaces straight into one byte per parameter."""
    space = SearchSpace.from_spec(
        [{"name": "a", "type": "integer", "range": {"min": 0, "max": 299}},
         {"name": "b", "type": "ordinal", "values": [1, 2, 4, 8]}],
        ["a % b == 0"],
    )
    wide = space.enumerate()
    narrow = space.enumerate(dtype=np.uint16)
    assert wide.dtype == np.int32 and narrow.dtype == np.uint16 and np.array_equal(wide, narrow)
    assert np.array_equal(space.enumerate(limit=7, dtype=np.uint16), wide[:7])
    with pytest.raises(SpaceError, match="cannot hold"):
        space.enumerate(dtype=np.uint8)  # 300 values of a
