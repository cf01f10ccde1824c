"""The published ConfigMap: shape, keys, determinism and when it changes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from fleettune.api import TuningRunSpec
from fleettune.controller.source import KernelSource
from fleettune.controller.spec import space_hash
from fleettune.fingerprint import GpuFingerprint
from fleettune.published import (
    TUNED_JSON,
    PublishedEntry,
    best_entries,
    configmap_data,
    kernel_identity,
    merge_entries,
    publish_plan,
    published_configmap,
    read_entries,
    safe_key,
)

ROOT = Path(__file__).resolve().parents[2]
OLD = GpuFingerprint(product="NVIDIA-A100-PCIE-40GB", compute_capability="8.0", driver_version="550.54.15",
                      cuda_runtime_version="12.4")
NEW = OLD.model_copy(update={"driver_version": "560.35.03"})


def entry(pool="a100", size=(4096, 4096), t=1.0, fp=OLD, at="2025-01-01T00:00:00Z", round=1, kernel="k1",
          trial=None, **config) -> PublishedEntry:
    # Another time is another trial (a re-measured copy of a configuration has its own index).
    return PublishedEntry(pool=pool, problem_size=size, config=config or {"block_size_x": 32, "tile": 2},
                          time_ms=t, fingerprint=fp, trial=int(t * 1000 + 0.5) if trial is None else trial,
                          measured_at=at, round=round, kernel=kernel)


def should_publish(current, new, pools=None, kernel=None) -> bool:
    return publish_plan("r", configmap_data("r", read_entries(current)) if current else None, new, pools,
                        kernel) is not None


def test_configmap_shape_and_flat_keys() -> None:
    cm = published_configmap("conv", "ns", "uid-1", [entry(use_shmem=True, order=[1, 0], f=0.5, name="x y")])
    assert cm["metadata"]["name"] == "conv-tuned"
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert cm["metadata"]["labels"]["fleettune.dev/published-by"] == "conv"
    data = cm["data"]
    assert data["a100.4096x4096.use_shmem"] == "true"
    assert data["a100.4096x4096.order"] == "[1,0]"
    assert data["a100.4096x4096.f"] == "0.5"
    assert data["a100.4096x4096.name"] == "x y"
    assert data["a100.4096x4096.time_ms"] == "1"
    assert data["a100.4096x4096.fingerprint"] == "NVIDIA-A100-PCIE-40GB_sm80_drv550.54.15_cuda12.4"
    assert data["a100.sizes"] == "4096x4096"
    assert data["a100.4096x4096.generation"] == "1" and data["a100.4096x4096.kernel"] == "k1"
    assert all(re.fullmatch(r"[-._a-zA-Z0-9]+", k) for k in data)
    doc = json.loads(data[TUNED_JSON])
    assert doc["run"] == "conv"
    (e,) = doc["entries"]
    assert e["problemSize"] == [4096, 4096] and e["fingerprint"]["driverVersion"] == "550.54.15"
    assert read_entries(data) == [entry(use_shmem=True, order=[1, 0], f=0.5, name="x y")]
    # Without an owner the ConfigMap outlives the run; a name can be given.
    cm = published_configmap("conv", "ns", None, [entry()], name="conv-params")
    assert "ownerReferences" not in cm["metadata"] and cm["metadata"]["name"] == "conv-params"


def test_output_is_deterministic() -> None:
    a = [entry(pool="b", t=2.0), entry(pool="a", size=(1024,)), entry(pool="a", size=(512,))]
    first = configmap_data("r", a)
    assert configmap_data("r", list(reversed(a))) == first
    assert list(first) == sorted(first)
    assert first["a.sizes"] == "512,1024"


def test_safe_keys() -> None:
    assert safe_key("pool.4096x4096.a/b c") == "pool.4096x4096.a_b_c"
    assert safe_key("..x") == "x"
    assert len(safe_key("p" * 400)) == 253


def test_only_better_or_newer_results_replace() -> None:
    published = configmap_data("r", [entry(t=1.0)])
    assert not should_publish(published, [entry(t=1.0)])  # unchanged
    assert not should_publish(published, [entry(t=1.2, block_size_x=64)])  # worse, same fingerprint
    assert should_publish(published, [entry(t=0.9, block_size_x=64)])  # better
    # A newer fingerprint replaces even when slower: it is what the pool is now.
    assert should_publish(published, [entry(t=1.3, fp=NEW, at="2025-02-01T00:00:00Z")])
    # ...but an older measurement of another fingerprint does not.
    assert not should_publish(published, [entry(t=0.5, fp=NEW, at="2024-12-01T00:00:00Z")])
    assert should_publish(published, [entry(size=(2048, 2048))])  # new size
    assert should_publish(None, [entry()])
    assert read_entries(publish_plan("r", None, []) or {}) == []


def test_merge_keeps_other_slots_and_prunes_removed_pools() -> None:
    cur = [entry(pool="a100"), entry(pool="rtx", t=2.0)]
    merged = merge_entries(cur, [entry(pool="a100", t=0.8)])
    assert [(e.pool, e.time_ms) for e in merged] == [("a100", 0.8), ("rtx", 2.0)]
    merged = merge_entries(cur, [entry(pool="a100", t=0.8)], pools={"a100"})
    assert [e.pool for e in merged] == ["a100"]
    assert should_publish(configmap_data("r", cur), [], pools={"a100"})


def test_best_entries_pick_the_fastest_of_the_newest_fingerprint() -> None:
    cands = [entry(t=0.5, at="2025-01-01"), entry(t=0.7, fp=NEW, at="2025-02-01"),
             entry(t=0.6, fp=NEW, at="2025-02-02"), entry(t=0.9, fp=NEW, at="2025-02-03")]
    (best,) = best_entries(cands)
    assert (best.time_ms, best.fingerprint) == (0.6, NEW)


def test_publish_plan_is_none_when_nothing_changes() -> None:
    data = configmap_data("r", [entry()])
    assert publish_plan("r", data, [entry(t=1.1)]) is None
    tampered = dict(data) | {"a100.4096x4096.tile": "99"}
    assert publish_plan("r", tampered, [entry()]) == data
    plan = publish_plan("r", data, [entry(t=0.5)])
    assert plan is not None and plan["a100.4096x4096.time_ms"] == "0.5"


def test_unreadable_current_data_is_replaced() -> None:
    assert read_entries({TUNED_JSON: "{not json"}) == []
    assert read_entries({TUNED_JSON: json.dumps({"entries": [{"pool": "a"}]})}) == []
    assert publish_plan("r", {TUNED_JSON: "garbage"}, [entry()]) is not None


def test_a_new_round_replaces_the_entry_even_when_slower() -> None:
    """Whatever starts a new round (driver, re-tune, space), its first result is published:
    the older round's faster time was measured on hardware or code that is no longer there."""
    published = configmap_data("r", [entry(t=0.42)])
    plan = publish_plan("r", published, [entry(t=5.58, round=2, block_size_x=64)], kernel="k1")
    assert plan is not None
    (now,) = read_entries(plan)
    assert (now.time_ms, now.round, now.config["block_size_x"]) == (5.58, 2, 64)
    assert plan["a100.4096x4096.generation"] == "2"
    # Within the new round, only a better time replaces it.
    assert publish_plan("r", plan, [entry(t=6.0, round=2)], kernel="k1") is None


