"""A node's metrics, health and readiness endpoint, store outages, and secrets in output.

The node runs in process (``scheduler.node.Node``) with scaled-down timings
and ``metrics_port=0``; tests scrape ``/metrics`` over HTTP and read the
values with prometheus-client's own parser, comparing them with the store
(the oracle: every run the node counted is a row of ``runs``). The outage
test puts a small TCP proxy between the node and PostgreSQL and cuts it: all
connections through it are reset and new ones refused until it is restored.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from click.testing import CliRunner
from helpers import closed_port, insert_run, store_now, wait_for
from prometheus_client.parser import text_string_to_metric_families

from scheduler import jobs, store
from scheduler.audit import verify
from scheduler.cli import cli
from scheduler.metrics import Metrics
from scheduler.node import Node
from scheduler.settings import Settings
from scheduler.spec import JobSpec

TIMINGS = {
    "lease_ttl_s": 2.0,
    "renew_interval_s": 0.5,
    "poll_interval_s": 0.25,
    "tick_interval_s": 0.5,
    "safety_margin_s": 0.5,
}

FAMILIES = {
    "scheduler_firing_runs_fired": "counter",
    "scheduler_firing_slots_skipped": "counter",
    "scheduler_firing_dispatch_lag_seconds": "histogram",
    "scheduler_firing_due_backlog_runs": "gauge",
    "scheduler_firing_tick_duration_seconds": "histogram",
    "scheduler_firing_fence_rejections": "counter",
    "scheduler_firing_stale_jobs": "counter",
    "scheduler_lease_partitions_owned": "gauge",
    "scheduler_lease_events": "counter",
    "scheduler_membership_live_nodes": "gauge",
    "scheduler_membership_heartbeat_age_seconds": "gauge",
    "scheduler_store_retries": "counter",
    "scheduler_store_errors": "counter",
    "scheduler_retention_pruned_rows": "counter",
    "scheduler_retention_batch_duration_seconds": "histogram",
    "scheduler_delivery_runs_in_flight": "gauge",
    "scheduler_delivery_queue_depth_runs": "gauge",
}
"""Every metric family a node exposes (counters without the ``_total`` suffix, as parsed)."""

SECRET = "S3cret-Pw-7f1c"


# ---------------------------------------------------------------- helpers


def get(port: int, path: str, timeout_s: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(port: int) -> dict[str, dict]:
    """``{family: {"type": ..., "samples": {(name, labels...): value}}}`` from /metrics."""
    status, text = get(port, "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {
            "type": family.type,
            "samples": {(s.name, *sorted(s.labels.items())): s.value for s in family.samples},
        }
    return out


def sample(metrics: dict, family: str, name: str, **labels: str) -> float:
    return metrics[family]["samples"][(name, *sorted(labels.items()))]


def ready(port: int) -> tuple[int, dict]:
    status, body = get(port, "/readyz")
    return status, json.loads(body)


def query(conn: psycopg.Connection, sql: str, params: tuple = ()) -> dict:
    """First row of a read, retried on 40001: under SERIALIZABLE even a test's read may be asked to retry."""
    return store.run_transaction(conn, lambda c: c.execute(sql, params).fetchone())


def count_runs(conn: psycopg.Connection) -> int:
    return query(conn, "SELECT count(*) AS n FROM runs")["n"]


def with_host(dsn: str, host: str, port: int, password: str | None = None) -> str:
    parts = urlsplit(dsn)
    auth = parts.username or ""
    if password:
        auth += f":{password}"
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}:{port}"))


@pytest.fixture
def start_node():
    nodes: list[Node] = []

    def start(dsn: str, **overrides) -> Node:
        node = Node(
            Settings(dsn=dsn, node_id=f"obs-{len(nodes) + 1}", metrics_port=0, **{**TIMINGS, **overrides}),
            metrics=Metrics(),
        )
        node.start()
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.stop()
        node.join(15)


