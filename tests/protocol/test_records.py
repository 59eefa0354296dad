"""The persisted ledger records: strict about unknown fields so typos surface, frozen, round-tripped
through their JSON bytes, each made unique by a write id from the clock in effect; an object that does
not parse is a `CorruptLedgerObject` naming its key and the offending field."""

from __future__ import annotations

import json
import pickle
import random
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from laminar_dev.sim.clock import EPOCH_START, SimClock
from laminar_orchestration.clock import use_clock
from laminar_orchestration.errors import ErrorKind
from laminar_orchestration.protocol import records
from laminar_orchestration.protocol.records import CorruptLedgerObject, new_write_id, now, parse_record

AT = EPOCH_START
KEY = "ledger/partitions/00000/grants/00000000000000000001.json"


#: A fenced grant, every optional field filled in.
GRANT: dict[str, Any] = {
    "partition": 3,
    "epoch": 2,
    "node": 1,
    "grant_kind": records.GrantKind.FENCE,
    "previous_epoch": 1,
    "previous_owner": 2,
    "generation": 4,
    "reason": "node 2 unresponsive",
    "granted_at": AT,
    "public_key": "ab" * 32,
}


def node_record(node: int, nudge_url: str | None = None, **fields: Any) -> records.NodeRecord:
    """Node `node`'s record, alive, at `nudge_url`."""
    return records.NodeRecord(
        node=node,
        generation=1,
        status=records.NodeStatus.ALIVE,
        host="h",
        pid=12,
        started_at=AT,
        heartbeat_at=AT,
        heartbeat_timeout_s=10.0,
        nudge_url=nudge_url,
        **fields,
    )


def _records() -> list[BaseModel]:
    """One of each persisted record, every optional part filled in."""
    progress = records.PartitionProgress(
        partition=3, epoch=2, state="running", source_offset=40, lag=0, last_commit_at=AT
    )
    requests = records.RequestReport(total={"GET": 5}, per_s={"GET": 0.5}, interval_s=10.0)
    return [
        records.ClusterRecord(cluster_id="c1", partitions=4, created_at=AT, reinitialized_at=AT),
        records.PartitionHead(partition=3, epoch=2, owner=1, status=records.PartitionStatus.ACTIVE, updated_at=AT),
        records.EpochGrant(**GRANT),
        records.ReleaseRecord(
            partition=3, epoch=2, node=1, commit_ulid=None, source_offset=7, released_at=AT, signature="cd" * 64
        ),
        node_record(1, "http://127.0.0.1:1234/nudge", partitions={3: progress}, requests=requests),
        records.MembershipRecord(cluster_epoch=2, members=[1, 2], reason="join", updated_at=AT),
    ]


@pytest.mark.parametrize("record", _records(), ids=lambda r: type(r).__name__)
def test_every_record_round_trips_through_its_stored_bytes(record: BaseModel) -> None:
    data = record.model_dump_json().encode()
    back = parse_record(KEY, data, type(record))
    assert back == record and back.model_dump_json().encode() == data


def test_a_typo_in_any_stored_record_is_corrupt_and_named() -> None:
    for record in _records():
        body = json.loads(record.model_dump_json())
        body["write_idd"] = body.pop("write_id")
        with pytest.raises(CorruptLedgerObject) as info:
            parse_record(KEY, json.dumps(body).encode(), type(record))
        assert info.value.key == KEY
        assert info.value.reason.startswith("write_idd: Extra inputs are not permitted"), type(record)
        assert KEY in str(info.value) and info.value.error_kind is ErrorKind.CORRUPT_DATA


#: Stored bytes that are no membership record, and how the error says so.
NOT_A_MEMBERSHIP_RECORD = [
    (b"not json", "<root>: Invalid JSON"),
    (b"\xff\xfe", "<root>: Invalid JSON"),
    (b"[]", "<root>: Input should be an object"),
    (b'{"kind": "epoch-grant", "partition": 0, "epoch": 1, "node": 3}', "kind: Input should be 'membership'"),
    (b'{"kind": "membership", "cluster_epoch": 0, "members": [], "reason": "", "updated_at": "x"}', "cluster_epoch"),
]


