"""Store wrappers that stage interleavings for tests (complements the fault injector)."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from laminar_orchestration.store import ForwardingStore, ObjectStore

__all__ = ["ForwardingStore", "PausingStore"]


class PausingStore(ForwardingStore):
    """Blocks the first create of `pause_key` until `resume` is set: a writer stalled mid-write."""

    def __init__(self, inner: ObjectStore, pause_key: str) -> None:
        super().__init__(inner)
        self.pause_key = pause_key
        self.reached, self.resume = threading.Event(), threading.Event()

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        if key == self.pause_key and not self.reached.is_set():
            self.reached.set()
            if not self.resume.wait(30):
                raise TimeoutError("PausingStore was never resumed")
        return self.inner.put_if_absent(key, data, metadata)
