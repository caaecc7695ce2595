"""Structured logs: one stable ``event`` name per record (CONTRIBUTING.md rule 8).

Call :func:`event` with the event name and fields; :func:`configure` picks
text (default) or JSON lines. Secrets never reach a record: DSNs are passed
through :func:`scheduler.store.redact_dsn` before they are logged, and, as a
second line of defence, every formatted line (fields, error texts,
tracebacks) has each secret registered with :func:`add_secret` (the store
password, registered by the CLI as soon as it reads a DSN) replaced by
``***``; the CLI's one-line errors go through :func:`redact` too.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time

LOGGER = logging.getLogger("scheduler")

MIN_SECRET_CHARS = 3
"""Shorter secrets are not scrubbed from free text (they would mangle it), here
nor by ``store.redact_text``; DSNs are still redacted structurally by
``store.redact_dsn``."""

_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def add_secret(*secrets: str | None) -> None:
    """Register strings (e.g. the store password) never to appear in output."""
    with _secrets_lock:
        _secrets.update(s for s in secrets if s and len(s) >= MIN_SECRET_CHARS)


API_TOKEN = re.compile(r"tk_[0-9a-fA-F]{16}_[A-Za-z0-9_-]*")
"""Anything shaped like a tenant API token (``tk_<key id>_<secret>``, scheduler/api/keys.py)."""


URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@'\"]*:)(?!password@)[^\s'\"]*@")
"""The password of a URL's user info (``scheme://user:password@``), up to the last ``@`` before
whitespace or a quote (a password may hold an unescaped ``/``, ``?`` or ``#``); the literal
placeholder ``password`` of the help texts' examples is left as it is."""


def redact(text: str) -> str:
    """Return ``text`` with every registered secret replaced by ``***``, anything shaped
    like an API token by ``tk_<redacted>`` and the password of any URL
    (``scheme://user:password@``) by ``***``: an error or log line that echoes input never
    shows a key pasted into the wrong field (``keys revoke TOKEN``) or a URL's password,
    whatever field it came in (the user alone is kept: a DSN without a password is left
    whole)."""
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, "***")
    text = URL_PASSWORD.sub(r"\g<head>***@", text)
    return API_TOKEN.sub("tk_<redacted>", text)


LIBRARY_LOGGERS = ("psycopg", "psycopg.pool", "alembic", "uvicorn")
"""Libraries whose warnings go through the same formatter (so ``--log-format
json`` stays one JSON object per line), as event ``library_log``."""


def _event_and_fields(record: logging.LogRecord) -> tuple[str, dict]:
    if hasattr(record, "event"):
        return record.event, getattr(record, "fields", {})
    return "library_log", {"logger": record.name, "message": record.getMessage()}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``event``, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        event_name, fields = _event_and_fields(record)
        payload = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": event_name,
        }
        payload.update(fields)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        # Scrub values before encoding too: JSON escaping could hide a secret's spelling.
        payload = {k: redact(v) if isinstance(v, str) else v for k, v in payload.items()}
        return redact(json.dumps(payload, default=lambda v: redact(str(v))))


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""What a log line never holds raw: C0 controls (line breaks, ESC, NUL, BEL ...), DEL, C1
controls (``\\x85`` NEL, ``\\x9b`` CSI ...) and the Unicode line and paragraph separators: a
value written raw could split a record or drive the terminal showing the log."""


def one_line(text: str) -> str:
    """``text`` with every line break and other control character (:data:`_CONTROL`) escaped
    (``\\n``, ``\\x1b``, ...): a value never splits a record nor reaches a terminal raw."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, an ellipsis (``…``) as the last one
    when it was cut: a log field of bounded length."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


_BARE_VALUE = re.compile(r'[^\s"=\\\x00-\x1f\x7f-\x9f\u2028\u2029]+')
"""A text-format value written as is: no whitespace, quote, ``=``, backslash or control character."""


def _json_escape_controls(quoted: str) -> str:
    """``quoted`` (a JSON string) with the control characters JSON leaves raw with non-ASCII
    output kept (DEL, C1, U+2028/9) escaped as ``\\u00XX``: still the same JSON string."""
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def text_value(value: object) -> str:
    """``value`` as the text format writes it (logfmt): bare when :data:`_BARE_VALUE` allows,
    else a JSON string (quotes, backslashes and every control character escaped, so
    ``json.loads`` reads the value back): a value with spaces cannot pass for more
    ``key=value`` pairs (a request path is client input), nor a line break split the record,
    nor an escape sequence reach the terminal showing the log."""
    text = str(value)
    if _BARE_VALUE.fullmatch(text):
        return text
    return _json_escape_controls(json.dumps(text, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """``<time> <level> <event> key=value ...``, always one line (logfmt).

    A value with whitespace, ``"``, ``=``, ``\\`` or a control character is
    written as a JSON string (:func:`text_value`), so values cannot forge
    fields nor drive a terminal; line breaks inside values (a store error's
    ``LINE 1: ...`` and ``HINT`` lines, a traceback, given as the last field
    ``exc=``) are escaped, so each record is exactly one line, as in JSON.
    """

    def format(self, record: logging.LogRecord) -> str:
        event_name, values = _event_and_fields(record)
        if record.exc_info:
            values = {**values, "exc": self.formatException(record.exc_info)}
        fields = " ".join(f"{k}={text_value(v)}" for k, v in values.items())
        ts = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        return redact(f"{ts} {record.levelname.lower():5} {one_line(event_name)} {fields}".rstrip())


def configure(fmt: str = "text", level: str = "info") -> None:
    """Send the ``scheduler`` logger to stderr as ``text`` or ``json``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    LOGGER.handlers[:] = [handler]
    LOGGER.setLevel(level.upper())
    LOGGER.propagate = False
    for name in LIBRARY_LOGGERS:
        library = logging.getLogger(name)
        library.handlers[:] = [handler]
        library.setLevel(logging.WARNING)
        library.propagate = False


def event(name: str, level: int = logging.INFO, exc_info: bool = False, **fields: object) -> None:
    """Log one record with the stable event ``name`` and ``fields``."""
    if LOGGER.isEnabledFor(level):
        LOGGER.log(level, name, extra={"event": name, "fields": fields}, exc_info=exc_info)
