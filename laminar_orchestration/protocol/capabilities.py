"""Write capabilities split by prefix: misuse is a type error, not a code-review finding.

Code that may write ledger records, code that may write checkpoints/state and
code that may commit output each receive only their own interface; the key
types are distinct `NewType`s, so handing the wrong key or calling the wrong
method is a type error (`mypy --strict`) and, at run time, a `ValueError`.

| capability          | prefix (write)                 | held by                       |
|---------------------|--------------------------------|-------------------------------|
| `LedgerWriter`      | ``ledger/``                    | the ledger (control plane; a node: its own record, releases) |
| `CheckpointWriter`  | ``checkpoints/``               | a node, per owned partition   |
| `OutputCommitter`   | ``sink/``, ``manifests/``      | a node, per owned partition   |
| `ManifestSealer`    | ``manifests/``                 | the ledger's grant path       |
| `SigningKeyWriter`  | ``grant-keys/``                | the ledger's grant path       |
| `SourceAppender`    | ``source/``                    | producers                     |

`storage_policies()` renders the split the store enforces: one IAM policy per
role (control plane, each node, producer, auditor) with exactly the reads,
conditional writes and deletes the code makes under that role, and a bucket
policy with what only S3 can check (conditional-write headers, no deletes of
ledger, manifests or source). The keys are `keys`' patterns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NewType

from laminar_orchestration.protocol import keys
from laminar_orchestration.protocol.keys import (
    CHECKPOINTS_PREFIX,
    GRANT_KEYS_PREFIX,
    LEDGER_PREFIX,
    MANIFESTS_PREFIX,
    PREFIXES,
    SINK_PREFIX,
    SOURCE_PREFIX,
)
from laminar_orchestration.store import ObjectMeta, ObjectStore, StoredObject

LedgerKey = NewType("LedgerKey", str)
CheckpointKey = NewType("CheckpointKey", str)
SinkKey = NewType("SinkKey", str)
ManifestKey = NewType("ManifestKey", str)
SourceKey = NewType("SourceKey", str)
GrantKeysKey = NewType("GrantKeysKey", str)


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


def grant_keys_key(key: str) -> GrantKeysKey:
    return GrantKeysKey(_scoped(key, GRANT_KEYS_PREFIX))


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


class SigningKeyWriter(ReadStore):
    """Writes grants' private signing keys under ``grant-keys/``, create-only: the ledger's grant path."""

    def create_signing_key(self, key: GrantKeysKey, data: bytes) -> str:
        return self._store.put_if_absent(_scoped(key, GRANT_KEYS_PREFIX), data)


class SourceAppender(ReadStore):
    """Appends to the input log under ``source/``."""

    def create_source(self, key: SourceKey, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        return self._store.put_if_absent(_scoped(key, SOURCE_PREFIX), data, metadata)

    def swap_source(self, key: SourceKey, data: bytes, etag: str) -> str:
        return self._store.put_if_match(_scoped(key, SOURCE_PREFIX), data, etag)


# --- storage policies: the same split, enforced by the store -------------------------------------

#: The roles, each a process kind with its own credentials.
CONTROL_PLANE_ROLE = "control-plane"
PRODUCER_ROLE = "producer"
AUDITOR_ROLE = "auditor"


def node_role(node: int) -> str:
    """The role name of worker node `node` (one role per node: it may write only its own node record)."""
    return f"node-{node}"


@dataclass(frozen=True)
class RoleAccess:
    """What one role may do, as key patterns relative to the store's prefix (see `keys`)."""

    #: Keys it reads (GET and HEAD) and may probe for absence (ListBucket on these prefixes, for 404s).
    reads: tuple[str, ...]
    #: Keys it writes (PUT, always conditional).
    writes: tuple[str, ...]
    #: Keys it deletes (conditional DELETE).
    deletes: tuple[str, ...] = ()
    #: Key prefixes it lists (beyond the absence probes).
    lists: tuple[str, ...] = ()
    #: Keys it reads only by the name a record gives it (GET, no listing): they exist, so it never
    #: needs a 404 from them, and the prefix's names stay unlisted.
    named_reads: tuple[str, ...] = ()
    #: The output table's objects, written by delta-rs: its log entries conditionally, its data files
    #: and checkpoints with a plain PUT. Not protocol state: `laminar verify` audits the table
    #: against the manifest chains, and `laminar table rebuild` recreates it from them.
    table_writes: tuple[str, ...] = ()


