"""A PostgreSQL server of the tests' own, and Dagster instances whose storage is in it.

The server is Debian's PostgreSQL (``apt-get install postgresql``; `scripts/test.sh`
installs it as root where missing), started on loopback in a temporary directory:
``initdb`` and ``pg_ctl`` from ``/usr/lib/postgresql/<version>/bin`` (else ``PATH``),
as the ``postgres`` user (else ``nobody``) when the tests run as root, since
PostgreSQL refuses to run as root. One server serves a test session
(`postgres_server`, a session fixture: import it into the test module); each
instance gets a database of its own (`PostgresServer.create_database`). Without
PostgreSQL the tests that need it fail and say how to install it: they never
skip.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2  # type: ignore[import-untyped]
import pytest
from dagster import DagsterInstance

from tests.dagster_plane import ControlPlane
from tests.processes import free_port

__all__ = [
    "PostgresControlPlane",
    "PostgresDatabase",
    "PostgresServer",
    "find_postgres_bin",
    "postgres_server",
    "start_postgres",
]

USER = "postgres"
#: What the tests say when there is no PostgreSQL to start.
MISSING = (
    "PostgreSQL's server programs (initdb, pg_ctl) were not found under /usr/lib/postgresql/*/bin nor on PATH: "
    "the Dagster-on-PostgreSQL tests need them (apt-get install postgresql; scripts/test.sh installs it as root)"
)


def find_postgres_bin() -> Path | None:
    """The directory of Debian's newest PostgreSQL server programs, else of ``initdb`` on PATH; None if neither."""

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path.parent.parent.name)) or (0,)

    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=version)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _server_user() -> str | None:
    """Whom to run the server as: None (ourselves) unless we are root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user to run PostgreSQL as")


@dataclass(frozen=True)
class PostgresDatabase:
    """One database of the server: where it is and the ``storage`` block of a dagster.yaml using it."""

    host: str
    port: int
    name: str

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@{self.host}:{self.port}/{self.name}"

    def connect(self) -> Any:
        return psycopg2.connect(host=self.host, port=self.port, user=USER, dbname=self.name)

    def query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        """The rows of one statement, read straight from the database (not through Dagster)."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall())
        finally:
            conn.close()

    def dagster_storage_yaml(self) -> str:
        """The instance's runs, event logs and schedules in this database (`dagster-postgres`)."""
        return (
            "# Runs, event logs and schedules in PostgreSQL (dagster-postgres).\n"
            "storage:\n"
            "  postgres:\n"
            "    postgres_db:\n"
            f"      hostname: {self.host}\n"
            f"      port: {self.port}\n"
            f"      db_name: {self.name}\n"
            f"      username: {USER}\n"
            # SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3, which dagster-postgres does not
            # install: name the driver it does (psycopg2-binary).
            "      scheme: postgresql+psycopg2\n"
            # The server trusts loopback connections; dagster-postgres wants a password all the same.
            "      password: unused\n"
        )


class PostgresServer:
    """A PostgreSQL server on 127.0.0.1 with its data in a temporary directory; `stop` removes it."""

    def __init__(self, bindir: Path, *, timeout_s: float = 60.0) -> None:
        self.bindir = bindir
        self.host = "127.0.0.1"
        self.port = free_port()
        self.user = _server_user()
        # Not under pytest's temporary root: its directories are private to us, and the server
        # may run as another user, who must reach its data directory.
        self.root = Path(tempfile.mkdtemp(prefix="laminar-postgres-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._names = 0
        self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")
        options = (
            f"-h {self.host} -p {self.port} -k {self.root} "
            # A throwaway server: durability costs time and buys nothing here.
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-o", options, "-w", "-t", str(int(timeout_s)),
            "start",
        )  # fmt: skip
        self._wait_ready(timeout_s)

    def _run(self, program: str, *args: str) -> None:
        cmd = [str(self.bindir / program), *args]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        proc = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            log = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stdout}{proc.stderr}{log}")

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                psycopg2.connect(host=self.host, port=self.port, user=USER, dbname="postgres").close()
                return
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def create_database(self, prefix: str = "dagster") -> PostgresDatabase:
        """A new, empty database on this server."""
        self._names += 1
        name = f"{re.sub(r'[^a-z0-9_]', '_', prefix.lower())}_{os.getpid()}_{self._names}"
        conn = psycopg2.connect(host=self.host, port=self.port, user=USER, dbname="postgres")
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return PostgresDatabase(self.host, self.port, name)

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres() -> PostgresServer:
    """A fresh server; fails the calling test, naming what to install, when PostgreSQL is missing."""
    bindir = find_postgres_bin()
    if bindir is None:
        pytest.fail(MISSING, pytrace=False)
    return PostgresServer(bindir)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the test session (per xdist worker): each test makes its own database."""
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


class PostgresControlPlane(ControlPlane):
    """`ControlPlane` (the repo's dagster.yaml, a daemon, a webserver) whose instance stores in PostgreSQL."""

    def __init__(
        self,
        workdir: Path,
        store_url: str,
        database: PostgresDatabase,
        *,
        heartbeat_timeout_s: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.database = database
        super().__init__(workdir, store_url, heartbeat_timeout_s=heartbeat_timeout_s, env=env)

    def instance(self) -> DagsterInstance:
        # The repo's dagster.yaml, copied by ControlPlane, plus the storage block: before the first
        # instance (ControlPlane's own, which creates the schema) and every process is started.
        config = self.home / "dagster.yaml"
        text = config.read_text()
        if "\nstorage:\n" not in text:
            config.write_text(text.rstrip("\n") + "\n" + self.database.dagster_storage_yaml())
        return super().instance()
