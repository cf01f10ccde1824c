"""The durable results store: every trial record of a run, in ConfigMaps it owns.

The TuningRun status only holds a bounded summary; the full history lives here, so an
operator restart loses nothing and a run of 10 000 trials never nears etcd's object
size limit. Records are gzip-compressed JSON lines in shards of at most
`SHARD_RECORDS` records; writes use the shard's resourceVersion (optimistic
concurrency), and a record is identified by (round, target, index), so writing it
twice — e.g. after a crash between recording and deleting its Job — stores it once.

Shards are named after the run *and* a hash of its uid, and read only when the run owns
them, so runs never share one; shards of earlier versions (``<run[:40]>-results-NNNN``,
same labels and owner) are still read, and appended to until full. A run that retains its
results (`fleetMemory.retainOnDelete`) writes its shards with no owner, so that they outlive
it: they are its own by their uid label.

Other runs read a store as the fleet's memory (`MemoryReader`): the shards of live runs, and
those retained, in the namespaces the operator lets share; never those of a deleted run
waiting for the garbage collector.
"""

from __future__ import annotations

import base64
import gzip
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fleettune import GROUP, KIND, PLURAL, VERSION
from fleettune.kubeapi import manifest, raw_json
from fleettune.labels import MANAGED_BY, MANAGER, RESULTS_OF_LABEL, RUN_UID_LABEL
from fleettune.names import child_name, label_value
from fleettune.results import StoredRun, TrialRecord

SHARD_RECORDS = 500
DATA_KEY = "records.jsonl.gz"

RecordId = tuple[int, str, int]  # (round, target, index)


def record_id(rec: TrialRecord) -> RecordId:
    return (rec.round, rec.target, rec.index)


def encode_shard(records: Iterable[TrialRecord]) -> str:
    lines = "".join(r.model_dump_json(exclude_none=True) + "\n" for r in records)
    return base64.b64encode(gzip.compress(lines.encode(), mtime=0)).decode()


def decode_shard(data: str | bytes) -> list[TrialRecord]:
    text = gzip.decompress(base64.b64decode(data)).decode()
    return [TrialRecord.model_validate_json(line) for line in text.splitlines() if line.strip()]


def shard_name(run: str, uid: str, index: int) -> str:
    """``<run>-<hash of uid>-results-NNNN``: unique per run object, however long its name and
    whatever other run shares its first characters (or its name, while an older run of that
    name is still being garbage-collected)."""
    return child_name(run, uid, f"results-{index:04d}")


def shard_prefix(run: str, uid: str) -> str:
    return child_name(run, uid, "results")


def _shard_order(name: str) -> tuple[int, str]:
    # Shards of earlier versions (`<run[:40]>-results-NNNN`) and current ones, by number.
    tail = name.rsplit("-", 1)[-1]
    return (int(tail) if tail.isdigit() else 1 << 30, name)


def _owners_and_run(obj: client.V1ConfigMap | Mapping[str, Any]) -> tuple[list[str], str | None]:
    """A ConfigMap's (client model or dict) owners' uids and the run uid it is labelled with."""
    if isinstance(obj, Mapping):
        meta = obj.get("metadata") or {}
        owners = [o.get("uid") for o in meta.get("ownerReferences") or []]
        return owners, (meta.get("labels") or {}).get(RUN_UID_LABEL)
    refs = (obj.metadata.owner_references if obj.metadata else None) or []
    return [o.uid for o in refs], ((obj.metadata.labels if obj.metadata else None) or {}).get(RUN_UID_LABEL)


def held_by(obj: client.V1ConfigMap | Mapping[str, Any], uid: str) -> bool:
    """Whether a ConfigMap is a shard of the run with ``uid``: owned by it, or retained (no
    owner, labelled with its uid)."""
    owners, run = _owners_and_run(obj)
    return uid in owners or (not owners and run == uid)


def _listed_name(cm: client.V1ConfigMap) -> str:
    return (cm.metadata.name if cm.metadata else None) or ""


class StoreConflict(RuntimeError):
    """Writing the store kept conflicting (another writer, or names taken): retried a few
    times with a short backoff, then given up for this step: the caller backs off too."""


@dataclass
class _Shard:
    name: str
    resource_version: str | None
    records: list[TrialRecord] = field(default_factory=list)
    retained: bool = False  # written with no owner (outlives the run)


