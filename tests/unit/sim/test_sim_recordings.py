"""Recording lookup, synthetic models and the answers the simulator gives (no cluster)."""

from __future__ import annotations

import gzip
import json

import pytest

from fleettune_dev.cluster.fleet import default_fleet, packaged_recordings_dir
from fleettune_dev.sim.answer import answer_trial, fingerprint
from fleettune_dev.sim.recordings import (
    Measurement,
    RecordedKernel,
    Recording,
    SyntheticKernel,
    compact_recording,
    load_recording,
    noise_factor,
)
from fleettune_job.protocol import Outcome, Trial, decode

A100 = packaged_recordings_dir() / "convolution_milo-A100.json.gz"
A4000 = packaged_recordings_dir() / "convolution_milo-A4000.json.gz"


def _raw(path):
    return json.loads(gzip.decompress(path.read_bytes()))


def _config(key: str, raw: dict) -> dict:
    return dict(zip(raw["tune_params_keys"], (int(v) for v in key.split(",")), strict=True))


@pytest.fixture(scope="module")
def raw_a100():
    return _raw(A100)


@pytest.fixture(scope="module")
def a100():
    return load_recording(A100)


def _trial(config: dict, **kw) -> Trial:
    return Trial(run="r", target="a100", index=0, kernel={"builtin": "convolution"}, config=config,
                 problem_size=[4096, 4096], **kw)


def _tiny() -> Recording:
    table = {"16,1,15": Measurement(1.0, (1.0, 1.1)), "32,1,15": Measurement(None, failure="runtime"),
             "16,2,15": Measurement(2.0, (2.0,))}
    return Recording(name="tiny", device_name="GPU", kernel_name="k", problem_size=[10],
                     keys=("bx", "by", "f"), table=table)


def test_key_normalises_values_and_fills_constants():
    rec = _tiny()
    assert rec.key({"bx": 16, "by": 1, "f": 15}) == "16,1,15"
    assert rec.key({"bx": 16.0, "by": True}) == "16,1,15"  # JSON/YAML round trips; f is constant
    with pytest.raises(KeyError, match="'by' is missing"):
        rec.key({"bx": 16})
    with pytest.raises(KeyError, match="bx=17 was never recorded"):
        rec.key({"bx": 17, "by": 1})
    assert rec.lookup({"bx": 32, "by": 1}).failure == "runtime"
    assert rec.lookup({"bx": 32, "by": 2}) is None  # absent: violates the recorded restrictions


def test_packaged_recordings_load_with_their_failures(a100, raw_a100):
    assert a100.device_name == "NVIDIA A100-PCIE-40GB"
    assert a100.problem_size == [4096, 4096]
    assert a100.keys == tuple(raw_a100["tune_params_keys"])
    assert len(a100.table) == len(raw_a100["cache"]) == 4362
    failures = [m.failure for m in a100.table.values() if m.failure]
    assert failures.count("runtime") == 155 and failures.count("compile") == 6
    best = min(m.time_ms for m in a100.table.values() if m.time_ms is not None)
    assert best == pytest.approx(0.5536, abs=1e-4)
    assert all(len(m.times) <= 8 for m in a100.table.values())


def test_lookup_by_kernel_tuner_key(a100, raw_a100):
    for key, entry in list(raw_a100["cache"].items())[::500]:
        m = a100.lookup(_config(key, raw_a100))
        if isinstance(entry["time"], str):
            assert m.failure in ("compile", "runtime")
        else:
            assert m.time_ms == entry["time"] and list(m.times) == entry["times"][:8]


def test_recorded_answers_follow_the_protocol(a100, raw_a100):
    pool = default_fleet().pool("a100")
    labels = pool.node_labels("a100-0")
    model = RecordedKernel(a100)
    ok_key = next(k for k, e in raw_a100["cache"].items() if not isinstance(e["time"], str))
    ans = answer_trial(_trial(_config(ok_key, raw_a100)), pool, labels, model)
    res = decode(ans.result.encode())
    assert res.outcome == Outcome.OK and res.objective == pytest.approx(raw_a100["cache"][ok_key]["time"])
    assert len(res.times) == 7 and res.fingerprint.simulated and not res.fingerprint.synthetic
    assert res.fingerprint.product == "NVIDIA A100-PCIE-40GB"
    assert res.fingerprint.compute_capability == "8.0"
    assert res.fingerprint.driver_version == pool.gpu.driver_version
    assert 0.8 < ans.duration_s < 1.0
    for kt, outcome in (("RuntimeFailedConfig", Outcome.LAUNCH_ERROR), ("CompilationFailedConfig",
                                                                        Outcome.COMPILE_ERROR)):
        key = next(k for k, e in raw_a100["cache"].items() if e["time"] == kt)
        res = answer_trial(_trial(_config(key, raw_a100)), pool, labels, model).result
        assert res.outcome == outcome and res.outcome.is_invalid_configuration
        assert kt in res.error and res.objective is None


