"""The one error family: every library error is a `LaminarError` whose kind decides the exit code."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import pickle
import pkgutil
import types
import typing
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pytest

import laminar_orchestration
from laminar_orchestration.dataplane.errors import Backpressure, CheckpointCorrupt
from laminar_orchestration.errors import (
    EXIT_CODES,
    ErrorKind,
    InvalidArgument,
    LaminarError,
    StructuredError,
    exit_code,
)
from laminar_orchestration.identity import PartitionId
from laminar_orchestration.protocol.cluster_epoch import ClusterEpochFenceTimeout, StaleClusterEpoch
from laminar_orchestration.protocol.fencing import NotOwned, StaleEpoch, UnknownPartition
from laminar_orchestration.protocol.framing import BadMagic, FrameError
from laminar_orchestration.protocol.ledger import ClusterAlreadyInitialized, ClusterNotInitialized
from laminar_orchestration.protocol.records import CorruptLedgerObject
from laminar_orchestration.protocol.source_errors import BadInputLine, CorruptSegment, InputFileError
from laminar_orchestration.protocol.tasks import InvalidTransition, MigrationKind, MigrationPhase
from laminar_orchestration.store import InvalidStoreUrl, ObjectNotFound, PreconditionFailed, StoreUnavailable
from laminar_orchestration.store.retry import AmbiguousWrite


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
    # StructuredError is how errors are written (errors.py), shared with development tooling: no error itself.
    errors = [e for e in errors if e is not StructuredError]
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


# --- every error of the package, written the one way (errors.py) ---------------------------


def _error_classes() -> list[type[LaminarError]]:
    """Every `LaminarError` subclass of the package, walked through ``__subclasses__``."""
    _library_errors()  # imports every module of the package
    found: set[type[LaminarError]] = set()
    todo: list[type[LaminarError]] = [LaminarError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found and sub.__module__.startswith("laminar_orchestration."):
                found.add(sub)
                todo.append(sub)
    return sorted(found, key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


_ERRORS = _error_classes()


def _sample(annotation: Any, index: int) -> Any:
    """A value of a field's type, distinct per field position (a swapped field order shows)."""
    if isinstance(annotation, typing.NewType):
        return _sample(annotation.__supertype__, index)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return _sample(next(arg for arg in args if arg is not type(None)), index)
    if origin is tuple:
        if args[1:] == (Ellipsis,):
            return (_sample(args[0], index), _sample(args[0], index + 1))
        return tuple(_sample(arg, index + n) for n, arg in enumerate(args))
    if origin is list:
        return [_sample(args[0], index)]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        members = list(annotation)
        return members[index % len(members)]
    simple: dict[Any, Any] = {int: 11 + index, float: 0.5 + index, str: f"<{index}>", bool: True}
    simple[Path] = Path(f"/{index}")
    assert annotation in simple, f"teach _sample the field type {annotation!r}"
    return simple[annotation]


def _instance(cls: type[LaminarError]) -> LaminarError:
    hints = typing.get_type_hints(cls)
    return cls(*(_sample(hints[field.name], n) for n, field in enumerate(dataclasses.fields(cls))))


def _values(error: LaminarError) -> tuple[Any, ...]:
    return tuple(getattr(error, field.name) for field in dataclasses.fields(error))


def test_the_walk_finds_every_error() -> None:
    names = {cls.__qualname__ for cls in _ERRORS}
    assert {"StaleEpoch", "BadMagic", "CorruptObject", "AmbiguousWrite", "NoSuchStore", "InvalidArgument"} <= names
    assert len(_ERRORS) > 90


@pytest.mark.parametrize("cls", _ERRORS, ids=lambda cls: cls.__qualname__)
def test_every_error_pickles_compares_and_renders_from_its_fields(cls: type[LaminarError]) -> None:
    error = _instance(cls)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert _values(copy) == _values(error) == error.args == copy.args
    assert copy == error and str(copy) == str(error) and repr(copy) == repr(error)
    if all(isinstance(value, Hashable) for value in _values(error)):
        assert hash(copy) == hash(error)
    assert copy.error_kind is cls.error_kind
    if dataclasses.fields(cls):
        # the text comes from a template or `_message`, never the fallback listing the fields
        gives = [k for k in cls.__mro__ if "_message" in vars(k) or vars(k).get("message")]
        assert gives and gives[0] is not StructuredError, f"{cls.__qualname__} has no `message`"


#: What the base (errors.py) provides: no error class writes these itself.
_PROVIDED: tuple[str, ...] = ("__str__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__")
_PROVIDED += ("__post_init__", "__setattr__", "__delattr__", "__init__", "__eq__", "__hash__", "__repr__")


@pytest.mark.parametrize("cls", _ERRORS, ids=lambda cls: cls.__qualname__)
def test_no_error_writes_what_the_base_provides(cls: type[LaminarError]) -> None:
    own = []
    for name in _PROVIDED:
        member = vars(cls).get(name)
        code = getattr(inspect.unwrap(member), "__code__", None) if member is not None else None
        # the dataclass machinery generates __init__, __eq__, __hash__, __repr__ (compiled from "<string>")
        if member is not None and (code is None or code.co_filename != "<string>"):
            own.append(name)
    assert own == [], f"{cls.__module__}.{cls.__qualname__} writes {own}: declare fields and `message` instead"
    assert not ("message" in vars(cls) and "_message" in vars(cls)), "a template or `_message`, not both"


def test_errors_are_frozen_values_that_still_travel() -> None:
    error = StaleEpoch(PartitionId(3), 4, 6)
    assert error == StaleEpoch(partition=PartitionId(3), local_epoch=4, current_epoch=6)
    assert error.args == (3, 4, 6) and hash(error) == hash(StaleEpoch(PartitionId(3), 4, 6))
    others: list[LaminarError] = [StaleEpoch(PartitionId(3), 4, 7), NotOwned(PartitionId(3))]
    assert all(error != other for other in others)
    with pytest.raises(dataclasses.FrozenInstanceError):
        error.local_epoch = 5  # type: ignore[misc]
    try:
        raise error
    except StaleEpoch as caught:
        caught.__traceback__ = None  # the interpreter and contextlib still assign these
    error.add_note("seen by node 2")
    copy = pickle.loads(pickle.dumps(error))
    assert copy == error and copy.__notes__ == ["seen by node 2"]


def test_a_subclass_template_overrides_a_parent_message_method() -> None:
    # PreconditionFailed words its text with logic; AmbiguousWrite (a subclass) with a template.
    assert str(PreconditionFailed("k", None)).startswith("create-only write of 'k'")
    assert str(AmbiguousWrite("k", "e1")).startswith("conditional write of 'k' (expected ETag e1) has an unknown")