class ResultsStore:
    """Blocking API calls: the controller runs these methods in an executor.

    A run's shards are the ConfigMaps labelled ``results-of=<run label>`` that the run (its
    uid) owns: whatever else carries the label — another run whose long name hashes alike,
    an older run of the same name not yet garbage-collected — is neither read nor written.
    """

    MAX_CONFLICTS = 6
    BACKOFF_S = 0.1

    def __init__(self, core: client.CoreV1Api, namespace: str, run: str, uid: str) -> None:
        self.core, self.namespace, self.run, self.uid = core, namespace, run, uid
        self.retained = False  # shards written from now on outlive the run (`retain`)
        self._shards: list[_Shard] = []
        self._ids: set[RecordId] = set()
        self._foreign: set[str] = set()  # shard names another object holds: never written
        # Shards that were deleted by someone else since the store last read or wrote them:
        # (name, the records it held), for the run to announce (`take_lost`).
        self.lost: list[tuple[str, list[TrialRecord]]] = []

    @property
    def records(self) -> list[TrialRecord]:
        return [r for s in self._shards for r in s.records]

    @property
    def shards(self) -> int:
        return len(self._shards)

    @property
    def prefix(self) -> str:
        return shard_prefix(self.run, self.uid)

    def __contains__(self, rid: object) -> bool:  # a RecordId
        return rid in self._ids

    def load(self) -> list[TrialRecord]:
        items = self.core.list_namespaced_config_map(
            self.namespace, label_selector=f"{RESULTS_OF_LABEL}={label_value(self.run)}"
        ).items
        shards = []
        known = {s.name: s for s in self._shards}
        for cm in sorted(items, key=lambda c: _shard_order(_listed_name(c))):
            meta = cm.metadata
            if meta is None or not meta.name or not held_by(cm, self.uid):
                continue
            old = known.get(meta.name)
            if old is not None and old.resource_version is not None and old.resource_version == meta.resource_version:
                shards.append(old)  # unchanged since read or written: not decoded again
                continue
            data = (cm.binary_data or {}).get(DATA_KEY)
            shards.append(_Shard(meta.name, meta.resource_version, decode_shard(data) if data else [],
                                 retained=not meta.owner_references))
        # A shard this store read or wrote that is gone was deleted by hand: its records
        # are lost, and the run's counts must say so rather than show what it held.
        listed = {s.name for s in shards}
        self.lost += [(s.name, s.records) for s in self._shards
                      if s.resource_version is not None and s.name not in listed and s.records]
        self._shards = shards
        self._ids = {record_id(r) for r in self.records}
        return self.records

    def retain(self, retained: bool) -> None:
        """Let the shards outlive the run (no owner), or go with it again: those written
        already are rewritten. A conflict leaves the rest for the next call."""
        self.retained = retained
        for shard in self._shards:
            if shard.resource_version is not None and shard.retained != retained:
                try:
                    self._write(shard, shard.records)
                except ApiException as exc:
                    if exc.status not in (404, 409):
                        raise
                    self.load()
                    return

    def take_lost(self) -> list[tuple[str, list[TrialRecord]]]:
        """The shards found deleted since the last call: (name, the records lost with it)."""
        lost, self.lost = self.lost, []
        return lost

    def _free_name(self) -> str:
        taken = {s.name for s in self._shards} | self._foreign
        index = len(self._shards)
        while shard_name(self.run, self.uid, index) in taken:
            index += 1
        return shard_name(self.run, self.uid, index)

    def append(self, records: Iterable[TrialRecord]) -> list[TrialRecord]:
        """Store new records durably; returns those that were not stored before.

        A conflict (the shard changed, or its name is taken) is retried at most
        MAX_CONFLICTS times, with a growing pause, then raised as StoreConflict: never a
        tight loop of failing writes."""
        fresh = []
        for rec in records:
            if record_id(rec) not in self._ids:
                self._ids.add(record_id(rec))
                fresh.append(rec)
        pending = list(fresh)
        conflicts = 0
        while pending:
            if not self._shards or len(self._shards[-1].records) >= SHARD_RECORDS:
                self._shards.append(_Shard(self._free_name(), None))
            shard = self._shards[-1]
            room = SHARD_RECORDS - len(shard.records)
            batch, pending = pending[:room], pending[room:]
            try:
                self._write(shard, shard.records + batch)
            except Exception as exc:
                status = exc.status if isinstance(exc, ApiException) else None
                conflict = status in (409, 404)
                conflicts += conflict
                if not conflict or conflicts > self.MAX_CONFLICTS:
                    # Not stored (as far as we know: a write that landed anyway shows up as a
                    # conflict next time): these records must be offered again, or the Jobs
                    # they came from would be deleted with their results unrecorded.
                    self._ids.difference_update(record_id(r) for r in batch + pending)
                    if conflict:
                        raise StoreConflict(f"results store of {self.run}: {conflicts} conflicting writes "
                                            f"in a row (last on ConfigMap {shard.name})") from None
                    raise
                if shard.resource_version is None and status == 409 and not self._ours(shard.name):
                    # The name is held by an object this run does not own: leave it alone
                    # and store under the next free name.
                    self._foreign.add(shard.name)
                    self._shards.pop()
                    pending = batch + pending
                    continue
                time.sleep(min(self.BACKOFF_S * 2 ** (conflicts - 1), 1.0))
                # Someone else wrote (an older operator instance?): reload, then retry what is missing.
                self.load()
                pending = [r for r in batch + pending if record_id(r) not in self._ids]
                self._ids.update(record_id(r) for r in pending)
                continue
            shard.records.extend(batch)
        return fresh

    def _ours(self, name: str) -> bool:
        """Whether the existing ConfigMap ``name`` is one of this run's shards (gone: not foreign)."""
        try:
            resp = self.core.read_namespaced_config_map(name, self.namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return held_by(raw_json(resp), self.uid)

    def _write(self, shard: _Shard, records: list[TrialRecord]) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": shard.name,
                "namespace": self.namespace,
                "labels": {MANAGED_BY: MANAGER, RESULTS_OF_LABEL: label_value(self.run), RUN_UID_LABEL: self.uid},
                "ownerReferences": [] if self.retained else [
                    {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": self.run, "uid": self.uid}
                ],
            },
            "binaryData": {DATA_KEY: encode_shard(records)},
        }
        # Raw answers: only the new resourceVersion is needed, not the client's slow models.
        if shard.resource_version is None:
            resp = self.core.create_namespaced_config_map(self.namespace, manifest(body), _preload_content=False)
        else:
            body["metadata"]["resourceVersion"] = shard.resource_version
            resp = self.core.replace_namespaced_config_map(shard.name, self.namespace, manifest(body),
                                                           _preload_content=False)
        shard.resource_version, shard.retained = raw_json(resp)["metadata"]["resourceVersion"], self.retained