def test_an_edited_kernel_withdraws_its_entries_until_they_are_measured_again() -> None:
    published = configmap_data("r", [entry(pool="a100", t=0.42), entry(pool="rtx", t=0.9)])
    # The kernel changed (k2): rtx's new round has a result, a100's has none yet.
    plan = publish_plan("r", published, [entry(pool="rtx", t=3.0, round=2, kernel="k2")], kernel="k2")
    assert plan is not None
    assert [(e.pool, e.time_ms, e.round, e.kernel) for e in read_entries(plan)] == [("rtx", 3.0, 2, "k2")]
    assert not any(k.startswith("a100.") for k in plan)
    # The same kernel re-tuned (a driver upgrade, a requested re-tune): kept until replaced.
    assert publish_plan("r", published, [], kernel="k1") is None
    # Entries of earlier versions carry no kernel: replaced by the current round's result.
    legacy = configmap_data("r", [entry(t=0.42, kernel="")])
    (now,) = read_entries(publish_plan("r", legacy, [entry(t=0.5)], kernel="k1") or {})
    assert (now.time_ms, now.kernel) == (0.5, "k1")


def test_size_budget() -> None:
    huge = [entry(pool=f"p{i}", **{f"param_{j}": "v" * 200 for j in range(40)}) for i in range(120)]
    with pytest.raises(ValueError, match="ConfigMap budget"):
        configmap_data("r", huge)


