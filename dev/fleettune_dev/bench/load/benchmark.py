"""Running `fleettune bench load`: the local control plane, the fleet simulator and the
operator (a subprocess, optionally sampled by py-spy), the runs applied and waited for,
and the `Report` filled from what was observed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fleettune import GROUP, PLURAL, VERSION
from fleettune.labels import RUN_LABEL, TARGET_LABEL
from fleettune_dev.bench.load.analysis import (
    SATURATED,
    CpuSampler,
    audit,
    gpu_utilisation,
    idle_breakdown,
    job_controller_delays,
    pod_waits,
    quantile,
    quantiles,
    reaction_latencies,
    reactions_by_load,
    steady_window,
    utilisation,
)
from fleettune_dev.bench.load.observe import Observer, apiserver_requests, job_trials, proc_cpu_seconds, proc_peak_rss
from fleettune_dev.bench.load.report import Report
from fleettune_dev.bench.load.workload import MANAGED, NAMESPACE, bench_fleet, run_manifests


def _scrape_suggestion_seconds(port: int) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return float("nan")
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "fleettune_suggestion_duration_seconds_sum")


def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the operator (``pip install py-spy``); None when it is not installed."""
    import shutil

    # Installed into the benchmark's own environment, whose bin/ need not be on PATH.
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if exe is None:
        return None
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--output", str(out), "--format", "raw",
                             "--rate", "20", "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


# Frames that tell where the operator's time goes (its own code, kopf, the API client, JSON).
_PROFILE_KEEP = ("fleettune/", "kopf/", "kubernetes/", "urllib3/", "json/", "ssl.py", "gzip", "pydantic")
_PROFILE_SKIP = ("fleettune/cli.py", "fleettune/controller/run.py", "(fleettune/controller/handlers.py")