class MemoryReader:
    """Reads the fleet's memory for one run: the records of its kernel in the other runs'
    stores of the namespaces it may read (`controller.memory`). A shard is decoded once per
    resourceVersion. Blocking API calls: run in an executor."""

    def __init__(self, core: client.CoreV1Api, custom: client.CustomObjectsApi) -> None:
        self.core, self.custom = core, custom
        self._decoded: dict[tuple[str, str], tuple[str | None, list[TrialRecord]]] = {}

    def read(self, namespaces: Iterable[str], kernel: str, own_uid: str) -> tuple[list[StoredRun], list[str]]:
        """(the stores with records of ``kernel``, what could not be read: one line per namespace)."""
        runs: list[StoredRun] = []
        problems: list[str] = []
        for namespace in namespaces:
            try:
                runs += self._read_namespace(namespace, kernel, own_uid)
            except ApiException as exc:
                problems.append(f"cannot read the results stores in namespace {namespace}: {_refusal(exc)}")
        return runs, problems

    def _read_namespace(self, namespace: str, kernel: str, own_uid: str) -> list[StoredRun]:
        listed: dict[str, Any] = self.custom.list_namespaced_custom_object(  # type: ignore[assignment]
            GROUP, VERSION, namespace, PLURAL)
        live = {item["metadata"]["uid"]: item["metadata"]["name"] for item in listed.get("items", [])}
        shards = self.core.list_namespaced_config_map(namespace, label_selector=RESULTS_OF_LABEL).items
        present = {(namespace, cm.metadata.name) for cm in shards if cm.metadata is not None}
        for gone in [key for key in self._decoded if key[0] == namespace and key not in present]:
            del self._decoded[gone]
        found: dict[str, StoredRun] = {}
        for cm in shards:
            meta = cm.metadata
            owners, uid = _owners_and_run(cm)
            if meta is None or not meta.name or uid is None or uid == own_uid:
                continue
            # A live run's, or retained (no owner): never a deleted run's that the garbage
            # collector has not removed yet.
            if owners and not any(o in live for o in owners):
                continue
            records = [r for r in self._decode(namespace, cm) if r.kernel == kernel]
            if not records:
                continue
            name = live.get(uid) or (meta.labels or {}).get(RESULTS_OF_LABEL, meta.name)
            run = found.setdefault(uid, StoredRun(namespace, name, uid, not owners, []))
            run.records.extend(records)
        return list(found.values())

    def _decode(self, namespace: str, cm: client.V1ConfigMap) -> list[TrialRecord]:
        assert cm.metadata is not None and cm.metadata.name
        key, version = (namespace, cm.metadata.name), cm.metadata.resource_version
        cached = self._decoded.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        data = (cm.binary_data or {}).get(DATA_KEY)
        try:
            records = decode_shard(data) if data else []
        except (ValueError, OSError):  # not a shard this operator wrote: nothing to learn from
            records = []
        self._decoded[key] = (version, records)
        return records


