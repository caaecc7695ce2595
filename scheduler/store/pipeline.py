"""The write pipeline: chunks of a firing tick, each its own transaction, queued on lanes in pipeline mode.

A :class:`Pipeline` holds a tick's write lanes (node sessions in psycopg's
pipeline mode). :meth:`Pipeline.send` queues one chunk's transaction
(``BEGIN``; the named statement; ``COMMIT``; a flush request) on the next
lane, round robin, without waiting: the store executes it while the caller
prepares the next, and sends its results as soon as it commits (the flush
request), so a lane's results arrive chunk by chunk rather than all at the
end: the node's watchdog bounds a wait on a lane by how long the store has
been silent in it (:mod:`scheduler.watchdog`), not by how many chunks it
waits for.
:meth:`Pipeline.collect` then waits for every queued chunk and sorts them
into the committed ones (with the statement's row, for the caller to count)
and the others (to re-send with :func:`resend`, or leave due). A chunk counts
as committed only once its ``COMMIT`` is known to have succeeded: under
SERIALIZABLE (CockroachDB) a 40001 can come at ``COMMIT``, after the
statement itself returned its counts.

Leaving a :class:`Pipeline` syncs its lanes one after the other, except
once a lane is found broken (its store went silent and the watchdog shut
its socket, or the store dropped it): the lanes not synced yet are closed
instead, their chunks' outcomes unknown. A silent store is silent on every
lane; waiting on each in turn would multiply the watchdog's bound by the
number of lanes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
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
    every lane's pipeline, leaving it syncs them, see the module doc) and the
    chunks queued on them.

    ``prepare`` is psycopg's for every statement sent (``False``: never
    prepared server-side).
    """

    def __init__(self, lanes: list[psycopg.Connection[Any]], *, prepare: bool | None = False) -> None:
        self.lanes = lanes
        self.sent: list[Sent] = []
        self._prepare = prepare
        self._entered: list[tuple[psycopg.Connection[Any], AbstractContextManager[Any]]] = []

    def __enter__(self) -> Pipeline:
        try:
            for lane in self.lanes:
                context = lane.pipeline()
                context.__enter__()
                self._entered.append((lane, context))
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Sync every lane in turn (wait for all its results); once a lane is found
        broken, close the lanes not synced yet instead of waiting on them.

        Raises the first error of a sync (psycopg.Error; ``OperationalError``
        if a lane was lost) if the block raised none; the block's own
        exception propagates unchanged.
        """
        first: psycopg.Error | None = None
        entered, self._entered = self._entered, []
        lost = any(lane.closed for lane, _ in entered)  # a lane broke: the store went silent or dropped us
        for lane, context in entered:
            if lost:
                lane.close()  # never waited on; its chunks' outcomes stay unknown
            try:
                context.__exit__(None, None, None)
            except psycopg.Error as error:
                if first is None and not lost:
                    first = error
            lost = lost or lane.closed
        if first is None and lost:
            first = psycopg.OperationalError("a write lane's connection to the store was lost")
        if first is not None and exc is None:
            raise first

    def send(self, query: str, params: dict[str, Any], partitions: set[int], batch: Any = None) -> Sent:
        """Queue one chunk's transaction (BEGIN; ``query``; COMMIT) on the next lane (round
        robin), then a flush request: the store sends the chunk's results once it commits."""
        write = self.lanes[len(self.sent) % len(self.lanes)]
        write.execute("BEGIN")
        cur = write.cursor()
        cur.execute(QUERIES[query], params, prepare=self._prepare)
        item = Sent(query, params, partitions, batch, cur, write.execute("COMMIT"))
        write.pgconn.send_flush_request()
        write.pgconn.flush()  # sent now (what the socket takes), not with the next chunk
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
