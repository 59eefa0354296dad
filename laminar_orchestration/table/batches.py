"""The committed batches a partition's manifest chain names, and their rows as the table holds them.

A batch counts only once its fenced manifest entry is on the chain: the
follower walks the chain's history entries forward from the last one the
table holds, by key (no listing), keeps the genuine entries (signed by their
epoch's grant, `ManifestReader.entry`) that follow their predecessor, and
passes over void ones exactly as every reader does: a forged entry, or a
superseded writer's (a zombie that published after the seal that fenced it).
Output named by no entry on the chain is never read.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
import pyarrow.parquet as pq

from laminar_orchestration.errors import CorruptDataError
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.capabilities import ReadStore
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.fencing import ConditionalPutFailed
from laminar_orchestration.protocol.keys import manifest_history_key
from laminar_orchestration.protocol.manifest import (
    ArtifactRef,
    BrokenManifestChain,
    StaleFencingToken,
    StaleGeneration,
    SuccessionError,
)
from laminar_orchestration.store import ForwardingStore, ObjectMeta, ObjectNotFound, ObjectStore, StoredObject

#: The columns the table adds in front of the processor's output columns.
LINEAGE_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("batch_seq", pa.int64(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("generation", pa.int64(), nullable=False),
        pa.field("start_offset", pa.int64(), nullable=False),
        pa.field("end_offset", pa.int64(), nullable=False),
        pa.field("committed_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
LINEAGE_COLUMNS: tuple[str, ...] = tuple(LINEAGE_SCHEMA.names)

# `sink/{p}/n-{node}/{epoch:010d}-{start:020d}-{end:020d}-{ulid}.parquet` (`keys.output_object_key`).
_OUTPUT_RANGE = re.compile(r"/\d{10}-(\d{20})-(\d{20})-[0-9A-Z]{26}\.parquet$")


def app_id(partition: int) -> str:
    """The Delta transaction identifier of `partition`: its version is the last manifest seq in the table."""
    return f"laminar/partition-{partition}"


class OutputUnreadable(CorruptDataError):
    """An output object a committed manifest names is missing or does not match the manifest."""

    key: str
    reason: str

    message = "output object {key!r} named by a committed manifest is unusable: {reason}"


@dataclass(frozen=True)
class CommittedBatch:
    """One committed manifest entry that names output: what the table appends for it."""

    partition: int
    seq: int
    epoch: int
    node: int
    generation: int
    start_offset: int
    end_offset: int
    committed_at: datetime
    outputs: tuple[ArtifactRef, ...]


def batch_of(version: ManifestVersion, previous_offset: int) -> CommittedBatch:
    """The batch `version` commits; its range from its output's name, else from the chain's offsets."""
    m = version.manifest
    start, end = previous_offset, m.source_offset
    if m.outputs:
        match = _OUTPUT_RANGE.search(m.outputs[0].key)
        if match:
            start, end = int(match.group(1)), int(match.group(2))
    return CommittedBatch(
        partition=m.partition,
        seq=m.seq,
        epoch=m.fencing_token,
        node=m.node,
        generation=m.generation,
        start_offset=start,
        end_offset=end,
        committed_at=m.committed_at,
        outputs=tuple(m.outputs),
    )


@dataclass(frozen=True)
class ChainWalk:
    """What a walk found: the batches after the start, and the newest genuine entry it reached."""

    batches: list[CommittedBatch]
    newest: ManifestVersion | None


class ChainFollower:
    """Walks manifest chains forward from a known entry, one GET per entry (and one HEAD at the end)."""

    def __init__(self, store: ObjectStore, reader: ManifestReader | None = None) -> None:
        self._store = store
        self.reader = reader or ManifestReader(store)
        #: Entries this process published itself (`remember`): the exact bytes stored under their key
        #: (a create-only write), so they are not read back; dropped once in the table (`forget`).
        self._known: dict[tuple[int, int], ManifestVersion] = {}

    def remember(self, version: ManifestVersion) -> None:
        """An entry this process published: the walk takes it instead of reading it."""
        if len(self._known) > 10_000:
            self._known.clear()  # never walked (a partition that moved away): read if needed
        self._known[(version.manifest.partition, version.manifest.seq)] = version

    def forget(self, partition: int, through: int) -> None:
        """Drop the remembered entries of `partition` up to seq `through` (in the table now)."""
        for key in [k for k in list(self._known) if k[0] == partition and k[1] <= through]:
            self._known.pop(key, None)

    def entry(self, partition: int, seq: int) -> ManifestVersion | None:
        """The genuine entry at `seq` (None: absent or forged)."""
        known = self._known.get((partition, seq))
        if (
            known is not None
            and self.reader.grant_keys.problem(
                known.manifest, partition, known.manifest.fencing_token, known.manifest.node
            )
            is None
        ):
            return known
        return self.reader.entry(PartitionId(partition), seq)

    def walk(self, partition: int, start: ManifestVersion | None, through: int | None = None) -> ChainWalk:
        """Every committed batch after `start` (None: from the chain's first entry), in chain order,
        up to seq `through` if given (no entry past it is read).

        A walk that took only entries this process published stops after the last of them without
        probing the chain's end: later entries are another writer's (a successor after a move), and
        the successor's node, whose own walk starts by reading, appends them.
        """
        previous = start
        seq = start.manifest.seq + 1 if start else 1
        skipped = 0
        batches: list[CommittedBatch] = []
        first, remembered_only = seq, True
        while through is None or seq <= through:
            if remembered_only and seq > first and (partition, seq) not in self._known:
                break  # past the last entry this process published: no probe
            known = self._known.get((partition, seq))
            version = self.entry(partition, seq)
            remembered_only = remembered_only and known is not None and version is known
            if version is None:
                if self._store.head(manifest_history_key(partition, seq)) is None:
                    break  # the end of the chain
                skipped += 1  # forged: void, the chain goes on past it
                seq += 1
                continue
            key = manifest_history_key(partition, seq)
            if previous is None:
                if version.manifest.parent_hash is not None:
                    raise BrokenManifestChain(PartitionId(partition), key, "the first entry names a parent")
            else:
                try:
                    version.manifest.validate_succession(previous.manifest, previous.raw_hash, skipped=skipped)
                except (StaleFencingToken, StaleGeneration):
                    skipped += 1  # a superseded writer's entry (a zombie after its fence): void
                    seq += 1
                    continue
                except (SuccessionError, ConditionalPutFailed) as exc:
                    raise BrokenManifestChain(PartitionId(partition), key, str(exc)) from exc
            if version.manifest.outputs:
                batches.append(batch_of(version, previous.manifest.source_offset if previous else 0))
            previous, skipped = version, 0
            seq += 1
        return ChainWalk(batches, previous)


def read_output(reads: ReadStore, ref: ArtifactRef) -> pa.Table:
    """An output object, checked against its manifest entry (size and sha256)."""
    obj = reads.get(ref.key)
    if obj is None:
        raise OutputUnreadable(ref.key, "missing from the store")
    if len(obj.data) != ref.size or hashlib.sha256(obj.data).hexdigest() != ref.sha256:
        raise OutputUnreadable(ref.key, "size or sha256 differs from the manifest entry")
    try:
        return pq.read_table(pa.BufferReader(obj.data))
    except (pa.ArrowException, OSError) as exc:
        raise OutputUnreadable(ref.key, f"not a readable Parquet file: {exc}") from exc


def batch_rows(batch: CommittedBatch, outputs: Sequence[pa.Table]) -> pa.Table | None:
    """The table rows of `batch`: its lineage columns, then the processor's output columns (None: no rows).

    The output's own ``epoch`` and ``generation`` columns (the default processor stamps them) are
    replaced by the manifest's, which is the authority on who committed the batch.
    """
    parts = [t for t in outputs if t.num_rows]
    if not parts:
        return None
    rows = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
    rows = rows.drop_columns([c for c in LINEAGE_COLUMNS if c in rows.column_names])
    n = rows.num_rows
    values = {
        "partition": batch.partition,
        "batch_seq": batch.seq,
        "epoch": batch.epoch,
        "generation": batch.generation,
        "start_offset": batch.start_offset,
        "end_offset": batch.end_offset,
        "committed_at": batch.committed_at,
    }
    lineage = [pa.array(pa.repeat(pa.scalar(values[f.name], f.type), n)) for f in LINEAGE_SCHEMA]
    columns = lineage + list(rows.columns)
    fields = list(LINEAGE_SCHEMA) + list(rows.schema)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


class ProbeMemo(ForwardingStore):
    """The store as the chain walk reads it, minus a redundant request: a GET that found nothing
    answers the HEAD of the same key that follows it.

    The walk GETs the next manifest entry and, when the reader returns none, HEADs the key to tell
    the chain's end (absent) from a forged entry (present); after a 404 the HEAD can only say
    absent. Each sync ends every partition's walk this way, so this halves its manifest probes.
    """

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self._absent: str | None = None

    def get(self, key: str) -> StoredObject:
        self._absent = None
        try:
            return self.inner.get(key)
        except ObjectNotFound:
            self._absent = key
            raise

    def head(self, key: str) -> ObjectMeta | None:
        if key == self._absent:
            self._absent = None
            return None
        return self.inner.head(key)

    def close(self) -> None:
        self.inner.close()
