"""DSNs: check one before anything connects with it, redact its password, name its SQLAlchemy dialect, describe
a failed connection (every host's failure on one line).

Never print a DSN as given: :func:`redact_dsn` and :func:`redact_text` mask
every spelling of its password (:func:`secret_spellings`).
"""

from __future__ import annotations

import os
import re
import socket
from urllib.parse import quote, quote_plus, unquote, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from scheduler import log
from scheduler.errors import ConfigError


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name if it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_ALL_ATTEMPTS = "Multiple connection attempts failed. All failures were:"
"""psycopg's line before one line per host it tried (a multi-host DSN)."""
_PSYCOPG_ATTEMPT = re.compile(
    r"- host: (?P<host>'[^']*'|None), port: (?P<port>'[^']*'|None), hostaddr: (?:'[^']*'|None): (?P<error>.*)"
)
_LIBPQ_ATTEMPT = re.compile(
    r'connection to server (?:at "(?P<host>[^"]*)"(?: \([^)]*\))?, port (?P<port>\d+)'
    r'|on socket "(?P<socket>[^"]*)") failed: (?P<reason>.*)'
)


_UNRESOLVED_HOST = re.compile(r"failed to resolve host (?P<host>'[^']*'|None): ")
"""psycopg's error when no host name of the DSN resolved (naming only the last one)."""

UNRESOLVED = "name does not resolve"
"""The reason :func:`connect_error` gives a host whose name does not resolve."""


def connect_error(exc: BaseException, dsn: str | None = None) -> str:
    """One line naming each host's failure of a failed connection: ``host:port: reason; host:port: reason``.

    A multi-host DSN (``h1:p1,h2:p2``, ``?host=h1,h2&port=p1,p2``,
    ``host=h1,h2 port=p1,p2``) makes psycopg try each host in turn; its
    error then holds one block per attempt (``- host: 'h1', port: 'p1', ...:
    <libpq's message>``), and libpq's own message one line per address it
    tried (``connection to server at "h" (addr), port p failed: <reason>``,
    ``... on socket "/path" failed: <reason>``). Each attempt becomes
    ``host:port: reason`` (the host and port as the DSN names them when
    several were tried, else as libpq reports them: psycopg resolves a host
    name first, so its address; a socket's path), in the order tried,
    repeated ones once; libpq's hint
    lines (``Is the server running ...``) are dropped. psycopg resolves host
    names before libpq tries any and leaves out those that do not resolve
    (naming only the last, and only when none did): given the ``dsn``, each
    host name of it the error does not name is ``host:port: name does not
    resolve`` (:data:`UNRESOLVED`; the port as the DSN gives it, else
    ``PGPORT`` or 5432), in the DSN's order among the others. A message with
    no such line (``invalid port number: "99999"``) gives its first line
    (:func:`first_line`). The result is not redacted: pass it through
    :func:`redact_text`.
    """
    lines = str(exc).strip().splitlines()
    if _ALL_ATTEMPTS in lines:  # the lines above repeat the last attempt
        lines = lines[lines.index(_ALL_ATTEMPTS) + 1 :]
    failures: list[tuple[str, str]] = []  # (host as named, "host:port: reason")
    for line in lines:
        attempt = _PSYCOPG_ATTEMPT.match(line.strip())
        error = attempt.group("error") if attempt else line.strip()
        libpq = _LIBPQ_ATTEMPT.search(error)
        if attempt is not None:
            host, port = (attempt.group(name).strip("'") for name in ("host", "port"))
            where = host if port == "None" else f"{host}:{port}"
        elif libpq is not None:
            host = libpq.group("socket") or libpq.group("host")
            where = libpq.group("socket") or f"{libpq.group('host')}:{libpq.group('port')}"
        else:
            continue
        reason = libpq.group("reason") if libpq is not None else error.removeprefix("connection failed: ")
        failures.append((host, f"{where}: {reason.strip()}"))
    if dsn is not None and (failures or _UNRESOLVED_HOST.match(str(exc).strip())):
        # Only an error about connection attempts can have left hosts out; one about the DSN
        # itself (``invalid port number``) tried none, and says so on its first line.
        failures = _with_unresolved(failures, dsn, exc)
    return "; ".join(dict.fromkeys(text for _, text in failures)) if failures else first_line(exc)


