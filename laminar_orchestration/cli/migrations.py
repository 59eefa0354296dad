"""The control plane's commands: migrate one partition, fail a node over, rebalance."""

from __future__ import annotations

import argparse

from laminar_orchestration.cli.base import (
    Command,
    add_migration_limits,
    check_node_id,
    check_partition,
    migration_config,
    open_ledger,
    parse_weights,
)
from laminar_orchestration.cli.output import Output
from laminar_orchestration.control.coordinator import MigrationCoordinator
from laminar_orchestration.control.moves import run_migration
from laminar_orchestration.control.operations import (
    NodeStillAlive,
    fail_over_node,
    plan_rebalance,
    run_rebalance,
)
from laminar_orchestration.control.placing import prepare_rebalance
from laminar_orchestration.errors import InvalidArgument
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.tasks import PhaseReport

__all__ = ["Failover", "Migrate", "Rebalance"]


class Migrate(Command):
    name = "migrate"
    help = "move a partition to another node (graceful), printing each phase"
    json_output = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--partition", type=int, required=True, help="the partition to move")
        parser.add_argument("--to", type=int, help="the live node that takes it over (required unless --cancel)")
        parser.add_argument(
            "--cancel",
            action="store_true",
            help="cancel the partition's migration in flight (before its new owner seeks); exit 1 if there is none",
        )
        add_migration_limits(parser)

    def run(self, args: argparse.Namespace, out: Output) -> int:
        ledger = open_ledger(args)
        # Checked first: a wrong partition or node must be named as such, not as a failed phase.
        check_partition(ledger, "--partition", args.partition)
        check_node_id("--to", args.to)
        coordinator = MigrationCoordinator(ledger, migration_config(args))
        if args.cancel:
            if args.to is not None:
                raise InvalidArgument("--cancel", "give --to NODE (move) or --cancel, not both")
            # NothingToCancel / CancelRefused are ledger errors: one line on stderr, exit 1.
            out.cancelled(coordinator.cancel_current(PartitionId(args.partition)))
            return 0
        if args.to is None:
            raise InvalidArgument("--to", "give the node to move the partition to, or --cancel")
        reports: list[PhaseReport] = []

        def on_phase(report: PhaseReport) -> None:
            reports.append(report)
            out.phase(report)

        task = run_migration(coordinator, args.partition, args.to, on_phase=on_phase)
        out.migrated(task, reports)
        return 0


class Failover(Command):
    name = "failover"
    help = "forced migration of every partition of a dead node to live nodes (least load)"
    json_output = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--node", type=int, required=True, help="the dead node")
        parser.add_argument("--to", type=int, help="the node to move them all to (default: least-loaded live nodes)")
        parser.add_argument("--force", action="store_true", help="fence the node even though it still heartbeats")
        add_migration_limits(parser, concurrency="max_concurrent_failovers")

    def run(self, args: argparse.Namespace, out: Output) -> int:
        check_node_id("--node", args.node)
        check_node_id("--to", args.to)
        if args.to is not None and args.to == args.node:
            raise InvalidArgument("--to", f"node {args.to} is the node being failed over")
        ledger = open_ledger(args)
        config = migration_config(args)
        # Nodes that registered since the last reconcile join the member set first, as the
        # reconcile (and `rebalance`) admits them: a node that just started may take the partitions.
        ledger.members.admit_nodes()
        try:
            plan, outcomes = fail_over_node(
                ledger,
                args.node,
                config,
                to_node=args.to,
                force=args.force,
                on_planned=out.failover_planned,
                on_done=out.move_done,
            )
        except NodeStillAlive:
            raise InvalidArgument(
                "--node",
                f"node {args.node} is alive: move its partitions with `laminar migrate` (graceful), "
                "or pass --force to fence it anyway",
            ) from None
        out.failed_over(plan, outcomes)
        return 0 if all(o.ok for o in outcomes) else 1


class Rebalance(Command):
    name = "rebalance"
    help = "balance partitions over the live nodes with the fewest moves"
    json_output = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="print the plan only")
        parser.add_argument(
            "--weight",
            action="append",
            default=[],
            metavar="NODE=WEIGHT",
            help="relative capacity of a node (repeatable; default 1)",
        )
        add_migration_limits(parser, concurrency="max_concurrent_migrations")

    def run(self, args: argparse.Namespace, out: Output) -> int:
        config = migration_config(args)
        weights = parse_weights(args.weight)
        ledger = open_ledger(args)
        if args.dry_run:
            plan = plan_rebalance(ledger, weights)
        else:
            # Every node's assignment rebuilt from the desired states first (a repair: a writer that
            # died between a state and its assignments, or a store that predates them), and released
            # partitions of a restarted node granted back (only the control plane grants): one read of
            # each partition's records for both and for the plan.
            reads = prepare_rebalance(MigrationCoordinator(ledger, config))
            plan = plan_rebalance(ledger, weights, owners=reads.owners, moving=reads.moving)
        out.rebalance_planned(plan, args.dry_run)
        outcomes = []
        if not args.dry_run:
            reason = f"laminar rebalance: {len(plan.moves)} move(s)"
            outcomes = run_rebalance(ledger, plan, config, reason=reason, on_done=out.move_done)
        out.rebalanced(plan, args.dry_run, outcomes)
        return 0 if all(o.ok for o in outcomes) else 1