def test_published_json_keys_stay_what_applications_read() -> None:
    e = entry(fp=OLD.model_copy(update={"mig_profile": "1g.5gb", "memory_mib": 40960}))
    doc = e.to_json()
    assert set(doc) == {"pool", "problemSize", "config", "timeMs", "fingerprint", "fingerprintKey", "generation",
                        "trial", "measuredAt", "kernel"}
    assert doc["fingerprint"] == {"product": "NVIDIA-A100-PCIE-40GB", "computeCapability": "8.0",
                                  "driverVersion": "550.54.15", "cudaRuntimeVersion": "12.4", "migProfile": "1g.5gb",
                                  "memoryMib": 40960}
    assert PublishedEntry.from_json(doc) == e


def test_the_round_is_published_as_generation() -> None:
    e = PublishedEntry.model_validate({"pool": "a", "problem_size": [8], "config": {}, "time_ms": 1.0, "round": 3})
    assert e.problem_size == (8,)
    doc = e.to_json()
    assert doc["generation"] == 3 and "round" not in doc
    assert PublishedEntry.from_json(doc).round == 3
    assert PublishedEntry.from_json({k: v for k, v in doc.items() if k != "generation"}).round == 1
    # The keyword of earlier versions, until every caller says round=.
    old = PublishedEntry(pool="a", problem_size=(8,), config={}, time_ms=1.0, generation=2)  # type: ignore[call-arg]
    assert old.round == 2


def test_a_trials_stored_record_replaces_its_provisional_one() -> None:
    """An answer read from a running Pod's log is published at once, before the Pod's end
    says whether its outputs were checked; the stored record then replaces it."""
    provisional = configmap_data("r", [entry(t=2.135, size=(64,), size_=256)])
    stored = entry(t=2.135, size=(64,), size_=256).model_copy(update={"verified": False})
    plan = publish_plan("r", provisional, [stored], kernel="k1")
    assert plan is not None and plan["a100.64.verified"] == "false"
    assert publish_plan("r", plan, [stored], kernel="k1") is None


# -- the kernel identity: what makes a published entry comparable ------------------------

_SOURCE_MAP, _RUN = yaml.safe_load_all((ROOT / "examples" / "user-kernel.yaml").read_text())
USER_KERNEL, TRANSPOSE = _RUN["spec"], _SOURCE_MAP["data"]["transpose.cu"]


def identity(raw: dict, source: str | None = TRANSPOSE) -> str:
    """The identity the operator publishes entries under: the spec's space hash and the
    digest of the source as read from its ConfigMap."""
    spec = TuningRunSpec.model_validate(raw)
    digest = None
    if spec.kernel.source is not None and source is not None:
        read = KernelSource()
        read.read(spec, {spec.kernel.source.key: source}, 0.0)
        digest = read.digest
    return kernel_identity(space_hash(spec), digest)


def edited(**changes) -> dict:
    """The user kernel's spec with parts replaced (paths joined by ``__``; list items by index)."""
    raw = copy.deepcopy(USER_KERNEL)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = raw
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value
    return raw


