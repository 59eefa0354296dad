"""A cluster with real fenced manifest chains for the output table's tests, no node process and no Spark.

Batches are committed through the library's fenced path (`protocol.commit.commit`: output file,
signed manifest entry under the owner's token); the batch output is the default processor's
batch aggregate in pyarrow, stamped with the writer's epoch and generation. `assert_exactly_once`
reads the table back with `deltalake` alone and checks it against the source.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from laminar_orchestration.dataplane.checkpoint import OutputWriter
from laminar_orchestration.identity import NodeId, PartitionId
from laminar_orchestration.ops.verify import reference_batch_aggregate
from laminar_orchestration.protocol.capabilities import OutputCommitter, manifest_key
from laminar_orchestration.protocol.chain import ManifestReader, ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.commit import commit
from laminar_orchestration.protocol.fencing import FencingToken, PartitionGuard
from laminar_orchestration.protocol.keys import manifest_history_key
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.producers import generate_events
from laminar_orchestration.protocol.signing import sign_record
from laminar_orchestration.protocol.source import SourceLog
from laminar_orchestration.store import ObjectStore
from laminar_orchestration.table import audit_table, table_location
from laminar_orchestration.ulid import next_ulid


@dataclass
class Cluster:
    """A ledger, a source log and publishers: commits batches as owners (and zombies) do."""

    store: ObjectStore
    partitions: int = 2
    ledger: Ledger = field(init=False)
    source: SourceLog = field(init=False)
    seed: int = 0
    #: Tokens a test keeps by partition (its owners').
    tokens: dict[int, FencingToken] = field(default_factory=dict)
    #: True: the store holds the cluster already (`laminar init` made it), it is not initialized again.
    existing: bool = False

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.store)
        if not self.existing:
            self.ledger.init_cluster(self.partitions)
        self.source = SourceLog(self.store, segment_events=20)

    def produce(self, count: int, keys: int = 8) -> None:
        self.seed += 1
        for p, table in generate_events(count, keys, self.seed, self.partitions, integer_values=True).items():
            if table.num_rows:
                self.source.append(p, table)

    def acquire(self, partition: int, node: int) -> FencingToken:
        own = self.ledger.ownership(PartitionId(partition))
        return self.ledger.acquire(PartitionId(partition), NodeId(node), expected_epoch=own.epoch if own else 0)

    def fence(self, partition: int, node: int) -> FencingToken:
        own = self.ledger.ownership(PartitionId(partition))
        token = self.ledger.fence(
            PartitionId(partition), NodeId(node), expected_epoch=own.epoch if own else 0, reason="t"
        )
        assert token is not None
        return token

    def release(self, token: FencingToken) -> None:
        current = ManifestReader(self.store).current(token.partition)
        assert current is not None
        self.ledger.release(
            token, commit_ulid=current.manifest.commit_ulid, source_offset=current.manifest.source_offset
        )

    def commit_batches(
        self,
        token: FencingToken,
        batch_events: int = 40,
        max_batches: int | None = None,
        remember: Callable[[ManifestVersion, dict[str, pa.Table]], None] | None = None,
    ) -> int:
        """Commit the partition's source after its committed offset, `batch_events` per batch; batches made.

        `remember` is told each committed entry and its output rows, as a node tells its table."""
        publisher = ManifestPublisher(OutputCommitter(self.store), self.store)
        writer = OutputWriter(OutputCommitter(self.store))
        guard = PartitionGuard(token)
        current = publisher.current(token.partition)
        offset = current.manifest.source_offset if current else 0
        made = 0
        for batch in self.source.iter_batches(token.partition, offset, batch_events):
            if max_batches is not None and made >= max_batches:
                break
            output = self.output(batch.to_table(), token.epoch)
            ref = writer.write(guard, output, batch.start_offset, batch.end_offset)
            version = commit(
                self.ledger,
                publisher,
                token,
                ManifestUpdate(source_offset=batch.end_offset, outputs=(ref,), events_applied=batch.end_offset),
            )
            if remember is not None:
                remember(version, {ref.key: output})
            made += 1
        return made

    @staticmethod
    def output(events: pa.Table, epoch: int, generation: int = 1) -> pa.Table:
        out = reference_batch_aggregate(events)
        n = out.num_rows
        out = out.append_column("epoch", pa.array([epoch] * n, pa.int64()))
        return out.append_column("generation", pa.array([generation] * n, pa.int64()))

    def zombie_commit(self, old: FencingToken, events: int = 5) -> str:
        """A fenced owner writes output and a manifest entry after the seal, bypassing the client checks.

        The entry is genuinely signed with the old epoch's key: only the chain's rules make it void.
        Returns the zombie's output key.
        """
        sealed = ManifestReader(self.store).current(old.partition)
        assert sealed is not None
        start = sealed.manifest.source_offset
        batch = next(iter(self.source.iter_batches(old.partition, start, events)))
        ref = OutputWriter(OutputCommitter(self.store)).write(
            PartitionGuard(old), self.output(batch.to_table(), old.epoch), batch.start_offset, batch.end_offset
        )
        unsigned = sealed.manifest.model_copy(
            update={
                "seq": sealed.manifest.seq + 1,
                "fencing_token": old.epoch,
                "node": old.node,
                "commit_ulid": next_ulid(sealed.manifest.commit_ulid),
                "parent_hash": sealed.raw_hash,
                "source_offset": batch.end_offset,
                "outputs": [ref],
                "note": "",
            }
        )
        entry = sign_record(unsigned, self.ledger.signing_keys.get(old.node, old.partition, old.epoch))
        key = manifest_history_key(old.partition, entry.seq)
        OutputCommitter(self.store).create_manifest(manifest_key(key), entry.model_dump_json().encode())
        return ref.key

    def committed_offset(self, partition: int) -> int:
        current: ManifestVersion | None = ManifestReader(self.store).current(PartitionId(partition))
        return current.manifest.source_offset if current else 0

    def source_counts(self, partition: int, upto: int | None = None) -> Counter[str]:
        """Events per key in the partition's source below `upto` (default: the committed offset)."""
        end = self.committed_offset(partition) if upto is None else upto
        counts: Counter[str] = Counter()
        for batch in self.source.iter_batches(partition, 0, 100_000):
            t = batch.to_table()
            t = t.filter(pc.less(t["offset"], end))
            counts.update(t["key"].to_pylist())
        return counts


