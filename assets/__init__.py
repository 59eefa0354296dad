"""Dagster assets of the laminar code location: what the ledger says, and the committed state.

The three ledger assets are external assets: Dagster never computes them, the
object store is their truth. The sensors report what they see as asset
observations (``SensorResult(asset_events=...)``) whenever the ledger changes,
so no run is ever launched to observe them. ``ownership_map`` and
``assignment_plan`` are observable source assets: the UI offers "Observe"
(a run that reads the ledger and records the same observation) instead of a
"Materialize" that could not work, and shows their latest observation:

* ``ownership_map`` — partition, epoch, owner, status, owner liveness, any
  migration in flight and a health word per partition ("ok", "failover
  pending", "moving", "unassigned"). The asset check
  ``partitions_on_live_nodes`` fails while a partition sits on a dead node or
  is unassigned; the sensors report it with each observation, and it can also
  be run from the UI.
* ``assignment_plan`` — the moves a rebalance would make now.
* ``checkpoint_manifests`` — per partition, the last committed manifest:
  seq, fencing token, source offset, state checkpoint key and size. Its
  freshness policy says whether the stream keeps up: the sensor reports it as
  *materialized* (at most once a minute) while every partition has committed
  since the last report or has nothing left to commit, so the Catalog shows it
  fresh while the stream is healthy, a warning after `STREAM_WARN_AFTER`
  without such a report (a partition stalled, unassigned or on a dead node)
  and a failure after `STREAM_FAIL_AFTER`. Otherwise it is observed when it
  changes, with the partitions behind.

``committed_state`` (see `assets.committed_state`) is a real, partitioned
asset: one Dagster partition per stream partition, materialized on Spark (the
``pyspark`` resource) from the committed checkpoints.
"""

import warnings
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetsDefinition,
    AssetSpec,
    BetaWarning,
    DataVersion,
    FreshnessPolicy,
    MetadataValue,
    ObserveResult,
    SourceAsset,
    TableColumn,
    TableRecord,
    TableSchema,
    asset_check,
    observable_source_asset,
)

from laminar_orchestration.control.operations import plan_rebalance
from laminar_orchestration.control.ownership import LiveOwnersCheck, check_live_owners, ownership_rows, report_ownership
from laminar_orchestration.control.placement import AssignmentError
from laminar_orchestration.control.progress import StreamProgress, checkpoint_rows, checkpoints_version
from laminar_orchestration.control.snapshot import fingerprint
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from resources import LaminarResource

from .committed_state import LAMINAR_PARTITIONS, committed_state

# `observable_source_asset` is marked beta; the observation-only assets rely on it knowingly.
warnings.filterwarnings("ignore", category=BetaWarning, message=".*observable_source_asset.*")

GROUP = "laminar"
#: The tag Dagster reads an observation's data version from.
DATA_VERSION_TAG = "dagster/data_version"

__all__ = [
    "ASSETS",
    "ASSET_CHECKS",
    "LAMINAR_PARTITIONS",
    "LIVE_OWNERS_CHECK",
    "STREAM_FAIL_AFTER",
    "STREAM_FRESHNESS",
    "STREAM_WARN_AFTER",
    "assignment_observation",
    "assignment_plan",
    "checkpoint_manifests",
    "checkpoint_observation",
    "committed_state",
    "live_owners_evaluation",
    "ownership_map",
    "ownership_observation",
    "partitions_on_live_nodes",
]


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> MetadataValue[Any]:
    schema = TableSchema(columns=[TableColumn(name, kind) for name, kind in columns])
    return MetadataValue.table(records=[TableRecord(data=row) for row in rows], schema=schema)


_OWNERSHIP_COLUMNS = [
    ("partition", "int"),
    ("epoch", "int"),
    ("owner", "int"),
    ("status", "string"),
    ("owner_alive", "bool"),
    ("migration", "string"),
    ("failure", "string"),
    ("health", "string"),
]


# --- the assets ---------------------------------------------------------------------------


def _as_observe_result(observation: AssetObservation) -> ObserveResult:
    """What an "Observe" run records: the observation the sensors report, with its data version."""
    version = observation.tags.get(DATA_VERSION_TAG)
    return ObserveResult(
        metadata=dict(observation.metadata), data_version=DataVersion(version) if version is not None else None
    )


