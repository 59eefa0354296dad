"""The simulation's memo of pure library work (`laminar_dev.sim.memo`) answers exactly as the library does:
a repeat of the same bytes is answered from memory, anything else is computed again."""

from __future__ import annotations

from datetime import UTC, datetime

from laminar_dev.sim.memo import memoized
from laminar_orchestration.protocol import signing
from laminar_orchestration.protocol.records import ReleaseRecord
from laminar_orchestration.protocol.signing import SigningKey, sign_record


def _release(offset: int) -> ReleaseRecord:
    return ReleaseRecord(
        partition=0,
        epoch=3,
        node=1,
        commit_ulid=None,
        source_offset=offset,
        released_at=datetime(2030, 1, 1, tzinfo=UTC),
        write_id="0123456789abcdef",
    )


def test_a_signature_copied_onto_other_content_is_refused_after_the_genuine_one_was_remembered() -> None:
    key = SigningKey.generate(0, 3, 1)
    genuine = sign_record(_release(10), key)
    copied = _release(11).model_copy(update={"signature": genuine.signature})
    with memoized():
        assert signing.signature_problem(genuine, key.public_key) is None
        assert signing.signature_problem(genuine, key.public_key) is None  # remembered
        assert signing.signature_problem(copied, key.public_key) is not None
        other = SigningKey.generate(0, 3, 1)
        assert signing.signature_problem(genuine, other.public_key) is not None


def test_a_signature_made_in_the_run_is_taken_as_good_only_for_the_public_half_of_the_key_that_made_it() -> None:
    key = SigningKey.generate(0, 3, 1)
    # A key record whose public half is another key's: what it signs must still fail with that public key.
    mismatched = key.model_copy(update={"public_key": SigningKey.generate(0, 3, 1).public_key})
    with memoized():
        genuine = sign_record(_release(10), key)
        forged = sign_record(_release(11), mismatched)
        assert signing.signature_problem(genuine, key.public_key) is None
        assert signing.signature_problem(forged, mismatched.public_key) is not None
        assert signing.signature_problem(forged, key.public_key) is None
    assert SigningKey.sign.__qualname__ == "SigningKey.sign"  # the run's patch is gone with it


def test_the_same_bytes_parse_once_and_other_bytes_parse_anew() -> None:
    first = _release(10).model_dump_json().encode()
    second = _release(11).model_dump_json().encode()
    with memoized():
        a, b, c = (ReleaseRecord.model_validate_json(raw) for raw in (first, bytes(first), second))
    assert a is b
    assert c.source_offset == 11
    assert ReleaseRecord.model_validate_json(first) is not a  # the memo ends with the run