# ---------------------------------------------------------------------- read from outside the operator


class ReadError(Exception):
    """A person's command cannot read a run: the message says why, in one line."""


class RunNotFound(ReadError, LookupError):
    """No TuningRun of that name in that namespace."""


def read_run(name: str, namespace: str | None = None, kubeconfig: str | None = None,
             context: str | None = None) -> tuple[dict[str, Any], list[TrialRecord], str]:
    """A TuningRun and every record of its results store, as a person's command reads them
    (`fleettune report`, `export`, `predict`): with a kubeconfig (``$KUBECONFIG`` or
    ``~/.kube/config``; the context's namespace when none is given), or in a Pod, its service
    account. Returns (the run as a dict, its records, the namespace); raises RunNotFound, or
    ReadError for a kubeconfig that cannot be used, an API server that cannot be reached or
    a refusal (the server's own words: which user may not do what)."""
    from pathlib import Path

    from kubernetes import config
    from urllib3.exceptions import HTTPError

    sa = Path("/var/run/secrets/kubernetes.io/serviceaccount")
    from_file = bool(kubeconfig or context or not (sa / "token").exists())
    try:
        if from_file:
            api = config.new_client_from_config(config_file=kubeconfig, context=context)
            if namespace is None:
                contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
                if context:
                    active = next((c for c in contexts if c["name"] == context), active)
                namespace = (active or {}).get("context", {}).get("namespace") or "default"
        else:
            config.load_incluster_config()
            api = client.ApiClient()
            namespace = namespace or (sa / "namespace").read_text().strip()
    except (config.ConfigException, OSError) as exc:
        where = f"the kubeconfig {kubeconfig or '($KUBECONFIG or ~/.kube/config)'}" if from_file \
            else "the Pod's service account"
        raise ReadError(f"cannot use {where}: {exc}") from None
    what = f"TuningRun {name!r} in namespace {namespace}"
    run: dict[str, Any] = {}
    with api:
        try:
            # A dict: the client builds no model for custom objects.
            run = client.CustomObjectsApi(api).get_namespaced_custom_object(  # type: ignore[assignment]
                GROUP, VERSION, namespace, PLURAL, name)
            records = ResultsStore(client.CoreV1Api(api), namespace, name, run["metadata"]["uid"]).load()
        except ApiException as exc:
            if exc.status == 404 and not run:
                raise RunNotFound(f"no {what}") from None
            whose = f"the results of {what}" if run else what
            raise ReadError(f"the API server refused to read {whose}: {_refusal(exc)}") from None
        except (HTTPError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ReadError(f"cannot reach the API server {api.configuration.host}: {reason}") from None
    return run, records, namespace


def _refusal(exc: ApiException) -> str:
    """The status code and the server's message (a Status object's ``message``)."""
    try:
        message = json.loads(exc.body or "{}").get("message") or ""
    except (ValueError, AttributeError):
        message = ""
    return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")
