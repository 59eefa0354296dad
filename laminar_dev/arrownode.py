"""A worker node process without Spark: ``python -m laminar_dev.arrownode --store URL --node-id N``.

The real node runtime (`laminar_orchestration.dataplane.node.Node`) with batches aggregated by pyarrow
(`laminar_dev.chaos.ArrowNode`): a node process that starts in a second, for tests whose subject
is everything around the aggregate (here: each process running with its own credentials).
"""

from __future__ import annotations

import argparse
import logging

from laminar_orchestration.control.leave import LeaveSettings, attach
from laminar_orchestration.dataplane.config import NodeConfig
from laminar_orchestration.store import open_store
from laminar_orchestration.table import TableCommitter


def main(argv: list[str] | None = None) -> None:
    """Run one node until SIGTERM/SIGINT."""
    from laminar_dev.chaos.arrow import ArrowNode

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--node-id", type=int, required=True)
    parser.add_argument("--heartbeat-timeout", type=float, default=3.0)
    parser.add_argument("--heartbeat-interval", type=float, default=None, help="seconds (0.5 unless --node-defaults)")
    # Its tests run it against one S3 server answering one request at a time that checks every request's
    # credentials: at the node's defaults (a reconcile every 50 ms, a migration poll every 10 ms)
    # three nodes keep that server busy, and every request queues.
    parser.add_argument("--poll-interval", type=float, default=0.25, help="reconcile, idle and standby polls (seconds)")
    parser.add_argument(
        "--node-defaults",
        action="store_true",
        help="run with `laminar node run`'s timing and its output table (what a user runs): --poll-interval is "
        "ignored, the other flags still apply",
    )
    parser.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port")
    parser.add_argument(
        "--table-sync-interval", type=float, default=None, help="keep the output table, syncing it this often"
    )
    parser.add_argument(
        "--leave-deadline",
        type=float,
        default=None,
        help="leave gracefully at SIGTERM (moves first, then release), within this many seconds; "
        "and take the node's share back at start",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    timing: dict[str, float | int] = {}
    if not args.node_defaults:
        timing = {
            "heartbeat_interval_s": 0.5,
            "refresh_interval_s": 0.5,
            "checkpoint_every_batches": 3,
            "reconcile_interval_s": args.poll_interval,
            "idle_poll_s": args.poll_interval,
            "standby_poll_s": args.poll_interval,
            "migration_poll_s": args.poll_interval / 5,
        }
    if args.heartbeat_interval is not None:
        timing["heartbeat_interval_s"] = args.heartbeat_interval
    if args.table_sync_interval:
        timing["table_sync_interval_s"] = args.table_sync_interval
    config = NodeConfig(
        store_url=args.store,
        node_id=args.node_id,
        heartbeat_timeout_s=args.heartbeat_timeout,
        metrics_port=args.metrics_port,
        **timing,  # type: ignore[arg-type]
    )
    # As `laminar node run` runs, a node at the defaults keeps the output table.
    keeps_table = args.node_defaults or args.table_sync_interval
    table = TableCommitter(open_store(args.store), node=args.node_id) if keeps_table else None
    node = ArrowNode(config, output_table=table)
    if args.leave_deadline is not None:
        attach(node, LeaveSettings(deadline_s=args.leave_deadline))
    node.run()


if __name__ == "__main__":
    main()