def role_access(nodes: Sequence[int] = (1,)) -> dict[str, RoleAccess]:
    """Every role's access, exactly what the code does under that role.

    * control plane (CLI `init/migrate/failover/rebalance/status`, the Dagster code location):
      mints grants with their signing keys (and seals the chain a grant fences, signed with the
      grant's key), moves ownership heads, records desired state and membership (and, at `init`,
      the stream's schema and processor and where the output table is); reads the source heads for
      lag; lists node records to find new nodes.
    * node N: its own node record, release records, the manifest chain it publishes, and the
      checkpoints and output under its own node (any partition's, no other node's); reads the
      signing keys of its own grants and no other node's. No grant, head, desired state,
      membership or source write; deletes nothing.
    * producer: source segments, source heads and the log ends; reads the cluster and stream records, the manifests
      (backpressure: lag = written - committed), the grants (whose public keys verify them) and
      the node records (whose generations tell a restarted writer's earlier incarnation apart,
      and whose nudge addresses, with the membership record, its source doorbell rings).
    * auditor (`verify`, `sweep`, `status`, `query`, `report`): reads and lists everything but
      the grants' private keys, deletes only unreferenced fenced objects (output and checkpoints)
      in the sweep.
    * the output table at its default place (`keys.OUTPUT_TABLE_PREFIX`): the nodes that keep it
      read it and write its log and their own data folder (`keys.table_node_folder`), nothing
      else under ``tables/``; the control plane (`laminar table`, the maintenance job, which also
      deletes there) reads and writes all of it; a table placed elsewhere (`laminar init
      --output-table`) needs its own grants.
    """
    all_prefixes = tuple(p for p in PREFIXES.values() if p != keys.GRANT_KEYS_PREFIX)
    # The record of where the output table is: every process that keeps or shows the table reads it.
    node_reads = (
        keys.LEDGER_PREFIX,
        keys.MANIFESTS_PREFIX,
        keys.CHECKPOINTS_PREFIX,
        keys.SOURCE_PREFIX,
        keys.OUTPUT_TABLE_KEY,
        keys.OUTPUT_TABLE_PREFIX,
    )
    access = {
        CONTROL_PLANE_ROLE: RoleAccess(
            reads=(*node_reads, keys.GRANT_KEYS_PREFIX),
            writes=(
                keys.CLUSTER_KEY,
                keys.MEMBERSHIP_KEY,
                keys.OWNERSHIP_HEADS_PATTERN,
                keys.GRANTS_PATTERN,
                keys.DESIRED_STATES_PATTERN,
                keys.ASSIGNMENTS_PATTERN,
                keys.MANIFEST_HISTORY_PATTERN,
                keys.MANIFEST_POINTERS_PATTERN,
                keys.SIGNING_KEYS_PATTERN,
                keys.OUTPUT_TABLE_KEY,  # `laminar init --output-table`
                keys.STREAM_KEY,  # `laminar init --schema --processor`
            ),
            # Its listing of the node records (`Membership.nodes`) is inside its ``ledger/`` reads.
            table_writes=(keys.OUTPUT_TABLE_PREFIX,),
            deletes=(keys.OUTPUT_TABLE_PREFIX,),  # the maintenance job's vacuum
        ),
        PRODUCER_ROLE: RoleAccess(
            reads=(
                keys.CLUSTER_KEY,
                keys.STREAM_KEY,  # the schema its appends are checked against
                keys.MEMBERSHIP_KEY,
                keys.GRANTS_PATTERN,
                keys.NODE_RECORDS_PATTERN,
                keys.MANIFESTS_PREFIX,
                keys.SOURCE_PREFIX,
            ),
            writes=(keys.SEGMENTS_PATTERN, keys.SOURCE_HEADS_PATTERN, keys.LOG_ENDS_KEY),
        ),
        AUDITOR_ROLE: RoleAccess(
            # `verify` audits the output table too.
            reads=(*all_prefixes, keys.TABLES_PREFIX),
            writes=(),
            deletes=(keys.CHECKPOINT_OBJECTS_PATTERN, keys.OUTPUT_OBJECTS_PATTERN),
            lists=(*all_prefixes, keys.TABLES_PREFIX),
        ),
    }
    for n in nodes:
        access[node_role(n)] = RoleAccess(
            reads=(*node_reads, keys.node_signing_keys_prefix(n)),
            writes=(
                keys.node_key(n),
                keys.move_report_key(n),
                keys.RELEASES_PATTERN,
                keys.MANIFEST_HISTORY_PATTERN,
                keys.MANIFEST_POINTERS_PATTERN,
                # Under its own node only: another node's checkpoints and output are not its to write.
                keys.node_checkpoint_objects_pattern(n),
                keys.node_output_objects_pattern(n),
            ),
            # The table's log, and data files under its own folder only: another node's committed
            # data file is not its to replace (nor to delete: nodes delete nothing).
            table_writes=(keys.OUTPUT_TABLE_LOG_PREFIX, keys.OUTPUT_TABLE_PREFIX + keys.table_node_folder(n)),
            # Committed output, by the names the manifests give: a partition's new owner appends to the
            # output table the batches its predecessor committed but did not append (killed first).
            named_reads=(keys.OUTPUT_OBJECTS_PATTERN,),
        )
    return access


