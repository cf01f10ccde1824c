"""`fleettune check`: the operator's checks before any Job, run offline on manifest files."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleettune import cli
from fleettune_job import nvrtc, tritonsource

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
USER = ROOT / "examples" / "user-kernel.yaml"


def user_kernel() -> tuple[dict[str, Any], dict[str, Any]]:
    source, run = yaml.safe_load_all(USER.read_text())
    return source, run


def check(tmp_path: Path, capsys: pytest.CaptureFixture[str], *docs: dict[str, Any]) -> tuple[int, str]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code = cli.main(["check", "-f", str(path)])
    return code, capsys.readouterr().out


def test_the_examples_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", *(a for p in EXAMPLES for a in ("-f", str(p)))]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok") == len(EXAMPLES)
    # A Jetson pool selected by a pool label: its GPU is known only from its nodes.
    assert "note: spec.targets[2]: the GPU of target jetson-orin is known only from its nodes" in out


def test_each_problem_names_its_field_and_fails_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, run = user_kernel()
    bad = copy.deepcopy(run)
    bad["spec"]["kernel"]["source"]["grid"][0] = "cdiv(problem_size[0], tile_size)"
    code, out = check(tmp_path, capsys, source, bad)
    assert code == 1 and "TuningRun default/transpose: spec.kernel.source.grid:" in out and "tile_size" in out

    # A constraint no configuration meets on the target's GPU.
    bad = copy.deepcopy(run)
    bad["spec"]["constraints"].append("tile_dim * block_rows > device.max_threads_per_block")
    code, out = check(tmp_path, capsys, source, bad)
    assert code == 1 and "spec.constraints[3]" in out and "leaves no valid configuration" in out

    # The source's ConfigMap must be among the files.
    code, out = check(tmp_path, capsys, run)
    assert code == 1 and "spec.kernel.source.configMap: ConfigMap 'transpose-source' not found" in out

    # Schema: a field the CRD does not have.
    bad = copy.deepcopy(run)
    bad["spec"]["budget"]["trialsPerTargt"] = 3
    code, out = check(tmp_path, capsys, source, bad)
    assert code == 1 and "spec.budget" in out and "trialsPerTargt" in out


@pytest.mark.skipif(not nvrtc.available(), reason="no NVRTC installed: the compile check is skipped, as the operator's")
def test_a_source_that_does_not_compile_fails_with_the_compilers_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, run = user_kernel()
    # The branch the default configuration compiles (use_shared 0).
    code = source["data"]["transpose.cu"]
    source["data"]["transpose.cu"] = code.replace("out[x * height + y + j]", "out[undeclared]")
    code, out = check(tmp_path, capsys, source, run)
    assert code == 1
    # Compiled for each target's architecture (A100: 8.0), with NVRTC's own message.
    assert "TuningRun default/transpose:" in out and "undeclared" in out and "target a100" in out


@pytest.mark.skipif(not tritonsource.available(), reason="Triton is not installed: its compile check is skipped, "
                    "as the operator's")
def test_a_triton_source_is_vetted_then_compiled_for_each_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, run = yaml.safe_load_all((ROOT / "examples" / "triton-matmul.yaml").read_text())
    text = source["data"]["matmul.py"]
    source["data"]["matmul.py"] = text.replace("acc += tl.dot(x, y)", "acc += tl.dot(x, y_undefined)")
    code, out = check(tmp_path, capsys, source, run)
    assert code == 1
    assert "spec.kernel.triton: with kernel.defaultConfig, for sm_80: CompilationError" in out
    assert "y_undefined is not defined" in out and "target a100" in out and "target rtx-a4000" in out

    source["data"]["matmul.py"] = "import os\nos.system('id')\n" + text
    code, out = check(tmp_path, capsys, source, run)
    assert code == 1 and "spec.kernel.triton.function: line 1: import of 'os'" in out


def test_unreadable_input_is_told_apart_from_a_refused_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "-f", str(tmp_path / "missing.yaml")]) == 2
    empty = tmp_path / "cm.yaml"
    empty.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}))
    assert cli.main(["check", "-f", str(empty)]) == 2
    assert "no TuningRun" in capsys.readouterr().err
