"""Store requests are counted the way S3 bills them: once per request sent, by method and key family."""

from __future__ import annotations

import threading

import pytest

from laminar_dev.faults import FaultInjectingStore
from laminar_orchestration.store import ObjectStore, PreconditionFailed, StoreError
from laminar_orchestration.store.metering import (
    MAX_FAMILIES,
    OTHER_FAMILY,
    RequestMeter,
    RequestMethod,
    RequestPrices,
    key_family,
)
from laminar_orchestration.store.retry import RetryingStore, RetryPolicy


def test_each_request_is_counted_once_by_method_and_family(store: ObjectStore, meter: RequestMeter) -> None:
    etag = store.put_if_absent("ledger/partitions/00003/desired.json", b"a")
    with pytest.raises(PreconditionFailed):
        store.put_if_absent("ledger/partitions/00003/desired.json", b"b")  # a lost write is billed too
    store.put_if_match("ledger/partitions/00003/desired.json", b"c", etag)
    store.get("ledger/partitions/00003/desired.json")
    assert store.get_or_none("ledger/partitions/00004/desired.json") is None
    assert store.head("manifests/00001/history/00000000000000000001.json") is None
    list(store.list("ledger/"))

    counts = meter.snapshot()
    assert counts.by_method["PUT"] == 3 and counts.by_method["GET"] == 2
    assert counts.by_family[("PUT", "ledger/partitions/desired.json")] == 3
    assert counts.by_family[("GET", "ledger/partitions/desired.json")] == 2
    assert counts.by_family[("HEAD", "manifests/history")] >= 1  # S3 may check the bucket once more
    assert counts.by_method["LIST"] >= 1


def test_a_retried_request_is_counted_per_try(store: ObjectStore, meter: RequestMeter) -> None:
    faulty = FaultInjectingStore(store)
    faulty.fail_next(op="get")
    retrying = RetryingStore(faulty, RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0))
    store.put_if_absent("source/00000/head.json", b"x")
    before = meter.snapshot().by_method.get("GET", 0)

    retrying.get("source/00000/head.json")

    # The injected failure never reached the backend; the successful try did, once.
    assert meter.snapshot().by_method["GET"] - before == 1
    assert retrying.meter is meter


def test_counts_from_many_threads_add_up() -> None:
    meter = RequestMeter()

    def work() -> None:
        for i in range(1000):
            meter.count(RequestMethod.GET, f"source/{i % 7:05d}/head.json")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert meter.snapshot().by_method == {"GET": 8000}
    assert meter.snapshot().by_family == {("GET", "source/head.json"): 8000}


def test_families_drop_partition_node_and_sequence_parts() -> None:
    assert key_family("ledger/partitions/00003/desired.json") == "ledger/partitions/desired.json"
    assert key_family("ledger/nodes/00002.json") == "ledger/nodes"
    assert key_family("checkpoints/00001/n-00002/01HX0000000000000000000000.delta") == "checkpoints"
    assert key_family("manifests/00000/current.json") == "manifests/current.json"


def test_families_are_bounded_per_process() -> None:
    meter = RequestMeter()
    for i in range(MAX_FAMILIES * 2):
        meter.count(RequestMethod.GET, f"family{i}/x")
    families = meter.snapshot().by_family
    assert len(families) <= MAX_FAMILIES + 1 and families[("GET", OTHER_FAMILY)] >= MAX_FAMILIES


def test_the_monthly_cost_follows_s3_list_prices() -> None:
    # 1 GET/s and 1 PUT/s for 30 days: 2.592M of each.
    cost = RequestPrices().monthly_cost({"GET": 1.0, "PUT": 1.0, "DELETE": 5.0})
    assert cost == pytest.approx(2592 * 0.0004 + 2592 * 0.005)


def test_a_store_error_still_counts_the_request(store: ObjectStore, meter: RequestMeter) -> None:
    with pytest.raises(StoreError):
        store.delete_if_match("sink/00000/n-00001/none.parquet", "nope")
    assert meter.snapshot().by_method["DELETE"] == 1
