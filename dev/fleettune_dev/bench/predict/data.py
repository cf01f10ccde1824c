"""Each kind of tuned data read into :class:`~fleettune_dev.bench.predict.rows.Row` s.

``load("KIND:PATH")`` with KIND one of :data:`KINDS`:

* ``kt-caches``: a folder of Kernel Tuner caches (``*.json``, ``*.json.gz``; or one file).
  One row per cache: one kernel family at one problem size on one GPU, with every measured
  configuration's time. ``problem`` = ``size_0``, ``size_1``, … (the problem size) and
  ``device``; the default is each parameter's first value, Kernel Tuner's convention. Files
  that are JSON but not Kernel Tuner caches (a T4 results file) are skipped with a warning.
* ``vllm-tables``: a folder (searched recursively) of vLLM's tuned Triton tables
  (``fused_moe/E=…,N=…,device_name=…[,dtype=…][,block_shape=…].json``,
  ``w8a8_block_fp8/N=…,K=…,device_name=…,dtype=…,block_shape=….json``). One row per (table,
  batch size M); best only. ``problem`` = ``M``, ``E``/``N``/``K`` (those in the name),
  ``dtype`` (``auto`` when absent), ``block_shape`` (``[128,128]`` without spaces, or
  ``none``), ``kernel`` (``fused_moe`` | ``w8a8_block_fp8``), ``device``.
* ``miopen-perfdb``: MIOpen's SQLite perf-db (``.db`` or ``.db.gz``). One row per (solver,
  convolution problem); best only, parameters ``p0``, ``p1``, … in the order of MIOpen's
  comma-separated string. ``problem`` = every column of the ``config`` table but ``id``
  (``layout``, ``data_type``, ``direction``, ``spatial_dim``, ``in_channels``, ``in_h``, ``in_w``,
  ``in_d``, ``fil_h``, ``fil_w``, ``fil_d``, ``out_channels``, ``batchsize``, ``pad_*``,
  ``conv_stride_*``, ``dilation_*``, ``bias``, ``group_count``) and ``device``.
* ``miopen-finddb``: MIOpen's text find-db (``.fdb.txt`` or ``.gz``). One row per problem; the
  configuration is the solver, with the time of each solver the line names. ``problem`` uses
  the perf-db's names for the key's fields (plus ``out_d``, ``out_h``, ``out_w``; depth fields
  are 1 for a 2-D key) so that both MIOpen kinds describe a convolution alike.

The device of a MIOpen file is the architecture in its name (``gfx906_60``). A row's volume is
the problem's work, roughly: the product of the sizes (Kernel Tuner), M (vLLM), and for
MIOpen batch × in_channels × in_d × in_h × in_w × out_channels × fil_d × fil_h × fil_w (input
rather than output extent, groups not divided out: a size to order problems by).
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleettune_dev.bench.predict.rows import Row, config_key

if TYPE_CHECKING:
    from fleettune.space.records import RecordedSpace

KINDS = ("kt-caches", "vllm-tables", "miopen-perfdb", "miopen-finddb")

log = logging.getLogger(__name__)


def load(spec: str) -> list[Row]:
    """The rows of ``KIND:PATH``; a ValueError that names the problem if it cannot."""
    kind, sep, path = spec.partition(":")
    if not sep or kind not in KINDS or not path:
        raise ValueError(f"data is KIND:PATH with KIND one of {', '.join(KINDS)}: {spec!r}")
    where = Path(path)
    if not where.exists():
        raise ValueError(f"{spec}: {path} does not exist")
    start = time.perf_counter()
    rows = _LOADERS[kind](where, f"{kind}:{where.name}")
    log.info("%s: %d rows in %.2f s", spec, len(rows), time.perf_counter() - start)
    return rows


def _files(path: Path, patterns: tuple[str, ...], recursive: bool, data: str) -> list[Path]:
    if path.is_file():
        return [path]
    found = sorted({f for p in patterns for f in (path.rglob(p) if recursive else path.glob(p)) if f.is_file()})
    if not found:
        raise ValueError(f"{data}: no {' or '.join(patterns)} file in {path}")
    return found


def _read_bytes(path: Path, data: str) -> bytes:
    if path.is_dir():
        raise ValueError(f"{data}: {path} is a folder; give the file")
    try:
        raw = path.read_bytes()
        # By content, not by name: a gzip file without .gz reads too.
        return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except (OSError, EOFError) as exc:
        raise ValueError(f"{data}: cannot read {path}: {exc}") from None


def _arch(path: Path) -> str:
    return path.name.split(".", 1)[0]


def _number(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text


# Kernel Tuner caches


def _kt_caches(path: Path, data: str) -> list[Row]:
    from fleettune.space.errors import SpaceError
    from fleettune_dev.interop import read_kernel_tuner_cache

    rows = []
    for f in _files(path, ("*.json", "*.json.gz"), False, data):
        try:
            row = _kt_row(read_kernel_tuner_cache(f), f.name, data)
        except SpaceError as exc:
            if "not a Kernel Tuner cache" not in str(exc):
                raise ValueError(f"{data}: cannot read {f.name}: {exc}") from None
            log.warning("%s: skipped %s: %s", data, f.name, exc)
            continue
        if row is None:
            log.warning("%s: skipped %s: no configuration ran", data, f.name)
        else:
            rows.append(row)
    if not rows:
        raise ValueError(f"{data}: no Kernel Tuner cache with a configuration that ran in {path}")
    return rows


def _kt_row(rec: RecordedSpace, name: str, data: str) -> Row | None:
    from fleettune_dev.bench.replay import family

    # An empty device_name (some AMD recordings): the GPU the file is named after.
    device = rec.device_name or name.removesuffix(".gz").removesuffix(".json").split("-", 1)[-1]
    fam = family(name)
    size = [s for s in (rec.problem_size if isinstance(rec.problem_size, list) else [rec.problem_size])
            if s is not None]
    times: dict[str, float] = {}
    configs: dict[str, dict[str, Any]] = {}
    invalid = set()
    for r in rec.records:
        key = config_key(r.config)
        if r.failure is None and r.time_ms is not None:
            times[key] = min(float(r.time_ms), times.get(key, math.inf))
            configs[key] = r.config
        else:
            invalid.add(key)
    if not times:
        return None
    default = {p.name: p.values[0] for p in rec.space.parameters}
    problem: dict[str, float | int | str] = {f"size_{i}": s for i, s in enumerate(size)}
    problem["device"] = device
    return Row(data=data, kind="kt-caches", group=fam, family=fam, device=device,
               key=f"{fam}|{device}|{'x'.join(str(s) for s in size)}",
               volume=float(math.prod(float(s) for s in size if isinstance(s, int | float))), problem=problem,
               best=dict(configs[min(times, key=lambda k: (times[k], k))]), times=times,
               invalid=frozenset(invalid - set(times)),
               default=default if config_key(default) in times or config_key(default) in invalid else None)


# vLLM tables

_NAME_FIELD = re.compile(r"(\w+)=(\[[^\]]*\]|[^,]*)")
_VLLM_KERNELS = ("fused_moe", "w8a8_block_fp8")


def _vllm_tables(path: Path, data: str) -> list[Row]:
    rows = []
    for f in _files(path, ("*.json",), True, data):
        fields = dict(_NAME_FIELD.findall(f.stem))
        device = fields.pop("device_name", None)
        if not device:
            log.warning("%s: skipped %s: no device_name in its name", data, f.name)
            continue
        kernel = f.parent.name if f.parent.name in _VLLM_KERNELS else _VLLM_KERNELS[0 if "E" in fields else 1]
        if "block_shape" in fields:
            fields["block_shape"] = fields["block_shape"].replace(" ", "")
        try:
            table = json.loads(f.read_text())
            entries = sorted((int(m), cfg) for m, cfg in table.items())
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"{data}: {f} is not a vLLM table ({{M: config}}): {exc}") from None
        shape: dict[str, float | int | str] = {k: int(fields[k]) for k in ("E", "N", "K") if k in fields}
        shape |= {"dtype": fields.get("dtype", "auto"), "block_shape": fields.get("block_shape", "none"),
                  "kernel": kernel, "device": device}
        fam = kernel + ":" + ",".join(f"{k}={v}" for k, v in fields.items())
        for m, cfg in entries:
            if not isinstance(cfg, dict):
                raise ValueError(f"{data}: {f}: the entry of M={m} is not a configuration")
            rows.append(Row(data=data, kind="vllm-tables", group=device, family=fam, device=device,
                            key=f"{f.stem}|M={m}", volume=float(m), problem={"M": m, **shape}, best=dict(cfg)))
    return rows


# MIOpen perf-db

_PERF_QUERY = "select p.solver, p.params, c.* from perf_db p join config c on p.config = c.id order by p.id"
_VOLUME = ("batchsize", "in_channels", "in_d", "in_h", "in_w", "out_channels", "fil_d", "fil_h", "fil_w")


def _perfdb(path: Path, data: str) -> list[Row]:
    device = _arch(path)
    conn = sqlite3.connect(":memory:")
    try:
        conn.deserialize(_read_bytes(path, data))
        cur = conn.execute(_PERF_QUERY)
        columns = [d[0] for d in cur.description][2:]
        found = cur.fetchall()
    except sqlite3.Error as exc:
        raise ValueError(f"{data}: {path} is not a MIOpen perf-db ({exc})") from None
    finally:
        conn.close()
    described = [c for c in columns if c != "id"]
    # One problem's description, family and key text, shared by the rows of its solvers.
    problems: dict[int, tuple[dict[str, float | int | str], str, str, float]] = {}
    by_solver: dict[str, list[tuple[int, list[str]]]] = {}
    for solver, params, *values in found:
        cid = values[0]
        if cid not in problems:
            problem = dict(zip(columns, values, strict=True))
            del problem["id"]
            problem["device"] = device
            full = "-".join(str(problem[c]) for c in described)
            fam = "-".join(str(problem[c]) for c in described if c != "batchsize")
            volume = float(math.prod(int(problem.get(c, 1)) for c in _VOLUME))
            problems[cid] = (problem, fam, full, volume)
        by_solver.setdefault(solver, []).append((cid, str(params).split(",")))
    rows, dropped = [], 0
    for solver, entries in by_solver.items():
        # A solver's string has one layout; another count of fields is another format (or damage).
        count = Counter(len(p) for _, p in entries).most_common(1)[0][0]
        for cid, parts in entries:
            if len(parts) != count or "" in parts:
                dropped += 1
                continue
            problem, fam, full, volume = problems[cid]
            rows.append(Row(data=data, kind="miopen-perfdb", group=solver, family=fam, device=device,
                            key=f"{solver}|{full}", volume=volume, problem=problem,
                            best={f"p{i}": _number(v) for i, v in enumerate(parts)}))
    if dropped:
        log.warning("%s: dropped %d of %d rows whose parameters do not parse like the rest of their solver's",
                    data, dropped, len(found))
    return rows


# MIOpen find-db

_SPATIAL = ("d", "h", "w")


def _fdb_problem(key: str) -> tuple[dict[str, float | int | str], str]:
    """A find-db key's fields by the perf-db's names, and the key without its batch size."""
    fields = key.split("-")
    direction, _, groups = fields[-1].partition("_g")
    first_layout = next(i for i, text in enumerate(fields) if not text[:1].isdigit())
    nums, layouts = fields[:first_layout], fields[first_layout:-2]
    if not layouts or len(nums) not in (12, 14):
        raise ValueError(f"not a 2-D or 3-D find-db key: {key!r}")
    dims = 2 if len(nums) == 12 else 3

    def dhw(text: str, depth: str) -> list[str]:  # "FYxFX" (2-D) or "FZxFYxFX" (3-D)
        parts = text.split("x")
        if len(parts) != dims:
            raise ValueError(f"{text!r} in a {dims}-D find-db key")
        return parts if dims == 3 else [depth, *parts]

    if dims == 2:  # C-H-W-FYxFX-K-OH-OW-N-PHxPW-SHxSW-DHxDW-bias
        c, h, w, fil, k, oh, ow, n, pad, stride, dil, bias = nums
        size, out = ["1", h, w], ["1", oh, ow]
    else:  # C-D-H-W-FZxFYxFX-K-OD-OH-OW-N-PDxPHxPW-SDxSHxSW-DDxDHxDW-bias
        c, d, h, w, fil, k, od, oh, ow, n, pad, stride, dil, bias = nums
        size, out = [d, h, w], [od, oh, ow]
    named = {"in": size, "fil": dhw(fil, "1"), "out": out, "pad": dhw(pad, "0"), "conv_stride": dhw(stride, "0"),
             "dilation": dhw(dil, "0")}
    problem: dict[str, float | int | str] = {"spatial_dim": dims, "in_channels": int(c), "out_channels": int(k),
                                             "batchsize": int(n), "bias": int(bias)}
    for name, values in named.items():
        problem |= {f"{name}_{a}": int(v) for a, v in zip(_SPATIAL, values, strict=True)}
    # NHWC keys name the input, weight and output layouts.
    problem |= {"layout": layouts[0] if len(set(layouts)) == 1 else ",".join(layouts), "data_type": fields[-2],
                "direction": direction, "group_count": int(groups) if groups else 1}
    batch_at = 7 if dims == 2 else 9
    return problem, "-".join(fields[:batch_at] + fields[batch_at + 1:])


def _finddb(path: Path, data: str) -> list[Row]:
    device = _arch(path)
    try:
        text = _read_bytes(path, data).decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{data}: {path} is not a text find-db ({exc})") from None
    rows, bad = [], 0
    for line in text.splitlines():
        key, sep, entries = line.strip().partition("=")
        if not key:
            continue
        try:
            if not sep:
                raise ValueError("no '='")
            problem, fam = _fdb_problem(key)
            times: dict[str, float] = {}
            for entry in entries.split(";"):
                solver, ms = entry.partition(":")[2].split(",")[:2]
                k = config_key({"solver": solver})
                times[k] = min(float(ms), times.get(k, math.inf))
        except (ValueError, IndexError, StopIteration):
            bad += 1
            continue
        problem["device"] = device
        best = json.loads(min(times, key=lambda k: (times[k], k)))
        rows.append(Row(data=data, kind="miopen-finddb", group=str(problem["direction"]), family=fam,
                        device=device, key=key, volume=float(math.prod(int(problem[c]) for c in _VOLUME)),
                        problem=problem, best=best, times=times))
    if bad:
        log.warning("%s: skipped %d lines that are not KEY=algo:Solver,ms,…;…", data, bad)
    if not rows:
        raise ValueError(f"{data}: {path} has no find-db line (KEY=algo:Solver,ms,…)")
    return rows


_LOADERS: dict[str, Callable[[Path, str], list[Row]]] = {
    "kt-caches": _kt_caches, "vllm-tables": _vllm_tables, "miopen-perfdb": _perfdb, "miopen-finddb": _finddb,
}