def summarise_profile(path: Path, top: int = 15) -> list[str]:
    """Inclusive share of samples per interesting function, from py-spy's collapsed stacks."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        for frame in set(stack.split(";")):
            if any(k in frame for k in _PROFILE_KEEP) and not any(k in frame for k in _PROFILE_SKIP):
                inclusive[frame] += n
    if not total:
        return []
    return [f"{n / total:6.1%}  {frame[:110]}" for frame, n in inclusive.most_common(top)]


def run_benchmark(args: argparse.Namespace) -> Report:
    from kubernetes import client

    from fleettune.crd import render
    from fleettune.labels import RESULTS_OF_LABEL
    from fleettune.store import DATA_KEY, decode_shard
    from fleettune_dev.cluster import LocalCluster
    from fleettune_dev.cluster.network import free_port
    from fleettune_dev.sim import FleetSimulator, PodStartup

    fleet = bench_fleet(args.gpus, args.pools, args.gpus_per_node)
    per_pool = args.gpus // args.pools
    parallelism = args.parallelism or max(1, math.ceil(args.oversubscribe * per_pool / args.runs))
    docs = run_manifests(fleet, args.runs, args.trials, parallelism, args.strategy, args.trials_per_pod)
    budget = docs[0]["spec"]["budget"]["trialsPerTarget"]
    report = Report(gpus=args.gpus, pools=args.pools, runs=args.runs, budget_per_target=budget,
                    parallelism=parallelism, strategy=args.strategy, trial_seconds=args.trial_seconds,
                    trials_per_pod=args.trials_per_pod, pod_startup=args.pod_startup)
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="fleettune-bench-"))
    say = (lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)) if not args.quiet else (lambda m: None)
    cluster = LocalCluster(state / "cluster", fleet, die_with_parent=True)
    operator: subprocess.Popen[bytes] | None = None
    sim: FleetSimulator | None = None
    observer: Observer | None = None
    profiler: subprocess.Popen[bytes] | None = None
    cpu = CpuSampler()
    try:
        cluster.up(progress=say)
        crd = state / "crd.yaml"
        crd.write_text(render())
        cluster.kubectl("apply", "--server-side", "-f", str(crd))
        cluster.wait_established(f"{PLURAL}.{GROUP}")
        api = cluster.api_client()
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})

        # Trial time is all "compile": the recorded kernel times add milliseconds on top (a
        # batch Pod compiles ahead, as many at once as the job's compile pool takes).
        sim = FleetSimulator(cluster.kubeconfig, fleet, time_scale=1.0, compile_s=args.trial_seconds,
                             startup=PodStartup() if args.pod_startup else None).start()
        metrics_port = free_port()
        log = open(state / "operator.log", "wb")  # noqa: SIM115 (closed with the process)
        operator = subprocess.Popen(
            [sys.executable, "-m", "fleettune.cli", "operator", "-n", NAMESPACE, "--metrics-port",
             str(metrics_port), "--metrics-address", "127.0.0.1"],
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        observer = Observer(cluster.api_client)
        observer.start()
        time.sleep(3)  # the operator's start-up (imports) is not part of the run
        req0 = apiserver_requests(api)
        cpu0, harness0 = proc_cpu_seconds(operator.pid), time.process_time()
        pids = cluster.component_pids()
        cp0 = {name: proc_cpu_seconds(pid) for name, pid in pids.items()}
        cpu.start()
        t0 = time.time()
        for doc in docs:
            custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, doc)
        say(f"{len(docs)} TuningRuns applied: {budget} trials per pool each, parallelism {parallelism}")
        if args.profile:
            profiler = start_profiler(operator.pid, Path(args.profile))
            if profiler is None:
                report.notes.append("--profile: py-spy is not installed (pip install py-spy)")

        largest = 0
        deadline = time.monotonic() + args.timeout
        last_print = 0.0
        while time.monotonic() < deadline:
            if operator.poll() is not None:
                report.notes.append(f"the operator exited with {operator.returncode}; see {state / 'operator.log'}")
                break
            items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
            largest = max([largest, *(len(json.dumps(i, separators=(",", ":"))) for i in items)])
            phases = Counter((i.get("status") or {}).get("phase", "Pending") for i in items)
            done = sum((i.get("status") or {}).get("trials", {}).get("completed", 0) for i in items)
            if time.monotonic() - last_print > 15:
                say(f"{time.time() - t0:5.0f} s: {done} trials, runs {dict(phases)}, "
                    f"operator RSS {proc_peak_rss(operator.pid) / 2**20:.0f} MiB")
                last_print = time.monotonic()
            if phases.get("Succeeded", 0) + phases.get("Failed", 0) == len(docs):
                report.finished = True
                break
            time.sleep(2)
        wall = time.time() - t0
        cpu.stop.set()  # the run is over: what follows is the bench's own accounting
        report.wall_s = wall
        if operator.poll() is None:
            report.operator_cpu_s = proc_cpu_seconds(operator.pid) - cpu0
            report.operator_peak_rss_bytes = proc_peak_rss(operator.pid)
        report.operator_cpu_share = report.operator_cpu_s / wall if wall else 0.0
        report.harness_cpu_s = time.process_time() - harness0
        req = apiserver_requests(api)
        delta = Counter({k: req[k] - req0.get(k, 0.0) for k in req})
        report.api_requests_per_s = sum(delta.values()) / wall
        report.api_top = [(f"{verb} {res}", n / wall) for (verb, res), n in delta.most_common()]
        report.suggestion_s = _scrape_suggestion_seconds(metrics_port)

        items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
        report.largest_run_bytes = max([largest, *(len(json.dumps(i, separators=(",", ":"))) for i in items)])
        records: dict[str, list[Any]] = {}
        for doc in docs:
            name = doc["metadata"]["name"]
            cms = core.list_namespaced_config_map(NAMESPACE, label_selector=f"{RESULTS_OF_LABEL}={name}").items
            records[name] = [r for cm in cms for r in decode_shard((cm.binary_data or {})[DATA_KEY])]
        all_records = [r for recs in records.values() for r in recs]
        report.evaluations = len(all_records)
        if all_records:
            report.api_requests_per_evaluation = sum(delta.values()) / len(all_records)
        report.trials_recorded = sum(r.is_observation for r in all_records)
        report.infra_failures = sum(not r.is_observation for r in all_records)
        report.trials_per_minute = 60 * len(all_records) / wall if wall else 0.0
        in_flight: set[tuple[str, str, int]] = set()
        if not report.finished:
            # Cut short: trials still in a Job are not lost, and budgets cannot be checked.
            jobs = json.loads(client.BatchV1Api(api).list_namespaced_job(
                NAMESPACE, label_selector=MANAGED, _preload_content=False).data)["items"]
            in_flight = {(j["metadata"]["labels"][RUN_LABEL], j["metadata"]["labels"][TARGET_LABEL], index)
                         for j in jobs for index in job_trials(j)}
            report.notes.append(f"cut short by --timeout with {len(in_flight)} trials in flight: "
                                "the audit checks losses and duplicates, not budgets")
        report.audit = audit(records, list(sim.answered), budget, fleet.pool_names(), in_flight)

        lat = reaction_latencies(observer.pods, observer.jobs)
        every = [r for rs in lat.values() for r in rs]
        seconds = [r.seconds for r in every]
        report.latency_p50_s, report.latency_p99_s = quantile(seconds, 0.5), quantile(seconds, 0.99)
        report.latency_by_pool = {p: quantiles([r.seconds for r in rs]) for p, rs in lat.items()}
        report.latency_by_load = {k: quantiles(xs) for k, xs in reactions_by_load(every, cpu).items()}
        report.machine_busy = cpu.busy(t0, t0 + wall)
        report.machine_saturated = (sum(min(b, t0 + wall) - max(a, t0) for a, b, share in cpu.samples
                                        if share >= SATURATED and b > t0) / wall if wall else float("nan"))
        report.component_cpu_s = {name: proc_cpu_seconds(pid) - cp0.get(name, 0.0)
                                  for name, pid in pids.items() if Path(f"/proc/{pid}").exists()}
        report.utilisation, report.utilisation_steady, _ = utilisation(observer.pods, args.gpus)
        report.gpu_busy_s, report.gpu_allocated_s, report.gpu_utilisation = gpu_utilisation(observer.pods)
        capacity = {pool.name: pool.nodes * pool.gpu.per_node for pool in fleet.pools}
        report.idle_steady = idle_breakdown(observer.pods, capacity, steady_window(observer.pods))
        jc, report.ahead_of_job_controller = job_controller_delays(observer)
        report.job_controller_p50_s, report.job_controller_p99_s = quantile(jc, 0.5), quantile(jc, 0.99)
        report.job_controller_n = len(jc)
        scheduling, starting, report.unschedulable_pods = pod_waits(observer.pods)
        report.scheduling_p50_s, report.scheduling_p99_s = quantile(scheduling, 0.5), quantile(scheduling, 0.99)
        report.starting_p50_s, report.starting_p99_s = quantile(starting, 0.5), quantile(starting, 0.99)
        if observer.errors:
            report.notes.append(f"watch errors: {observer.errors[-1]}")
        if sim.errors:
            report.notes.append(f"simulator errors ({len(sim.errors)}): {sim.errors[-1]}")
        report.notes.append(f"operator log: {state / 'operator.log'}")
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            try:
                profiler.wait(timeout=60)
            except subprocess.TimeoutExpired:
                profiler.kill()
            if Path(args.profile).is_file():
                report.profile = summarise_profile(Path(args.profile))
                report.notes.append(f"py-spy profile (collapsed stacks): {args.profile}")
        api.close()
        return report
    finally:
        cpu.stop.set()
        if observer is not None:
            observer.stop.set()
        if profiler is not None and profiler.poll() is None:
            profiler.kill()
        if operator is not None and operator.poll() is None:
            os.killpg(operator.pid, signal.SIGTERM)
            try:
                operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(operator.pid, signal.SIGKILL)
                operator.wait(timeout=10)
        if sim is not None:
            sim.stop()
        if not args.keep:
            cluster.down()
        else:
            print(f"[bench] kept: KUBECONFIG={cluster.kubeconfig}  (stop: fleettune cluster down "
                  f"--state-dir {cluster.state_dir})", file=sys.stderr)
