"""The durable results store: every trial record of a run, in ConfigMaps it owns.

The TuningRun status only holds a bounded summary; the full history lives here, so an
operator restart loses nothing and a run of 10 000 trials never nears etcd's object
size limit. Records are gzip-compressed JSON lines in shards of at most
`SHARD_RECORDS` records; writes use the shard's resourceVersion (optimistic
concurrency), and a record is identified by (generation, target, index), so writing it
twice — e.g. after a crash between recording and deleting its Job — stores it once.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fleettune import GROUP, KIND, VERSION
from fleettune.jobs import MANAGED_BY
from fleettune.results import TrialRecord

SHARD_RECORDS = 500
RESULTS_OF = f"{GROUP}/results-of"
DATA_KEY = "records.jsonl.gz"

RecordId = tuple[int, str, int]


def record_id(rec: TrialRecord) -> RecordId:
    return (rec.generation, rec.target, rec.index)


def encode_shard(records: Iterable[TrialRecord]) -> str:
    lines = "".join(r.model_dump_json(exclude_none=True) + "\n" for r in records)
    return base64.b64encode(gzip.compress(lines.encode(), mtime=0)).decode()


def decode_shard(data: str) -> list[TrialRecord]:
    text = gzip.decompress(base64.b64decode(data)).decode()
    return [TrialRecord.model_validate_json(line) for line in text.splitlines() if line.strip()]


def shard_name(run: str, index: int) -> str:
    return f"{run[:40]}-results-{index:04d}"


@dataclass
class _Shard:
    name: str
    resource_version: str | None
    records: list[TrialRecord] = field(default_factory=list)


class ResultsStore:
    """Blocking API calls: the controller runs these methods in an executor."""

    def __init__(self, core: client.CoreV1Api, namespace: str, run: str, uid: str) -> None:
        self.core, self.namespace, self.run, self.uid = core, namespace, run, uid
        self._shards: list[_Shard] = []
        self._ids: set[RecordId] = set()

    @property
    def records(self) -> list[TrialRecord]:
        return [r for s in self._shards for r in s.records]

    @property
    def shards(self) -> int:
        return len(self._shards)

    def __contains__(self, rid: RecordId) -> bool:
        return rid in self._ids

    def load(self) -> list[TrialRecord]:
        items = self.core.list_namespaced_config_map(
            self.namespace, label_selector=f"{RESULTS_OF}={self.run}"
        ).items
        shards = []
        for cm in sorted(items, key=lambda c: c.metadata.name):
            data = (cm.binary_data or {}).get(DATA_KEY)
            shards.append(_Shard(cm.metadata.name, cm.metadata.resource_version, decode_shard(data) if data else []))
        self._shards = shards
        self._ids = {record_id(r) for r in self.records}
        return self.records

    def append(self, records: Iterable[TrialRecord]) -> list[TrialRecord]:
        """Store new records durably; returns those that were not stored before."""
        fresh = []
        for rec in records:
            if record_id(rec) not in self._ids:
                self._ids.add(record_id(rec))
                fresh.append(rec)
        pending = list(fresh)
        while pending:
            if not self._shards or len(self._shards[-1].records) >= SHARD_RECORDS:
                self._shards.append(_Shard(shard_name(self.run, len(self._shards)), None))
            shard = self._shards[-1]
            room = SHARD_RECORDS - len(shard.records)
            batch, pending = pending[:room], pending[room:]
            try:
                self._write(shard, shard.records + batch)
            except Exception as exc:
                if not isinstance(exc, ApiException) or exc.status not in (409, 404):
                    # Not stored (as far as we know: a write that landed anyway shows up as a
                    # conflict next time): these records must be offered again, or the Jobs
                    # they came from would be deleted with their results unrecorded.
                    self._ids.difference_update(record_id(r) for r in batch + pending)
                    raise
                # Someone else wrote (an older operator instance?): reload, then retry what is missing.
                self.load()
                pending = [r for r in batch + pending if record_id(r) not in self._ids]
                self._ids.update(record_id(r) for r in pending)
                continue
            shard.records.extend(batch)
        return fresh

    def _write(self, shard: _Shard, records: list[TrialRecord]) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": shard.name,
                "namespace": self.namespace,
                "labels": {MANAGED_BY: "fleettune", RESULTS_OF: self.run},
                "ownerReferences": [
                    {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": self.run, "uid": self.uid}
                ],
            },
            "binaryData": {DATA_KEY: encode_shard(records)},
        }
        # Raw answers: only the new resourceVersion is needed, not the client's slow models.
        if shard.resource_version is None:
            resp = self.core.create_namespaced_config_map(self.namespace, body, _preload_content=False)
        else:
            body["metadata"]["resourceVersion"] = shard.resource_version
            resp = self.core.replace_namespaced_config_map(shard.name, self.namespace, body,
                                                           _preload_content=False)
        shard.resource_version = json.loads(resp.data)["metadata"]["resourceVersion"]