#: Objects written once (If-None-Match) and never again.
CREATE_ONLY_PATTERNS: tuple[str, ...] = (
    keys.GRANTS_PATTERN,
    keys.RELEASES_PATTERN,
    keys.MANIFEST_HISTORY_PATTERN,
    keys.SEGMENTS_PATTERN,
    keys.CHECKPOINT_OBJECTS_PATTERN,
    keys.OUTPUT_OBJECTS_PATTERN,
    keys.SIGNING_KEYS_PATTERN,
    keys.STREAM_KEY,
)
#: Objects created once (If-None-Match) and then only swapped (If-Match).
CAS_PATTERNS: tuple[str, ...] = (
    keys.CLUSTER_KEY,
    keys.MEMBERSHIP_KEY,
    keys.NODE_RECORDS_PATTERN,
    keys.OWNERSHIP_HEADS_PATTERN,
    keys.DESIRED_STATES_PATTERN,
    keys.ASSIGNMENTS_PATTERN,
    keys.MOVE_REPORTS_PATTERN,
    keys.MANIFEST_POINTERS_PATTERN,
    keys.SOURCE_HEADS_PATTERN,
    keys.LOG_ENDS_KEY,
    keys.OUTPUT_TABLE_KEY,
)
#: Prefixes nothing ever deletes from.
NEVER_DELETED: tuple[str, ...] = (keys.LEDGER_PREFIX, keys.MANIFESTS_PREFIX, keys.SOURCE_PREFIX, keys.GRANT_KEYS_PREFIX)


def _base(prefix: str) -> str:
    stripped = prefix.strip("/")
    return f"{stripped}/" if stripped else ""


def _wild(pattern: str) -> str:
    """A prefix ends in '/': it covers every key under it."""
    return f"{pattern}*" if pattern.endswith("/") else pattern


def identity_policy(bucket: str, prefix: str, access: RoleAccess) -> dict[str, Any]:
    """One role's IAM policy: GET/HEAD, conditional PUT and DELETE on its keys, ListBucket on its prefixes."""
    base = _base(prefix)

    def objects(patterns: Sequence[str]) -> list[str]:
        return [f"arn:aws:s3:::{bucket}/{base}{_wild(p)}" for p in patterns]

    statements: list[dict[str, Any]] = [
        {
            "Sid": "Read",
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": objects((*access.reads, *access.named_reads)),
        },
        {
            # A GET/HEAD of a missing key answers 404 only to a principal that may list it (403 otherwise),
            # and every probe (grant e+1, manifest seq+1, the segment at the log's end) depends on the 404.
            "Sid": "ListForAbsenceAndAudit",
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": [f"arn:aws:s3:::{bucket}"],
            "Condition": {"StringLike": {"s3:prefix": [f"{base}{_wild(p)}" for p in (*access.reads, *access.lists)]}},
        },
    ]
    if access.writes or access.table_writes:
        statements.append(
            {
                "Sid": "Write",
                "Effect": "Allow",
                "Action": ["s3:PutObject"],
                "Resource": objects((*access.writes, *access.table_writes)),
            }
        )
    if access.deletes:
        statements.append(
            {"Sid": "Delete", "Effect": "Allow", "Action": ["s3:DeleteObject"], "Resource": objects(access.deletes)}
        )
    return {"Version": "2012-10-17", "Statement": statements}


