"""The data plane's commands: run a node, produce events, query the state, verify, sweep."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING

from laminar_orchestration.cli.base import (
    Command,
    check_at_least,
    check_node_id,
    check_partition,
    open_ledger,
    parse_partition_list,
)
from laminar_orchestration.cli.output import Output
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.errors import InvalidArgument

if TYPE_CHECKING:
    import pyarrow as pa

    from laminar_orchestration.protocol.segments import AppendResult
    from laminar_orchestration.protocol.source import SourceLog

_NODE_DEFAULTS = NodeConfig.model_fields

__all__ = ["NodeRun", "Produce", "Query", "Sweep", "Verify"]


class NodeRun(Command):
    name = "node"
    help = "run a worker node"
    # `laminar node run`: a group of one today, room for node subcommands later.
    subcommands = {"run": "run a long-lived worker node (Ctrl-C / SIGTERM drains it)"}

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--node-id", type=int, required=True, help="this node's id (>= 1)")
        parser.add_argument(
            "--spark-master",
            default=_NODE_DEFAULTS["spark_master"].default,
            help="Spark master URL (default %(default)s)",
        )
        parser.add_argument("--spark-ui", action="store_true", help="enable the Spark UI (off by default)")
        parser.add_argument(
            "--heartbeat-timeout",
            type=float,
            default=_NODE_DEFAULTS["heartbeat_timeout_s"].default,
            help="seconds without heartbeat = dead (default %(default)s)",
        )
        parser.add_argument(
            "--refresh-interval",
            type=float,
            default=_NODE_DEFAULTS["refresh_interval_s"].default,
            help="seconds between cluster-epoch reads and a committing partition's successor probes",
        )
        parser.add_argument(
            "--table-sync-interval",
            type=float,
            default=_NODE_DEFAULTS["table_sync_interval_s"].default,
            help="seconds between the node's appends to the output table (one Delta commit each)",
        )
        parser.add_argument(
            "--heartbeat-interval",
            type=float,
            default=_NODE_DEFAULTS["heartbeat_interval_s"].default,
            help="seconds between heartbeats (each a billed PUT)",
        )
        parser.add_argument(
            "--batch-max-events",
            type=int,
            default=_NODE_DEFAULTS["batch_max_events"].default,
            help="events per micro-batch at most",
        )
        parser.add_argument(
            "--checkpoint-every-batches",
            type=int,
            default=_NODE_DEFAULTS["checkpoint_every_batches"].default,
            help="state snapshot every K batches",
        )
        parser.add_argument(
            "--checkpoint-every-s",
            type=float,
            default=_NODE_DEFAULTS["checkpoint_every_s"].default,
            help="state snapshot every T seconds",
        )
        parser.add_argument(
            "--spark-warm-up-batches",
            type=int,
            default=_NODE_DEFAULTS["spark_warm_up_batches"].default,
            help="synthetic batches Spark runs at start while the node has no real batch (0: none)",
        )
        parser.add_argument(
            "--log-level",
            default="info",
            choices=("debug", "info", "warning"),
            help="node log level (debug: where each batch's time went)",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=_NODE_DEFAULTS["metrics_port"].default,
            metavar="PORT",
            help="serve Prometheus metrics at http://HOST:PORT/metrics (default: none; 0: any free port)",
        )
        parser.add_argument(
            "--metrics-host",
            default=_NODE_DEFAULTS["metrics_host"].default,
            help="address the metrics are served on (default %(default)s)",
        )
        parser.add_argument(
            "--leave-deadline",
            type=float,
            default=20.0,
            metavar="SECONDS",
            help="at SIGTERM, move the node's partitions to live nodes for at most this long, then release "
            "the rest (a second SIGTERM ends it at once; keep it below the pod's grace period; default 20)",
        )
        parser.add_argument(
            "--no-rejoin",
            action="store_true",
            help="do not take this node's share of the partitions back when it starts (leave it to a rebalance)",
        )
        parser.add_argument(
            "--processor",
            metavar="REF",
            help="the processor to run (package.module:attribute or an installed name); default: the cluster's "
            "recorded one, which any other must match",
        )
        parser.add_argument(
            "--standby-for",
            default="",
            metavar="P[,P...]",
            help="keep a warm standby copy of these partitions while another node owns them (failovers prefer it)",
        )

    def run(self, args: argparse.Namespace, out: Output) -> int:
        from laminar_orchestration.control.leave import LeaveSettings, attach
        from laminar_orchestration.ops.node_builder import build_node

        check_node_id("--node-id", args.node_id)
        positive = {
            "--heartbeat-timeout": args.heartbeat_timeout,
            "--refresh-interval": args.refresh_interval,
            "--table-sync-interval": args.table_sync_interval,
            "--heartbeat-interval": args.heartbeat_interval,
            "--checkpoint-every-s": args.checkpoint_every_s,
            "--leave-deadline": args.leave_deadline,
        }
        for flag, value in positive.items():
            if not value > 0:
                raise InvalidArgument(flag, f"{value} must be > 0")
        check_at_least("--batch-max-events", args.batch_max_events, 1)
        check_at_least("--checkpoint-every-batches", args.checkpoint_every_batches, 1)
        check_at_least("--spark-warm-up-batches", args.spark_warm_up_batches, 0)
        if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
            raise InvalidArgument("--metrics-port", f"{args.metrics_port} must be in 0..65535")
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        # Only our own loggers follow --log-level: py4j's debug output would drown the node's.
        for name in ("laminar", "laminar_orchestration"):
            logging.getLogger(name).setLevel(args.log_level.upper())
        # py4j logs every closed Spark gateway connection at INFO: library noise in the node's log.
        logging.getLogger("py4j").setLevel(logging.WARNING)
        # The flags named as the config's fields take their values as given; the others are translated.
        same = (
            "node_id",
            "spark_master",
            "spark_ui",
            "batch_max_events",
            "checkpoint_every_batches",
            "checkpoint_every_s",
            "spark_warm_up_batches",
            "processor",
        )
        config = NodeConfig(
            store_url=args.store,
            heartbeat_timeout_s=args.heartbeat_timeout,
            heartbeat_interval_s=args.heartbeat_interval,
            refresh_interval_s=args.refresh_interval,
            table_sync_interval_s=args.table_sync_interval,
            standby_for=parse_partition_list("--standby-for", args.standby_for),
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            **{name: getattr(args, name) for name in same},
        )
        node = build_node(config)
        # SIGTERM moves the partitions away before the node stops; at start it takes its share back.
        attach(node, LeaveSettings(deadline_s=args.leave_deadline, rejoin=not args.no_rejoin))
        node.run()
        return 0


class Produce(Command):
    name = "produce"
    help = "append events to the partitioned source log"
    json_output = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--from-file",
            help="events file (- for stdin): JSON lines, CSV or Parquet of the stream's schema (the default schema: "
            'JSONL of {"partition", "key", "value"[, "ts"]})',
        )
        parser.add_argument(
            "--format", choices=["jsonl", "csv", "parquet"], help="the file's format (default: its suffix)"
        )
        parser.add_argument("--count", type=int, help="generate N events instead")
        parser.add_argument("--keys", type=int, default=100, help="distinct keys for --count (default 100)")
        parser.add_argument("--seed", type=int, default=0, help="random seed for --count")
        parser.add_argument("--segment-events", type=int, default=100_000, help="events per log segment at most")
        parser.add_argument(
            "--soft-lag", type=int, default=5_000_000, help="warn when a partition lags this many events"
        )
        parser.add_argument(
            "--hard-lag", type=int, default=20_000_000, help="refuse to append past this lag (0: no limit)"
        )

    def run(self, args: argparse.Namespace, out: Output) -> int:
        from laminar_orchestration.dataplane.backpressure import admit, partition_backpressure
        from laminar_orchestration.processing.schema import DEFAULT_STREAM_SCHEMA
        from laminar_orchestration.protocol.event_files import file_format, read_events
        from laminar_orchestration.protocol.producers import generate_events
        from laminar_orchestration.protocol.source import SourceLog
        from laminar_orchestration.protocol.stream import read_stream_record

        if args.from_file is None and args.count is None:
            raise InvalidArgument("produce", "give --from-file FILE or --count N")
        check_at_least("--count", args.count, 0)
        check_at_least("--keys", args.keys, 1)
        check_at_least("--segment-events", args.segment_events, 1)
        check_at_least("--soft-lag", args.soft_lag, 1)
        check_at_least("--hard-lag", args.hard_lag, 0)
        ledger = open_ledger(args)
        partitions = ledger.cluster().partitions
        record = read_stream_record(ledger.store)
        schema = record.stream_schema if record is not None else DEFAULT_STREAM_SCHEMA
        if args.count is not None and schema != DEFAULT_STREAM_SCHEMA:
            raise InvalidArgument("--count", "generates the default schema's events; this stream has its own")
        log = SourceLog(ledger.store, partitions=partitions, segment_events=args.segment_events, schema=schema)
        # Backpressure before anything is appended: a rejected produce appends nothing.
        if args.hard_lag > 0:
            soft = min(args.soft_lag, args.hard_lag)
            states = [
                partition_backpressure(ledger.store, p, soft_threshold=soft, hard_threshold=args.hard_lag)
                for p in range(partitions)
            ]
            for warning in admit(states):
                print(
                    f"laminar produce: warning: a partition is {warning.pending_lag} events behind "
                    f"(soft limit {warning.soft_threshold})",
                    file=sys.stderr,
                )
        counts: dict[int, int] = {}
        # The default stream's JSON lines keep their own reader (a "partition" on every line, "ts"
        # optional); every other file is read whole against the schema, then routed by key.
        legacy = log.schema == DEFAULT_STREAM_SCHEMA and (args.format or "jsonl") == "jsonl"
        if args.from_file and legacy and not args.from_file.endswith((".csv", ".parquet")):
            for p, res in _produce_jsonl(args.from_file, log).items():
                counts[p] = res.events
        elif args.from_file:
            events = read_events(args.from_file, log.schema, file_format(args.from_file, args.format))
            _check_partitions(args.from_file, events, partitions)
            for p, res in log.append_routed(events).items():
                counts[p] = res.events
        else:
            appended = log.append_many(generate_events(args.count, args.keys, args.seed, partitions))
            counts = {p: res.events for p, res in appended.items()}
        out.produced(counts, {p: log.end_offset(p) for p in counts})
        return 0


def _check_partitions(path: str, events: pa.Table, partitions: int) -> None:
    """A file's ``partition`` column, if it has one, names partitions of the cluster (checked before
    anything is appended)."""
    from laminar_orchestration.processing.schema import EventsDoNotMatchSchema
    from laminar_orchestration.protocol.event_files import EventFileError
    from laminar_orchestration.protocol.source_events import partition_numbers

    if "partition" in events.column_names:
        try:
            partition_numbers(events["partition"], partitions)
        except EventsDoNotMatchSchema as exc:
            at = f"event {exc.row + 1}, " if exc.row is not None else ""
            raise EventFileError("stdin" if path == "-" else path, f"{at}column 'partition'", exc.reason) from None


def _produce_jsonl(path: str, log: SourceLog) -> dict[int, AppendResult]:
    """The default stream's JSON lines from `path` (``-``: stdin, spooled to a file first: every line
    is checked before anything is appended)."""
    from laminar_orchestration.protocol.producers import produce_from_jsonl
    from laminar_orchestration.protocol.source_errors import BadInputLine

    if path != "-":
        return produce_from_jsonl(path, log)
    with tempfile.NamedTemporaryFile(prefix="laminar-produce-", suffix=".jsonl") as spool:
        shutil.copyfileobj(sys.stdin.buffer, spool)
        spool.flush()
        try:
            return produce_from_jsonl(spool.name, log)
        except BadInputLine as exc:
            raise BadInputLine("stdin", exc.line_number, exc.reason) from None


class Query(Command):
    name = "query"
    help = "print the committed state of a partition and its committed offset"
    json_output = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--partition", type=int, required=True)
        parser.add_argument(
            "--key", help="look up one key (reads the newest deltas first, the snapshot only if needed)"
        )

    def run(self, args: argparse.Namespace, out: Output) -> int:
        from laminar_orchestration.dataplane.folding import resolve_logic
        from laminar_orchestration.dataplane.restore import committed_state, lookup

        ledger = open_ledger(args)
        check_partition(ledger, "--partition", args.partition)
        # The recorded processor's state columns: a windowed stream's state is not the default's.
        schema = resolve_logic(ledger.store, 0, reference=None, given=None).processor.codec.schema
        if args.key is not None:
            values, offset = lookup(ledger.store, args.partition, args.key, state_schema=schema)
            out.key_lookup(args.partition, offset, args.key, values)
        else:
            state, offset = committed_state(ledger.store, args.partition, state_schema=schema)
            out.state(args.partition, offset, state)
        return 0


class Verify(Command):
    name = "verify"
    help = "audit the store: every event committed exactly once; exit 1 on loss or duplication"
    json_output = True

    def run(self, args: argparse.Namespace, out: Output) -> int:
        from laminar_orchestration.cli.output import verified
        from laminar_orchestration.ops.verify import audit_store
        from laminar_orchestration.table import audit_table

        store = open_ledger(args).store
        audits = audit_store(store)
        # The output table too, once a node created it: every committed batch in it exactly once.
        table = audit_table(store)
        out.audit(audits, table if table.exists else None)
        return 0 if verified(audits, table) else 1


class Sweep(Command):
    name = "sweep"
    help = "anti-entropy: delete output/checkpoint objects no manifest names and none ever can"
    json_output = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="report, delete nothing")
        parser.add_argument(
            "--grace-s",
            type=float,
            default=3600.0,
            help="minimum age in seconds (>= 0) of an unreferenced object of a sealed epoch before it is "
            "deleted (default 3600); objects of an epoch that may still publish are never deleted",
        )

    def run(self, args: argparse.Namespace, out: Output) -> int:
        from laminar_orchestration.ops.sweep import sweep

        out.swept(sweep(open_ledger(args).store, grace_s=args.grace_s, dry_run=args.dry_run), args.dry_run)
        return 0
