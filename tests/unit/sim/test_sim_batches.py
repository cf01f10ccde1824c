"""Batch Pods in the simulator: the timeline from recorded costs, the start-up model, a
batch stopped by its deletion, and what an unreadable batch gets (no cluster: a fake API)."""

from __future__ import annotations

import gzip
import json
import random
from types import SimpleNamespace

import pytest
from kubernetes.client import ApiException

from fleettune_dev.bench.load import bench_fleet
from fleettune_dev.cluster.fleet import NodePool, default_fleet
from fleettune_dev.sim import FleetSimulator, PodStartup
from fleettune_dev.sim.answer import DEFAULT_COMPILE_S, Answer, answer_trial
from fleettune_dev.sim.batch import BatchAnswer, answer_batch, compile_slots, timeline
from fleettune_dev.sim.kubelet import KILLED_EXIT_CODE
from fleettune_dev.sim.recordings import Measurement, RecordedKernel, Recording, compact_recording, load_recording
from fleettune_job.protocol import (
    EXIT_STOPPED_EARLY,
    TRIAL_ENV,
    Batch,
    Outcome,
    Trial,
    TrialResult,
    decode_batch,
)

FLEET = default_fleet()
A100 = FLEET.pool("a100")
LABELS = A100.node_labels("a100-0")
CONFIG = {"block_size_x": 32, "block_size_y": 4, "tile_size_x": 1, "tile_size_y": 3, "read_only": 1,
          "use_padding": 0, "use_shmem": 1}
RECORDED_MS = 0.5536  # CONFIG's time in the A100 recording


def _batch(configs: list[dict], first: int = 10, kernel: dict | None = None, **kw) -> Batch:
    return Batch(run="r", target="a100", kernel=kernel or {"builtin": "convolution"}, problem_size=[4096, 4096],
                 entries=[{"index": first + n, "config": c} for n, c in enumerate(configs)], **kw)


def _pod(env: str | None, uid: str = "u") -> dict:
    envs = [{"name": TRIAL_ENV, "value": env}] if env is not None else []
    return {"metadata": {"name": "p", "namespace": "ns", "uid": uid, "resourceVersion": "7"},
            "spec": {"nodeName": "a100-0", "containers": [{"name": "trial", "image": "t", "env": envs}]},
            "status": {"phase": "Running"}}


def _sim(**kw) -> FleetSimulator:
    return FleetSimulator("/nonexistent/kubeconfig", FLEET, time_scale=0, **kw)


def test_a_run_that_tunes_some_parameters_is_answered_with_the_kernels_defaults_for_the_rest():
    # The job image runs a built-in with its defaults for what the run does not tune
    # (use_padding 1, use_shmem 1, tile_size_y 1, ...): so does the simulator's lookup.
    model = RecordedKernel(load_recording(FLEET.recording_path("convolution_milo-A100")))
    trial = Trial(run="r", target="a100", index=0, kernel={"builtin": "convolution"}, problem_size=[4096, 4096],
                  config={"block_size_x": 16, "block_size_y": 1, "tile_size_x": 2})
    answer = answer_trial(trial, A100, LABELS, model)
    assert answer.result.outcome == Outcome.OK and answer.result.objective == pytest.approx(2.547616, rel=1e-4)


# ---------------------------------------------------------------------------- the timeline


def test_compiles_overlap_on_their_slots_while_the_gpu_works_in_order():
    # 8 configurations, 1 s to compile, 0.1 s on the GPU, 4 slots: two waves of compiles,
    # the GPU behind each.
    assert timeline([(1.0, 0.1)] * 8, slots=4) == pytest.approx([1.1, 1.2, 1.3, 1.4, 2.1, 2.2, 2.3, 2.4])
    # One slot: each compile after the last, the GPU never the bottleneck.
    assert timeline([(1.0, 0.1)] * 3, slots=1) == pytest.approx([1.1, 2.1, 3.1])
    # GPU-bound: the critical path is the GPU's work, compiles hidden behind it.
    assert timeline([(0.1, 1.0)] * 4, slots=4)[-1] == pytest.approx(0.1 + 4 * 1.0)


