"""The API's commands: `scheduler keys create|list|revoke`, `scheduler api`, `scheduler node --api-port`."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from scheduler import jobs, store
from scheduler.api import keys
from scheduler.cli import cli
from scheduler.metrics import Metrics
from scheduler.node import Node
from scheduler.settings import Settings

SCRIPT = Path(sys.executable).with_name("scheduler")
TIMINGS = {"lease_ttl_s": 4.0, "renew_interval_s": 1.0, "poll_interval_s": 0.5, "tick_interval_s": 0.5}


def run(args: list[str], dsn: str):
    env = {key: None for key in os.environ if key.startswith("SCHEDULER_")} | {"SCHEDULER_DSN": dsn}
    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


def test_keys_create_prints_the_token_once_list_never_shows_it_revoke_refuses_it(pg_dsn):
    with store.connect(pg_dsn) as conn:
        jobs.add_tenant(conn, "acme")
    created = run(["keys", "create", "--tenant", "acme", "--role", "worker", "--name", "ci"], pg_dsn)
    assert created.exit_code == 0, created.stderr
    token = created.stdout.strip()
    assert created.stdout == token + "\n"  # the token alone on stdout
    key_id, _ = keys.parse_token(token)
    assert created.stderr == f"key {key_id} created (role worker, tenant acme); the token below is shown once\n"
    with store.connect(pg_dsn) as conn:
        assert keys.authenticate(conn, token) == keys.Principal(key_id, "acme", "worker")

    listed = run(["keys", "list", "--json"], pg_dsn)
    assert listed.exit_code == 0
    [row] = json.loads(listed.stdout)
    assert (row["key_id"], row["tenant"], row["role"], row["name"], row["revoked_at"]) == (
        key_id,
        "acme",
        "worker",
        "ci",
        None,
    )
    text = run(["keys", "list", "--tenant", "acme"], pg_dsn).stdout
    assert key_id in text and token.split("_", 2)[2] not in text + listed.stdout

    revoked = run(["keys", "revoke", key_id], pg_dsn)
    assert revoked.exit_code == 0 and revoked.stdout.startswith(f"key {key_id} revoked at ")
    with store.connect(pg_dsn) as conn:
        assert keys.authenticate(conn, token) is None


def test_keys_create_errors_are_one_line_naming_the_field(pg_dsn):
    for args, message in (
        (["--tenant", "ghost", "--role", "tenant"], "tenant: no tenant 'ghost' (create it with `scheduler tenants "
                                                    "add`)"),
        (["--role", "worker"], "tenant: is required for a worker key"),
        (["--tenant", "x", "--role", "admin"], "tenant: must be omitted for an admin key (admin keys belong to no "
                                               "tenant) (got 'x')"),
    ):  # fmt: skip
        result = run(["keys", "create", *args], pg_dsn)
        assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {message}\n")
    result = run(["keys", "revoke", "nothex"], pg_dsn)
    assert result.exit_code == 2 and result.stderr.startswith("error: key_id: must be 16 lower-case hex characters")


def test_keys_create_help_says_the_tenant_must_exist_and_how_to_create_it(pg_dsn):
    """``jobs add`` creates a missing tenant, ``keys create`` refuses one (exit 2): its help says so."""
    text = " ".join(run(["keys", "create", "--help"], pg_dsn).stdout.split())
    assert "--tenant TEXT The key's tenant, which must exist (`scheduler tenants add T` creates it, as" in text
    assert "`jobs add` does); omit it for --role admin." in text


def test_a_token_pasted_where_a_key_id_or_tenant_goes_is_never_echoed_by_the_cli(pg_dsn):
    """``keys revoke TOKEN`` (the natural mistake) and a token given as ``--tenant`` are
    refused with the token shown as ``tk_<redacted>``, never its secret.

    The secret is base64url, so it may itself hold ``_``: one token of each kind is tried
    (each of 43 characters is ``_`` with chance 1/64, so a token has one about half the time)."""
    tokens: dict[bool, str] = {}
    with store.connect(pg_dsn) as conn:
        conn.execute("INSERT INTO tenants (tenant) VALUES ('acme') ON CONFLICT DO NOTHING")
        for _ in range(200):
            token, _key_id = keys.create(conn, "acme", "tenant", "t")
            tokens.setdefault("_" in token.split("_", 2)[2], token)
            if len(tokens) == 2:
                break
    assert len(tokens) == 2
    for token in tokens.values():
        secret = token.split("_", 2)[2]  # tk_<key id: 16 hex>_<secret: 43 base64url>
        assert len(secret) == 43
        for args in (["keys", "revoke", token], ["keys", "create", "--tenant", token, "--role", "tenant"]):
            result = run(args, pg_dsn)
            assert result.exit_code == 2 and "tk_<redacted>" in result.stderr, result.stderr
            assert secret not in result.stderr and secret[:12] not in result.stderr


def test_scheduler_api_serves_on_loopback_until_sigterm(pg_dsn):
    with store.connect(pg_dsn) as conn:
        token, _ = keys.create(conn, None, "admin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")} | {"SCHEDULER_DSN": pg_dsn}
    proc = subprocess.Popen(
        [str(SCRIPT), "--log-format", "json", "api", "--port", "0"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stderr.readline()
        event = json.loads(line)
        assert event["event"] == "api_listening", line
        url = event["url"]
        assert url.startswith("http://127.0.0.1:")
        response = httpx.get(f"{url}/v1/tenants", headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200 and response.json() == {"items": [], "next_cursor": None}
        assert httpx.get(f"{url}/openapi.json").json()["info"]["title"] == "trigger engine API"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
    assert token not in stderr
    # The stop is logged, as a node's and a worker's are (its last line was api_listening; a trial).
    last = json.loads(stderr.strip().splitlines()[-1])
    assert (last["event"], last["signal"]) == ("api_stopped", "SIGTERM"), stderr


def test_scheduler_api_refuses_a_port_in_use_and_one_ssl_option_alone(pg_dsn, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")} | {"SCHEDULER_DSN": pg_dsn}
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    result = subprocess.run(
        [str(SCRIPT), "api", "--ssl-certfile", str(cert)], env=env, capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stderr) == (
        2,
        "error: --ssl-certfile and --ssl-keyfile go together: give both or neither (see 'scheduler api --help')\n",
    )
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [str(SCRIPT), "api", "--port", str(port)], env=env, capture_output=True, text=True, timeout=60
        )
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: port: cannot listen on 127.0.0.1:{port} (")


def test_a_node_with_api_port_serves_the_api_on_its_own_thread_and_stops_it(pg_dsn, caplog):
    with store.connect(pg_dsn) as conn:
        token, _ = keys.create(conn, None, "admin")
    node = Node(Settings(dsn=pg_dsn, node_id="api-node", api_port=0, **TIMINGS), metrics=Metrics())
    caplog.set_level(logging.INFO, logger="scheduler")
    node.start()
    try:
        assert node.api is not None and node.api.thread.name == "api"
        url = node.api.url
        # The event `scheduler api` logs, once, before node_started.
        events = [r.event for r in caplog.records if getattr(r, "event", None) in ("api_listening", "node_started")]
        assert events == ["api_listening", "node_started"]
        [listening] = [r for r in caplog.records if getattr(r, "event", None) == "api_listening"]
        assert listening.fields == {"url": f"http://127.0.0.1:{node.api.port}"}
        response = httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200, response.text
        deadline = time.monotonic() + 20
        while not response.json()["nodes"] and time.monotonic() < deadline:
            time.sleep(0.2)
            response = httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"})
        assert [n["node_id"] for n in response.json()["nodes"]] == ["api-node"]
    finally:
        node.stop()
        node.join(15)
    assert not node.api.thread.is_alive()
    try:
        httpx.get(f"{url}/v1/status", timeout=2)
        raise AssertionError("the API still answers after the node stopped")
    except httpx.TransportError:
        pass


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a certificate")
def test_scheduler_api_serves_https_with_uvicorns_tls_options(pg_dsn, tmp_path):
    cert, key = tmp_path / "api.pem", tmp_path / "api.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    with store.connect(pg_dsn) as conn:
        token, _ = keys.create(conn, None, "admin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")} | {"SCHEDULER_DSN": pg_dsn}
    proc = subprocess.Popen(
        [str(SCRIPT), "--log-format", "json", "api", "--port", "0", "--ssl-certfile", str(cert), "--ssl-keyfile",
         str(key)],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = json.loads(proc.stderr.readline())["url"]
        assert url.startswith("https://127.0.0.1:")
        response = httpx.get(
            f"{url}/v1/status",
            headers={"Authorization": f"Bearer {token}"},
            verify=ssl.create_default_context(cafile=str(cert)),
        )
        assert response.status_code == 200, response.text
        with pytest.raises(httpx.TransportError):
            httpx.get(url.replace("https://", "http://") + "/v1/status", timeout=5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert proc.returncode == 0


def test_the_runs_group_help_names_every_subcommand():
    """``scheduler --help`` said runs were to "inspect and prune": ``redrive`` was missing."""
    result = CliRunner().invoke(cli, ["--help"])
    [line] = [line for line in result.output.splitlines() if line.strip().startswith("runs ")]
    group = cli.commands["runs"]
    assert sorted(group.commands) == ["cancel", "list", "prune", "redrive"]
    for name in group.commands:  # as `scheduler --help` shows the line (cut to the terminal's 80 columns)
        assert name in line.lower(), (name, line)


def test_trigger_force_help_says_what_it_overrides_and_what_still_holds():
    """``--force`` said "run even if the overlap policy would skip it", and the command's help
    "(then 'skipped' if the policy forbids it)": it overrides only the overlap policy's
    skip or hold; replace still cancels, and the request id still deduplicates."""
    result = CliRunner().invoke(cli, ["jobs", "trigger", "--help"], terminal_width=200)
    text = " ".join(result.output.split())
    assert "then 'skipped'" not in text and 'then "skipped"' not in text
    assert (
        "--force Deliver the run at once even if the job's overlap policy would skip it (forbid) or hold it "
        "(buffer_one); replace still cancels the job's unfinished runs. The request id still deduplicates: "
        "a repeated --request-id makes no second run, forced or not." in text
    ), text
