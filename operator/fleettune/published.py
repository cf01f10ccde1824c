"""The published ConfigMap: the best configuration per pool and problem size, for
applications to read at start-up (pure: builds the object, decides whether to write;
writing it is `fleettune.controller.publisher`'s).

Data keys:

* ``tuned.json``: every entry — pool, problem size, configuration, time, fingerprint
  (`fleettune.api.TunedFor`'s camelCase form, as in the status), tuning round (key
  ``generation``, its name when the format was published) and kernel identity (``kernel``:
  a hash of the kernel, its source, parameters, constraints and objective) — as one JSON
  document;
* flat keys an application (or an env-from / volume mount) can read without a JSON
  parser: ``<pool>.<size>.<param>`` = value, ``<pool>.<size>.time_ms``,
  ``<pool>.<size>.fingerprint``, ``<pool>.<size>.generation``, ``<pool>.<size>.kernel``,
  ``<pool>.<size>.verified`` (``false`` when the outputs were never checked: the fleet
  simulator's results; absent when they were),
  and ``<pool>.sizes`` listing the tuned sizes, with ``<size>`` = ``2048x2048``.

With ``spec.publish.format: vllm``, the tables vLLM and SGLang load are written beside them
(``fleettune.servingtables``), built from the measured entries (their ``deviceName``, the GPU
as its trials reported it).

With ``spec.publish.includePredicted``, the run's predictions (``status.predictions``) fill
the (pool, size) slots that have no measured entry: in ``tuned.json`` with ``"source":
"predicted"``, ``basis`` (``sizes`` or ``gpus``) and, where known, ``predictedMs``,
``expectedFraction`` and ``expectedFractionRange``; flat keys ``<pool>.<size>.<param>``,
``<pool>.<size>.source`` = ``predicted``, ``<pool>.<size>.basis`` and
``<pool>.<size>.expected_fraction``, and ``<pool>.predicted_sizes``. Measured entries carry
no ``source`` key (as before, so readers of earlier versions and an unchanged result keep
the same bytes). A measured entry always takes the slot, kept old-round entries included;
predictions are never read back (each publish takes the run's current ones), and they are
left out first, last slots first, when the data would exceed the ConfigMap's budget
(``predictedLeftOut`` in ``tuned.json`` counts them).

Everything is sorted and free of timestamps of its own, so writing an unchanged result
(server-side apply, a restarted operator) is a no-op. One object, written in one call:
an application never sees half an update.

An entry always belongs to its pool's current round. Within a round it is replaced only
by a better result on the same fingerprint, or by a result of a newer fingerprint (a pool
whose nodes change driver one at a time). When a new round starts, the first result of
that round replaces the entry whatever its time: a driver upgrade or an edited kernel may
make the best configuration slower, and then the slower one is the truth. Until the new
round has a result, the old entry stays when the kernel is the same (a driver upgrade or a
requested re-tune: the old configuration is still a correct one for the application to
run) and is withdrawn when the kernel changed (source, parameters, constraints or
objective): a configuration measured on code that no longer exists may not even be valid.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from fleettune import servingtables
from fleettune.api import VllmTableSpec
from fleettune.fingerprint import GpuFingerprint, fingerprint_key
from fleettune.labels import MANAGED_BY, MANAGER, PUBLISHED_BY, PUBLISHED_BY_RUN, PUBLISHED_BY_UID
from fleettune.sizes import ProblemSize, size_key

TUNED_JSON = "tuned.json"
SCHEMA = "fleettune.dev/tuned/v1"
MAX_KEY = 253
MAX_BYTES = 900 * 1024  # a ConfigMap holds at most 1 MiB in all; leave room for metadata
_KEY_UNSAFE = re.compile(r"[^-._a-zA-Z0-9]+")


class PublishedEntry(BaseModel):
    """The best result of one pool on one problem size."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    pool: str
    problem_size: ProblemSize = Field(min_length=1)
    config: dict[str, Any]
    time_ms: float = Field(gt=0)
    fingerprint: GpuFingerprint = GpuFingerprint()
    trial: int | None = None
    # The pool's tuning round. Written as "generation" in tuned.json, which applications
    # read; `generation=` is also accepted here until every caller says `round=`.
    round: int = Field(default=1, validation_alias=AliasChoices("round", "generation"))
    measured_at: str = ""  # ISO-8601 time the trial was recorded: orders fingerprints
    kernel: str = ""  # the kernel's identity (`kernel_identity`); "" in entries of earlier versions
    # False: the configuration's outputs were never checked (the fleet simulator cannot compute
    # them); written as "verified": false, and absent when checked.
    verified: bool = True
    # The GPU as its trials reported it (the driver's name): serving stacks' tables are named
    # after it (`servingtables`); "" in entries of earlier versions.
    device_name: str = ""

    @property
    def slot(self) -> tuple[str, ProblemSize]:
        return self.pool, self.problem_size

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pool": self.pool,
            "problemSize": list(self.problem_size),
            "config": self.config,
            "timeMs": _significant(self.time_ms),
            "fingerprint": self.fingerprint.to_status().dump(),
            "fingerprintKey": fingerprint_key(self.fingerprint),
            "generation": self.round,
        }
        if self.trial is not None:
            out["trial"] = self.trial
        if self.measured_at:
            out["measuredAt"] = self.measured_at
        if self.kernel:
            out["kernel"] = self.kernel
        if not self.verified:
            out["verified"] = False
        if self.device_name:
            out["deviceName"] = self.device_name
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PublishedEntry:
        return cls(
            pool=data["pool"],
            problem_size=tuple(data["problemSize"]),
            config=dict(data["config"]),
            time_ms=float(data["timeMs"]),
            fingerprint=GpuFingerprint.from_status(data.get("fingerprint") or {}),
            trial=data.get("trial"),
            round=int(data.get("generation", 1)),
            measured_at=str(data.get("measuredAt", "")),
            kernel=str(data.get("kernel", "")),
            verified=data.get("verified", True) is not False,
            device_name=str(data.get("deviceName", "")),
        )


