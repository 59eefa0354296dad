"""`laminar init` and `laminar status`: create the cluster, look at it."""

from __future__ import annotations

import argparse

from laminar_orchestration.cli.base import Command, open_ledger
from laminar_orchestration.cli.output import Output
from laminar_orchestration.control.snapshot import snapshot_cluster
from laminar_orchestration.errors import InvalidArgument
from laminar_orchestration.identity import MAX_PARTITIONS

__all__ = ["Init", "Status"]


class Init(Command):
    name = "init"
    help = "create the cluster record and N unassigned partitions"
    json_output = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--partitions", type=int, required=True, help="number of partitions (>= 1)")
        parser.add_argument("--force", action="store_true", help="re-initialize an existing cluster (epochs are kept)")

    def run(self, args: argparse.Namespace, out: Output) -> int:
        if not 1 <= args.partitions <= MAX_PARTITIONS:
            raise InvalidArgument("--partitions", f"{args.partitions} is not within 1..{MAX_PARTITIONS}")
        ledger = open_ledger(args, create=True)
        out.initialized(ledger.init_cluster(args.partitions, force=args.force), ledger.store.url)
        return 0


class Status(Command):
    name = "status"
    help = "partitions (epoch, owner, status), nodes (heartbeat, liveness), cluster epoch"
    json_output = True

    def run(self, args: argparse.Namespace, out: Output) -> int:
        from laminar_orchestration.table import table_status

        ledger = open_ledger(args)
        snapshot = snapshot_cluster(ledger)
        out.status(snapshot, table_status(ledger.store, ledger=ledger))
        return 0
