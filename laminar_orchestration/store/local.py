"""The embedded default: an object store in a local directory.

Correct for several processes on one machine. Every object is one file holding
a small header (ETag, user metadata, size, checksum) followed by the bytes.
Writes go to a temporary file in the same directory, are fsynced, and are then
published atomically (`link` for create-only, `rename` for CAS), so a reader or
a crash never sees a torn object. Mutations of one key are serialized across
processes with an `flock` on a per-key lock file, and the directory entry is
fsynced before that lock is released.

File names (store format 2): key ``a/b`` is the file ``a/b%`` and every
segment has ``%`` escaped as ``%25``. A file name therefore always ends in a
bare ``%`` and a directory name never does, so ``a/b`` and ``a/b/c`` are
independent objects, as on S3. A store written before this format (no
``.laminar-store-format`` file, objects under their plain key) is opened in
format 1 and keeps working, without the prefix-key guarantee.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import struct
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import laminar_orchestration.store.base as base
from laminar_orchestration.errors import CorruptDataError, ErrorKind
from laminar_orchestration.store.base import ObjectMeta, ObjectStore, StoredObject, check_key
from laminar_orchestration.store.metering import RequestMethod

_MAGIC = b"LMOB1\n"
_HEADER_LEN = struct.Struct("<I")
_LOCK_DIR = ".locks"
_TMP_PREFIX = ".tmp-"
_CACHE_MAX_OBJECT = 16 * 1024
# Header layout: magic, u32 length, then '{"etag":"' and 24 hex digits (see _encode).
_ETAG_START = len(_MAGIC) + 4 + len('{"etag":"')
_ETAG_END = _ETAG_START + 24
_CACHE_ENTRIES = 50_000
#: Names the on-disk layout; absent in stores written before keys were escaped.
_FORMAT_FILE = ".laminar-store-format"
_FORMAT = "2"
#: Errors of a path the OS will never accept (too long, invalid bytes): the URL is wrong, retrying cannot help.
_REFUSED_NAME_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EINVAL, errno.EILSEQ})
#: Suffix of every object file in format 2 (see the module docstring).
_OBJ_SUFFIX = "%"


class CorruptObject(base.StoreError, CorruptDataError):
    """A file in the local store that is not a well-formed object (torn or foreign)."""

    key: str
    path: Path
    reason: str

    message = "corrupt object {key!r} at {path}: {reason}"


class NoSuchStore(base.StoreUnavailable):
    """A read-only open of a local store directory that does not exist (a typo must not create one)."""

    error_kind: ClassVar[ErrorKind] = ErrorKind.NOT_FOUND

    def _message(self) -> str:
        # Worded as what it is (its exit code is not-found's), not as an outage.
        return f"store not found: {self.detail}"


def _escape(segment: str) -> str:
    return segment.replace("%", "%25")


def _unescape(name: str) -> str:
    # Escaped text has every '%' followed by '25', so a left-to-right replace inverts _escape.
    return name.replace("%25", "%")


class LocalObjectStore(ObjectStore):
    """An object store rooted at a local directory."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True, create: bool = True) -> None:
        try:
            self.root = Path(root).resolve()
            is_file = self.root.exists() and not self.root.is_dir()
        except ValueError as exc:  # a NUL byte: Python refuses the name before the OS sees it
            raise base.InvalidStoreUrl(os.fspath(root), f"not a usable directory name: {exc}") from None
        except OSError as exc:
            if exc.errno not in _REFUSED_NAME_ERRNOS:
                raise base.StoreUnavailable("open", "", f"cannot inspect the store directory {root}: {exc}") from exc
            raise base.InvalidStoreUrl(
                os.fspath(root), f"the operating system refuses the name: {exc.strerror}"
            ) from None
        if is_file:
            raise base.InvalidStoreUrl(self.root.as_uri(), f"{self.root} is a file, not a store directory")
        if not create and not self.root.is_dir():
            # A typo in a store path must not silently create an empty store.
            raise NoSuchStore("open", "", f"no local store at {self.root} (does the path exist?)")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / _LOCK_DIR).mkdir(exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise base.InvalidStoreUrl(
                self.root.as_uri(), f"a parent of {self.root} is a file, not a directory"
            ) from None
        except OSError as exc:
            if exc.errno in _REFUSED_NAME_ERRNOS:
                reason = f"the operating system refuses the name {self.root}: {exc.strerror}"
                raise base.InvalidStoreUrl(self.root.as_uri(), reason) from None
            raise base.StoreUnavailable("open", "", f"cannot create the store directory {self.root}: {exc}") from exc
        self.url = self.root.as_uri()
        self._fsync = fsync
        self._cache: dict[str, tuple[bytes, StoredObject]] = {}
        self._paths: dict[str, str] = {}
        self._root_s = str(self.root)
        #: 2: escaped names (keys and prefixes never collide); 1: plain names of older stores.
        self.format = self._open_format()

    def _open_format(self) -> int:
        marker = self.root / _FORMAT_FILE
        try:
            return int(marker.read_text().strip() or _FORMAT)
        except FileNotFoundError:
            pass
        except ValueError as exc:
            raise CorruptObject(_FORMAT_FILE, marker, f"unreadable store format: {exc}") from exc
        with os.scandir(self.root) as entries:
            if any(e.name != _LOCK_DIR and not e.name.startswith(_TMP_PREFIX) for e in entries):
                return 1  # written before the format file existed: keep its plain names
        tmp = self.root / f"{_TMP_PREFIX}{secrets.token_hex(8)}"
        tmp.write_text(_FORMAT + "\n")
        try:
            os.link(tmp, marker)  # atomic: concurrent openers of an empty store agree on one format
        except FileExistsError:
            return int(marker.read_text().strip())
        finally:
            tmp.unlink()
        self._sync_dir(marker)
        return int(_FORMAT)

    def object_path(self, key: str) -> Path:
        """The file that holds `key` (for tools and tests that inspect the store on disk)."""
        return self._path(key)

    # -- paths and locks -------------------------------------------------

    def _path(self, key: str) -> Path:
        return Path(self._fspath(key))

    def _fspath(self, key: str) -> str:
        # Reads are hot (ledger refresh): validate each key once, join as strings.
        path = self._paths.get(key)
        if path is None:
            check_key(key)
            if key.split("/", 1)[0] == _LOCK_DIR:
                raise base.InvalidKey(key, f"the top-level name {_LOCK_DIR!r} is reserved")
            if self.format >= 2:
                *dirs, name = (_escape(s) for s in key.split("/"))
                path = "/".join([self._root_s, *dirs, name + _OBJ_SUFFIX])
            else:
                path = f"{self._root_s}/{key}"
            if len(self._paths) >= _CACHE_ENTRIES:
                self._paths.clear()
            self._paths[key] = path
        return path

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        digest = hashlib.sha1(key.encode()).hexdigest()
        fd = os.open(self.root / _LOCK_DIR / digest, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    # -- encoding ----------------------------------------------------------

    @staticmethod
    def _encode(data: bytes, metadata: Mapping[str, str] | None) -> tuple[bytes, str]:
        etag = secrets.token_hex(12)
        header = json.dumps(
            {
                "etag": etag,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "metadata": dict(metadata or {}),
            },
            separators=(",", ":"),
        ).encode()
        return _MAGIC + _HEADER_LEN.pack(len(header)) + header, etag

    def _read_header(self, key: str, path: Path, fh: object) -> dict[str, object]:
        assert hasattr(fh, "read")
        prefix = fh.read(len(_MAGIC) + _HEADER_LEN.size)
        if len(prefix) < len(_MAGIC) + _HEADER_LEN.size or not prefix.startswith(_MAGIC):
            raise CorruptObject(key, path, "missing object header (not written by laminar?)")
        (hlen,) = _HEADER_LEN.unpack(prefix[len(_MAGIC) :])
        raw = fh.read(hlen)
        try:
            header = json.loads(raw)
        except ValueError as exc:
            raise CorruptObject(key, path, f"unreadable header: {exc}") from exc
        if not isinstance(header, dict) or not {"etag", "size", "sha256", "metadata"} <= header.keys():
            raise CorruptObject(key, path, "header lacks etag/size/sha256/metadata")
        return header

    def _make_parents(self, path: Path) -> None:
        missing: list[Path] = []
        parent = path.parent
        while not parent.is_dir():
            missing.append(parent)
            parent = parent.parent
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):
                directory.mkdir()
            # A new directory's entry lives in its parent: sync it, or a synced object below could vanish.
            self._sync_dir(directory)

    def _write_tmp(self, path: Path, data: bytes, metadata: Mapping[str, str] | None) -> tuple[Path, str]:
        self._make_parents(path)
        tmp = path.parent / f"{_TMP_PREFIX}{secrets.token_hex(8)}"
        head, etag = self._encode(data, metadata)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, head)
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return tmp, etag

    def _sync_dir(self, path: Path) -> None:
        if not self._fsync:
            return
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _current_etag(self, key: str, path: Path) -> str | None:
        try:
            with open(path, "rb") as fh:
                return str(self._read_header(key, path, fh)["etag"])
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    # -- ObjectStore -------------------------------------------------------

    def _put(
        self,
        operation: str,
        key: str,
        data: bytes,
        metadata: Mapping[str, str] | None,
        install: Callable[[Path, Path], None],
    ) -> str:
        """Write the object to a temporary file, then, under the key's lock, `install` it at the key's path
        (or raise PreconditionFailed); the temporary file is gone either way."""
        self.meter.count(RequestMethod.PUT, key)
        path = self._path(key)
        try:
            tmp, etag = self._write_tmp(path, data, metadata)
            try:
                with self._locked(key):
                    install(tmp, path)
                    # Durable before the lock lets a contender see it: a grant another process lost
                    # to must not vanish in a power loss, nor a CAS the next one read.
                    self._sync_dir(path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        except OSError as exc:
            raise base.StoreUnavailable(operation, key, str(exc)) from exc
        return etag

    def put_if_absent(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> str:
        def create(tmp: Path, path: Path) -> None:
            try:
                os.link(tmp, path)  # atomic create-if-absent, across processes
            except FileExistsError:
                raise base.PreconditionFailed(key, None) from None

        return self._put("put_if_absent", key, data, metadata, create)

    def put_if_match(self, key: str, data: bytes, etag: str, metadata: Mapping[str, str] | None = None) -> str:
        def swap(tmp: Path, path: Path) -> None:
            if self._current_etag(key, path) != etag:
                raise base.PreconditionFailed(key, etag)
            os.replace(tmp, path)

        return self._put("put_if_match", key, data, metadata, swap)

    def delete_if_match(self, key: str, etag: str) -> None:
        self.meter.count(RequestMethod.DELETE, key)
        path = self._path(key)
        try:
            with self._locked(key):
                current = self._current_etag(key, path)
                if current is None:
                    raise base.ObjectNotFound(key)
                if current != etag:
                    raise base.PreconditionFailed(key, etag)
                os.unlink(path)
                self._sync_dir(path)
        except OSError as exc:
            raise base.StoreUnavailable("delete_if_match", key, str(exc)) from exc

    def get(self, key: str) -> StoredObject:
        obj = self.get_or_none(key)
        if obj is None:
            raise base.ObjectNotFound(key)
        return obj

    def get_or_none(self, key: str) -> StoredObject | None:
        self.meter.count(RequestMethod.GET, key)
        fspath = self._fspath(key)
        try:
            fd = os.open(fspath, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        with os.fdopen(fd, "rb") as fh:
            # The ETag sits at a fixed offset of the header and is random per write:
            # when it matches the cached one the bytes are the cached bytes. This
            # keeps refreshing thousands of small ledger heads cheap.
            prefix = fh.read(_ETAG_END)
            cached = self._cache.get(key)
            if cached is not None and prefix == cached[0]:
                return cached[1]
            fh.seek(0)
            try:
                header = self._read_header(key, Path(fspath), fh)
                data = fh.read()
            except IsADirectoryError:
                return None
        if len(data) != header["size"] or hashlib.sha256(data).hexdigest() != header["sha256"]:
            raise CorruptObject(key, Path(fspath), "payload does not match its recorded size/checksum")
        meta = header["metadata"]
        assert isinstance(meta, dict)
        obj = StoredObject(key=key, data=data, etag=str(header["etag"]), metadata=meta)
        if len(data) <= _CACHE_MAX_OBJECT and prefix[_ETAG_START:] == obj.etag.encode():
            if len(self._cache) >= _CACHE_ENTRIES:
                self._cache.clear()
            self._cache[key] = (prefix, obj)
        return obj

    def head(self, key: str) -> ObjectMeta | None:
        self.meter.count(RequestMethod.HEAD, key)
        path = self._path(key)
        try:
            with open(path, "rb") as fh:
                header = self._read_header(key, path, fh)
                # Objects are published by link/rename of a finished file: its mtime is the write's.
                mtime = os.fstat(fh.fileno()).st_mtime
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        meta = header["metadata"]
        assert isinstance(meta, dict)
        size = header["size"]
        assert isinstance(size, int)
        modified = datetime.fromtimestamp(mtime, UTC)
        return ObjectMeta(key=key, size=size, etag=str(header["etag"]), metadata=meta, last_modified=modified)

    def list(self, prefix: str) -> Iterator[str]:
        self.meter.count(RequestMethod.LIST, prefix)
        base = self.root
        escaped = self.format >= 2
        keys: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            rel_dir = os.path.relpath(dirpath, base)
            if rel_dir == ".":
                dirnames[:] = [d for d in dirnames if d != _LOCK_DIR]
                rel_dir = ""
            if escaped:
                rel_dir = "/".join(_unescape(d) for d in rel_dir.split("/")) if rel_dir else ""
            for name in filenames:
                if name.startswith(_TMP_PREFIX) or name == _FORMAT_FILE:
                    continue
                if escaped:
                    if not name.endswith(_OBJ_SUFFIX):
                        continue  # not an object file (a stray file someone put here)
                    name = _unescape(name[: -len(_OBJ_SUFFIX)])
                key = f"{rel_dir}/{name}" if rel_dir else name
                if key.startswith(prefix):
                    keys.append(key)
        return iter(sorted(keys))

    def sweep_temporaries(self, older_than_s: float = 3600.0) -> int:
        """Remove temporary files left by writers that crashed mid-write. Returns the count."""
        import time

        cutoff = time.time() - older_than_s
        removed = 0
        for dirpath, _dirs, filenames in os.walk(self.root):
            for name in filenames:
                if name.startswith(_TMP_PREFIX):
                    p = Path(dirpath) / name
                    try:
                        if p.stat().st_mtime < cutoff:
                            p.unlink()
                            removed += 1
                    except OSError as exc:
                        if exc.errno != errno.ENOENT:
                            raise
        return removed