def test_an_object_that_does_not_parse_is_a_corrupt_ledger_object_naming_its_key() -> None:
    for data, reason in NOT_A_MEMBERSHIP_RECORD:
        with pytest.raises(CorruptLedgerObject) as info:
            parse_record(KEY, data, records.MembershipRecord)
        assert info.value.key == KEY and info.value.reason.startswith(reason), info.value.reason
        back = pickle.loads(pickle.dumps(info.value))  # it crosses process boundaries with its fields
        assert (back.key, back.reason, str(back)) == (info.value.key, info.value.reason, str(info.value))


def test_records_are_frozen_and_refuse_unknown_fields_and_out_of_range_values() -> None:
    head = records.PartitionHead(
        partition=0, epoch=0, owner=0, status=records.PartitionStatus.UNASSIGNED, updated_at=AT
    )
    with pytest.raises(ValidationError, match="frozen"):
        head.epoch = 1
    with pytest.raises(ValidationError, match="Extra inputs"):
        records.PartitionHead.model_validate({**head.model_dump(), "ownr": 2})
    for bad in (
        lambda: records.ClusterRecord(cluster_id="c", partitions=0, created_at=AT),
        lambda: records.EpochGrant.model_validate({**GRANT, "epoch": 0}),  # epoch 0 is "never granted"
        lambda: records.EpochGrant.model_validate({**GRANT, "public_key": "not hex"}),
        lambda: records.ReleaseRecord(partition=0, epoch=1, node=1, commit_ulid=None, source_offset=-1, released_at=AT),
        lambda: records.PartitionHead.model_validate({**head.model_dump(), "status": "gone"}),
        lambda: records.PartitionProgress(partition=0, epoch=0, state="running", retry_delay_s=-1.0),
    ):
        with pytest.raises(ValidationError):
            bad()


def test_each_record_gets_its_own_write_id_so_equal_writes_have_different_bytes() -> None:
    """A writer whose response was lost tells its own write from another's by the bytes."""
    one = records.MembershipRecord(cluster_epoch=1, members=[1], reason="join", updated_at=AT)
    two = records.MembershipRecord(cluster_epoch=1, members=[1], reason="join", updated_at=AT)
    assert one.write_id != two.write_id and one.model_dump_json() != two.model_dump_json()
    for record in (one, two):
        assert len(record.write_id) == 16 and int(record.write_id, 16) >= 0


def test_time_and_write_ids_come_from_the_clock_in_effect() -> None:
    def run(seed: int) -> tuple[list[str], list[object]]:
        sim = SimClock(random.Random(seed))
        with use_clock(sim):
            times: list[object] = [now()]
            sim.seconds = 5.0
            times.append(now())
            ids = [new_write_id(), records.ClusterRecord(cluster_id="c", partitions=1, created_at=now()).write_id]
        return ids, times

    ids, times = run(4)
    assert times == [EPOCH_START, EPOCH_START + timedelta(seconds=5)]
    assert run(4) == (ids, times) and run(5)[0] != ids  # a run is a pure function of its seed


def test_signed_bytes_cover_every_field_but_the_signature_in_a_canonical_order() -> None:
    unsigned = records.ReleaseRecord(partition=1, epoch=2, node=3, commit_ulid=None, source_offset=4, released_at=AT)
    signed = unsigned.model_copy(update={"signature": "ef" * 64})
    assert signed.signed_bytes() == unsigned.signed_bytes()  # signing does not change what is signed
    body = json.loads(unsigned.signed_bytes())
    assert "signature" not in body and list(body) == sorted(body)
    assert body["write_id"] == unsigned.write_id  # the nonce is signed too
    moved = unsigned.model_copy(update={"source_offset": 5})
    assert moved.signed_bytes() != unsigned.signed_bytes()
    with pytest.raises(ValidationError):
        records.ReleaseRecord.model_validate({**unsigned.model_dump(), "signature": "ef" * 63})