def reversed_keys(value):
    if isinstance(value, dict):
        return {k: reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(v) for v in value]
    return value


@pytest.mark.parametrize("change", [
    {"parameters__0__values": [8, 16, 32]},  # a value dropped
    {"parameters__0__values": [8, 16, 32, 128]},  # a value replaced
    {"parameters__1__name": "rows_per_thread"},  # a parameter renamed (the #define's name)
    {"parameters__2__type": "categorical"},
    {"parameters": [*USER_KERNEL["parameters"], {"name": "unroll", "values": [1, 2]}]},  # one more #define
    {"parameters": USER_KERNEL["parameters"][:-1]},  # one fewer
    {"constraints__0": "block_rows < tile_dim"},
    {"constraints": USER_KERNEL["constraints"][:-1]},
    {"constraints": [*USER_KERNEL["constraints"], "tile_dim >= 16"]},
    {"kernel__source__function": "transpose_v2"},
    {"kernel__source__block": ["tile_dim", "2 * block_rows"]},
    {"kernel__defaultConfig__tile_dim": 16},
], ids=lambda c: next(iter(c)))
def test_the_kernel_identity_changes_with_parameters_constraints_and_kernel(change) -> None:
    assert identity(edited(**change)) != identity(USER_KERNEL)


@pytest.mark.parametrize("source", [
    "#define UNROLL 4\n" + TRANSPOSE,  # a define of the source's own
    TRANSPOSE.replace("#if use_shared", "#if use_shared && 0"),  # a preprocessor branch
    TRANSPOSE.replace("tile_dim + use_padding", "tile_dim + 1"),
])
def test_the_kernel_identity_changes_with_the_cuda_source(source: str) -> None:
    assert identity(USER_KERNEL, source) != identity(USER_KERNEL)


def test_the_kernel_identity_changes_with_a_defines_value() -> None:
    four, eight = (identity(USER_KERNEL, f"#define UNROLL {n}\n" + TRANSPOSE) for n in (4, 8))
    assert four != eight and identity(USER_KERNEL, "#define UNROLL 4\n" + TRANSPOSE) == four


def test_the_kernel_identity_stays_when_nothing_it_covers_changes() -> None:
    first = identity(USER_KERNEL)
    assert identity(copy.deepcopy(USER_KERNEL)) == first
    assert identity(reversed_keys(USER_KERNEL)) == first  # mappings' key order, at every level
    # What decides where and how long it tunes, not what it tunes.
    assert identity(edited(budget__trialsPerTarget=99, budget__parallelism=1)) == first
    assert identity(edited(strategy={"name": "random", "seed": 5})) == first
    assert identity(edited(targets=USER_KERNEL["targets"][:1])) == first
    assert identity(edited(publish={"configMapName": "transpose-tuned"})) == first
    # The same source read again is the same kernel, and is not an edit.
    spec = TuningRunSpec.model_validate(USER_KERNEL)
    read = KernelSource()
    assert read.read(spec, {"transpose.cu": TRANSPOSE}, 0.0) is False
    before = read.digest
    assert read.read(spec, {"transpose.cu": TRANSPOSE, "other": "x"}, 1.0) is False and read.digest == before
    assert read.read(spec, {"transpose.cu": TRANSPOSE + "\n"}, 2.0) is True and read.digest != before


def test_a_builtin_kernels_identity_has_no_source_part() -> None:
    conv = yaml.safe_load((ROOT / "examples" / "convolution-fleet.yaml").read_text())["spec"]
    h = space_hash(TuningRunSpec.model_validate(conv))
    assert kernel_identity(h, None) == kernel_identity(h, None) == identity(conv)
    assert kernel_identity(h, None) != kernel_identity(h, "0" * 64)
    assert re.fullmatch(r"[0-9a-f]{12}", kernel_identity(h, None))
    conv["parameters"][0]["values"] = [16, 32]
    assert identity(conv) != kernel_identity(h, None)
