"""User source in the simulator: compiled for real (CUDA with NVRTC, Triton with Triton's
compiler), timed by a synthetic model.

A user-source trial names the path where its Pod mounts the run's ConfigMap key
(``/etc/fleettune/kernel/<key>``). The simulator reads that key through the API, as the
kubelet would to fill the volume, and compiles it with NVRTC for the node's compute
capability as the job would compile it (the same defines written into the source, the same
headers and options): a typo, an undefined parameter or a configuration ptxas rejects
fails here exactly as on the GPU, without one. A Triton kernel is compiled by Triton for the
node's compute capability (:class:`TritonCompiler`), and a configuration whose shared memory
exceeds the GPU's limit fails as Triton's launcher would fail it. Nobody has
measured the kernel, so a configuration that compiles gets its time from a smooth
deterministic model of its numeric values (:func:`synthetic_measurement`), always marked
synthetic.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from fleettune_dev.sim.recordings import Measurement, noise_factor, unit_hash
from fleettune_job.protocol import Trial
from fleettune_job.tritonsource import CompileRequest, CompileResult, compile_many

# ConfigMap name -> its data (string and decoded binary keys), or None when it does not exist.
ConfigMapReader = Callable[[str], Mapping[str, str] | None]

MODEL_NOISE = 0.03
MAX_REPEATS = 8
# What every CUDA GPU of compute capability >= 2.0 refuses to launch.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_Z = 64


class SourceUnavailable(LookupError):
    """The Pod does not carry the source where the trial says (the Job's problem, not the
    configuration's: an infrastructure error)."""


def source_location(container: Mapping[str, Any], volumes: list[Mapping[str, Any]],
                    source_path: str) -> tuple[str, str]:
    """(ConfigMap name, key) that ``container`` mounts at ``source_path``.

    The deepest mount containing the path wins, as in the container's filesystem; a
    ``subPath`` and a volume's ``items`` remap keys like the kubelet does.
    """
    path = PurePosixPath(source_path)
    best: tuple[int, Mapping[str, Any], PurePosixPath] | None = None
    for mount in container.get("volumeMounts") or []:
        root = PurePosixPath(mount.get("mountPath") or "/nonexistent")
        if path == root or root in path.parents:
            rel = PurePosixPath(mount.get("subPath") or "") / path.relative_to(root)
            if best is None or len(root.parts) > best[0]:
                best = (len(root.parts), mount, rel)
    if best is None:
        raise SourceUnavailable(f"no volume of the trial container is mounted at {source_path}")
    _, mount, rel = best
    volume = next((v for v in volumes if v.get("name") == mount.get("name")), None)
    cm = (volume or {}).get("configMap")
    if not cm or not cm.get("name"):
        raise SourceUnavailable(f"{source_path} is on volume {mount.get('name')!r}, which is not a ConfigMap")
    relative = rel.as_posix()
    items = cm.get("items")
    if items:
        key = next((i.get("key") for i in items if PurePosixPath(i.get("path") or "").as_posix() == relative), None)
        if key is None:
            raise SourceUnavailable(f"ConfigMap {cm['name']} projects no key to {source_path}")
        return cm["name"], key
    return cm["name"], relative


def config_map_data(doc: Mapping[str, Any]) -> dict[str, str]:
    """A ConfigMap's keys as files would hold them (binaryData decoded as UTF-8 where it is)."""
    data = dict(doc.get("data") or {})
    for key, b64 in (doc.get("binaryData") or {}).items():
        data[key] = base64.b64decode(b64).decode(errors="replace")
    return data


def _interface(trial: Trial) -> Any:
    from fleettune_job.kernels import BUILTINS

    return BUILTINS.get(trial.kernel.builtin or "")


Dims = tuple[int, int, int]


def launch_geometry(trial: Trial) -> tuple[Dims, Dims] | None:
    """(grid, block) as the job works them out (None when the trial gives no geometry).
    Raises ValueError (an ExpressionError) when an expression cannot be evaluated."""
    from fleettune_job.expressions import geometry

    desc = _interface(trial)
    grid, block = trial.kernel.grid, trial.kernel.block
    names: dict[str, Any] = {}
    if desc is not None:
        grid, block = grid or list(desc.grid), block or list(desc.block)
        names = dict(desc.default_config)
    if not grid or not block:
        return None
    # Booleans are ints: expressions see them as 0/1.
    names |= {k: int(v) if isinstance(v, bool) else v for k, v in trial.config.items() if isinstance(v, int | float)}
    return (geometry(grid, names, trial.problem_size, "grid"), geometry(block, names, trial.problem_size, "block"))


def launch_refused(grid: Dims, block: Dims) -> str | None:
    """Why CUDA would refuse to launch with this geometry, in the job's words."""
    threads = block[0] * block[1] * block[2]
    if min(*grid, *block) < 1:
        return f"simulated: CUDA_ERROR_INVALID_VALUE: grid {list(grid)}, block {list(block)} (a dimension below 1)"
    if threads > MAX_THREADS_PER_BLOCK or block[2] > MAX_BLOCK_Z:
        return (f"simulated: CUDA_ERROR_INVALID_VALUE: block {list(block)} ({threads} threads; at most "
                f"{MAX_THREADS_PER_BLOCK}, z at most {MAX_BLOCK_Z})")
    return None


def compile_defines(trial: Trial) -> dict[str, str]:
    """The job's defines (name -> rendered value): every configuration entry and
    ``problem_size_<i>`` (plus, for source implementing a built-in's interface, that
    interface's defaults and problem defines). Raises ValueError for a name or value that
    cannot be a compile-time constant."""
    from fleettune_job.kernels.base import as_int, define_value
    from fleettune_job.prepare import user_defines

    problem_size = [int(n) for n in trial.problem_size]
    if trial.kernel.arguments is not None:  # a kernel with its own interface: the job's own defines
        return user_defines(trial.config, problem_size)
    defines: dict[str, Any] = dict(trial.config)
    builtin = trial.kernel.builtin
    if builtin:
        from fleettune_job.kernels import BUILTINS

        desc = BUILTINS.get(builtin)
        if desc is not None:
            problem_size = problem_size or list(desc.problem_size)
            known = {p.name for p in desc.parameters}
            interface = desc.default_config | {k: as_int(k, v) for k, v in trial.config.items() if k in known}
            defines = interface | defines | desc.problem.defines(problem_size, interface)
    defines |= {f"problem_size_{i}": n for i, n in enumerate(problem_size)}
    return {name: define_value(name, value) for name, value in sorted(defines.items())}


class Compiler:
    """NVRTC checks, cached per (source, options, function, architecture): a tuning run
    asks for the same configuration on every node of a pool, and again when it retries."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self.compiles = 0  # actual NVRTC runs (cache misses)
        self._cache: OrderedDict[tuple[str, tuple[str, ...], str, str], str | None] = OrderedDict()
        # One compile at a time: NVRTC and ptxas are CPU-heavy, and the simulator shares
        # its machine with the control plane it feeds.
        self._lock = threading.Lock()

    @staticmethod
    def available() -> bool:
        from fleettune_job import nvrtc

        return nvrtc.available()

    def check(self, source: str, defines: Mapping[str, str], function: str, compute_capability: str) -> str | None:
        """None if the source compiles for the architecture with ``defines`` (rendered values)
        and defines ``function``, else the compiler's message: the code and options the job
        compiles. Raises RuntimeError when libnvrtc is missing."""
        from fleettune_job import nvrtc

        code = nvrtc.program(source, defines)
        options = nvrtc.job_options(nvrtc.header_options())
        key = (hashlib.sha256(code.encode()).hexdigest(), options, function, compute_capability)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            verdict = nvrtc.check_kernel(code, options, function, compute_capability)
            self.compiles += 1
            self._cache[key] = verdict
            if len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
            return verdict


class TritonCompiler:
    """Triton compiles (``fleettune_job.tritonsource``), cached per configuration and
    architecture; a batch's configurations are compiled in one child process."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self.compiles = 0
        self._cache: OrderedDict[CompileRequest, CompileResult] = OrderedDict()
        self._lock = threading.Lock()
        self._folder = tempfile.TemporaryDirectory(prefix="fleettune-sim-triton-")  # Triton's own cache

    @staticmethod
    def request(source: str, trial: Trial, compute_capability: str) -> CompileRequest:
        arguments = [(a.kind, a.dtype) for a in trial.kernel.arguments or []]
        return CompileRequest.of(source, trial.kernel.function or "", arguments, trial.config, compute_capability)

    def check(self, requests: list[CompileRequest]) -> list[CompileResult]:
        """Each request's verdict (raises TritonSourceError for a source that is not vetted,
        RuntimeError when Triton is missing)."""
        with self._lock:
            missing = list(dict.fromkeys(r for r in requests if r not in self._cache))
            if missing:
                for r, result in zip(missing, compile_many(missing, self._folder.name), strict=True):
                    self._cache[r] = result
                self.compiles += len(missing)
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
            return [self._cache[r] for r in requests]


def shared_memory_refused(shared_bytes: int, compute_capability: str) -> str | None:
    """Triton's launcher's message for a kernel over the GPU's shared memory per block."""
    from fleettune.space import SpaceError, lookup_device

    try:
        limit = lookup_device(compute_capability=compute_capability).shared_memory_per_block_optin
    except SpaceError:
        return None
    if shared_bytes <= limit:
        return None
    return f"simulated: out of resource: shared memory, Required: {shared_bytes}, Hardware limit: {limit}"


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def synthetic_measurement(source: str, trial: Trial, device: str, seed: int = 0) -> Measurement:
    """A time for a kernel nobody has measured: smooth in each numeric parameter, the same
    for the same configuration in every process, so an optimiser has a landscape to learn.

    Each numeric parameter contributes a bowl in log2 of its value, whose optimum and
    steepness come from the source and the parameter's name (2..256, so powers of two
    typical of block sizes matter); other values a fixed factor per value. The problem's
    element count sets the scale, the device a speed factor, and each configuration a few
    percent of noise seeded by its key.
    """
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    elements = math.prod(int(n) for n in trial.problem_size) if trial.problem_size else 1 << 20
    time_ms = (0.02 + 1e-7 * elements) * (0.6 + 1.2 * unit_hash(seed, "device", device))
    for name, value in sorted(trial.config.items()):
        x = _numeric(value)
        if x is None:
            time_ms *= 1 + 0.5 * unit_hash(seed, digest, name, "value", json.dumps(value, sort_keys=True))
            continue
        position = math.copysign(math.log2(1 + abs(x)), x)
        optimum = 1 + 7 * unit_hash(seed, digest, name, "optimum")
        steepness = 0.02 + 0.1 * unit_hash(seed, digest, name, "steepness")
        time_ms *= 1 + steepness * (position - optimum) ** 2
    key = json.dumps(trial.config, sort_keys=True, separators=(",", ":"))
    time_ms *= noise_factor(MODEL_NOISE, seed, digest, device, key)
    times = tuple(time_ms * noise_factor(MODEL_NOISE / 5, seed, digest, device, key, i)
                  for i in range(min(trial.repeats, MAX_REPEATS)))
    return Measurement(time_ms=time_ms, times=times, synthetic=True,
                       detail="synthetic: user source compiled with NVRTC, time from a model")
