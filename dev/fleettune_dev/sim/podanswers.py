"""What a trial Pod on a fake node answers: its batch, entry by entry, on the node's timeline.

:class:`PodAnswers` reads the batch from the Pod's ``FLEETTUNE_TRIAL`` and answers each
configuration from the node pool's recording or synthetic model of the kernel, or from the
built-in kernel's own model where nobody recorded it on that GPU; user source is read from
the Pod's ConfigMap volume and compiled for real (NVRTC, or Triton's compiler), its times
synthetic (``fleettune_dev.sim.usersource``). Then :func:`~fleettune_dev.sim.batch.answer_batch` lays
the answers on the batch's timeline. It makes no API call of its own: ConfigMaps come
through the ``config_maps`` reader the caller passes. Safe to call from several threads.
"""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

from fleettune.labels import POOL_LABEL
from fleettune_dev.cluster.fleet import Fleet, NodePool
from fleettune_dev.sim import tritoninterp
from fleettune_dev.sim.answer import (
    DEFAULT_COMPILE_S,
    Answer,
    answer_measurement,
    answer_trial,
    fingerprint,
    infra,
    invalid_configuration,
)
from fleettune_dev.sim.batch import BatchAnswer, answer_batch, compile_slots
from fleettune_dev.sim.builtin import answer_builtin
from fleettune_dev.sim.podspec import trial_container, trial_env, trial_env_vars
from fleettune_dev.sim.recordings import KernelModel, RecordedKernel, SyntheticKernel, load_recording
from fleettune_dev.sim.usersource import (
    Compiler,
    ConfigMapReader,
    SourceUnavailable,
    TritonCompiler,
    compile_defines,
    launch_geometry,
    launch_refused,
    shared_memory_refused,
    source_location,
    synthetic_measurement,
)
from fleettune_job import tritonsource
from fleettune_job.expressions import geometry
from fleettune_job.kernels import BUILTINS
from fleettune_job.protocol import TRIAL_ENV, Batch, Outcome, Trial


