"""Fixtures of the cluster tests (see ``harness.py``).

``cluster``
    a :class:`harness.Cluster` on a fresh database (``pg_dsn``) with the
    ``conn`` fixture as its store connection; every node process it spawned
    is SIGKILLed at teardown, pass or fail, and the tail of each node's log
    is printed (pytest shows it for a failed test). Coordinator ``sql`` by
    default; a test runs against both with :data:`harness`-side
    ``@both_coordinators`` (``parametrize("cluster", ["sql", "etcd"],
    indirect=True)``).
``relay`` (suite-wide, ``tests/fixtures.py``)
    a :class:`relay.FreezingRelay` in front of this test's store
    (``relay.dsn(pg_dsn)`` is the DSN through it), stopped at teardown.
``etcd_server`` (session)
    a throwaway single-member etcd (:class:`scheduler.devtools.etcd_server.ThrowawayEtcd`:
    free loopback ports, data on /dev/shm), started on first use and stopped
    at the end of the session. Each etcd test uses its own key prefix. Without
    an etcd binary the test FAILS when ``CI=true`` (CI installs
    ``etcd-server``) and is skipped only outside CI.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from harness import Cluster  # noqa: E402

from scheduler.devtools.etcd_server import EtcdUnavailable, ThrowawayEtcd, find_etcd  # noqa: E402

_prefixes = itertools.count(1)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[ThrowawayEtcd]:
    """The session's throwaway etcd (see the module docstring)."""
    binary = find_etcd()
    if binary is None:
        message = (
            "no etcd binary (etcd-server): the etcd coordinator tests need it; "
            "apt-get install etcd-server, or set SCHEDULER_ETCD_BIN"
        )
        if _in_ci():
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(f"{message} (skipped outside CI only)")
    try:
        import aetcd  # noqa: F401
    except ImportError:
        message = "the etcd coordinator needs the etcd extra: .venv/bin/pip install -e '.[etcd]'"
        if _in_ci():
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message)
    server = ThrowawayEtcd(binary)
    try:
        server.start()
    except EtcdUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix of this test's own in the session's etcd."""
    return f"/t/{next(_prefixes)}-{request.node.name[:40]}/"


@pytest.fixture
def cluster(request: pytest.FixtureRequest, pg_dsn: str, conn: psycopg.Connection, tmp_path: Path) -> Iterator[Cluster]:
    """Node processes of one test on a fresh database; all killed at teardown."""
    coordinator = getattr(request, "param", "sql")
    if coordinator == "etcd":
        server = request.getfixturevalue("etcd_server")
        group = Cluster(
            pg_dsn,
            conn,
            tmp_path,
            coordinator="etcd",
            etcd_endpoint=server.endpoint,
            etcd_prefix=request.getfixturevalue("etcd_prefix"),
        )
    else:
        group = Cluster(pg_dsn, conn, tmp_path)
    try:
        yield group
    finally:
        group.teardown()