class PredictedEntry(BaseModel):
    """A prediction for a (pool, size) with no measured entry (`Prediction` of the status)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    pool: str
    problem_size: ProblemSize = Field(min_length=1)
    config: dict[str, Any]
    basis: Literal["sizes", "gpus"]  # the Prediction's source: the pool's other sizes, or the other GPUs
    kernel: str = ""
    predicted_ms: float | None = None
    expected_fraction: float | None = None
    expected_fraction_range: tuple[float, float] | None = None

    @property
    def slot(self) -> tuple[str, ProblemSize]:
        return self.pool, self.problem_size

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pool": self.pool, "problemSize": list(self.problem_size), "config": self.config,
                               "source": "predicted", "basis": self.basis}
        if self.kernel:
            out["kernel"] = self.kernel
        if self.predicted_ms is not None and self.predicted_ms > 0:
            out["predictedMs"] = _significant(self.predicted_ms)
        if self.expected_fraction is not None:
            out["expectedFraction"] = _significant(self.expected_fraction)
        if self.expected_fraction_range is not None:
            out["expectedFractionRange"] = [_significant(v) for v in self.expected_fraction_range]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PredictedEntry:
        return cls(pool=data["pool"], problem_size=tuple(data["problemSize"]), config=dict(data["config"]),
                   basis=data["basis"], kernel=str(data.get("kernel", "")), predicted_ms=data.get("predictedMs"),
                   expected_fraction=data.get("expectedFraction"),
                   expected_fraction_range=data.get("expectedFractionRange"))


def _significant(v: float) -> float:
    # Six significant digits: enough for any timing, and stable across float noise.
    return float(f"{v:.6g}")


def safe_key(text: str) -> str:
    """A ConfigMap data key (``[-._a-zA-Z0-9]+``, at most 253 characters)."""
    key = _KEY_UNSAFE.sub("_", text).strip(".") or "_"
    return key[:MAX_KEY]


def _value(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v)) if abs(v) < 2**53 else json.dumps(v)
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def flat_keys(entries: Iterable[PublishedEntry], predicted: Iterable[PredictedEntry] = ()) -> dict[str, str]:
    out: dict[str, str] = {}
    sizes: dict[str, list[ProblemSize]] = {}
    guessed: dict[str, list[ProblemSize]] = {}
    for e in entries:
        prefix = f"{e.pool}.{size_key(e.problem_size)}"
        for name, value in e.config.items():
            out[safe_key(f"{prefix}.{name}")] = _value(value)
        out[safe_key(f"{prefix}.time_ms")] = _value(_significant(e.time_ms))
        out[safe_key(f"{prefix}.fingerprint")] = fingerprint_key(e.fingerprint)
        out[safe_key(f"{prefix}.generation")] = str(e.round)
        if e.kernel:
            out[safe_key(f"{prefix}.kernel")] = e.kernel
        if not e.verified:
            out[safe_key(f"{prefix}.verified")] = "false"
        sizes.setdefault(e.pool, []).append(e.problem_size)
    for p in predicted:
        prefix = f"{p.pool}.{size_key(p.problem_size)}"
        for name, value in p.config.items():
            out[safe_key(f"{prefix}.{name}")] = _value(value)
        out[safe_key(f"{prefix}.source")] = "predicted"
        out[safe_key(f"{prefix}.basis")] = p.basis
        if p.kernel:
            out[safe_key(f"{prefix}.kernel")] = p.kernel
        if p.expected_fraction is not None:
            out[safe_key(f"{prefix}.expected_fraction")] = _value(_significant(p.expected_fraction))
        guessed.setdefault(p.pool, []).append(p.problem_size)
    for key, by_pool in (("sizes", sizes), ("predicted_sizes", guessed)):
        for pool, listed in by_pool.items():
            out[safe_key(f"{pool}.{key}")] = ",".join(size_key(s) for s in sorted(listed))
    return out


def _sorted(entries: Iterable[PublishedEntry]) -> list[PublishedEntry]:
    return sorted(entries, key=lambda e: e.slot)


def _data(run_name: str, ordered: list[PublishedEntry], predicted: list[PredictedEntry],
          left_out: int, tables: Mapping[str, str]) -> tuple[dict[str, str], int]:
    """The data and its size in bytes."""
    rows = sorted([*((e.slot, e.to_json()) for e in ordered), *((p.slot, p.to_json()) for p in predicted)],
                  key=lambda row: row[0])
    doc: dict[str, Any] = {"schema": SCHEMA, "run": run_name, "entries": [row[1] for row in rows]}
    if left_out:
        doc["predictedLeftOut"] = left_out
    data = {TUNED_JSON: json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False) + "\n"}
    flat = flat_keys(ordered, predicted)
    if TUNED_JSON in flat:  # a pool named "tuned" with a size "json" cannot exist, but be sure
        raise ValueError(f"flat key {TUNED_JSON!r} collides with the JSON document")
    data |= flat
    if data.keys() & tables.keys():
        raise ValueError(f"flat keys collide with the serving tables' {sorted(data.keys() & tables.keys())[:3]}")
    data |= tables
    return data, sum(len(k) + len(v.encode()) for k, v in data.items())


def configmap_data(run_name: str, entries: Iterable[PublishedEntry],
                   predicted: Iterable[PredictedEntry] = (), vllm: VllmTableSpec | None = None) -> dict[str, str]:
    """The ConfigMap's data: ``predicted`` fills the slots no entry holds, as many of them
    (first slots first) as fit; the measured entries (and with ``vllm``, their serving
    tables) must fit (ValueError otherwise)."""
    ordered = _sorted(entries)
    tables = servingtables.config_map_data(ordered, vllm) if vllm is not None else {}
    taken = {e.slot for e in ordered}
    guesses: dict[tuple[str, ProblemSize], list[PredictedEntry]] = {}
    for p in predicted:
        if p.slot not in taken:
            guesses.setdefault(p.slot, []).append(p)
    # One per slot whatever the order given: "gpus" (the other GPUs at this very size) first.
    fill = [min(guesses[slot], key=lambda p: (p.basis, json.dumps(p.to_json(), sort_keys=True)))
            for slot in sorted(guesses)]
    data, size = _data(run_name, ordered, fill, 0, tables)
    if size > MAX_BYTES and fill:
        # The largest number of predictions that fits (the size grows with each one kept).
        low, high = 0, len(fill) - 1
        while low < high:
            mid = (low + high + 1) // 2
            if _data(run_name, ordered, fill[:mid], len(fill) - mid, tables)[1] <= MAX_BYTES:
                low = mid
            else:
                high = mid - 1
        data, size = _data(run_name, ordered, fill[:low], len(fill) - low, tables)
    if size > MAX_BYTES:
        raise ValueError(f"published data would be {size} bytes, over the {MAX_BYTES}-byte ConfigMap budget")
    return dict(sorted(data.items()))


def published_configmap(
    run_name: str,
    namespace: str,
    owner_uid: str | None,
    entries: Iterable[PublishedEntry],
    *,
    name: str | None = None,
    run_uid: str | None = None,
) -> dict[str, Any]:
    """The whole ConfigMap (``name`` defaults to ``<run>-tuned``). With ``owner_uid`` it is
    owned by the run and garbage-collected with it; without, it outlives the run (for
    applications that must keep starting after the run is deleted). Its label and
    annotations mark it as this run's (see `not_ours`)."""
    from fleettune import GROUP, KIND, VERSION
    from fleettune.names import label_value

    meta: dict[str, Any] = {
        "name": name or f"{run_name[:247]}-tuned",
        "namespace": namespace,
        "labels": {MANAGED_BY: MANAGER, PUBLISHED_BY: label_value(run_name)},
        "annotations": {PUBLISHED_BY_RUN: run_name},
    }
    if run_uid or owner_uid:
        meta["annotations"][PUBLISHED_BY_UID] = run_uid or owner_uid
    if owner_uid:
        meta["ownerReferences"] = [{"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": run_name,
                                    "uid": owner_uid}]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": configmap_data(run_name, entries)}