def bucket_policy(bucket: str, prefix: str) -> dict[str, Any]:
    """The bucket policy: what only S3 can enforce, for every principal (conditions on the request).

    * a create-only object is written with If-None-Match or not at all (a grant, a release, a
      manifest entry, a segment, a fenced object can never be overwritten);
    * a CAS object is written with If-None-Match or If-Match (no blind overwrite of a head,
      a pointer, a node record, the desired state, the membership or the cluster record);
    * nothing is deleted from ``ledger/``, ``manifests/``, ``source/`` or ``grant-keys/``.
    """
    base = _base(prefix)

    def objects(patterns: Sequence[str]) -> list[str]:
        return [f"arn:aws:s3:::{bucket}/{base}{_wild(p)}" for p in patterns]

    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "CreateOnlyNeedsIfNoneMatch",
                "Effect": "Deny",
                "Principal": "*",
                "Action": ["s3:PutObject"],
                "Resource": objects(CREATE_ONLY_PATTERNS),
                "Condition": {"Null": {"s3:if-none-match": "true"}},
            },
            {
                "Sid": "LedgerManifestAndSourceWritesAreConditional",
                "Effect": "Deny",
                "Principal": "*",
                "Action": ["s3:PutObject"],
                "Resource": objects((*CAS_PATTERNS, *NEVER_DELETED)),
                "Condition": {"Null": {"s3:if-none-match": "true", "s3:if-match": "true"}},
            },
            {
                "Sid": "NeverDeleted",
                "Effect": "Deny",
                "Principal": "*",
                "Action": ["s3:DeleteObject", "s3:DeleteObjectVersion"],
                "Resource": objects(NEVER_DELETED),
            },
        ],
    }


@dataclass(frozen=True)
class StoragePolicies:
    """Every role's IAM policy and the bucket policy, for one bucket and key prefix."""

    bucket: str
    prefix: str
    roles: Mapping[str, dict[str, Any]]
    bucket_policy: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "prefix": self.prefix,
            "roles": dict(self.roles),
            "bucket_policy": self.bucket_policy,
        }


def storage_policies(bucket: str, prefix: str = "", *, nodes: Sequence[int] = (1,)) -> StoragePolicies:
    """The roles' IAM policies (`role_access`) and the bucket policy, rendered for `bucket` and `prefix`.

    A node's policy is per node (`node_role`): it may write only its own node record.
    """
    roles = {role: identity_policy(bucket, prefix, access) for role, access in role_access(nodes).items()}
    return StoragePolicies(bucket, prefix.strip("/"), roles, bucket_policy(bucket, prefix))


def partition_session_policy(bucket: str, prefix: str, node: int, partitions: Sequence[int]) -> dict[str, Any]:
    """A session policy for short-lived credentials of `node` limited to the partitions granted to it.

    Passed as ``Policy`` to STS ``AssumeRole`` on the node's role by the control plane, it narrows
    the node's static writes (any partition's manifests, checkpoints, output and releases) to
    `partitions`; the node record stays writable. The effective access is the intersection with
    the role's policy, so it can only take away.
    """
    base = _base(prefix)
    writes = [
        keys.node_key(node),
        keys.move_report_key(node),
        *(pattern for p in partitions for pattern in keys.partition_write_patterns(p, node)),
    ]
    reads = (
        keys.LEDGER_PREFIX,
        keys.MANIFESTS_PREFIX,
        keys.CHECKPOINTS_PREFIX,
        keys.SOURCE_PREFIX,
        keys.node_signing_keys_prefix(node),
    )
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/{base}{_wild(r)}" for r in reads],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [f"{base}{_wild(r)}" for r in reads]}},
            },
            {
                "Effect": "Allow",
                "Action": ["s3:PutObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/{base}{w}" for w in writes],
            },
        ],
    }
