"""Persisted ledger records (pydantic). Where each one is stored is spelled in `keys`.

Every record carries a `write_id`: a random nonce that makes its bytes unique,
so a writer whose response was lost can tell its own write from another's.
"""

from __future__ import annotations

import enum
import json
from datetime import datetime
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from laminar_orchestration import clock
from laminar_orchestration.errors import CorruptDataError, LaminarError
from laminar_orchestration.store import StoredObject

M = TypeVar("M", bound=BaseModel)


class LedgerError(LaminarError):
    """Base of ledger errors."""


class CorruptLedgerObject(LedgerError, CorruptDataError):
    """A ledger object that cannot be parsed. Nothing overwrites it."""

    key: str
    reason: str

    message = "corrupt ledger object {key!r}: {reason}"


def parse_record(key: str, data: bytes, model: type[M]) -> M:
    """Parse one ledger object or raise CorruptLedgerObject naming it."""
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "<root>"
        raise CorruptLedgerObject(key, f"{where}: {first.get('msg')}") from exc
    except ValueError as exc:
        raise CorruptLedgerObject(key, str(exc)) from exc


class ParsedRecords:
    """Ledger records parsed once per version: a record is immutable per ETag, and the control plane
    and nodes read the same few records over and over."""

    def __init__(self, limit: int = 50_000) -> None:
        self._limit = limit
        self._parsed: dict[str, tuple[str, BaseModel]] = {}

    def parse(self, obj: StoredObject, model: type[M]) -> M:
        """`obj` parsed as `model` (CorruptLedgerObject naming it if it is not one)."""
        cached = self._parsed.get(obj.key)
        if cached is not None and cached[0] == obj.etag and isinstance(cached[1], model):
            return cached[1]
        record = parse_record(obj.key, obj.data, model)
        if len(self._parsed) >= self._limit:
            self._parsed.clear()
        self._parsed[obj.key] = (obj.etag, record)
        return record


FORMAT_VERSION = 1


def now() -> datetime:
    """The current time by the clock in effect (`clock.current`)."""
    return clock.current().now()


def new_write_id() -> str:
    """A random 16-hex-digit nonce from the clock in effect's entropy."""
    return clock.current().random_bytes(8).hex()


class Record(BaseModel):
    """Base of persisted records: strict about unknown fields so typos surface."""

    model_config = ConfigDict(extra="forbid", frozen=True)


#: An Ed25519 public key or private key (32 bytes), hex.
KEY_HEX_PATTERN = r"^[0-9a-f]{64}$"
#: An Ed25519 signature (64 bytes), hex.
SIGNATURE_HEX_PATTERN = r"^[0-9a-f]{128}$"


class SignedRecord(Record):
    """A record that counts only with a signature by the private key of its epoch's grant (`signing`)."""

    #: Ed25519 signature over `signed_bytes()`; None on a record nobody signed (it counts as forged).
    signature: str | None = Field(default=None, pattern=SIGNATURE_HEX_PATTERN)

    def signed_bytes(self) -> bytes:
        """The canonical bytes the signature covers: every field but the signature, keys sorted."""
        body = self.model_dump(mode="json", exclude={"signature"})
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class ClusterRecord(Record):
    """Created once by `laminar init`."""

    kind: Literal["cluster"] = "cluster"
    format_version: int = FORMAT_VERSION
    cluster_id: str
    partitions: int = Field(ge=1)
    created_at: datetime
    reinitialized_at: datetime | None = None
    write_id: str = Field(default_factory=new_write_id)


class PartitionStatus(enum.StrEnum):
    UNASSIGNED = "unassigned"
    ACTIVE = "active"
    RELEASED = "released"


class PartitionHead(Record):
    """CAS pointer naming the current owner, so readers need no listing.

    It may lag the immutable grants (a grantee died before moving it); readers
    roll forward by probing the next grant keys.
    """

    kind: Literal["partition-head"] = "partition-head"
    partition: int = Field(ge=0)
    epoch: int = Field(ge=0)
    owner: int = Field(ge=0)
    status: PartitionStatus
    updated_at: datetime
    write_id: str = Field(default_factory=new_write_id)


class GrantKind(enum.StrEnum):
    #: Graceful: the previous epoch was released first.
    ACQUIRE = "acquire"
    #: Forced: the previous owner is fenced out without its cooperation.
    FENCE = "fence"