def not_ours(meta: Mapping[str, Any], run_name: str) -> str | None:
    """Why an existing ConfigMap (its metadata) must not be published into by the run
    ``run_name``; None when it may.

    It may when it carries the run's publishing marks: the label ``published-by`` with the
    run's name (as a label value) and, when present (earlier versions did not write it),
    the annotation ``published-by-run`` with its whole name. Not the uid and not the owner:
    with ``retainOnDelete`` the map outlives its run, and a run re-created under the same
    name takes its published map over; and a map the run owns may be one of its results
    shards. Anything else — an application's own ConfigMap, another run's published map or
    results — is never written: replacing it would lose its data (and, owned by the run,
    garbage-collect it with the run)."""
    from fleettune.names import label_value

    name = meta.get("name", "?")
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if (labels.get(PUBLISHED_BY) == label_value(run_name) and labels.get(MANAGED_BY) == MANAGER
            and annotations.get(PUBLISHED_BY_RUN, run_name) == run_name):
        return None
    return f"spec.publish.configMapName: ConfigMap {name} exists and is not published by this run"


def read_entries(data: Mapping[str, str] | None) -> list[PublishedEntry]:
    """The entries of a published ConfigMap's data ([] when absent or unreadable: then the
    next write simply replaces it)."""
    raw = (data or {}).get(TUNED_JSON)
    if not raw:
        return []
    try:
        doc = json.loads(raw)
        # Predictions are not results: each publish takes the run's current ones instead.
        return [PublishedEntry.from_json(e) for e in doc.get("entries", []) if e.get("source") != "predicted"]
    except (ValueError, KeyError, TypeError, AttributeError, ValidationError):
        return []


