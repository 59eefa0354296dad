"""moto's S3 emulation over HTTP on loopback, one request at a time in moto, and the one launcher for it.

`start_s3_server` is what the tests (``tests/conftest.py``), the benchmarks
and the chaos suite use: it runs this module as a subprocess
(``python -m laminar_dev.s3server --port 0 --port-file PATH``), waits until it
answers, and sets fake AWS credentials in ``os.environ`` while it runs. With
``--port 0`` the OS picks a free port and the server writes it to
``--port-file`` once the socket is listening, so nobody races another process
for a port.

Why one request at a time in moto: moto evaluates ``If-None-Match`` /
``If-Match`` and then stores the object as two separate Python steps; two
racing conditional PUTs could both pass the check, which would make our
concurrency tests fail for moto's sake (or pass by luck). One request at a
time makes each conditional write atomic, as it is on S3. The server is one
event loop (`laminar_dev.wsgi_loop`): every connection reads its whole request
without blocking the others, so a client that stops mid-request (a paused
zombie process, a slow upload) holds up only its own connection, and moto is
then called on the loop's thread, one request after another.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import boto3
from botocore.config import Config

from laminar_dev.wsgi_loop import RAW_HEADERS_KEY, WsgiLoopServer

__all__ = [
    "FAKE_AWS_ENV",
    "AccessKey",
    "create_iam_user",
    "enable_auth",
    "fake_aws_environ",
    "iam_pattern_match",
    "main",
    "start_s3_server",
]

STARTUP_TIMEOUT_S = 30.0

#: Fake credentials: moto accepts anything, and they guarantee that nothing run
#: against the server can touch a real AWS account whatever the environment holds.
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    # No instance-metadata probing (slow timeouts when not on EC2).
    "AWS_EC2_METADATA_DISABLED": "true",
}
_CLEARED_AWS_ENV = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


@contextlib.contextmanager
def fake_aws_environ(workdir: Path) -> Iterator[None]:
    """Fake credentials, no endpoint or profile and no ~/.aws files in os.environ while inside (children inherit)."""
    changes: dict[str, str | None] = dict(FAKE_AWS_ENV)
    changes.update(dict.fromkeys(_CLEARED_AWS_ENV))
    changes["AWS_CONFIG_FILE"] = str(workdir / "no-aws-config")
    changes["AWS_SHARED_CREDENTIALS_FILE"] = str(workdir / "no-aws-credentials")
    saved = {name: os.environ.get(name) for name in changes}
    try:
        _set_environ(changes)
        yield
    finally:
        _set_environ(saved)


def _set_environ(values: Mapping[str, str | None]) -> None:
    """Set each variable of `values` in os.environ; None unsets it."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _wait_for_server(proc: subprocess.Popen[bytes], port_file: Path, log: Path) -> str:
    """The server's URL once it answers HTTP; RuntimeError with its log if it dies or hangs."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    url: str | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        if url is None and port_file.exists():
            url = f"http://127.0.0.1:{int(port_file.read_text())}"
        if url is not None:
            try:
                # An unsigned GET / is ListBuckets; it also warms up moto's S3 app.
                with urllib.request.urlopen(url + "/", timeout=5):
                    return url
            except urllib.error.HTTPError:
                return url  # any HTTP answer means it is serving
            except OSError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"moto server did not answer within {STARTUP_TIMEOUT_S}s:\n{log.read_text(errors='replace')}")


@dataclass(frozen=True)
class AccessKey:
    """An IAM user's access key on the server."""

    user: str
    access_key_id: str
    secret_access_key: str

    def environ(self) -> dict[str, str]:
        """The environment variables that make boto3 in a process use this key (and no session token)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}

    def client(self, service: Literal["s3", "iam"], endpoint: str) -> Any:
        """A boto3 client of `service` at `endpoint` signing with this key only."""
        session = boto3.session.Session(
            aws_access_key_id=self.access_key_id, aws_secret_access_key=self.secret_access_key, region_name="us-east-1"
        )
        # Path-style: a loopback endpoint has no bucket subdomains.
        return session.client(service, endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"}))


#: The administrator `enable_auth` creates: allowed everything, like an account's root.
ADMIN_USER = "laminar-admin"


def create_iam_user(endpoint: str, admin: AccessKey | None, user: str, policy: Mapping[str, Any]) -> AccessKey:
    """Create IAM user `user` with `policy` inline (signed by `admin`, or the fake keys before auth is on)."""
    if admin is not None:
        iam = admin.client("iam", endpoint)
    else:
        iam = AccessKey("", FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"], FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"]).client(
            "iam", endpoint
        )
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName=f"{user}-policy", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return AccessKey(user, key["AccessKeyId"], key["SecretAccessKey"])


def enable_auth(endpoint: str) -> AccessKey:
    """Create an administrator and switch authentication on; returns the administrator's key.

    From then on the server checks every request's signature and its IAM
    Action/Resource against the signer's policies (moto does not evaluate
    Condition blocks or bucket policies).
    """
    admin = create_iam_user(
        endpoint,
        None,
        ADMIN_USER,
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]},
    )
    # Not form-encoded: moto reads the raw body as the number of requests still allowed unsigned.
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
    return admin


@contextlib.contextmanager
def start_s3_server(workdir: Path, *, auth: bool = False) -> Iterator[str]:
    """Run the server on a free loopback port (its port file and log in `workdir`); yield its endpoint URL.

    While inside, os.environ holds fake AWS credentials (`fake_aws_environ`),
    so boto3 clients here and in child processes need no setup. With `auth`,
    the server enforces signatures and IAM policies (`enable_auth`) and
    os.environ holds the administrator's key instead (no session token): give
    each role's process its own key (`create_iam_user`, `AccessKey.environ`).
    The server exits with this process even if it is killed without cleaning up.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port_file, log = workdir / "port", workdir / "server.log"
    with fake_aws_environ(workdir):
        with open(log, "wb") as log_fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "laminar_dev.s3server", "--port", "0", "--port-file", str(port_file),
                 "--parent-pid", str(os.getpid())],
                stdin=subprocess.DEVNULL,
                # To a file, never a pipe: nobody drains a pipe and a full one would freeze the server.
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parent.parent,  # where `laminar_dev` is importable from
            )  # fmt: skip
        try:
            endpoint = _wait_for_server(proc, port_file, log)
            if not auth:
                yield endpoint
            else:
                admin = enable_auth(endpoint)
                os.environ.pop("AWS_SESSION_TOKEN", None)  # restored by `fake_aws_environ`
                os.environ.update(admin.environ())
                yield endpoint
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _exit_when_orphaned(parent_pid: int) -> None:
    """Stop the server if the test process that started it dies without cleaning up."""

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def iam_pattern_match(pattern: str, value: str) -> re.Match[str] | None:
    """IAM's matching of an Action or Resource pattern: `*` any run of characters (`/` included),
    `?` exactly one character, everything else literal, the whole value."""
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, value, re.DOTALL)


