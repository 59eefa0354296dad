"""The object-store protocol: what lives in the store and the rules that guard it.

Keys and records, versioned objects (create-only entries plus a CAS pointer),
signing, fencing tokens and guards, the epoch ledger, the manifest chain, the
source log, the fenced commit, the cluster epoch, and the migration task and
desired-state records the control plane writes for the nodes.

May import: the package root (errors, identity, clock, ulid) and `store`. Never
the data plane, the control plane, the operator tools or the CLI.
"""