class EpochGrant(Record):
    """Immutable, create-only: partition `partition` belongs to `node` at `epoch`. Never deleted."""

    kind: Literal["epoch-grant"] = "epoch-grant"
    partition: int = Field(ge=0)
    epoch: int = Field(ge=1)
    node: int = Field(ge=0)
    grant_kind: GrantKind
    previous_epoch: int = Field(ge=0)
    previous_owner: int = Field(ge=0)
    #: The grantee's node generation when known: a restarted node never adopts
    #: an epoch granted to its previous incarnation (which may still be a zombie).
    generation: int | None = None
    reason: str = ""
    granted_at: datetime
    #: The public half of this grant's signing key: every manifest entry and release at this epoch
    #: must verify with it. None only on grants made before grants carried keys (nothing verifies).
    public_key: str | None = Field(default=None, pattern=KEY_HEX_PATTERN)
    write_id: str = Field(default_factory=new_write_id)


class ReleaseRecord(SignedRecord):
    """Immutable, create-only: the owner of `epoch` stopped and handed over `commit_ulid`."""

    kind: Literal["release"] = "release"
    partition: int = Field(ge=0)
    epoch: int = Field(ge=1)
    node: int = Field(ge=1)
    commit_ulid: str | None
    source_offset: int = Field(ge=0)
    released_at: datetime
    write_id: str = Field(default_factory=new_write_id)


class NodeStatus(enum.StrEnum):
    ALIVE = "alive"
    LEAVING = "leaving"
    LEFT = "left"


class PartitionProgress(Record):
    """A node's report on one partition it runs or is moving, read by the coordinator."""

    partition: int = Field(ge=0)
    epoch: int = Field(ge=0)
    #: running | warming | restoring | draining | released | failed | revoked | stopped | standby
    state: str
    migration_id: str | None = None
    #: The last migration phase (a `MigrationPhase` value) this node completed.
    phase_done: str | None = None
    bytes_moved: int = Field(default=0, ge=0)
    source_offset: int = Field(default=0, ge=0)
    events_committed: int = Field(default=0, ge=0)
    commits: int = Field(default=0, ge=0)
    last_commit_at: datetime | None = None
    error: str | None = None
    #: Failures in a row of this partition's worker on this node (reset by a successful commit).
    consecutive_failures: int = Field(default=0, ge=0)
    #: The last of those failures, while `consecutive_failures` > 0.
    last_failure: str | None = None
    #: The delay before the restart that followed the last failure.
    retry_delay_s: float | None = Field(default=None, ge=0)
    #: A standby's or a warming migration target's distance behind the committed state, in events.
    lag: int | None = Field(default=None, ge=0)


class RequestReport(Record):
    """The store requests a process sent, as its heartbeat reports them (see `store.metering`)."""

    #: Requests since the process started, by method (GET, HEAD, PUT, DELETE, LIST).
    total: dict[str, int] = Field(default_factory=dict)
    #: Requests per second by method over the interval since the previous report.
    per_s: dict[str, float] = Field(default_factory=dict)
    #: The busiest "METHOD family" pairs over that interval, in requests per second.
    top_families: dict[str, float] = Field(default_factory=dict)
    interval_s: float = Field(default=0.0, ge=0)


class NodeRecord(Record):
    """One node's own record: identity, heartbeat, partition progress. Only that node writes it."""

    kind: Literal["node"] = "node"
    node: int = Field(ge=1)
    generation: int = Field(ge=1)
    status: NodeStatus
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_timeout_s: float = Field(gt=0)
    partitions: dict[int, PartitionProgress] = Field(default_factory=dict)
    #: The node's store requests (None from nodes that predate request reports).
    requests: RequestReport | None = None
    #: Where the control plane may nudge the node to read its assignment now (advisory; None: nowhere).
    nudge_url: str | None = None
    write_id: str = Field(default_factory=new_write_id)


class MembershipRecord(Record):
    """The member set and the cluster epoch (membership generation), advanced by CAS."""

    kind: Literal["membership"] = "membership"
    cluster_epoch: int = Field(ge=1)
    members: list[int]
    reason: str
    updated_at: datetime
    write_id: str = Field(default_factory=new_write_id)
