"""`fleettune report`: per-pool summary, convergence curve, table and HTML from a status and records."""

from __future__ import annotations

import io
import re

import pytest

from fleettune.report import best_so_far, figure_png, pool_reports, print_table, render_html
from fleettune.results import TrialRecord
from fleettune.status import run_status, target_status
from fleettune_job.protocol import Fingerprint, Outcome


def rec(target: str, index: int, outcome: Outcome, ms: float | None = None, **config: int) -> TrialRecord:
    cfg = config or {"bx": index}
    return TrialRecord(
        target=target, index=index, config=cfg, key=",".join(f"{k}={v}" for k, v in cfg.items()), outcome=outcome,
        objective=ms, fingerprint=Fingerprint(product="NVIDIA A100-SXM4-40GB", driver_version="550.54",
                                              simulated=True) if target == "a100" else None,
    )


@pytest.fixture
def records() -> list[TrialRecord]:
    return [
        rec("a100", 0, Outcome.OK, 2.0, bx=16),  # the default configuration
        rec("a100", 1, Outcome.COMPILE_ERROR),
        rec("a100", 2, Outcome.OK, 1.5, bx=32),
        rec("a100", 3, Outcome.INFRA_ERROR),
        rec("a100", 4, Outcome.OK, 1.7, bx=8),
        rec("a100", 5, Outcome.OK, 0.9, bx=64),
        rec("orin", 0, Outcome.TIMEOUT),
    ]


@pytest.fixture
def run(records: list[TrialRecord]) -> dict:
    a100 = target_status(name="a100", phase="Succeeded", budget=5, records=[r for r in records if r.target == "a100"],
                         running=0, device="NVIDIA A100-SXM4-40GB", default_key="bx=16")
    orin = target_status(name="orin", phase="Running", budget=5, records=[r for r in records if r.target == "orin"],
                         running=1, device="Jetson AGX Orin", message="1 trial running")
    status = run_status(previous=None, generation=1, phase="Running", targets=[a100, orin], results=None,
                        reason="Tuning", message="")
    return {"metadata": {"name": "conv", "namespace": "ns", "uid": "u"},
            "status": status.model_dump(by_alias=True, exclude_none=True, mode="json")}


def test_best_so_far_counts_invalid_trials_but_not_infra_failures(records: list[TrialRecord]) -> None:
    xs, ys = best_so_far([r for r in records if r.target == "a100"])
    # Observations in trial order: ok 2.0, compile error, ok 1.5, (infra skipped), ok 1.7, ok 0.9.
    assert xs == [1, 2, 3, 4, 5]
    assert ys == [2.0, 2.0, 1.5, 1.5, 0.9]


def test_best_so_far_starts_at_the_first_valid_result() -> None:
    xs, ys = best_so_far([rec("a", 0, Outcome.TIMEOUT), rec("a", 1, Outcome.OK, 3.0)])
    assert (xs, ys) == ([2], [3.0])


def test_pool_reports(run: dict, records: list[TrialRecord]) -> None:
    a100, orin = pool_reports(run["status"], records)
    assert (a100.name, a100.valid, a100.invalid, a100.infra_failed) == ("a100", 4, 1, 1)
    assert a100.best_ms == 0.9
    assert [r.config for r in a100.best] == [{"bx": 64}, {"bx": 32}, {"bx": 8}, {"bx": 16}]
    assert a100.default_ms == 2.0 and a100.speedup == pytest.approx(2.0 / 0.9, rel=1e-3)
    assert a100.invalid_by_outcome == {"compile_error": 1}
    assert (orin.best_ms, orin.invalid_by_outcome, orin.phase) == (None, {"timeout": 1}, "Running")


def test_pools_only_in_the_store_are_reported(run: dict, records: list[TrialRecord]) -> None:
    pools = pool_reports(run["status"], [*records, rec("rtx", 0, Outcome.OK, 1.0)])
    assert [p.name for p in pools] == ["a100", "orin", "rtx"]
    assert pools[-1].phase == "Removed"


def test_table_names_every_pool_and_its_best(run: dict, records: list[TrialRecord]) -> None:
    out = io.StringIO()
    print_table(run, pool_reports(run["status"], records), file=out)
    text = out.getvalue()
    assert "ns/conv" in text
    a100_line = next(line for line in text.splitlines() if "a100" in line and "ms" in line)
    assert "0.9 ms" in a100_line and "bx=64" in a100_line and "2.22x" in a100_line
    assert re.search(r"orin.*Running", text)


def test_png_is_a_png(run: dict, records: list[TrialRecord]) -> None:
    png = figure_png(pool_reports(run["status"], records), records, "ns/conv")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(png) > 5000  # axes, curves and labels, not an empty canvas


def test_html_is_self_contained_and_escaped(run: dict, records: list[TrialRecord]) -> None:
    run["status"]["targets"][1]["message"] = "<script>alert(1)</script>"
    pools = pool_reports(run["status"], records)
    page = render_html(run, pools, b"\x89PNG fake")
    assert "data:image/png;base64," in page
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert '{&quot;bx&quot;: 64}' in page  # the best configuration, shown as JSON
    assert page.count("<h2>") == 4  # convergence, two pools, conditions
