"""Dagster assets of the laminar code location: what the ledger says, refreshed by observation.

All three are observable source assets: Dagster never writes them, it
observes the object store. Each observation records the state as metadata and
a data version (a hash of the state), so the UI shows when it changed. The
``observe_laminar_state`` job observes all three; the
``laminar_observation_sensor`` (see ``sensors``) launches it whenever the
state's fingerprint changes.

* ``ownership_map`` — partition, epoch, owner, status (+ owner liveness and
  any migration in flight) as a table.
* ``assignment_plan`` — the moves a rebalance would make now.
* ``checkpoint_manifests`` — per partition, the last committed manifest:
  seq, fencing token, source offset, state checkpoint key and size.
"""

import hashlib
import json
from typing import Any

from dagster import (
    AssetSelection,
    DataVersion,
    MetadataValue,
    ObserveResult,
    TableColumn,
    TableRecord,
    TableSchema,
    define_asset_job,
    in_process_executor,
    observable_source_asset,
)

from laminar_orchestration.assignment import (
    AssignmentError,
    live_node_ids,
    plan_assignment,
)
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.ledger import Ledger
from laminar_orchestration.manifest import ManifestReader
from laminar_orchestration.ownership import snapshot_cluster
from resources import LaminarResource

GROUP = "laminar"

__all__ = [
    "ASSETS",
    "assignment_plan",
    "checkpoint_manifests",
    "checkpoint_rows",
    "fingerprint",
    "observe_laminar_state",
    "ownership_map",
    "ownership_rows",
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


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> MetadataValue[Any]:
    schema = TableSchema(columns=[TableColumn(name, kind) for name, kind in columns])
    return MetadataValue.table(records=[TableRecord(data=row) for row in rows], schema=schema)


def _uninitialized(ledger: Ledger) -> ObserveResult | None:
    if ledger.is_initialized():
        return None
    return ObserveResult(
        data_version=DataVersion("uninitialized"),
        metadata={"store": ledger.store.url, "note": "no cluster yet: run `laminar init`"},
    )


@observable_source_asset(
    group_name=GROUP,
    description="Who owns each partition at which epoch (ledger head records, rolled forward over grants).",
)
def ownership_map(laminar: LaminarResource) -> ObserveResult:
    ledger = laminar.ledger()
    if (empty := _uninitialized(ledger)) is not None:
        return empty
    rows = ownership_rows(ledger)
    # The data version covers ownership only; liveness changes do not make a new version.
    version = fingerprint([(r["partition"], r["epoch"], r["owner"], r["status"]) for r in rows])
    return ObserveResult(
        data_version=DataVersion(version),
        metadata={
            "ownership": _table(
                rows,
                [
                    ("partition", "int"),
                    ("epoch", "int"),
                    ("owner", "int"),
                    ("status", "string"),
                    ("owner_alive", "bool"),
                    ("migration", "string"),
                ],
            ),
            "partitions": len(rows),
            "unassigned": sum(1 for r in rows if r["owner"] == 0),
            "on_dead_nodes": sum(1 for r in rows if r["owner"] != 0 and not r["owner_alive"]),
            "migrations_in_flight": sum(1 for r in rows if r["migration"]),
            "cluster_epoch": ledger.membership().cluster_epoch,
            "live_nodes": ", ".join(str(n) for n in sorted(live_node_ids(ledger))) or "-",
            "store": ledger.store.url,
        },
    )


@observable_source_asset(
    group_name=GROUP,
    description="The moves a rebalance would make now (sticky, weighted planner over the live nodes).",
)
def assignment_plan(laminar: LaminarResource) -> ObserveResult:
    ledger = laminar.ledger()
    if (empty := _uninitialized(ledger)) is not None:
        return empty
    current = {r["partition"]: r["owner"] for r in ownership_rows(ledger)}
    live = live_node_ids(ledger)
    try:
        plan = plan_assignment(current, live)
    except AssignmentError as exc:
        return ObserveResult(data_version=DataVersion("no-plan"), metadata={"error": str(exc)})
    moves = [m.to_json() for m in plan.moves]
    return ObserveResult(
        data_version=DataVersion(fingerprint(plan.to_json())),
        metadata={
            "moves": _table(moves, [("partition", "int"), ("from_node", "int"), ("to_node", "int")]),
            "move_count": len(moves),
            "balanced": plan.balanced,
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
    )


@observable_source_asset(
    group_name=GROUP,
    description="Last committed manifest of each partition: seq, fencing token, source offset, "
    "state checkpoint key and size.",
)
def checkpoint_manifests(laminar: LaminarResource) -> ObserveResult:
    ledger = laminar.ledger()
    if (empty := _uninitialized(ledger)) is not None:
        return empty
    rows = checkpoint_rows(ledger, laminar.manifests())
    metadata: dict[str, Any] = {
        "manifests": _table(
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
        ),
        "partitions_with_commits": len(rows),
    }
    # One entry per partition, so each partition's history can be charted in the UI.
    for row in rows:
        metadata[f"partition_{row['partition']:05d}"] = MetadataValue.json(row)
    return ObserveResult(
        data_version=DataVersion(fingerprint([(r["partition"], r["seq"], r["commit_ulid"]) for r in rows])),
        metadata=metadata,
    )


ASSETS = [ownership_map, assignment_plan, checkpoint_manifests]

#: Observes every laminar asset (launched by laminar_observation_sensor on change).
observe_laminar_state = define_asset_job(
    "observe_laminar_state",
    selection=AssetSelection.assets(*(a.key for a in ASSETS)),
    description="Observe the ownership map, the assignment plan and the checkpoint manifests.",
    # Three quick ledger reads: a process per step would cost more than the work.
    executor_def=in_process_executor,
)
