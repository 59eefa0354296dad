"""Retries for transient store failures, without ever guessing a write's outcome.

Reads are simply retried. A conditional write is different: when it fails with
a `TransientStoreError` the request may have been applied and only the response
lost. Retrying it blindly would turn our own success into a false conflict
(create-only: "already exists") or, worse, make us believe we lost a race we
won. So after every unknown outcome the retry layer *reads the key back* and
decides:

=================  ==========================  ===============================
operation          read-back shows             verdict
=================  ==========================  ===============================
put_if_absent      absent                      not applied: retry the write
                   our bytes and metadata      applied: return its ETag
                   anything else               `PreconditionFailed`
put_if_match       the expected ETag           not applied: retry the write
                   our bytes and metadata      applied: return its ETag
                   anything else               `AmbiguousWrite`
delete_if_match    absent                      applied: done
                   the expected ETag           not applied: retry
                   anything else               `PreconditionFailed`
=================  ==========================  ===============================

"Our bytes" can only mean "our write" if no one else ever writes identical
bytes: callers MUST make every payload unique (laminar puts a write id in each
record). The same uniqueness protects compare-and-swap from ABA on S3, whose
ETag is the MD5 of the bytes.

A 409 `ConcurrentModification` on a write is handled the same way: another
conditional write was in flight, so re-read before deciding.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import laminar_orchestration.store.base as base
from laminar_orchestration.store.base import ObjectMeta, ObjectStore, StoredObject

__all__ = ["AmbiguousWrite", "RetryPolicy", "RetryingStore"]

T = TypeVar("T")


class AmbiguousWrite(base.PreconditionFailed):
    """A compare-and-swap whose outcome is unknown and whose key has moved on.

    The response was lost (or a 409 came back) and the read-back shows neither
    the expected ETag nor our bytes: our write may have landed and then been
    superseded by another writer, or it never landed and we lost the race. The
    caller must re-read the key and decide from its current content; it must
    not assume either outcome.
    """

    message = (
        "conditional write of {key!r} (expected ETag {expected_etag}) has an "
        "unknown outcome and the object has since changed: re-read it"
    )


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter.

    Attempt ``n`` (0-based) that failed is followed by a sleep drawn uniformly
    from ``[0, min(max_delay_s, base_delay_s * 2**n)]``; after `max_attempts`
    failed attempts the operation gives up with `StoreUnavailable`.
    """

    max_attempts: int = 6
    base_delay_s: float = 0.02
    max_delay_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("delays must not be negative")

    def delay(self, failed_attempt: int, rng: random.Random) -> float:
        """Seconds to sleep after the 0-based `failed_attempt` failed."""
        cap = min(self.max_delay_s, self.base_delay_s * (2.0**failed_attempt))
        return rng.uniform(0.0, cap)


class _Again:
    """What a settle function returns when the write did not land and may be sent again."""


_AGAIN = _Again()


def _norm_meta(metadata: Mapping[str, str] | None) -> dict[str, str]:
    # S3 lowercases metadata keys; compare case-insensitively so a read-back of
    # our own write through S3 is still recognised as ours.
    return {k.lower(): v for k, v in (metadata or {}).items()}


def _is_ours(obj: StoredObject, data: bytes, metadata: Mapping[str, str] | None) -> bool:
    return obj.data == data and _norm_meta(obj.metadata) == _norm_meta(metadata)


