"""The promises the simulation checks after every applied write, as typed violations.

`Checker` watches the simulated store's writes (lost responses included: they
landed) and keeps, per partition, what it needs to decide each promise
incrementally: the grants, the manifest chain as created, the source events
and the fold of them, the state the chain's snapshot and deltas add up to.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq

from laminar_orchestration.keys import (
    FENCED_OBJECT_PREFIXES,
    grant_key,
    ledger_partition_prefix,
    manifest_history_key,
    manifest_pointer_key,
    manifest_prefix,
    parse_fenced_object_key,
)
from laminar_orchestration.manifest import PartitionManifest
from laminar_orchestration.records import EpochGrant, parse_record
from laminar_orchestration.source import SourceBatch, SourceLog
from laminar_orchestration.store import ObjectStore

#: Per key: (events counted, sum of their values) - the sim's keyed fold.
FoldState = dict[str, tuple[int, float]]


class InvariantViolation(Exception):
    """Base of the promises a run can break. `invariant` names the promise."""

    invariant: ClassVar[str] = "invariant"

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled by field (for runs in worker processes): the dataclass fields are not in `args`.
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return (_rebuild, (type(self), fields))

    def fields(self) -> dict[str, object]:
        """The violation's fields by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


def _rebuild(cls: type[InvariantViolation], fields: dict[str, object]) -> InvariantViolation:
    return cls(**fields)


@dataclass
class DoubleGrant(InvariantViolation):
    """Two writers acted as the owner of one (partition, epoch), or its grant was written twice."""

    invariant: ClassVar[str] = "one owner per epoch"
    partition: int
    epoch: int
    writers: tuple[str, ...]

    def __str__(self) -> str:
        return f"partition {self.partition} epoch {self.epoch} has more than one owner: {', '.join(self.writers)}"


@dataclass
class StaleManifestAccepted(InvariantViolation):
    """A manifest under an epoch created after the chain was sealed (fenced) at a later one."""

    invariant: ClassVar[str] = "no manifest after the fence"
    partition: int
    seq: int
    epoch: int
    fenced_at: int
    node: int

    def __str__(self) -> str:
        return (
            f"partition {self.partition}: manifest seq {self.seq} under epoch {self.epoch} by node {self.node} "
            f"accepted after the chain was fenced at epoch {self.fenced_at}"
        )


@dataclass
class OffsetRegression(InvariantViolation):
    """The committed source offset moved backwards along the chain."""

    invariant: ClassVar[str] = "offsets never move backwards"
    partition: int
    seq: int
    previous: int
    offset: int

    def __str__(self) -> str:
        return f"partition {self.partition}: manifest seq {self.seq} moved the offset {self.previous} -> {self.offset}"


@dataclass
class ExactlyOnceViolated(InvariantViolation):
    """The committed deltas do not tile [snapshot offset, committed offset): events lost or applied twice."""

    invariant: ClassVar[str] = "exactly once"
    partition: int
    seq: int
    kind: str  # loss | duplicate
    start: int
    end: int

    def __str__(self) -> str:
        what = f"{self.kind} of source offsets [{self.start}, {self.end})"
        return f"partition {self.partition}: manifest seq {self.seq}: {what}"


@dataclass
class StateMismatch(InvariantViolation):
    """The committed state is not the fold of exactly the events below the committed offset."""

    invariant: ClassVar[str] = "committed state = fold of the committed events"
    partition: int
    seq: int
    offset: int
    key: str
    expected: tuple[int, float] | None
    actual: tuple[int, float] | None

    def __str__(self) -> str:
        return (
            f"partition {self.partition}: manifest seq {self.seq} at offset {self.offset}: key {self.key!r} "
            f"is {self.actual}, the fold of the source says {self.expected}"
        )


@dataclass
class ChainBroken(InvariantViolation):
    """A history entry that does not follow its predecessor (gap, or beyond the source log's end)."""

    invariant: ClassVar[str] = "the manifest chain is well formed"
    partition: int
    key: str
    reason: str

    def __str__(self) -> str:
        return f"partition {self.partition}: {self.key}: {self.reason}"


