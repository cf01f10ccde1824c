"""`fleettune report RUN`: a per-pool table in the terminal (or JSON), and on request an HTML
or PNG report with the convergence figure (matplotlib: `pip install 'fleettune[report]'`).

The data is the run's status (what the operator concluded) and its results store (every
trial), so a report can be made at any time — during the run, after it, after an
operator restart — without the operator. Everything but `main` is pure and works on
plain objects, so the report is tested without a cluster.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleettune.results import TrialRecord
from fleettune.rollup import outputs_unverified, ranked
from fleettune_job.protocol import Outcome

TOP = 5


@dataclass
class PoolReport:
    name: str
    phase: str = ""
    device: str = ""
    budget: int = 0
    valid: int = 0
    invalid: int = 0
    infra_failed: int = 0
    best_ms: float | None = None
    default_ms: float | None = None
    speedup: float | None = None
    best: list[TrialRecord] = field(default_factory=list)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    invalid_by_outcome: dict[str, int] = field(default_factory=dict)
    pods: int = 0  # trial Pods (Jobs) the records came from: fewer than trials when batched
    gpu_s: float = 0.0  # GPU seconds the configurations took (verification and timing)
    pruned: int = 0  # configurations timed no further (nor verified) than it took to see they are slow
    unverified: bool = False  # the best's outputs were never compared with the reference (the fleet simulator)

    @property
    def synthetic(self) -> bool:
        return bool(self.fingerprint.get("synthetic"))


def best_so_far(records: Iterable[TrialRecord]) -> tuple[list[int], list[float]]:
    """The convergence curve: after each trial (in trial order), the best time found so far.

    Every observation counts as a trial, invalid ones included (as the benchmarks count
    them); infrastructure failures do not, since they say nothing about a configuration.
    """
    xs: list[int] = []
    ys: list[float] = []
    best = float("inf")
    n = 0
    for rec in sorted(records, key=lambda r: r.index):
        if not rec.is_observation:
            continue
        n += 1
        if rec.outcome == Outcome.OK and rec.objective is not None:
            best = min(best, rec.objective)
        if best < float("inf"):
            xs.append(n)
            ys.append(best)
    return xs, ys


def pool_reports(status: dict[str, Any], records: Sequence[TrialRecord]) -> list[PoolReport]:
    """One report per target: the status's view, completed from the records."""
    by_target: dict[str, list[TrialRecord]] = {}
    for rec in records:
        by_target.setdefault(rec.target, []).append(rec)
    names = [t["name"] for t in status.get("targets") or []]
    names += sorted(set(by_target) - set(names))  # pools removed from the spec still have results
    out = []
    for name in names:
        st: dict[str, Any] = next((t for t in status.get("targets") or [] if t["name"] == name), {})
        recs = by_target.get(name, [])
        best = ranked(recs)
        invalid: dict[str, int] = {}
        for r in recs:
            if r.outcome.is_invalid_configuration:
                invalid[r.outcome.value] = invalid.get(r.outcome.value, 0) + 1
        out.append(PoolReport(
            name=name,
            phase=st.get("phase", "Removed" if not st else ""),
            device=st.get("device", ""),
            budget=int(st.get("budget", 0)),
            valid=sum(r.outcome == Outcome.OK for r in recs),
            invalid=sum(invalid.values()),
            infra_failed=sum(r.outcome == Outcome.INFRA_ERROR for r in recs),
            best_ms=best[0].objective if best else None,
            default_ms=st.get("defaultMs"),
            speedup=st.get("speedup"),
            best=best[:TOP],
            fingerprint=st.get("fingerprint") or (recs[-1].fingerprint.model_dump() if recs and recs[-1].fingerprint
                                                 else {}),
            message=st.get("message", ""),
            invalid_by_outcome=invalid,
            pods=len({r.job for r in recs if r.job}),
            gpu_s=sum(r.run_s or 0.0 for r in recs),
            pruned=sum(bool(r.pruned) for r in recs),
            unverified=bool((st.get("fingerprint") or {}).get("unverified")) or outputs_unverified(recs),
        ))
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g} ms"


UNVERIFIED_FOOTNOTE = ("unverified: the outputs were never compared with the reference configuration's (the "
                       "fleet simulator cannot compute them): a wrong configuration may be the best")


def _best(pool: PoolReport) -> str:
    return _ms(pool.best_ms) + (" (unverified)" if pool.unverified and pool.best_ms is not None else "")