class RetryingStore(ObjectStore):
    """Wraps a store, retrying transient failures and resolving unknown write outcomes.

    See the module docstring for the read-back rules; payloads must be unique.

    Counters (thread-safe, for tests and benchmarks):

    * `attempts` - calls made to the inner store, read-backs included;
    * `retries` - calls repeated because the previous one failed transiently;
    * `resolved_by_readback` - writes with an unknown outcome that a read-back
      proved were applied (each would otherwise have been a false conflict).
    """

    def __init__(
        self,
        inner: ObjectStore,
        policy: RetryPolicy | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        seed: int | None = None,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self.meter = inner.meter
        self.policy = policy or RetryPolicy()
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.attempts = 0
        self.retries = 0
        self.resolved_by_readback = 0

    # -- plumbing ---------------------------------------------------------------

    def _count(self, *, attempt: bool = False, retry: bool = False, resolved: bool = False) -> None:
        with self._lock:
            self.attempts += attempt
            self.retries += retry
            self.resolved_by_readback += resolved

    def _backoff(self, failed_attempt: int) -> None:
        with self._lock:  # random.Random is not documented as thread-safe
            delay = self.policy.delay(failed_attempt, self._rng)
        self._sleep(delay)

    def _attempts(self) -> Iterator[int]:
        """Each attempt's 0-based number, once it is counted (and, from the second on, backed off for)."""
        for attempt in range(self.policy.max_attempts):
            if attempt:
                self._backoff(attempt - 1)
            self._count(attempt=True, retry=attempt > 0)
            yield attempt

    def _read(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """Run a read, retrying transient failures; StoreUnavailable when exhausted."""
        last: base.TransientStoreError | None = None
        for _ in self._attempts():
            try:
                return fn()
            except base.TransientStoreError as exc:
                last = exc
        raise base.StoreUnavailable(
            op, key, f"gave up after {self.policy.max_attempts} attempts; last error: {last}"
        ) from last

    def _read_back(self, op: str, key: str) -> StoredObject | None:
        try:
            return self._read(op, key, lambda: self.inner.get_or_none(key))
        except base.StoreUnavailable as exc:
            raise base.StoreUnavailable(
                op, key, f"the write's outcome is unknown and reading it back failed: {exc.detail}"
            ) from exc

    def _gave_up(self, op: str, key: str, last: Exception | None) -> base.StoreUnavailable:
        return base.StoreUnavailable(
            op,
            key,
            f"gave up after {self.policy.max_attempts} attempts (each read back: not applied); last error: {last}",
        )

    # -- conditional writes ----------------------------------------------------

    def _write(
        self,
        op: str,
        key: str,
        call: Callable[[], T],
        settle: Callable[[StoredObject | None], T | _Again],
        *,
        gone: tuple[type[Exception], ...] = (),
    ) -> T:
        """Run a conditional write, settling each unknown outcome by `settle`-ing the key read back.

        `settle` returns the write's result, `_AGAIN` when the write did not land, or raises the
        conflict. An error of `gone` after an unknown outcome stands for a read-back of "absent".
        """
        last: Exception | None = None
        uncertain = False  # has an earlier attempt possibly been applied?
        for _ in self._attempts():
            try:
                return call()
            except gone:
                if not uncertain:
                    raise
                outcome = settle(None)  # an earlier attempt landed after all
            except base.PreconditionFailed:
                if not uncertain:
                    raise
                # An earlier attempt that we read back as "not applied" may still have
                # landed late (a delayed request); it would make this retry fail.
                outcome = settle(self._read_back(op, key))
            except (base.TransientStoreError, base.ConcurrentModification) as exc:
                last, uncertain = exc, True
                outcome = settle(self._read_back(op, key))
            if not isinstance(outcome, _Again):
                return outcome
        raise self._gave_up(op, key, last) from last

    def _resolved(self, current: StoredObject) -> str:
        """The ETag of our own write that a read-back found applied."""
        self._count(resolved=True)
        return current.etag

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        """Create-only write; an unknown outcome is settled by reading the key back."""

        def settle(current: StoredObject | None) -> str | _Again:
            if current is None:
                return _AGAIN  # nothing landed: safe to write again
            if _is_ours(current, data, metadata):
                return self._resolved(current)
            raise base.PreconditionFailed(key, None)

        return self._write("put_if_absent", key, lambda: self.inner.put_if_absent(key, data, metadata), settle)

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        """Compare-and-swap; an unknown outcome is settled by reading the key back.

        Raises `AmbiguousWrite` (a `PreconditionFailed`) when the read-back
        shows neither the expected ETag nor our bytes.
        """

        def settle(current: StoredObject | None) -> str | _Again:
            if current is not None and current.etag == etag:
                return _AGAIN  # unchanged: our write did not land, try again
            if current is not None and _is_ours(current, data, metadata):
                return self._resolved(current)
            raise AmbiguousWrite(key, etag)

        return self._write("put_if_match", key, lambda: self.inner.put_if_match(key, data, etag, metadata), settle)

    def delete_if_match(self, key: str, etag: str) -> None:
        """Conditional delete; an unknown outcome is settled by reading the key back.

        If the read-back finds the key absent the delete counts as done, even
        though another writer's delete could have been the one that landed.
        """

        def settle(current: StoredObject | None) -> _Again | None:
            if current is None:
                self._count(resolved=True)
                return None
            if current.etag == etag:
                return _AGAIN
            raise base.PreconditionFailed(key, etag)

        self._write(
            "delete_if_match", key, lambda: self.inner.delete_if_match(key, etag), settle, gone=(base.ObjectNotFound,)
        )

    # -- reads -----------------------------------------------------------------

    def get(self, key: str) -> StoredObject:
        return self._read("get", key, lambda: self.inner.get(key))

    def head(self, key: str) -> ObjectMeta | None:
        return self._read("head", key, lambda: self.inner.head(key))

    def list(self, prefix: str) -> Iterator[str]:
        # Materialise inside the retry so a failure mid-listing is retried too.
        keys = self._read("list", prefix, lambda: tuple(self.inner.list(prefix)))
        return iter(keys)

    def close(self) -> None:
        """Close the inner store."""
        self.inner.close()
