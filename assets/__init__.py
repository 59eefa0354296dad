"""Dagster assets of the laminar code location: what the ledger says, and the committed state.

The three ledger assets are external assets: Dagster never computes them, the
object store is their truth. The sensors report what they see as asset
observations (``SensorResult(asset_events=...)``) whenever the ledger changes,
so no run is ever launched to observe them:

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

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetsDefinition,
    AssetSpec,
    FreshnessPolicy,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset_check,
)

from laminar_orchestration.control.placement import AssignmentError, plan_assignment
from laminar_orchestration.control.snapshot import live_node_ids, snapshot_cluster
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.source import SourceLog
from resources import LaminarResource

from .committed_state import LAMINAR_PARTITIONS, committed_state

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
    "StreamProgress",
    "assignment_observation",
    "assignment_plan",
    "checkpoint_manifests",
    "checkpoint_observation",
    "checkpoint_rows",
    "committed_state",
    "fingerprint",
    "health",
    "live_owners_evaluation",
    "ownership_map",
    "ownership_observation",
    "ownership_rows",
    "partitions_on_live_nodes",
    "stream_progress",
]


def fingerprint(value: Any) -> str:
    """A short stable hash of JSON-able data: the data version of an observation."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def ownership_rows(ledger: Ledger) -> list[dict[str, Any]]:
    """One row per partition: partition, epoch, owner, status, owner_alive, migration.

    From the library's ownership snapshot, without the offsets: they change
    with every commit, and the rows are the observation's fingerprint.
    """
    return [
        {
            "partition": p.partition,
            "epoch": p.epoch,
            "owner": p.owner,
            "status": p.status,
            "owner_alive": p.owner_alive,
            "migration": "" if p.migration is None else f"{p.migration.migration_id} ({p.migration.phase})",
        }
        for p in snapshot_cluster(ledger, offsets=False).partitions
    ]


def checkpoint_rows(ledger: Ledger, manifests: ManifestReader) -> list[dict[str, Any]]:
    """One row per partition with a committed manifest (partitions never committed are left out)."""
    rows = []
    for p in ledger.partitions():
        version = manifests.current(PartitionId(p))
        if version is None:
            continue
        m = version.manifest
        rows.append(
            {
                "partition": int(p),
                "seq": m.seq,
                "fencing_token": m.fencing_token,
                "node": m.node,
                "source_offset": m.source_offset,
                "state_offset": m.state_offset,
                "events_applied": m.events_applied,
                "snapshot_files": len(m.snapshot.files) if m.snapshot else 0,
                "snapshot_bytes": m.snapshot.size if m.snapshot else 0,
                "deltas": len(m.deltas),
                "delta_bytes": sum(d.ref.size for d in m.deltas),
                "outputs": len(m.outputs),
                "commit_ulid": m.commit_ulid,
                "committed_at": m.committed_at.isoformat(),
            }
        )
    return rows


def health(row: dict[str, Any]) -> str:
    """One word on a partition of the ownership map: what an operator must know first."""
    if row["owner"] == 0:
        return "unassigned"
    if not row["owner_alive"]:
        return "failover in flight" if row["migration"] else "owner dead: failover pending"
    return "moving" if row["migration"] else "ok"


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
    ("health", "string"),
]


# --- the assets ---------------------------------------------------------------------------

ownership_map = AssetSpec(
    "ownership_map",
    group_name=GROUP,
    description="Who owns each partition at which epoch, whether the owner is alive, migrations in "
    "flight (ledger head records, rolled forward over grants). Observed by the sensors when it changes.",
)
assignment_plan = AssetSpec(
    "assignment_plan",
    group_name=GROUP,
    description="The moves a rebalance would make now (sticky, weighted planner over the live nodes).",
)
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
    table = [{**r, "health": health(r)} for r in (rows if rows is not None else ownership_rows(ledger))]
    # The data version covers ownership only; liveness changes do not make a new version.
    version = fingerprint([(r["partition"], r["epoch"], r["owner"], r["status"]) for r in table])
    return AssetObservation(
        asset_key=ownership_map.key,
        metadata={
            # Counts first: they are what the asset page shows at a glance.
            "on_dead_nodes": sum(1 for r in table if r["owner"] != 0 and not r["owner_alive"]),
            "migrations_in_flight": sum(1 for r in table if r["migration"]),
            "unassigned": sum(1 for r in table if r["owner"] == 0),
            "partitions": len(table),
            "ownership": _table(table, _OWNERSHIP_COLUMNS),
            "live_nodes": ", ".join(str(n) for n in sorted(live_node_ids(ledger))) or "-",
            "cluster_epoch": ledger.membership().cluster_epoch,
            "store": ledger.store.url,
        },
        tags={DATA_VERSION_TAG: version},
    )


