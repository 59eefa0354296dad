"""The output table's own objects (log entries, checkpoints, data files), read and written by name.

The committer writes its commits itself instead of through delta-rs, whose commit lists the log and
reads its own entry back: a request here is one billed request (one GET, HEAD or PUT), on a local
directory or under an S3 prefix. Every write is create-only (``If-None-Match: *`` on S3, a hard link
of a finished temporary file locally), so a log entry lands once or not at all and no writer can
replace another's data file.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from laminar_orchestration.store.metering import RequestMeter, RequestMethod
from laminar_orchestration.table.errors import TableStoreFault
from laminar_orchestration.table.location import TableLocation

#: S3 error codes meaning "no such object" (a HEAD answers a bare 404).
_ABSENT = frozenset({"404", "NoSuchKey", "NotFound"})
#: S3 error codes meaning "a create-only write found the object there" (409: a concurrent one in flight).
_PRESENT = frozenset({"412", "PreconditionFailed", "409", "ConditionalRequestConflict"})


def request_family(name: str) -> str:
    """The kind of table object `name` is, as a request meter's key: ``tables/log-entry``,
    ``tables/checkpoint``, ``tables/_last_checkpoint``, ``tables/log`` (a listing) or ``tables/data-file``."""
    if not name.startswith("_delta_log/"):
        return "tables/data-file" if name else "tables/log"
    leaf = name.rsplit("/", 1)[-1]
    if not leaf:
        return "tables/log"
    if leaf == "_last_checkpoint":
        return "tables/_last_checkpoint"
    return "tables/checkpoint" if ".checkpoint." in leaf else "tables/log-entry"


def _code(exc: Any) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


class TableObjects:
    """The objects under one table location, by name relative to its root (``_delta_log/...``)."""

    def __init__(self, location: TableLocation, meter: RequestMeter | None = None) -> None:
        self.location = location
        self._client: Any = None
        #: Requests sent, by method (GET, HEAD, PUT): what the tests and the benchmark count.
        self.requests: Counter[str] = Counter()
        #: Also counted here, by method and kind of object (`request_family`), when given.
        self.meter = meter

    def _count(self, method: RequestMethod, name: str) -> None:
        self.requests[method.value] += 1
        if self.meter is not None:
            self.meter.count(method, request_family(name))

    # -- addressing ----------------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        return Path(self.location.uri) / name

    def _bucket_key(self, name: str) -> tuple[str, str]:
        bucket, _, prefix = self.location.uri.split("://", 1)[1].partition("/")
        prefix = prefix.strip("/")
        return bucket, f"{prefix}/{name}" if prefix else name

    def _s3(self) -> Any:
        if self._client is None:
            from laminar_orchestration.store.s3 import make_s3_client

            self._client = make_s3_client(self.location.storage_options.get("AWS_ENDPOINT_URL"))
        return self._client

    def _fault(self, name: str, exc: BaseException) -> TableStoreFault:
        return TableStoreFault(self.location.uri, name, " ".join(str(exc).split())[:300])

    # -- requests ------------------------------------------------------------------------------

    def get(self, name: str) -> bytes | None:
        """The object's bytes; None if there is none."""
        self._count(RequestMethod.GET, name)
        if self.location.is_local:
            try:
                return self._path(name).read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None
            except OSError as exc:
                raise self._fault(name, exc) from exc
        bucket, key = self._bucket_key(name)
        try:
            body = self._s3().get_object(Bucket=bucket, Key=key)["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()
        except Exception as exc:
            if _code(exc) in _ABSENT:
                return None
            raise self._fault(name, exc) from exc

    def identity(self, name: str) -> str | None:
        """What tells this object from a replacement under the same name (ETag and size; inode,
        size and mtime locally), in one HEAD; None if there is none."""
        self._count(RequestMethod.HEAD, name)
        if self.location.is_local:
            try:
                st = self._path(name).stat()
            except (FileNotFoundError, NotADirectoryError):
                return None
            return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
        bucket, key = self._bucket_key(name)
        try:
            head = self._s3().head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            if _code(exc) in _ABSENT:
                return None
            raise self._fault(name, exc) from exc
        return f"{head.get('ETag')}:{head.get('ContentLength')}"

    def create(self, name: str, data: bytes) -> bool:
        """Write the object unless one is there: True if this call wrote it, False if it was there.

        TableStoreFault when the outcome is unknown (the caller reads the name again to find out).
        """
        self._count(RequestMethod.PUT, name)
        if self.location.is_local:
            path = self._path(name)
            # A finished file appears under its name at once, or not at all (readers never see half of it).
            tmp = path.parent / f"_commit_{uuid.uuid4().hex}.json.tmp"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_bytes(data)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    return False
                return True
            except OSError as exc:
                raise self._fault(name, exc) from exc
            finally:
                tmp.unlink(missing_ok=True)
        bucket, key = self._bucket_key(name)
        try:
            self._s3().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except Exception as exc:
            if _code(exc) in _PRESENT:
                return False
            raise self._fault(name, exc) from exc
        return True

    def put(self, name: str, data: bytes) -> None:
        """Write the object, replacing any (only `_last_checkpoint`, a hint readers check, is ever replaced)."""
        self._count(RequestMethod.PUT, name)
        try:
            if self.location.is_local:
                path = self._path(name)
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.parent / f"_commit_{uuid.uuid4().hex}.json.tmp"
                tmp.write_bytes(data)
                os.replace(tmp, path)
                return
            bucket, key = self._bucket_key(name)
            self._s3().put_object(Bucket=bucket, Key=key, Body=data)
        except Exception as exc:
            raise self._fault(name, exc) from exc

    def delete(self, name: str) -> None:
        """Remove the object (nothing if there is none)."""
        self._count(RequestMethod.DELETE, name)
        try:
            if self.location.is_local:
                self._path(name).unlink(missing_ok=True)
                return
            bucket, key = self._bucket_key(name)
            self._s3().delete_object(Bucket=bucket, Key=key)
        except Exception as exc:
            raise self._fault(name, exc) from exc

    def names(self, folder: str = "") -> list[str]:
        """The names of every object under `folder` (``""``: the whole table), in name order."""
        self._count(RequestMethod.LIST, folder)
        try:
            if self.location.is_local:
                root = Path(self.location.uri)
                base = root / folder if folder else root
                if not base.is_dir():
                    return []
                return sorted(p.relative_to(root).as_posix() for p in base.rglob("*") if p.is_file())
            bucket, prefix = self._bucket_key(folder)
            found: list[str] = []
            strip = len(self._bucket_key("")[1])
            for page in self._s3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                found.extend(str(o["Key"])[strip:] for o in page.get("Contents", []))
            return sorted(found)
        except Exception as exc:
            raise self._fault(folder or ".", exc) from exc
