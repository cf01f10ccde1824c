"""What a simulated GPU measures for a configuration: recorded or synthetic.

A :class:`Recording` is a brute-forced Kernel Tuner cache (every valid configuration of a
kernel timed on one GPU model), read with :func:`fleettune_dev.interop.read_kernel_tuner_cache`
and indexed by Kernel Tuner's key (the parameter values joined by "," in the recording's
parameter order). A :class:`KernelModel` answers one configuration:

* :class:`RecordedKernel` — the recording itself. A configuration absent from it violates
  the recorded kernel's restrictions (the files hold exactly the restricted space), so it
  is answered like Kernel Tuner's ``InvalidConfig``: a compile failure, marked synthetic
  because it was inferred, not measured.
* :class:`SyntheticKernel` — another GPU's recording × a slowdown × deterministic
  per-configuration noise, for pools nobody has recorded (Jetson). Always synthetic.

A full Kernel Tuner cache also says what each configuration cost besides its kernel time
(``compile_time``, ``verification_time``, ``benchmark_time``, in ms): a measurement keeps
them when present, and the simulator then takes a trial's duration from them. Compact
recordings made before these were kept have none; the simulator models the costs then.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

Failure = Literal["compile", "runtime", "invalid"]
MAX_REPEATS_KEPT = 8


@dataclass(frozen=True)
class Measurement:
    time_ms: float | None  # None when the configuration failed
    times: tuple[float, ...] = ()
    failure: Failure | None = None
    synthetic: bool = False
    detail: str = ""  # where the answer came from, for the result's error text / logs
    # What the recording's tuner spent on the configuration (ms), when it recorded it.
    compile_ms: float | None = None  # compile and module load, on the host
    verification_ms: float | None = None  # the checked launch
    benchmark_ms: float | None = None  # all timed launches


def _plain(value: Any) -> Any:
    # JSON turns 16 into 16 but a YAML/CRD round trip may give 16.0: compare as numbers.
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@dataclass
class Recording:
    name: str
    device_name: str
    kernel_name: str
    problem_size: list[int]
    keys: tuple[str, ...]
    table: dict[str, Measurement]
    values: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.values:
            seen: dict[str, dict[Any, Any]] = {k: {} for k in self.keys}
            for key in self.table:
                for name, text in zip(self.keys, key.split(","), strict=True):
                    seen[name].setdefault(text, text)
            self.values = {k: tuple(v) for k, v in seen.items()}
        self._text_of = {k: {_plain(_parse_scalar(t)): t for t in vals} for k, vals in self.values.items()}

    def key(self, config: dict[str, Any]) -> str:
        """Kernel Tuner's cache key of ``config``; raises KeyError naming what cannot match.

        Parameters missing from ``config`` that have a single recorded value (constants of
        the recorded space, like ``filter_width=15``) take that value.
        """
        parts = []
        for name in self.keys:
            texts = self._text_of[name]
            if name not in config:
                if len(texts) == 1:
                    parts.append(next(iter(texts.values())))
                    continue
                raise KeyError(f"parameter {name!r} is missing (recorded parameters: {', '.join(self.keys)})")
            text = texts.get(_plain(config[name]))
            if text is None:
                raise KeyError(f"{name}={config[name]!r} was never recorded "
                               f"(recorded values: {', '.join(texts.values())})")
            parts.append(text)
        return ",".join(parts)

    def lookup(self, config: dict[str, Any]) -> Measurement | None:
        """The recorded measurement, or None if the configuration is not in the recording."""
        try:
            return self.table.get(self.key(config))
        except KeyError:
            return None


def _parse_scalar(text: str) -> Any:
    if text in ("True", "False"):  # str() of a Python bool, as Kernel Tuner writes it
        return text == "True"
    try:
        return json.loads(text)
    except ValueError:
        return text


def _kt_value_text(value: Any) -> str:
    # Kernel Tuner builds keys with str() of each value.
    return str(value)


_FAILURES: dict[str, Failure] = {"compile": "compile", "runtime": "runtime", "invalid": "invalid"}
COST_FIELDS = ("compile_time", "verification_time", "benchmark_time")  # Kernel Tuner's, in ms


def _costs(entry: dict[str, Any]) -> dict[str, float]:
    """The recorded costs of one cache entry by Kernel Tuner's names (absent or not a time: left out)."""
    out = {}
    for name in COST_FIELDS:
        value = entry.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            out[name] = float(value)
    return out


