"""The laminar side of the windowed benchmark: real node processes (`laminar node run`, through the
local cluster launcher) on a cluster whose stream record names the windowed-count processor; the
same backlog, steady load, planned moves and killed nodes as the Spark side, the state (`laminar
query`'s keys and the latest snapshot's bytes) sampled every 30 s, and the output read back from
the committed manifests.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from laminar_dev.localcluster import HEARTBEAT_TIMEOUT_S, Cluster, wait_until
from laminar_orchestration.dataplane.checkpoint import download_table
from laminar_orchestration.dataplane.restore import committed_state
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.processing.registry import load_processor
from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA, StreamSchema
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore

from .common import REPO_ROOT, progress
from .migration_cluster import (
    DRIVER_MEMORY,
    NODE_ARGS,
    SPARK_MASTER,
    WARM_UP_ENDED,
    History,
    log_tails,
    pick_target,
    ts,
    wait_standby,
)
from .migration_runs import failover_run, graceful_run, revive
from .windows_load import BACKLOG_TICKS, EVENTS_PER_TICK, ScheduledLoad, as_default_schema, backlog
from .windows_spark import Outage, Plan, Sampler, SideRun, tree_cpu_s

#: The example as shipped, and the same windows over the default schema (`windows_processor`).
EXAMPLE_PROCESSOR = "examples.windowed_counts:processor"
DEFAULT_SCHEMA_PROCESSOR = "benchmarks.windows_processor:processor"
STANDBY_ARGS = ("--standby-for", "0")
#: What a node logs once its Spark session is up and its first warm-up batches ran.
SPARK_READY = "spark ready in"
WARM_UP_WAIT_S = 60.0


def source_takes_schemas() -> bool:
    """Whether the source log appends tables of a stream's own schema (``SourceLog(..., schema=...)``)."""
    return "schema" in inspect.signature(SourceLog.__init__).parameters


def stream_setup(clicks_mode: bool) -> tuple[StreamSchema, str]:
    if clicks_mode:
        return StreamSchema.from_file(REPO_ROOT / "examples" / "clicks.yaml"), EXAMPLE_PROCESSOR
    return DEFAULT_STREAM_SCHEMA, DEFAULT_SCHEMA_PROCESSOR


def init_with_stream(ledger: Ledger, schema: StreamSchema, reference: str) -> tuple[Any, str]:
    """Initialise a one-partition cluster whose stream record names `schema` and `reference`, as
    ``laminar init --schema --processor`` does. The processor bound to the schema, and how."""
    ledger.init_cluster(1, schema=schema, processor=reference)
    return load_processor(reference).bind(schema), "Ledger.init_cluster(schema=, processor=), as `laminar init`"


def appender(cluster: Cluster, schema: StreamSchema, clicks_mode: bool) -> Any:
    """How the benchmark appends a tick of page views to partition 0."""
    if not clicks_mode:
        return lambda t: cluster.source.append(0, as_default_schema(t))
    log = SourceLog(cluster.store, partitions=1, segment_events=20_000, schema=schema)  # type: ignore[call-arg, unused-ignore]
    fields = schema.input_schema

    def append(t: pa.Table) -> None:
        n = t.num_rows
        columns = {
            "user": t["user"],
            "page": t["page"],
            "amount": pc.cast(pc.round(t["amount"], 2), fields.field("amount").type),
            "tags": pa.nulls(n, fields.field("tags").type),
            "at": t["at"],
        }
        log.append(0, pa.table({f.name: columns[f.name] for f in fields}))

    return append


def settle(cluster: Cluster, node: int) -> None:
    """Wait until `node`'s Spark is up, then for its background warm-up to end, at most `WARM_UP_WAIT_S`
    (on a busy machine it runs for minutes; the Spark side's workers run one warm-up query)."""
    wait_until(lambda: SPARK_READY in cluster.nodes[node].log(), 600, f"node {node}'s Spark", 0.5)
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: WARM_UP_ENDED in cluster.nodes[node].log(), WARM_UP_WAIT_S, "warm-up", 0.5)


def read_outputs(store: ObjectStore) -> tuple[dict[int, float], list[tuple[str, int, int]]]:
    """Per window end (ms): the commit time of the manifest holding its last row; every (key, start, views)."""
    reader = ReadStore(store)
    emitted: dict[int, float] = {}
    rows: list[tuple[str, int, int]] = []
    for m in History(store, 0).since(1):
        for ref in m.outputs:
            out = download_table(reader, ref)
            if not out.num_rows:
                continue
            starts = out["window_start"].cast(pa.timestamp("ms", "UTC")).cast(pa.int64()).to_pylist()
            ends = out["window_end"].cast(pa.timestamp("ms", "UTC")).cast(pa.int64()).to_pylist()
            for key, start, end, views in zip(out["key"].to_pylist(), starts, ends, out["views"].to_pylist(),
                                              strict=True):  # fmt: skip
                emitted[end] = max(emitted.get(end, 0.0), ts(m))
                rows.append((str(key), start, int(views)))
    return emitted, rows


