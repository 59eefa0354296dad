"""Where the output table lives, and how delta-rs reaches it.

By default the table sits beside the store it is derived from: under the
local store's directory (``<root>/tables/output``) or under the S3 store's
prefix (``s3://bucket/prefix/tables/output``). ``LAMINAR_TABLE_URI`` or an
explicit URI puts it elsewhere. delta-rs does not use boto3, so for S3 the
endpoint, region and credentials boto3 resolves are handed to it as storage
options; delta-rs 1.x commits the log with conditional puts (``If-None-Match``),
so concurrent writers need no lock table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from urllib.parse import unquote, urlparse

from laminar_orchestration.errors import InvalidInputError
from laminar_orchestration.protocol.keys import TABLES_PREFIX
from laminar_orchestration.store import LocalObjectStore, ObjectStore

#: Where the table is relative to the store's root or prefix.
DEFAULT_TABLE_PATH = f"{TABLES_PREFIX}output"
#: Environment variable naming the table's URI (overrides the default beside the store).
TABLE_URI_ENV = "LAMINAR_TABLE_URI"


class InvalidTableUri(InvalidInputError, ValueError):
    """A table URI delta-rs cannot use."""

    uri: str
    reason: str

    message = "output table {uri!r}: {reason}"


@dataclass(frozen=True)
class TableLocation:
    """A Delta table's URI and the storage options delta-rs needs to reach it."""

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def is_local(self) -> bool:
        return not urlparse(self.uri).scheme

    def options(self) -> dict[str, str] | None:
        """The storage options as delta-rs takes them (None for a local path)."""
        return dict(self.storage_options) if self.storage_options else None

    def describe(self) -> str:
        """The URI without credentials: safe to print."""
        return self.uri


def _innermost(store: ObjectStore) -> ObjectStore:
    """The backend under wrappers (retrying, metering, fault injection) that keep theirs in `inner`."""
    seen = 0
    while isinstance(getattr(store, "inner", None), ObjectStore) and seen < 16:
        store = store.inner  # type: ignore[attr-defined]
        seen += 1
    return store


def _s3_options(endpoint: str | None) -> dict[str, str]:
    """Endpoint, region and credentials for delta-rs, as boto3 resolves them for the store."""
    import boto3

    options: dict[str, str] = {}
    session = boto3.Session()
    creds = session.get_credentials()
    if creds is not None:
        frozen = creds.get_frozen_credentials()
        options["AWS_ACCESS_KEY_ID"] = frozen.access_key or ""
        options["AWS_SECRET_ACCESS_KEY"] = frozen.secret_key or ""
        if frozen.token:
            options["AWS_SESSION_TOKEN"] = frozen.token
    options["AWS_REGION"] = session.region_name or os.environ.get("AWS_REGION") or "us-east-1"
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and "amazonaws.com" not in endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


def _from_uri(uri: str, endpoint: str | None = None) -> TableLocation:
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        path = unquote(parsed.path) if scheme == "file" else uri
        if not path:
            raise InvalidTableUri(uri, "no path")
        return TableLocation(str(Path(path).resolve()))
    if scheme in ("s3", "s3a"):
        if not parsed.netloc:
            raise InvalidTableUri(uri, "no bucket: use s3://bucket/prefix")
        return TableLocation(f"s3://{parsed.netloc}/{parsed.path.strip('/')}", MappingProxyType(_s3_options(endpoint)))
    raise InvalidTableUri(uri, f"unsupported scheme {scheme!r}: use a path, file:///path or s3://bucket/prefix")


def table_location(store: ObjectStore, uri: str | None = None) -> TableLocation:
    """The output table of `store`: `uri`, else ``$LAMINAR_TABLE_URI``, else beside the store."""
    backend = _innermost(store)
    endpoint = getattr(backend, "endpoint", None)
    explicit = (uri or os.environ.get(TABLE_URI_ENV, "")).strip()
    if explicit:
        return _from_uri(explicit, endpoint if isinstance(endpoint, str) else None)
    if isinstance(backend, LocalObjectStore):
        return TableLocation(str(backend.root / DEFAULT_TABLE_PATH))
    url = store.url.rstrip("/")
    return _from_uri(f"{url}/{DEFAULT_TABLE_PATH}", endpoint if isinstance(endpoint, str) else None)
