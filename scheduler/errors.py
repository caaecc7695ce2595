"""The project's exception tree.

Every error the engine raises on purpose derives from :class:`SchedulerError`
(procrastinate's pattern: the class docstring is the default message).
Store errors worth retrying are chosen by SQLSTATE, never by message text
(see :func:`scheduler.store.is_retryable`), and re-raised with ``raise ...
from`` so the driver's cause stays attached.
"""

from __future__ import annotations

import re
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
    ``2030-01-01T00:00:00Z``), never its repr; other values are ``repr``'d
    (an ``int`` in full: integers are never rounded through float).
    """
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            return value.isoformat()
        return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"
    if isinstance(value, str) and len(value) > limit:
        head = repr(value[:limit])
        return f"{head[:-1]}…{head[-1]} ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit + 40 else f"{text[:limit]}… ({len(text)} characters)"


class SchedulerError(Exception):
    """Trigger engine error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ValidationError(SchedulerError, ValueError):
    """Invalid input.

    Raised before anything is written. ``field`` names the input field (``cron``,
    ``tz``, ``interval``, ``at``, ``misfire``, ...), ``rule`` is a short
    sentence saying what the value must satisfy, ``value`` is the offending
    value as given. ``str(error)`` is ``"<field>: <rule> (got <value>)"``, the
    value cut by :func:`clip` (a 10 kB input is not echoed whole). ``item``:
    in a batch (:func:`scheduler.jobs.apply_jobs`), the 0-based index of the
    item at fault (``None``: not an item's fault, or no batch).
    """

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        self.item: int | None = None
        got = "" if value is None else f" (got {clip(value)})"
        super().__init__(f"{field}: {rule}{got}")


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
