"""`laminar init` and `laminar status`: create the cluster, look at it."""

from __future__ import annotations

import argparse

from ..errors import InvalidArgument
from ..identity import MAX_PARTITIONS
from ..ownership import snapshot_cluster
from .base import Command, open_ledger
from .output import Output

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
        out.status(snapshot_cluster(open_ledger(args)))
        return 0
