"""Processors by name: ``package.module:attribute``, an installed package's entry point, or a built-in.

A reference names a `Processor` object, or a callable taking no arguments that returns one
(a factory, so a module can build its processor from its own config). Installed packages
offer processors under the ``laminar.processors`` entry-point group::

    [project.entry-points."laminar.processors"]
    sessions = "clicks.pipeline:sessions"

The cluster records the reference and the processor's fingerprint (`processor_fingerprint`);
a node whose processor's fingerprint differs refuses to take partitions, since mixed logic
would corrupt state silently.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import sys
from importlib.metadata import entry_points

from laminar_orchestration.errors import InvalidInputError
from laminar_orchestration.processing.contract import Processor
from laminar_orchestration.processing.schema import StreamSchema

#: The entry-point group installed packages name their processors under.
ENTRY_POINT_GROUP = "laminar.processors"
#: The processor of a cluster initialised without ``--processor``.
DEFAULT_PROCESSOR = "keyed_aggregation"
_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_NAME = re.compile(r"^[A-Za-z_][\w.-]*$")


class ProcessorNotFound(InvalidInputError):
    """A processor reference that names nothing loadable; `reason` says what failed."""

    reference: str
    reason: str

    message = "processor {reference!r}: {reason}"


def _builtins() -> dict[str, Processor]:
    from laminar_orchestration.processing.keyed import keyed_aggregation

    return {DEFAULT_PROCESSOR: keyed_aggregation}


def load_processor(reference: str) -> Processor:
    """The processor `reference` names: ``module:attribute``, an entry point's name, or a built-in's."""
    reference = reference.strip()
    builtins = _builtins()
    if reference in builtins:
        return builtins[reference]
    if ":" in reference:
        if not _REFERENCE.match(reference):
            raise ProcessorNotFound(reference, "expected package.module:attribute")
        module_name, attribute = reference.split(":", 1)
        # As `python -m` does: a module beside the command (examples.sessions) imports from the working directory.
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.append(os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ProcessorNotFound(reference, f"cannot import {module_name!r}: {exc}") from None
        target: object = module
        for part in attribute.split("."):
            if not hasattr(target, part):
                raise ProcessorNotFound(reference, f"{module_name!r} has no attribute {attribute!r}")
            target = getattr(target, part)
        return _as_processor(reference, target)
    if not _NAME.match(reference):
        raise ProcessorNotFound(reference, "not a name nor package.module:attribute")
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == reference]
    if not found:
        known = sorted({*builtins, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})
        raise ProcessorNotFound(
            reference, f"no built-in nor installed processor of that name (known: {', '.join(known)})"
        )
    try:
        target = found[0].load()
    except Exception as exc:  # an installed package's import may fail any way
        raise ProcessorNotFound(reference, f"entry point {found[0].value!r} failed to load: {exc}") from None
    return _as_processor(reference, target)


def _as_processor(reference: str, target: object) -> Processor:
    if isinstance(target, Processor):
        return target
    if callable(target):
        try:
            built = target()
        except Exception as exc:  # the user's factory
            raise ProcessorNotFound(reference, f"the factory raised {type(exc).__name__}: {exc}") from None
        if isinstance(built, Processor):
            return built
        raise ProcessorNotFound(reference, f"the factory returned {type(built).__name__}, not a processor")
    raise ProcessorNotFound(reference, f"names a {type(target).__name__}, not a processor nor a factory of one")


def processor_fingerprint(processor: Processor, schema: StreamSchema) -> str:
    """What a processor means for a stream: its name, version, state columns and the stream's schema.

    Two nodes run the same logic on the same state exactly when their fingerprints agree.
    """
    canonical = json.dumps(
        {
            "name": processor.name,
            "version": processor.version,
            "state": [[f.name, str(f.type), f.nullable] for f in processor.codec.schema],
            "expiry": processor.expiry_column,
            "stream": schema.fingerprint,
        },
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
