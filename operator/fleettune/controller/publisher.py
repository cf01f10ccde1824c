"""Publishing a run's best configurations into its ConfigMap (I/O; the decisions are
`fleettune.published`'s).

Only when the best improves, and only into a ConfigMap this run created or publishes
into (`published.not_ours`): any other is left untouched and the refusal shown in the
`Published` condition.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from fleettune.api import Prediction, PublishSpec
from fleettune.controller.kube import Kube
from fleettune.controller.pool import Pool
from fleettune.fingerprint import GpuFingerprint
from fleettune.names import bounded
from fleettune.published import PredictedEntry, PublishedEntry, not_ours, publish_plan, published_configmap
from fleettune.results import TrialRecord
from fleettune.rollup import PUBLISH_FAILED, PUBLISH_REFUSED, outputs_unverified, ranked

PUBLISH_RECHECK_S = 60.0


def entries(pools: Iterable[Pool], records: Sequence[TrialRecord], kernel: str) -> list[PublishedEntry]:
    """The best configuration of each pool's current round, where it has one."""
    out = []
    for pool in pools:
        mine = pool.records(records)
        best = ranked(mine)
        if best and best[0].objective is not None:  # ranked results are valid: they have one
            out.append(PublishedEntry(
                pool=pool.spec.name, problem_size=pool.problem_size, config=best[0].config,
                time_ms=best[0].objective, fingerprint=pool.tuned_for or GpuFingerprint(),
                trial=best[0].index, round=pool.round, measured_at=best[0].recorded_at, kernel=kernel,
                verified=not outputs_unverified(mine),
                device_name=best[0].fingerprint.product if best[0].fingerprint is not None else "",
            ))
    return out


def predicted(predictions: Iterable[Prediction | Mapping[str, Any]], kernel: str) -> list[PredictedEntry]:
    """The run's predictions (`status.predictions`, as models or in their camelCase form)
    that recommend a configuration, as entries to publish for their slots."""
    out = []
    for raw in predictions:
        try:
            p = raw if isinstance(raw, Prediction) else Prediction.model_validate(raw)
        except ValidationError:
            continue  # a malformed one is no recommendation
        if p.config is None:
            continue  # no valid result to predict from yet, or the prediction failed
        low_high = p.expected_fraction_range
        out.append(PredictedEntry(
            pool=p.target, problem_size=tuple(p.problem_size), config=p.config, basis=p.source, kernel=kernel,
            predicted_ms=p.predicted_ms, expected_fraction=p.expected_fraction,
            expected_fraction_range=(low_high[0], low_high[1]) if low_high else None,
        ))
    return out


class Publisher:
    def __init__(self, kube: Kube, namespace: str, run: str, uid: str,
                 log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self.kube, self.namespace, self.run, self.uid, self.log = kube, namespace, run, uid, log
        # The ConfigMap as last read or written: its data and resourceVersion (None: there is
        # none), when it was read, and why it may not be written (None: it may).
        self.data: dict[str, str] | None = None
        self.resource_version: str | None = None
        self.read_at: tuple[str, float] | None = None
        self.problem: str | None = None
        self.error: str | None = None  # the last attempt failed (retried)
        self.target: PublishSpec | None = None

    def condition(self) -> tuple[bool, str, str] | None:
        """The `Published` condition: None when the run does not publish."""
        if self.target is None:
            return None
        if self.problem is not None:
            return False, PUBLISH_REFUSED, self.problem
        if self.error is not None:
            return False, PUBLISH_FAILED, self.error
        if self.resource_version is None:
            return False, "NothingYet", "no result to publish yet"
        return True, "Published", ""

    async def _read(self, name: str) -> None:
        cm = await asyncio.to_thread(self.kube.get_config_map, self.namespace, name)
        self.read_at = (name, time.monotonic())
        self.problem = not_ours(cm["metadata"], self.run) if cm is not None else None
        if cm is None or self.problem is not None:
            self.data, self.resource_version = None, None
        else:
            self.data, self.resource_version = cm.get("data") or {}, cm["metadata"]["resourceVersion"]

    def recheck(self) -> None:
        """Read the ConfigMap again on the next publish (it changed, or was deleted)."""
        self.read_at = None

    @property
    def refused_name(self) -> str | None:
        """The ConfigMap this run may not publish into, while it may not."""
        return self.target.config_map_name if self.target is not None and self.problem is not None else None

    async def publish(self, target: PublishSpec | None, pools: set[str], best: list[PublishedEntry],
                      kernel: str, predictions: Iterable[Prediction | Mapping[str, Any]] = ()) -> None:
        """``predictions``: the run's (`status.predictions`), published where ``target``
        includes them."""
        self.target = target
        if target is None:
            self.problem = None
            return
        name = target.config_map_name
        last = self.read_at
        try:
            # Read again now and then: the ConfigMap may have been deleted, or a refused name freed.
            if last is None or last[0] != name or time.monotonic() - last[1] > PUBLISH_RECHECK_S:
                await self._read(name)
            if self.problem is not None:
                return
            guesses = predicted(predictions, kernel) if target.include_predicted else []
            data = publish_plan(self.run, self.data, best, pools=pools, kernel=kernel, predicted=guesses,
                                vllm=target.vllm if target.format == "vllm" else None)
            if data is None:
                self.error = None
                return
            body = published_configmap(
                self.run, self.namespace, None if target.retain_on_delete else self.uid, [],
                name=name, run_uid=self.uid,
            )
            body["data"] = data
            # Only over the version read: a ConfigMap created or changed since is read (and
            # judged) again on the next step instead of being overwritten.
            rv = await asyncio.to_thread(self.kube.write_config_map, self.namespace, body, self.resource_version)
        except ApiException as exc:
            self.read_at = None
            if exc.status not in (404, 409):
                self.error = f"writing ConfigMap {name}: {exc.status} {bounded(exc.reason, 200)}"
                self.log.warning("publishing to ConfigMap %s failed: %s", name, bounded(exc, 300))
            return
        except ValueError as exc:  # more than a ConfigMap holds
            self.error = f"spec.publish.configMapName: {bounded(exc, 300)}"
            return
        self.data, self.resource_version, self.error = data, rv, None
        self.log.info("published the best configurations to ConfigMap %s", name)
