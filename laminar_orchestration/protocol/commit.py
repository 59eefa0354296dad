"""A batch's fenced commit, as the production worker and the simulator both make it.

The fence is the manifest chain: a publish under an epoch the chain was sealed
past is refused (`StaleFencingToken`, `StaleGeneration`). Around it, two
decisions every owner makes the same way:

* before publishing, look for a successor's grant (one GET by key). Not the
  fence - a grant is visible before its seal - but an early exit that spares a
  doomed write and tells the owner at once that it lost the partition. An owner
  that looked recently (its kill-switch refresh reads the ledger) may skip it;
* when the publish's response is lost, the commit counts iff it landed on the
  chain (`ManifestPublisher.landed`); otherwise the store error stands and
  the batch is retried from the committed state.
"""

from __future__ import annotations

from laminar_orchestration.protocol.chain import ManifestVersion
from laminar_orchestration.protocol.chain_writes import ManifestPublisher, ManifestUpdate
from laminar_orchestration.protocol.fencing import FencingToken, StaleEpoch
from laminar_orchestration.protocol.ledger import Ledger
from laminar_orchestration.protocol.records import EpochGrant
from laminar_orchestration.store import StoreError


def successor_grant(ledger: Ledger, token: FencingToken) -> EpochGrant | None:
    """The grant of the epoch after `token`'s, if the control plane made one."""
    return ledger.grant(token.partition, token.epoch + 1)


def commit(
    ledger: Ledger,
    publisher: ManifestPublisher,
    token: FencingToken,
    update: ManifestUpdate,
    *,
    look_for_successor: bool = True,
) -> ManifestVersion:
    """Publish `update` as the owner at `token.epoch`; returns the committed chain entry.

    StaleEpoch when a successor's grant is already visible (nothing is written; looked for only
    with `look_for_successor`),
    the publisher's fencing errors when the chain refuses the entry, the
    StoreError when the outcome is unknown and the entry is not on the chain.
    """
    successor = successor_grant(ledger, token) if look_for_successor else None
    if successor is not None:
        raise StaleEpoch(token.partition, token.epoch, successor.epoch)
    try:
        return publisher.publish(token, update)
    except StoreError:
        landed = publisher.landed(token, update)
        if landed is None:
            raise
        return landed
