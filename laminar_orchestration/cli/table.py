"""`laminar table ...`: the committed output as a Delta Lake table (sync, rebuild, maintain, status, audit)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from laminar_orchestration.cli.base import Command, parse_partition_list
from laminar_orchestration.cli.output import Output
from laminar_orchestration.errors import EXIT_ISSUES_FOUND
from laminar_orchestration.store import open_store

__all__ = ["Table"]

TABLE_HELP = "table URI: a path or s3://bucket/prefix (default: $LAMINAR_TABLE_URI, else <store>/tables/output)"

_SUBCOMMANDS = {
    "sync": "append every committed batch not yet in the table (one Delta commit)",
    "rebuild": "recreate the table from the manifest chains (after a lost or corrupted log)",
    "maintain": "compact small files, checkpoint the log, vacuum old files",
    "status": "the table's location, version, rows and per-partition lag",
    "audit": "check that the table holds every committed batch exactly once, and nothing else",
}


class Table(Command):
    name = "table"
    help = "the committed output as an exactly-once Delta Lake table"
    json_output = True
    subcommands = _SUBCOMMANDS

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--table", default=None, help=TABLE_HELP)

    def add_subcommand_arguments(self, subcommand: str, parser: argparse.ArgumentParser) -> None:
        if subcommand in ("sync", "status"):
            parser.add_argument("--partitions", default="", metavar="P[,P...]", help="only these (default: all)")
        if subcommand == "rebuild":
            parser.add_argument("--force", action="store_true", help="also replace a table of another cluster")
        if subcommand == "maintain":
            parser.add_argument(
                "--retention-hours", type=int, default=168, help="vacuum files unreferenced for longer (168)"
            )

    def run(self, args: argparse.Namespace, out: Output) -> int:
        from laminar_orchestration.protocol.ledger import Ledger
        from laminar_orchestration.table import (
            TableCommitter,
            audit_table,
            compact_and_checkpoint,
            rebuild_table,
            table_location,
            table_status,
        )

        store = open_store(args.store, create=False)
        location = table_location(store, args.table)
        chosen = parse_partition_list("--partitions", getattr(args, "partitions", "") or "")
        command = args.table_command
        data: dict[str, Any]
        code = 0
        if command == "sync":
            result = TableCommitter(store, location).sync(chosen or tuple(Ledger(store).partitions()))
            data, text = result.to_json(), result.summary_lines()
        elif command == "rebuild":
            removed, result = rebuild_table(store, location, force=args.force)
            data = {"removed_objects": removed, **result.to_json()}
            text = [
                f"removed {removed} objects of the old log (old data files: `laminar table maintain` vacuums them)",
                *result.summary_lines(),
            ]
        elif command == "maintain":
            report = compact_and_checkpoint(location, retention_hours=args.retention_hours)
            data, text = report.to_json(), report.summary_lines()
        elif command == "status":
            status = table_status(store, location, partitions=chosen or None)
            data, text = status.to_json(), status.summary_lines()
        else:
            audit = audit_table(store, location)
            data, text = audit.to_json(), audit.summary_lines()
            code = 0 if audit.ok else EXIT_ISSUES_FOUND
        if args.json:
            json.dump(data, sys.stdout, indent=2, default=str)
            sys.stdout.write("\n")
        else:
            for line in text:
                print(line)
        return code