@dataclass
class ManifestArtifactDeleted(InvariantViolation):
    """An object some manifest names was deleted (before or after the manifest was published)."""

    invariant: ClassVar[str] = "no named object is deleted"
    key: str

    def __str__(self) -> str:
        return f"{self.key} is named by a manifest and was deleted"


@dataclass
class GarbageNotSwept(InvariantViolation):
    """Once faults stopped and a sweep ran, an object no manifest names, of a sealed epoch, is still there."""

    invariant: ClassVar[str] = "liveness: unreachable objects of sealed epochs are swept"
    partition: int
    key: str
    epoch: int
    sealed_at: int

    def __str__(self) -> str:
        return (
            f"partition {self.partition}: {self.key} (epoch {self.epoch}) is named by no manifest and its epoch "
            f"is sealed (below {self.sealed_at}), yet a sweep after the faults stopped left it"
        )


@dataclass
class MigrationWedged(InvariantViolation):
    """A migration record still unfinished well after its deadline, once faults stopped."""

    invariant: ClassVar[str] = "every migration terminates by its deadline"
    partition: int
    migration_id: str
    phase: str
    overdue_s: float

    def __str__(self) -> str:
        return (
            f"partition {self.partition}: migration {self.migration_id} still {self.phase} "
            f"{self.overdue_s:.1f}s after its deadline"
        )


@dataclass
class PartitionNotLive(InvariantViolation):
    """After faults stopped, a partition was not active on a live node within the bound."""

    invariant: ClassVar[str] = "liveness: every partition active on a live node"
    partition: int
    epoch: int
    owner: int
    reason: str
    waited_s: float

    def __str__(self) -> str:
        return (
            f"partition {self.partition} not active on a live node {self.waited_s:.1f}s after faults stopped "
            f"(ledger: epoch {self.epoch}, owner {self.owner}): {self.reason}"
        )


class EventDecoder:
    """The (key, value) events of a source batch, decoding each immutable Parquet payload once."""

    def __init__(self) -> None:
        self._cache: dict[bytes, list[tuple[str, float]]] = {}

    def events(self, batch: SourceBatch) -> list[tuple[str, float]]:
        """Every event of `batch` in offset order."""
        out: list[tuple[str, float]] = []
        for payload in batch.payloads:
            decoded = self._cache.get(payload)
            if decoded is None:
                # ParquetFile on one thread: several times faster than read_table on tiny payloads.
                table = pq.ParquetFile(pa.BufferReader(payload)).read(columns=["key", "value"], use_threads=False)
                keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
                decoded = self._cache[payload] = list(zip(keys, values, strict=True))
            out.extend(decoded)
        return out


def fold(state: FoldState, events: list[tuple[str, float]]) -> None:
    """Apply `events` in order to `state` (count and sum per key)."""
    for key, value in events:
        count, total = state.get(key, (0, 0.0))
        state[key] = (count + 1, total + value)


def decode_delta(data: bytes) -> FoldState:
    """A sim delta object: the touched keys' full new values."""
    return {k: (int(v[0]), float(v[1])) for k, v in json.loads(data).items()}


def encode_delta(values: Mapping[str, tuple[int, float]]) -> bytes:
    """The bytes of a sim delta object (sorted, so equal values give equal bytes)."""
    return json.dumps({k: list(values[k]) for k in sorted(values)}, separators=(",", ":")).encode()


@dataclass
class _Partition:
    pointer_key: str
    manifest_prefix: str
    ledger_prefix: str
    chain: list[PartitionManifest] = field(default_factory=list)
    #: epoch -> (node, generation) of its grant.
    grants: dict[int, tuple[int, int | None]] = field(default_factory=dict)
    #: epoch -> the newest generation of the grant's node that sealed the chain at it: a restarted
    #: process re-adopts its node's grant and seals again, and only it may publish from then on.
    sealed_generation: dict[int, int] = field(default_factory=dict)
    events: list[tuple[str, float]] = field(default_factory=list)
    ref_offset: int = 0
    ref_state: FoldState = field(default_factory=dict)
    overlay_keys: list[str] = field(default_factory=list)
    overlay: FoldState = field(default_factory=dict)


