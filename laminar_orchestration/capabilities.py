"""Write capabilities split by prefix: misuse is a type error, not a code-review finding.

Code that may write ledger records, code that may write checkpoints/state and
code that may commit output each receive only their own interface; the key
types are distinct `NewType`s, so handing the wrong key or calling the wrong
method is a type error (`mypy --strict`) and, at run time, a `ValueError`.

| capability          | prefix (write)                 | held by                       |
|---------------------|--------------------------------|-------------------------------|
| `LedgerWriter`      | ``ledger/``                    | the ledger (control plane)    |
| `CheckpointWriter`  | ``checkpoints/``               | a node, per owned partition   |
| `OutputCommitter`   | ``sink/``, ``manifests/``      | a node, per owned partition   |
| `ManifestSealer`    | ``manifests/``                 | the ledger's grant path       |
| `SourceAppender`    | ``source/``                    | producers                     |

`storage_policies()` renders the same split as per-principal S3 bucket policies.
The prefixes are `keys.PREFIXES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NewType

from .keys import CHECKPOINTS_PREFIX, LEDGER_PREFIX, MANIFESTS_PREFIX, PREFIXES, SINK_PREFIX, SOURCE_PREFIX
from .store import ObjectMeta, ObjectStore, StoredObject

LedgerKey = NewType("LedgerKey", str)
CheckpointKey = NewType("CheckpointKey", str)
SinkKey = NewType("SinkKey", str)
ManifestKey = NewType("ManifestKey", str)
SourceKey = NewType("SourceKey", str)


def _scoped(key: str, prefix: str) -> str:
    if not key.startswith(prefix):
        raise ValueError(f"key {key!r} is outside the {prefix!r} prefix of this capability")
    return key


def ledger_key(key: str) -> LedgerKey:
    return LedgerKey(_scoped(key, LEDGER_PREFIX))


def checkpoint_key(key: str) -> CheckpointKey:
    return CheckpointKey(_scoped(key, CHECKPOINTS_PREFIX))


def sink_key(key: str) -> SinkKey:
    return SinkKey(_scoped(key, SINK_PREFIX))


def manifest_key(key: str) -> ManifestKey:
    return ManifestKey(_scoped(key, MANIFESTS_PREFIX))


def source_key(key: str) -> SourceKey:
    return SourceKey(_scoped(key, SOURCE_PREFIX))


class ReadStore:
    """Reads by explicit key (get, head). No listing: that is `AuditReader`'s."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    def get(self, key: str) -> StoredObject | None:
        return self._store.get_or_none(key)

    def head(self, key: str) -> ObjectMeta | None:
        return self._store.head(key)


class LedgerWriter(ReadStore):
    """Writes under ``ledger/`` only: create-only records and CAS pointers."""

    def create(self, key: LedgerKey, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        return self._store.put_if_absent(_scoped(key, LEDGER_PREFIX), data, metadata)

    def swap(self, key: LedgerKey, data: bytes, etag: str) -> str:
        return self._store.put_if_match(_scoped(key, LEDGER_PREFIX), data, etag)


class CheckpointWriter(ReadStore):
    """Writes state snapshots under ``checkpoints/``, create-only, with fencing metadata."""

    def put_checkpoint(self, key: CheckpointKey, data: bytes, metadata: Mapping[str, str]) -> str:
        return self._store.put_if_absent(_scoped(key, CHECKPOINTS_PREFIX), data, metadata)


class OutputCommitter(ReadStore):
    """Writes output files under ``sink/`` and publishes manifests under ``manifests/``."""

    def put_output(self, key: SinkKey, data: bytes, metadata: Mapping[str, str]) -> str:
        return self._store.put_if_absent(_scoped(key, SINK_PREFIX), data, metadata)

    def create_manifest(self, key: ManifestKey, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        return self._store.put_if_absent(_scoped(key, MANIFESTS_PREFIX), data, metadata)

    def swap_manifest(self, key: ManifestKey, data: bytes, etag: str) -> str:
        return self._store.put_if_match(_scoped(key, MANIFESTS_PREFIX), data, etag)


class ManifestSealer(ReadStore):
    """Writes manifest history entries and the pointer under ``manifests/``: the seal a grant puts
    on a partition's manifest chain. No output, no checkpoint, no ledger record."""

    def create_manifest(self, key: ManifestKey, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        return self._store.put_if_absent(_scoped(key, MANIFESTS_PREFIX), data, metadata)

    def swap_manifest(self, key: ManifestKey, data: bytes, etag: str) -> str:
        return self._store.put_if_match(_scoped(key, MANIFESTS_PREFIX), data, etag)


class SourceAppender(ReadStore):
    """Appends to the input log under ``source/``."""

    def create_source(self, key: SourceKey, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        return self._store.put_if_absent(_scoped(key, SOURCE_PREFIX), data, metadata)

    def swap_source(self, key: SourceKey, data: bytes, etag: str) -> str:
        return self._store.put_if_match(_scoped(key, SOURCE_PREFIX), data, etag)


def storage_policies(bucket: str, prefix: str = "") -> dict[str, dict[str, object]]:
    """Per-principal S3 policies mirroring the capability split.

    Only the anti-entropy/audit principal may list; the node's fast path may not.
    """
    base = f"arn:aws:s3:::{bucket}/{prefix.strip('/') + '/' if prefix.strip('/') else ''}"

    def statement(actions: list[str], prefixes: list[str]) -> dict[str, object]:
        return {
            "Effect": "Allow",
            "Action": actions,
            "Resource": [f"{base}{PREFIXES[p]}*" for p in prefixes],
        }

    read_all = statement(["s3:GetObject"], list(PREFIXES))
    write = ["s3:PutObject", "s3:DeleteObject"]
    return {
        # Granting an epoch seals the partition's manifest chain (see `ManifestSealer`).
        "control-plane": {"Version": "2012-10-17", "Statement": [read_all, statement(write, ["ledger", "manifests"])]},
        "node": {
            "Version": "2012-10-17",
            "Statement": [
                read_all,
                # Nodes take grants, record releases and heartbeat (ledger/); inside the
                # node only the reconcile loop holds the LedgerWriter, batches never do.
                statement(write, ["checkpoints", "sink", "manifests", "ledger"]),
            ],
        },
        "producer": {"Version": "2012-10-17", "Statement": [read_all, statement(write, ["source"])]},
        "auditor": {
            "Version": "2012-10-17",
            "Statement": [
                read_all,
                {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{bucket}"]},
            ],
        },
    }