@observable_source_asset(
    name="ownership_map",
    group_name=GROUP,
    required_resource_keys={"laminar"},
    description="Who owns each partition at which epoch, whether the owner is alive, migrations in "
    "flight (ledger head records, rolled forward over grants). Observed by the sensors when it changes "
    "(no runs); Observe reads the ledger now.",
)
def ownership_map(context: AssetExecutionContext) -> ObserveResult:
    """The ownership map read from the ledger now (the sensors report the same when it changes)."""
    laminar: LaminarResource = context.resources.laminar
    return _as_observe_result(ownership_observation(laminar.ledger()))


@observable_source_asset(
    name="assignment_plan",
    group_name=GROUP,
    required_resource_keys={"laminar"},
    description="The moves a rebalance would make now (sticky, weighted planner over the live nodes). "
    "Observed by the sensors when it changes (no runs); Observe plans it now.",
)
def assignment_plan(context: AssetExecutionContext) -> ObserveResult:
    """The rebalance plan over the live nodes now (the sensors report the same when it changes)."""
    laminar: LaminarResource = context.resources.laminar
    return _as_observe_result(assignment_observation(laminar.ledger()))


#: A stream with no report of keeping up for this long shows a freshness warning, then a failure.
STREAM_WARN_AFTER = timedelta(minutes=2)
STREAM_FAIL_AFTER = timedelta(minutes=5)
STREAM_FRESHNESS = FreshnessPolicy.time_window(fail_window=STREAM_FAIL_AFTER, warn_window=STREAM_WARN_AFTER)

checkpoint_manifests = AssetSpec(
    "checkpoint_manifests",
    group_name=GROUP,
    description="Last committed manifest of each partition: seq, fencing token, source offset, "
    "state checkpoint key and size. Materialized while every partition keeps up (commits, or has "
    "nothing to commit): stale means a partition stopped committing.",
    freshness_policy=STREAM_FRESHNESS,
)


def _uninitialized(ledger: Ledger, key: AssetKey) -> AssetObservation | None:
    if ledger.is_initialized():
        return None
    return AssetObservation(
        asset_key=key,
        metadata={"store": ledger.store.url, "note": "no cluster yet: run `laminar init`"},
        tags={DATA_VERSION_TAG: "uninitialized"},
    )


def ownership_observation(ledger: Ledger, rows: Sequence[dict[str, Any]] | None = None) -> AssetObservation:
    """The `ownership_map` as the ledger shows it now (or as `rows`, read a moment ago)."""
    if rows is None and (empty := _uninitialized(ledger, ownership_map.key)) is not None:
        return empty
    report = report_ownership(ledger, rows)
    return AssetObservation(
        asset_key=ownership_map.key,
        metadata={
            # Counts first: they are what the asset page shows at a glance.
            "on_dead_nodes": report.on_dead_nodes,
            "migrations_in_flight": report.migrations_in_flight,
            "unassigned": report.unassigned,
            "partitions": len(report.rows),
            "ownership": _table(list(report.rows), _OWNERSHIP_COLUMNS),
            "live_nodes": ", ".join(str(n) for n in report.live_nodes) or "-",
            "cluster_epoch": report.cluster_epoch,
            "store": report.store,
        },
        # The data version covers ownership only; liveness changes do not make a new version.
        tags={DATA_VERSION_TAG: report.version},
    )


def assignment_observation(ledger: Ledger, rows: Sequence[dict[str, Any]] | None = None) -> AssetObservation:
    """The `assignment_plan`: what a rebalance would move now (from ownership `rows`, if read a moment ago)."""
    if rows is None and (empty := _uninitialized(ledger, assignment_plan.key)) is not None:
        return empty
    try:
        if rows is None:
            plan = plan_rebalance(ledger).assignment
        else:
            owners = {int(r["partition"]): int(r["owner"]) for r in rows}
            moving = [int(r["partition"]) for r in rows if r["migration"]]
            plan = plan_rebalance(ledger, owners=owners, moving=moving).assignment
    except AssignmentError as exc:
        return AssetObservation(
            asset_key=assignment_plan.key, metadata={"error": str(exc)}, tags={DATA_VERSION_TAG: "no-plan"}
        )
    moves = [m.to_json() for m in plan.moves]
    return AssetObservation(
        asset_key=assignment_plan.key,
        metadata={
            "move_count": len(moves),
            "balanced": plan.balanced,
            "moves": _table(moves, [("partition", "int"), ("from_node", "int"), ("to_node", "int")]),
            "nodes": _table(
                plan.to_json()["nodes"],
                [
                    ("node", "int"),
                    ("quota", "float"),
                    ("low", "int"),
                    ("high", "int"),
                    ("before", "int"),
                    ("after", "int"),
                ],
            ),
        },
        tags={DATA_VERSION_TAG: fingerprint(plan.to_json())},
    )


