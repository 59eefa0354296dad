"""``laminar_observation_sensor``: the ledger assets observed from the sensor, no runs.

Every evaluation (the daemon's 5 s loop) reads the nodes' records, assignments
and move reports, and every partition's records only when those moved (or
every `OWNERSHIP_EVERY_S`), and reports, as asset events of the sensor tick
itself:

* ``ownership_map`` and its ``partitions_on_live_nodes`` check whenever
  ownership, owner liveness or a migration's phase changed — a node going
  silent shows as "owner dead: failover pending" on the next tick;
* ``assignment_plan`` whenever ownership or the live nodes changed;
* ``checkpoint_manifests`` at most every `CHECKPOINT_EVERY_S` (they change
  with every commit; a partition's manifest is read again only when the nodes'
  heartbeats report another commit of it, `CheckpointRows`): materialized
  while every partition keeps up (committed since the last materialization,
  or nothing to commit), which keeps the asset fresh under its freshness
  policy; otherwise observed, naming the partitions behind, when the
  manifests changed;
* ``stream_output`` at most every `TABLE_EVERY_S`, when the output table's
  version moved (the nodes append to it; nothing else observes it), so
  assets downstream of the table see each new version;
* the stream partitions as ``committed_state``'s Dagster partitions.
"""

import json
import logging
import time
from dataclasses import dataclass, field

