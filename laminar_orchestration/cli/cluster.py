"""`laminar init` and `laminar status`: create the cluster, look at it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from laminar_orchestration.cli.base import Command, open_ledger
from laminar_orchestration.cli.output import Output
from laminar_orchestration.control.snapshot import snapshot_cluster
from laminar_orchestration.control.watch import summarize_cluster
from laminar_orchestration.errors import InvalidArgument
from laminar_orchestration.identity import MAX_PARTITIONS
from laminar_orchestration.protocol.ledger import Ledger

if TYPE_CHECKING:
    from laminar_orchestration.processing.schema import StreamSchema

__all__ = ["DETAIL_UP_TO", "Init", "Status"]

#: Up to this many partitions `status` reads every partition's records (about six reads each, in
#: parallel); beyond, it summarizes from the node records and assignments unless asked for --detail.
DETAIL_UP_TO = 64


class Init(Command):
    name = "init"
    help = "create the cluster record and N unassigned partitions"
    json_output = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--partitions", type=int, required=True, help="number of partitions (>= 1)")
        parser.add_argument("--force", action="store_true", help="re-initialize an existing cluster (epochs are kept)")
        parser.add_argument(
            "--output-table",
            metavar="URI",
            default=None,
            help="where the output table is: a path or s3://bucket/prefix, recorded in the store for every node "
            "and command (default: <store>/tables/output; with --force, moves it)",
        )
        parser.add_argument(
            "--schema",
            metavar="FILE",
            help="the stream's schema (JSON or YAML: columns, key, event_time); default: key, value, ts",
        )
        parser.add_argument(
            "--processor",
            metavar="REF",
            help="the processor every node runs: package.module:attribute or an installed name "
            "(default: keyed_aggregation)",
        )

    def run(self, args: argparse.Namespace, out: Output) -> int:
        if not 1 <= args.partitions <= MAX_PARTITIONS:
            raise InvalidArgument("--partitions", f"{args.partitions} is not within 1..{MAX_PARTITIONS}")
        if args.output_table is not None and not args.output_table.strip():
            raise InvalidArgument("--output-table", "empty: give a path, file:///path or s3://bucket/prefix")
        # The stream's schema and processor are loaded and checked before anything is written (pyarrow
        # and the processor's module load only when asked for).
        from laminar_orchestration.protocol.stream import check_stream, read_stream_record, stream_record

        schema = _schema_of(args.schema)
        stream = None if args.schema is None and args.processor is None else stream_record(schema, args.processor)
        ledger = open_ledger(args, create=True)
        if stream is not None:  # another stream recorded: refused before the table's location is written
            check_stream(ledger.store, stream, cluster_exists=ledger.is_initialized())
        table = None
        if args.output_table is not None:
            table = self._record_table(ledger, args.output_table, force=args.force)
        cluster = ledger.init_cluster(args.partitions, force=args.force, schema=schema, processor=args.processor)
        out.initialized(cluster, ledger.store.url, read_stream_record(ledger.store))
        if table is not None and not args.json:
            print(f"output table {table}")
        return 0

    @staticmethod
    def _record_table(ledger: Ledger, uri: str, *, force: bool) -> str | None:
        """Record where the output table is, before the cluster record (an interrupted init re-run completes
        it); None when the cluster exists and no --force: `init_cluster` refuses, nothing is written."""
        from laminar_orchestration.table import InvalidTableUri, record_table_location

        exists = ledger.is_initialized()
        if exists and not force:
            return None
        try:
            location = record_table_location(
                ledger.store, uri, cluster_id=ledger.cluster().cluster_id if exists else None, replace=True
            )
        except InvalidTableUri as exc:
            raise InvalidArgument("--output-table", f"{uri!r}: {exc.reason}") from None
        return location.describe()


def _schema_of(schema_file: str | None) -> StreamSchema | None:
    """The schema `--schema` names, read and checked (None without the flag)."""
    from laminar_orchestration.processing.schema import InvalidSchema, StreamSchema

    if schema_file is None:
        return None
    try:
        return StreamSchema.from_file(schema_file)
    except InvalidSchema as exc:
        raise InvalidArgument("--schema", str(exc)) from None


class Status(Command):
    name = "status"
    help = "partitions (epoch, owner, status), nodes (heartbeat, liveness), cluster epoch"
    json_output = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        how = parser.add_mutually_exclusive_group()
        how.add_argument(
            "--detail",
            action="store_true",
            help="read every partition's ledger records, manifest and log end (the default up to "
            f"{DETAIL_UP_TO} partitions)",
        )
        how.add_argument(
            "--summary",
            action="store_true",
            help="each partition as its owner's heartbeat and the assignments show it: a few reads a node, "
            f"whatever the partitions (the default beyond {DETAIL_UP_TO} partitions)",
        )
        parser.add_argument(
            "--partition",
            type=int,
            action="append",
            metavar="P",
            help="only partition P, read in detail from its ledger records (repeat for more)",
        )

    def run(self, args: argparse.Namespace, out: Output) -> int:
        from laminar_orchestration.table import table_status

        ledger = open_ledger(args)
        if args.partition:
            known = ledger.cluster().partitions
            for p in args.partition:
                if not 0 <= p < known:
                    raise InvalidArgument("--partition", f"{p} is not within 0..{known - 1}")
            snapshot = snapshot_cluster(ledger, partitions=args.partition)
        elif args.detail or (not args.summary and ledger.cluster().partitions <= DETAIL_UP_TO):
            snapshot = snapshot_cluster(ledger)
        else:
            snapshot = summarize_cluster(ledger)
        # The table's lag walks each partition's chain from the table's position: only with the detail.
        shown = None if snapshot.detail else [p.partition for p in snapshot.partitions if args.partition]
        from laminar_orchestration.protocol.stream import read_stream_record

        stream = read_stream_record(ledger.store)
        out.status(snapshot, table_status(ledger.store, ledger=ledger, partitions=shown), stream)
        return 0