def run_laminar(plan: Plan, root: Path, clicks_mode: bool) -> SideRun:
    """laminar: the same run as `run_spark`, on two nodes that keep a warm standby of partition 0."""
    res = SideRun()
    cluster = Cluster(
        (root / "store").as_uri(),
        root,
        partitions=1,
        env={"LAMINAR_SPARK_DRIVER_MEMORY": DRIVER_MEMORY},
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        spark_master=SPARK_MASTER,
        node_args=NODE_ARGS,
        per_node_args={1: STANDBY_ARGS, 2: STANDBY_ARGS},
        init=False,
    )
    schema, reference = stream_setup(clicks_mode)
    bound, how = init_with_stream(cluster.ledger, schema, reference)
    res.notes.append(f"laminar: stream recorded by {how}: processor {reference!r}, schema columns "
                     f"{[c.name for c in schema.columns]}")  # fmt: skip
    append = appender(cluster, schema, clicks_mode)
    load = ScheduledLoad(append)
    sampler: Sampler | None = None
    t0 = time.perf_counter()
    progress("laminar: starting nodes 1 and 2 (both --standby-for 0)")
    try:
        for n in (1, 2):
            cluster.start_node(n)
        cluster.wait_alive(1, 2, timeout=300)
        cluster.place({0: 1})
        for n in (1, 2):
            settle(cluster, n)
        res.notes.append(f"laminar: 2 nodes up and warmed up in {time.perf_counter() - t0:.1f} s")
        hist = History(cluster.store, 0)
        progress(f"laminar: catch-up of a {BACKLOG_TICKS}-tick backlog")
        first = backlog()
        t_backlog = time.time()
        append(first)
        end = cluster.source.end_offset(0)
        wait_until(lambda: cluster.committed(0) >= end, 900, "laminar to commit the backlog", 0.05)
        done = next(m for m in hist.since(1) if m.source_offset >= end)
        res.catch_up_events, res.catch_up_s = first.num_rows, ts(done) - t_backlog
        progress(f"    {first.num_rows:,} events in {res.catch_up_s:.2f} s")

        manifests = ManifestReader(cluster.store)

        def sample() -> tuple[int, int]:
            state, _ = committed_state(cluster.store, 0, state_schema=bound.codec.schema)
            current = manifests.current(PartitionId(0))
            snap = current.manifest.snapshot if current else None
            return state.num_rows, snap.size if snap is not None else 0

        sampler = Sampler(sample, plan.sample_s)
        run_s = plan.minutes * 60.0
        start_offset = cluster.committed(0)
        load.start()
        t_start = time.time()
        sampler.start()
        steady_end = t_start + run_s / 2
        pids = [node.proc.pid for node in cluster.nodes.values()]
        cpu0 = tree_cpu_s(pids)
        progress(f"laminar: steady load for {run_s / 2:.0f} s (no disturbance)")
        time.sleep(max(0.0, steady_end - time.time()))
        res.cpu_s = tree_cpu_s(pids) - cpu0
        res.steady_events_done = cluster.committed(0) - start_offset
        res.steady_window = (t_start, steady_end)
        res.steady_s = steady_end - t_start
        res.steady_events_in = sum(1 for at in load.appended_at.values() if at <= steady_end) * EVENTS_PER_TICK
        for i in range(plan.moves):
            target = pick_target(cluster, {cluster.owner(0)})
            wait_standby(cluster, target, 0, 300)
            progress(f"  laminar move {i + 1}/{plan.moves}: {cluster.owner(0)} -> {target}")
            m = graceful_run(cluster, hist, target, warm_commits=3, timeout=120)
            res.moves.append(Outage("move", str(m.from_node), str(m.to_node), m.unavailable_s,
                                    m.launch_to_first_data_s))  # fmt: skip
            progress(
                f"    unavailable {m.unavailable_s:.2f} s, launch -> first commit {m.launch_to_first_data_s:.2f} s"
            )
            time.sleep(plan.settle_s)
        for i in range(plan.kills):
            wait_standby(cluster, pick_target(cluster, {cluster.owner(0)}), 0, 300)
            progress(f"  laminar kill {i + 1}/{plan.kills}: node {cluster.owner(0)}")
            k = failover_run(cluster, hist, warm_commits=3, timeout=120)
            res.kills.append(Outage("kill", str(k.victim), str(k.to_node), k.unavailable_s, k.recovery_s,
                                    k.detection_s))  # fmt: skip
            progress(f"    detection {k.detection_s:.2f} s, recovery {k.recovery_s:.2f} s; restarting node {k.victim}")
            revive(cluster, k.victim, settle=False)
            settle(cluster, k.victim)
            time.sleep(plan.settle_s)
        time.sleep(max(0.0, t_start + run_s - time.time()))
        sampler.stop()
        load.stop()
        res.appended_at = dict(load.appended_at)
        end = cluster.source.end_offset(0)
        wait_until(lambda: cluster.committed(0) >= end, 300, "laminar to commit the load", 0.2)
        res.states = sampler.samples
        res.notes += [f"laminar sampler: {e}" for e in sampler.errors[:3]]
        current = manifests.current(PartitionId(0))
        if current is not None and current.manifest.event_time is not None:
            res.late_events = current.manifest.event_time.late_events
        res.window_emitted, res.rows = read_outputs(cluster.store)
    except BaseException:
        progress("laminar FAILED; node log tails:\n" + log_tails(cluster))
        raise
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        if load.is_alive():
            with contextlib.suppress(Exception):
                load.stop()
        cluster.shutdown()
    return res
