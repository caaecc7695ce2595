"""The project's exception tree.

Every error the engine raises on purpose derives from :class:`SchedulerError`
(procrastinate's pattern: the class docstring is the default message).
Store errors worth retrying are chosen by SQLSTATE, never by message text
(see :func:`scheduler.store.is_retryable`), and re-raised with ``raise ...
from`` so the driver's cause stays attached.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime

ECHO_MAX_CHARS = 80
"""Longest input echoed whole in an error message; longer ones are cut (:func:`clip`)."""

UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")
"""Characters a TEXT column cannot keep: NUL, and unpaired surrogates (not UTF-8)."""


def clip(value: object, limit: int = ECHO_MAX_CHARS) -> str:
    """``repr(value)`` for an error message, a string cut to ``limit`` characters.

    A string longer than ``limit`` becomes its first ``limit`` characters, an
    ellipsis and its length: ``'1111…' (10000 characters)``; a ``datetime`` is
    its ISO 8601 text (an aware one in UTC with ``Z``, as
    :func:`scheduler.schedule.format_instant` prints it:
    ``2030-01-01T00:00:00Z``), never its repr; a bool and None are spelt as
    JSON and TOML spell them (``true``, ``false``, ``null``: what the person
    typed, not Python's ``True``); other values are ``repr``'d (an ``int`` in
    full: integers are never rounded through float).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            return value.isoformat()
        return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"
    if isinstance(value, str) and len(value) > limit:
        head = repr(value[:limit])
        return f"{head[:-1]}…{head[-1]} ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit + 40 else f"{text[:limit]}… ({len(text)} characters)"


CLI_WORDS: Mapping[str, str] = {
    "since": "--since",
    "until": "--until",
    "max_runs": "--max-runs",
    "cron": "--cron",
    "interval": "--interval",
    "at": "--at",
    "misfire": "--misfire",
    "misfire_grace_s": "--misfire-grace-s",
    "catchup_window_s": "--catchup-window-s",
    "queue": "--queue",
    "url": "--url",
    "backoff_base_s": "--backoff-base-s",
    "backoff_cap_s": "--backoff-cap-s",
    "tenants_add": "`scheduler tenants add`",
}
"""The CLI's words for the inputs and commands a rule may name: ``{name}`` in a rule
(:class:`ValidationError`) or a hint (:class:`SchedulerError`) → the CLI's flag or
command. ``str(error)`` renders these; another surface renders its own
(:meth:`SchedulerError.render`; the HTTP API's are
:data:`scheduler.api.errors.API_WORDS`)."""

_WORD = re.compile(r"\{([a-z_]+)\}")


def _words(template: str, words: Mapping[str, str]) -> str:
    """``template`` with each ``{name}`` of :data:`CLI_WORDS` replaced by ``words[name]``
    (``name`` itself when ``words`` lacks it); other text is left as is."""
    return _WORD.sub(lambda m: words.get(m[1], m[1]) if m[1] in CLI_WORDS else m[0], template)


class SchedulerError(Exception):
    """Trigger engine error.

    ``hint``: what to do about it, naming inputs or commands as ``{name}``
    placeholders (:data:`CLI_WORDS`); ``str(error)`` is ``"<message> (<hint>)"``
    in the CLI's words, :meth:`render` in another surface's.
    """

    def __init__(self, message: str | None = None, *, hint: str | None = None) -> None:
        self.message = message or (self.__doc__ or "").strip()
        self.hint = hint
        super().__init__(self.render(CLI_WORDS))

    def render(self, words: Mapping[str, str]) -> str:
        """The one-line message with the placeholders of its rule or hint in ``words``
        (placeholder name → a surface's word for it)."""
        return self.message if self.hint is None else f"{self.message} ({_words(self.hint, words)})"


class ValidationError(SchedulerError, ValueError):
    """Invalid input.

    Raised before anything is written. ``field`` names the input field (``cron``,
    ``tz``, ``interval``, ``at``, ``misfire``, ...), ``rule`` is a short
    sentence saying what the value must satisfy, ``value`` is the offending
    value as given. ``str(error)`` is ``"<field>: <rule> (got <value>)"``, the
    value cut by :func:`clip` (a 10 kB input is not echoed whole). ``item``:
    in a batch (:func:`scheduler.jobs.apply_jobs`), the 0-based index of the
    item at fault (``None``: not an item's fault, or no batch).

    A rule naming another input names it as a ``{name}`` placeholder
    (``"must be after {since}"``, kept as given in ``template``): ``rule`` and
    ``str(error)`` say the CLI's flag (``--since``, :data:`CLI_WORDS`),
    :meth:`render` a surface's own word (the API's body field ``since``).
    """

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.template = rule
        self.rule = _words(rule, CLI_WORDS)
        self.value = value
        self.item: int | None = None
        super().__init__(f"{field}: {rule}")

    def render(self, words: Mapping[str, str], field: str | None = None) -> str:
        """``"<field>: <rule> (got <value>)"``, the rule's placeholders in ``words``;
        ``field``: a surface's own name for the field (the API's ``interval_s`` for
        ``interval``), else :attr:`field`."""
        got = "" if self.value is None else f" (got {clip(self.value)})"
        return f"{field or self.field}: {_words(self.template, words)}{got}"


class ConflictError(SchedulerError):
    """The request conflicts with what the store already holds (CLI exit status 2).

    Example: ``jobs add --name N`` with a different spec than the stored job N,
    without ``--replace``.
    """


class NotFoundError(SchedulerError):
    """No such object in the store (CLI exit status 2: the request named it)."""


class StoreError(SchedulerError):
    """The store failed and retrying did not help (CLI exit status 1).

    ``sqlstate`` is the PostgreSQL/CockroachDB SQLSTATE of the last failure,
    or ``None`` for connection-level failures.
    """

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        self.sqlstate = sqlstate
        super().__init__(message)


class LeaseLostError(SchedulerError):
    """A lease this node believed it held is gone (its epoch moved on)."""


class ConfigError(SchedulerError):
    """Invalid settings; the message names every setting involved."""


class StoreSetupError(ConfigError):
    """The store answers but cannot be used as configured: fatal, retrying will not help.

    Raised when a node starts (or first reaches its store) and finds the
    schema missing or behind the code's head revision, the authentication
    refused, or the database absent. The message says what to do (e.g.
    ``run `scheduler db upgrade` first``); the CLI exits with status 2.
    """


class CoordinatorError(SchedulerError):
    """The coordinator service (etcd) failed or could not be reached.

    Raised by the etcd coordinator in place of the client's own errors, so the
    lease loop treats it like a store failure: logged, counted, retried.
    """


class EpochRegressionError(CoordinatorError):
    """The etcd revision is not above an epoch already stored.

    A claim's epoch is its etcd revision; if the store holds an
    ``owner_epoch`` at or above it (a reset etcd, or a switch from the SQL
    coordinator's counters), writing it would not fence the previous owner.
    See docs/operations.md for how to raise the etcd revision.
    """
