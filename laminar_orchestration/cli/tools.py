"""`laminar demo` (a whole cluster on one machine) and `laminar report` (the ownership timeline)."""

from __future__ import annotations

import argparse
from pathlib import Path

from laminar_orchestration.cli.base import Command, check_node_id, open_ledger
from laminar_orchestration.cli.output import Output
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.errors import InvalidArgument

__all__ = ["Demo", "Policies", "Report"]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class Demo(Command):
    name = "demo"
    help = "run a local cluster with load and the Dagster UI until Ctrl-C"
    # The demo makes a fresh store of its own unless --store names one.
    shared_store = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.description = (
            "run a local cluster (nodes as processes, a steady load, Dagster webserver and daemon) "
            "on a fresh store under ./.laminar/demo-<timestamp>, printing status tables until Ctrl-C"
        )
        parser.add_argument(
            "--store",
            dest="demo_store",
            default=None,
            metavar="URL",
            help="store URL (default: a fresh local store under ./.laminar/demo-<timestamp>; s3://bucket/prefix works)",
        )
        parser.add_argument("--partitions", type=int, default=4, help="partitions of a new cluster (default 4)")
        parser.add_argument("--nodes", type=int, default=3, help="worker node processes (default 3)")
        parser.add_argument(
            "--rate", type=float, default=200.0, help="events per second the producer appends (default 200)"
        )
        parser.add_argument("--keys", type=int, default=100, help="distinct keys of the load (default 100)")
        parser.add_argument(
            "--port", type=int, default=3000, help="port of the Dagster webserver on 127.0.0.1 (default 3000)"
        )
        parser.add_argument("--duration", type=float, help="once the cluster is up, run this many seconds, then stop")
        parser.add_argument("--interval", type=float, default=5.0, help="seconds between status tables (default 5)")
        parser.add_argument(
            "--heartbeat-timeout",
            type=float,
            default=NodeConfig.model_fields["heartbeat_timeout_s"].default,
            help="seconds without heartbeat = dead (default %(default)s)",
        )
        parser.add_argument("--spark-master", default="local[1]", help="Spark master of each node (default local[1])")
        parser.add_argument("--no-dagster", action="store_true", help="run without the Dagster webserver and daemon")
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=9100,
            help="Prometheus /metrics: the control plane on this port, node N on this port + N (default 9100; 0: none)",
        )

    def run(self, args: argparse.Namespace, out: Output) -> int:
        from laminar_orchestration.ops.demo import DemoOptions, run_demo

        # The flags named as the options take their values as given; the others are translated.
        same = ("partitions", "nodes", "rate", "keys", "port", "duration", "interval", "spark_master")
        options = DemoOptions(
            store=args.demo_store,
            heartbeat_timeout_s=args.heartbeat_timeout,
            dagster=not args.no_dagster,
            base_dir=Path.cwd(),
            metrics_port=args.metrics_port or None,
            **{name: getattr(args, name) for name in same},
        )
        options.check()
        return run_demo(options)


class Report(Command):
    name = "report"
    help = "write the ownership timeline (epochs, migrations, failovers) as a self-contained HTML file"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--out",
            default=None,
            help="output file (default: laminar-report.html beside a local store's directory, "
            "else ./.laminar/laminar-report.html)",
        )
        parser.add_argument("--no-png", action="store_true", help="no PNG even when matplotlib is importable")

    def run(self, args: argparse.Namespace, out: Output) -> int:
        from laminar_orchestration.ops.report import default_report_path, write_report
        from laminar_orchestration.ops.timeline import FAILOVER, MIGRATION

        ledger = open_ledger(args)
        path = Path(args.out) if args.out else default_report_path(ledger.store)
        written = write_report(ledger, path, png=not args.no_png)
        report = written.report
        print(
            f"{_plural(len(report.partitions), 'partition')}, {_plural(len(report.spans), 'epoch')} "
            f"({_plural(report.count(MIGRATION), 'migration')}, {_plural(report.count(FAILOVER), 'failover')})"
        )
        print(f"wrote {written.html}")
        if written.png is not None:
            print(f"wrote {written.png}")
        elif not args.no_png:
            print(f"no PNG: {written.png_skipped}")
        return 0


class Policies(Command):
    name = "policies"
    help = "print each role's least-privilege S3 policy and the bucket policy, for an operator to apply"
    json_output = True
    # Renders documents for a bucket; reads no store.
    shared_store = False

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--bucket", required=True, help="the S3 bucket of the store")
        parser.add_argument("--prefix", default="", help="the store's key prefix in the bucket (s3://BUCKET/PREFIX)")
        parser.add_argument(
            "--nodes",
            default="1",
            metavar="IDS",
            help="comma-separated node ids: one node role each, writing only its own node record (default 1)",
        )

    def run(self, args: argparse.Namespace, out: Output) -> int:
        from laminar_orchestration.protocol.capabilities import storage_policies

        if not args.bucket.strip():
            raise InvalidArgument("--bucket", "give the bucket's name")
        nodes: list[int] = []
        for part in str(args.nodes).split(","):
            try:
                node = int(part)
            except ValueError:
                raise InvalidArgument("--nodes", f"{part!r} is not a node id") from None
            check_node_id("--nodes", node)
            nodes.append(node)
        out.policies(storage_policies(args.bucket.strip(), args.prefix, nodes=sorted(set(nodes))))
        return 0