def committed(store: ObjectStore, partitions: int = 2, events: int = 160) -> Cluster:
    """A cluster whose every partition node 1 owns (its token kept) and has committed all its source."""
    cluster = Cluster(store, partitions=partitions)
    cluster.produce(events)
    for p in range(partitions):
        cluster.tokens[p] = cluster.acquire(p, 1)
        cluster.commit_batches(cluster.tokens[p])
    return cluster


def table_counts(table: pa.Table, partition: int) -> Counter[str]:
    """Per key, the events the table's rows of `partition` account for (sum of ``batch_count``)."""
    rows = table.filter(pc.equal(table["partition"], partition))
    counts: Counter[str] = Counter()
    for key, n in zip(rows["key"].to_pylist(), rows["batch_count"].to_pylist(), strict=True):
        counts[key] += n
    return counts


def batch_keys(table: pa.Table) -> Counter[tuple[int, int, str]]:
    """How often each (partition, batch seq, key) row is in the table: exactly once each, or a duplicate."""
    return Counter(
        zip(table["partition"].to_pylist(), table["batch_seq"].to_pylist(), table["key"].to_pylist(), strict=True)
    )


def output_table(store: ObjectStore) -> DeltaTable:
    """The output table of `store` as a downstream reader opens it: `deltalake` alone."""
    location = table_location(store)
    return DeltaTable(location.uri, storage_options=location.options())


def assert_exactly_once(cluster: Cluster) -> None:
    """The table holds every committed event of every partition once, and nothing else: read with
    `deltalake`, each (partition, batch, key) row once and the events per key those committed; the
    audit finds no issue and no partition behind."""
    data = output_table(cluster.store).to_pyarrow_table()
    assert max(batch_keys(data).values(), default=1) == 1, "a row appears twice"
    for p in range(cluster.partitions):
        assert table_counts(data, p) == cluster.source_counts(p), f"partition {p}"
    audit = audit_table(cluster.store)
    assert audit.ok, audit.summary_lines()
    assert all(part.lag_batches == 0 for part in audit.partitions), audit.summary_lines()
