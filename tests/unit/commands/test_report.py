"""`fleettune report`: per-pool summary, convergence curve, table and HTML from a status and records;
the table and JSON without matplotlib (a plain install), the figure with the `report` extra."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest

from fleettune.commands.report import (
    FigureUnavailable,
    best_so_far,
    figure_png,
    main,
    pool_reports,
    print_table,
    render_html,
    summary,
)
from fleettune.results import TrialRecord
from fleettune.rollup import run_status, target_status
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


# ---------------------------------------------------------------------- the command without matplotlib


@pytest.fixture
def stored(monkeypatch: pytest.MonkeyPatch, run: dict, records: list[TrialRecord]) -> list[tuple]:
    """`fleettune report` reads this run and these records instead of a cluster's."""
    from fleettune import store

    calls: list[tuple] = []

    def read_run(name, namespace=None, kubeconfig=None, context=None):
        calls.append((name, namespace))
        return run, records, "ns"

    monkeypatch.setattr(store, "read_run", read_run)
    return calls


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """As after a plain `pip install fleettune`: `import matplotlib` fails (also when a test
    before this one imported it)."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError):
        import matplotlib  # noqa: F401


def test_without_matplotlib_the_report_prints_its_table(no_matplotlib, stored, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["conv", "-n", "ns"]) == 0
    out, err = capsys.readouterr()
    a100_line = next(line for line in out.splitlines() if "a100" in line and "ms" in line)
    assert "0.9 ms" in a100_line and "bx=64" in a100_line
    assert not err and not list(tmp_path.iterdir())  # a table, no file
    assert stored == [("conv", "ns")]


def test_without_matplotlib_the_report_prints_json(no_matplotlib, stored, capsys):
    assert main(["conv", "--json"]) == 0
    pools = json.loads(capsys.readouterr().out)
    assert [(p["pool"], p["bestMs"]) for p in pools] == [("a100", 0.9), ("orin", None)]


@pytest.mark.parametrize("flag", ["--html", "--png"])
def test_without_matplotlib_a_figure_request_names_the_extra(no_matplotlib, stored, capsys, tmp_path, flag):
    out_file = tmp_path / "r.out"
    assert main(["conv", flag, str(out_file)]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1, err
    assert err.startswith(f"fleettune report: {flag}: ") and "pip install 'fleettune[report]'" in err
    assert "matplotlib" in err
    assert not out_file.exists()
    assert stored == []  # said before reading the cluster


def test_without_matplotlib_the_figure_function_raises_the_same_error(no_matplotlib, run, records):
    with pytest.raises(FigureUnavailable, match=r"pip install 'fleettune\[report\]'"):
        figure_png(pool_reports(run["status"], records), records)


def test_with_matplotlib_html_and_png_are_written(stored, capsys, tmp_path):
    html, png = tmp_path / "r.html", tmp_path / "r.png"
    assert main(["conv", "--html", str(html), "--png", str(png)]) == 0
    assert "data:image/png;base64," in html.read_text() and png.read_bytes()[:4] == b"\x89PNG"
    assert "0.9 ms" in capsys.readouterr().out


def test_the_report_module_does_not_import_matplotlib():
    """`fleettune report`'s module loads on a plain install; only the figure needs the extra."""
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "import fleettune.cli, fleettune.commands.report\n"
            "assert 'matplotlib' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
            "try:\n"
            "    fleettune.cli.main(['report', '--help'])\n"
            "except SystemExit as exc:\n"
            "    assert exc.code == 0, exc.code\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fleettune[report]" in proc.stdout


def test_a_pool_report_counts_pods_and_gpu_time_of_batches(run: dict) -> None:
    recs = [TrialRecord(target="a100", index=i, config={"b": i}, key=str(i), outcome=Outcome.OK, objective=1.0 + i,
                        job=f"conv-a100-{4 * (i // 4):04d}", run_s=0.25, pruned=i > 6 or None) for i in range(10)]
    (pool, *_) = pool_reports(run, recs)
    assert (pool.valid, pool.pruned, pool.pods, pool.gpu_s) == (10, 3, 3, 2.5)
    (row, *_) = summary([pool])
    assert (row["pods"], row["gpuSeconds"], row["pruned"]) == (3, 2.5, 3)
    out = io.StringIO()
    print_table(run, [pool], file=out)
    assert "pruned" in out.getvalue()