def _with_unresolved(failures: list[tuple[str, str]], dsn: str, exc: BaseException) -> list[tuple[str, str]]:
    """``failures`` with a ``host:port: name does not resolve`` entry for each host name of ``dsn``
    psycopg would resolve that no failure names and that does not resolve (psycopg 3.3 names
    the addresses a name resolved to, e.g. ``127.0.0.1`` for ``localhost``, so a name absent
    from the failures may well have been tried: it is looked up again here, on this error
    path only), placed in the DSN's order."""
    named = {host for host, _ in failures}
    if _UNRESOLVED_HOST.match(str(exc).strip()):
        named = set()  # no name resolved, no host tried
    hosts = _dsn_hosts(dsn)
    unresolved = {
        (host, port) for host, port, resolvable in hosts if resolvable and host not in named and not _resolves(host)
    }
    if not unresolved:
        return failures
    pending, out = list(failures), []
    for host, port, _ in hosts:
        if (host, port) in unresolved:
            out.append((host, f"{host}:{port}: {UNRESOLVED}"))
        else:
            out.extend(f for f in pending if f[0] == host)
            pending = [f for f in pending if f[0] != host]
    return out + pending


def _resolves(host: str) -> bool:
    """True if ``host`` (a name) resolves to an address, as psycopg resolves it before connecting."""
    try:
        return bool(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
    except (OSError, UnicodeError, ValueError):
        return False


def _dsn_hosts(dsn: str) -> list[tuple[str, str, bool]]:
    """``(host, port, resolvable)`` of each host ``dsn`` lists, in order: the port as given, else
    ``PGPORT`` or 5432; ``resolvable`` when psycopg may resolve it before connecting (neither a
    socket directory nor a host given a ``hostaddr``). [] if libpq cannot parse it."""
    try:
        params = conninfo_to_dict(libpq_dsn(dsn))
    except psycopg.Error:
        return []
    hosts = str(params.get("host") or os.environ.get("PGHOST") or "").split(",")
    ports = str(params.get("port") or os.environ.get("PGPORT") or "5432").split(",")
    hostaddrs = str(params.get("hostaddr") or "").split(",")
    out = []
    for i, host in enumerate(hosts):
        port = (ports[i] if len(ports) > 1 and i < len(ports) else ports[0]) or "5432"
        addr = hostaddrs[i] if i < len(hostaddrs) else ""
        # An IP address is "resolved" too (never failing): libpq then names it as the DSN spells it.
        out.append((host, port, bool(host) and not host.startswith("/") and host[1:2] != ":" and not addr))
    return out


def _uri_userinfo(dsn: str) -> tuple[str, str, str] | None:
    """``(scheme://, userinfo, rest from the '@')`` of a URI DSN with user info, else None.

    The user info is taken up to the *last* ``@``: a password with an
    unescaped ``@``, ``/``, ``?`` or ``#`` is then masked whole, whichever way
    libpq or Python's urlsplit would split it.
    """
    scheme, sep, rest = dsn.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0:
        return None
    return scheme + sep, rest[:at], rest[at:]


def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***`` (URI or key=value form)."""
    if "://" in dsn:
        parts = _uri_userinfo(dsn)
        if parts is not None and ":" in parts[1]:
            dsn = parts[0] + parts[1].split(":", 1)[0] + ":***" + parts[2]
        return re.sub(r"(password=)[^&]*", r"\1***", dsn)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


DSN_URI_AT_RULE = (
    "a URI may hold '@' only once, between the user info and the host: percent-encode "
    "@ : / ? # in the user name and password (e.g. @ as %40)"
)
"""The rule :func:`check_dsn` names for a URI libpq would split elsewhere than meant."""

_AUTHORITY_END = re.compile(r"[/?#]")


def check_dsn(dsn: str) -> None:
    """Refuse a DSN that cannot mean what it says, before anything connects with it.

    Called by every path that opens the store (:func:`connect`, so node
    sessions, the CLI and the health probe; :func:`sqlalchemy_dialect`, so
    migrations). A URI (``scheme://...``) whose authority holds more than one
    ``@``, or with an ``@`` after its authority (in the path, query or
    fragment), has a user name or password with an unescaped ``@`` (and then
    perhaps ``/ ? #``): libpq would take part of the password for the host
    or the database, and echo it in its errors. A DSN libpq cannot parse at
    all (``garbage``, a ``mysql://`` URI, an unknown keyword) is refused too,
    and so is a port that is not a whole number from 1 to 65535 (libpq
    parses any text there and refuses it only when connecting).
    Raises :class:`ConfigError` (``dsn: <rule>``, exit status 2) that never
    holds the password; an empty ``dsn`` passes (callers say none is set).
    """
    if "://" in dsn:
        rest = dsn.split("://", 1)[1]
        end = _AUTHORITY_END.search(rest)
        authority, after = (rest, "") if end is None else (rest[: end.start()], rest[end.start() :])
        if authority.count("@") > 1 or "@" in after:
            raise ConfigError(f"dsn: {DSN_URI_AT_RULE}")
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(libpq_dsn(dsn))
    except psycopg.Error as exc:
        raise ConfigError(
            "dsn: must be a URI (postgresql://user:password@host:5432/dbname) or libpq keywords "
            f"(host=... dbname=...); libpq: {redact_text(first_line(exc), dsn)}"
        ) from None
    for port in str(params.get("port") or "").split(","):  # one per host; empty: the default
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise ConfigError(f"dsn: each port must be a whole number from 1 to 65535 (got {port!r})")


def dsn_secrets(dsn: str) -> list[str]:
    """The password(s) in ``dsn`` as written and percent-decoded (URI or key=value form).

    A URI password holding an unescaped ``@``, ``:``, ``/``, ``?`` or ``#``
    would be misparsed by libpq, whose errors would echo pieces of it (e.g.
    ``failed to resolve host 'SuperSecret42@127.0.0.1'`` for the password
    ``Pass@SuperSecret42``); :func:`check_dsn` refuses such a URI before
    libpq sees it, and as a second line of defence those pieces (at least
    :data:`scheduler.log.MIN_SECRET_CHARS` long) are secrets too. Callers
    register the result with :func:`scheduler.log.add_secret` so they are
    scrubbed from every log line and error message.
    """
    found: list[str] = []
    if "://" in dsn:
        try:
            password = urlsplit(dsn).password
        except ValueError:
            password = None
        raw = ([password] if password else []) + re.findall(r"[?&]password=([^&#]*)", dsn)
        parts = _uri_userinfo(dsn)
        if parts is not None and ":" in parts[1]:
            raw.append(parts[1].split(":", 1)[1])
        for secret in raw:
            found += [secret, unquote(secret)]
        for secret in raw:
            if re.search(r"[@:/?#]", secret):
                found += [piece for piece in re.split(r"[@:/?#]", secret) if len(piece) >= log.MIN_SECRET_CHARS]
    else:
        for match in re.findall(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn):
            found.append(match)
            if match.startswith("'") and match.endswith("'"):
                found.append(re.sub(r"\\(.)", r"\1", match[1:-1]))
    return [secret for secret in dict.fromkeys(found) if secret]


def secret_spellings(dsn: str) -> list[str]:
    """:func:`dsn_secrets`, each also percent-encoded as in a URL (``quote``, ``quote_plus``):
    the spellings a driver's or a library's error may echo."""
    found = dsn_secrets(dsn)
    return list(dict.fromkeys(found + [quote(s, safe="") for s in found] + [quote_plus(s) for s in found]))


def redact_text(text: str, dsn: str) -> str:
    """Return ``text`` (an error message) without ``dsn`` or any of its passwords.

    The DSN itself, wherever ``text`` echoes it, is replaced by
    :func:`redact_dsn`'s form; then every spelling of a password
    (:func:`secret_spellings`) at least :data:`scheduler.log.MIN_SECRET_CHARS`
    long is replaced by ``***``. A shorter one is left in free text, which it
    would mangle (``y`` in ``mysql``); it is still masked inside the DSN.
    """
    if dsn:
        text = text.replace(dsn, redact_dsn(dsn))
        for secret in sorted(secret_spellings(dsn), key=len, reverse=True):
            if len(secret) >= log.MIN_SECRET_CHARS:
                text = text.replace(secret, "***")
    return text


def sqlalchemy_dialect(dsn: str) -> str:
    """The SQLAlchemy URL naming the dialect for ``dsn``, without any connection parameter.

    ``cockroachdb://`` (or ``cockroachdb+<driver>://``) → ``cockroachdb+psycopg://``
    (needs the ``sqlalchemy-cockroachdb`` package); any other DSN (a
    ``postgresql://``/``postgres://`` URI, libpq keywords) →
    ``postgresql+psycopg://``. SQLAlchemy never parses the DSN itself: its
    connections are opened by libpq from the DSN as written
    (:func:`scheduler.store.sqlalchemy_engine`), so every form libpq accepts
    works (several hosts, ``target_session_attrs``, a socket directory), and
    the URL holds no password. Raises :class:`ConfigError` (:func:`check_dsn`)
    for a DSN libpq would misparse or cannot parse.
    """
    check_dsn(dsn)
    return "cockroachdb+psycopg://" if re.match(r"cockroachdb(\+\w+)?://", dsn) else "postgresql+psycopg://"


def libpq_dsn(dsn: str) -> str:
    """Return a DSN psycopg can open (strips SQLAlchemy driver suffixes)."""
    return re.sub(r"^(postgresql|cockroachdb)\+\w+://", "postgresql://", dsn).replace(
        "cockroachdb://", "postgresql://", 1
    )
