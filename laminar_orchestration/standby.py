"""Warm standby: a node keeps a copy of a partition it does not own by following the manifest chain.

A `StandbyFollower` polls the partition's current manifest and brings its
local `StateReplica` to it: the snapshot once (files it already holds are
reused), then only the deltas each newly published manifest names. It never
reads a delta no manifest names, so a zombie's uncommitted work is never
applied. When the node takes the partition over (a failover to it, a
migration towards it) the worker adopts the replica and applies only the
last few deltas instead of downloading the whole state.
"""

from __future__ import annotations

import logging
import threading

from .errors import LaminarError
from .manifest import ManifestReader
from .replica import StateReplica
from .store import StoreError

log = logging.getLogger("laminar.standby")


class StandbyFollower(threading.Thread):
    """Keeps `replica` equal to the newest committed manifest of its partition, until `stop`."""

    def __init__(self, replica: StateReplica, reader: ManifestReader, *, poll_s: float, node: int) -> None:
        super().__init__(name=f"standby-{replica.partition}", daemon=True)
        self.replica = replica
        self._reader = reader
        self._poll_s = poll_s
        self._node = node
        self._stop_requested = threading.Event()
        #: The newest committed offset seen in the chain, and the one the replica reflects.
        self.committed_offset = 0
        self.error: str | None = None

    @property
    def partition(self) -> int:
        return self.replica.partition

    @property
    def lag(self) -> int:
        """Committed events the replica does not reflect yet (what a takeover would still apply)."""
        return max(0, self.committed_offset - self.replica.source_offset)

    def run(self) -> None:
        while not self._stop_requested.is_set():
            self.follow_once()
            self._stop_requested.wait(self._poll_s)

    def follow_once(self) -> None:
        """One step: read the chain's newest manifest and catch up to it."""
        try:
            version = self._reader.current(self.replica.partition)  # type: ignore[arg-type]
            if version is None:
                return
            self.committed_offset = version.manifest.source_offset
            if self.replica.store is None or self.replica.source_offset != self.committed_offset:
                self.replica.catch_up(version.manifest)
            self.error = None
        except (LaminarError, StoreError) as exc:
            # A standby is an optimisation: it reports the problem and tries again next poll.
            if self.error != str(exc):
                log.warning("node %s: standby of partition %s: %s", self._node, self.partition, exc)
            self.error = str(exc)

    def stop(self) -> StateReplica:
        """Stop following (after the step in progress) and hand the replica over."""
        self._stop_requested.set()
        if self.is_alive():
            self.join()
        return self.replica
