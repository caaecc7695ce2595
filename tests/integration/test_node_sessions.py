"""Every node session is built by store.node_connect with the client-side bounds.

The firing lanes, the lease session, retention and the health probe each
open a :class:`WatchedConnection` whose libpq parameters carry TCP
keepalives and ``tcp_user_timeout`` derived from the TTL, whose server-side
timeouts are the node's, and whose blocking calls the watchdog bounds.
"""

from __future__ import annotations

import threading
from datetime import UTC

import psycopg.conninfo

from scheduler import store
from scheduler.clock import SystemClock
from scheduler.coordination import LeaseTable, SqlCoordinator
from scheduler.firing import Firer
from scheduler.health import StoreProbe
from scheduler.metrics import Metrics
from scheduler.retention import STATEMENT_TIMEOUT_S, RetentionLoop
from scheduler.settings import Settings
from scheduler.watchdog import CallBounds, Watchdog, WatchedConnection


def settings(pg_dsn: str) -> Settings:
    return Settings(dsn=pg_dsn, node_id="n1", lease_ttl_s=10.0, retention_s=3600.0).validated()


def test_a_node_session_carries_keepalives_tcp_user_timeout_and_the_watchdog_bounds(pg_dsn):
    watchdog = Watchdog()
    conn = store.node_connect(settings(pg_dsn), "scheduler-test:n1", watchdog=watchdog)
    try:
        params = conn.info.get_parameters()
        assert {
            k: params.get(k)
            for k in (
                "keepalives",
                "keepalives_idle",
                "keepalives_interval",
                "keepalives_count",
                "tcp_user_timeout",
                "connect_timeout",
            )
        } == {
            "keepalives": "1",
            "keepalives_idle": "2",
            "keepalives_interval": "1",
            "keepalives_count": "3",
            "tcp_user_timeout": "5000",
            "connect_timeout": "5",
        }
        shown = {
            name: conn.execute(f"SHOW {name}").fetchone()[name]
            for name in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")
        }
        assert shown == {"lock_timeout": "2s", "statement_timeout": "4s", "idle_in_transaction_session_timeout": "4s"}
        assert isinstance(conn, WatchedConnection)
        assert conn.watch == (watchdog, CallBounds(6.0, 8.0, 12.0), "scheduler-test:n1")
        assert watchdog.in_flight() == []
        _, done = watchdog.thread_state(threading.get_ident())
        assert done is not None  # the SHOW queries went through the watchdog
    finally:
        conn.close()


def test_every_node_component_opens_watched_sessions(pg_dsn):
    s = settings(pg_dsn)
    metrics = Metrics()
    firer = Firer(s, LeaseTable(SystemClock(), s.safety_margin_s), SystemClock(), metrics)
    coordinator = SqlCoordinator(s, metrics)
    retention = RetentionLoop(s, lambda: [], SystemClock(), metrics)
    probe = StoreProbe(s.dsn, application_name="scheduler-probe:n1", settings=s)
    try:
        sessions = {
            "firing": firer._connection("read"),
            "lease": coordinator._session._connection(),
            "retention": retention._connection(),
        }
        assert probe.check() is None
        sessions["probe"] = probe._connection()
        assert {name: type(conn).__name__ for name, conn in sessions.items()} == dict.fromkeys(
            sessions, "WatchedConnection"
        )
        assert {name: conn.watch[1] for name, conn in sessions.items()} == {
            "firing": CallBounds(6.0, 8.0, 12.0),
            "lease": CallBounds(6.0, 8.0, 12.0),
            "retention": CallBounds.after_statement_timeout(STATEMENT_TIMEOUT_S, 2.0),
            "probe": CallBounds(3.0, 5.0, 9.0),
        }
        assert {
            name: conn.info.get_parameters().get("tcp_user_timeout") for name, conn in sessions.items()
        } == dict.fromkeys(sessions, "5000")
    finally:
        firer.close()
        coordinator.close()
        retention.close()
        probe.close()