def checkpoint_observation(
    ledger: Ledger,
    manifests: ManifestReader,
    rows: Sequence[dict[str, Any]] | None = None,
    progress: StreamProgress | None = None,
) -> AssetObservation | AssetMaterialization:
    """The `checkpoint_manifests`: each partition's last committed manifest.

    With `progress` showing every partition keeping up it is a materialization,
    which keeps the asset fresh; otherwise an observation naming the partitions behind.
    """
    if (empty := _uninitialized(ledger, checkpoint_manifests.key)) is not None:
        return empty
    rows = list(rows) if rows is not None else checkpoint_rows(ledger, manifests)
    metadata: dict[str, Any] = {}
    if progress is not None:
        # What the Catalog shows first: is the stream keeping up, and which partitions are not.
        metadata["partitions_behind"] = progress.behind_listing()
        metadata["uncommitted_events"] = progress.uncommitted_events
    metadata["partitions_with_commits"] = len(rows)
    metadata["manifests"] = _table(
        rows,
        [
            ("partition", "int"),
            ("seq", "int"),
            ("fencing_token", "int"),
            ("node", "int"),
            ("source_offset", "int"),
            ("state_offset", "int"),
            ("events_applied", "int"),
            ("snapshot_files", "int"),
            ("snapshot_bytes", "int"),
            ("deltas", "int"),
            ("delta_bytes", "int"),
            ("outputs", "int"),
            ("commit_ulid", "string"),
            ("committed_at", "string"),
        ],
    )
    # One entry per partition, so each partition's history can be charted in the UI.
    for row in rows:
        metadata[f"partition_{row['partition']:05d}"] = MetadataValue.json(row)
    tags = {DATA_VERSION_TAG: checkpoints_version(rows)}
    if progress is not None and progress.keeping_up:
        return AssetMaterialization(asset_key=checkpoint_manifests.key, metadata=metadata, tags=tags)
    return AssetObservation(asset_key=checkpoint_manifests.key, metadata=metadata, tags=tags)


# --- the health check -----------------------------------------------------------------------

LIVE_OWNERS_CHECK = "partitions_on_live_nodes"
_CHECK_DESCRIPTION = "Every partition is owned by a live node (fails while one is unassigned or on a dead node)."


def _live_owners_metadata(check: LiveOwnersCheck) -> dict[str, Any]:
    return {"partitions_in_trouble": len(check.troubled), "partitions": check.listing}


def live_owners_evaluation(rows: Sequence[dict[str, Any]]) -> AssetCheckEvaluation:
    """The `partitions_on_live_nodes` check over ownership `rows`, as a sensor reports it."""
    check = check_live_owners(rows)
    return AssetCheckEvaluation(
        asset_key=ownership_map.key,
        check_name=LIVE_OWNERS_CHECK,
        passed=check.passed,
        metadata=_live_owners_metadata(check),
        severity=AssetCheckSeverity.ERROR,
        description=check.description,
    )


@asset_check(asset=ownership_map.key, name=LIVE_OWNERS_CHECK, description=_CHECK_DESCRIPTION)
def partitions_on_live_nodes(context: AssetCheckExecutionContext, laminar: LaminarResource) -> AssetCheckResult:
    """On demand from the UI; the sensors report the same check with every ownership observation."""
    ledger = laminar.ledger()
    rows = ownership_rows(ledger) if ledger.is_initialized() else []
    check = check_live_owners(rows)
    context.log.info(check.description)
    return AssetCheckResult(
        passed=check.passed,
        metadata=_live_owners_metadata(check),
        severity=AssetCheckSeverity.ERROR,
        description=check.description,
    )


ASSETS: list[AssetSpec | AssetsDefinition | SourceAsset] = [
    ownership_map,
    assignment_plan,
    checkpoint_manifests,
    committed_state,
]
ASSET_CHECKS = [partitions_on_live_nodes]