def kernel_identity(space_hash: str, source_digest: str | None) -> str:
    """What a published entry was measured on: the run's space hash (kernel, parameters,
    constraints, objective) and, for CUDA source, the digest of the source text."""
    return hashlib.sha256(f"{space_hash}/{source_digest or ''}".encode()).hexdigest()[:12]


def _wins(new: PublishedEntry, old: PublishedEntry) -> bool:
    if (new.round, new.kernel) != (old.round, old.kernel):
        # A new round (or kernel): its result is the truth even when slower. Callers pass
        # only results of their pools' current rounds as new.
        return True
    if new.trial is not None and (new.trial, new.config) == (old.trial, old.config):
        # The same trial: its record as stored replaces the provisional one read from its
        # running Pod's log (which could not say whether its outputs were checked).
        return True
    if fingerprint_key(new.fingerprint) == fingerprint_key(old.fingerprint):
        # Same hardware and driver: only a strictly better time replaces, so a re-measured
        # (noisier) copy of the same configuration never makes the published one regress.
        return math.isfinite(new.time_ms) and _significant(new.time_ms) < _significant(old.time_ms)
    # Another fingerprint in the same round (nodes changing driver one at a time): the newer
    # measurement describes the pool as it is now.
    return not new.measured_at or not old.measured_at or new.measured_at >= old.measured_at


