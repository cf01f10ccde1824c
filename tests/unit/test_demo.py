"""What `fleettune demo` prints (no cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from fleettune_dev.demo import _summary, _table, run_name

CONFIG = {f"parameter_number_{i}": i * 16 for i in range(12)}
RUN = {
    "metadata": {"name": "convolution-fleet"},
    "status": {"phase": "Succeeded", "targets": [
        {"name": "jetson-orin", "device": "Jetson AGX Orin", "phase": "Succeeded", "completed": 40, "budget": 40,
         "fingerprint": {"synthetic": True, "simulated": True}, "best": {"objectiveMs": 3.56, "config": CONFIG},
         "defaultMs": 7.1, "speedup": 2.0, "priorWeight": 0.5,
         "learnedFrom": [{"kind": "Pool", "name": "a100", "results": 12},
                         {"kind": "Run", "name": "old", "results": 3}]},
        {"name": "a100", "device": "NVIDIA A100-PCIE-40GB", "phase": "Succeeded", "completed": 40, "budget": 40,
         "fingerprint": {"simulated": True}, "best": {"objectiveMs": 0.887, "config": CONFIG}},
    ]},
}


def _console(width: int) -> Console:
    return Console(record=True, width=width, color_system=None, force_terminal=False)


def test_the_live_table_keeps_the_synthetic_marker():
    console = _console(160)
    console.print(_table(RUN, 12.0))
    text = console.export_text()
    assert "Jetson AGX Orin [synthetic]" in text
    assert "NVIDIA A100-PCIE-40GB [synthetic]" not in text
    assert "a100, old @0.50" in text  # what each pool learns from, and its weight


def test_the_summary_says_what_each_pool_learned_from():
    console = _console(160)
    _summary(console, RUN)
    assert "learned from pool a100 (12), run old (3); weight 0.50" in console.export_text()


def test_the_summary_never_wraps_a_configuration():
    console = _console(80)
    _summary(console, RUN)
    text = console.export_text()
    assert json.dumps(CONFIG, separators=(",", ":")) in text.splitlines()[3].strip()
    assert "SYNTHETIC numbers" in text


def test_the_run_is_found_in_a_manifest_that_holds_other_objects_too():
    root = Path(__file__).resolve().parents[2]
    assert run_name((root / "examples" / "user-kernel.yaml").read_text()) == "transpose"
    assert run_name((root / "examples" / "convolution-fleet.yaml").read_text()) == "convolution-fleet"
    with pytest.raises(ValueError, match="no TuningRun"):
        run_name("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