from dagster import (
    AddDynamicPartitionsRequest,
    AssetCheckEvaluation,
    AssetMaterialization,
    AssetObservation,
    DefaultSensorStatus,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets import (
    LAMINAR_PARTITIONS,
    assignment_observation,
    checkpoint_observation,
    live_owners_evaluation,
    ownership_observation,
)
from assets.stream_output import stream_output_observation
from laminar_orchestration.control.ownership import OwnershipRows, ownership_rows, ownership_signature
from laminar_orchestration.control.progress import CheckpointRows, checkpoint_rows, stream_progress
from laminar_orchestration.control.snapshot import fingerprint
from laminar_orchestration.errors import LaminarError
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.ledger import Ledger
from resources import LaminarResource

__all__ = [
    "CHECKPOINT_EVERY_S",
    "OWNERSHIP_EVERY_S",
    "TABLE_EVERY_S",
    "TABLE_UNSEEN_EVERY_S",
    "ObservationCursor",
    "laminar_observation_sensor",
    "observe",
]

log = logging.getLogger(__name__)

#: How long one evaluation reads before it reports what it has and goes on at the next tick (the
#: daemon gives a sensor 60 s; the first look at a large cluster's records takes longer).
READ_BUDGET_S = 20.0
#: Least time between two observations of the checkpoint manifests.
CHECKPOINT_EVERY_S = 60.0
#: Most time between two reads of every partition's ownership; in between they are read only when
#: the nodes' records, assignments or move reports moved (`ownership_signature`).
OWNERSHIP_EVERY_S = 300.0
#: Least time between two looks at the output table (its log, and the chains from its position: about
#: three reads a partition, as many as the manifests' observation).
TABLE_EVERY_S = 60.0
#: The same while no table has been seen yet: the nodes create it with their first sync.
TABLE_UNSEEN_EVERY_S = 15.0


@dataclass
class ObservationCursor:
    """What was last reported: fingerprints of each asset's state, and when the manifests were."""

    ownership: str = ""
    plan: str = ""
    #: The `ownership_signature` when every partition's ownership was last read, and when.
    signature: str = ""
    ownership_at: float = 0.0
    manifests: str = ""
    manifests_at: float = 0.0
    partitions: int = 0
    #: partition (as a string: JSON keys) -> manifest seq at the last materialization of the manifests.
    materialized_seqs: dict[str, int] = field(default_factory=dict)
    #: The output table's data version at its last observation, and when the table was last read.
    table: str = ""
    table_at: float = 0.0

    @classmethod
    def decode(cls, raw: str | None) -> "ObservationCursor":
        try:
            return cls(**json.loads(raw)) if raw else cls()
        except (ValueError, TypeError):
            return cls()  # a mangled cursor costs one repeated observation

    def encode(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


@dataclass
class Observed:
    """One evaluation's events and the cursor after them."""

    events: list[AssetObservation | AssetMaterialization | AssetCheckEvaluation] = field(default_factory=list)
    new_partitions: list[str] = field(default_factory=list)
    cursor: ObservationCursor = field(default_factory=ObservationCursor)


def observe(
    ledger: Ledger,
    manifests: ManifestReader,
    cursor: ObservationCursor,
    *,
    now: float | None = None,
    checkpoints: CheckpointRows | None = None,
    ownership: OwnershipRows | None = None,
) -> Observed:
    """The asset events that differ from what `cursor` says was reported.

    `checkpoints`: the manifests as this process last read them (None: every partition's is read);
    `ownership`: the same for the ownership rows.
    """
    at = time.time() if now is None else now
    # Reads that take longer (every partition of a large cluster) go on at the next tick.
    deadline = time.monotonic() + READ_BUDGET_S
    out = Observed(cursor=ObservationCursor(**{**cursor.__dict__, "materialized_seqs": dict(cursor.materialized_seqs)}))
    # Every partition's records only when something that moves with them moved (three reads a node).
    signature = ownership_signature(ledger)
    full = at - cursor.ownership_at >= OWNERSHIP_EVERY_S
    rows = None
    if signature != cursor.signature or full:
        # Only the partitions whose records moved are read again, unless every partition's is due.
        rows = ownership.rows(ledger, deadline=deadline) if ownership is not None else ownership_rows(ledger)
    if rows is not None:
        out.cursor.signature = signature
        if full or ownership is None:
            out.cursor.ownership_at = at
        own = fingerprint(rows)
        if own != cursor.ownership:
            out.events += [ownership_observation(ledger, rows), live_owners_evaluation(rows)]
            out.cursor.ownership = own
        plan = fingerprint([(r["partition"], r["owner"], r["owner_alive"]) for r in rows])
        if plan != cursor.plan:
            out.events.append(assignment_observation(ledger, rows))
            out.cursor.plan = plan
    committed = None
    if at - cursor.manifests_at >= CHECKPOINT_EVERY_S:
        committed = (
            checkpoints.rows(ledger, manifests, deadline=deadline)
            if checkpoints is not None
            else checkpoint_rows(ledger, manifests)
        )
    if committed is not None:
        state = fingerprint([(r["partition"], r["seq"]) for r in committed])
        reported = {int(p): seq for p, seq in cursor.materialized_seqs.items()}
        progress = stream_progress(ledger, committed, reported)
        # Keeping up: materialized even if nothing changed (an idle, caught-up stream stays fresh).
        out.cursor.manifests_at = at  # read again in a minute either way (two reads per partition)
        if progress.keeping_up or state != cursor.manifests:
            out.events.append(checkpoint_observation(ledger, manifests, committed, progress))
            out.cursor.manifests = state
            if progress.keeping_up:
                out.cursor.materialized_seqs = {str(p): seq for p, seq in progress.seqs.items()}
    # Until the table is first seen, a look (its recorded place and log: two reads) comes sooner.
    if at - cursor.table_at >= (TABLE_EVERY_S if cursor.table else TABLE_UNSEEN_EVERY_S):
        out.cursor.table_at = at
        _observe_table(ledger, out)
    count = len(ledger.partitions())
    if count > cursor.partitions:
        out.new_partitions = [str(p) for p in range(cursor.partitions, count)]
        out.cursor.partitions = count
    return out


def _observe_table(ledger: Ledger, out: Observed) -> None:
    """Add `stream_output`'s observation to `out` if the table's version moved since the last one."""
    try:
        observation = stream_output_observation(ledger.store)
    except LaminarError as exc:  # an unreadable table must not stop the ledger's observations
        log.warning("stream_output not observed: %s", exc)
        return
    version = observation.tags.get("dagster/data_version", "") if observation is not None else ""
    if observation is not None and version != out.cursor.table:
        out.events.append(observation)
        out.cursor.table = version


#: Per store, the manifests and ownership as this code server last read them (the sensor's ticks
#: share them).
_CHECKPOINTS: dict[str, CheckpointRows] = {}
_OWNERSHIP: dict[str, OwnershipRows] = {}


@sensor(
    name="laminar_observation_sensor",
    minimum_interval_seconds=5,
    default_status=DefaultSensorStatus.RUNNING,
    description="Reports observations of the ledger assets (and the live-owner check) when the ledger "
    "changes, and the stream partitions as committed_state partitions. Launches no runs.",
)
def laminar_observation_sensor(context: SensorEvaluationContext, laminar: LaminarResource) -> SensorResult | SkipReason:
    ledger = laminar.ledger()
    if not ledger.is_initialized():
        return SkipReason(f"no cluster in {ledger.store.url}")
    cursor = ObservationCursor.decode(context.cursor)
    checkpoints = _CHECKPOINTS.setdefault(ledger.store.url, CheckpointRows())
    ownership = _OWNERSHIP.setdefault(ledger.store.url, OwnershipRows())
    observed = observe(ledger, laminar.manifests(), cursor, checkpoints=checkpoints, ownership=ownership)
    if not observed.events and not observed.new_partitions:
        return SkipReason("nothing changed since the last observation")
    requests = (
        [AddDynamicPartitionsRequest(LAMINAR_PARTITIONS.name or "", observed.new_partitions)]
        if observed.new_partitions
        else []
    )
    return SensorResult(
        asset_events=observed.events, dynamic_partitions_requests=requests, cursor=observed.cursor.encode()
    )