def _config(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def _device(pool: PoolReport) -> str:
    dev = pool.fingerprint.get("product") or pool.device or "?"
    return dev + (" (synthetic)" if pool.synthetic else " (simulated)" if pool.fingerprint.get("simulated") else "")


def print_table(run: dict[str, Any], pools: Sequence[PoolReport], file: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    meta, status = run.get("metadata", {}), run.get("status") or {}
    console = Console(file=file or sys.stdout, width=160)
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    console.print(
        f"[bold]{meta.get('namespace')}/{meta.get('name')}[/bold]  phase {status.get('phase', 'Pending')}  "
        f"trials {status.get('progress', '-')}  Ready={ready.get('status', '?')} {ready.get('reason', '')}"
    )
    table = Table(show_lines=False)
    numbers = ("valid", "pruned", "invalid", "infra", "budget", "pods")
    for col in ("pool", "phase", "device", *numbers, "best", "default", "speed-up", "best configuration"):
        table.add_column(col, justify="right" if col in numbers else "left")
    for p in pools:
        table.add_row(
            p.name, p.phase, _device(p), str(p.valid), str(p.pruned), str(p.invalid), str(p.infra_failed),
            str(p.budget), str(p.pods),
            _best(p), _ms(p.default_ms), "-" if p.speedup is None else f"{p.speedup:.2f}x",
            _config(p.best[0].config) if p.best else "-",
        )
    console.print(table)
    for p in pools:
        if p.message:
            console.print(f"{p.name}: {p.message}")
    if any(p.synthetic for p in pools):
        console.print("(synthetic: answered from a model of the GPU, not from recorded measurements)")
    if any(p.unverified for p in pools):
        console.print(f"({UNVERIFIED_FOOTNOTE})")


def figure_png(pools: Sequence[PoolReport], records: Sequence[TrialRecord], title: str = "") -> bytes:
    """Convergence curves (best so far against trials) and every valid time, one panel per pool.

    Needs matplotlib (the `report` extra): `FigureUnavailable` without it."""
    require_figure()
    import matplotlib

    matplotlib.use("Agg")  # no display in a pod or CI
    import matplotlib.pyplot as plt

    n = max(1, len(pools))
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4), squeeze=False)
    for ax, pool in zip(axes[0], pools, strict=False):
        recs = [r for r in records if r.target == pool.name]
        obs = [r for r in sorted(recs, key=lambda r: r.index) if r.is_observation]
        ok = [(i + 1, r.objective) for i, r in enumerate(obs) if r.outcome == Outcome.OK and r.objective]
        bad = [i + 1 for i, r in enumerate(obs) if r.outcome.is_invalid_configuration]
        if ok:
            ax.scatter([x for x, _ in ok], [y for _, y in ok], s=10, alpha=0.4, label="valid trial")
        xs, ys = best_so_far(recs)
        if xs:
            ax.step(xs, ys, where="post", color="C3", linewidth=2, label="best so far")
        if pool.default_ms:
            ax.axhline(pool.default_ms, color="grey", linestyle="--", linewidth=1, label="default config")
        if bad:
            lo = ax.get_ylim()[0] if ok else 0
            ax.scatter(bad, [lo] * len(bad), marker="x", color="C1", s=14, label="invalid config")
        ax.set_title(f"{pool.name} — {_device(pool)}", fontsize=10)
        ax.set_xlabel("trials")
        ax.set_ylabel("kernel time (ms)")
        if ok and max(y for _, y in ok) / min(y for _, y in ok) > 20:
            ax.set_yscale("log")  # a few very slow configurations would squash the curve
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def render_html(run: dict[str, Any], pools: Sequence[PoolReport], png: bytes) -> str:
    """A self-contained page (the figure is inlined): open it, mail it, attach it to a ticket."""
    meta, status = run.get("metadata", {}), run.get("status") or {}
    esc = html.escape
    title = f"fleettune report: {meta.get('namespace')}/{meta.get('name')}"
    rows = "".join(
        f"<tr><td>{esc(p.name)}</td><td>{esc(p.phase)}</td><td>{esc(_device(p))}</td>"
        f"<td>{p.valid}</td><td>{p.invalid}</td><td>{p.infra_failed}</td><td>{p.budget}</td>"
        f"<td>{esc(_best(p))}</td><td>{esc(_ms(p.default_ms))}</td>"
        f"<td>{'-' if p.speedup is None else f'{p.speedup:.2f}x'}</td></tr>"
        for p in pools
    )
    sections = []
    for p in pools:
        best = "".join(
            f"<tr><td>{i + 1}</td><td>{esc(_ms(r.objective))}</td><td>{r.index}</td>"
            f"<td><code>{esc(json.dumps(r.config, sort_keys=True))}</code></td></tr>"
            for i, r in enumerate(p.best)
        )
        fp = ", ".join(f"{k}: {v}" for k, v in p.fingerprint.items() if v not in ("", None, False))
        invalid = ", ".join(f"{k} {v}" for k, v in sorted(p.invalid_by_outcome.items())) or "none"
        sections.append(
            f"<h2>{esc(p.name)}</h2><p>Measured on: {esc(fp or p.device or 'unknown')}<br>"
            f"Invalid configurations: {esc(invalid)}"
            + ("<br><b>Outputs not verified</b>: " + esc(UNVERIFIED_FOOTNOTE) if p.unverified else "")
            + (f"<br>{esc(p.message)}" if p.message else "")
            + "</p><table><tr><th>#</th><th>time</th><th>trial</th><th>configuration</th></tr>"
            + (best or "<tr><td colspan=4>no valid result yet</td></tr>")
            + "</table>"
        )
    conditions = "".join(
        f"<tr><td>{esc(c.get('type', ''))}</td><td>{esc(c.get('status', ''))}</td><td>{esc(c.get('reason', ''))}"
        f"</td><td>{esc(c.get('message', ''))}</td></tr>"
        for c in status.get("conditions") or []
    )
    note = ""
    if any(p.synthetic for p in pools):
        note = "<p><em>Pools marked synthetic were answered from a model of the GPU, not from measurements.</em></p>"
    if any(p.unverified for p in pools):
        note += f"<p><em>Best times marked {esc(UNVERIFIED_FOOTNOTE)}.</em></p>"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}}table{{border-collapse:collapse;margin:.5em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}th{{background:#eee}}img{{max-width:100%}}</style>
</head><body>
<h1>{esc(title)}</h1>
<p>Phase <b>{esc(status.get('phase', 'Pending'))}</b>, trials {esc(status.get('progress', '-'))},
started {esc(status.get('startedAt') or '-')}, completed {esc(status.get('completedAt') or '-')}.</p>
<table><tr><th>pool</th><th>phase</th><th>device</th><th>valid</th><th>invalid</th><th>infra</th><th>budget</th>
<th>best</th><th>default</th><th>speed-up</th></tr>{rows}</table>
{note}
<h2>Convergence</h2>
<img alt="best time so far against trials, per pool" src="data:image/png;base64,{base64.b64encode(png).decode()}">
{''.join(sections)}
<h2>Conditions</h2>
<table><tr><th>type</th><th>status</th><th>reason</th><th>message</th></tr>{conditions}</table>
</body></html>
"""


# ---------------------------------------------------------------------- the command

# The figure needs matplotlib, which a plain `pip install fleettune` leaves out.
FIGURE_EXTRA = "pip install 'fleettune[report]'"


class FigureUnavailable(RuntimeError):
    """matplotlib cannot be imported: the message says which extra brings it."""


def require_figure() -> None:
    """Raise `FigureUnavailable` unless the convergence figure can be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:  # absent, or hidden (None in sys.modules)
        raise FigureUnavailable(f"the figure needs matplotlib ({exc}): {FIGURE_EXTRA}") from None


def summary(pools: Sequence[PoolReport]) -> list[dict[str, Any]]:
    """The per-pool summary that `--json` prints."""
    return [
        {"pool": p.name, "phase": p.phase, "device": _device(p), "valid": p.valid, "invalid": p.invalid,
         "infraFailed": p.infra_failed, "budget": p.budget, "pods": p.pods, "gpuSeconds": round(p.gpu_s, 3),
         "pruned": p.pruned, "verified": not p.unverified,
         "bestMs": p.best_ms, "defaultMs": p.default_ms,
         "speedup": p.speedup, "best": [{"config": r.config, "ms": r.objective, "trial": r.index} for r in p.best]}
        for p in pools
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fleettune report",
        description="Per-pool table of a TuningRun (or --json); with --html/--png also the convergence "
        f"figure, which needs matplotlib: {FIGURE_EXTRA}.",
    )
    parser.add_argument("run", help="TuningRun name")
    parser.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace")
    parser.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    parser.add_argument("--context")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with the figure")
    parser.add_argument("--png", metavar="FILE", help="also write the convergence figure as PNG")
    parser.add_argument("--json", action="store_true", help="print the per-pool summary as JSON instead of a table")
    # Kept for scripts of earlier versions, when the HTML file was written unless asked not to.
    parser.add_argument("--no-file", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.html or args.png:
        try:  # before reading the cluster: say at once what is missing
            require_figure()
        except FigureUnavailable as exc:
            flag = "--html" if args.html else "--png"
            print(f"fleettune report: {flag}: {exc}", file=sys.stderr)
            return 2

    from fleettune import store

    try:
        run, records, namespace = store.read_run(args.run, args.namespace, args.kubeconfig, args.context)
    except store.ReadError as exc:
        print(f"fleettune report: {exc}", file=sys.stderr)
        return 1
    pools = pool_reports(run.get("status") or {}, records)
    if args.json:
        print(json.dumps(summary(pools), indent=2))
    else:
        print_table(run, pools)
    if not (args.html or args.png):
        return 0
    png = figure_png(pools, records, f"{namespace}/{args.run}")
    if args.png:
        Path(args.png).write_bytes(png)
        print(f"wrote {args.png}", file=sys.stderr)
    if args.html:
        Path(args.html).write_text(render_html(run, pools, png))
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