class PodAnswers:
    """Answers of the trial Pods of ``fleet``'s pools. ``seed`` fixes the synthetic models'
    noise; ``compile_s``: the simulated compile time of a configuration. ``compiler``
    compiles user source (its ``compiles`` counts NVRTC runs)."""

    def __init__(self, fleet: Fleet, seed: int = 0, compile_s: float = DEFAULT_COMPILE_S) -> None:
        self.fleet = fleet
        self.seed = seed
        self.compile_s = compile_s
        self.compiler = Compiler()
        self.triton = TritonCompiler()
        # (source, configuration, problem size) -> the interpreter's verdict (None: outputs match).
        self._verdicts: dict[tuple[str, str, str], str | None] = {}
        self._models: dict[tuple[str, str], KernelModel] = {}
        self._answering = threading.Lock()

    def answer(self, pod: dict[str, Any], node_labels: dict[str, str],
               config_maps: ConfigMapReader | None = None) -> BatchAnswer:
        """What a Pod on a node with these labels answers, on its timeline; a Pod whose batch
        cannot be read stops before its first configuration (an infrastructure failure).
        ``config_maps`` reads the ConfigMaps of the Pod's namespace (user source); it is the
        only API access."""
        text = trial_env(pod)
        pool_name = node_labels.get(POOL_LABEL)
        try:
            pool = self.fleet.pool(pool_name or "")
        except KeyError:
            return BatchAnswer.failed(infra(
                f"node {pod['spec'].get('nodeName')} has no pool of the fleet ({POOL_LABEL}={pool_name})"))
        if text is None:
            return BatchAnswer.failed(infra(f"no {TRIAL_ENV} value in the pod's containers", pool, node_labels))
        try:
            work = Batch.from_env(text)
        except ValueError as exc:
            return BatchAnswer.failed(infra(f"invalid {TRIAL_ENV}: {str(exc).splitlines()[0]}", pool, node_labels))
        trials = work.trials()
        if work.kernel.language == "triton":  # the batch's compiles in one process, then cached
            self._compile_triton(pod, trials, pool, node_labels, config_maps)
        # Entry by entry (user source is compiled once: the compiler caches its verdicts).
        answers = [self._answer_trial(pod, trial, pool, node_labels, config_maps) for trial in trials]
        return answer_batch(work, answers, compile_slots(pool, trial_env_vars(pod)))

    def _answer_trial(self, pod: dict[str, Any], trial: Trial, pool: NodePool, node_labels: dict[str, str],
                      config_maps: ConfigMapReader | None) -> Answer:
        if trial.kernel.source_path:
            return self._answer_source(pod, trial, pool, node_labels, config_maps)
        kernel = trial.kernel.builtin
        if kernel is None:
            return infra("the trial names neither a built-in kernel nor a source_path", pool, node_labels)
        with self._answering:  # the models (and their noise generators) are not shared between threads
            model = self.model(pool, kernel)
            if model is not None:
                return answer_trial(trial, pool, node_labels, model, compile_s=self.compile_s)
        desc = BUILTINS.get(kernel)
        if desc is None:
            return infra(f"pool {pool.name} has no recording or synthetic model for kernel {kernel!r}, and it is "
                         f"not a built-in kernel (built-ins: {', '.join(sorted(BUILTINS))})", pool, node_labels)
        # Nobody recorded this kernel on this GPU: the model of the kernel itself (synthetic).
        return answer_builtin(trial, pool, node_labels, desc, seed=self.seed, compile_s=self.compile_s)

    def _read_source(self, pod: dict[str, Any], trial: Trial, pool: NodePool, labels: dict[str, str],
                     config_maps: ConfigMapReader | None) -> str | Answer:
        """The source the Pod mounts, or the infrastructure failure of reading it."""
        path = trial.kernel.source_path or ""
        found = trial_container(pod)
        assert found is not None  # the trial was read from it
        try:
            cm_name, key = source_location(found[0], list((pod.get("spec") or {}).get("volumes") or []), path)
        except SourceUnavailable as exc:
            return infra(f"cannot read kernel source {path}: {exc}", pool, labels)
        if config_maps is None:
            return infra(f"cannot read kernel source {path}: no API access to ConfigMap {cm_name}", pool, labels)
        try:
            data = config_maps(cm_name)
        except Exception as exc:
            return infra(f"cannot read kernel source {path}: reading ConfigMap {cm_name}: {exc}", pool, labels)
        if data is None:
            return infra(f"cannot read kernel source {path}: ConfigMap {cm_name} not found", pool, labels)
        if key not in data:
            return infra(f"cannot read kernel source {path}: ConfigMap {cm_name} has no key {key!r}", pool, labels)
        return data[key]

    def _compile_triton(self, pod: dict[str, Any], trials: list[Trial], pool: NodePool, labels: dict[str, str],
                        config_maps: ConfigMapReader | None) -> None:
        """The batch's compiles, then its verification in Triton's interpreter of those that
        compiled, each in one child process; each trial then answers from the caches."""
        source = self._read_source(pod, trials[0], pool, labels, config_maps)
        if not isinstance(source, str) or not tritonsource.available():
            return
        cc = fingerprint(pool, labels, synthetic=True).compute_capability
        try:
            results = self.triton.check([self.triton.request(source, t, cc) for t in trials])
        except (ValueError, RuntimeError):
            return  # each trial answers its own error
        todo = [t for t, r in zip(trials, results, strict=True) if r.error is None and tritoninterp.verifiable(t)
                and self._verdict_key(source, t) not in self._verdicts]
        if todo:
            try:
                verdicts = tritoninterp.verify(source, todo)
            except (RuntimeError, subprocess.TimeoutExpired):
                return  # the reference does not run in the interpreter: unverified, as every simulated result
            with self._answering:
                self._verdicts.update(zip((self._verdict_key(source, t) for t in todo), verdicts, strict=True))

    @staticmethod
    def _verdict_key(source: str, trial: Trial) -> tuple[str, str, str]:
        return source, json.dumps(trial.config, sort_keys=True), json.dumps(trial.problem_size)

    def _answer_triton(self, source: str, trial: Trial, pool: NodePool, labels: dict[str, str]) -> Answer:
        """Compiled by Triton for the node's architecture, refused as Triton's launcher would
        refuse it, verified in Triton's interpreter (`_compile_triton`), timed by the
        synthetic model."""
        if not tritonsource.available():
            return infra("Triton is not installed: the simulator compiles Triton kernels with it "
                         "(pip install 'fleettune[triton]')", pool, labels)
        device = fingerprint(pool, labels, synthetic=True)
        try:
            grid = geometry(trial.kernel.grid or [], _numbers(trial.config), trial.problem_size, "grid")
        except ValueError as exc:
            return invalid_configuration(Outcome.LAUNCH_ERROR, f"launch geometry: {exc}", pool, labels, compile_s=0)
        try:
            result = self.triton.check([self.triton.request(source, trial, device.compute_capability)])[0]
        except (ValueError, RuntimeError) as exc:
            return invalid_configuration(Outcome.COMPILE_ERROR, str(exc), pool, labels, compile_s=0)
        if result.error is not None:
            return invalid_configuration(Outcome.COMPILE_ERROR, result.error, pool, labels, compile_s=self.compile_s)
        refused = shared_memory_refused(result.shared_bytes, device.compute_capability)
        if refused is None and min(grid) < 1:
            refused = f"simulated: grid {list(grid)} has a dimension below 1"
        if refused is not None:
            return invalid_configuration(Outcome.LAUNCH_ERROR, refused, pool, labels, compile_s=self.compile_s)
        wrong = self._verdicts.get(self._verdict_key(source, trial))
        if wrong is not None:
            return invalid_configuration(Outcome.CORRECTNESS_ERROR, f"simulated in Triton's interpreter at problem "
                                         f"size {tritoninterp.reduced(trial.problem_size)}: {wrong}", pool, labels,
                                         compile_s=self.compile_s)
        m = synthetic_measurement(source, trial, f"{device.product}/{device.compute_capability}", self.seed)
        return answer_measurement(trial, pool, labels, m, compile_s=self.compile_s)

    def _answer_source(self, pod: dict[str, Any], trial: Trial, pool: NodePool, labels: dict[str, str],
                       config_maps: ConfigMapReader | None) -> Answer:
        """User source: read from the Pod's ConfigMap volume, compiled for the node's compute
        capability, timed by the synthetic model when it compiles."""
        source = self._read_source(pod, trial, pool, labels, config_maps)
        if not isinstance(source, str):
            return source
        if trial.kernel.language == "triton":
            return self._answer_triton(source, trial, pool, labels)
        if not self.compiler.available():
            return infra("libnvrtc not found: the simulator compiles user kernel source with NVRTC "
                         "(pip install nvidia-cuda-nvrtc-cu12, or set FLEETTUNE_NVRTC to libnvrtc.so)", pool, labels)
        # In the job's order: geometry and defines, the compile, the launch.
        try:
            geometry = launch_geometry(trial)
        except ValueError as exc:
            return invalid_configuration(Outcome.LAUNCH_ERROR, f"launch geometry: {exc}", pool, labels, compile_s=0)
        try:
            defines = compile_defines(trial)
        except ValueError as exc:
            return invalid_configuration(Outcome.COMPILE_ERROR, str(exc), pool, labels, compile_s=0)
        device = fingerprint(pool, labels, synthetic=True)
        verdict = self.compiler.check(source, defines, trial.kernel.function or "", device.compute_capability)
        if verdict is not None:
            return invalid_configuration(Outcome.COMPILE_ERROR, verdict, pool, labels, compile_s=self.compile_s)
        refused = launch_refused(*geometry) if geometry else None
        if refused is not None:
            return invalid_configuration(Outcome.LAUNCH_ERROR, refused, pool, labels, compile_s=self.compile_s)
        m = synthetic_measurement(source, trial, f"{device.product}/{device.compute_capability}", self.seed)
        return answer_measurement(trial, pool, labels, m, compile_s=self.compile_s)

    def model(self, pool: NodePool, kernel: str) -> KernelModel | None:
        key = (pool.name, kernel)
        if key not in self._models:
            sim = pool.simulation
            if kernel in sim.recordings:
                rec = load_recording(self.fleet.recording_path(sim.recordings[kernel]))
                self._models[key] = RecordedKernel(rec)
            elif kernel in sim.synthetic:
                spec = sim.synthetic[kernel]
                rec = load_recording(self.fleet.recording_path(spec.source))
                self._models[key] = SyntheticKernel(rec, slowdown=spec.slowdown, noise=spec.noise,
                                                    seed=self.seed, label=f"{pool.name}/{kernel}")
            else:
                return None
        return self._models[key]


def _numbers(config: dict[str, Any]) -> dict[str, Any]:
    """A configuration as expressions see it (booleans as 0/1)."""
    return {k: int(v) if isinstance(v, bool) else v for k, v in config.items() if isinstance(v, int | float)}
