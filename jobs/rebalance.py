"""The `rebalance` job: plan a balanced assignment over the live nodes and carry it out.

``plan_rebalance`` plans with the library's rebalance
(`laminar_orchestration.control.operations.plan_rebalance`: the sticky planner, minus
partitions a migration already moves), records the plan as an
observation of the ``assignment_plan`` asset and, unless ``dry_run``, fans the
moves out as waves (``DynamicOutput``s): within a wave no node takes part in
more than ``max_concurrent_migrations`` moves. Each wave is one mapped
``migrate`` step that runs its moves concurrently (threads; a per-node slot
limit guards them again), and waves run one after another (in-process
executor), so at no time does a node take part in more than
``max_concurrent_migrations`` migrations. ``summarize_rebalance`` collects
the results.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dagster as dg
from pydantic import Field

from laminar_orchestration.control.moves import run_moves
from laminar_orchestration.control.operations import RebalancePlan, rebalance_move
from laminar_orchestration.control.operations import plan_rebalance as plan_rebalance_moves
from laminar_orchestration.control.placement import AssignmentError, Move, schedule_waves
from laminar_orchestration.protocol.tasks import MigrationConfig, PhaseReport
from resources import LaminarResource

from .common import EXPECTED_ERRORS, MigrationLimits, failure

ASSIGNMENT_PLAN_ASSET = dg.AssetKey("assignment_plan")
PLAN_ERRORS: tuple[type[Exception], ...] = (*EXPECTED_ERRORS, AssignmentError)


class RebalanceConfig(dg.Config):
    """Launchpad config of `rebalance`."""

    dry_run: bool = Field(default=False, description="Only compute and show the plan; move nothing.")
    max_concurrent_migrations: int = Field(
        default=2, ge=1, description="At most this many migrations at once on any node."
    )
    weights: dict[str, float] = Field(
        default_factory=dict,
        description="Relative capacity per node id, e.g. {'3': 2.0}; nodes not listed weigh 1.",
    )
    tuning: MigrationLimits = Field(
        default_factory=MigrationLimits, description="Timeouts and retries of each migration (the defaults when unset)."
    )


@dg.config_mapping
def _rebalance_config(config: RebalanceConfig) -> dg.RunConfig:
    return dg.RunConfig(ops={"plan_rebalance": config})


@dataclass(frozen=True)
class Wave:
    """Moves that may run at the same time, and what they need to run."""

    index: int
    moves: tuple[Move, ...]
    live_nodes: tuple[int, ...]
    max_per_node: int
    config: dict[str, Any]


def parse_weights(raw: dict[str, float]) -> dict[int, float]:
    """Node-id keyed weights from the config's string keys; names the bad key."""
    weights = {}
    for key, value in raw.items():
        try:
            node = int(key)
        except ValueError:
            raise AssignmentError(f"weights: {key!r} is not a node id") from None
        if node < 1:
            raise AssignmentError(f"weights: node id must be >= 1, got {node}")
        weights[node] = float(value)
    return weights


def plan_markdown(plan: RebalancePlan) -> str:
    """The plan as a Markdown table for the UI."""
    lines = ["| partition | from node | to node |", "|---:|---:|---:|"]
    lines += [f"| {m.partition} | {m.from_node or '-'} | {m.to_node} |" for m in plan.moves]
    if len(lines) == 2:
        lines.append("| - | - | - |")
    a = plan.assignment
    lines += ["", "| node | quota | balanced range | before | after |", "|---:|---:|:---:|---:|---:|"]
    for n, b in sorted(a.bounds.items()):
        lines.append(
            f"| {n} | {b.quota:.2f} | {b.low}..{b.high} | {a.counts_before.get(n, 0)} | {a.counts_after.get(n, 0)} |"
        )
    if plan.skipped_in_flight:
        skipped = ", ".join(f"p{m.partition}" for m in plan.skipped_in_flight)
        lines += ["", f"Skipped (a migration is already in flight): {skipped}"]
    return "\n".join(lines)


