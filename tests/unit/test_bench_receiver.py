"""The bench's ``raw`` receiver (:class:`bench.consumers.RawReceiver`): HTTP/1.1 requests split
across reads or several in one read are each recorded once, with their Idempotency-Key, and
answered 204 in order; what it does not serve is refused and the connection closed."""

from __future__ import annotations

import asyncio

import pytest

from bench.consumers import RawReceiver


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True


def request(key: str | None, body: bytes = b'{"a":1}', extra: str = "") -> bytes:
    head = "POST /run HTTP/1.1\r\nHost: 127.0.0.1:1\r\nContent-Type: application/json\r\n"
    if key is not None:
        head += f"Idempotency-Key: {key}\r\n"
    return (head + extra + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def connect() -> tuple[RawReceiver, FakeTransport, list[tuple[str, float]]]:
    seen: list[tuple[str, float]] = []
    protocol = RawReceiver(seen)
    transport = FakeTransport()
    protocol.connection_made(transport)
    return protocol, transport, seen


def test_a_request_split_anywhere_is_recorded_once_when_its_body_is_complete() -> None:
    data = request("7.1700000000000000")
    for cut in range(1, len(data)):
        protocol, transport, seen = connect()
        protocol.data_received(data[:cut])
        assert (seen, transport.written) == ([], b"")
        protocol.data_received(data[cut:])
        assert [key for key, _ in seen] == ["7.1700000000000000"]
        assert transport.written == b"HTTP/1.1 204 No Content\r\n\r\n"
        assert not transport.closed


def test_requests_in_one_read_are_answered_in_order_and_the_connection_kept() -> None:
    protocol, transport, seen = connect()
    protocol.data_received(request("1.1") + request("2.2", b"") + request(None) + request("3.3")[:10])
    assert [key for key, _ in seen] == ["1.1", "2.2", ""]
    assert transport.written == b"HTTP/1.1 204 No Content\r\n\r\n" * 3
    protocol.data_received(request("3.3")[10:])
    assert [key for key, _ in seen] == ["1.1", "2.2", "", "3.3"]
    assert not transport.closed


def test_header_names_in_any_case_and_values_keep_theirs() -> None:
    protocol, transport, seen = connect()
    body = b"xyz"
    protocol.data_received(
        b"POST /run HTTP/1.1\r\nidempotency-KEY:  Ab.C \r\ncontent-length: 3\r\n\r\n" + body + request("d.E")
    )
    assert [key for key, _ in seen] == ["Ab.C", "d.E"]


def test_connection_close_is_answered_then_closed() -> None:
    protocol, transport, seen = connect()
    protocol.data_received(request("1.1", extra="Connection: close\r\n") + request("2.2"))
    assert [key for key, _ in seen] == ["1.1"]
    assert transport.written == b"HTTP/1.1 204 No Content\r\n\r\n"
    assert transport.closed


@pytest.mark.parametrize(
    ("extra", "status"),
    [("Transfer-Encoding: chunked\r\n", b"501"), ("Content-Length: -1\r\n", b"400"), ("Content-Length: x\r\n", b"400")],
)
def test_what_it_does_not_serve_is_refused_unrecorded_and_closed(extra: str, status: bytes) -> None:
    protocol, transport, seen = connect()
    protocol.data_received(b"POST /run HTTP/1.1\r\nIdempotency-Key: 1.1\r\n" + extra.encode() + b"\r\n")
    assert seen == []
    assert transport.written.startswith(b"HTTP/1.1 " + status + b" ")
    assert transport.closed
