"""The push client's transport against real local servers (scheduler/delivery/curl.py, push.Pusher).

No store: :class:`~scheduler.delivery.push.Pusher` sends attempts of hand-made
:class:`~scheduler.delivery.lifecycle.Claimed` runs to threaded ``http.server``
endpoints on 127.0.0.1, and each test asserts what the endpoint received and
the :class:`~scheduler.delivery.push.Outcome`.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers import Receiver

from scheduler.delivery import curl
from scheduler.delivery.lifecycle import Claimed, RunKey
from scheduler.delivery.push import MAX_RESPONSE_READ, Pusher
from scheduler.delivery.ssrf import AddressPolicy

T0 = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
LOCAL = AddressPolicy.parse("127.0.0.1/32")


def claimed(url: str, *, headers: dict[str, str] | None = None, timeout_s: float | None = None) -> Claimed:
    key = RunKey.of(uuid.uuid4(), T0)
    return Claimed(
        key=key,
        tenant="acme",
        queue=None,
        job_name="nightly",
        origin="schedule",
        scheduled_at=T0,
        attempt=1,
        token=uuid.uuid4(),
        leased_until=T0 + timedelta(seconds=60),
        claimed_at=T0,
        payload={"k": 1},
        url=url,
        method="POST",
        headers=headers,
        timeout_s=timeout_s,
    )


def push_all(runs: list[Claimed], policy: AddressPolicy = LOCAL, **kwargs) -> list:
    """Send ``runs`` one after the other through one Pusher; their outcomes in order."""

    async def main() -> list:
        async with Pusher(policy, concurrency=8, per_host=8, **kwargs) as pusher:
            return [await pusher.push(run, ["s3cret"]) for run in runs]

    return asyncio.run(main())


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_a_response_body_past_the_read_limit_is_cut_and_its_status_counts(receiver) -> None:
    receiver.body = b"x" * (3 * MAX_RESPONSE_READ)
    receiver.script = [(503, {}, 0.0)]
    small = Receiver()
    small.body = b"x" * 10
    try:
        first, second = push_all([claimed(receiver.url()), claimed(small.url())])
    finally:
        small.close()
    assert (first.outcome, first.status, first.error) == ("retry", 503, "HTTP 503 Service Unavailable")
    assert (second.outcome, second.status) == ("succeeded", 200)


def test_keep_alive_reuses_one_connection_for_a_host(receiver) -> None:
    outcomes = push_all([claimed(receiver.url()) for _ in range(3)])
    assert [o.outcome for o in outcomes] == ["succeeded"] * 3
    assert len({r["peer"] for r in receiver.requests}) == 1


def test_an_attempt_reaches_the_endpoint_once_when_its_kept_alive_connections_die_unanswered(receiver) -> None:
    """An endpoint that reads each request and drops the connection without answering.
    libcurl re-sends a request whose reused connection died before any answer, on another
    connection, up to 5 times, whenever it can rewind the body: six kept-alive connections
    made one attempt reach the endpoint six times (a trial). One attempt, one request
    (docs/delivery.md): the attempt fails and the run's retry policy decides."""

    async def main() -> tuple[list, object]:
        async with Pusher(LOCAL, concurrency=8, per_host=8) as pusher:
            receiver.delay_s = 0.3  # six at once: six connections, then kept alive
            warm = await asyncio.gather(*(pusher.push(claimed(receiver.url()), ["s3cret"]) for _ in range(6)))
            receiver.script = [(0, {}, 0.0)] * 20
            return warm, await pusher.push(claimed(receiver.url()), ["s3cret"])

    warm, dropped = asyncio.run(main())
    assert [o.outcome for o in warm] == ["succeeded"] * 6
    assert len({r["peer"] for r in receiver.requests[:6]}) == 6
    assert len(receiver.requests) == 7  # the attempt was sent once
    assert dropped.outcome == "retry"
    assert dropped.error == "connection error: connection closed before any answer (not sent again)"


def test_a_connection_idle_past_max_idle_is_not_reused(receiver) -> None:
    """A server may close an idle keep-alive connection as a push is sent on it, and that
    push would fail (never sent twice): connections idle past ``max_idle_s`` are not reused."""

    async def main() -> list[str]:
        async with Pusher(LOCAL, concurrency=8, per_host=8, max_idle_s=1) as pusher:
            outcomes = [await pusher.push(claimed(receiver.url()), ["s3cret"]) for _ in range(2)]
            await asyncio.sleep(2.2)  # libcurl counts idle time in whole seconds: 2 > 1
            outcomes.append(await pusher.push(claimed(receiver.url()), ["s3cret"]))
            return [o.outcome for o in outcomes]

    assert asyncio.run(main()) == ["succeeded"] * 3
    first, second, third = (r["peer"] for r in receiver.requests)
    assert first == second != third


def test_a_proxy_in_the_environment_is_never_used(receiver, monkeypatch) -> None:
    # A proxy that would see (and could keep) every tenant's signed request: pushes go direct.
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # the discard port: nothing listens
    (outcome,) = push_all([claimed(receiver.url())])
    assert outcome.outcome == "succeeded"
    assert receiver.requests[0]["path"] == "/hook"


def test_a_header_with_cr_or_lf_written_past_the_save_check_is_never_sent(receiver) -> None:
    run = claimed(receiver.url(), headers={"X-A": "a\r\nX-Injected: 1"})
    (outcome,) = push_all([run])
    assert (outcome.outcome, outcome.error) == ("failed", "invalid header: CR, LF or NUL in a name or value")
    assert receiver.requests == []