@dg.op(
    description="Compute the sticky, weighted assignment plan over the live nodes and fan the moves "
    "out in waves that respect max_concurrent_migrations per node.",
    out=dg.DynamicOut(Wave),
)
def plan_rebalance(
    context: dg.OpExecutionContext, config: RebalanceConfig, laminar: LaminarResource
) -> Iterator[dg.DynamicOutput[Wave] | dg.AssetObservation]:
    try:
        ledger = laminar.ledger()
        plan = plan_rebalance_moves(ledger, parse_weights(config.weights))
    except PLAN_ERRORS as exc:
        raise failure("cannot plan a rebalance", exc) from exc
    moves, live = plan.moves, plan.live_nodes
    waves = schedule_waves(moves, config.max_concurrent_migrations, live_nodes=live)
    context.log.info(
        f"rebalance plan over live nodes {sorted(live)}: {len(moves)} move(s) in {len(waves)} wave(s)"
        + (" (dry run)" if config.dry_run else "")
    )
    yield dg.AssetObservation(
        asset_key=ASSIGNMENT_PLAN_ASSET,
        metadata={
            "plan": dg.MetadataValue.md(plan_markdown(plan)),
            "moves": len(moves),
            "waves": len(waves),
            "dry_run": config.dry_run,
            "plan_json": dg.MetadataValue.json(plan.assignment.to_json()),
        },
    )
    if config.dry_run or not moves:
        return
    # A rebalance is a new membership generation; in-flight work of partitions
    # that do not move stays valid (the cluster epoch has a two-epoch window).
    epoch = ledger.members.bump_cluster_epoch(f"rebalance run {context.run_id}: {len(moves)} move(s)")
    context.log.info(f"cluster epoch is now {epoch}")
    settings = config.tuning.migration_config(max_concurrent_migrations=config.max_concurrent_migrations)
    for i, wave in enumerate(waves, start=1):
        value = Wave(
            i,
            tuple(wave),
            tuple(sorted(live)),
            config.max_concurrent_migrations,
            settings.model_dump(exclude_unset=True),
        )
        yield dg.DynamicOutput(
            value,
            mapping_key=f"wave_{i}",
            metadata={"moves": ", ".join(f"p{m.partition}:{m.from_node}->{m.to_node}" for m in wave)},
        )


@dataclass(frozen=True)
class MoveResult:
    """One finished move of a rebalance."""

    move: Move
    ok: bool
    detail: str
    duration_s: float
    bytes_moved: int


@dg.op(
    description="Carry out one wave of moves concurrently (graceful, or forced from a dead owner), "
    "never more than max_concurrent_migrations at once per node.",
    ins={"wave": dg.In(Wave)},
)
def migrate(context: dg.OpExecutionContext, laminar: LaminarResource, wave: Wave) -> dg.Output[list[MoveResult]]:
    settings = MigrationConfig(**wave.config)
    live = set(wave.live_nodes)

    def one(move: Move) -> list[PhaseReport]:
        reports: list[PhaseReport] = []
        rebalance_move(laminar.coordinator(settings), move, live, reports.append)
        return reports

    outcomes = run_moves(wave.moves, one, wave.max_per_node, live_nodes=live)
    results = []
    for o in outcomes:
        if o.ok:
            moved = sum(r.bytes_moved for r in o.result or [])
            results.append(MoveResult(o.move, True, "active", o.duration_s, moved))
            context.log.info(
                f"p{o.move.partition}: node {o.move.from_node} -> {o.move.to_node} "
                f"in {o.duration_s:.2f}s, {moved} bytes"
            )
        else:
            results.append(MoveResult(o.move, False, f"{type(o.error).__name__}: {o.error}", o.duration_s, 0))
            context.log.error(f"p{o.move.partition}: {type(o.error).__name__}: {o.error}")
    table = [
        "| partition | from | to | ok | duration_s | bytes_moved | detail |",
        "|---:|---:|---:|:-:|---:|---:|---|",
    ]
    table += [
        f"| {r.move.partition} | {r.move.from_node} | {r.move.to_node} | {'yes' if r.ok else 'NO'} | "
        f"{r.duration_s:.3f} | {r.bytes_moved} | {r.detail} |"
        for r in results
    ]
    failed = [r for r in results if not r.ok]
    if failed:
        raise failure(
            f"wave {wave.index}: {len(failed)} of {len(results)} move(s) failed",
            RuntimeError("; ".join(f"p{r.move.partition}: {r.detail}" for r in failed)),
            wave=wave.index,
            moves=dg.MetadataValue.md("\n".join(table)),
        )
    return dg.Output(
        results,
        metadata={
            "wave": wave.index,
            "moves": dg.MetadataValue.md("\n".join(table)),
            "duration_s": dg.MetadataValue.float(round(max((r.duration_s for r in results), default=0.0), 6)),
            "bytes_moved": sum(r.bytes_moved for r in results),
        },
    )


@dg.op(description="Totals of the rebalance.")
def summarize_rebalance(context: dg.OpExecutionContext, waves: list[list[MoveResult]]) -> dg.Output[int]:
    results = [r for wave in waves for r in wave]
    context.log.info(f"rebalance moved {len(results)} partition(s)")
    return dg.Output(
        len(results),
        metadata={
            "moved": len(results),
            "bytes_moved": sum(r.bytes_moved for r in results),
            "partitions": ", ".join(str(r.move.partition) for r in results) or "-",
        },
    )


@dg.job(
    name="rebalance",
    description="Balance partitions over the live nodes with the fewest moves "
    "(at most max_concurrent_migrations per node at a time).",
    config=_rebalance_config,
    executor_def=dg.in_process_executor,
)
def rebalance() -> None:
    summarize_rebalance(plan_rebalance().map(migrate).collect())