def assignment_observation(ledger: Ledger) -> AssetObservation:
    """The `assignment_plan`: what a rebalance would move now."""
    if (empty := _uninitialized(ledger, assignment_plan.key)) is not None:
        return empty
    current = {r["partition"]: r["owner"] for r in ownership_rows(ledger)}
    try:
        plan = plan_assignment(current, live_node_ids(ledger))
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


@dataclass(frozen=True)
class StreamProgress:
    """Whether every partition kept up since the last report: committed since, or nothing left to commit."""

    #: partition -> seq of its last committed manifest (absent: never committed).
    seqs: dict[int, int]
    #: partition -> events in its source log not committed yet.
    lags: dict[int, int]
    #: Partitions with events to commit and no commit since the last report.
    behind: list[int]

    @property
    def keeping_up(self) -> bool:
        """True when no partition is behind."""
        return not self.behind


def stream_progress(ledger: Ledger, rows: Sequence[dict[str, Any]], reported: Mapping[int, int]) -> StreamProgress:
    """Each partition's progress since the manifests `reported` (partition -> seq) at the last report."""
    source = SourceLog(ledger.store)
    by_partition = {r["partition"]: r for r in rows}
    seqs, lags, behind = {}, {}, []
    for p in (int(p) for p in ledger.partitions()):
        row = by_partition.get(p)
        committed = row["source_offset"] if row else 0
        lags[p] = max(0, source.end_offset(p) - committed)
        if row is not None:
            seqs[p] = row["seq"]
        progressed = row is not None and reported.get(p) != row["seq"]
        if lags[p] > 0 and not progressed:
            behind.append(p)
    return StreamProgress(seqs=seqs, lags=lags, behind=behind)


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
        metadata["partitions_behind"] = ", ".join(f"p{p} ({progress.lags[p]} events)" for p in progress.behind) or "-"
        metadata["uncommitted_events"] = sum(progress.lags.values())
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
    version = fingerprint([(r["partition"], r["seq"], r["commit_ulid"]) for r in rows])
    tags = {DATA_VERSION_TAG: version}
    if progress is not None and progress.keeping_up:
        return AssetMaterialization(asset_key=checkpoint_manifests.key, metadata=metadata, tags=tags)
    return AssetObservation(asset_key=checkpoint_manifests.key, metadata=metadata, tags=tags)


# --- the health check -----------------------------------------------------------------------

LIVE_OWNERS_CHECK = "partitions_on_live_nodes"
_CHECK_DESCRIPTION = "Every partition is owned by a live node (fails while one is unassigned or on a dead node)."


def _live_owners(rows: Sequence[dict[str, Any]]) -> tuple[bool, dict[str, Any], str]:
    troubled = [r for r in rows if r["owner"] == 0 or not r["owner_alive"]]
    listing = ", ".join(f"p{r['partition']} ({health(r)})" for r in troubled)
    metadata = {"partitions_in_trouble": len(troubled), "partitions": listing or "-"}
    if not troubled:
        return True, metadata, f"all {len(rows)} partitions on live nodes"
    return False, metadata, f"{len(troubled)} of {len(rows)} partitions not on a live node: {listing}"


def live_owners_evaluation(rows: Sequence[dict[str, Any]]) -> AssetCheckEvaluation:
    """The `partitions_on_live_nodes` check over ownership `rows`, as a sensor reports it."""
    passed, metadata, description = _live_owners(rows)
    return AssetCheckEvaluation(
        asset_key=ownership_map.key,
        check_name=LIVE_OWNERS_CHECK,
        passed=passed,
        metadata=metadata,
        severity=AssetCheckSeverity.ERROR,
        description=description,
    )


@asset_check(asset=ownership_map.key, name=LIVE_OWNERS_CHECK, description=_CHECK_DESCRIPTION)
def partitions_on_live_nodes(context: AssetCheckExecutionContext, laminar: LaminarResource) -> AssetCheckResult:
    """On demand from the UI; the sensors report the same check with every ownership observation."""
    ledger = laminar.ledger()
    rows = ownership_rows(ledger) if ledger.is_initialized() else []
    passed, metadata, description = _live_owners(rows)
    context.log.info(description)
    return AssetCheckResult(
        passed=passed, metadata=metadata, severity=AssetCheckSeverity.ERROR, description=description
    )


ASSETS: list[AssetSpec | AssetsDefinition] = [ownership_map, assignment_plan, checkpoint_manifests, committed_state]
ASSET_CHECKS = [partitions_on_live_nodes]