def test_a_configuration_that_fails_to_compile_never_takes_the_gpu():
    times = timeline([(1.0, 0.5), (1.0, 0.0), (1.0, 0.5)], slots=1)
    assert times == pytest.approx([1.5, 2.0, 3.5])  # the failure is answered when its compile ends
    # With the slots to compile ahead, the failure is answered before the GPU is free.
    assert timeline([(1.0, 5.0), (1.0, 0.0)], slots=2) == pytest.approx([6.0, 1.0])
    with pytest.raises(ValueError):
        timeline([(1.0, 1.0)], slots=-1)


def _costed_recording() -> Recording:
    table = {
        "16,1": Measurement(1.0, (1.0,), compile_ms=2000.0, verification_ms=100.0, benchmark_ms=300.0),
        "32,1": Measurement(None, failure="compile", compile_ms=1500.0),
        "64,1": Measurement(2.0, (2.0,)),  # no recorded costs: the model's
        "16,2": Measurement(None, failure="runtime", compile_ms=1000.0, verification_ms=20.0),
    }
    return Recording(name="costed", device_name="GPU", kernel_name="k", problem_size=[4096, 4096],
                     keys=("bx", "by"), table=table)


def test_batch_durations_come_from_the_recorded_costs():
    model = RecordedKernel(_costed_recording())
    configs = [{"bx": 16, "by": 1}, {"bx": 32, "by": 1}, {"bx": 64, "by": 1}, {"bx": 16, "by": 2}]
    batch = _batch(configs)
    answers = [answer_trial(t, A100, LABELS, model) for t in batch.trials()]
    ok, failed, modelled, launch = answers
    assert (ok.compile_s, ok.gpu_s) == pytest.approx((2.0, 0.4))  # verification + benchmark
    assert (failed.compile_s, failed.gpu_s) == pytest.approx((1.5, 0.0))
    assert (modelled.compile_s, modelled.gpu_s) == pytest.approx((DEFAULT_COMPILE_S, 2.0 * 10 / 1000))
    assert (launch.compile_s, launch.gpu_s) == pytest.approx((1.0, 0.02))
    assert (ok.result.compile_s, ok.result.run_s) == pytest.approx((2.0, 0.4))

    two = answer_batch(batch, answers, slots=2)
    # slot A: 0-2 (ok), slot B: 0-1.5 (fails), B: 1.5-2.35 (modelled), A: 2-3 (launch);
    # GPU: ok 2-2.4, modelled 2.4-2.42, launch 3-3.02.
    assert [t.at_s for t in two.answers] == pytest.approx([2.4, 1.5, 2.42, 3.02])
    assert two.duration_s == pytest.approx(3.02)
    result = decode_batch(two.result.encode())
    assert result.done and result.exit_code == 0 and [a.i for a in result.answers] == [10, 11, 12, 13]
    assert [a.o for a in result.answers] == [Outcome.OK, Outcome.COMPILE_ERROR, Outcome.OK, Outcome.LAUNCH_ERROR]
    assert result.answers[0].c == pytest.approx(2.0) and result.answers[0].r == pytest.approx(0.4)
    # Compiles one after another: the batch takes longer, the GPU work is the same.
    assert answer_batch(batch, answers, slots=1).duration_s == pytest.approx(2 + 1.5 + 0.85 + 1 + 0.02)


