from fleettune.results import TrialRecord
from fleettune.rollup import TOP_K, run_status, target_status
from fleettune.store import decode_shard, encode_shard
from fleettune_job.protocol import Outcome


def _rec(index, outcome=Outcome.OK, objective=None, key=None):
    return TrialRecord(
        target="a100", index=index, config={"x": index}, key=key or str(index), outcome=outcome, objective=objective
    )


RECORDS = [
    _rec(0, objective=2.0, key="default"),
    *[_rec(i, objective=1.0 + i / 100) for i in range(1, 20)],
    _rec(20, Outcome.COMPILE_ERROR),
    _rec(21, Outcome.INFRA_ERROR),
    _rec(22, objective=1.0 + 1 / 100, key="1"),  # a repeat of config "1" is listed once
]


def test_shard_round_trip():
    assert decode_shard(encode_shard(RECORDS)) == RECORDS


def test_a_record_of_an_earlier_version_keeps_its_round():
    # Earlier versions wrote the pool's tuning round under the key "generation".
    import base64
    import gzip
    import json

    from fleettune.store import record_id

    new = _rec(3, objective=1.5).model_copy(update={"round": 2})
    old_line = json.loads(new.model_dump_json(exclude_none=True))
    old_line["generation"] = old_line.pop("round")
    old_shard = base64.b64encode(gzip.compress((json.dumps(old_line) + "\n").encode())).decode()
    [old] = decode_shard(old_shard)
    assert old.round == 2 and old == new and record_id(old) == record_id(new) == (2, "a100", 3)
    # Written again, a record has the new key only.
    [line] = gzip.decompress(base64.b64decode(encode_shard([old]))).decode().splitlines()
    assert json.loads(line)["round"] == 2 and "generation" not in json.loads(line)


def test_target_status_counts_ranks_and_computes_speedup():
    st = target_status(name="a100", phase="Running", budget=40, records=RECORDS, running=3, default_key="default")
    assert (st.completed, st.valid, st.invalid, st.infra_failed, st.running) == (22, 21, 1, 1, 3)
    assert st.best.trial == 1 and st.best.objective_ms == 1.01
    assert len(st.top) == TOP_K and len({t.config for t in st.top}) == TOP_K
    assert st.top[0].config == " ".join(f"{k}={v}" for k, v in st.best.config.items())
    assert st.default_ms == 2.0 and st.speedup == round(2.0 / 1.01, 3)


def test_run_status_stays_small_whatever_the_number_of_trials():
    many = [_rec(i, objective=1.0 + i) for i in range(10_000)]
    st = target_status(name="a100", phase="Running", budget=10_000, records=many, running=0)
    status = run_status(previous=None, generation=3, phase="Running", targets=[st] * 16, results=None,
                        reason="Tuning", message="")
    assert len(status.model_dump_json()) < 64 * 1024
    assert status.progress == f"{16 * 10_000}/{16 * 10_000}"
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert ready.status == "False" and ready.observed_generation == 3


def test_conditions_keep_transition_time_until_status_changes():
    st = target_status(name="a", phase="Running", budget=1, records=[], running=1)
    first = run_status(previous=None, generation=1, phase="Running", targets=[st], results=None, reason="T", message="")
    again = run_status(
        previous=first, generation=1, phase="Running", targets=[st], results=None, reason="T", message=""
    )
    assert first.conditions == again.conditions
    done = run_status(previous=first, generation=1, phase="Succeeded", targets=[st], results=None, reason="Tuned",
                      message="")
    ready = next(c for c in done.conditions if c.type == "Ready")
    assert ready.status == "True" and done.completed_at is not None


def test_every_fingerprint_field_fits_the_status_schema():
    from fleettune.fingerprint import GpuFingerprint

    fp = GpuFingerprint(
        product="Jetson-AGX-Orin", compute_capability="8.7", driver_version="540.4.0", cuda_runtime_version="12.6",
        mig_profile="1g.5gb", sharing="mps", replicas=2, arch="arm64", l4t_version="36.4.0", family="ampere",
        memory_mib=32768, source="fleettune",
    )
    st = target_status(name="orin", phase="Running", budget=1, records=[], running=0, tuned_for=fp.to_status())
    assert GpuFingerprint.from_status(st.tuned_for.dump()) == fp


