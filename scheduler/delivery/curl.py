"""HTTP/1.1 requests done by libcurl (pycurl's multi interface) on an asyncio event loop.

The push client's transport (:class:`~scheduler.delivery.push.Pusher`).
libcurl parses, frames, pools keep-alive connections and times out in C;
this module only lets the event loop watch curl's sockets (``add_reader`` /
``add_writer`` from curl's socket callback, ``call_later`` from its timer
callback, the pattern of libcurl's ``multi_socket`` API and of its
``hiperfifo`` example) and hands each finished transfer to the coroutine
awaiting it. Measured on this project's 2-core machine against one local
receiver: ~105 µs of client CPU per request against ~250 µs for aiohttp's
client, and one node's pushes are bounded by that CPU (docs/performance.md,
"2026-12-02, evening: push at 3,000 runs/s").

What every request gets, whatever the caller passes:

* no proxy (an empty ``PROXY``: the environment's ``http_proxy`` is ignored,
  as pushes go straight to the tenant's endpoint), no cookies (libcurl keeps
  none without a cookie file), no redirects followed, ``http`` and
  ``https`` only, HTTP/1.1, no content decoding;
* the SSRF rule at connect: ``allow(address)`` is asked for every address
  curl is about to connect to (``OPENSOCKETFUNCTION``, after DNS, so a name
  that now resolves to a refused address is never connected to); a refused
  address is skipped and curl tries the name's next one;
* at most ``max_body`` bytes of a response body read; a longer body ends
  the transfer (its connection is closed, the status is kept);
* **one request per call, never re-sent.** libcurl re-sends a request
  whose reused connection died before any answer (on another connection,
  up to 5 times), rewinding the body to do so: an endpoint that read the
  request and then dropped the connection got one push attempt six times
  (a trial, six kept-alive connections). The body is handed to libcurl
  by a read callback whose seek callback refuses to rewind once libcurl
  has read any of it, so such a request fails (:class:`TransferError`,
  "connection closed before any answer") and the caller's retry policy
  decides, as for any connection error. A request whose connection died
  before libcurl read its body may still be retried by libcurl: at most its
  headers went out, and no endpoint acts on a request whose body
  (``Content-Length`` bytes) never came.

A connection is checked when it is opened and then reused (keep-alive) for
the same host and port only; the policy never changes during a client's life.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pycurl

READ, WRITE = 1, 2

MAX_IDLE_S = 4
"""A kept-alive connection idle longer than this is closed, not reused (libcurl's
``MAXAGE_CONN``; its default is 118 s). Below the idle timeouts servers close
connections after (Node.js 5 s; nginx 75 s): a server closing an idle
connection must not race the push sent on it, which would fail (a request is
never sent twice, see the module doc) and wait for its retry. A host pushed to
every few seconds keeps its connections."""


@dataclasses.dataclass(frozen=True)
class Response:
    """What came back: ``status`` (e.g. 204), ``reason`` (the status line's phrase, may be
    empty), ``retry_after`` (the ``Retry-After`` header's value as sent, or None)."""

    status: int
    reason: str
    retry_after: str | None


class TransferError(Exception):
    """No response: ``code`` is libcurl's error number (``pycurl.E_*``), ``message`` its text."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def timed_out(self) -> bool:
        """The request's own deadline (``timeout_s``) passed."""
        return self.code == pycurl.E_OPERATION_TIMEDOUT


class AddressRefused(TransferError):
    """Every address curl tried for the host was refused by ``allow`` (``refused``: them, in order)."""

    def __init__(self, refused: Sequence[str]) -> None:
        super().__init__(pycurl.E_COULDNT_CONNECT, "every address refused: " + ", ".join(refused))
        self.refused = tuple(refused)


class _Transfer:
    """One easy handle's request state while curl runs it: the status line, ``Retry-After``,
    bytes read, and the addresses refused or allowed at connect. Made once per handle with
    its callbacks set once (:meth:`CurlClient._new_handle`), and :meth:`reset` for each
    request: a handle is reused only once out of the multi handle, so no callback of an
    earlier request can reach a later one."""

    __slots__ = (
        "allow",
        "allowed",
        "body",
        "body_read",
        "future",
        "max_body",
        "method",
        "over_limit",
        "refused",
        "retry_after",
        "rewind_refused",
        "sent",
        "status",
        "url",
    )

    def __init__(self, allow: Callable[[str], bool], max_body: int) -> None:
        self.allow = allow
        self.max_body = max_body
        self.url = ""  # the URL and method last set on the handle (set again only when they change)
        self.method = ""
        self.future: asyncio.Future[Response] | None = None
        self.body = b""
        self.sent = -1
        self.rewind_refused = False
        self.status = b""
        self.retry_after: bytes | None = None
        self.body_read = 0
        self.over_limit = False
        self.refused: list[str] = []
        self.allowed = 0

    def reset(self, future: asyncio.Future[Response], body: bytes) -> None:
        """Ready for a new request sending ``body``, finished through ``future``."""
        self.future = future
        self.body = body
        self.sent = -1  # body bytes handed to libcurl (-1: it has not asked for the body yet)
        self.rewind_refused = False
        self.status = b""
        self.retry_after = None
        self.body_read = 0
        self.over_limit = False
        self.refused = []
        self.allowed = 0

    def header(self, line: bytes) -> None:
        if line[:5] == b"HTTP/":  # a new response (a 1xx may come first): forget the last one's
            self.status = line
            self.retry_after = None
        elif line[:12].lower() == b"retry-after:":
            self.retry_after = line[12:].strip()

    def write(self, data: bytes) -> int | None:
        self.body_read += len(data)
        if self.body_read > self.max_body:
            self.over_limit = True
            return 0  # fewer bytes than given: curl ends the transfer (CURLE_WRITE_ERROR)
        return None  # all of it taken

    def read(self, size: int) -> bytes:
        """libcurl's ``READFUNCTION``: the next ``size`` bytes of the request body."""
        start = max(self.sent, 0)
        chunk = self.body[start : start + size]
        self.sent = start + len(chunk)
        return chunk

    def seek(self, offset: int, origin: int) -> int:
        """libcurl's ``SEEKFUNCTION``, called to rewind the body before sending the request
        again: allowed only while libcurl has read none of it (see the module doc)."""
        if self.sent < 0 and offset == 0 and origin == os.SEEK_SET:
            return pycurl.SEEKFUNC_OK
        self.rewind_refused = True
        return pycurl.SEEKFUNC_FAIL

    def open_socket(self, purpose: int, address: tuple[int, int, int, tuple[Any, ...]]) -> Any:
        family, socktype, protocol, addr = address
        host = str(addr[0])
        if not self.allow(host):
            self.refused.append(host)
            return pycurl.SOCKET_BAD  # curl goes on with the name's next address, if any
        self.allowed += 1
        return socket.socket(family, socktype, protocol)  # pycurl keeps a dup() of its descriptor


def _ca_options() -> list[tuple[int, str]]:
    """The system's CA bundle for ``https`` (libcurl's built-in path is the wheel builder's)."""
    paths = ssl.get_default_verify_paths()
    out: list[tuple[int, str]] = []
    cafile = os.environ.get(paths.openssl_cafile_env) or paths.cafile
    capath = os.environ.get(paths.openssl_capath_env) or paths.capath
    if cafile and os.path.isfile(cafile):
        out.append((pycurl.CAINFO, cafile))
    if capath and os.path.isdir(capath):
        out.append((pycurl.CAPATH, capath))
    return out


class CurlClient:
    """A keep-alive HTTP/1.1 client on the running event loop (create it inside the loop).

    ``max_total`` connections at most, ``max_per_host`` per host and port;
    ``allow(address)`` decides every address connected to (module doc);
    ``resolve`` pins names to addresses (``{"name": ["10.0.0.1", ...]}``,
    libcurl's ``RESOLVE``, tests); ``dns_cache_s`` how long a name's answer
    is reused (seconds); ``max_body`` the response bytes read at most;
    ``max_idle_s`` how long an idle connection may wait to be reused
    (whole seconds, :data:`MAX_IDLE_S`).
    Not thread-safe: one loop, one thread. :meth:`close` when done.
    """

    def __init__(
        self,
        *,
        max_total: int,
        max_per_host: int,
        allow: Callable[[str], bool],
        user_agent: str,
        max_body: int,
        resolve: Mapping[str, Sequence[str]] | None = None,
        dns_cache_s: int = 10,
        max_idle_s: int = MAX_IDLE_S,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._allow = allow
        self._max_body = max_body
        self._resolve = dict(resolve or {})
        self._static: list[tuple[int, Any]] = [
            (pycurl.NOSIGNAL, 1),
            (pycurl.POST, 1),  # a body from READFUNCTION (CUSTOMREQUEST names the method)
            (pycurl.PROXY, ""),
            (pycurl.FOLLOWLOCATION, 0),
            (pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS),
            (pycurl.REDIR_PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS),
            (pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1),
            (pycurl.USERAGENT, user_agent),
            (pycurl.DNS_CACHE_TIMEOUT, dns_cache_s),
            (pycurl.MAXAGE_CONN, max_idle_s),
            (pycurl.TCP_NODELAY, 1),
            *_ca_options(),
        ]
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._multi.setopt(pycurl.M_MAX_TOTAL_CONNECTIONS, max_total)
        self._multi.setopt(pycurl.M_MAX_HOST_CONNECTIONS, max_per_host)
        self._multi.setopt(pycurl.M_MAXCONNECTS, max_total)
        self._watched: dict[int, int] = {}
        self._timer: asyncio.Handle | None = None
        self._timer_soon = False  # self._timer is a call at the loop's next turn (a 0 timeout)
        self._running: dict[pycurl.Curl, _Transfer] = {}
        self._state: dict[pycurl.Curl, _Transfer] = {}  # every open handle's, running or idle
        self._idle: list[pycurl.Curl] = []
        self._max_idle = max_total
        self._closed = False

    async def request(
        self, method: str, url: str, body: bytes, headers: Sequence[tuple[str, str]], timeout_s: float
    ) -> Response:
        """Send ``method url`` with ``body`` and ``headers`` (``(name, value)``, values
        without CR/LF) and read the answer, all within ``timeout_s`` (seconds).

        Returns the :class:`Response` (any status). Raises :class:`AddressRefused`
        if every address tried was refused, :class:`TransferError` for any other
        failure (``timed_out`` for the deadline), RuntimeError once closed.
        Cancelling the awaiting task ends the transfer.
        """
        if self._closed:
            raise RuntimeError("the HTTP client is closed")
        handle = self._idle.pop() if self._idle else self._new_handle()
        transfer = self._state[handle]
        future: asyncio.Future[Response] = self._loop.create_future()
        transfer.reset(future, body)
        lines = [f"{name}: {value}" if value else f"{name};" for name, value in headers]
        lines.append("Expect:")  # no 100-continue round trip for bodies over 1 KiB
        try:
            if url != transfer.url:
                transfer.url = ""
                handle.setopt(pycurl.URL, ascii_url(url))
                transfer.url = url
            if method != transfer.method:
                handle.setopt(pycurl.CUSTOMREQUEST, method)
                transfer.method = method
            handle.setopt(pycurl.POSTFIELDSIZE_LARGE, len(body))
            handle.setopt(pycurl.HTTPHEADER, lines)
            handle.setopt(pycurl.TIMEOUT_MS, max(1, round(timeout_s * 1000)))
            if self._resolve:
                handle.setopt(pycurl.RESOLVE, _resolve_entries(self._resolve, url))
        except (pycurl.error, UnicodeError, TypeError, ValueError) as exc:  # e.g. a URL curl cannot take
            self._close_handle(handle)
            raise TransferError(pycurl.E_URL_MALFORMAT, f"request refused by libcurl: {type(exc).__name__}") from None
        self._running[handle] = transfer
        self._multi.add_handle(handle)
        try:
            return await future  # the answer or the error, taken when the transfer ended (_finish)
        except asyncio.CancelledError:
            if self._running.get(handle) is transfer and transfer.future is future:  # still this request's
                self._drop(handle, reuse=False)
            raise

    async def close(self) -> None:
        """End every transfer (their awaiters get :class:`TransferError`) and close the connections."""
        if self._closed:
            return
        self._closed = True
        for handle, transfer in list(self._running.items()):
            self._drop(handle, reuse=False)
            _finish(transfer, pycurl.E_ABORTED_BY_CALLBACK, "client closed")
        for fd, events in list(self._watched.items()):
            self._unwatch(fd, events)
        self._watched.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for handle in self._idle:
            self._close_handle(handle)
        self._idle.clear()
        self._multi.close()

    # ------------------------------------------------------------ curl's side

    def _new_handle(self) -> pycurl.Curl:
        handle = pycurl.Curl()
        for option, value in self._static:
            handle.setopt(option, value)
        transfer = _Transfer(self._allow, self._max_body)
        handle.setopt(pycurl.READFUNCTION, transfer.read)  # not POSTFIELDS: never re-sent
        handle.setopt(pycurl.SEEKFUNCTION, transfer.seek)
        handle.setopt(pycurl.HEADERFUNCTION, transfer.header)
        handle.setopt(pycurl.WRITEFUNCTION, transfer.write)
        handle.setopt(pycurl.OPENSOCKETFUNCTION, transfer.open_socket)
        self._state[handle] = transfer
        return handle

    def _close_handle(self, handle: pycurl.Curl) -> None:
        self._state.pop(handle, None)
        handle.close()

    def _drop(self, handle: pycurl.Curl, *, reuse: bool) -> None:
        self._running.pop(handle, None)
        self._multi.remove_handle(handle)
        if reuse and len(self._idle) < self._max_idle:
            self._idle.append(handle)
        else:
            self._close_handle(handle)

    def _on_socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        wanted = 0
        if what in (pycurl.POLL_IN, pycurl.POLL_INOUT):
            wanted |= READ
        if what in (pycurl.POLL_OUT, pycurl.POLL_INOUT):
            wanted |= WRITE
        had = self._watched.get(fd, 0)
        if wanted == had:
            return
        self._unwatch(fd, had & ~wanted)
        added = wanted & ~had
        if added & READ:
            self._loop.add_reader(fd, self._act, fd, pycurl.CSELECT_IN)
        if added & WRITE:
            self._loop.add_writer(fd, self._act, fd, pycurl.CSELECT_OUT)
        if wanted:
            self._watched[fd] = wanted
        else:
            self._watched.pop(fd, None)

    def _unwatch(self, fd: int, events: int) -> None:
        if events & READ:
            self._loop.remove_reader(fd)
        if events & WRITE:
            self._loop.remove_writer(fd)

    def _on_timer(self, timeout_ms: int) -> None:
        """libcurl's timer callback: act on ``SOCKET_TIMEOUT`` in ``timeout_ms`` (-1: never).
        A 0 while a call is already due at the loop's next turn keeps that call: libcurl
        asks for 0 at every handle added, and a claim adds dozens in one turn."""
        if timeout_ms == 0 and self._timer_soon and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_soon = timeout_ms == 0
        if timeout_ms == 0:
            self._timer = self._loop.call_soon(self._act, pycurl.SOCKET_TIMEOUT, 0)
        elif timeout_ms > 0:
            self._timer = self._loop.call_later(timeout_ms / 1000, self._act, pycurl.SOCKET_TIMEOUT, 0)

    def _act(self, fd: int, events: int) -> None:
        if self._closed:
            return
        if fd == pycurl.SOCKET_TIMEOUT:
            self._timer = None
        try:
            while True:
                code, _ = self._multi.socket_action(fd, events)
                if code != pycurl.E_CALL_MULTI_PERFORM:
                    break
        except pycurl.error as exc:  # the multi handle itself failed: end every transfer, none hangs
            code, message = (exc.args + (pycurl.E_ABORTED_BY_CALLBACK, "libcurl multi error"))[:2]
            for handle, transfer in list(self._running.items()):
                self._drop(handle, reuse=False)
                _finish(transfer, int(code), str(message))
            return
        self._collect()

    def _collect(self) -> None:
        while True:
            queued, done, failed = self._multi.info_read()
            for handle in done:
                transfer = self._running.get(handle)
                if transfer is not None:
                    transfer.status = transfer.status or _status_line(handle)
                    self._drop(handle, reuse=True)
                    _finish(transfer)
            for handle, code, message in failed:
                transfer = self._running.get(handle)
                if transfer is not None:
                    self._drop(handle, reuse=False)
                    _finish(transfer, code, message)
            if not queued:
                return


_URL_SAFE = "".join(chr(c) for c in range(0x21, 0x7F))


def ascii_url(url: str) -> str:
    """``url`` as sent on the wire: a non-ASCII host in its IDNA form (``xn--…``, as DNS was
    asked when the URL was saved), any other non-ASCII character percent-encoded as UTF-8
    (what browsers and aiohttp send); an ASCII URL unchanged. Raises UnicodeError for a
    host IDNA cannot encode, ValueError for a URL that does not split."""
    if url.isascii():
        return url
    parts = urlsplit(url)
    host, colon, port = parts.netloc.rpartition(":")
    if not (colon and port.isdigit()):  # no port ("[::1]" splits as "[:" and "1]")
        host, colon, port = parts.netloc, "", ""
    if not host.isascii():
        host = host.encode("idna").decode("ascii")
    return urlunsplit(
        (
            parts.scheme,
            host + colon + port,
            quote(parts.path, safe=_URL_SAFE),
            quote(parts.query, safe=_URL_SAFE),
            quote(parts.fragment, safe=_URL_SAFE),
        )
    )


def _status_line(handle: pycurl.Curl) -> bytes:
    return f"HTTP/1.1 {handle.getinfo(pycurl.RESPONSE_CODE)} ".encode()


def _finish(transfer: _Transfer, code: int | None = None, message: str = "") -> None:
    """End ``transfer``'s request: its future gets the :class:`Response` (``code`` None: curl
    finished it; or a response whose body went over the limit) or the error, taken now (the
    handle may serve another request before the awaiter resumes)."""
    future = transfer.future
    if future is None or future.done():
        return
    if code is None or (transfer.over_limit and transfer.status):
        future.set_result(_response(transfer))
    elif transfer.rewind_refused and not transfer.status:
        future.set_exception(TransferError(code, "connection closed before any answer (not sent again)"))
    elif transfer.refused and not transfer.allowed:
        future.set_exception(AddressRefused(transfer.refused))
    else:
        future.set_exception(TransferError(code, message))


def _response(transfer: _Transfer) -> Response:
    parts = transfer.status.split(None, 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    reason = parts[2].strip().decode("latin-1") if len(parts) > 2 else ""
    retry_after = transfer.retry_after.decode("latin-1") if transfer.retry_after is not None else None
    return Response(status, reason, retry_after)


def _resolve_entries(table: Mapping[str, Sequence[str]], url: str) -> list[str]:
    """libcurl ``RESOLVE`` lines (``name:port:addr,addr``) for ``table``'s names at ``url``'s port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return [f"{name}:{port}:{','.join(_bracket(a) for a in addresses)}" for name, addresses in table.items()]


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address else address
