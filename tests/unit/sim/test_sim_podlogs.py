"""The simulated Pods' log folder: made at start, removed at stop, never left behind."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from fleettune_dev.cluster.fleet import default_fleet
from fleettune_dev.sim import FleetSimulator
from fleettune_dev.sim.podlogs import PodLogs


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes folders
    return tmp_path


def test_the_folder_exists_only_between_start_and_stop(tmp_root: Path) -> None:
    logs = PodLogs()
    pod = {"metadata": {"namespace": "ns", "name": "p", "uid": "u"}}
    assert logs.open(object(), pod) is False  # not started: no file, no Logs object
    assert not list(tmp_root.iterdir())
    logs.start()
    folder = logs.directory
    assert folder is not None and folder.parent == tmp_root and folder.is_dir()
    (folder / "ns_p_u.log").write_text("a line\n")
    logs.stop()
    assert not folder.exists() and logs.directory is None


def test_a_simulator_built_and_never_started_leaves_nothing(tmp_root: Path) -> None:
    FleetSimulator("/nonexistent/kubeconfig", default_fleet(), time_scale=0)
    assert not list(tmp_root.iterdir())
