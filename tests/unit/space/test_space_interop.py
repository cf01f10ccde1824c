"""Interop round trips on the recorded data: Kernel Tuner caches, T4 results, T1 specs."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from fleettune.space import SearchSpace, SpaceError
from fleettune_dev.interop import (
    Record,
    read_kernel_tuner_cache,
    read_t1_spec,
    read_t4,
    write_kernel_tuner_cache,
    write_t4,
)

README_COUNTS = {  # file stem: (configurations, failed) from data/README.md
    "convolution_milo-A100": (4362, 161), "convolution_milo-A4000": (4362, 161),
    "dedispersion_milo-A100": (11130, 0), "convolution-RTX_2080_Ti": (6768, 1512),
    "convolution-RTX_3090": (6768, 1548), "pnpoly-RTX_2080_Ti": (4092, 370), "pnpoly-RTX_3090": (4092, 330),
    "gemm-RTX_3090": (17956, 0),
}


def _same_records(a, b):
    assert len(a.records) == len(b.records)
    for ra, rb in zip(a.records, b.records, strict=True):
        assert ra.config == rb.config
        assert ra.failure == rb.failure
        assert ra.time_ms == pytest.approx(rb.time_ms) if ra.time_ms is not None else rb.time_ms is None
        assert ra.times == pytest.approx(rb.times)


@pytest.mark.parametrize("stem", sorted(README_COUNTS))
def test_kernel_tuner_cache_reads_and_round_trips(stem, data_dir, tmp_path):
    rec = read_kernel_tuner_cache(data_dir / "spaces" / f"{stem}.json.gz")
    configs, failed = README_COUNTS[stem]
    assert len(rec.records) == configs
    assert sum(r.failure is not None for r in rec.records) == failed
    assert rec.rows.shape == (configs, len(rec.space.names))
    assert rec.space.to_configs(rec.rows) == [r.config for r in rec.records]
    assert rec.device_name and rec.kernel_name
    out = tmp_path / ("again.json.gz" if stem.startswith("pnpoly") else "again.json")  # gzip is slow: once
    write_kernel_tuner_cache(out, rec)
    again = read_kernel_tuner_cache(out)
    _same_records(rec, again)
    assert again.space.names == rec.space.names
    assert [p.values for p in again.space.parameters] == [p.values for p in rec.space.parameters]
    assert (again.device_name, again.problem_size) == (rec.device_name, rec.problem_size)
    # the keys are Kernel Tuner's
    raw = json.loads(gzip.decompress((data_dir / "spaces" / f"{stem}.json.gz").read_bytes()))
    written = json.loads(gzip.decompress(out.read_bytes()) if out.suffix == ".gz" else out.read_bytes())
    assert set(written["cache"]) == set(raw["cache"])


def test_unterminated_cache_is_repaired(data_dir, tmp_path):
    text = gzip.decompress((data_dir / "spaces" / "pnpoly-RTX_3090.json.gz").read_bytes()).decode()
    full = read_kernel_tuner_cache(data_dir / "spaces" / "pnpoly-RTX_3090.json.gz")
    for cut in (len(text) - 3, len(text) // 2, len(text) // 2 + 17):
        path = tmp_path / f"cut{cut}.json"
        path.write_text(text[:cut])
        rec = read_kernel_tuner_cache(path)
        assert 0 < len(rec.records) <= len(full.records)
        assert [r.config for r in rec.records] == [r.config for r in full.records[: len(rec.records)]]
    path = tmp_path / "trailing_comma.json"
    path.write_text('{"device_name": "x", "kernel_name": "k", "tune_params_keys": ["a"], "tune_params": {"a": [1, 2]},'
                    '\n"cache": {\n"1": {"a": 1, "time": 0.5, "times": [0.5]},\n"2": {"a": 2, "time": "Compil')
    rec = read_kernel_tuner_cache(path)
    assert [(r.config, r.time_ms) for r in rec.records] == [({"a": 1}, 0.5)]


def test_garbage_files_give_space_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2, 3")
    with pytest.raises(SpaceError, match=r"bad\.json"):
        read_kernel_tuner_cache(bad)
    with pytest.raises(SpaceError, match="cannot read"):
        read_kernel_tuner_cache(tmp_path / "missing.json")
    bad.write_text('{"results": 3}')
    with pytest.raises(SpaceError, match="not a T4"):
        read_t4(bad)


def test_t4_matches_the_same_kernel_tuner_cache(data_dir, tmp_path):
    t4 = read_t4(data_dir / "spaces" / "convolution-RTX_3090_T4.json.gz")
    kt = read_kernel_tuner_cache(data_dir / "spaces" / "convolution-RTX_3090.json.gz")
    assert len(t4.records) == len(kt.records) == 6768
    by_key = {kt.space.key(r.config): r for r in kt.records}
    for r in t4.records:
        other = by_key[kt.space.key(r.config)]
        assert r.failure == other.failure
    assert t4.best().time_ms == pytest.approx(kt.best().time_ms)
    out = tmp_path / "t4.json"
    write_t4(out, t4)
    again = read_t4(out)
    _same_records(t4, again)
    # T4 → Kernel Tuner → T4 keeps the compile times
    write_kernel_tuner_cache(tmp_path / "kt.json", t4)
    via_kt = read_kernel_tuner_cache(tmp_path / "kt.json")
    _same_records(t4, via_kt)
    assert via_kt.records[0].extras["compile_time"] == t4.records[0].extras["compile_time"]


def test_t1_specs_give_the_recorded_restricted_spaces(data_dir):
    pairs = (("convolution_milo", "convolution_milo-A100"), ("dedispersion_milo", "dedispersion_milo-A100"))
    for spec_name, cache in pairs:
        spec = read_t1_spec(data_dir / "specs" / f"{spec_name}.json")
        rec = read_kernel_tuner_cache(data_dir / "spaces" / f"{cache}.json.gz")
        configs = spec.space.to_configs(spec.space.enumerate())
        assert {spec.space.key(c) for c in configs} == {rec.space.key(r.config) for r in rec.records}


def test_t1_value_expressions(data_dir):
    spec = read_t1_spec(data_dir / "specs" / "hotspot_milo.json")
    bsx = next(p for p in spec.space.parameters if p.name == "block_size_x")
    assert bsx.values[:6] == (1, 2, 4, 8, 16, 32) and bsx.values[-1] == 1024
    bsy = next(p for p in spec.space.parameters if p.name == "block_size_y")
    assert bsy.values == (1, 2, 4, 8, 16, 32) and bsy.scale == "log"
    assert any("max_tfactor" in w for w in spec.warnings)


def test_t1_value_expressions_are_sandboxed(tmp_path):
    doc = {"ConfigurationSpace": {"TuningParameters": [
        {"Name": "x", "Type": "int", "Values": "__import__('os').listdir('/')"}], "Conditions": []}}
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpaceError, match="not allowed"):
        read_t1_spec(path)
    doc["ConfigurationSpace"]["TuningParameters"][0]["Values"] = "list(range(10**12))"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpaceError, match="too"):
        read_t1_spec(path)


def test_writing_records_of_a_spec_space(tmp_path):
    space = SearchSpace.from_spec([{"name": "order", "type": "permutation", "size": 3},
                                   {"name": "v", "type": "categorical", "values": ["a", "b"]}])
    configs = space.to_configs(space.enumerate())
    recs = [Record(config=c, time_ms=float(i), times=[float(i)]) for i, c in enumerate(configs)]
    recs[1] = Record(config=recs[1].config, time_ms=None, failure="compile")
    write_kernel_tuner_cache(tmp_path / "c.json", space, recs, device_name="NVIDIA L4", kernel_name="k",
                             problem_size=[8])
    again = read_kernel_tuner_cache(tmp_path / "c.json")
    assert again.records[1].failure == "compile"
    assert [r.time_ms for r in again.records][2:] == [float(i) for i in range(2, len(recs))]
    assert again.device_name == "NVIDIA L4"
    assert np.array_equal(again.rows[:, 1], space.enumerate()[:, 1])
