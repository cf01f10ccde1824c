"""`fleettune bench triton`: Triton's compile throughput on this machine's CPUs, with the
real compiler, on the shipped example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleettune_dev.bench.tritoncompile import main
from fleettune_job import tritonsource

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(not tritonsource.available(), reason="Triton is not installed (the triton extra)")
def test_it_compiles_the_examples_configurations_cold_then_cached(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures.json"
    assert main(["-f", str(ROOT / "examples" / "triton-matmul.yaml"), "--configs", "2", "--workers", "1",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 configurations of matmul for sm_80" in printed and "bounds the batch" in printed
    figures = json.loads(out.read_text())
    assert figures["configs"] == 2 and figures["cold"]["compile_errors"] == 0
    # The cache turns a compile into a lookup: the second pass is faster than the first.
    assert figures["cached"]["wall_s"] < figures["cold"]["wall_s"]
    assert figures["bound"] in ("compile", "gpu")


def test_a_file_without_a_triton_kernel_is_refused() -> None:
    with pytest.raises(SystemExit, match=r"has no kernel\.triton"):
        main(["-f", str(ROOT / "examples" / "user-kernel.yaml")])
