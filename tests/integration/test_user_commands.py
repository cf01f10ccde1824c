"""What a user does with a checkout against a real API server: `kubectl apply -f examples/`
(every document an object the cluster knows: a server-side dry-run), `fleettune export`
of a run's stored results as a Kernel Tuner cache that Kernel Tuner replays, and the
commands' one-line answers when the run is not there or the user may not read it."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from kubernetes import client

from fleettune import GROUP, PLURAL, VERSION
from fleettune.commands.export import main as export_main
from fleettune.commands.predict import main as predict_main
from fleettune.commands.report import main as report_main
from fleettune.results import TrialRecord
from fleettune.space import SearchSpace
from fleettune.store import ResultsStore
from fleettune_job.protocol import Fingerprint, Outcome

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tuningrun_kind(cluster: Any) -> Iterator[None]:
    """The TuningRun CRD installed (`operator_support.install_crd`)."""
    from operator_support import install_crd

    install_crd(cluster)
    yield


def test_kubectl_applies_the_examples_folder(cluster: Any, tuningrun_kind: None, namespace: str) -> None:
    proc = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(ROOT / "examples"), check=False)
    assert proc.returncode == 0, proc.stderr
    applied = [line for line in proc.stdout.splitlines() if line.strip()]
    documents = [doc for path in sorted((ROOT / "examples").glob("*.yaml"))
                 for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert len(applied) == len(documents), proc.stdout
    assert all(line.endswith("(server dry run)") for line in applied), proc.stdout


def test_export_reads_a_run_from_the_cluster_and_kernel_tuner_replays_it(
    cluster: Any, tuningrun_kind: None, namespace: str, api_client: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kernel_tuner = pytest.importorskip("kernel_tuner", reason="Kernel Tuner is in the dev extra")
    parameters = [{"name": "block_size_x", "type": "ordinal", "values": [32, 64, 128]},
                  {"name": "tile", "type": "ordinal", "values": [1, 2]}]
    run = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TuningRun", "metadata": {"name": "exported"},
           "spec": {"kernel": {"builtin": "gemm", "problemSize": [256, 256]}, "parameters": parameters,
                    "targets": [{"name": "a100"}]}}
    created = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, run)
    space = SearchSpace.from_spec(parameters, [])
    fp = Fingerprint(product="NVIDIA A100-SXM4-40GB", simulated=True)
    times = {}
    records = []
    for i, config in enumerate(space.to_configs(space.enumerate())):
        ms = None if i == 2 else 1.0 + i / 8
        records.append(TrialRecord(target="a100", index=i, config=config, key=space.key(config),
                                   outcome=Outcome.OK if ms else Outcome.COMPILE_ERROR, objective=ms,
                                   times=[ms] * 2 if ms else [], fingerprint=fp))
        times[(config["block_size_x"], config["tile"])] = ms
    ResultsStore(client.CoreV1Api(api_client), namespace, "exported", created["metadata"]["uid"]).append(records)

    cache = tmp_path / "exported.json"
    assert export_main(["exported", "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
                        "--format", "kernel-tuner", "-o", str(cache)]) == 0
    assert f"6 results of {namespace}/exported pool a100 (round 1, NVIDIA A100-SXM4-40GB)" in capsys.readouterr().err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = kernel_tuner.tune_kernel(
            "gemm", "__global__ void gemm(float *c) {}", (256, 256), [np.zeros(1, np.float32)],
            {"block_size_x": [32, 64, 128], "tile": [1, 2]}, simulation_mode=True, cache=str(cache),
            strategy="brute_force", quiet=True)
    assert len(results) == 6
    for res in results:
        want = times[(res["block_size_x"], res["tile"])]
        assert ("__error__" in res) if want is None else res["time"] == pytest.approx(want), res
    missing = export_main(["absent", "-n", namespace, "--kubeconfig", str(cluster.kubeconfig), "--format", "t4"])
    assert missing == 1


def test_a_missing_run_or_a_refused_user_gets_one_line(
    cluster: Any, tuningrun_kind: None, namespace: str, api_client: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kc = ["-n", namespace, "--kubeconfig", str(cluster.kubeconfig)]
    assert predict_main(["absent", *kc, "--size", "64,64"]) == 1
    assert capsys.readouterr().err.strip() == f"fleettune predict: no TuningRun 'absent' in namespace {namespace}"

    # A service account with no role: the server's refusal, in its words, and no token.
    core = client.CoreV1Api(api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    token = core.create_namespaced_service_account_token(
        "nobody", namespace, {"spec": {"expirationSeconds": 600}}).status.token
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"] = [{"name": u["name"], "user": {"token": token}} for u in config["users"]]
    refused = tmp_path / "nobody.kubeconfig"
    refused.write_text(yaml.safe_dump(config))
    for command, main in (("report", report_main), ("predict", predict_main)):
        extra = ["--size", "64,64"] if command == "predict" else []
        assert main(["absent", "-n", namespace, "--kubeconfig", str(refused), *extra]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"fleettune {command}: the API server refused to read TuningRun 'absent' in namespace "
                              f"{namespace}: 403 Forbidden: "), err
        assert f"system:serviceaccount:{namespace}:nobody" in err and "tuningruns" in err, err
        assert token not in err and "\n" not in err

    # May read the run but not its results store (ConfigMaps): said as such.
    run = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TuningRun", "metadata": {"name": "readable"},
           "spec": {"kernel": {"builtin": "gemm", "problemSize": [256, 256]}, "targets": [{"name": "a100"}],
                    "parameters": [{"name": "block_size_x", "type": "ordinal", "values": [32, 64]}]}}
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, run)
    rbac = client.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "runs-only"}, "rules": [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "runs-only"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "runs-only"},
        "subjects": [{"kind": "ServiceAccount", "name": "nobody", "namespace": namespace}]})
    err = ""
    for _ in range(50):  # the authorizer's cache takes the binding in within moments
        assert report_main(["readable", "-n", namespace, "--kubeconfig", str(refused)]) == 1
        err = capsys.readouterr().err.strip()
        if "the results of" in err:
            break
        time.sleep(0.2)
    assert err.startswith(f"fleettune report: the API server refused to read the results of TuningRun 'readable' "
                          f"in namespace {namespace}: 403 Forbidden: "), err
    assert "configmaps" in err, err
