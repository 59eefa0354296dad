"""The anti-entropy sweep: remove output and checkpoint objects no manifest names.

Fenced writes upload their objects before publishing the manifest that names
them; a writer that loses ownership (or crashes) in between leaves objects that
readers never see. The sweep deletes such an object only when it can never
become visible: its epoch is below the partition's current manifest fencing
token (its writer can no longer publish), or it is older than a grace period.
Deletion is conditional on the ETag read, so a concurrent rewrite is never lost.
This lists the store: it is an audit path, never a hot one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .identity import PartitionId
from .ledger import Ledger
from .manifest import ManifestReader, _decode_ulid
from .store import ObjectNotFound, ObjectStore, PreconditionFailed

SWEPT_PREFIXES = ("sink/", "checkpoints/")


@dataclass
class SweepReport:
    scanned: int = 0
    referenced: int = 0
    deleted: list[str] = field(default_factory=list)
    kept_in_grace: list[str] = field(default_factory=list)


def _age_s(key: str, now_s: float) -> float | None:
    """Object names end in a ULID; its first 48 bits are the creation time in ms."""
    stem = key.rsplit("/", 1)[-1].split(".", 1)[0]
    ulid = stem.rsplit("-", 1)[-1]
    try:
        created_ms = _decode_ulid(ulid) >> 80
    except ValueError:
        return None
    return now_s - created_ms / 1000.0


def sweep(store: ObjectStore, *, grace_s: float = 3600.0, dry_run: bool = False) -> SweepReport:
    """Delete unreferenced `sink/` and `checkpoints/` objects that can never be published."""
    ledger = Ledger(store)
    reader = ManifestReader(store)
    referenced: set[str] = set()
    tokens: dict[int, int] = {}
    for p in ledger.partitions():
        for version in reader.history(PartitionId(p)):
            m = version.manifest
            referenced.update(ref.key for ref in m.artifacts())
            tokens[p] = m.fencing_token
    report = SweepReport()
    now_s = time.time()
    for prefix in SWEPT_PREFIXES:
        for key in store.list(prefix):
            report.scanned += 1
            if key in referenced:
                report.referenced += 1
                continue
            meta = store.head(key)
            if meta is None:
                continue
            try:
                partition = int(meta.metadata.get("x-laminar-partition", "-1"))
                epoch = int(meta.metadata.get("x-laminar-epoch", "-1"))
            except ValueError:
                continue  # not ours: leave foreign objects alone
            superseded = 0 <= epoch < tokens.get(partition, 0)
            age = _age_s(key, now_s)
            expired = age is not None and age > grace_s
            if not (superseded or expired):
                report.kept_in_grace.append(key)
                continue
            report.deleted.append(key)
            if not dry_run:
                try:
                    store.delete_if_match(key, meta.etag)
                except (PreconditionFailed, ObjectNotFound):
                    report.deleted.pop()
    return report
