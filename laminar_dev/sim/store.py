"""The simulated object store: in-memory conditional writes, seeded faults, simulated latency.

`MemoryObjectStore` keeps the `ObjectStore` promises the real backends keep
(create-only, compare-and-swap on the ETag, conditional delete, sorted
listing, `check_key`), checked by the same conformance suite; its ETags are a
counter, so a run's bytes-independent history is a pure function of its seed.
`SimStore` wraps it in the existing `FaultInjectingStore` and hands every call
to the simulation first: the scheduler's interleaving point, where simulated
time passes, faults are drawn and actors crash or get preempted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol, TypeVar

from laminar_dev.faults import WRITE_OPS, FaultInjectingStore
from laminar_orchestration.store.base import (
    ObjectMeta,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StoredObject,
    check_key,
)

T = TypeVar("T")


@dataclass(frozen=True)
class _Version:
    data: bytes
    etag: str
    metadata: Mapping[str, str]
    #: What every read of this version returns: one frozen object, its metadata read-only, so a
    #: read copies nothing (a version never changes; a write makes a new one).
    stored: StoredObject


class WriteObserver(Protocol):
    """Told about every write the store applied (the invariant checker)."""

    def applied(self, op: str, key: str, data: bytes | None) -> None:
        """`op` on `key` took effect; `data` is the new content (None for a delete)."""
        ...


class MemoryObjectStore(ObjectStore):
    """An in-memory `ObjectStore` with the real backends' conditional semantics. Thread-safe."""

    def __init__(self, url: str = "memory://sim") -> None:
        self.url = url
        self._objects: dict[str, _Version] = {}
        self._lock = threading.Lock()
        self._next_etag = 0
        self._valid_keys: set[str] = set()
        #: Sees every applied write, lost responses included (they did land).
        self.observer: WriteObserver | None = None

    def _check(self, key: str) -> None:
        # Keys repeat a lot in a simulation: validate each one once.
        if key not in self._valid_keys:
            check_key(key)
            self._valid_keys.add(key)

    def _etag(self) -> str:
        self._next_etag += 1
        return f'"{self._next_etag:08x}"'

    def _store(self, op: str, key: str, data: bytes, metadata: Mapping[str, str] | None) -> str:
        content, etag, frozen = bytes(data), self._etag(), MappingProxyType(dict(metadata or {}))
        version = _Version(content, etag, frozen, StoredObject(key, content, etag, frozen))
        self._objects[key] = version
        if self.observer is not None:
            self.observer.applied(op, key, version.data)
        return version.etag

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        """Create `key` only if absent (If-None-Match: *)."""
        self._check(key)
        with self._lock:
            if key in self._objects:
                raise PreconditionFailed(key, None)
            return self._store("put_if_absent", key, data, metadata)

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        """Replace `key` only if its ETag is `etag` (If-Match); a missing key fails the precondition."""
        self._check(key)
        with self._lock:
            current = self._objects.get(key)
            if current is None or current.etag != etag:
                raise PreconditionFailed(key, etag)
            return self._store("put_if_match", key, data, metadata)

    def delete_if_match(self, key: str, etag: str) -> None:
        """Delete `key` only if its ETag is `etag`; ObjectNotFound when absent."""
        self._check(key)
        with self._lock:
            current = self._objects.get(key)
            if current is None:
                raise ObjectNotFound(key)
            if current.etag != etag:
                raise PreconditionFailed(key, etag)
            del self._objects[key]
            if self.observer is not None:
                self.observer.applied("delete_if_match", key, None)

    def get(self, key: str) -> StoredObject:
        """The object with its ETag and metadata; ObjectNotFound when absent."""
        self._check(key)
        current = self._objects.get(key)
        if current is None:
            raise ObjectNotFound(key)
        return current.stored

    def head(self, key: str) -> ObjectMeta | None:
        """Size, ETag and metadata of `key`, or None."""
        self._check(key)
        current = self._objects.get(key)
        return None if current is None else ObjectMeta(key, len(current.data), current.etag, dict(current.metadata))

    def list(self, prefix: str) -> Iterator[str]:
        """Keys under `prefix`, sorted."""
        with self._lock:
            keys = sorted(k for k in self._objects if k.startswith(prefix))
        return iter(keys)

    def get_or_none(self, key: str) -> StoredObject | None:
        """`get`, None when absent (no exception on the simulation's hot path)."""
        self._check(key)
        current = self._objects.get(key)
        return None if current is None else current.stored


class CallHook(Protocol):
    """The simulation's side of every store call."""

    def before_call(self, op: str, key: str) -> None:
        """Called before the call is decided: time passes, other actors may run, the caller may crash."""
        ...

    def after_call(self, op: str, key: str, outcome: str) -> None:
        """Called with what the caller saw: "ok" or the error's type name."""
        ...


class SimStore(FaultInjectingStore):
    """`FaultInjectingStore` over a `MemoryObjectStore`, every call first handed to `hook`.

    Faults come from the fault injector (seeded `random_faults`, or scheduled
    ones): failed requests that never applied and lost responses of writes that
    did. The hook runs before each call, so an actor can be preempted (other
    actors run to an interleaving point) or crash between any two store calls.
    """

    def __init__(self, inner: MemoryObjectStore, hook: CallHook) -> None:
        super().__init__(inner)
        self.memory = inner
        self.hook = hook

    def _run(self, op: str, key: str, fn: Callable[[], T]) -> T:
        self.hook.before_call(op, key)
        try:
            result = super()._run(op, key, fn)
        except Exception as exc:
            self.hook.after_call(op, key, type(exc).__name__)
            raise
        self.hook.after_call(op, key, "ok")
        return result

    def get_or_none(self, key: str) -> StoredObject | None:
        """`get` through the fault injector, None when absent."""
        try:
            return self.get(key)
        except ObjectNotFound:
            return None


__all__ = ["WRITE_OPS", "CallHook", "MemoryObjectStore", "SimStore", "WriteObserver"]