class TcpProxy:
    """127.0.0.1:port → target, with :meth:`cut` (reset everything, refuse new) and :meth:`restore`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._up = threading.Event()
        self._up.set()
        self._closed = threading.Event()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up.is_set():
                self._reset(client)
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                self._reset(client)
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 0.2)
                if not self._up.is_set() or self._closed.is_set():
                    break
                for src in readable:
                    data = src.recv(65536)
                    if not data:
                        raise OSError("closed")
                    (b if src is a else a).sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            self._reset(a)
            self._reset(b)
            with self._lock:
                if (a, b) in self._pairs:
                    self._pairs.remove((a, b))

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()
        except OSError:
            pass

    def cut(self) -> None:
        self._up.clear()

    def restore(self) -> None:
        self._up.set()

    def close(self) -> None:
        self._closed.set()
        self._up.clear()
        self._listener.close()


# ---------------------------------------------------------------- metrics


def test_metrics_endpoint_reads_the_same_runs_as_the_store(pg_dsn, conn, start_node):
    node = start_node(pg_dsn)
    port = node.metrics_port
    assert port
    wait_for("/readyz 200", lambda: ready(port)[0], lambda s: s == 200)
    status, body = ready(port)
    assert body["ready"] is True and body["reasons"] == [] and body["checks"]["store"] == "ok"
    assert get(port, "/healthz") == (200, "ok\n")
    assert get(port, "/nope")[0] == 404

    wait_for("all partitions claimed", lambda: len(node.table), lambda n: n == 1024)
    at = store_now(conn) + timedelta(seconds=1.5)
    specs = [JobSpec.build(tenant=f"t{i % 2}", at=at + timedelta(milliseconds=100 * i)) for i in range(6)]
    jobs.add_jobs(conn, specs)
    wait_for("6 runs", lambda: count_runs(conn), lambda n: n == 6)

    metrics = wait_for(
        "the counter to catch up",
        lambda: scrape(port),
        lambda m: sample(m, "scheduler_firing_runs_fired", "scheduler_firing_runs_fired_total") == 6,
    )
    for family, kind in FAMILIES.items():
        assert metrics.get(family, {}).get("type") == kind, family
    assert sample(metrics, "scheduler_firing_runs_fired", "scheduler_firing_runs_fired_total") == count_runs(conn)
    assert sample(metrics, "scheduler_firing_dispatch_lag_seconds", "scheduler_firing_dispatch_lag_seconds_count") == 6
    lag_sum = sample(metrics, "scheduler_firing_dispatch_lag_seconds", "scheduler_firing_dispatch_lag_seconds_sum")
    stored = query(conn, "SELECT sum(extract(epoch FROM fired_at - scheduled_at))::float8 AS s FROM runs")
    assert lag_sum == pytest.approx(stored["s"], abs=1e-3)
    assert sample(metrics, "scheduler_lease_partitions_owned", "scheduler_lease_partitions_owned") == 1024
    assert sample(metrics, "scheduler_lease_events", "scheduler_lease_events_total", kind="claimed") == 1024
    assert sample(metrics, "scheduler_lease_events", "scheduler_lease_events_total", kind="renewed") >= 1024
    assert sample(metrics, "scheduler_lease_events", "scheduler_lease_events_total", kind="lost") == 0
    assert sample(metrics, "scheduler_membership_live_nodes", "scheduler_membership_live_nodes") == 1
    assert (
        0
        <= sample(metrics, "scheduler_membership_heartbeat_age_seconds", "scheduler_membership_heartbeat_age_seconds")
        < TIMINGS["lease_ttl_s"]
    )
    assert (
        sample(metrics, "scheduler_firing_tick_duration_seconds", "scheduler_firing_tick_duration_seconds_count") >= 2
    )
    assert sample(metrics, "scheduler_firing_fence_rejections", "scheduler_firing_fence_rejections_total") == 0
    assert sample(metrics, "scheduler_store_errors", "scheduler_store_errors_total", sqlstate_class="conn") == 0

    node.stop()  # draining: not ready any more, though still serving
    status, body = ready(port)
    assert status == 503 and any(reason.startswith("stopping") for reason in body["reasons"])


def test_delivery_gauges_on_the_metrics_endpoint(pg_dsn, conn, start_node):
    """The node reads queue depth per tenant and runs in flight at start (then every 10 s)."""
    now = store_now(conn)
    job = uuid.uuid4()  # runs of no job: nothing fires them, only the gauges read them
    insert_run(conn, job, now - timedelta(seconds=3), tenant="acme")
    insert_run(conn, job, now - timedelta(seconds=2), tenant="acme", queue=None)
    insert_run(conn, job, now - timedelta(seconds=1), tenant="globex")
    insert_run(conn, job, now, tenant="globex", state="leased", leased_until=now)
    insert_run(conn, job, now + timedelta(seconds=1), tenant="globex", state="dead")
    node = start_node(pg_dsn)
    metrics = wait_for(
        "the delivery gauges",
        lambda: scrape(node.metrics_port),
        lambda m: "scheduler_delivery_queue_depth_runs" in m and m["scheduler_delivery_queue_depth_runs"]["samples"],
    )
    assert metrics["scheduler_delivery_queue_depth_runs"]["samples"] == {
        ("scheduler_delivery_queue_depth_runs", ("tenant", "acme")): 2,
        ("scheduler_delivery_queue_depth_runs", ("tenant", "globex")): 1,
        ("scheduler_delivery_queue_depth_runs", ("tenant", "other")): 0,
    }
    assert (
        sample(metrics, "scheduler_delivery_runs_in_flight", "scheduler_delivery_runs_in_flight", state="leased") == 1
    )
    assert (
        sample(metrics, "scheduler_delivery_runs_in_flight", "scheduler_delivery_runs_in_flight", state="failed") == 0
    )


def test_metrics_port_in_use_is_an_error_before_anything_starts(pg_dsn):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        node = Node(Settings(dsn=pg_dsn, node_id="busy", metrics_port=port, **TIMINGS))
        with pytest.raises(Exception, match=f"metrics_port: cannot listen on 127.0.0.1:{port}"):
            node.start()
        assert node._threads == []


# ---------------------------------------------------------------- outage


def test_store_outage_makes_the_node_unready_and_it_recovers_without_losing_a_run(pg_dsn, conn, start_node):
    parts = urlsplit(pg_dsn)
    proxy = TcpProxy(parts.hostname, parts.port)
    try:
        node = start_node(with_host(pg_dsn, "127.0.0.1", proxy.port))
        port = node.metrics_port
        wait_for("/readyz 200", lambda: ready(port)[0], lambda s: s == 200)
        wait_for("all partitions claimed", lambda: len(node.table), lambda n: n == 1024)
        jobs.add_jobs(conn, [JobSpec.build(tenant="acme", interval_s=1) for _ in range(5)])
        since = store_now(conn)
        wait_for("runs before the outage", lambda: count_runs(conn), lambda n: n >= 10)

        proxy.cut()
        cut_at = time.monotonic()
        status, body = wait_for("/readyz 503 (store)", lambda: ready(port), lambda r: r[0] == 503, timeout_s=5)
        assert body["ready"] is False and any(reason.startswith("store:") for reason in body["reasons"])
        # past the TTL the heartbeat is stale too: peers would now take the partitions
        status, body = wait_for(
            "a stale heartbeat",
            lambda: ready(port),
            lambda r: any(x.startswith("heartbeat:") for x in r[1]["reasons"]),
            timeout_s=TIMINGS["lease_ttl_s"] + 5,
        )
        assert status == 503 and time.monotonic() - cut_at >= TIMINGS["lease_ttl_s"] - 0.6
        metrics = scrape(port)  # the endpoint itself keeps serving during the outage
        errors = sum(
            value
            for key, value in metrics["scheduler_store_errors"]["samples"].items()
            if key[0] == "scheduler_store_errors_total"
        )
        assert errors >= 1
        assert (
            sample(metrics, "scheduler_membership_heartbeat_age_seconds", "scheduler_membership_heartbeat_age_seconds")
            >= TIMINGS["lease_ttl_s"]
        )

        # hold the outage past the lease deadline: the node must stop firing on its own
        wait_for(
            "no firable partition",
            lambda: len(node.table.firable()),
            lambda n: n == 0,
            timeout_s=TIMINGS["lease_ttl_s"] + 2,
        )
        time.sleep(max(0.0, cut_at + TIMINGS["lease_ttl_s"] + 2.0 - time.monotonic()))
        outage_s = time.monotonic() - cut_at
        proxy.restore()
        wait_for("/readyz 200 again", lambda: ready(port)[0], lambda s: s == 200, timeout_s=15)
        until = store_now(conn)
        wait_for(
            "the node to catch up",
            lambda: query(conn, "SELECT count(*) AS n FROM jobs WHERE next_nominal_at < %s", (until,))["n"],
            lambda n: n == 0,
            timeout_s=15,
        )
    finally:
        proxy.close()
    report = store.run_transaction(conn, lambda c: verify(c, since, until))
    assert report.expected >= 5 * 3
    assert (report.missing, report.duplicates, report.unexpected) == (0, 0, 0), report
    assert report.runs == report.expected
    assert report.lateness_max_s >= outage_s - TIMINGS["lease_ttl_s"]  # the outage's slots fired late, not lost


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize("host", ["127.0.0.1", "no-such-host.invalid"])
def test_node_with_a_password_and_no_store_never_prints_the_password(pg_dsn, host):
    """A node pointed at a closed port or a bad host logs store errors and serves 503, never the password."""
    dsn = with_host(pg_dsn, host, closed_port(), password=SECRET)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env["SCHEDULER_DSN"] = dsn
    cmd = [
        sys.executable,
        "-m",
        "scheduler",
        "--log-format",
        "json",
        "node",
        "--node-id",
        "secretive",
        "--metrics-port",
        "0",
        *[arg for k, v in TIMINGS.items() for arg in (f"--{k.replace('_', '-')}", str(v))],
    ]
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    try:

        def events() -> list[dict]:
            return [json.loads(line) for line in list(lines) if line.startswith("{")]

        listening = wait_for("metrics_listening", lambda: [e for e in events() if e["event"] == "metrics_listening"])
        wait_for("store_unavailable", lambda: [e for e in events() if e["event"] == "store_unavailable"])
        status, body = ready(listening[0]["port"])
        assert status == 503 and any(reason.startswith("store:") for reason in body["reasons"])
        assert SECRET not in json.dumps(body)
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, _ = process.communicate(timeout=20)
        reader.join(5)
    output = stdout + "".join(lines)
    assert process.returncode == 0, output
    assert SECRET not in output
    started = [json.loads(line) for line in lines if '"node_started"' in line][0]
    assert started["dsn"].startswith(f"postgresql://postgres:***@{host}:")
    assert any(json.loads(line)["event"] == "store_unavailable" for line in lines if line.startswith("{"))


@pytest.mark.parametrize(
    "command",
    [
        ["jobs", "list"],
        ["db", "upgrade"],
        ["runs", "prune", "--older-than", "7d"],
        ["verify", "--since", "2030-01-01T00:00:00Z", "--until", "2030-01-02T00:00:00Z"],
    ],
)
@pytest.mark.parametrize("host", ["127.0.0.1", "no-such-host.invalid"])
def test_cli_store_errors_never_print_the_password(pg_dsn, command, host):
    dsn = with_host(pg_dsn, host, closed_port(), password=SECRET)
    env: dict[str, str | None] = {key: None for key in os.environ if key.startswith("SCHEDULER_")}
    env["SCHEDULER_DSN"] = dsn
    result = CliRunner().invoke(cli, command, env=env, catch_exceptions=False)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: ")
    assert SECRET not in result.stdout + result.stderr
    assert "***@" in result.stderr


def test_config_show_masks_the_password_of_a_real_dsn(pg_dsn):
    dsn = with_host(pg_dsn, "127.0.0.1", 5432, password=SECRET)
    result = CliRunner().invoke(cli, ["config", "show", "--dsn", dsn], catch_exceptions=False)
    assert result.exit_code == 0
    assert SECRET not in result.stdout and ":***@127.0.0.1:5432/" in result.stdout


def test_migration_errors_redact_the_password(pg_dsn):
    """An alembic/SQLAlchemy failure message (which may echo the URL) has the password removed."""
    from scheduler.errors import StoreError
    from scheduler.migrate import upgrade

    dsn = with_host(pg_dsn, "127.0.0.1", closed_port(), password=SECRET)
    with pytest.raises(StoreError) as caught:
        upgrade(dsn)
    assert SECRET not in str(caught.value) and "***@" in str(caught.value)
