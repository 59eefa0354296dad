"""The `laminar` command line: one subcommand per operation, `--json` where output is data.

Every subcommand takes `--store URL` (default: ``LAMINAR_STORE``, else a local
store under the working directory). Errors are reported as one line,
``laminar: error: <what is wrong>``, with an exit code by the error's kind
(`laminar_orchestration.errors.EXIT_CODES`): 2 invalid input, 3 unavailable,
4 conflict, 5 fenced, 6 corrupt data, 7 not found, 1 any other failure (and
`verify` finding losses or duplicates).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from .errors import InvalidArgument, LaminarError, exit_code
from .identity import MAX_PARTITIONS, UNASSIGNED
from .ledger import Ledger
from .store import default_store_url, open_store

Handler = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, Handler] = {}


def command(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _COMMANDS[name] = fn
        return fn

    return register


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=_json_default))


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _ledger(args: argparse.Namespace, *, create: bool = False) -> Ledger:
    return Ledger(open_store(args.store, create=create))


# --- argument checks: before anything is read or written ----------------------------


def _check_at_least(flag: str, value: float | None, low: float) -> None:
    if value is not None and value < low:
        raise InvalidArgument(flag, f"{value} is below the minimum of {low}")


def _check_node_id(flag: str, node: int | None) -> None:
    if node is None:
        return
    if node == UNASSIGNED:
        raise InvalidArgument(flag, "node 0 is the 'unassigned' sentinel, not a node (node ids are >= 1)")
    if node < 1:
        raise InvalidArgument(flag, f"{node} is not a node id (node ids are >= 1)")


def _check_partition(ledger: Ledger, flag: str, partition: int) -> None:
    count = ledger.cluster().partitions
    if not 0 <= partition < count:
        raise InvalidArgument(flag, f"partition {partition} does not exist (the cluster has partitions 0..{count - 1})")


# --- init / status -----------------------------------------------------------


@command("init")
def cmd_init(args: argparse.Namespace) -> int:
    if not 1 <= args.partitions <= MAX_PARTITIONS:
        raise InvalidArgument("--partitions", f"{args.partitions} is not within 1..{MAX_PARTITIONS}")
    ledger = _ledger(args, create=True)
    record = ledger.init_cluster(args.partitions, force=args.force)
    if args.json:
        _print_json(record.model_dump(mode="json"))
    else:
        print(f"initialized cluster {record.cluster_id} with {record.partitions} partitions in {ledger.store.url}")
    return 0


def status_report(ledger: Ledger) -> dict[str, Any]:
    """The data `laminar status` prints: partitions, nodes, cluster epoch."""
    from .assignment import warm_copies
    from .manifest import ManifestReader
    from .source import SourceLog

    cluster = ledger.cluster()
    membership = ledger.membership()
    partitions = []
    views = ledger.nodes()
    # What the owner reports about its worker: consecutive failures and the last reason.
    progress = {(v.record.node, p): pr for v in views for p, pr in v.record.partitions.items()}
    standbys = warm_copies(views)
    manifests = ManifestReader(ledger.store)
    source = SourceLog(ledger.store)
    for pid, own in ledger.ownerships(ledger.partitions()).items():
        if own is None:
            continue
        reported = progress.get((int(own.owner), int(pid)))
        current = manifests.current(pid)
        committed = current.manifest.source_offset if current else 0
        log_end = source.end_offset(int(pid))
        partitions.append(
            {
                "partition": int(pid),
                "epoch": own.epoch,
                "owner": int(own.owner),
                "status": own.status.value,
                "head_lagged": own.head_lagged,
                "committed_offset": committed,
                "log_end": log_end,
                "lag": max(0, log_end - committed),
                "standbys": {str(n): lag for n, lag in sorted(standbys.get(int(pid), {}).items())},
                "failures": reported.consecutive_failures if reported else 0,
                "last_failure": reported.last_failure if reported else None,
            }
        )
    nodes = [
        {
            "node": v.record.node,
            "generation": v.record.generation,
            "status": v.record.status.value,
            "alive": v.alive,
            "last_heartbeat": v.record.heartbeat_at.isoformat(),
            "heartbeat_age_s": round(v.heartbeat_age_s, 3),
            "host": v.record.host,
            "pid": v.record.pid,
        }
        for v in views
    ]
    return {
        "store": ledger.store.url,
        "cluster_id": cluster.cluster_id,
        "cluster_epoch": membership.cluster_epoch,
        "partitions": partitions,
        "nodes": nodes,
    }


@command("status")
def cmd_status(args: argparse.Namespace) -> int:
    report = status_report(_ledger(args))
    if args.json:
        _print_json(report)
        return 0
    print(f"store {report['store']}  cluster {report['cluster_id']}  cluster epoch {report['cluster_epoch']}")
    print(
        f"{'PARTITION':>9}  {'EPOCH':>5}  {'OWNER':>5}  {'COMMITTED':>12}  {'LOG END':>12}  {'LAG':>10}  "
        f"{'STANDBYS':<12}  {'FAILURES':>8}  STATUS"
    )
    for p in report["partitions"]:
        owner = p["owner"] or "-"
        failing = f"  ({p['last_failure']})" if p["failures"] else ""
        standbys = ",".join(f"{n}(lag {lag})" for n, lag in p["standbys"].items()) or "-"
        print(
            f"{p['partition']:>9}  {p['epoch']:>5}  {owner:>5}  {p['committed_offset']:>12}  {p['log_end']:>12}  "
            f"{p['lag']:>10}  {standbys:<12}  {p['failures']:>8}  {p['status']}{failing}"
        )
    print(f"{'NODE':>9}  {'GEN':>5}  {'ALIVE':>5}  {'HEARTBEAT AGE':>13}  STATUS")
    for n in report["nodes"]:
        alive = "yes" if n["alive"] else "NO"
        print(f"{n['node']:>9}  {n['generation']:>5}  {alive:>5}  {n['heartbeat_age_s']:>12.1f}s  {n['status']}")
    return 0


# --- data plane: node, produce, query, verify -----------------------------------------


@command("node")
def cmd_node(args: argparse.Namespace) -> int:
    import logging

    from .runtime import NodeConfig, run_node

    _check_node_id("--node-id", args.node_id)
    positive = {
        "--heartbeat-timeout": args.heartbeat_timeout,
        "--refresh-interval": args.refresh_interval,
        "--checkpoint-every-s": args.checkpoint_every_s,
    }
    for flag, value in positive.items():
        if not value > 0:
            raise InvalidArgument(flag, f"{value} must be > 0")
    _check_at_least("--batch-max-events", args.batch_max_events, 1)
    _check_at_least("--checkpoint-every-batches", args.checkpoint_every_batches, 1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = NodeConfig(
        store_url=args.store,
        node_id=args.node_id,
        spark_master=args.spark_master,
        spark_ui=args.spark_ui,
        heartbeat_timeout_s=args.heartbeat_timeout,
        heartbeat_interval_s=min(1.0, args.heartbeat_timeout / 4),
        refresh_interval_s=args.refresh_interval,
        batch_max_events=args.batch_max_events,
        checkpoint_every_batches=args.checkpoint_every_batches,
        checkpoint_every_s=args.checkpoint_every_s,
        standby_for=_partition_list("--standby-for", args.standby_for),
    )
    run_node(config)
    return 0


@command("produce")
def cmd_produce(args: argparse.Namespace) -> int:
    from .backpressure import admit, partition_backpressure
    from .source import SourceLog, generate_events, produce_from_jsonl

    if args.from_file is None and args.count is None:
        raise InvalidArgument("produce", "give --from-file FILE or --count N")
    _check_at_least("--count", args.count, 0)
    _check_at_least("--keys", args.keys, 1)
    _check_at_least("--segment-events", args.segment_events, 1)
    _check_at_least("--soft-lag", args.soft_lag, 1)
    _check_at_least("--hard-lag", args.hard_lag, 0)
    ledger = _ledger(args)
    partitions = ledger.cluster().partitions
    log = SourceLog(ledger.store, partitions=partitions, segment_events=args.segment_events)
    counts: dict[int, int] = {}
    # Backpressure before anything is appended: a rejected produce appends nothing.
    if args.hard_lag > 0:
        states = [
            partition_backpressure(ledger.store, p, soft_threshold=min(args.soft_lag, args.hard_lag),
                                   hard_threshold=args.hard_lag)
            for p in range(partitions)
        ]  # fmt: skip
        for warning in admit(states):
            print(
                f"laminar produce: warning: a partition is {warning.pending_lag} events behind "
                f"(soft limit {warning.soft_threshold})",
                file=sys.stderr,
            )
    if args.from_file:
        for p, res in produce_from_jsonl(args.from_file, log).items():
            counts[p] = res.events
    else:
        tables = generate_events(args.count, args.keys, args.seed, partitions)
        for p, table in tables.items():
            counts[p] = log.append(p, table).events
    if args.json:
        _print_json({"appended": {str(p): n for p, n in sorted(counts.items())}})
    else:
        for p, n in sorted(counts.items()):
            print(f"partition {p}: appended {n} events (log end {log.end_offset(p)})")
    return 0


@command("query")
def cmd_query(args: argparse.Namespace) -> int:
    from .replica import committed_state, lookup

    ledger = _ledger(args)
    _check_partition(ledger, "--partition", args.partition)
    if args.key is not None:
        values, offset = lookup(ledger.store, args.partition, args.key)
        if args.json:
            _print_json({"partition": args.partition, "committed_offset": offset, "key": args.key, "values": values})
        elif values is None:
            print(f"partition {args.partition}: committed offset {offset}, key {args.key!r} not in the state")
        else:
            print(f"partition {args.partition}: committed offset {offset}, key {args.key!r}: {values}")
        return 0
    state, offset = committed_state(ledger.store, args.partition)
    if args.json:
        # Written row by row, so a large state is never one string in memory.
        out = sys.stdout
        out.write(f'{{"partition": {args.partition}, "committed_offset": {offset}, "keys": [')
        first = True
        for batch in state.to_batches(65_536):
            for row in batch.drop_columns(["last_offset"]).to_pylist():
                out.write(("" if first else ", ") + json.dumps(row))
                first = False
        out.write("]}\n")
        return 0
    print(f"partition {args.partition}: committed offset {offset}, {state.num_rows} keys")
    print(f"{'KEY':<16} {'COUNT':>10} {'SUM':>16} {'MIN':>12} {'MAX':>12} {'LAST':>12}")
    for batch in state.to_batches(65_536):
        for r in batch.to_pylist():
            print(
                f"{r['key']:<16} {r['count']:>10} {r['sum']:>16.4f} {r['min']:>12.4f} {r['max']:>12.4f} "
                f"{r['last']:>12.4f}"
            )
    return 0


@command("verify")
def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import audit_store

    audits = audit_store(_ledger(args).store)
    ok = all(a.ok for a in audits)
    if args.json:
        _print_json(
            {
                "ok": ok,
                "partitions": [
                    {
                        "partition": a.partition,
                        "committed_offset": a.committed_offset,
                        "events_in_source": a.events_in_source,
                        "manifests": a.manifests,
                        "epochs_granted": a.epochs_granted,
                        "duplicates": a.duplicates,
                        "losses": a.losses,
                        "orphan_outputs": a.orphan_outputs,
                        "issues": [vars(i) for i in a.issues],
                    }
                    for a in audits
                ],
            }
        )
    else:
        for a in audits:
            verdict = "ok" if a.ok else f"{len(a.issues)} PROBLEMS"
            print(
                f"partition {a.partition}: committed {a.committed_offset}/{a.events_in_source} events, "
                f"{a.manifests} manifests, {a.epochs_granted} epochs: {verdict}"
            )
            for i in a.issues:
                where = f" [{i.start_offset}, {i.end_offset})" if i.start_offset is not None else ""
                print(f"  {i.kind}{where}: {i.detail}")
        print("verify: OK" if ok else "verify: FAILED")
    return 0 if ok else 1


# --- control plane: migrate, failover, rebalance ----------------------------------------


def _migration_config(args: argparse.Namespace) -> Any:
    from .migration import MigrationConfig

    values = {
        "migration_timeout_s": args.migration_timeout,
        "release_wait_timeout_s": args.release_wait_timeout,
        "checkpoint_transfer_timeout_s": args.transfer_timeout,
        "max_concurrent_migrations": getattr(args, "max_concurrent", None),
    }
    flags = {
        "migration_timeout_s": "--migration-timeout",
        "release_wait_timeout_s": "--release-wait-timeout",
        "checkpoint_transfer_timeout_s": "--transfer-timeout",
        "max_concurrent_migrations": "--max-concurrent",
    }
    for name, value in values.items():
        if value is not None and not value > 0:
            raise InvalidArgument(flags[name], f"{value} must be > 0")
    return MigrationConfig(**{k: v for k, v in values.items() if v is not None})


def _phase_json(report: Any) -> dict[str, Any]:
    return {
        "phase": str(report.phase),
        "duration_s": round(report.duration_s, 6),
        "bytes_moved": report.bytes_moved,
        "detail": report.detail,
    }


def _outcome_json(outcome: Any) -> dict[str, Any]:
    return {
        **outcome.move.to_json(),
        "ok": outcome.ok,
        "duration_s": round(outcome.duration_s, 6),
        "error": None if outcome.ok else f"{type(outcome.error).__name__}: {outcome.error}",
        "phases": [_phase_json(r) for r in (outcome.result or [])],
    }


def _print_outcome(outcome: Any) -> None:
    m = outcome.move
    moved = sum(r.bytes_moved for r in (outcome.result or []))
    if outcome.ok:
        verdict = f"active, {moved} bytes"
    else:
        verdict = f"FAILED: {type(outcome.error).__name__}: {outcome.error}"
    print(
        f"partition {m.partition}: node {m.from_node or '-'} -> {m.to_node} in {outcome.duration_s:.2f}s: {verdict}",
        flush=True,
    )


@command("migrate")
def cmd_migrate(args: argparse.Namespace) -> int:
    from .assignment import run_migration
    from .migration import MigrationCoordinator, PhaseReport

    # Checked first: a wrong partition or node must be named as such, not as a failed phase.
    _check_partition(_ledger(args), "--partition", args.partition)
    _check_node_id("--to", args.to)
    coordinator = MigrationCoordinator(_ledger(args), _migration_config(args))
    if args.cancel:
        if args.to is not None:
            raise InvalidArgument("--cancel", "give --to NODE (move) or --cancel, not both")
        return _cancel_migration(coordinator, args)
    if args.to is None:
        raise InvalidArgument("--to", "give the node to move the partition to, or --cancel")
    reports: list[PhaseReport] = []

    def on_phase(report: PhaseReport) -> None:
        reports.append(report)
        if not args.json:
            print(
                f"{report.phase!s:<14} {report.duration_s:>9.3f}s {report.bytes_moved:>12} bytes  {report.detail}",
                flush=True,
            )

    task = run_migration(coordinator, args.partition, args.to, on_phase=on_phase)
    if args.json:
        _print_json({"migration": task.model_dump(mode="json"), "phases": [_phase_json(r) for r in reports]})
    else:
        total = sum(r.duration_s for r in reports)
        print(
            f"migration {task.migration_id}: partition {task.partition} node {task.from_node} -> "
            f"{task.to_node}, epoch {task.from_epoch} -> {task.to_epoch}: {task.phase} in {total:.2f}s"
        )
    return 0


def _cancel_migration(coordinator: Any, args: argparse.Namespace) -> int:
    from .identity import PartitionId

    # NothingToCancel / CancelRefused are ledger errors: one line on stderr, exit 1.
    task = coordinator.cancel_current(PartitionId(args.partition))
    if args.json:
        _print_json({"migration": task.model_dump(mode="json")})
    else:
        print(
            f"cancelled migration {task.migration_id} of partition {task.partition} "
            f"(node {task.from_node} -> {task.to_node}) at phase {task.failed_phase}"
        )
    return 0


@command("failover")
def cmd_failover(args: argparse.Namespace) -> int:
    from .assignment import (
        Move,
        drive,
        failover_target,
        live_node_ids,
        node_loads,
        ownership_map,
        prepare_failover,
        run_moves,
        warm_copies,
    )
    from .migration import MigrationCoordinator, NoLiveNode, PhaseReport

    _check_node_id("--node", args.node)
    _check_node_id("--to", args.to)
    if args.to is not None and args.to == args.node:
        raise InvalidArgument("--to", f"node {args.to} is the node being failed over")
    ledger = _ledger(args)
    config = _migration_config(args)
    live = live_node_ids(ledger)
    if args.node in live and not args.force:
        raise InvalidArgument(
            "--node",
            f"node {args.node} is alive: move its partitions with `laminar migrate` (graceful), "
            "or pass --force to fence it anyway",
        )
    if args.to is not None and args.to not in live:
        raise NoLiveNode(args.to)
    current = ownership_map(ledger)
    loads = node_loads(current, live - {args.node})
    moves = []
    warm = warm_copies(ledger.nodes())
    for p in sorted(p for p, owner in current.items() if owner == args.node):
        target = args.to if args.to is not None else failover_target(loads, warm=warm.get(p))
        if target is None:
            raise NoLiveNode(args.node)  # no other live node
        loads[target] = loads.get(target, 0) + 1
        moves.append(Move(p, args.node, target))
    if not args.json:
        print(f"node {args.node}: {len(moves)} partition(s) to fail over", flush=True)

    def failover(move: Move) -> list[PhaseReport]:
        coordinator = MigrationCoordinator(ledger, config)
        decision = prepare_failover(coordinator, move.partition, move.to_node, live=live, allow_live_owner=args.force)
        reports: list[PhaseReport] = []
        if decision.task is not None:
            drive(coordinator, decision.task, reports.append)
        return reports

    outcomes = run_moves(
        moves,
        failover,
        config.max_concurrent_migrations,
        live_nodes=live - {args.node},
        on_done=None if args.json else _print_outcome,
    )
    if args.json:
        _print_json({"node": args.node, "failovers": [_outcome_json(o) for o in outcomes]})
    return 0 if all(o.ok for o in outcomes) else 1


def _partition_list(flag: str, text: str) -> tuple[int, ...]:
    """``"0,2,3"`` -> (0, 2, 3); an empty string is no partition."""
    parts = [t.strip() for t in text.split(",") if t.strip()]
    try:
        values = tuple(int(t) for t in parts)
    except ValueError:
        raise InvalidArgument(flag, f"{text!r} is not a comma-separated list of partition numbers") from None
    for v in values:
        if v < 0:
            raise InvalidArgument(flag, f"partition {v} is negative")
    return values


def _parse_weights(items: Sequence[str]) -> dict[int, float]:
    weights = {}
    for item in items:
        node, sep, weight = item.partition("=")
        try:
            if not sep:
                raise ValueError
            weights[int(node)] = float(weight)
        except ValueError:
            raise InvalidArgument("--weight", f"{item!r}: expected NODE=WEIGHT, e.g. 3=2.0") from None
    return weights


@command("rebalance")
def cmd_rebalance(args: argparse.Namespace) -> int:
    from .assignment import live_node_ids, ownership_map, plan_assignment, run_migration, run_moves
    from .migration import DesiredStates, MigrationCoordinator, PhaseReport

    ledger = _ledger(args)
    config = _migration_config(args)
    live = live_node_ids(ledger)
    plan = plan_assignment(ownership_map(ledger), live, _parse_weights(args.weight))
    in_flight = {
        int(p)
        for p, state in DesiredStates(ledger).all().items()
        if state.migration is not None and not state.migration.is_terminal
    }
    moves = [m for m in plan.moves if m.partition not in in_flight]
    skipped = [m.partition for m in plan.moves if m.partition in in_flight]
    if not args.json:
        print(f"live nodes {sorted(live)}: {len(moves)} move(s)" + (" (dry run)" if args.dry_run else ""))
        print(f"{'NODE':>6} {'QUOTA':>7} {'RANGE':>7} {'BEFORE':>7} {'AFTER':>6}")
        for n, b in sorted(plan.bounds.items()):
            print(
                f"{n:>6} {b.quota:>7.2f} {f'{b.low}..{b.high}':>7} {plan.counts_before.get(n, 0):>7} "
                f"{plan.counts_after.get(n, 0):>6}"
            )
        for m in moves:
            print(f"move partition {m.partition}: node {m.from_node or '-'} -> {m.to_node}")
        if skipped:
            print(f"skipped (migration in flight): partitions {skipped}")
    outcomes = []
    if moves and not args.dry_run:
        ledger.bump_cluster_epoch(f"laminar rebalance: {len(moves)} move(s)")

        def move_one(move: Any) -> list[PhaseReport]:
            reports: list[PhaseReport] = []
            run_migration(
                MigrationCoordinator(ledger, config),
                move.partition,
                move.to_node,
                forced=None if move.from_node in live else True,
                on_phase=reports.append,
            )
            return reports

        outcomes = run_moves(
            moves,
            move_one,
            config.max_concurrent_migrations,
            live_nodes=live,
            on_done=None if args.json else _print_outcome,
        )
    if args.json:
        _print_json(
            {
                "dry_run": args.dry_run,
                "live_nodes": sorted(live),
                "plan": plan.to_json(),
                "skipped_in_flight": skipped,
                "results": [_outcome_json(o) for o in outcomes],
            }
        )
    return 0 if all(o.ok for o in outcomes) else 1


@command("sweep")
def cmd_sweep(args: argparse.Namespace) -> int:
    from .antientropy import sweep

    report = sweep(_ledger(args).store, grace_s=args.grace_s, dry_run=args.dry_run)
    if args.json:
        _print_json(report.to_json())
    else:
        verb = "would delete" if args.dry_run else "deleted"
        print(
            f"scanned {report.scanned} objects: {report.referenced} referenced, "
            f"{verb} {len(report.deleted)}, {len(report.kept_in_grace)} unreferenced but within the grace period, "
            f"{len(report.kept_unsealed)} of an epoch that may still publish, "
            f"{len(report.kept_unverified)} kept unverified"
        )
        for key, why in sorted(report.kept_unverified.items()):
            print(f"  kept {key}: {why}")
    return 0


@command("chaos")
def cmd_chaos(args: argparse.Namespace) -> int:
    from .chaos import SCENARIOS
    from .chaos import main as chaos_main

    unknown = sorted(set(args.scenario or ()) - set(SCENARIOS))
    if unknown:
        raise InvalidArgument("--scenario", f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    return chaos_main(
        profile_name=args.profile,
        names=args.scenario,
        store_url=args.chaos_store,
        as_json=args.json,
        out=args.out,
        workdir=args.workdir,
    )


# --- demo and report -----------------------------------------------------------------------


@command("demo")
def cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .demo import DemoOptions, run_demo

    options = DemoOptions(
        store=args.demo_store,
        partitions=args.partitions,
        nodes=args.nodes,
        rate=args.rate,
        keys=args.keys,
        port=args.port,
        duration=args.duration,
        interval=args.interval,
        heartbeat_timeout_s=args.heartbeat_timeout,
        spark_master=args.spark_master,
        dagster=not args.no_dagster,
        base_dir=Path.cwd(),
    )
    try:
        options.check()
    except ValueError as exc:
        raise InvalidArgument("demo", str(exc)) from None
    return run_demo(options)


@command("report")
def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .report import FAILOVER, MIGRATION, write_report

    written = write_report(_ledger(args), Path(args.out), png=not args.no_png)
    report = written.report
    print(
        f"{len(report.partitions)} partitions, {len(report.spans)} epochs "
        f"({report.count(MIGRATION)} migrations, {report.count(FAILOVER)} failovers)"
    )
    print(f"wrote {written.html}")
    if written.png is not None:
        print(f"wrote {written.png}")
    return 0


# --- parser --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="laminar", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, *, json_output: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--store",
            default=None,
            help="store URL: file:///path or s3://bucket/prefix (default: $LAMINAR_STORE, else ./.laminar/store)",
        )
        if json_output:
            p.add_argument("--json", action="store_true", help="print machine-readable JSON")
        return p

    p = add("init", "create the cluster record and N unassigned partitions", json_output=True)
    p.add_argument("--partitions", type=int, required=True, help="number of partitions (>= 1)")
    p.add_argument("--force", action="store_true", help="re-initialize an existing cluster (epochs are kept)")

    add(
        "status",
        "partitions (epoch, owner, status), nodes (heartbeat, liveness), cluster epoch",
        json_output=True,
    )

    node = sub.add_parser("node", help="run a worker node", description="run a worker node")
    node_sub = node.add_subparsers(dest="node_command", required=True, metavar="NODE_COMMAND")
    run = node_sub.add_parser("run", help="run a long-lived worker node (Ctrl-C / SIGTERM drains it)")
    run.add_argument("--store", default=None, help="store URL (default: $LAMINAR_STORE, else ./.laminar/store)")
    run.add_argument("--node-id", type=int, required=True, help="this node's id (>= 1)")
    run.add_argument("--spark-master", default="local[*]", help="Spark master URL (default local[*])")
    run.add_argument("--spark-ui", action="store_true", help="enable the Spark UI (off by default)")
    run.add_argument("--heartbeat-timeout", type=float, default=6.0, help="seconds without heartbeat = dead")
    run.add_argument("--refresh-interval", type=float, default=1.5, help="guard refresh (kill-switch) seconds")
    run.add_argument("--batch-max-events", type=int, default=1_000_000, help="events per micro-batch at most")
    run.add_argument("--checkpoint-every-batches", type=int, default=10, help="state snapshot every K batches")
    run.add_argument("--checkpoint-every-s", type=float, default=30.0, help="state snapshot every T seconds")
    run.add_argument(
        "--standby-for",
        default="",
        metavar="P[,P...]",
        help="keep a warm standby copy of these partitions while another node owns them (failovers prefer it)",
    )

    p = add("produce", "append events to the partitioned source log", json_output=True)
    p.add_argument("--from-file", help='JSONL file: one {"partition", "key", "value"[, "ts"]} per line')
    p.add_argument("--count", type=int, help="generate N events instead")
    p.add_argument("--keys", type=int, default=100, help="distinct keys for --count (default 100)")
    p.add_argument("--seed", type=int, default=0, help="random seed for --count")
    p.add_argument("--segment-events", type=int, default=100_000, help="events per log segment at most")
    p.add_argument("--soft-lag", type=int, default=5_000_000, help="warn when a partition lags this many events")
    p.add_argument("--hard-lag", type=int, default=20_000_000, help="refuse to append past this lag (0: no limit)")

    p = add("query", "print the committed state of a partition and its committed offset", json_output=True)
    p.add_argument("--partition", type=int, required=True)
    p.add_argument("--key", help="look up one key (reads the newest deltas first, the snapshot only if needed)")

    add(
        "verify",
        "audit the store: every event committed exactly once; exit 1 on loss or duplication",
        json_output=True,
    )

    def add_limits(p: argparse.ArgumentParser) -> None:
        p.add_argument("--migration-timeout", type=float, help="seconds for a whole migration (default 30)")
        p.add_argument("--release-wait-timeout", type=float, help="seconds per old-owner phase (default 15)")
        p.add_argument("--transfer-timeout", type=float, help="seconds per new-owner phase (default 60)")

    p = add("migrate", "move a partition to another node (graceful), printing each phase", json_output=True)
    p.add_argument("--partition", type=int, required=True, help="the partition to move")
    p.add_argument("--to", type=int, help="the live node that takes it over (required unless --cancel)")
    p.add_argument(
        "--cancel",
        action="store_true",
        help="cancel the partition's migration in flight (before its new owner seeks); exit 1 if there is none",
    )
    add_limits(p)

    p = add(
        "failover",
        "forced migration of every partition of a dead node to live nodes (least load)",
        json_output=True,
    )
    p.add_argument("--node", type=int, required=True, help="the dead node")
    p.add_argument("--to", type=int, help="the node to move them all to (default: least-loaded live nodes)")
    p.add_argument("--force", action="store_true", help="fence the node even though it still heartbeats")
    p.add_argument("--max-concurrent", type=int, help="migrations at once per node (default 2)")
    add_limits(p)

    p = add("rebalance", "balance partitions over the live nodes with the fewest moves", json_output=True)
    p.add_argument("--dry-run", action="store_true", help="print the plan only")
    p.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="NODE=WEIGHT",
        help="relative capacity of a node (repeatable; default 1)",
    )
    p.add_argument("--max-concurrent", type=int, help="migrations at once per node (default 2)")
    add_limits(p)

    p = add(
        "sweep",
        "anti-entropy: delete output/checkpoint objects no manifest names and none ever can",
        json_output=True,
    )
    p.add_argument("--dry-run", action="store_true", help="report, delete nothing")
    p.add_argument(
        "--grace-s",
        type=float,
        default=3600.0,
        help="minimum age in seconds (>= 0) of an unreferenced object of a sealed epoch before it is "
        "deleted (default 3600); objects of an epoch that may still publish are never deleted",
    )

    # Not `add()`: chaos must not default to the shared store; it starts from an empty one.
    p = sub.add_parser(
        "chaos",
        help="run the chaos suite on a local cluster and audit every promise (loopback only)",
        description="kill, pause and restart nodes and the orchestrator, inject store faults, then audit: "
        "no duplicate, no loss, one owner per epoch, every stale write rejected",
    )
    p.add_argument("--profile", choices=("short", "long"), default="short", help="short (~5 min) or long (~15 min)")
    p.add_argument(
        "--store",
        dest="chaos_store",
        default=None,
        metavar="URL",
        help="an EMPTY store for the node processes: file:///path, or s3://bucket/prefix with a loopback "
        "AWS_ENDPOINT_URL (default: a fresh local store in the work directory)",
    )
    p.add_argument(
        "--scenario",
        action="extend",
        nargs="+",
        metavar="NAME",
        help="run only these (store-faults, kill9-mid-batch, zombie, kill9-mid-release, orchestrator-killed, "
        "migrations-rebalance, rolling-restart)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    p.add_argument(
        "--out",
        metavar="FILE",
        help="write the table to FILE and the JSON report next to it (default .laminar/chaos/report-PROFILE.txt)",
    )
    p.add_argument("--workdir", metavar="DIR", help="keep stores and node logs here (default: a temporary directory)")

    p = sub.add_parser(
        "demo",
        help="run a local cluster with load and the Dagster UI until Ctrl-C",
        description="run a local cluster (nodes as processes, a steady load, Dagster webserver and daemon) "
        "on a fresh store under ./.laminar/demo-<timestamp>, printing status tables until Ctrl-C",
    )
    p.add_argument(
        "--store",
        dest="demo_store",
        default=None,
        metavar="URL",
        help="store URL (default: a fresh local store under ./.laminar/demo-<timestamp>; s3://bucket/prefix works)",
    )
    p.add_argument("--partitions", type=int, default=4, help="partitions of a new cluster (default 4)")
    p.add_argument("--nodes", type=int, default=3, help="worker node processes (default 3)")
    p.add_argument("--rate", type=float, default=200.0, help="events per second the producer appends (default 200)")
    p.add_argument("--keys", type=int, default=100, help="distinct keys of the load (default 100)")
    p.add_argument("--port", type=int, default=3000, help="port of the Dagster webserver on 127.0.0.1 (default 3000)")
    p.add_argument("--duration", type=float, help="once the cluster is up, run this many seconds, then stop")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between status tables (default 5)")
    p.add_argument("--heartbeat-timeout", type=float, default=6.0, help="seconds without heartbeat = dead (default 6)")
    p.add_argument("--spark-master", default="local[1]", help="Spark master of each node (default local[1])")
    p.add_argument("--no-dagster", action="store_true", help="run without the Dagster webserver and daemon")

    p = add("report", "write the ownership timeline (epochs, migrations, failovers) as a self-contained HTML file")
    p.add_argument("--out", default="laminar-report.html", help="output file (default ./laminar-report.html)")
    p.add_argument("--no-png", action="store_true", help="no PNG even when matplotlib is importable")

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "store", "unset") is None:
        args.store = default_store_url()
    try:
        return _COMMANDS[args.command](args)
    except LaminarError as exc:
        # One line whatever the message holds: scripts grep it, humans read it.
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"laminar: error: {message}", file=sys.stderr)
        return exit_code(exc.error_kind)
    except KeyboardInterrupt:
        if args.command == "init":
            print("laminar: interrupted: run the same `laminar init` again to complete it", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
