"""Store wrappers that stage interleavings for tests (complements the fault injector)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

from laminar_orchestration.store import ObjectMeta, ObjectStore, StoredObject


class ForwardingStore(ObjectStore):
    """Forwards every call to `inner`; a test wrapper overrides only the call it stages."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.url, self.meter = inner, inner.url, inner.meter

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        return self.inner.put_if_absent(key, data, metadata)

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        return self.inner.put_if_match(key, data, etag, metadata)

    def delete_if_match(self, key: str, etag: str) -> None:
        self.inner.delete_if_match(key, etag)

    def get(self, key: str) -> StoredObject:
        return self.inner.get(key)

    def head(self, key: str) -> ObjectMeta | None:
        return self.inner.head(key)

    def list(self, prefix: str) -> Iterator[str]:
        return self.inner.list(prefix)


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