def _match_patterns_as_iam_does() -> None:
    """Make the server's policy checks use `iam_pattern_match`.

    moto turns a pattern into a regular expression by replacing `*` with `.*` only, so a `?` is a
    regex quantifier (the storage policies' five-character partition segment, ``?????``, would be
    a syntax error) and a `.` matches any character. The storage policies rely on `?` to keep a
    key from spanning segments (`keys.PARTITION_SEGMENT_PATTERN`), so the emulation must honour it.
    """
    from moto.iam import access_control

    access_control.IAMPolicyStatement._match = staticmethod(iam_pattern_match)  # type: ignore[method-assign, assignment]


def _spare_moto_per_request_work() -> None:
    """Two costs moto pays on every request that change nothing it answers (the server's CPU is what
    bounds every S3 test and benchmark here):

    * an error's lookup table is built anew for each error response (the factory holding its cache
      is made per call), and every absent key the protocol probes for is one: the table is kept
      per service;
    * the request id is drawn one character at a time: it is drawn from `secrets` at once.
    """
    import secrets

    from moto.core import errors, responses
    from moto.core.model import ServiceModel

    tables: dict[str, errors.ErrorLookup] = {}
    build = errors.ErrorLookupFactory._create_error_lut

    def for_service(self: errors.ErrorLookupFactory, service_model: ServiceModel) -> errors.ErrorLookup:
        service_id = service_model.metadata.get("serviceId")
        if service_id is None:
            return build(service_model)
        table = tables.get(service_id)
        if table is None:
            table = tables[service_id] = build(service_model)
        return table

    def request_id(headerdict: dict[str, Any] | None = None) -> str:
        req_id = secrets.token_urlsafe(39)  # 52 characters, as moto's own
        if isinstance(headerdict, dict):
            headerdict["x-amzn-requestid"] = req_id
        return req_id

    errors.ErrorLookupFactory.for_service = for_service  # type: ignore[method-assign]
    responses.gen_amzn_requestid_long = request_id  # type: ignore[attr-defined]


#: A connection idle this long, between requests or mid-request, is closed: a paused client is not waited for.
CONNECTION_TIMEOUT_S = 60.0


def _keeping_metadata_names(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """`app`, given the spelling of S3 metadata header names with underscores, as moto's own server does
    (WSGI's HTTP_* keys drop such headers: `X_Foo` could otherwise pass for `X-Foo`)."""
    from moto.core.request import (
        PRESERVED_HEADER_NAMES_ENVIRON_KEY,
        environ_key_for_header,
        should_preserve_original_header_name,
    )

    def call(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        headers: list[tuple[str, str]] = environ[RAW_HEADERS_KEY]
        names: dict[str, str] = {}
        for name, value in headers:
            if should_preserve_original_header_name(name):
                key = environ_key_for_header(name)
                if key not in environ:
                    names[key] = name
                    environ[key] = value
        environ[PRESERVED_HEADER_NAMES_ENVIRON_KEY] = names
        return app(environ, start_response)

    return call


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, bind, publish the port, and serve until killed."""
    # Imported here: only the server process needs moto, not whoever starts it.
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    _match_patterns_as_iam_does()
    _spare_moto_per_request_work()

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path, help="where to write the bound port")
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    args = parser.parse_args(argv)

    class HostCachingDispatcher(DomainDispatcherApplication):
        """moto's dispatcher, remembering which backend serves a host.

        moto lists its package directory and tries every service's URL patterns on each request
        (a few milliseconds, most of a small request's time); the answer for a host never changes.
        """

        def __init__(self) -> None:
            super().__init__(create_backend_app)
            self.backend_of_host: dict[str | None, Any] = {}

        def get_backend_for_host(self, host: str | None) -> Any:
            if host not in self.backend_of_host:
                self.backend_of_host[host] = super().get_backend_for_host(host)
            return self.backend_of_host[host]

    server = WsgiLoopServer(
        _keeping_metadata_names(HostCachingDispatcher()), args.host, args.port, idle_timeout_s=CONNECTION_TIMEOUT_S
    )
    port = server.port
    if args.port_file is not None:
        # Write then rename, so the harness never reads a half-written file.
        tmp = args.port_file.with_name(args.port_file.name + ".tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(args.port_file)
    print(f"moto S3 server listening on http://{args.host}:{port}", file=sys.stderr, flush=True)
    if args.parent_pid is not None:
        _exit_when_orphaned(args.parent_pid)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