@functools.lru_cache(maxsize=16)
def load_recording(path: Path) -> Recording:
    """Read (once per process) a Kernel Tuner cache file, .json or .json.gz."""
    from fleettune_dev.interop import read_kernel_tuner_cache

    rs = read_kernel_tuner_cache(path)
    records = list(rs.records)
    keys = tuple(rs.space.names)  # the recording's tune_params_keys order
    table: dict[str, Measurement] = {}
    for rec in records:
        key = ",".join(_kt_value_text(rec.config[k]) for k in keys)
        times = tuple(float(t) for t in (rec.times or ())[:MAX_REPEATS_KEPT])
        costs = _costs(rec.extras)
        if rec.failure is not None:
            m = Measurement(time_ms=None, failure=_FAILURES[rec.failure], detail=f"recorded failure in {path.name}")
        elif rec.time_ms is not None:
            m = Measurement(time_ms=float(rec.time_ms), times=times or (float(rec.time_ms),))
        else:
            continue
        table[key] = replace(m, compile_ms=costs.get("compile_time"), verification_ms=costs.get("verification_time"),
                             benchmark_ms=costs.get("benchmark_time"))
    name = path.name.removesuffix(".gz").removesuffix(".json")
    size = rs.problem_size
    problem_size = [int(s) for s in size] if isinstance(size, list | tuple) else [int(size)]
    return Recording(name=name, device_name=str(rs.device_name), kernel_name=str(rs.kernel_name),
                     problem_size=problem_size, keys=keys, table=table)


class KernelModel(Protocol):
    recording: Recording

    def measure(self, config: dict[str, Any]) -> Measurement: ...


def _not_recorded(rec: Recording, config: dict[str, Any]) -> Measurement:
    try:
        rec.key(config)
        why = "violates the recorded kernel's restrictions"
    except KeyError as exc:
        why = str(exc.args[0])
    return Measurement(time_ms=None, failure="invalid", synthetic=True,
                       detail=f"configuration not in recording {rec.name}: {why}")


@dataclass
class RecordedKernel:
    recording: Recording

    def measure(self, config: dict[str, Any]) -> Measurement:
        found = self.recording.lookup(config)
        return found if found is not None else _not_recorded(self.recording, config)


def unit_hash(*parts: object) -> float:
    """A deterministic number in (0, 1) from its arguments (stable across processes)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2**64


def noise_factor(spread: float, *parts: object) -> float:
    """A log-normal factor with median 1 and relative spread ``spread``, fixed per ``parts``."""
    if spread == 0:
        return 1.0
    return math.exp(spread * statistics.NormalDist().inv_cdf(unit_hash(*parts)))


@dataclass
class SyntheticKernel:
    recording: Recording  # the source recording (another GPU model)
    slowdown: float
    noise: float
    seed: int = 0
    label: str = "synthetic"

    def measure(self, config: dict[str, Any]) -> Measurement:
        base = self.recording.lookup(config)
        if base is None:
            return _not_recorded(self.recording, config)
        origin = f"synthetic: {self.recording.name} x{self.slowdown:g}, noise {self.noise:g}"
        if base.time_ms is None:
            return replace(base, synthetic=True, detail=origin)
        key = self.recording.key(config)
        factor = self.slowdown * noise_factor(self.noise, self.seed, self.label, key)
        # Repeats jitter around the configuration's own (noisy) time by a fifth of the spread.
        times = tuple(t * factor * noise_factor(self.noise / 5, self.seed, self.label, key, i)
                      for i, t in enumerate(base.times))
        # Timed launches are the kernel's time; the checked launch is a launch plus a host
        # comparison (GPU-bound enough to follow the slowdown); compiling is host work.
        return replace(base, time_ms=base.time_ms * factor, times=times, synthetic=True, detail=origin,
                       verification_ms=scale_ms(base.verification_ms, self.slowdown),
                       benchmark_ms=scale_ms(base.benchmark_ms, factor))


def scale_ms(value: float | None, factor: float) -> float | None:
    """A recorded cost times ``factor``; unrecorded stays unrecorded."""
    return None if value is None else value * factor


def compact_recording(src: Path, dst: Path, repeats: int = MAX_REPEATS_KEPT) -> tuple[int, int]:
    """Write a smaller, still valid Kernel Tuner cache: header, parameters, time, ≤ ``repeats``
    times, and the compile/verification/benchmark times where the source has them.

    This is how the recordings shipped in ``fleettune_dev/data/recordings`` were made.
    Returns (configurations, bytes written).
    """
    opener = gzip.open if src.name.endswith(".gz") else open
    with opener(src, "rt") as f:
        doc = json.load(f)
    keys = doc["tune_params_keys"]
    out = {k: v for k, v in doc.items() if k != "cache"}
    cache = {}
    for key, rec in doc["cache"].items():
        small = {k: rec[k] for k in keys}
        t = rec.get("time")
        if isinstance(t, str):  # a failure string is the truth, whatever else the record says
            small["time"] = t
        else:
            small["time"] = round(float(t), 6)
            small["times"] = [round(float(x), 6) for x in (rec.get("times") or [])[:repeats]]
        small |= {name: round(ms, 3) for name, ms in _costs(rec).items()}
        cache[key] = small
    out["cache"] = cache
    data = gzip.compress(json.dumps(out, separators=(",", ":")).encode(), compresslevel=9, mtime=0)
    dst.write_bytes(data)
    return len(cache), len(data)
