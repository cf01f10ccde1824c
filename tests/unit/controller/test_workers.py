"""The worker clusters the operator reads MultiKueue-dispatched trials from (docs/operations/multikueue.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleettune.controller.kube import load_workers


def _kubeconfig(server: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "w",
        "clusters": [{"name": "w", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "w", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "w", "context": {"cluster": "w", "user": "w"}}],
    })


def test_each_mounted_secret_or_file_is_one_worker_named_by_its_entry(tmp_path: Path) -> None:
    (tmp_path / "jetson-site").mkdir()
    (tmp_path / "jetson-site" / "kubeconfig").write_text(_kubeconfig("https://10.0.0.1:6443"))
    (tmp_path / "lab.yaml").write_text(_kubeconfig("https://10.0.0.2:6443"))
    (tmp_path / "..data").mkdir()  # what a Secret volume holds beside its keys
    (tmp_path / "empty").mkdir()
    workers = load_workers(str(tmp_path))
    assert {name: api.configuration.host for name, api in workers.items()} == {
        "jetson-site": "https://10.0.0.1:6443", "lab.yaml": "https://10.0.0.2:6443"}
    assert load_workers("") == {}


def test_a_setting_that_is_not_a_folder_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"FLEETTUNE_WORKER_KUBECONFIGS=.*not a folder"):
        load_workers(str(tmp_path / "missing"))


def test_a_workers_ended_trial_pod_is_kept_by_job_name_until_forgotten() -> None:
    from fleettune.controller.watch import EndedPods, job_name_of
    from fleettune_job.protocol import CONTAINER_NAME

    def pod(phase: str, code: int | None) -> dict:
        state = {"terminated": {"exitCode": code}} if code is not None else {"running": {}}
        labels = {"batch.kubernetes.io/job-name": "conv-a100-0003"}
        return {"metadata": {"name": "p", "namespace": "ns", "labels": labels},
                "status": {"phase": phase, "containerStatuses": [{"name": CONTAINER_NAME, "state": state}]}}

    kept = EndedPods(key=job_name_of)
    assert not kept.observe(None, pod("Running", None)) and kept.get("ns", "conv-a100-0003") is None
    # A trial Job is never retried: any end but a disruption's is final, and kept once.
    assert kept.observe(None, pod("Failed", 137)) and not kept.observe(None, pod("Failed", 137))
    assert kept.get("ns", "conv-a100-0003")["status"]["phase"] == "Failed"
    kept.job_deleted("ns", "conv-a100-0003")
    assert kept.get("ns", "conv-a100-0003") is None
