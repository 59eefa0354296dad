"""One conformance suite for every ObjectStore backend (local filesystem and S3).

Each test states a promise of `ObjectStore` that laminar's fencing relies on and
runs it against both backends through the `store` fixture. The concurrency
tests race real threads so a non-atomic conditional write would show up as two
winners or a lost update. What one backend alone promises is in
`tests/store/test_local.py` (there, real processes race too) and
`tests/store/test_s3.py`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from laminar_orchestration.store import InvalidKey, ObjectNotFound, ObjectStore, PreconditionFailed
from tests.threads import run_together

# -- basic semantics -----------------------------------------------------------------


def test_put_if_absent_creates_once(store: ObjectStore) -> None:
    etag = store.put_if_absent("leases/p0", b"first", {"writer": "w1"})

    with pytest.raises(PreconditionFailed) as failed:
        store.put_if_absent("leases/p0", b"second", {"writer": "w2"})

    assert failed.value.key == "leases/p0"
    assert failed.value.expected_etag is None
    obj = store.get("leases/p0")
    assert (obj.data, obj.etag, dict(obj.metadata)) == (b"first", etag, {"writer": "w1"})


def test_put_if_match_swaps_when_etag_is_current(store: ObjectStore) -> None:
    e1 = store.put_if_absent("ptr", b"v1")

    e2 = store.put_if_match("ptr", b"v2", e1, {"epoch": "2"})

    assert e2 != e1
    obj = store.get("ptr")
    assert (obj.data, obj.etag, dict(obj.metadata)) == (b"v2", e2, {"epoch": "2"})


def test_put_if_match_rejects_stale_etag(store: ObjectStore) -> None:
    e1 = store.put_if_absent("ptr", b"v1")
    e2 = store.put_if_match("ptr", b"v2", e1)

    with pytest.raises(PreconditionFailed) as failed:
        store.put_if_match("ptr", b"v3", e1)

    assert (failed.value.key, failed.value.expected_etag) == ("ptr", e1)
    obj = store.get("ptr")
    assert (obj.data, obj.etag) == (b"v2", e2)


def test_put_if_match_on_missing_key_is_a_failed_precondition(store: ObjectStore) -> None:
    with pytest.raises(PreconditionFailed):
        store.put_if_match("never-created", b"v", "0123456789abcdef")
    # And on a key that existed but was deleted: the old ETag must not revive it.
    etag = store.put_if_absent("gone", b"v1")
    store.delete_if_match("gone", etag)
    with pytest.raises(PreconditionFailed):
        store.put_if_match("gone", b"v2", etag)
    assert store.head("never-created") is None
    assert store.head("gone") is None


def test_delete_if_match(store: ObjectStore) -> None:
    e1 = store.put_if_absent("k", b"v1")
    e2 = store.put_if_match("k", b"v2", e1)

    with pytest.raises(PreconditionFailed) as failed:
        store.delete_if_match("k", e1)  # stale ETag: must not delete
    assert failed.value.expected_etag == e1
    assert store.get("k").data == b"v2"

    store.delete_if_match("k", e2)
    assert store.head("k") is None
    with pytest.raises(ObjectNotFound):
        store.get("k")

    with pytest.raises(ObjectNotFound) as missing:
        store.delete_if_match("k", e2)
    assert missing.value.key == "k"

    # A deleted key can be created again.
    store.put_if_absent("k", b"v3")
    assert store.get("k").data == b"v3"


def test_get_and_head_report_etag_size_and_metadata(store: ObjectStore) -> None:
    data = bytes(range(256)) * 3  # every byte value, not just text
    meta = {"writer-id": "w-42", "epoch": "7"}
    etag = store.put_if_absent("objs/blob", data, meta)

    obj = store.get("objs/blob")
    assert (obj.key, obj.data, obj.etag, dict(obj.metadata)) == ("objs/blob", data, etag, meta)

    head = store.head("objs/blob")
    assert head is not None
    assert (head.key, head.size, head.etag, dict(head.metadata)) == (
        "objs/blob",
        len(data),
        etag,
        meta,
    )


def test_empty_object_without_metadata(store: ObjectStore) -> None:
    etag = store.put_if_absent("empty", b"")
    obj = store.get("empty")
    assert (obj.data, obj.etag, dict(obj.metadata)) == (b"", etag, {})
    head = store.head("empty")
    assert head is not None and head.size == 0


def test_reads_of_a_missing_key(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound) as missing:
        store.get("nope/x")
    assert missing.value.key == "nope/x"
    assert store.head("nope/x") is None
    assert store.get_or_none("nope/x") is None


def test_list_is_sorted_and_prefix_filtered(store: ObjectStore) -> None:
    keys = ["b/2", "a/2", "ab", "a/10", "c", "a/1", "a/sub/deep"]
    for i, key in enumerate(keys):
        store.put_if_absent(key, f"payload-{i}".encode())

    assert list(store.list("")) == sorted(keys)
    assert list(store.list("a/")) == ["a/1", "a/10", "a/2", "a/sub/deep"]
    # A prefix is a string prefix, not a directory: "a" also matches "ab".
    assert list(store.list("a")) == ["a/1", "a/10", "a/2", "a/sub/deep", "ab"]
    assert list(store.list("a/sub/")) == ["a/sub/deep"]
    assert list(store.list("zzz")) == []


def test_etag_changes_on_every_write(store: ObjectStore) -> None:
    # Distinct payloads, as laminar always writes (S3 ETags are content hashes).
    etags = [store.put_if_absent("ctr", b"0")]
    for i in range(1, 6):
        etags.append(store.put_if_match("ctr", str(i).encode(), etags[-1]))
        head = store.head("ctr")
        assert head is not None and head.etag == etags[-1]
    assert len(set(etags)) == len(etags)


def test_a_key_and_a_longer_key_under_it_are_independent(store: ObjectStore) -> None:
    # S3 has no directories: "a/b" and "a/b/c" are two objects, in either creation order.
    e_short = store.put_if_absent("a/b", b"short")
    e_long = store.put_if_absent("a/b/c", b"long")
    store.put_if_absent("x/y/z", b"first the longer one")
    store.put_if_absent("x/y", b"then its prefix")
    assert store.get("a/b").data == b"short" and store.get("a/b/c").data == b"long"
    assert store.get("x/y").data == b"then its prefix"
    assert list(store.list("a/b")) == ["a/b", "a/b/c"]
    assert list(store.list("")) == ["a/b", "a/b/c", "x/y", "x/y/z"]
    with pytest.raises(PreconditionFailed):
        store.put_if_absent("a/b", b"again")
    e_short = store.put_if_match("a/b", b"short-2", e_short)
    store.delete_if_match("a/b/c", e_long)
    assert store.head("a/b/c") is None and store.get("a/b").data == b"short-2"
    store.delete_if_match("a/b", e_short)
    assert store.get_or_none("a/b") is None
    assert store.head("a") is None  # a prefix alone is no object


def test_keys_with_escape_characters_round_trip(store: ObjectStore) -> None:
    keys = ["p%/q", "p%25", "p%", "p/q%", "p%2/r"]
    for key in keys:
        store.put_if_absent(key, key.encode())
    for key in keys:
        assert store.get(key).data == key.encode()
    assert list(store.list("p")) == sorted(keys)


BAD_KEYS = ["", "/abs", "trailing/", "a//b", "./a", "a/./b", "a/../b", "..", ".tmp-x", "a/.tmp-y"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_invalid_keys_are_rejected(store: ObjectStore, key: str) -> None:
    ops: list[Callable[[], object]] = [
        lambda: store.put_if_absent(key, b"x"),
        lambda: store.put_if_match(key, b"x", "etag"),
        lambda: store.delete_if_match(key, "etag"),
        lambda: store.get(key),
        lambda: store.head(key),
    ]
    for op in ops:
        with pytest.raises(InvalidKey):
            op()
    assert list(store.list("")) == []


# -- concurrency: threads ------------------------------------------------------------------

N_THREADS = 8


def _race(n: int, fn: Callable[[int], str]) -> tuple[dict[int, str], list[int]]:
    """Run fn(i) for i in range(n) on n threads released together.

    Returns (winner index -> ETag, loser indices). Any error other than
    PreconditionFailed fails the test.
    """
    wins: dict[int, str] = {}
    losses: list[int] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        try:
            etag = fn(i)
        except PreconditionFailed:
            with lock:
                losses.append(i)
        else:
            with lock:
                wins[i] = etag

    errors = run_together(run, n, 60)  # any other error is reported, not hidden
    assert not errors, errors
    return wins, losses


def test_threads_racing_create_only_exactly_one_wins(store: ObjectStore) -> None:
    wins, losses = _race(N_THREADS, lambda i: store.put_if_absent("race/lease", f"owner-{i}".encode()))

    assert len(wins) == 1 and len(losses) == N_THREADS - 1
    [(winner, etag)] = wins.items()
    obj = store.get("race/lease")
    assert (obj.data, obj.etag) == (f"owner-{winner}".encode(), etag)


def test_threads_racing_cas_from_one_etag_exactly_one_wins(store: ObjectStore) -> None:
    base = store.put_if_absent("race/ptr", b"epoch-0")

    wins, losses = _race(N_THREADS, lambda i: store.put_if_match("race/ptr", f"epoch-1-by-{i}".encode(), base))

    assert len(wins) == 1 and len(losses) == N_THREADS - 1
    [(winner, etag)] = wins.items()
    obj = store.get("race/ptr")
    assert (obj.data, obj.etag) == (f"epoch-1-by-{winner}".encode(), etag)


@dataclass
class _IncrementLog:
    """What one incrementer saw: the counter values its successful CAS ops replaced."""

    bases: list[int] = field(default_factory=list)
    conflicts: int = 0


def _increment(store: ObjectStore, key: str, writer: str, times: int) -> _IncrementLog:
    """Read-modify-write `key` with CAS until `times` increments succeeded."""
    log = _IncrementLog()
    while len(log.bases) < times:
        cur = store.get(key)
        n = int(json.loads(cur.data)["n"])
        # The writer id keeps every payload unique (no ABA on content-hash ETags).
        new = json.dumps({"n": n + 1, "writer": writer}).encode()
        try:
            store.put_if_match(key, new, cur.etag)
        except PreconditionFailed:
            log.conflicts += 1
        else:
            log.bases.append(n)
    return log


def _assert_no_lost_update(store: ObjectStore, key: str, logs: list[_IncrementLog]) -> None:
    bases = sorted(b for log in logs for b in log.bases)
    total = len(bases)
    # Each successful CAS replaced a distinct counter value: had two writers both
    # "won" from the same read, a base would repeat and the final count fall short.
    assert bases == list(range(total))
    assert json.loads(store.get(key).data)["n"] == total


def test_threads_cas_increments_lose_no_update(store: ObjectStore) -> None:
    # Fewer threads than the one-shot races: every success costs each contender a
    # GET and a PUT, and the S3 emulator serves one request at a time.
    n_threads, per_thread = 4, 6
    store.put_if_absent("counter", json.dumps({"n": 0, "writer": "init"}).encode())
    logs = [_IncrementLog() for _ in range(n_threads)]

    def run(i: int) -> None:
        logs[i] = _increment(store, "counter", f"t{i}", per_thread)

    errors = run_together(run, n_threads, 120)
    assert not errors, errors
    assert sum(len(log.bases) for log in logs) == n_threads * per_thread
    _assert_no_lost_update(store, "counter", logs)
