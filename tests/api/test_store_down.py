"""A store the API cannot reach: 503 problem+json with Retry-After, never a 500, the password never shown."""

from __future__ import annotations

import time

import httpx
from helpers import closed_port

from scheduler.api.server import ApiThread

TOKEN = "tk_0123456789abcdef_" + "A" * 43


def test_an_unreachable_store_is_503_with_retry_after_and_no_password(caplog):
    server = ApiThread(f"postgresql://app:S3cretPassw0rd@127.0.0.1:{closed_port()}/scheduler").start()
    try:
        server.app.state.pool.timeout = 0.5  # wait half a second for a connection, not POOL_TIMEOUT_S
        response = httpx.get(f"{server.url}/v1/tenants", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert response.status_code == 503, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["retry-after"] == "1"
        assert response.json() == {
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": "store: unavailable, try again",
        }
        # Explain computes from its inputs alone, but checking its key reads the store: 503 too.
        explain = httpx.get(
            f"{server.url}/v1/explain", params={"cron": "0 2 * * *"}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert (explain.status_code, explain.json()["detail"]) == (503, "store: unavailable, try again")
        # Without a key it is still a 401: nothing is read for a token that is not one.
        assert httpx.get(f"{server.url}/v1/tenants", timeout=30).status_code == 401
    finally:
        server.stop()
    assert "S3cretPassw0rd" not in caplog.text


def test_a_pooled_connection_whose_server_turned_read_only_is_replaced(pg_dsn):
    """A server turned read-only under the API's pool (a demoted primary) refuses writes with
    SQLSTATE 25006 and keeps the connection up; returned to the pool as it was, every request
    it served would fail the same way. The request that meets it fails (503, as any store
    failure) and the connection is closed, so the pool opens a new one, to the writable host
    a multi-host DSN names."""
    import psycopg
    import pytest
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    from scheduler.api import errors
    from scheduler.api.deps import pooled

    pool = ConnectionPool(
        pg_dsn, min_size=1, max_size=1, open=True, kwargs={"autocommit": True, "row_factory": dict_row}
    )
    try:
        with pooled(pool) as conn:
            pid = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
            conn.execute("SET default_transaction_read_only = on")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction), pooled(pool) as conn:
            conn.execute("CREATE TEMP TABLE t (x int)")
        with pooled(pool) as conn:
            assert conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"] != pid
            conn.execute("CREATE TEMP TABLE t (x int)")
    finally:
        pool.close()
    from fastapi import FastAPI

    app = FastAPI()
    errors.install(app)
    assert app.exception_handlers[psycopg.errors.ReadOnlySqlTransaction] is errors._store_unavailable  # 503


def test_a_read_only_store_does_not_fail_a_request_over_its_keys_last_used_time(pg_dsn):
    """Every authenticated request may record its key's ``last_used_at`` (at most once a
    minute per key). On a store turned read-only (a demoted primary) that write failed the
    request itself: a GET answered 503 while the read it asked for would have worked. The
    record is best effort: the key is verified, the request goes on."""
    from scheduler import store
    from scheduler.api import keys
    from scheduler.api.keys import KeyVerifier

    conn = store.connect(pg_dsn)
    try:
        conn.execute("INSERT INTO tenants (tenant) VALUES ('acme') ON CONFLICT (tenant) DO NOTHING")
        token, row = keys.create(conn, "acme", "tenant", "ro")
        conn.execute("SET default_transaction_read_only = on")

        class Borrowed:
            def __enter__(self):
                return conn

            def __exit__(self, *exc):
                return None

        principal = KeyVerifier(ttl_s=0.0, touch_interval_s=0.0).verify(Borrowed, token)
        assert principal is not None and (principal.key_id, principal.tenant) == (row["key_id"], "acme")
    finally:
        conn.close()


def test_pooled_connections_the_store_closed_are_replaced_not_answered_503(api):
    """A trial: after a store restart the API answered 503 to as many requests as it had
    pooled connections (each found its connection closed by the server). A connection the
    server has spoken on while it sat idle in the pool (a termination notice, or EOF) is
    checked when taken and replaced; the requests are served."""
    import psycopg

    token = api.key("acme", "tenant")
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(headers=headers, timeout=30) as client:
        assert all(client.get(f"{api.url}/v1/schedules").status_code == 200 for _ in range(8))
        with psycopg.connect(api.dsn, autocommit=True) as admin:
            api_backends = (
                "FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'scheduler-api'"
            )
            assert admin.execute(f"SELECT pg_terminate_backend(pid) {api_backends}").fetchall()
            deadline = time.monotonic() + 10
            while admin.execute(f"SELECT 1 {api_backends}").fetchone():
                assert time.monotonic() < deadline
                time.sleep(0.01)
        answers = [client.get(f"{api.url}/v1/schedules").status_code for _ in range(8)]
    assert answers == [200] * 8


def test_the_first_request_after_a_store_outage_is_served_not_held_by_a_reconnect_backoff(pg_dsn, relay):
    """A trial: with requests arriving during an outage, the API answered 503 for ~25 s after
    the store was back: the pool retried its connections on a doubling backoff (1, 2, 4,
    8 s ...) and every request waited for the next retry. Now a failed connection attempt
    gives up after a second, and the next request starts a new one at once."""
    from scheduler import jobs, store
    from scheduler.api import keys
    from scheduler.settings import ApiSettings

    with store.connect(pg_dsn) as conn:
        jobs.add_tenant(conn, "acme")
        token, _ = keys.create(conn, "acme", "tenant", None)
    settings = ApiSettings(rate_per_s=100_000.0, burst=100_000, pool_size=2)
    server = ApiThread(relay.dsn(pg_dsn), "127.0.0.1", 0, settings).start()
    try:
        server.app.state.pool.timeout = 0.5  # wait half a second for a connection, not POOL_TIMEOUT_S
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
            url = f"{server.url}/v1/schedules"
            assert client.get(url).status_code == 200
            relay.cut()
            outage_ends = time.monotonic() + 4.5
            during = []
            while time.monotonic() < outage_ends:  # requests keep coming: each 503 after 0.5 s
                during.append(client.get(url).status_code)
                time.sleep(0.3)
            relay.restore()
            assert set(during) == {503}, during
            started = time.monotonic()
            first = client.get(url)
            assert first.status_code == 200, first.text
            assert time.monotonic() - started < 2.0
    finally:
        server.stop()