def test_a_pruned_configuration_is_answered_and_charged_as_the_job_times_it():
    runs = (4.0, 5.0, 6.0, 4.0, 4.0, 4.0, 4.0, 4.0)
    table = {"16,1": Measurement(4.0, runs, compile_ms=2000.0, verification_ms=100.0, benchmark_ms=800.0),
             "32,1": Measurement(4.0, runs)}  # no recorded costs: the model's
    model = RecordedKernel(Recording(name="slow", device_name="GPU", kernel_name="k", problem_size=[4096, 4096],
                                     keys=("bx", "by"), table=table))
    costed, modelled = _batch([{"bx": 16, "by": 1}, {"bx": 32, "by": 1}], prune_above_ms=4.5).trials()
    ans = answer_trial(costed, A100, LABELS, model)
    # The first 3 runs' median is 5 ms > 4.5: timed no further, not verified; the recorded 4 ms
    # × that median over the median of all 8 (5 / 4) reported; 3 of 8 runs' share of the
    # benchmark spent, and no verification.
    assert ans.result.objective == 5.0 and ans.result.times == [4.0, 5.0, 6.0] and ans.result.pruned
    assert ans.gpu_s == pytest.approx(0.8 * 3 / 8)
    assert answer_trial(modelled, A100, LABELS, model).gpu_s == pytest.approx(4.0 * (3 + 3) / 1000)
    # Pruned or not on the recording's scale: runs of 6 ms for a recorded 4 ms are 4 ms runs.
    offset = RecordedKernel(Recording(name="offset", device_name="GPU", kernel_name="k", problem_size=[4096, 4096],
                                      keys=("bx", "by"), table={"16,1": Measurement(4.0, (6.0,) * 8)}))
    kept = answer_trial(costed, A100, LABELS, offset)
    assert kept.result.pruned is None and kept.result.objective == 4.0
    # Under the cut-off (or with no cut-off), every run the trial asks for.
    for kept in (costed.model_copy(update={"prune_above_ms": 5.5}), costed.model_copy(update={"prune_above_ms": None})):
        ans = answer_trial(kept, A100, LABELS, model)
        assert ans.result.objective == 4.0 and len(ans.result.times) == 7 and ans.gpu_s == pytest.approx(0.9)
        assert ans.result.pruned is None


def test_a_pod_of_one_configuration_keeps_its_duration_when_the_recording_has_no_costs():
    ans = _sim().answer(_pod(_batch([CONFIG]).to_env()), LABELS)
    assert [a.answer.result.objective for a in ans.answers] == [RECORDED_MS]
    assert ans.duration_s == pytest.approx(DEFAULT_COMPILE_S + RECORDED_MS * (3 + 7) / 1000)


def test_a_batch_pod_is_answered_from_the_pools_recording_on_its_timeline():
    other = {**CONFIG, "tile_size_y": 1}
    ans = _sim().answer(_pod(_batch([CONFIG, other, CONFIG | {"block_size_x": 999}]).to_env()), LABELS)
    assert isinstance(ans, BatchAnswer)
    result = decode_batch(ans.result.encode())
    assert result.done and [a.o for a in result.answers] == [Outcome.OK, Outcome.OK, Outcome.COMPILE_ERROR]
    assert result.answers[0].t == RECORDED_MS
    assert not result.fingerprint.synthetic, "an inferred invalid verdict does not make measurements synthetic"
    # 4 compiles at once (the job's pool on a 64-core node): all 3 at once, then the GPU in order.
    assert [t.at_s for t in ans.answers][2] == pytest.approx(DEFAULT_COMPILE_S)
    assert ans.duration_s == pytest.approx(DEFAULT_COMPILE_S + sum(t.answer.gpu_s for t in ans.answers))


def test_compile_slots_are_the_jobs_compile_ahead_pool_on_the_pools_nodes():
    assert [compile_slots(p) for p in FLEET.pools] == [4, 4, 4]  # one per core but one, at most 4
    assert compile_slots(bench_fleet(24, 3, 4).pools[0]) == 4
    unset = NodePool.model_validate({k: v for k, v in A100.model_dump(by_alias=True).items() if k != "resources"})
    assert compile_slots(unset) == 4  # a node of NodeResources' default 32 cores
    small = A100.model_copy(update={"resources": A100.resources.model_copy(update={"cpu": "2500m"})})
    assert compile_slots(small) == 1
    assert compile_slots(A100, {"FLEETTUNE_COMPILE_WORKERS": "2"}) == 2
    assert compile_slots(A100, {"FLEETTUNE_COMPILE_WORKERS": "0"}) == 0  # compile-ahead off


