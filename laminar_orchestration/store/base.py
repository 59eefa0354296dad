"""The object-store interface every backend implements.

Conditional writes are the only coordination primitive laminar relies on:
create-only (`If-None-Match: *`) mints unique names, compare-and-swap on the
ETag (`If-Match`) advances mutable pointers. Listing exists for audits and
anti-entropy sweeps only; nothing on a hot path may call it.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from laminar_orchestration.errors import ConflictError, InvalidInputError, LaminarError, NotFoundError, UnavailableError
from laminar_orchestration.store.metering import PROCESS_METER, RequestMeter


@dataclass(frozen=True)
class ObjectMeta:
    """What `head` returns: identity and size of one stored object."""

    key: str
    size: int
    etag: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    #: When the store last wrote the object, by the store's clock (None: the backend does not say).
    #: The writer cannot choose it, unlike the ULID in a name; not part of the object's identity.
    last_modified: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True)
class StoredObject:
    """What `get` returns: the bytes and the ETag they were read at."""

    key: str
    data: bytes
    etag: str
    metadata: Mapping[str, str] = field(default_factory=dict)


class StoreError(LaminarError):
    """Base of every error an object store raises."""


class PreconditionFailed(StoreError, ConflictError):
    """A conditional write lost: the object exists (create-only) or its ETag moved (CAS).

    HTTP 412 on S3. `expected_etag` is None for a create-only write.
    """

    key: str
    expected_etag: str | None

    def _message(self) -> str:
        if self.expected_etag is None:
            return f"create-only write of {self.key!r} failed: the object already exists"
        return f"conditional write of {self.key!r} failed: ETag is no longer {self.expected_etag}"


class ConcurrentModification(StoreError, ConflictError):
    """Another conditional write on the same key was in flight (HTTP 409 on S3). Retry after re-reading."""

    key: str

    message = "concurrent conditional write on {key!r} (409 conflict)"


class ObjectNotFound(StoreError, NotFoundError):
    """The key does not exist."""

    key: str

    message = "object {key!r} not found"


class TransientStoreError(StoreError, UnavailableError):
    """A failure worth retrying: 5xx, throttling, a reset connection, a timeout."""

    operation: str
    key: str
    detail: str

    message = "transient failure in {operation} of {key!r}: {detail}"


class StoreUnavailable(StoreError, UnavailableError):
    """Retries were exhausted, or the store is misconfigured/unreachable."""

    operation: str
    key: str
    detail: str

    def _message(self) -> str:
        where = f" of {self.key!r}" if self.key else ""
        return f"store unavailable during {self.operation}{where}: {self.detail}"


class AccessDenied(StoreUnavailable):
    """The store refused this request to the caller's credentials (HTTP 403 AccessDenied): their
    policy does not allow it on `key`. A retry with them fails alike; another principal's may not."""

    def _message(self) -> str:
        return f"{self.operation} of {self.key!r} denied to these credentials: {self.detail}"


class InvalidStoreUrl(StoreError, InvalidInputError):
    """A store URL that names no supported backend or lacks a part."""

    url: str
    reason: str

    message = "invalid store URL {url!r}: {reason}"


class InvalidKey(StoreError, InvalidInputError):
    """A key that is empty, absolute, or escapes the store root."""

    key: str
    reason: str

    message = "invalid object key {key!r}: {reason}"


def check_key(key: str) -> str:
    """Reject keys that could escape a prefix or collide with backend internals."""
    if not key:
        raise InvalidKey(key, "empty")
    if key.startswith("/") or key.endswith("/"):
        raise InvalidKey(key, "must not start or end with '/'")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidKey(key, "empty, '.' or '..' path segment")
    if any(p.startswith(".tmp-") for p in parts):
        raise InvalidKey(key, "segments starting with '.tmp-' are reserved")
    return key


class ObjectStore(abc.ABC):
    """Conditional-write object storage. Thread-safe; safe across processes."""

    #: A URL that reopens this store from another process (`file://...` or `s3://...`).
    url: str
    #: Where a backend counts the requests it sends (the process's meter unless given another).
    meter: RequestMeter = PROCESS_METER

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        """Create `key` only if it does not exist; return the new ETag.

        Raises PreconditionFailed if the key exists.
        """

    @abc.abstractmethod
    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        """Replace `key` only if its current ETag is `etag`; return the new ETag.

        Raises PreconditionFailed if the ETag moved or the key is gone.
        """

    @abc.abstractmethod
    def delete_if_match(self, key: str, etag: str) -> None:
        """Delete `key` only if its current ETag is `etag`.

        Raises PreconditionFailed if the ETag moved, ObjectNotFound if absent.
        """

    @abc.abstractmethod
    def get(self, key: str) -> StoredObject:
        """Read `key` with its ETag and user metadata. Raises ObjectNotFound."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectMeta | None:
        """Size, ETag and user metadata of `key`, or None if absent."""

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[str]:
        """Keys under `prefix`, sorted. For audits and anti-entropy only, never a hot path."""

    def get_or_none(self, key: str) -> StoredObject | None:
        """`get`, but None instead of ObjectNotFound."""
        try:
            return self.get(key)
        except ObjectNotFound:
            return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections or handles. The default holds none."""


class ForwardingStore(ObjectStore):
    """Forwards every call to `inner`: the base of a wrapper that changes one call (it keeps the inner
    store's URL and request meter)."""

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