def test_configuration_absent_from_the_recording_is_a_synthetic_invalid_config(a100):
    pool = default_fleet().pool("a100")
    # block 256x16 = 4096 threads: outside the recorded (restricted) space.
    config = {"block_size_x": 256, "block_size_y": 16, "tile_size_x": 1, "tile_size_y": 1, "read_only": 0,
              "use_padding": 0, "use_shmem": 0}
    res = answer_trial(_trial(config), pool, {}, RecordedKernel(a100)).result
    assert res.outcome == Outcome.COMPILE_ERROR and res.fingerprint.synthetic
    assert "InvalidConfig" in res.error and "not in recording" in res.error
    res = answer_trial(_trial({**config, "block_size_x": 999}), pool, {}, RecordedKernel(a100)).result
    assert "block_size_x=999 was never recorded" in res.error


def test_driver_upgrade_shows_in_the_fingerprint():
    pool = default_fleet().pool("a100")
    labels = pool.node_labels("a100-0") | {"nvidia.com/cuda.driver-version.full": "560.1.2"}
    assert fingerprint(pool, labels, synthetic=False).driver_version == "560.1.2"
    jetson = default_fleet().pool("jetson-orin")
    fp = fingerprint(jetson, jetson.node_labels("jetson-orin-0"), synthetic=True)
    assert (fp.product, fp.compute_capability, fp.synthetic) == ("Jetson AGX Orin", "8.7", True)


def test_synthetic_model_is_deterministic_slower_and_marked(raw_a100):
    base = load_recording(A4000)
    model = SyntheticKernel(base, slowdown=2.8, noise=0.04, seed=0, label="jetson-orin/convolution")
    raw = _raw(A4000)
    ok = [k for k, e in raw["cache"].items() if not isinstance(e["time"], str)][:200]
    ratios = []
    for key in ok:
        cfg = _config(key, raw)
        m = model.measure(cfg)
        assert m.synthetic and m == model.measure(cfg)
        ratios.append(m.time_ms / raw["cache"][key]["time"])
    assert 2.6 < sorted(ratios)[len(ratios) // 2] < 3.0
    assert len(set(round(r, 6) for r in ratios)) > 100, "noise differs per configuration"
    other_seed = SyntheticKernel(base, slowdown=2.8, noise=0.04, seed=1, label="jetson-orin/convolution")
    assert other_seed.measure(_config(ok[0], raw)).time_ms != model.measure(_config(ok[0], raw)).time_ms
    failed = next(k for k, e in raw["cache"].items() if isinstance(e["time"], str))
    m = model.measure(_config(failed, raw))
    assert m.failure and m.synthetic
    pool = default_fleet().pool("jetson-orin")
    res = answer_trial(_trial(_config(ok[0], raw)), pool, pool.node_labels("jetson-orin-0"), model).result
    assert res.outcome == Outcome.OK and res.fingerprint.synthetic


def test_noise_factor_has_median_one():
    values = sorted(noise_factor(0.1, "x", i) for i in range(2001))
    assert values[1000] == pytest.approx(1.0, abs=0.02)
    assert noise_factor(0, "x") == 1.0


def test_problem_size_scaling_and_timeouts(a100, raw_a100):
    pool = default_fleet().pool("a100")
    key = next(k for k, e in raw_a100["cache"].items() if not isinstance(e["time"], str))
    cfg = _config(key, raw_a100)
    t = raw_a100["cache"][key]["time"]
    small = Trial(run="r", target="a100", index=0, kernel={"builtin": "convolution"}, config=cfg,
                  problem_size=[2048, 2048])
    res = answer_trial(small, pool, {}, RecordedKernel(a100)).result
    assert res.objective == pytest.approx(t / 4) and res.fingerprint.synthetic
    slow = _trial(cfg, timeout_s=0.5)
    ans = answer_trial(slow, pool, {}, RecordedKernel(a100))
    assert ans.result.outcome == Outcome.TIMEOUT and ans.duration_s == 0.5
    longer = answer_trial(_trial(cfg, min_duration_s=2.0), pool, {}, RecordedKernel(a100))
    assert longer.duration_s == pytest.approx(0.85 + 2.0)


def test_compact_recording_keeps_a_valid_cache(tmp_path, raw_a100):
    n, size = compact_recording(A100, tmp_path / "c.json.gz", repeats=2)
    assert n == 4362 and size == (tmp_path / "c.json.gz").stat().st_size
    rec = load_recording(tmp_path / "c.json.gz")
    assert rec.keys == tuple(raw_a100["tune_params_keys"])
    assert all(len(m.times) <= 2 for m in rec.table.values())
