"""The retry layer under injected faults, plus `open_store` and retries against an unreachable S3 endpoint.

Fault tests wrap each backend as RetryingStore(FaultInjectingStore(backend)).
The key promise: a conditional write whose response was lost is settled by
reading back, so our own applied write is never reported as a conflict and a
write that really lost is never reported as a success.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from laminar_dev.faults import FaultInjectingStore, FaultKind
from laminar_orchestration.store import (
    InvalidStoreUrl,
    LocalObjectStore,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StoredObject,
    StoreUnavailable,
    TransientStoreError,
    open_store,
)
from laminar_orchestration.store.retry import AmbiguousWrite, RetryingStore, RetryPolicy
from laminar_orchestration.store.s3 import S3ObjectStore

NO_WAIT = RetryPolicy(max_attempts=6, base_delay_s=0.0, max_delay_s=0.0)
META = {"writer-id": "w-1"}


class InterleavingStore(FaultInjectingStore):
    """Fault injection plus a one-shot action run just before/after the next `get`.

    RetryingStore's read-back is a `get`, so this lets a test put another
    writer's action exactly between our write and its read-back, or between the
    read-back and our retry.
    """

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.before_get: Callable[[], object] | None = None
        self.after_get: Callable[[], object] | None = None

    def get(self, key: str) -> StoredObject:
        action, self.before_get = self.before_get, None
        if action is not None:
            action()
        try:
            return super().get(key)
        finally:
            action, self.after_get = self.after_get, None
            if action is not None:
                action()


@pytest.fixture
def faulty(store: ObjectStore) -> InterleavingStore:
    return InterleavingStore(store)


@pytest.fixture
def retrying(faulty: InterleavingStore) -> RetryingStore:
    return RetryingStore(faulty, NO_WAIT)


# -- plain retries ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["5xx", "throttle", "reset"])
def test_transient_read_failures_are_retried(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore, kind: FaultKind
) -> None:
    etag = store.put_if_absent("k", b"v")
    faulty.fail_next(2, op="get", kind=kind)
    faulty.fail_next(1, op="head", kind=kind)
    faulty.fail_next(1, op="list", kind=kind)

    assert retrying.get("k").etag == etag
    head = retrying.head("k")
    assert head is not None and head.etag == etag
    assert list(retrying.list("")) == ["k"]
    assert faulty.injected_failures == 4
    assert retrying.retries == 4
    assert faulty.pending == 0


@pytest.mark.parametrize("op", ["put_if_absent", "put_if_match", "delete_if_match"])
def test_write_failed_before_reaching_the_store_is_retried(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore, op: str
) -> None:
    e1 = store.put_if_absent("existing", b"v1", META)
    faulty.fail_next(2, op=op)  # type: ignore[arg-type]

    if op == "put_if_absent":
        etag = retrying.put_if_absent("new", b"fresh", META)
        assert store.get("new").etag == etag
    elif op == "put_if_match":
        etag = retrying.put_if_match("existing", b"v2", e1, META)
        assert (store.get("existing").data, store.get("existing").etag) == (b"v2", etag)
    else:
        retrying.delete_if_match("existing", e1)
        assert store.head("existing") is None

    assert faulty.calls[op] == 3
    # Both unknown outcomes were read back (and found not applied) before retrying.
    assert faulty.calls["get"] == 2
    assert retrying.resolved_by_readback == 0


def test_conflict_409_is_reread_then_retried(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore
) -> None:
    faulty.fail_next(1, op="put_if_absent", kind="conflict")

    etag = retrying.put_if_absent("k", b"mine", META)

    assert store.get("k").etag == etag
    assert (faulty.injected_failures, faulty.calls["put_if_absent"], faulty.calls["get"]) == (
        1,
        2,
        1,
    )


def test_exhausted_retries_raise_store_unavailable(store: ObjectStore, faulty: InterleavingStore) -> None:
    retrying = RetryingStore(faulty, RetryPolicy(max_attempts=3, base_delay_s=0.0))
    store.put_if_absent("k", b"v")
    faulty.fail_next(100, op="get")

    with pytest.raises(StoreUnavailable) as unavailable:
        retrying.get("k")
    assert "3 attempts" in str(unavailable.value)
    assert faulty.calls["get"] == 3 and retrying.attempts == 3

    faulty.clear()
    faulty.fail_next(100, op="put_if_absent")
    with pytest.raises(StoreUnavailable) as unavailable:
        retrying.put_if_absent("new", b"v")
    assert unavailable.value.key == "new"
    assert faulty.calls["put_if_absent"] == 3
    assert store.head("new") is None


def test_unreadable_outcome_is_reported_as_unknown(store: ObjectStore, faulty: InterleavingStore) -> None:
    retrying = RetryingStore(faulty, RetryPolicy(max_attempts=3, base_delay_s=0.0))
    faulty.lose_response_next(1, op="put_if_absent")
    faulty.fail_next(100, op="get")

    with pytest.raises(StoreUnavailable) as unavailable:
        retrying.put_if_absent("k", b"v")

    assert "outcome is unknown" in str(unavailable.value)
    assert store.get("k").data == b"v"  # it did land; the caller must not assume either way


def test_backoff_sleeps_with_capped_full_jitter(store: ObjectStore, faulty: InterleavingStore) -> None:
    sleeps: list[float] = []
    policy = RetryPolicy(max_attempts=6, base_delay_s=0.1, max_delay_s=0.25)
    retrying = RetryingStore(faulty, policy, sleep=sleeps.append, seed=3)
    store.put_if_absent("k", b"v")
    faulty.fail_next(5, op="get")

    retrying.get("k")

    caps = [0.1, 0.2, 0.25, 0.25, 0.25]
    assert len(sleeps) == 5
    assert all(0.0 <= s <= cap for s, cap in zip(sleeps, caps, strict=True))


def test_retry_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(base_delay_s=-1.0)


# -- unknown outcomes of conditional writes ---------------------------------------------------


def test_lost_response_after_applied_create_is_a_success(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore
) -> None:
    faulty.lose_response_next(1, op="put_if_absent")

    etag = retrying.put_if_absent("lease", b"mine", META)

    assert faulty.lost_responses == 1
    assert retrying.resolved_by_readback == 1
    obj = store.get("lease")
    assert (obj.data, obj.etag) == (b"mine", etag)
    # What a blind retry would have seen: a false "already exists".
    with pytest.raises(PreconditionFailed):
        store.put_if_absent("lease", b"mine", META)


def test_lost_response_after_applied_cas_is_a_success(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore
) -> None:
    e1 = store.put_if_absent("ptr", b"epoch-1", META)
    faulty.lose_response_next(1, op="put_if_match")

    e2 = retrying.put_if_match("ptr", b"epoch-2", e1, META)

    assert retrying.resolved_by_readback == 1
    obj = store.get("ptr")
    assert (obj.data, obj.etag) == (b"epoch-2", e2)
    with pytest.raises(PreconditionFailed):  # a blind retry: a false lost race
        store.put_if_match("ptr", b"epoch-2", e1, META)


def test_lost_response_after_applied_delete_is_done(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore
) -> None:
    etag = store.put_if_absent("k", b"v")
    faulty.lose_response_next(1, op="delete_if_match")

    retrying.delete_if_match("k", etag)

    assert store.head("k") is None
    assert faulty.lost_responses == 1
    with pytest.raises(ObjectNotFound):  # a blind retry: a false "not found"
        store.delete_if_match("k", etag)


@pytest.mark.parametrize("lose_response", [False, True], ids=["failed", "lost-412"])
def test_create_that_really_lost_is_a_precondition_failure(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore, lose_response: bool
) -> None:
    store.put_if_absent("lease", b"theirs", {"writer-id": "w-2"})
    if lose_response:
        faulty.lose_response_next(1, op="put_if_absent")  # the 412 itself is lost
    else:
        faulty.fail_next(1, op="put_if_absent")

    with pytest.raises(PreconditionFailed) as failed:
        retrying.put_if_absent("lease", b"mine", META)

    assert failed.value.expected_etag is None
    assert retrying.resolved_by_readback == 0
    assert store.get("lease").data == b"theirs"


def test_plain_conflict_is_not_retried(store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore) -> None:
    store.put_if_absent("lease", b"theirs")
    with pytest.raises(PreconditionFailed):
        retrying.put_if_absent("lease", b"mine")
    assert (faulty.calls["put_if_absent"], faulty.calls["get"]) == (1, 0)


def test_same_bytes_but_other_metadata_is_not_ours(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore
) -> None:
    store.put_if_absent("lease", b"same", {"writer-id": "w-2"})
    faulty.fail_next(1, op="put_if_absent")
    with pytest.raises(PreconditionFailed):
        retrying.put_if_absent("lease", b"same", {"writer-id": "w-1"})


@pytest.mark.parametrize("applied", [True, False], ids=["ours-superseded", "lost-race"])
def test_cas_with_unknown_outcome_then_moved_is_ambiguous(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore, applied: bool
) -> None:
    e1 = store.put_if_absent("ptr", b"epoch-1", META)

    def other_writer() -> None:
        current = store.get("ptr")
        store.put_if_match("ptr", b"epoch-9-by-other", current.etag, {"writer-id": "w-2"})

    if applied:
        faulty.lose_response_next(1, op="put_if_match")
    else:
        faulty.fail_next(1, op="put_if_match")
    faulty.before_get = other_writer  # lands between our write and the read-back

    with pytest.raises(AmbiguousWrite) as ambiguous:
        retrying.put_if_match("ptr", b"epoch-2", e1, META)

    assert isinstance(ambiguous.value, PreconditionFailed)
    assert ambiguous.value.expected_etag == e1
    assert store.get("ptr").data == b"epoch-9-by-other"


def test_cas_with_unknown_outcome_on_deleted_key_is_ambiguous(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore
) -> None:
    e1 = store.put_if_absent("ptr", b"epoch-1")
    faulty.fail_next(1, op="put_if_match")
    faulty.before_get = lambda: store.delete_if_match("ptr", e1)

    with pytest.raises(AmbiguousWrite):
        retrying.put_if_match("ptr", b"epoch-2", e1)


def test_create_that_lands_late_is_still_recognised(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore
) -> None:
    # Our first request times out and the read-back finds nothing; then the
    # delayed request lands, so the retry gets 412. It is still our write.
    faulty.fail_next(1, op="put_if_absent")
    faulty.after_get = lambda: store.put_if_absent("lease", b"mine", META)

    etag = retrying.put_if_absent("lease", b"mine", META)

    assert store.get("lease").etag == etag
    assert retrying.resolved_by_readback == 1


def test_cas_that_lands_late_is_still_recognised(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore
) -> None:
    e1 = store.put_if_absent("ptr", b"epoch-1", META)
    faulty.fail_next(1, op="put_if_match")
    faulty.after_get = lambda: store.put_if_match("ptr", b"epoch-2", e1, META)

    e2 = retrying.put_if_match("ptr", b"epoch-2", e1, META)

    assert store.get("ptr").etag == e2
    assert retrying.resolved_by_readback == 1


def test_delete_with_unknown_outcome_after_etag_moved_fails(
    store: ObjectStore, faulty: InterleavingStore, retrying: RetryingStore
) -> None:
    e1 = store.put_if_absent("k", b"v1")
    faulty.fail_next(1, op="delete_if_match")
    faulty.before_get = lambda: store.put_if_match("k", b"v2", e1)

    with pytest.raises(PreconditionFailed):
        retrying.delete_if_match("k", e1)
    assert store.get("k").data == b"v2"


def test_random_faults_never_lose_or_invent_an_update(store: ObjectStore, faulty: InterleavingStore) -> None:
    """Sequential CAS increments through 30% random faults: every one must land exactly once."""
    retrying = RetryingStore(faulty, RetryPolicy(max_attempts=30, base_delay_s=0.0))
    retrying.put_if_absent("counter", json.dumps({"n": 0}).encode())
    faulty.random_faults(0.3, seed=11)

    for i in range(25):
        cur = retrying.get("counter")
        n = json.loads(cur.data)["n"]
        assert n == i
        # No concurrent writer exists, so any PreconditionFailed is a false conflict.
        retrying.put_if_match("counter", json.dumps({"n": n + 1, "w": i}).encode(), cur.etag)

    faulty.random_faults(0.0, seed=0)
    assert json.loads(store.get("counter").data)["n"] == 25
    assert faulty.lost_responses > 0 and faulty.injected_failures > 0
    assert retrying.resolved_by_readback > 0


def test_random_faults_are_reproducible(local_store: LocalObjectStore) -> None:
    def run() -> tuple[int, int]:
        faulty = FaultInjectingStore(local_store)
        faulty.random_faults(0.5, seed=5, ops=frozenset({"head"}))
        for _ in range(40):
            with contextlib.suppress(TransientStoreError):
                faulty.head("k")
        return faulty.injected_failures, faulty.calls["head"]

    first = run()
    assert first == run()
    assert 0 < first[0] < 40


def test_latency_injection(store: ObjectStore, faulty: InterleavingStore) -> None:
    store.put_if_absent("k", b"v")
    faulty.latency(0.05, op="head")

    t0 = time.perf_counter()
    faulty.head("k")
    assert time.perf_counter() - t0 >= 0.05
    faulty.get("k")  # other ops are not delayed
    assert faulty.delayed == 1

    faulty.latency(0, op="head")
    faulty.head("k")
    assert faulty.delayed == 1


def test_fault_plan_rejects_unknown_ops(local_store: LocalObjectStore) -> None:
    faulty = FaultInjectingStore(local_store)
    with pytest.raises(ValueError):
        faulty.fail_next(1, op="put")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        faulty.random_faults(1.5, seed=0)


# -- open_store and URLs -------------------------------------------------------------------


def test_open_store_round_trip(store_url: str) -> None:
    opened = open_store(store_url)
    try:
        etag = opened.put_if_absent("k", b"v")
        assert opened.get("k").etag == etag
        assert opened.url == store_url
        # The URL alone reopens the same store (as another process would).
        assert open_store(opened.url).get("k").data == b"v"
    finally:
        opened.close()


def test_open_store_wraps_s3_in_retries(
    s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)

    opened = open_store(f"s3://{s3_bucket}/some/prefix")
    assert isinstance(opened, RetryingStore)
    assert isinstance(opened.inner, S3ObjectStore)
    assert (opened.inner.bucket, opened.inner.prefix) == (s3_bucket, "some/prefix")
    assert opened.inner.endpoint.rstrip("/") == s3_endpoint
    assert isinstance(open_store(f"s3://{s3_bucket}", retrying=False), S3ObjectStore)
    assert isinstance(open_store(tmp_path.as_uri()), LocalObjectStore)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://x", "unsupported scheme 'ftp'"),
        ("s3://", "no bucket"),
        ("s3:///prefix", "no bucket"),
        ("file://host/x", "no host"),
    ],
)
def test_bad_store_urls(url: str, reason: str) -> None:
    with pytest.raises(InvalidStoreUrl) as invalid:
        open_store(url)
    assert invalid.value.url == url
    assert reason in str(invalid.value)


# -- an unreachable S3 endpoint ------------------------------------------------------------------


@pytest.fixture
def fake_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.usefixtures("fake_aws_credentials")
def test_s3_unreachable_endpoint_exhausts_retries_and_names_it(closed_port: int) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    retrying = RetryingStore(S3ObjectStore("b", endpoint_url=endpoint), NO_WAIT)

    with pytest.raises(StoreUnavailable) as unavailable:
        retrying.get("k")

    assert endpoint in str(unavailable.value)
    assert retrying.attempts == NO_WAIT.max_attempts
