"""The local-filesystem store: correct for several processes on one machine, a reader or a crash never
sees a torn object, and a store path no directory can have is a typed error that names it.

Every object is one file (a header with its ETag, size and checksum, then the bytes), written to a
temporary file and published atomically under a per-key `flock`; the shared contract every backend
keeps is `tests/store/test_base.py`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.queues import Queue as MpQueue
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path

import pytest

from laminar_orchestration.errors import ErrorKind
from laminar_orchestration.store import (
    CorruptObject,
    InvalidKey,
    InvalidStoreUrl,
    LocalObjectStore,
    PreconditionFailed,
    StoreUnavailable,
)
from laminar_orchestration.store.local import NoSuchStore
from tests.store.test_base import _assert_no_lost_update, _increment, _IncrementLog
from tests.threads import run_together

META = {"writer-id": "w-1"}

# -- concurrency: processes (S3 is shared by construction) ----------------------------------

N_PROCS = 4


def _proc_main(task: str, root: str, start: MpEvent, out: MpQueue[tuple[int, str, object]], i: int) -> None:
    """Body of one racing process; reports (i, "ok", result) or (i, "error", repr)."""
    try:
        store = LocalObjectStore(root)  # each process opens the store on its own
        start.wait()
        result: object
        if task == "create":
            try:
                result = store.put_if_absent("race/lease", f"proc-{i}".encode())
            except PreconditionFailed:
                result = None
        else:
            result = _increment(store, "counter", f"p{i}", 10).bases
        out.put((i, "ok", result))
    except BaseException as exc:  # surface child failures instead of a queue timeout
        out.put((i, "error", repr(exc)))


def _run_procs(task: str, root: str) -> dict[int, object]:
    # fork keeps this quick (spawn re-imports pytest and boto3 per child). The
    # children still contend as independent processes: each opens its own
    # store, so every flock is taken on a file description of its own.
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    out: MpQueue[tuple[int, str, object]] = ctx.Queue()
    procs = [ctx.Process(target=_proc_main, args=(task, root, start, out, i)) for i in range(N_PROCS)]
    for p in procs:
        p.start()
    start.set()  # release them together
    results: dict[int, object] = {}
    for _ in procs:
        i, status, value = out.get(timeout=60)
        assert status == "ok", value
        results[i] = value
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return results


def test_processes_racing_create_only_exactly_one_wins(local_store: LocalObjectStore) -> None:
    results = _run_procs("create", str(local_store.root))

    winners = {i: etag for i, etag in results.items() if etag is not None}
    assert len(winners) == 1
    [(winner, etag)] = winners.items()
    obj = local_store.get("race/lease")
    assert (obj.data, obj.etag) == (f"proc-{winner}".encode(), etag)


def test_processes_cas_increments_lose_no_update(local_store: LocalObjectStore) -> None:
    local_store.put_if_absent("counter", json.dumps({"n": 0, "writer": "init"}).encode())

    results = _run_procs("increment", str(local_store.root))

    logs = []
    for bases in results.values():
        assert isinstance(bases, list)
        logs.append(_IncrementLog(bases=bases))
    assert sum(len(log.bases) for log in logs) == N_PROCS * 10
    _assert_no_lost_update(local_store, "counter", logs)


def test_a_rewrite_by_another_opener_is_read_not_the_bytes_read_before(tmp_path: Path) -> None:
    # Each opener caches small objects by ETag: a write through another opener (another process)
    # must still be seen, even at the same size.
    writer, reader = LocalObjectStore(tmp_path / "s"), LocalObjectStore(tmp_path / "s")
    etag = writer.put_if_absent("ledger/head", b"epoch-1")
    assert reader.get("ledger/head").data == b"epoch-1"
    writer.put_if_match("ledger/head", b"epoch-2", etag)
    obj = reader.get("ledger/head")
    assert (obj.data, obj.etag) == (b"epoch-2", writer.get("ledger/head").etag)


# -- atomic publication and torn files --------------------------------------------------------


def _temporaries(store: LocalObjectStore) -> list[Path]:
    return [p for p in store.root.rglob("*") if p.name.startswith(".tmp-")]


def test_a_reader_sees_each_version_whole_while_it_is_replaced(local_store: LocalObjectStore) -> None:
    # Large enough that a copy in place would be seen half-written; the rename publishes it at once.
    versions = [bytes([i]) * (1 << 20) for i in range(12)]
    etag = local_store.put_if_absent("big", versions[0])
    seen: set[bytes] = set()
    done = threading.Event()

    def write_or_read(i: int) -> None:
        if i == 0:
            nonlocal etag
            for data in versions[1:]:
                etag = local_store.put_if_match("big", data, etag)
            done.set()
            return
        while not done.is_set() or not seen:
            data = local_store.get("big").data  # a torn file would raise CorruptObject here
            assert data in versions
            seen.add(data[:1])

    errors = run_together(write_or_read, 2, 60)
    assert not errors, errors
    assert seen and local_store.get("big").data == versions[-1]


def test_a_conditional_write_leaves_no_temporary_file_whether_it_wins_or_loses(
    local_store: LocalObjectStore,
) -> None:
    etag = local_store.put_if_absent("grants/1", b"g1")
    with pytest.raises(PreconditionFailed):
        local_store.put_if_absent("grants/1", b"g2")
    with pytest.raises(PreconditionFailed):
        local_store.put_if_match("grants/1", b"g3", "0" * 24)
    local_store.put_if_match("grants/1", b"g4", etag)
    assert _temporaries(local_store) == []
    assert local_store.get("grants/1").data == b"g4"


def test_a_failed_publish_is_unavailable_and_leaves_neither_object_nor_temporary_file(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_link(src: object, dst: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "link", broken_link)
    with pytest.raises(StoreUnavailable) as unavailable:
        local_store.put_if_absent("leases/p3", b"mine")
    monkeypatch.undo()
    assert (unavailable.value.operation, unavailable.value.key) == ("put_if_absent", "leases/p3")
    assert "Input/output error" in str(unavailable.value)
    assert local_store.head("leases/p3") is None and _temporaries(local_store) == []


def test_a_crashed_writers_temporary_file_is_no_object_and_is_swept_once_old(local_store: LocalObjectStore) -> None:
    local_store.put_if_absent("a/k", b"v1")
    # What a writer killed mid-write leaves beside the object: a partial temporary file.
    torn = local_store.object_path("a/k").parent / ".tmp-0123456789abcdef"
    torn.write_bytes(b"LMOB1\n\x00\x00")
    assert list(local_store.list("")) == ["a/k"]
    assert local_store.get("a/k").data == b"v1"

    assert local_store.sweep_temporaries(older_than_s=3600) == 0  # a live writer's file may be fresh
    assert torn.exists()
    hour_ago = time.time() - 7200
    os.utime(torn, (hour_ago, hour_ago))
    assert local_store.sweep_temporaries(older_than_s=3600) == 1
    assert not torn.exists() and local_store.get("a/k").data == b"v1"


def _corrupt(store: LocalObjectStore, key: str, edit: Callable[[bytes], bytes]) -> None:
    path = store.object_path(key)
    path.write_bytes(edit(path.read_bytes()))


@pytest.mark.parametrize(
    "edit",
    [
        lambda raw: b"this is not a laminar object",
        lambda raw: raw[:-1] + bytes([raw[-1] ^ 0xFF]),  # payload bit rot
        lambda raw: raw[:-3],  # torn write
    ],
    ids=["garbage", "bit-rot", "truncated"],
)
def test_corrupt_local_object_is_reported_with_its_key(
    local_store: LocalObjectStore, edit: Callable[[bytes], bytes]
) -> None:
    local_store.put_if_absent("leases/p7", b"payload-bytes", META)
    _corrupt(local_store, "leases/p7", edit)

    with pytest.raises(CorruptObject) as corrupt:
        local_store.get("leases/p7")
    assert corrupt.value.key == "leases/p7"
    assert "leases/p7" in str(corrupt.value)


def test_local_store_syncs_the_directory_before_releasing_the_key_lock(
    local_store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_locked = local_store._locked
    real_sync = local_store._sync_dir

    @contextlib.contextmanager
    def locked(key: str) -> Iterator[None]:
        with real_locked(key):
            events.append("lock")
            yield
            events.append("unlock")

    def sync(path: Path) -> None:
        events.append("sync")
        real_sync(path)

    monkeypatch.setattr(local_store, "_locked", locked)
    monkeypatch.setattr(local_store, "_sync_dir", sync)
    for op in (
        lambda: local_store.put_if_absent("grants/1", b"g"),
        lambda: local_store.put_if_match("grants/1", b"h", local_store.get("grants/1").etag),
        lambda: local_store.delete_if_match("grants/1", local_store.get("grants/1").etag),
    ):
        events.clear()
        op()
        assert events[-3:] == ["lock", "sync", "unlock"], events


# -- on-disk format -------------------------------------------------------------------------


def test_local_store_opens_a_store_written_before_keys_were_escaped(tmp_path: Path) -> None:
    root = tmp_path / "old"
    (root / ".locks").mkdir(parents=True)
    # An object as the previous format wrote it: the file sits under the plain key.
    (root / "ledger").mkdir()
    (root / "ledger" / "cluster.json").write_bytes(LocalObjectStore._encode(b"{}", None)[0] + b"{}")
    old = LocalObjectStore(root)
    assert old.format == 1 and old.get("ledger/cluster.json").data == b"{}"
    assert list(old.list("")) == ["ledger/cluster.json"]
    old.put_if_absent("ledger/more", b"x")
    assert (root / "ledger" / "more").exists()
    new = LocalObjectStore(tmp_path / "new")
    new.put_if_absent("ledger/more", b"x")
    assert new.format == 2 and new.object_path("ledger/more").name == "more%"
    assert LocalObjectStore(tmp_path / "new", create=False).format == 2


def test_an_unreadable_store_format_is_reported_as_corrupt(tmp_path: Path) -> None:
    root = tmp_path / "s"
    LocalObjectStore(root)
    (root / ".laminar-store-format").write_text("two\n")
    with pytest.raises(CorruptObject) as corrupt:
        LocalObjectStore(root)
    assert "unreadable store format" in str(corrupt.value)


def test_the_lock_directory_is_no_key_and_is_never_listed(local_store: LocalObjectStore) -> None:
    local_store.put_if_absent("k", b"v")  # takes a lock file under .locks/
    with pytest.raises(InvalidKey) as invalid:
        local_store.put_if_absent(".locks/k", b"v")
    assert "reserved" in str(invalid.value)
    assert list(local_store.list("")) == ["k"]


# -- opening a store --------------------------------------------------------------------------


def test_a_read_only_open_of_a_missing_store_names_it_and_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "stroe"
    with pytest.raises(NoSuchStore) as missing:
        LocalObjectStore(typo, create=False)
    assert isinstance(missing.value, StoreUnavailable) and missing.value.error_kind == ErrorKind.NOT_FOUND
    assert str(typo) in str(missing.value)
    assert not typo.exists()


def _a_file(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("not a store")
    return tmp_path / "notes.txt"


@pytest.mark.parametrize(
    ("root", "reason"),
    [
        pytest.param(_a_file, "is a file, not a store directory", id="a-file"),
        pytest.param(lambda t: _a_file(t) / "store", "a parent of", id="a-parent-is-a-file"),
        pytest.param(lambda t: t / "x\x00y", "not a usable directory name", id="nul"),
        pytest.param(lambda t: t / ("a" * 300) / "store", "refuses the name", id="name-too-long"),
    ],
)
def test_a_path_no_store_directory_can_have_is_an_invalid_store_url_naming_it(
    tmp_path: Path, root: Callable[[Path], Path], reason: str
) -> None:
    path = root(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(InvalidStoreUrl) as invalid:
        LocalObjectStore(path)
    assert reason in invalid.value.reason
    assert path.name in invalid.value.url
    assert sorted(tmp_path.rglob("*")) == before  # nothing created