def test_header_values_are_sent_as_given_the_empty_one_included(receiver) -> None:
    run = claimed(receiver.url(), headers={"X-Empty": "", "X-Token": "a b\tc", "idempotency-key": "theirs"})
    (outcome,) = push_all([run])
    assert outcome.outcome == "succeeded"
    headers = receiver.requests[0]["headers"]
    assert (headers["x-empty"], headers["x-token"]) == ("", "a b\tc")
    assert headers["idempotency-key"] == run.run_id  # ours win over the job's, whatever the case
    assert "expect" not in headers


def test_an_attempt_whose_task_is_cancelled_ends_its_transfer_and_the_client_goes_on(receiver) -> None:
    receiver.delay_s = 5.0

    async def main() -> tuple:
        async with Pusher(LOCAL, concurrency=8, per_host=8) as pusher:
            slow = asyncio.ensure_future(pusher.push(claimed(receiver.url()), ["s"]))
            await asyncio.sleep(0.5)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            receiver.delay_s = 0.0
            started = time.monotonic()
            outcome = await pusher.push(claimed(receiver.url()), ["s"])
            return outcome, time.monotonic() - started

    outcome, took = asyncio.run(main())
    assert outcome.outcome == "succeeded" and took < 4.0
    assert len(receiver.requests) == 2


@pytest.fixture
def untrusted_https(tmp_path: Path):
    """An HTTPS endpoint on 127.0.0.1 with a self-signed certificate no system bundle trusts."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    receiver = Receiver()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    receiver.server.socket = context.wrap_socket(receiver.server.socket, server_side=True)
    receiver.cert = cert  # type: ignore[attr-defined]
    yield receiver
    receiver.close()


def test_a_certificate_the_system_does_not_trust_is_refused_and_retried(untrusted_https) -> None:
    (outcome,) = push_all([claimed(f"https://127.0.0.1:{untrusted_https.port}/hook", timeout_s=5)])
    assert outcome.outcome == "retry"
    assert outcome.error.startswith("connection error: ") and "certificate" in outcome.error
    assert untrusted_https.requests == []


def test_a_certificate_from_the_ca_bundle_in_ssl_cert_file_is_trusted(untrusted_https, monkeypatch) -> None:
    # The bundle is the system's (OpenSSL's SSL_CERT_FILE when set), not one built into libcurl.
    monkeypatch.setenv("SSL_CERT_FILE", str(untrusted_https.cert))
    (outcome,) = push_all([claimed(f"https://127.0.0.1:{untrusted_https.port}/hook", timeout_s=5)])
    assert (outcome.outcome, outcome.status) == ("succeeded", 200)
    assert len(untrusted_https.requests) == 1


def test_a_non_ascii_path_and_query_are_sent_percent_encoded(receiver) -> None:
    (outcome,) = push_all([claimed(f"http://127.0.0.1:{receiver.port}/caf\u00e9?q=\u00e9t\u00e9&x=%41")])
    assert outcome.outcome == "succeeded"
    assert receiver.requests[0]["path"] == "/caf%C3%A9?q=%C3%A9t%C3%A9&x=%41"


@pytest.mark.parametrize(
    ("url", "wire"),
    [
        ("http://example.com/a?b=c", "http://example.com/a?b=c"),
        ("https://b\u00fccher.example:8443/\u00fc", "https://xn--bcher-kva.example:8443/%C3%BC"),
        ("http://[::1]/\u00e9#\u00e9", "http://[::1]/%C3%A9#%C3%A9"),
        ("http://[::1]:81/\u00e9", "http://[::1]:81/%C3%A9"),
    ],
)
def test_urls_go_on_the_wire_in_ascii(url: str, wire: str) -> None:
    assert curl.ascii_url(url) == wire


def test_a_url_libcurl_refuses_is_an_invalid_target_url(receiver) -> None:
    # Past the save-time URL rules, but no DNS name: a label of 64 characters has no IDNA form.
    (outcome,) = push_all([claimed("http://" + "\u00e9" * 64 + ".example/a")])
    assert (outcome.outcome, outcome.error) == ("failed", "invalid target url")
    assert receiver.requests == []


def test_each_request_gets_its_own_answer_while_handles_are_reused_across_hosts() -> None:
    """A handle serves the next request as soon as its transfer ends, often before the
    request it served has resumed: what that request gets must be its own answer."""
    ok, busy = Receiver(), Receiver()
    busy.script = [(503, {"Retry-After": "7"}, 0.0)] * 100

    async def main() -> list[tuple[bool, int, str | None]]:
        client = curl.CurlClient(max_total=2, max_per_host=2, allow=LOCAL.allows, user_agent="t", max_body=1024)

        async def sequence(i: int) -> list[tuple[bool, int, str | None]]:
            got = []
            for j in range(50):
                target = busy if (i + j) % 2 else ok
                response = await client.request("POST", target.url(), b"{}", [], 5.0)
                got.append((target is busy, response.status, response.retry_after))
            return got

        try:
            return [item for got in await asyncio.gather(*(sequence(i) for i in range(4))) for item in got]
        finally:
            await client.close()

    try:
        answers = asyncio.run(main())
    finally:
        ok.close()
        busy.close()
    assert len(answers) == 200
    assert [(status, retry_after) for _, status, retry_after in answers] == [
        (503, "7") if to_busy else (200, None) for to_busy, _, _ in answers
    ]
    assert (len(ok.requests), len(busy.requests)) == (100, 100)
