"""A store wrapper that injects failures, for the tests, the benchmarks and the chaos suite.

Two kinds of failure matter for conditional writes and both can be scheduled:

* *failed requests* (`FaultInjectingStore.fail_next`): the error is raised
  before the inner store is called, so nothing was applied;
* *lost responses* (`FaultInjectingStore.lose_response_next`): the inner write
  is performed and then the error is raised, as when a connection drops after
  S3 applied a PUT. Only a read-back can tell this apart from the first kind.

Plus fixed per-operation latency and a seeded random mode. All scheduling and
counting is thread-safe.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar, get_args

import laminar_orchestration.store.base as base
from laminar_orchestration.store.base import ObjectMeta, ObjectStore, StoredObject

__all__ = ["FaultInjectingStore", "FaultKind", "Op"]

T = TypeVar("T")

#: The operations faults can target.
Op = Literal["put_if_absent", "put_if_match", "delete_if_match", "get", "head", "list"]
#: How a failed request looks: an HTTP 503, throttling, a reset connection, or a
#: 409 conditional-write conflict (raised as `ConcurrentModification`).
FaultKind = Literal["5xx", "throttle", "reset", "conflict"]

OPS: frozenset[str] = frozenset(get_args(Op))
WRITE_OPS: frozenset[str] = frozenset({"put_if_absent", "put_if_match", "delete_if_match"})

_DETAIL = {
    "5xx": "injected HTTP 503 ServiceUnavailable",
    "throttle": "injected HTTP 503 SlowDown",
    "reset": "injected connection reset by peer",
}


@dataclass(frozen=True)
class _Fault:
    """One scheduled fault: consumed by the next call it matches."""

    lose_response: bool  # perform the inner call first, then fail
    kind: FaultKind
    op: str | None  # None: any op (for lost responses: any write)

    def matches(self, op: str) -> bool:
        if self.op is not None:
            return self.op == op
        return op in WRITE_OPS if self.lose_response else True


def _check_op(op: str | None) -> None:
    if op is not None and op not in OPS:
        raise ValueError(f"unknown operation {op!r}; expected one of {sorted(OPS)}")


class FaultInjectingStore(ObjectStore):
    """Wraps a store and makes chosen calls fail, lose their response, or run slowly.

    Scheduled faults (`fail_next`, `lose_response_next`) are consumed in the
    order they were scheduled by the first call they match. Random faults
    (`random_faults`) apply to calls no scheduled fault matched.

    Counters: `injected_failures` (requests failed before reaching the inner
    store), `lost_responses` (inner calls performed whose response was then
    dropped), `delayed` (calls slowed by `latency`), and `calls` (per-op count of
    calls received).
    """

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.meter = inner.meter
        self._lock = threading.Lock()
        self._queue: list[_Fault] = []
        self._latency: dict[str | None, float] = {}
        self._random_rate = 0.0
        self._random_ops: frozenset[str] = OPS
        self._rng = random.Random(0)
        self.injected_failures = 0
        self.lost_responses = 0
        self.delayed = 0
        self.calls: Counter[str] = Counter()

    # -- planning ---------------------------------------------------------------

    def fail_next(self, n: int = 1, op: Op | None = None, kind: FaultKind = "5xx") -> None:
        """Fail the next `n` calls of `op` (any op if None) before they reach the store."""
        _check_op(op)
        with self._lock:
            self._queue.extend(_Fault(False, kind, op) for _ in range(n))

    def lose_response_next(self, n: int = 1, op: Op | None = None) -> None:
        """Perform the next `n` calls of `op` (any write if None), then raise a transient error."""
        _check_op(op)
        with self._lock:
            self._queue.extend(_Fault(True, "reset", op) for _ in range(n))

    def latency(self, seconds: float, op: Op | None = None) -> None:
        """Delay every call of `op` (every call if None) by `seconds`; 0 removes the delay."""
        _check_op(op)
        with self._lock:
            if seconds > 0:
                self._latency[op] = seconds
            else:
                self._latency.pop(op, None)

    def random_faults(self, rate: float, seed: int, *, ops: frozenset[str] | None = None) -> None:
        """Fail each call of `ops` (all ops if None) with probability `rate`, reproducibly.

        Half of the injected write faults are lost responses (applied, then
        failed), the other half failed requests. ``rate=0`` turns this off.
        """
        if not 0.0 <= rate <= 1.0:
            raise ValueError("rate must be within [0, 1]")
        for op in ops or ():
            _check_op(op)
        with self._lock:
            self._random_rate = rate
            self._random_ops = ops if ops is not None else OPS
            self._rng = random.Random(seed)

    def clear(self) -> None:
        """Drop every scheduled, random and latency fault (counters are kept)."""
        with self._lock:
            self._queue.clear()
            self._latency.clear()
            self._random_rate = 0.0

    @property
    def pending(self) -> int:
        """Scheduled faults not yet consumed."""
        with self._lock:
            return len(self._queue)

    # -- execution ----------------------------------------------------------------

    def _choose(self, op: str) -> tuple[_Fault | None, float]:
        with self._lock:
            self.calls[op] += 1
            delay = self._latency.get(op, self._latency.get(None, 0.0))
            if delay:
                self.delayed += 1
            for i, fault in enumerate(self._queue):
                if fault.matches(op):
                    return self._queue.pop(i), delay
            if op in self._random_ops and self._rng.random() < self._random_rate:
                lose = op in WRITE_OPS and self._rng.random() < 0.5
                kind: FaultKind = self._rng.choice(("5xx", "throttle", "reset"))
                return _Fault(lose, kind, op), delay
            return None, delay

    def _run(self, op: str, key: str, fn: Callable[[], T]) -> T:
        fault, delay = self._choose(op)
        if delay:
            time.sleep(delay)
        if fault is None:
            return fn()
        if fault.lose_response:
            # The store handles the request; whatever it answered - success, 412,
            # 404, 409 - the caller never hears back.
            with contextlib.suppress(base.PreconditionFailed, base.ObjectNotFound, base.ConcurrentModification):
                fn()
            with self._lock:
                self.lost_responses += 1
            raise base.TransientStoreError(op, key, "injected: connection reset after the request")
        with self._lock:
            self.injected_failures += 1
        if fault.kind == "conflict":
            raise base.ConcurrentModification(key)
        raise base.TransientStoreError(op, key, _DETAIL[fault.kind])

    # -- ObjectStore ----------------------------------------------------------------

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        return self._run("put_if_absent", key, lambda: self.inner.put_if_absent(key, data, metadata))

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        return self._run("put_if_match", key, lambda: self.inner.put_if_match(key, data, etag, metadata))

    def delete_if_match(self, key: str, etag: str) -> None:
        self._run("delete_if_match", key, lambda: self.inner.delete_if_match(key, etag))

    def get(self, key: str) -> StoredObject:
        return self._run("get", key, lambda: self.inner.get(key))

    def head(self, key: str) -> ObjectMeta | None:
        return self._run("head", key, lambda: self.inner.head(key))

    def list(self, prefix: str) -> Iterator[str]:
        return self._run("list", prefix, lambda: iter(tuple(self.inner.list(prefix))))

    def close(self) -> None:
        """Close the inner store."""
        self.inner.close()