def best_entries(candidates: Iterable[PublishedEntry]) -> list[PublishedEntry]:
    """One entry per (pool, size): the fastest of the newest fingerprint among ``candidates``."""
    out: dict[tuple[str, ProblemSize], PublishedEntry] = {}
    for e in sorted(candidates, key=lambda e: (e.measured_at, e.time_ms)):
        old = out.get(e.slot)
        if old is None or _wins(e, old):
            out[e.slot] = e
    return _sorted(out.values())


def merge_entries(
    current: Iterable[PublishedEntry], new: Iterable[PublishedEntry], pools: Collection[str] | None = None,
    kernel: str | None = None,
) -> list[PublishedEntry]:
    """What to publish given what is published and the bests of the pools' current rounds.

    Entries of slots the new results do not cover are kept (an application keeps its
    configuration while its pool re-tunes the same kernel), except pools not in ``pools``
    when given (targets removed) and, when ``kernel`` is given, entries measured on
    another kernel (withdrawn until their pool has a result of this one)."""
    out = {e.slot: e for e in current
           if (pools is None or e.pool in pools) and (kernel is None or e.kernel == kernel)}
    for e in best_entries(new):
        if pools is not None and e.pool not in pools:
            continue
        old = out.get(e.slot)
        if old is None or _wins(e, old):
            out[e.slot] = e
    return _sorted(out.values())


def publish_plan(
    run_name: str, current_data: Mapping[str, str] | None, new_entries: Iterable[PublishedEntry],
    pools: Collection[str] | None = None, kernel: str | None = None, predicted: Iterable[PredictedEntry] = (),
    vllm: VllmTableSpec | None = None,
) -> dict[str, str] | None:
    """The data to write, or None when the ConfigMap already says exactly that (also
    repairs hand-edited or truncated flat keys). ``predicted``: the run's predictions, for
    the slots left without a measured entry; ``vllm``: also the serving stacks' tables."""
    measured = merge_entries(read_entries(current_data), new_entries, pools, kernel)
    guesses = [p for p in predicted if pools is None or p.pool in pools]
    desired = configmap_data(run_name, measured, guesses, vllm)
    return None if dict(current_data or {}) == desired else desired