class Checker:
    """Decides the safety promises on every applied write; `violation` keeps the first one broken."""

    def __init__(self, memory: ObjectStore, partitions: int, decoder: EventDecoder) -> None:
        self._memory = memory
        self._decoder = decoder
        self._source = SourceLog(memory, partitions=partitions)
        self._parts = [
            _Partition(manifest_pointer_key(p), manifest_prefix(p) + "/", ledger_partition_prefix(p) + "/")
            for p in range(partitions)
        ]
        self._named: set[str] = set()
        #: Every key a delete removed (the sweep's).
        self._deleted: set[str] = set()
        self.violation: InvariantViolation | None = None
        self.manifests_checked = 0
        #: Manifests that named a newer snapshot than the entry before them.
        self.snapshots_named = 0
        #: Data commits under an epoch made after a later epoch was granted (before its seal: legitimate).
        self.late_commits = 0

    def applied(self, op: str, key: str, data: bytes | None) -> None:
        """Check what the write of `key` changed (never raises: the first violation is kept)."""
        if self.violation is not None:
            return
        try:
            self._check(op, key, data)
        except InvariantViolation as exc:
            self.violation = exc

    def _check(self, op: str, key: str, data: bytes | None) -> None:
        if data is None:
            self._deleted.add(key)
            if key in self._named:
                raise ManifestArtifactDeleted(key)
            return
        for p, part in enumerate(self._parts):
            if key.startswith(part.manifest_prefix) and key != part.pointer_key:
                self._manifest(p, part, key, data)
                return
            if key.startswith(part.ledger_prefix) and b'"kind":"epoch-grant"' in data:
                self._grant(p, part, key, op, data)
                return

    def _grant(self, p: int, part: _Partition, key: str, op: str, data: bytes) -> None:
        grant = parse_record(key, data, EpochGrant)
        if key != grant_key(p, grant.epoch):
            raise ChainBroken(p, key, f"a grant of epoch {grant.epoch} stored under the wrong key")
        if grant.epoch in part.grants or op != "put_if_absent":
            raise DoubleGrant(p, grant.epoch, (f"grant {part.grants.get(grant.epoch)}", f"node {grant.node}"))
        part.grants[grant.epoch] = (grant.node, grant.generation)

    def _manifest(self, p: int, part: _Partition, key: str, data: bytes) -> None:
        m = parse_record(key, data, PartitionManifest)
        self.manifests_checked += 1
        if key != manifest_history_key(p, m.seq) or m.seq != len(part.chain) + 1:
            raise ChainBroken(p, key, f"entry seq {m.seq} after {len(part.chain)} entries")
        if part.chain:
            prev = part.chain[-1]
            if m.fencing_token < prev.fencing_token:
                raise StaleManifestAccepted(p, m.seq, m.fencing_token, prev.fencing_token, m.node)
            if m.source_offset < prev.source_offset:
                raise OffsetRegression(p, m.seq, prev.source_offset, m.source_offset)
        grant = part.grants.get(m.fencing_token)
        if m.is_seal and grant is not None and grant[0] == m.node:
            known = part.sealed_generation.get(m.fencing_token, -1)
            part.sealed_generation[m.fencing_token] = max(known, m.generation)
        if not m.is_seal and m.node != 0:
            if max(part.grants, default=0) > m.fencing_token:
                self.late_commits += 1
            holder = part.sealed_generation.get(m.fencing_token, grant[1] if grant else None)
            if grant is None or grant[0] != m.node or (holder is not None and holder != m.generation):
                raise DoubleGrant(
                    p,
                    m.fencing_token,
                    (
                        f"grant {grant} (sealed by gen {holder})",
                        f"manifest seq {m.seq} by node {m.node} gen {m.generation}",
                    ),
                )
        for ref in m.artifacts():
            # Objects are uploaded before the manifest that names them: one gone by now was deleted.
            if ref.key not in self._named and ref.key in self._deleted and self._memory.head(ref.key) is None:
                raise ManifestArtifactDeleted(ref.key)
        self._exactly_once(p, part, m)
        if m.snapshot is not None and (not part.chain or part.chain[-1].snapshot != m.snapshot):
            self.snapshots_named += 1
        part.chain.append(m)
        self._named.update(ref.key for ref in m.artifacts())

    def _exactly_once(self, p: int, part: _Partition, m: PartitionManifest) -> None:
        if m.outputs:
            # Output is visible once its manifest is: each commit's output (the range of its
            # delta) must start where the chain's previous entry ended, or events repeat or vanish.
            start = part.chain[-1].source_offset if part.chain else 0
            last = m.deltas[-1] if m.deltas else None
            if last is None or last.start_offset != start or last.end_offset != m.source_offset:
                got = last.start_offset if last is not None else m.source_offset
                kind = "duplicate" if got < start else "loss"
                raise ExactlyOnceViolated(p, m.seq, kind, min(got, start), max(got, start))
        # The snapshot holds the state at its offset; the deltas must tile the rest up to the commit's.
        expected = m.state_offset
        for d in m.deltas:
            if d.start_offset != expected:
                kind = "duplicate" if d.start_offset < expected else "loss"
                raise ExactlyOnceViolated(p, m.seq, kind, min(expected, d.start_offset), max(expected, d.start_offset))
            expected = d.end_offset
        if expected != m.source_offset:
            kind = "duplicate" if expected > m.source_offset else "loss"
            lo, hi = sorted((expected, m.source_offset))
            raise ExactlyOnceViolated(p, m.seq, kind, lo, hi)
        keys = [f.ref.key for f in m.snapshot.files] if m.snapshot else []
        keys += [d.ref.key for d in m.deltas]
        if keys[: len(part.overlay_keys)] != part.overlay_keys:
            part.overlay_keys, part.overlay = [], {}
        for k in keys[len(part.overlay_keys) :]:
            obj = self._memory.get_or_none(k)
            if obj is None:
                raise ChainBroken(p, k, "a snapshot file or delta the manifest names does not exist")
            part.overlay.update(decode_delta(obj.data))
            part.overlay_keys.append(k)
        reference = self._reference(p, part, m.source_offset, m.seq)
        if reference != part.overlay:
            for k in sorted(set(reference) | set(part.overlay)):
                if reference.get(k) != part.overlay.get(k):
                    raise StateMismatch(p, m.seq, m.source_offset, k, reference.get(k), part.overlay.get(k))

    def _reference(self, p: int, part: _Partition, offset: int, seq: int) -> FoldState:
        while len(part.events) < offset:
            batch = self._source.read(p, len(part.events), 10_000)
            if batch is None:
                raise ChainBroken(p, manifest_history_key(p, seq), f"offset {offset} is beyond the source log's end")
            part.events.extend(self._decoder.events(batch))
        if offset < part.ref_offset:
            part.ref_offset, part.ref_state = 0, {}
        fold(part.ref_state, part.events[part.ref_offset : offset])
        part.ref_offset = offset
        return part.ref_state

    def check_swept(self, ledger_epochs: Mapping[int, int]) -> None:
        """Raise GarbageNotSwept for an object left that no manifest names and whose epoch is sealed.

        Sealed: below both the partition's ledger epoch (`ledger_epochs`) and the
        fencing token of its manifest chain, so no publish can ever name it.
        """
        for prefix in FENCED_OBJECT_PREFIXES:
            for key in self._memory.list(prefix):
                if key in self._named:
                    continue
                name = parse_fenced_object_key(key)
                part = self._parts[name.partition]
                token = part.chain[-1].fencing_token if part.chain else 0
                sealed_at = min(token, ledger_epochs.get(name.partition, 0))
                if name.epoch < sealed_at:
                    raise GarbageNotSwept(name.partition, key, name.epoch, sealed_at)
