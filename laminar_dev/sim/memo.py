"""Pure library computations done once per run: `memoized` answers a repeat of the same bytes from memory.

In a scenario every process re-reads the same few records, manifests and source
segments over and over, and each read repeats work whose answer depends on the
bytes alone: a record's JSON validation, an entry's Ed25519 verification, a
segment's frame and footer checks, loading a grant's private key to sign. For the
duration of a run, `memoized` patches those four to remember their answers by their full inputs (the bytes
included), so the library's decisions and the trace are unchanged; only a
repeat costs nothing. Failures are not remembered: they are computed again. A signature made
in the run is remembered as valid for the public key derived from its private key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from laminar_orchestration.protocol import signing as signing_module
from laminar_orchestration.protocol import source as source_module
from laminar_orchestration.protocol.records import Record, SignedRecord
from laminar_orchestration.protocol.segments import decode_segment
from laminar_orchestration.protocol.source_events import EVENT_SCHEMA

from . import invariants as invariants_module

#: (model, JSON bytes) -> the record parsed from them. Records are frozen: readers may share one.
_Records = dict[tuple[type[Record], bytes], Record]


class RunMemo:
    """The remembered answers of one run (dropped with it)."""

    def __init__(self) -> None:
        self.records: _Records = {}
        self.signatures: dict[tuple[str, str, bytes], str | None] = {}
        #: id(record) -> (record, public key, verdict): the signed bytes of a record seen before.
        self.checked: dict[int, tuple[SignedRecord, str, str | None]] = {}
        self.segments: dict[tuple[str, bytes, int, int, pa.Schema], list[tuple[memoryview, int]]] = {}
        self.private_keys: dict[bytes, Ed25519PrivateKey] = {}
        #: private key bytes -> hex public key.
        self.public_keys: dict[bytes, str] = {}


class _PrivateKeys:
    """`Ed25519PrivateKey` as `signing` uses it, each key loaded once (loading derives its public half)."""

    def __init__(self, memo: RunMemo) -> None:
        self._memo = memo

    def from_private_bytes(self, data: bytes) -> Ed25519PrivateKey:
        key = self._memo.private_keys.get(data)
        if key is None:
            key = self._memo.private_keys[data] = Ed25519PrivateKey.from_private_bytes(data)
        return key


@contextlib.contextmanager
def memoized() -> Iterator[RunMemo]:
    """Remember record parses, signature checks and segment checks for the duration of a run."""
    memo = RunMemo()
    validate_json = Record.model_validate_json.__func__  # type: ignore[attr-defined]
    signature_problem = signing_module.signature_problem

    def parse(cls: type[Record], json_data: str | bytes | bytearray, /, **options: Any) -> Record:
        if options or not isinstance(json_data, bytes):
            parsed: Record = validate_json(cls, json_data, **options)
            return parsed
        key = (cls, json_data)
        record = memo.records.get(key)
        if record is None:
            record = memo.records[key] = validate_json(cls, json_data)
        return record

    def verified(record: SignedRecord, public_key: str | None) -> str | None:
        if record.signature is None or public_key is None:
            return signature_problem(record, public_key)
        # A record parsed from the same bytes is the same (frozen) object: known without its signed bytes.
        # The entry holds the record, so its id is not reused within the run.
        seen = memo.checked.get(id(record))
        if seen is not None and seen[0] is record and seen[1] == public_key:
            return seen[2]
        # The signed bytes, not the record: a signature copied onto other content must fail again.
        key = (public_key, record.signature, record.signed_bytes())
        if key not in memo.signatures:
            memo.signatures[key] = signature_problem(record, public_key)
        problem = memo.signatures[key]
        memo.checked[id(record)] = (record, public_key, problem)
        return problem

    sign = signing_module.SigningKey.sign
    keys = _PrivateKeys(memo)

    def signing(signer: signing_module.SigningKey, data: bytes) -> str:
        signature: str = sign(signer, data)
        # Ed25519 signatures verify with the public half of the key that made them: one made here needs
        # no check. The public half is derived from the private key, never taken from the record.
        private = bytes.fromhex(signer.private_key)
        public = memo.public_keys.get(private)
        if public is None:
            public = memo.public_keys[private] = keys.from_private_bytes(private).public_key().public_bytes_raw().hex()
        memo.signatures[(public, signature, data)] = None
        return signature

    def segment(
        key: str, data: bytes, *, partition: int, start_offset: int, schema: pa.Schema = EVENT_SCHEMA
    ) -> list[tuple[memoryview, int]]:
        memo_key = (key, data, partition, start_offset, schema)
        frames = memo.segments.get(memo_key)
        if frames is None:
            frames = memo.segments[memo_key] = decode_segment(
                key, data, partition=partition, start_offset=start_offset, schema=schema
            )
        return list(frames)

    saved: list[tuple[object, str, object]] = []

    def patch(owner: object, name: str, value: object) -> None:
        # None: the name was inherited (a model's classmethod), so putting it back is deleting it.
        saved.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, value)

    patch(Record, "model_validate_json", classmethod(parse))
    patch(signing_module, "signature_problem", verified)
    patch(signing_module, "Ed25519PrivateKey", keys)
    patch(signing_module.SigningKey, "sign", signing)
    patch(source_module, "decode_segment", segment)
    patch(invariants_module, "decode_segment", segment)
    try:
        yield memo
    finally:
        for owner, name, value in reversed(saved):
            if value is None:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


__all__ = ["RunMemo", "memoized"]