def test_without_compile_ahead_each_configuration_compiles_then_runs():
    assert timeline([(1.0, 0.5), (1.0, 0.0), (1.0, 0.5)], slots=0) == pytest.approx([1.5, 2.5, 4.0])
    env = _pod(_batch([CONFIG, {**CONFIG, "tile_size_y": 1}]).to_env())
    env["spec"]["containers"][0]["env"].append({"name": "FLEETTUNE_COMPILE_WORKERS", "value": "0"})
    ans = _sim().answer(env, LABELS)
    assert isinstance(ans, BatchAnswer)
    assert ans.duration_s == pytest.approx(sum(t.answer.duration_s for t in ans.answers))


def test_full_kernel_tuner_caches_keep_their_costs_and_compact_ones_still_load(tmp_path):
    cache = {"tune_params_keys": ["bx"], "tune_params": {"bx": [16, 32]}, "device_name": "GPU",
             "kernel_name": "k", "problem_size": [64],
             "cache": {"16": {"bx": 16, "time": 1.0, "times": [1.0, 1.0], "compile_time": 812.5,
                              "verification_time": 3.25, "benchmark_time": 40.0, "strategy_time": 0},
                       "32": {"bx": 32, "time": "CompilationFailedConfig", "compile_time": 90.0}}}
    src = tmp_path / "full.json"
    src.write_text(json.dumps(cache))
    m = load_recording(src).table["16"]
    assert (m.compile_ms, m.verification_ms, m.benchmark_ms) == (812.5, 3.25, 40.0)
    assert load_recording(src).table["32"].compile_ms == 90.0
    compact_recording(src, tmp_path / "small.json.gz")
    small = json.loads(gzip.decompress((tmp_path / "small.json.gz").read_bytes()))["cache"]
    assert small["16"]["compile_time"] == 812.5 and "strategy_time" not in small["16"]
    assert load_recording(tmp_path / "small.json.gz").table["16"] == m
    packaged = next(iter(load_recording(FLEET.recording_path("convolution_milo-A100")).table.values()))
    assert packaged.compile_ms is None and packaged.benchmark_ms is None


def test_a_batch_on_a_synthetic_pool_is_marked_synthetic():
    jetson = FLEET.pool("jetson-orin")
    ans = _sim().answer(_pod(_batch([CONFIG]).to_env()), jetson.node_labels("jetson-orin-0"))
    assert isinstance(ans, BatchAnswer) and ans.result.fingerprint.synthetic


# ---------------------------------------------------------------------------- start-up


def test_the_start_up_model_has_the_quantiles_it_is_given():
    model = PodStartup()
    draws = sorted(model.for_pod(0, f"pod-{i}") for i in range(20_000))
    assert draws[10_000] == pytest.approx(2.0, rel=0.05)
    assert draws[19_800] == pytest.approx(5.0, rel=0.08)
    assert model.quantile(0.5) == pytest.approx(2.0) and model.quantile(0.99) == pytest.approx(5.0)
    assert model.for_pod(0, "a") == model.for_pod(0, "a") != model.for_pod(1, "a")
    rng = random.Random(1)
    sampled = sorted(model.sample(rng) for _ in range(20_000))
    assert sampled[10_000] == pytest.approx(2.0, rel=0.05)
    slow = PodStartup(p50_s=10, p99_s=30)
    assert slow.quantile(0.99) == pytest.approx(30) and PodStartup(3, 3).for_pod(0, "x") == pytest.approx(3)
    for bad in ((0, 5), (3, 2), (float("nan"), 5)):
        with pytest.raises(ValueError):
            PodStartup(*bad)


