"""Object storage with conditional writes: the interface, its backends, and `open_store`.

Store URLs:

* ``file:///abs/path`` (or a bare path) - the embedded local-filesystem store;
* ``s3://bucket/prefix`` - S3 or any S3-compatible endpoint; the endpoint comes
  from ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``), credentials and region
  from the usual boto3 chain.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from laminar_orchestration.store.base import (
    AccessDenied,
    ConcurrentModification,
    ForwardingStore,
    InvalidKey,
    InvalidStoreUrl,
    ObjectMeta,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StoredObject,
    StoreError,
    StoreUnavailable,
    TransientStoreError,
)
from laminar_orchestration.store.local import CorruptObject, LocalObjectStore

__all__ = [
    "AccessDenied",
    "ConcurrentModification",
    "CorruptObject",
    "ForwardingStore",
    "InvalidKey",
    "InvalidStoreUrl",
    "LocalObjectStore",
    "ObjectMeta",
    "ObjectNotFound",
    "ObjectStore",
    "PreconditionFailed",
    "S3Url",
    "StoreError",
    "StoreUnavailable",
    "StoredObject",
    "TransientStoreError",
    "default_store_url",
    "open_store",
    "parse_s3_url",
]

#: Where the store lives when neither ``--store`` nor ``LAMINAR_STORE`` says.
DEFAULT_LOCAL_DIR = ".laminar/store"


def default_store_url() -> str:
    """``LAMINAR_STORE`` if set, else a local store under the working directory."""
    env = os.environ.get("LAMINAR_STORE", "").strip()
    if env:
        return env
    return (Path.cwd() / DEFAULT_LOCAL_DIR).resolve().as_uri()


@dataclass(frozen=True)
class S3Url:
    """Where an ``s3://bucket/prefix`` store lives: its bucket, and its prefix without slashes around it."""

    bucket: str
    prefix: str


def parse_s3_url(url: str) -> S3Url:
    """The bucket and prefix an ``s3://`` store URL names; `InvalidStoreUrl` if it names no bucket."""
    parsed = urlparse(url.strip())
    if parsed.scheme.lower() != "s3":
        raise InvalidStoreUrl(url, "not an s3:// URL: use s3://bucket/prefix")
    if not parsed.netloc:
        raise InvalidStoreUrl(url, "s3 URL has no bucket: use s3://bucket/prefix")
    return S3Url(parsed.netloc, parsed.path.strip("/"))


def open_store(url: str | None = None, *, retrying: bool = True, create: bool = True) -> ObjectStore:
    """Open the store a URL names; S3 stores are wrapped in the retry layer unless asked not to.

    `create=False` refuses to create a missing local store directory (read-only commands).
    """
    url = (url or default_store_url()).strip()
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == "":
        if not url:
            raise InvalidStoreUrl(url, "empty")
        _refuse_url_typo(url)
        return _open_local(url, url, create)
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise InvalidStoreUrl(url, "file URLs take no host: use file:///absolute/path")
        try:
            path = unquote(parsed.path, errors="strict")
        except UnicodeDecodeError:
            raise InvalidStoreUrl(url, "the path's %-escapes are not UTF-8") from None
        if not path:
            raise InvalidStoreUrl(url, "file URL has no path")
        return _open_local(url, path, create)
    if scheme == "s3":
        location = parse_s3_url(url)
        from laminar_orchestration.store.s3 import S3ObjectStore

        inner: ObjectStore = S3ObjectStore(bucket=location.bucket, prefix=location.prefix)
        if not retrying:
            return inner
        from laminar_orchestration.store.retry import RetryingStore

        return RetryingStore(inner)
    raise InvalidStoreUrl(url, f"unsupported scheme {scheme!r}: use file:///path or s3://bucket/prefix")


#: A store URL whose ':' was lost (``s3//bucket/x``): a local path by the letter, a typo in fact.
_URL_TYPO = re.compile(r"^(s3|file)//+(.*)$", re.IGNORECASE)


def _refuse_url_typo(url: str) -> None:
    """InvalidStoreUrl for a path that reads as a store URL missing its ':', saying both readings."""
    match = _URL_TYPO.match(url)
    if match is None:
        return
    scheme, rest = match.group(1).lower(), match.group(2)
    meant = f"s3://{rest}" if scheme == "s3" else f"file:///{rest}"
    raise InvalidStoreUrl(
        url, f"it reads as a local directory, not a URL: write {meant} for the store URL, or ./{url} for that directory"
    )


def _open_local(url: str, path: str, create: bool) -> LocalObjectStore:
    """The local store at `path` (what `url` names); InvalidStoreUrl naming `url` if no directory can have that name."""
    if "\x00" in path:
        # Checked before the filesystem sees it: no file name holds a NUL, and nothing may be created.
        raise InvalidStoreUrl(url, "the path holds a NUL byte (%00), which no file name may contain")
    try:
        return LocalObjectStore(Path(path), create=create)
    except InvalidStoreUrl as exc:
        if exc.url == url:
            raise
        raise InvalidStoreUrl(url, exc.reason) from None