def test_status_stays_small_at_the_spec_limits_on_sizes_and_predictions():
    import json

    from fleettune.api import MAX_PREDICTIONS, MAX_TUNED_TARGETS
    from fleettune.controller.reporting import BASIS_MAX

    config = {f"parameter_{i}": 1024 + i for i in range(10)}
    records = [TrialRecord(target="t", index=i, config=config, key=str(i), outcome=Outcome.OK, objective=1.5 + i)
               for i in range(2000)]
    tuned_for = {"product": "NVIDIA-A100-SXM4-80GB", "computeCapability": "8.0", "driverVersion": "550.54.15",
                 "cudaRuntimeVersion": "12.4", "arch": "amd64", "source": "gfd", "memoryMib": 81920}
    targets = [
        target_status(name=f"pool-with-long-name{i:02d}.4096x4096x4096", phase="Running", budget=2000,
                      records=records, running=8, device="NVIDIA A100-SXM4-80GB", space_size=10**6,
                      default_key="0", message="m" * 200, tuning_round=3, tuned_for=tuned_for, top_k=1)
        .model_copy(update={"problem_size": [4096, 4096, 4096], "target": f"pool-with-long-name{i:02d}"})
        for i in range(MAX_TUNED_TARGETS)
    ]
    predictions = [{"target": "pool-with-long-name00", "problemSize": [8192, 8192, 8192], "config": config,
                    "predictedMs": 12.345678, "basis": "b" * BASIS_MAX}] * MAX_PREDICTIONS
    status = run_status(previous=None, generation=1, phase="Running", targets=targets,
                        results={"configMapPrefix": "r" * 60, "shards": 4, "records": 2000 * MAX_TUNED_TARGETS},
                        reason="Tuning", message="x" * 500, extra={"predictions": predictions})
    size = len(json.dumps(status.model_dump(by_alias=True, exclude_none=True, mode="json")))
    assert all(t.best is not None and not t.top for t in status.targets)
    assert size < 48 * 1024, size


def test_a_write_lost_to_a_connection_error_leaves_the_records_to_be_offered_again():
    from types import SimpleNamespace

    import pytest
    from urllib3.exceptions import MaxRetryError

    from fleettune.store import ResultsStore

    class FlakyCore:  # the apiserver goes away for one write (the store's own logic is under test)
        def __init__(self):
            self.fail, self.written = True, []

        def create_namespaced_config_map(self, namespace, body, _preload_content=True):
            if self.fail:
                self.fail = False
                raise MaxRetryError(None, "/api/v1/namespaces/ns/configmaps", "connection refused")
            self.written.append(body)
            return SimpleNamespace(data=b'{"metadata": {"resourceVersion": "1"}}')

    core = FlakyCore()
    store = ResultsStore(core, "ns", "run", "uid")
    rec = _rec(0, objective=1.0)
    with pytest.raises(MaxRetryError):
        store.append([rec])
    assert (rec.round, rec.target, rec.index) not in store and store.records == []
    assert store.append([rec]) == [rec]
    assert (rec.round, rec.target, rec.index) in store and len(core.written) == 1


def _conditions(phase, reason, message="", generation=1, previous=None):
    st = target_status(name="a", phase="Running", budget=4, records=[], running=1)
    status = run_status(previous=previous, generation=generation, phase=phase, targets=[st], results=None,
                        reason=reason, message=message)
    return status, {c.type: c for c in status.conditions}


def test_kstatus_reads_reconciling_while_pending_or_running_and_stalled_once_failed():
    expected = {  # phase: (Ready, Reconciling, Stalled)
        "Pending": ("False", "True", "False"),
        "Running": ("False", "True", "False"),
        "Succeeded": ("True", "False", "False"),
        "Failed": ("False", "False", "True"),
    }
    for phase, (ready, reconciling, stalled) in expected.items():
        _, c = _conditions(phase, f"Why{phase}", f"because {phase}", generation=4)
        assert (c["Ready"].status, c["Reconciling"].status, c["Stalled"].status) == (ready, reconciling, stalled), phase
        assert all(cond.observed_generation == 4 for cond in c.values()), phase
        if reconciling == "True":  # what kstatus and Flux show while it waits
            assert (c["Reconciling"].reason, c["Reconciling"].message) == (f"Why{phase}", f"because {phase}")
        else:
            assert c["Reconciling"].reason == "Finished"
        if stalled == "True":  # Ready's reason and message: why it failed
            assert (c["Stalled"].reason, c["Stalled"].message) == (c["Ready"].reason, c["Ready"].message)
            assert c["Stalled"].reason == "WhyFailed"
        else:
            assert (c["Stalled"].reason, c["Stalled"].message) == ("AsExpected", "")


def test_a_failed_run_that_is_fixed_stops_being_stalled_and_keeps_one_condition_per_type():
    failed, c = _conditions("Failed", "InvalidSpec", "spec.targets[0]: bad", generation=1)
    stalled_at = c["Stalled"].last_transition_time
    again, c = _conditions("Failed", "InvalidSpec", "spec.targets[0]: bad", generation=1, previous=failed)
    assert c["Stalled"].last_transition_time == stalled_at
    fixed, c = _conditions("Running", "Tuning", generation=2, previous=again)
    assert c["Stalled"].status == "False" and c["Reconciling"].status == "True"
    assert all(cond.observed_generation == 2 for cond in c.values()) and fixed.observed_generation == 2
    types = [cond.type for cond in fixed.conditions]
    assert len(types) == len(set(types))  # status.conditions is a map keyed by type in the CRD