def test_a_session_that_finds_its_server_read_only_reconnects(pg_dsn):
    """A server that turns read-only under an open session (a demoted primary, a standby
    promoted elsewhere, `default_transaction_read_only` set and reloaded) answers every write
    with SQLSTATE 25006 but keeps the connection up: the lease loop kept writing into it
    every second and never reached the writable host `target_session_attrs=read-write`
    would pick on a new connection. A read-only refusal closes the session, so the next
    call connects again (and libpq chooses the writable host)."""
    session = store.StoreSession(settings(pg_dsn), role="lease")
    try:
        pid = session.transaction(lambda c: c.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"])
        session.transaction(lambda c: c.execute("SET default_transaction_read_only = on"))
        try:
            session.transaction(lambda c: c.execute("CREATE TEMP TABLE t (x int)"))
        except Exception as exc:  # noqa: BLE001 - the test asserts its type below
            refused = exc
        assert getattr(refused, "sqlstate", None) == "25006"
        assert not session.open
        again = session.transaction(lambda c: c.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"])
        assert again != pid
        session.transaction(lambda c: c.execute("CREATE TEMP TABLE t (x int)"))  # writable again
    finally:
        session.close()


def test_the_readiness_probe_says_a_read_only_store_is_not_ready(pg_dsn):
    """A store that answers reads but refuses every write (a standby after a failover it was
    not promoted in, or `default_transaction_read_only`) left `/readyz` saying `store: ok`
    while the node could fire nothing. The probe asks whether its session may write."""
    dbname = store.connect(pg_dsn).execute("SELECT current_database() AS d").fetchone()["d"]
    probe = StoreProbe(pg_dsn, application_name="scheduler-probe:n1", settings=settings(pg_dsn))
    admin = store.connect(pg_dsn)
    try:
        assert probe.check() is None
        admin.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
        probe.close()  # a new session picks the setting up (as one to a standby would be)
        reason = probe.check()
        assert reason is not None and reason.startswith("store: read-only")
        admin.execute(f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')
        probe.check()  # the probe closed its read-only session: this one is new
        assert probe.check() is None
    finally:
        admin.execute(f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')
        probe.close()
        admin.close()


def test_every_session_reads_times_in_utc_and_keeps_the_dsns_own_options(pg_dsn, monkeypatch):
    """Sessions run with ``TimeZone=UTC`` whatever the server's default (timestamps decode as
    ``datetime.timezone.utc``, ~5x cheaper than a named zone's), and the options a DSN (or
    PGOPTIONS) carries reach the server beside the engine's own, which win where both name one."""
    sep = "&" if "?" in pg_dsn else "?"
    dsn = f"{pg_dsn}{sep}options=-c%20work_mem%3D7MB%20-c%20TimeZone%3DAsia/Tokyo%20-c%20statement_timeout%3D9s"
    for conn in (
        store.connect(dsn),
        store.connect(dsn, statement_timeout_s=4.0),
        store.node_connect(settings(dsn), "scheduler-test:n1", watchdog=Watchdog()),
    ):
        with conn:
            shown = {name: conn.execute(f"SHOW {name}").fetchone()[name] for name in ("work_mem", "TimeZone")}
            assert shown == {"work_mem": "7MB", "TimeZone": "UTC"}
            assert conn.execute("SELECT now() AS t").fetchone()["t"].tzinfo is UTC
    with store.connect(dsn, statement_timeout_s=4.0) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "4s"
    with store.connect(dsn) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "9s"
    monkeypatch.setenv("PGOPTIONS", "-c work_mem=5MB")
    with store.connect(pg_dsn, statement_timeout_s=4.0) as conn:
        assert conn.execute("SHOW work_mem").fetchone()["work_mem"] == "5MB"
        assert conn.execute("SHOW TimeZone").fetchone()["TimeZone"] == "UTC"


def test_sessions_read_times_in_utc_even_with_pgtz_in_the_environment(pg_dsn, monkeypatch):
    """libpq sends the PGTZ environment variable as a startup parameter of its own, which the
    server applied after the engine's ``-c TimeZone=UTC``: a worker started with
    ``PGTZ=America/New_York`` handed its handlers ``nominal_time`` in New York's zone, and the
    API wrote ``+05:30`` offsets under ``PGTZ=Asia/Kolkata`` (a trial). Every engine session,
    the API's pooled ones included, reads in UTC whatever PGTZ says."""
    from scheduler.api.app import _pool

    monkeypatch.setenv("PGTZ", "Asia/Kolkata")
    for conn in (
        store.connect(pg_dsn),
        store.node_connect(settings(pg_dsn), "scheduler-test:n1", watchdog=Watchdog()),
    ):
        with conn:
            assert conn.execute("SHOW TimeZone").fetchone()["TimeZone"] == "UTC"
            assert conn.execute("SELECT now() AS t").fetchone()["t"].tzinfo is UTC
    pool = _pool(pg_dsn, 1)
    pool.open(wait=True)
    try:
        with pool.connection() as conn:
            assert conn.execute("SHOW TimeZone").fetchone()["TimeZone"] == "UTC"
            assert conn.execute("SELECT now() AS t").fetchone()["t"].tzinfo is UTC
    finally:
        pool.close()


def test_the_options_of_a_libpq_service_reach_every_session(pg_dsn, tmp_path, monkeypatch):
    """A DSN naming a service of the service file (``service=name``, or ``PGSERVICE``) keeps the
    service's ``options`` (e.g. the search_path of the engine's schema): libpq would read them
    itself, but the engine's explicit options would replace them."""
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    (tmp_path / "pg_service.conf").write_text(
        "# the engine's store\n[sched]\n"
        f"host={info.get('host', '127.0.0.1')}\nport={info.get('port', 5432)}\n"
        f"dbname={info['dbname']}\nuser={info.get('user', 'postgres')}\noptions=-c work_mem=6MB\n"
    )
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "pg_service.conf"))
    monkeypatch.setenv("PGOPTIONS", "-c work_mem=5MB")  # the service's options come first
    for dsn in ("service=sched", "postgresql:///?service=sched"):
        for conn in (store.connect(dsn), store.connect(dsn, statement_timeout_s=4.0)):
            with conn:
                assert conn.execute("SHOW work_mem").fetchone()["work_mem"] == "6MB"
                assert conn.execute("SHOW TimeZone").fetchone()["TimeZone"] == "UTC"
    monkeypatch.setenv("PGSERVICE", "sched")
    with store.connect(pg_dsn, statement_timeout_s=4.0) as conn:  # the DSN names no service: PGSERVICE's
        assert conn.execute("SHOW work_mem").fetchone()["work_mem"] == "6MB"