def test_start_up_is_added_before_the_first_configuration_only_when_switched_on():
    pod = _pod(_batch([CONFIG]).to_env())
    off, on = _sim(), _sim(startup=PodStartup())
    for sim in (off, on):
        sim.time_scale = 1.0
    answer = off.answer(pod, LABELS)
    assert off._due(pod, "n", answer, began=100.0).at == pytest.approx(100.0 + answer.duration_s)
    startup = PodStartup().for_pod(0, "u")
    due = on._due(pod, "n", answer, began=100.0, startup_s=startup)
    assert due.at == pytest.approx(100.0 + startup + answer.duration_s)
    assert due.elapsed_s(100.0 + startup + 0.5, 1.0) == pytest.approx(0.5)


# ---------------------------------------------------------------------------- stopped mid-batch


def test_a_killed_batch_keeps_the_answers_its_time_had_reached():
    batch = _batch([{"bx": 16, "by": 1}, {"bx": 32, "by": 1}, {"bx": 64, "by": 1}])
    model = RecordedKernel(_costed_recording())
    ans = answer_batch(batch, [answer_trial(t, A100, LABELS, model) for t in batch.trials()], slots=1)
    assert [t.at_s for t in ans.answers] == pytest.approx([2.4, 3.5, 4.37])
    for elapsed, answered in ((0.0, []), (2.4, [10]), (4.0, [10, 11]), (99.0, [10, 11, 12])):
        result = decode_batch(ans.terminated(elapsed).encode())
        assert [a.i for a in result.answers] == answered
        assert not result.done and result.error == "terminated" and result.exit_code == EXIT_STOPPED_EARLY


class FakeCore:
    """The API calls the simulator makes about one Pod and its node."""

    def __init__(self, pod_phase: str = "Running", node_uid: str = "node-1", conflict: bool = False) -> None:
        self.pod_phase, self.node_uid, self.conflict = pod_phase, node_uid, conflict
        self.patches: list[dict] = []

    def read_node(self, name: str, **_: object) -> SimpleNamespace:
        if not self.node_uid:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps({"metadata": {"name": name, "uid": self.node_uid,
                                                             "annotations": {"kwok.x-k8s.io/node": "fake"}}}))

    def read_namespaced_pod(self, name: str, namespace: str, **_: object) -> SimpleNamespace:
        return SimpleNamespace(data=json.dumps({"metadata": {"name": name, "uid": "u", "resourceVersion": "8"},
                                                "status": {"phase": self.pod_phase}}))

    def patch_namespaced_pod_status(self, name: str, namespace: str, body: dict, **_: object) -> SimpleNamespace:
        if self.conflict:
            self.conflict = False
            self.pod_phase = "Failed"  # kwok's delete stage got there first
            raise ApiException(status=409, reason="Conflict")
        self.patches.append(body)
        return SimpleNamespace(data=b"{}")


def _running_batch(sim: FleetSimulator, elapsed_s: float) -> tuple[dict, BatchAnswer]:
    """A tracked batch Pod of 3 configurations, ``elapsed_s`` into its (time-scale 1) run:
    compiled by 0.85 s (4 at once), then timed for a second each (answers at 1.85, 2.85, 3.85)."""
    import time

    configs = [CONFIG, {**CONFIG, "tile_size_y": 1}, {**CONFIG, "tile_size_x": 2}]
    pod = _pod(_batch(configs, min_duration_s=1.0).to_env())
    answer = sim.answer(pod, LABELS)
    assert isinstance(answer, BatchAnswer)
    sim.time_scale = 1.0
    sim._running.add("u")
    sim._batches["u"] = sim._due(pod, "node-1", answer, began=time.monotonic() - elapsed_s)
    return pod, answer


def _deleted(pod: dict) -> dict:
    return pod | {"metadata": pod["metadata"] | {"deletionTimestamp": "2025-01-01T00:00:00Z"}}


