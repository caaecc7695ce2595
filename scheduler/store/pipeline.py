"""The write pipeline: chunks of a firing tick, each its own transaction, queued on lanes in pipeline mode.

A :class:`Pipeline` holds a tick's write lanes (node sessions in psycopg's
pipeline mode). :meth:`Pipeline.send` queues one chunk's transaction
(``BEGIN``; the named statement; ``COMMIT``) on the next lane, round robin,
without waiting: the store executes it while the caller prepares the next.
:meth:`Pipeline.collect` then waits for every queued chunk and sorts them
into the committed ones (with the statement's row, for the caller to count)
and the others (to re-send with :func:`resend`, or leave due). A chunk counts
as committed only once its ``COMMIT`` is known to have succeeded: under
SERIALIZABLE (CockroachDB) a 40001 can come at ``COMMIT``, after the
statement itself returned its counts.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from types import TracebackType
from typing import Any

import psycopg

from scheduler.store.queries import QUERIES, Row, execute
from scheduler.store.retry import run_transaction


@dataclasses.dataclass
class Sent:
    """A chunk queued on a lane: its statement (``query`` name and ``params``,
    for a re-send), the partitions it fences, the caller's ``batch`` (what it
    needs to count the outcome; ``None`` if nothing), its statement's and its
    COMMIT's cursors, and once waited for, ``outcome`` = (the statement's row,
    COMMIT succeeded)."""

    query: str
    params: dict[str, Any]
    partitions: set[int]
    batch: Any
    statement: psycopg.Cursor[Any]
    commit: psycopg.Cursor[Any]
    outcome: tuple[Row | None, bool] | None = None

    def wait(self) -> tuple[Row | None, bool]:
        """Wait for the chunk's results (psycopg syncs its lane); raise psycopg.Error on failure."""
        if self.outcome is None:
            row = self.statement.fetchone()
            self.outcome = (row, self.commit.statusmessage == "COMMIT")
        return self.outcome


class Pipeline:
    """A tick's write lanes in pipeline mode (a context manager: entering it enters
    every lane's pipeline, leaving it syncs them) and the chunks queued on them.

    ``prepare`` is psycopg's for every statement sent (``False``: never
    prepared server-side).
    """

    def __init__(self, lanes: list[psycopg.Connection[Any]], *, prepare: bool | None = False) -> None:
        self.lanes = lanes
        self.sent: list[Sent] = []
        self._prepare = prepare
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Pipeline:
        for lane in self.lanes:
            self._stack.enter_context(lane.pipeline())
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return self._stack.__exit__(kind, exc, tb)

    def send(self, query: str, params: dict[str, Any], partitions: set[int], batch: Any = None) -> Sent:
        """Queue one chunk's transaction (BEGIN; ``query``; COMMIT) on the next lane (round robin)."""
        write = self.lanes[len(self.sent) % len(self.lanes)]
        write.execute("BEGIN")
        cur = write.cursor()
        cur.execute(QUERIES[query], params, prepare=self._prepare)
        item = Sent(query, params, partitions, batch, cur, write.execute("COMMIT"))
        self.sent.append(item)
        return item

    def wait(self) -> None:
        """Wait until every chunk queued so far has its outcome; raise psycopg.Error on the first failure."""
        for item in self.sent:
            item.wait()

    def collect(self) -> tuple[list[tuple[Sent, Row]], list[Sent]]:
        """Wait for every queued chunk; return ``(committed, failed)`` in the order sent and forget them.

        ``committed``: the chunks whose COMMIT succeeded, each with its
        statement's row; ``failed``: the others (statement or COMMIT failed,
        or the lane broke). Never raises a store error.
        """
        committed: list[tuple[Sent, Row]] = []
        failed: list[Sent] = []
        for item in self.sent:
            try:
                row, ok = item.wait()
            except psycopg.Error:
                row, ok = None, False
            if row is None or not ok:
                failed.append(item)
            else:
                committed.append((item, row))
        self.sent = []
        return committed, failed


def resend(
    conn: psycopg.Connection[Any],
    item: Sent,
    *,
    prepare: bool | None = False,
    on_retry: Callable[[str], None] | None = None,
) -> Row:
    """Run a chunk that did not commit again on ``conn`` (not pipelined), retried whole on
    40001/40P01 (:func:`run_transaction`); return its statement's row. Raises
    :class:`~scheduler.errors.StoreError` when the attempts run out."""
    row: Row = run_transaction(
        conn, lambda c: execute(c, item.query, item.params, prepare=prepare)[0], on_retry=on_retry
    )
    return row
