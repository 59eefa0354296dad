"""The one error family: every library error is a `LaminarError` whose kind decides the exit code."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest

import laminar_orchestration
from laminar_orchestration.dataplane.backpressure import Backpressure
from laminar_orchestration.dataplane.checkpoint import CheckpointCorrupt
from laminar_orchestration.errors import EXIT_CODES, ErrorKind, InvalidArgument, LaminarError, exit_code
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.cluster_epoch import ClusterEpochFenceTimeout, StaleClusterEpoch
from laminar_orchestration.protocol.fencing import StaleEpoch, UnknownPartition
from laminar_orchestration.protocol.framing import BadMagic, FrameError
from laminar_orchestration.protocol.ledger import ClusterAlreadyInitialized, ClusterNotInitialized
from laminar_orchestration.protocol.records import CorruptLedgerObject
from laminar_orchestration.protocol.segments import BadInputLine, CorruptSegment, InputFileError
from laminar_orchestration.protocol.tasks import InvalidTransition, MigrationKind, MigrationPhase
from laminar_orchestration.store import InvalidStoreUrl, ObjectNotFound, PreconditionFailed, StoreUnavailable


def _library_errors() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(laminar_orchestration.__path__, "laminar_orchestration."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == info.name
                and not name.startswith("_")
            ):
                found[f"{info.name}.{name}"] = obj
    return list(found.values())


def test_every_library_error_is_a_laminar_error() -> None:
    errors = _library_errors()
    assert len(errors) > 40
    strays = [f"{e.__module__}.{e.__qualname__}" for e in errors if not issubclass(e, LaminarError)]
    assert strays == []


def test_every_kind_has_a_distinct_exit_code() -> None:
    assert set(EXIT_CODES) == set(ErrorKind)
    assert len(set(EXIT_CODES.values())) == len(ErrorKind)
    assert 0 not in EXIT_CODES.values()
    assert exit_code(ErrorKind.INVALID_INPUT) == 2


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (InvalidStoreUrl("ftp://x", "unsupported scheme"), ErrorKind.INVALID_INPUT),
        (BadInputLine("f.jsonl", 3, "bad"), ErrorKind.INVALID_INPUT),
        (InvalidArgument("--partition", "out of range"), ErrorKind.INVALID_INPUT),
        (StoreUnavailable("get", "k", "timeout"), ErrorKind.UNAVAILABLE),
        (PreconditionFailed("k", None), ErrorKind.CONFLICT),
        (ClusterAlreadyInitialized("file:///s", 3), ErrorKind.CONFLICT),
        (StaleEpoch(PartitionId(0), 1, 2), ErrorKind.FENCED),
        (CheckpointCorrupt("checkpoints/x", "sha256 mismatch"), ErrorKind.CORRUPT_DATA),
        (BadMagic("seg", 0, 0), ErrorKind.CORRUPT_DATA),
        (CorruptLedgerObject("ledger/cluster.json", "bad"), ErrorKind.CORRUPT_DATA),
        (CorruptSegment("source/x", "bad"), ErrorKind.CORRUPT_DATA),
        (ObjectNotFound("k"), ErrorKind.NOT_FOUND),
        (ClusterNotInitialized("file:///s"), ErrorKind.NOT_FOUND),
        (UnknownPartition(PartitionId(9)), ErrorKind.NOT_FOUND),
        (StaleClusterEpoch(1, 3, 4), ErrorKind.FENCED),
        (ClusterEpochFenceTimeout(4, 1.5), ErrorKind.UNAVAILABLE),
        (Backpressure(0, 100, 50, 1.0), ErrorKind.UNAVAILABLE),
        (InputFileError("/nope", "no such file"), ErrorKind.INVALID_INPUT),
    ],
)
def test_kinds_fields_messages_and_pickling(error: LaminarError, kind: ErrorKind) -> None:
    assert isinstance(error, LaminarError)
    assert error.error_kind is kind
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)


def test_a_field_named_kind_does_not_shadow_the_error_kind() -> None:
    # InvalidTransition keeps its `kind` field (the migration kind); the error kind is separate.
    err = InvalidTransition(MigrationKind.GRACEFUL, MigrationPhase.PLANNED, MigrationPhase.SEEKING)
    assert err.kind is MigrationKind.GRACEFUL
    assert err.error_kind is ErrorKind.CONFLICT


def test_frame_errors_keep_their_fields() -> None:
    err = BadMagic("source/00000/x.seg", 64, 0xDEADBEEF)
    assert isinstance(err, FrameError) and (err.source, err.offset, err.magic) == ("source/00000/x.seg", 64, 0xDEADBEEF)
    assert "bad magic 0xDEADBEEF" in str(err)