def test_a_batch_pod_deleted_mid_batch_reports_exit_137_with_its_answers_so_far():
    sim = _sim()
    pod, _ = _running_batch(sim, elapsed_s=2.3)
    submitted: list[tuple] = []
    sim._submit = lambda fn, *args: submitted.append((fn, args)) or True
    sim._consider("MODIFIED", _deleted(pod))
    assert "u" not in sim._running and "u" not in sim._batches
    [(fn, (due, rv))] = submitted
    assert fn == sim._terminate_on_worker and rv == "7"
    core = FakeCore()
    sim._terminate(core, due, rv)
    [body] = core.patches
    assert body["metadata"] == {"uid": "u", "resourceVersion": "7"}, "written only over the Pod as it was seen"
    assert body["status"]["phase"] == "Failed"
    state = body["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == KILLED_EXIT_CODE and state["reason"] == "Error"
    result = decode_batch(state["message"])
    assert [a.i for a in result.answers] == [10] and not result.done and result.error == "terminated"
    assert sim.answered == [("ns", "r", "a100", 10)] and sim.terminated == 1 and sim.outcomes == {"ok": 1}
    # Its due completion comes to nothing: the Pod is no longer running.
    sim._complete(FakeCore(), due)
    assert sim.answered == [("ns", "r", "a100", 10)]


def test_a_batch_pod_deleted_after_its_time_was_up_had_exited_by_itself():
    sim = _sim()
    _running_batch(sim, elapsed_s=60.0)
    core = FakeCore()
    sim._terminate(core, sim._batches.pop("u"), "7")
    state = core.patches[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 0 and decode_batch(state["message"]).done
    assert sim.terminated == 0 and len(sim.answered) == 3


def test_a_deleted_batch_pod_that_kwok_ended_first_keeps_kwoks_status():
    sim = _sim()
    _running_batch(sim, elapsed_s=1.5)
    core = FakeCore(conflict=True)
    sim._terminate(core, sim._batches.pop("u"), "7")
    assert core.patches == [] and sim.answered == [] and sim.terminated == 0


class LostReplyCore(FakeCore):
    """An apiserver that stores the first status write and dies before replying; the Pod
    is then still there to read back, or (``deleted``) already removed."""

    def __init__(self, deleted: bool) -> None:
        super().__init__()
        self.deleted, self.stored = deleted, None

    def read_namespaced_pod(self, name: str, namespace: str, **_: object) -> SimpleNamespace:
        if self.deleted:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps({"metadata": {"name": name, "uid": "u"}, "status": self.stored}))

    def patch_namespaced_pod_status(self, name: str, namespace: str, body: dict, **_: object) -> SimpleNamespace:
        from urllib3.exceptions import ProtocolError

        reply = super().patch_namespaced_pod_status(name, namespace, body)
        if self.stored is not None:
            return reply
        self.stored = body["status"]
        raise ProtocolError("Connection broken: IncompleteRead(0 bytes read)")


@pytest.mark.parametrize("deleted", [False, True])
def test_a_deleted_batch_pods_write_whose_reply_was_lost_is_read_back_and_counted_once(deleted):
    sim = _sim()
    _running_batch(sim, elapsed_s=2.3)
    core = LostReplyCore(deleted)
    sim._worker_api = lambda: core
    sim._running.discard("u")  # deleted: the watch no longer counts it running
    sim._terminate_on_worker(sim._batches.pop("u"), "7")
    assert len(core.patches) == 1 and sim.answered == [] and sim.unsettled == []
    assert "IncompleteRead" in sim.errors[-1]
    [due] = sim._heap  # to be read back once the apiserver answers again
    for _ in range(2):  # a second try counts nothing twice
        sim._complete(core, due)
    assert len(core.patches) == 1, "the Pod ended: nothing more is written"
    if deleted:  # whether the operator saw them cannot be told
        assert sim.unsettled == [("ns", "r", "a100", 10)] and sim.answered == [] and sim.terminated == 0
    else:
        assert sim.answered == [("ns", "r", "a100", 10)] and sim.unsettled == [] and sim.terminated == 1


def test_a_batch_pod_whose_node_is_gone_gets_no_answer_at_all():
    sim = _sim()
    _running_batch(sim, elapsed_s=1.5)
    core = FakeCore(node_uid="")
    sim._terminate(core, sim._batches["u"], "7")
    assert core.patches == [] and sim.lost == 1 and "u" not in sim._batches and sim.answered == []


def test_a_batch_pod_deleted_before_it_was_answered_is_killed_with_no_answer():
    sim = _sim()
    submitted: list[tuple] = []
    sim._submit = lambda fn, *args: submitted.append((fn, args)) or True
    pod = _deleted(_pod(_batch([CONFIG]).to_env(), uid="v"))
    sim._consider("MODIFIED", pod)
    sim._consider("MODIFIED", pod)  # once only
    [(fn, (seen,))] = submitted
    assert fn == sim._stop_untracked_on_worker
    core = FakeCore()
    sim._stop_untracked(core, seen)
    state = core.patches[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == KILLED_EXIT_CODE and decode_batch(state["message"]).answers == []
    # A Pod that is no trial Pod (no FLEETTUNE_TRIAL) being deleted is left to kwok.
    submitted.clear()
    sim._consider("MODIFIED", _deleted(_pod(None, uid="w")))
    assert submitted == []


def test_a_finished_batch_pod_is_completed_with_every_answer():
    sim = _sim()
    _, answer = _running_batch(sim, elapsed_s=60.0)
    core = FakeCore()
    sim._complete(core, sim._batches["u"])
    state = core.patches[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert core.patches[0]["status"]["phase"] == "Succeeded" and state["exitCode"] == 0
    assert decode_batch(state["message"]) == answer.result
    assert [i for *_, i in sim.answered] == [10, 11, 12] and "u" not in sim._batches


# ---------------------------------------------------------------------------- unreadable batches


def test_an_invalid_batch_env_is_an_infrastructure_failure_in_the_batch_protocol():
    sim = _sim()
    empty = json.dumps({"run": "r", "target": "a100", "kernel": {"builtin": "convolution"},
                        "problem_size": [1], "entries": []})
    for env, text in ((empty, "invalid FLEETTUNE_TRIAL"),
                      (_batch([CONFIG], kernel={"builtin": "transpose"}).to_env(), "no recording or synthetic model")):
        ans = sim.answer(_pod(env), LABELS)
        assert isinstance(ans, BatchAnswer), text
        result = decode_batch(ans.result.encode())
        assert not result.done and result.answers == [] and text in result.error
        assert result.exit_code == EXIT_STOPPED_EARLY and ans.duration_s > 0
    # Not even JSON, or a one-configuration document of an earlier version: no batch to read either.
    trial = Trial(run="r", target="a100", index=0, kernel={"builtin": "convolution"}, config=CONFIG,
                  problem_size=[4096, 4096])
    for env in ("{not json", trial.model_dump_json()):
        garbled = sim.answer(_pod(env), LABELS)
        assert not garbled.answers and "invalid FLEETTUNE_TRIAL" in decode_batch(garbled.result.encode()).error


def test_an_infrastructure_failure_mid_batch_stops_it_with_what_it_had():
    ok = Answer(TrialResult(outcome=Outcome.OK, objective=1.0), compile_s=1.0, gpu_s=0.1)
    broken = Answer(TrialResult(outcome=Outcome.INFRA_ERROR, error="simulator: no source"), compile_s=0.2)
    batch = _batch([{"a": 1}, {"a": 2}, {"a": 3}])
    ans = answer_batch(batch, [ok, broken, ok], slots=1)
    assert [t.index for t in ans.answers] == [10] and ans.duration_s == pytest.approx(1.2)
    result = ans.result
    assert not result.done and result.error == "simulator: no source" and result.exit_code == 20
