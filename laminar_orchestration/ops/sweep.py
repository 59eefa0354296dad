"""The anti-entropy sweep: remove output and checkpoint objects no manifest names.

Fenced writes upload their objects before publishing the manifest that names
them; a writer that loses ownership (or crashes) in between leaves objects that
readers never see. The sweep deletes such an object only when it can never
become visible: its epoch is strictly below both the partition's current
ledger epoch and the latest fencing token of its manifest chain (a publish
under that epoch is rejected from then on), and no manifest names it. Age is
never a reason to delete, only an extra margin (`grace_s`): an owner stalled
between upload and publish, or one whose clock is behind, keeps its objects.
Deletion is conditional on the ETag read, so a concurrent rewrite is never lost.
This lists the store: it is an audit path, never a hot one.

An unreferenced object under ``sink/`` or ``checkpoints/`` whose key does not
parse (`keys.parse_fenced_object_key`) is an orphan too: the code writes only
keys it can parse back, so no honest writer will ever publish one, and keeping
them would let whoever holds a node's keys fill the store with objects nothing
removes. It goes once it is `grace_s` old by the store's own clock (the key
carries no ULID); a backend that does not report when an object was written
keeps it unless `grace_s` is 0. Nothing outside those two prefixes is touched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laminar_orchestration import clock
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.ops.errors import InvalidGracePeriod
from laminar_orchestration.protocol.chain import ManifestReader
from laminar_orchestration.protocol.keys import (
    FENCED_OBJECT_PREFIXES,
    FencedObjectName,
    UnparseableObjectKey,
    parse_fenced_object_key,
)
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.store import ObjectNotFound, ObjectStore, PreconditionFailed

#: Default minimum age of an object before the sweep may delete it.
DEFAULT_GRACE_S = 3600.0

PARTITION_METADATA = "x-laminar-partition"
EPOCH_METADATA = "x-laminar-epoch"


@dataclass
class SweepReport:
    """What one sweep saw and did (JSON-ready through `to_json`)."""

    scanned: int = 0
    referenced: int = 0
    deleted: list[str] = field(default_factory=list)
    #: Sealed (never publishable) but younger than the grace period.
    kept_in_grace: list[str] = field(default_factory=list)
    #: Epoch not below the ledger epoch and the chain's fencing token: its writer may still publish it.
    kept_unsealed: list[str] = field(default_factory=list)
    #: Name and metadata disagree: kept, key -> why.
    kept_unverified: dict[str, str] = field(default_factory=dict)
    #: Unreferenced objects whose key does not parse, key -> why: orphans, each also in `deleted`
    #: or (younger than the grace period) in `kept_in_grace`.
    unparseable: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON."""
        return {
            "scanned": self.scanned,
            "referenced": self.referenced,
            "deleted": list(self.deleted),
            "kept_in_grace": list(self.kept_in_grace),
            "kept_unsealed": list(self.kept_unsealed),
            "kept_unverified": dict(self.kept_unverified),
            "unparseable": dict(self.unparseable),
        }


def _metadata_mismatch(name: FencedObjectName, metadata: Mapping[str, str]) -> str | None:
    for field_name, expected in ((PARTITION_METADATA, name.partition), (EPOCH_METADATA, name.epoch)):
        raw = metadata.get(field_name)
        if raw is None:
            return f"no {field_name} metadata"
        try:
            value = int(raw)
        except ValueError:
            return f"{field_name} metadata {raw!r} is not an integer"
        if value != expected:
            return f"{field_name} metadata {value} disagrees with the key ({expected})"
    return None


def sweep(
    store: ObjectStore,
    *,
    grace_s: float = DEFAULT_GRACE_S,
    dry_run: bool = False,
    read_parallelism: int | None = None,
) -> SweepReport:
    """Delete unreferenced `sink/` and `checkpoints/` objects that can never be published.

    An object is deleted only when its epoch (from its key, confirmed by its
    metadata) is strictly below the partition's ledger epoch and below the
    latest fencing token of its manifest chain, no manifest names it, and it
    is at least `grace_s` old. An unreferenced object whose key does not parse
    is deleted once it is `grace_s` old by the store's `last_modified` (see the
    module). Raises InvalidGracePeriod for a negative or NaN `grace_s`. Ages
    are measured by the clock in effect (`clock.current()`); `read_parallelism`
    is the ledger's (None: its default for the store).
    """
    if math.isnan(grace_s) or grace_s < 0:
        raise InvalidGracePeriod(grace_s)
    ledger = Ledger(store, read_parallelism=read_parallelism)
    reader = ManifestReader(store)
    partitions = ledger.partitions()
    # Epochs and tokens only grow and are read before the listing, so a stale
    # value can only keep an object, never delete a publishable one.
    epochs = {int(p): (own.epoch if own else 0) for p, own in ledger.ownerships(partitions).items()}
    referenced: set[str] = set()
    tokens: dict[int, int] = {}
    for p in partitions:
        for version in reader.history(PartitionId(p)):
            m = version.manifest
            referenced.update(ref.key for ref in m.artifacts())
            tokens[int(p)] = max(tokens.get(int(p), 0), m.fencing_token)
    report = SweepReport()
    now_ms = clock.current().now().timestamp() * 1000.0

    def delete(key: str, etag: str) -> None:
        report.deleted.append(key)
        if not dry_run:
            try:
                store.delete_if_match(key, etag)
            except (PreconditionFailed, ObjectNotFound):
                report.deleted.pop()

    for prefix in FENCED_OBJECT_PREFIXES:
        for key in store.list(prefix):
            if not key.startswith(FENCED_OBJECT_PREFIXES):
                continue  # only output and checkpoints: never the ledger, manifests, source or grant keys
            report.scanned += 1
            if key in referenced:
                report.referenced += 1
                continue
            try:
                name = parse_fenced_object_key(key)
            except UnparseableObjectKey as exc:
                meta = store.head(key)
                if meta is None:
                    continue
                report.unparseable[key] = exc.reason
                if meta.last_modified is None:
                    old_enough = grace_s == 0  # the backend does not say when: only no grace at all deletes it
                else:
                    old_enough = now_ms - meta.last_modified.timestamp() * 1000.0 >= grace_s * 1000.0
                if old_enough:
                    delete(key, meta.etag)
                else:
                    report.kept_in_grace.append(key)
                continue
            meta = store.head(key)
            if meta is None:
                continue
            mismatch = _metadata_mismatch(name, meta.metadata)
            if mismatch is not None:
                report.kept_unverified[key] = mismatch
                continue
            sealed = name.epoch < tokens.get(name.partition, 0) and name.epoch < epochs.get(name.partition, 0)
            if not sealed:
                report.kept_unsealed.append(key)
                continue
            if now_ms - name.created_ms < grace_s * 1000.0:
                report.kept_in_grace.append(key)
                continue
            delete(key, meta.etag)
    return report
