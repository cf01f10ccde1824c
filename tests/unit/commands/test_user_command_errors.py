"""`fleettune report`, `export` and `predict` when the cluster cannot be read: one line
that says why and exit status 1, never a traceback. Real kubeconfig files and the real
client; the API server is one that refuses connections (nothing listens on port 1)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from fleettune.commands.export import main as export_main
from fleettune.commands.predict import main as predict_main
from fleettune.commands.report import main as report_main

COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "report": lambda args: report_main(args),
    "export": lambda args: export_main([*args, "--format", "kernel-tuner"]),
    "predict": lambda args: predict_main([*args, "--size", "64,64"]),
}


def kubeconfig(path: Path, server: str = "https://127.0.0.1:1") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}],
        "users": [{"name": "u", "user": {"token": "not-a-secret-but-never-printed"}}],
    }))
    return path


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unreachable_api_server_is_one_line(command: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert COMMANDS[command](["run", "--kubeconfig", str(kubeconfig(tmp_path / "kc"))]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fleettune {command}: cannot reach the API server https://127.0.0.1:1: "), err
    assert "Traceback" not in err and "\n" not in err and "never-printed" not in err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_kubeconfig_that_cannot_be_used_names_itself(command: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "absent"
    assert COMMANDS[command](["run", "--kubeconfig", str(missing)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fleettune {command}: cannot use the kubeconfig {missing}: "), err
    assert "\n" not in err

    assert COMMANDS[command](["run", "--kubeconfig", str(kubeconfig(tmp_path / "kc")), "--context", "nope"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fleettune {command}: cannot use the kubeconfig {tmp_path / 'kc'}: ") and "nope" in err
    assert "\n" not in err



def test_the_operator_without_a_cluster_says_so_before_starting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from fleettune.controller.run import main as operator_main

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    # (The client reads $KUBECONFIG once, at import.)
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "absent"))
    with pytest.raises(SystemExit) as info:
        operator_main(["--metrics-port", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fleettune operator: no cluster to run against: not in a Pod, and the kubeconfig"), err
    assert "\n" not in err
