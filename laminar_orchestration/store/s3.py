"""The S3 backend: conditional writes on AWS S3 or any S3-compatible endpoint.

Create-only is ``PutObject`` with ``If-None-Match: *``; compare-and-swap is
``PutObject`` / ``DeleteObject`` with ``If-Match: <etag>``. Every botocore or
HTTP failure is translated into the typed errors of `base`, so callers (and the
retry layer) never see a ``ClientError``:

* 412 ``PreconditionFailed`` -> `PreconditionFailed`;
* 409 ``ConditionalRequestConflict`` -> `ConcurrentModification`;
* 404 ``NoSuchKey`` -> `ObjectNotFound` (but `PreconditionFailed` for a CAS,
  whose precondition "the ETag is X" failed);
* 5xx, throttling, timeouts, dropped connections -> `TransientStoreError`;
* a missing bucket, bad credentials, a malformed endpoint, an endpoint that
  does not implement conditional writes -> `StoreUnavailable`, naming the
  bucket and endpoint so the operator can fix the configuration.

Two S3 properties callers must know:

* The ETag of a single-part upload is the MD5 of its bytes, so writing the same
  bytes twice yields the same ETag. Payloads must be unique (laminar puts a
  write id in every record) or compare-and-swap suffers ABA.
* User metadata travels as HTTP headers: keys are lowercased by S3 (this store
  lowercases them up front so what you read equals what you wrote) and values
  must be ASCII.

botocore's own retries are disabled: `RetryingStore` retries, and it must see
every transient failure of a conditional write to resolve it by reading back.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, NoReturn

import boto3
import botocore.exceptions as bce
from botocore.config import Config

import laminar_orchestration.store.base as base
from laminar_orchestration.store.base import ObjectMeta, ObjectStore, StoredObject, check_key
from laminar_orchestration.store.metering import RequestMethod

if TYPE_CHECKING:
    from typing import TypedDict, Unpack

    from mypy_boto3_s3 import S3Client

    class _PutCondition(TypedDict, total=False):
        """The precondition header of a conditional PutObject."""

        IfNoneMatch: str
        IfMatch: str


__all__ = ["S3ObjectStore", "make_s3_client"]

#: Error codes that mean "try again later" whatever their HTTP status.
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
    }
)
#: Error codes that no retry can fix: the configuration is wrong.
_AUTH_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
    }
)

# Short connect timeout: an unreachable endpoint should fail fast and be retried
# by RetryingStore. The read timeout covers a slow PUT of a few megabytes.
_CONNECT_TIMEOUT_S = 5.0
_READ_TIMEOUT_S = 30.0


def _endpoint_from_env() -> str | None:
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        value = os.environ.get(var, "").strip()
        if value:
            return value
    return None


def _unquote_etag(etag: str) -> str:
    return etag.strip().strip('"')


def _lower_keys(metadata: Mapping[str, str] | None) -> dict[str, str]:
    return {k.lower(): v for k, v in (metadata or {}).items()}


def make_s3_client(endpoint_url: str | None = None) -> S3Client:
    """A boto3 S3 client configured for laminar: no botocore retries, short timeouts.

    The endpoint is `endpoint_url`, else ``AWS_ENDPOINT_URL_S3``, else
    ``AWS_ENDPOINT_URL``, else AWS itself. With an explicit endpoint, buckets are
    addressed path-style. Raises StoreUnavailable for a malformed endpoint.
    """
    endpoint = (endpoint_url or "").strip() or _endpoint_from_env()
    config = Config(
        # RetryingStore owns retries: it must see each transient failure of a
        # conditional write to resolve its outcome by reading back.
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=_CONNECT_TIMEOUT_S,
        read_timeout=_READ_TIMEOUT_S,
        # Many threads may share one store (a worker's lease keepers).
        max_pool_connections=32,
        # Self-hosted endpoints rarely have wildcard DNS for bucket subdomains.
        s3={"addressing_style": "path"} if endpoint else None,
    )
    try:
        # A private session: boto3's default session is not thread-safe.
        session = boto3.session.Session()
        return session.client("s3", endpoint_url=endpoint, config=config)
    except (ValueError, bce.BotoCoreError) as exc:
        raise base.StoreUnavailable("open", "", f"cannot build an S3 client for endpoint {endpoint!r}: {exc}") from exc


class S3ObjectStore(ObjectStore):
    """An object store in an S3 bucket, under an optional key prefix.

    `url` is ``s3://bucket/prefix``; it does not carry the endpoint, which
    another process takes from ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``.
    The boto3 client is thread-safe, so one store may be shared by threads.
    A `client` passed in is used as is (and not closed by `close`); build it
    with `make_s3_client` so botocore does not retry behind our back.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: S3Client | None = None,
        endpoint_url: str | None = None,
    ) -> None:
        if not bucket:
            raise base.StoreUnavailable("open", "", "no S3 bucket given")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            # The prefix is part of every key, so it obeys the key rules too.
            check_key(self.prefix)
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._owns_client = client is None
        if client is None:
            try:
                client = make_s3_client(endpoint_url)
            except base.StoreUnavailable as exc:
                raise base.StoreUnavailable("open", "", f"bucket {bucket!r}: {exc.detail}") from exc
        self._client = client
        self.endpoint = str(self._client.meta.endpoint_url)
        # HEAD answers 404 with no body for a missing bucket and a missing key
        # alike; we check the bucket once so a typo is not read as "absent".
        self._bucket_verified = False

    def close(self) -> None:
        """Close the connection pool of a client this store created."""
        if self._owns_client:
            self._client.close()

    # -- keys and errors ------------------------------------------------------

    def _full(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self) -> str:
        return f"bucket {self.bucket!r} at {self.endpoint}"

    def _translate(
        self,
        exc: Exception,
        op: str,
        key: str,
        *,
        expected_etag: str | None = None,
    ) -> NoReturn:
        """Raise the typed store error for a botocore failure of `op` on `key`."""
        if isinstance(exc, bce.ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            message = str(error.get("Message", "")) or str(exc)
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if code == "PreconditionFailed" or status == 412:
                raise base.PreconditionFailed(key, expected_etag) from exc
            if code == "ConditionalRequestConflict" or status == 409:
                raise base.ConcurrentModification(key) from exc
            if code == "NoSuchBucket":
                raise base.StoreUnavailable(op, key, f"{self._where()} does not exist (NoSuchBucket)") from exc
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                raise base.ObjectNotFound(key) from exc
            if code == "AccessDenied" or (status == 403 and code in ("", "403", "Forbidden")):
                # This key is not these credentials' to touch (a HEAD's 403 carries no code); the
                # other refusals below concern the credentials themselves.
                raise base.AccessDenied(op, key, f"{self._where()} refused it ({code or status}): {message}") from exc
            if code in _AUTH_CODES or status == 403:
                raise base.StoreUnavailable(
                    op, key, f"access to {self._where()} refused ({code or status}): {message}"
                ) from exc
            if code == "NotImplemented" or status == 501:
                raise base.StoreUnavailable(
                    op,
                    key,
                    f"the endpoint of {self._where()} does not implement this request "
                    f"(conditional writes need If-None-Match/If-Match support): {message}",
                ) from exc
            if code in _TRANSIENT_CODES or status >= 500:
                raise base.TransientStoreError(op, key, f"{code or status}: {message}") from exc
            raise base.StoreUnavailable(
                op, key, f"unexpected S3 error from {self._where()}: {code} (HTTP {status}): {message}"
            ) from exc
        if isinstance(exc, bce.NoCredentialsError | bce.PartialCredentialsError):
            raise base.StoreUnavailable(op, key, f"no usable AWS credentials for {self._where()}: {exc}") from exc
        if isinstance(exc, bce.ConnectionError | bce.HTTPClientError | bce.IncompleteReadError):
            # Refused/reset connections, timeouts, truncated bodies: the request
            # may or may not have been applied; RetryingStore sorts that out.
            raise base.TransientStoreError(op, key, f"{type(exc).__name__}: {exc}") from exc
        if isinstance(exc, bce.BotoCoreError):
            raise base.StoreUnavailable(
                op, key, f"S3 client error for {self._where()}: {type(exc).__name__}: {exc}"
            ) from exc
        raise exc

    # -- ObjectStore ------------------------------------------------------------

    def _put_object(
        self, key: str, data: bytes, metadata: Mapping[str, str] | None, **condition: Unpack[_PutCondition]
    ) -> str:
        """One metered conditional PutObject (`condition`: IfNoneMatch or IfMatch); its ETag.

        botocore's errors pass through untranslated: each caller maps them for its own operation.
        """
        self.meter.count(RequestMethod.PUT, key)
        full = self._full(key)
        resp = self._client.put_object(
            Bucket=self.bucket, Key=full, Body=data, Metadata=_lower_keys(metadata), **condition
        )
        return _unquote_etag(resp["ETag"])

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        try:
            return self._put_object(key, data, metadata, IfNoneMatch="*")
        except (bce.ClientError, bce.BotoCoreError) as exc:
            self._translate(exc, "put_if_absent", key)

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        try:
            return self._put_object(key, data, metadata, IfMatch=f'"{_unquote_etag(etag)}"')
        except (bce.ClientError, bce.BotoCoreError) as exc:
            try:
                self._translate(exc, "put_if_match", key, expected_etag=etag)
            except base.ObjectNotFound:
                # S3 answers 404 for If-Match on a missing key; for the caller the
                # precondition "the ETag is `etag`" simply failed.
                raise base.PreconditionFailed(key, etag) from exc

    def delete_if_match(self, key: str, etag: str) -> None:
        self.meter.count(RequestMethod.DELETE, key)
        full = self._full(key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=full, IfMatch=f'"{_unquote_etag(etag)}"')
        except (bce.ClientError, bce.BotoCoreError) as exc:
            self._translate(exc, "delete_if_match", key, expected_etag=etag)

    def get(self, key: str) -> StoredObject:
        self.meter.count(RequestMethod.GET, key)
        full = self._full(key)
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=full)
            body = resp["Body"]
            try:
                data = body.read()
            finally:
                body.close()
        except (bce.ClientError, bce.BotoCoreError) as exc:
            self._translate(exc, "get", key)
        return StoredObject(
            key=key,
            data=data,
            etag=_unquote_etag(resp["ETag"]),
            metadata=dict(resp.get("Metadata", {})),
        )

    def head(self, key: str) -> ObjectMeta | None:
        self.meter.count(RequestMethod.HEAD, key)
        full = self._full(key)
        try:
            resp = self._client.head_object(Bucket=self.bucket, Key=full)
        except (bce.ClientError, bce.BotoCoreError) as exc:
            try:
                self._translate(exc, "head", key)
            except base.ObjectNotFound:
                self._verify_bucket("head", key)
                return None
        self._bucket_verified = True
        modified = resp.get("LastModified")
        return ObjectMeta(
            key=key,
            size=int(resp["ContentLength"]),
            etag=_unquote_etag(resp["ETag"]),
            metadata=dict(resp.get("Metadata", {})),
            last_modified=modified if isinstance(modified, datetime) else None,
        )

    def _verify_bucket(self, op: str, key: str) -> None:
        """Raise StoreUnavailable if the bucket itself is missing (checked once per store)."""
        if self._bucket_verified:
            return
        try:
            self.meter.count(RequestMethod.HEAD, "")
            self._client.head_bucket(Bucket=self.bucket)
        except bce.ClientError as exc:
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if status == 404:
                raise base.StoreUnavailable(op, key, f"{self._where()} does not exist (NoSuchBucket)") from exc
            if status != 403:
                self._translate(exc, op, key)
            # 403: the bucket exists; a least-privilege role may list only its prefixes, not HEAD the bucket.
        except bce.BotoCoreError as exc:
            self._translate(exc, op, key)
        # Benign race: several threads may verify at once; all write True.
        self._bucket_verified = True

    def list(self, prefix: str) -> Iterator[str]:
        # Eager on purpose: errors surface here, inside the retry layer, rather
        # than halfway through the caller's iteration.
        base = f"{self.prefix}/" if self.prefix else ""
        keys: list[str] = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=base + prefix):
                self.meter.count(RequestMethod.LIST, prefix)  # one billed request per page
                for item in page.get("Contents", []):
                    full = item.get("Key", "")
                    if full.startswith(base):
                        keys.append(full[len(base) :])
        except (bce.ClientError, bce.BotoCoreError) as exc:
            self._translate(exc, "list", prefix)
        self._bucket_verified = True
        # S3 already returns UTF-8 byte order (== code point order); sort anyway
        # because S3-compatible stores are not all so careful.
        return iter(sorted(keys))
