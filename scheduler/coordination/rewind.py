"""Noticing a store that went back in time (asynchronous failover, a restored backup).

An asynchronous standby promoted after its primary died lacks the primary's
last commits; a store restored from a backup lacks everything after it.
Either way, runs this node committed in the lost window are gone, the jobs'
slots are back where they were, and those slots fire again, with the same
run identity ``<job_id>.<nominal µs>`` (the primary key): exactly-once in the
store has become at-least-once for the executors, which deduplicate by run
id. Nothing in the store itself can show the loss (``scheduler verify``
reads the store it is given: the vanished runs are simply not there), so the
node that wrote the lost commits is the one that can see it, from what it
remembers:

* **Epochs** (:class:`RewindWatch`, in the lease loop, any coordinator).
  Every epoch a claim gave this node was committed by the store, and in a
  healthy store a partition's fence epoch never goes down, and a claim by
  anyone bumps it: once this node held epoch *e*, the fence row reads *e*
  under this node, or something larger, forever. The watch keeps, per
  partition, the highest epoch the node was granted, and checks it against
  what the store answers, at no extra cost on the hot path:

  - a claim returning epoch ≤ the one remembered (the claim's own result);
  - the fence rows (``select_fences``: one read of ≤ 1,024 primary-key
    rows) of leases a renewal just missed (a takeover shows a larger
    epoch; a rewound store a smaller one, or the same epoch under another
    node), and of every partition remembered on the first renewal after a
    store error (a reconnect: the failover case).

* **Renewals** (:class:`RenewalWatermarks`, the SQL coordinator). The
  renewal statement returns each lease row's ``renewed_at`` as it was
  before the update and as it wrote it. Only this node renews a row it
  holds at its epoch, so in a healthy store the value before equals the
  one its previous renewal wrote (or, after a renewal whose commit went
  unanswered, is later); earlier means that renewal was lost. This catches
  a lost tail with no claim in it (the usual case: renewals every
  ``renew_interval_s`` and runs every second, no lease moving), as soon as
  the lost window holds one renewal. Store times are compared only with
  store times written into the same row, so clock skew between primary and
  standby does not matter.

* **Runs** (:class:`RunMarks`, the firer, any coordinator). The two watches
  above need the lost window to hold a claim or a renewal; the usual
  asynchronous loss does not (a replication lag of milliseconds, renewals
  every ``renew_interval_s``): it holds only fired runs. So the firer
  remembers, per partition it fired in, the last run it committed there
  (its key ``partition_id, job_id, nominal_time`` and the epoch it was fired
  under), taken from the firing statement's own answer (``fire_runs`` and
  ``fire_group`` return, per partition, their highest inserted run: no
  extra query). Commits are atomic and ordered, so if the store lost a
  tail holding any of this node's commits in a partition, it lost the last
  one. When the firer's store sessions were closed after an error (a
  reconnect: the only way to reach a promoted standby), its first tick on
  the new connections first runs one query (``select_runs_present``: one
  primary-key probe of ``runs`` and of ``jobs`` per remembered run) and
  reports (``seen="runs"``) every partition whose remembered run

  - is gone while its job is still at or before that run's slot (the store
    will fire it again: exactly the re-fire the executors must absorb), or
  - is there but written by another node or under another epoch (someone
    already fired the slot again after the loss).

  A run that retention or ``runs prune`` deleted, or whose job was edited,
  deleted or pruned, has a job past its slot or no job: not reported (and
  not re-fired either). Reported partitions are forgotten (the store's word
  stands; the next run fired there is remembered afresh); a check that
  fails is logged (``rewind_check_failed``) and run again on the next tick,
  on a new connection; firing is never held for it. Entries are kept when
  the lease is lost or released (the check is run on the reconnect after
  the failover, and a failover longer than the TTL loses the leases first;
  a run this node committed is its concern whoever owns the partition now),
  at most one per partition (1,024) and replaced by the next run fired
  there. What it cannot see: a rewind while the firer's connections stayed
  open (impossible in a real failover: the old primary's connections die
  with it), runs committed by a node that died (nobody remembers them), a
  lost run whose slot the store has since moved past without it (a
  misfire skip after a long outage), a lost run this node fired again
  itself before a check that failed could be repeated (same node, same
  epoch: indistinguishable), run-now and backfill runs (not remembered),
  and anything lost before this process started.

A rewind is logged (``store_rewound``, WARNING: the partitions, the epochs,
times or runs remembered and found, and what it means) and counted per
partition in ``scheduler_store_rewind_detected_total``; the remembered value
is then replaced by the store's, so one rewind counts once. A rewind seen by
both the lease loop's watches and the firer's (the lease watches and the
runs watch each see it at their first call after the reconnect) counts and
is logged once: a partition counted by one is not counted again by the
other within :data:`SEEN_TWICE_S` (:meth:`Metrics.count_rewound`). Nothing
else changes: the node never stops for it, and keeps firing fenced.

Why fencing stays correct after a rewind
----------------------------------------
A claim in the rewound store bumps the fence from the epoch it has now, so
it may hand out again an epoch *number* some node held in the lost
window. That is harmless because the fence, the renewal and the release are
keyed on the pair (node, epoch), never on the epoch alone: the firing
statement locks a partition only where ``owner_node`` *and* ``owner_epoch``
are still the firer's. A stale peer holding (B, 5) from the lost window
cannot fire under (A, 5) reissued to A; and its renewals of (B, 5) miss
the rewound lease row, so it drops the lease. The same node given its old
number again, (A, 5) twice, is one process holding one lease: the old
in-memory lease was dropped when its renewal missed (or is simply
overwritten by the claim), and the old primary that accepted the lost
commits is gone with its connections. Within the store that exists, epochs
still only grow, and every invariant of docs/design.md §2 holds there.
What the fence cannot undo is the lost window's effect on the executors: a
slot whose run vanished fires again, same run id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from scheduler import log
from scheduler.metrics import Metrics

MEANING = (
    "the store went back in time (asynchronous failover lost its tail, or a backup was restored): "
    "runs fired in the lost window may fire again with the same run id; executors deduplicate by run id"
)
"""The ``note`` of every ``store_rewound`` record."""

SAMPLE = 8
"""Partitions named in one ``store_rewound`` record (the count covers them all)."""


SEEN_TWICE_S = 60.0
"""Seconds within which a partition counted by the lease loop's watches (``claim``,
``fence``, ``renewal``) is not counted again by the firer's (``runs``), and the
converse: both see one rewind on their first call after the reconnect."""


def report(metrics: Metrics, node_id: str, seen: str, found: list[tuple[int, object, object]]) -> None:
    """Log one ``store_rewound`` WARNING and count the partitions of ``found``.

    ``found``: ``(partition, what this node had, what the store shows)``,
    by partition id; ``seen``: how it was noticed (``claim``, ``fence``,
    ``renewal``: the lease loop; ``runs``: the firer). Partitions the other
    side counted within :data:`SEEN_TWICE_S` are left out (neither counted
    nor logged). Nothing for an empty ``found``.
    """
    if not found:
        return
    watch = "runs" if seen == "runs" else "lease"
    counted = set(metrics.count_rewound([pid for pid, _, _ in found], watch, time.monotonic(), SEEN_TWICE_S))
    found = [entry for entry in found if entry[0] in counted]
    if not found:
        return
    log.event(
        "store_rewound",
        logging.WARNING,
        node=node_id,
        seen=seen,
        partitions=len(found),
        sample=[{"partition": pid, "had": _plain(had), "store": _plain(now)} for pid, had, now in found[:SAMPLE]],
        note=MEANING,
    )


def _plain(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime) else value


class RewindWatch:
    """The epochs this node was granted, per partition, checked against the store's answers.

    Used by the lease loop (one thread). :meth:`granted` records claims and
    renewals; :meth:`check_claimed` and :meth:`check_fences` compare and
    :func:`report`. Partitions are ``0..1023``; epochs are the coordinator's
    (SQL counters or etcd revisions).
    """

    def __init__(self, node_id: str, metrics: Metrics) -> None:
        self._node_id = node_id
        self._metrics = metrics
        self._epochs: dict[int, int] = {}

    def known(self) -> list[int]:
        """Partitions this node was ever granted (and not found rewound since), ascending."""
        return sorted(self._epochs)

    def granted(self, pairs: Iterable[tuple[int, int]]) -> None:
        """Remember ``(partition, epoch)`` pairs the store just granted or renewed (the highest per partition)."""
        for pid, epoch in pairs:
            if epoch > self._epochs.get(pid, -1):
                self._epochs[pid] = epoch

    def check_claimed(self, claimed: list[tuple[int, int]]) -> None:
        """A claim's ``(partition, new epoch)`` pairs: an epoch not above the one remembered is a rewind.

        Reports them (``seen="claim"``), then remembers every pair.
        """
        found = [(pid, self._epochs[pid], epoch) for pid, epoch in claimed if epoch <= self._epochs.get(pid, -1)]
        for pid, _, epoch in found:
            self._epochs[pid] = epoch
        report(self._metrics, self._node_id, "claim", sorted(found))
        self.granted(claimed)

    def check_fences(self, fences: dict[int, tuple[str | None, int]]) -> None:
        """Fence rows ``{partition: (owner node, epoch)}`` read from the store.

        A partition remembered at epoch *e* is rewound if its fence epoch is
        below *e*, or equal to *e* under another node (a claim always bumps
        it). Reports them (``seen="fence"``) and forgets them (the store's
        word stands from now on; a later claim is remembered afresh).
        """
        found = []
        for pid, (owner, epoch) in sorted(fences.items()):
            had = self._epochs.get(pid)
            if had is not None and (epoch < had or (epoch == had and owner != self._node_id)):
                found.append((pid, had, epoch))
                del self._epochs[pid]
        report(self._metrics, self._node_id, "fence", found)


class RenewalWatermarks:
    """What each renewal wrote into ``leases.renewed_at``, checked at the next one (the SQL coordinator).

    :meth:`check` takes the renewal statement's rows (``partition_id``,
    ``owner_epoch``, ``prior_renewed_at``: the value before the update,
    ``renewed_at``: the value written), reports those whose prior value is
    earlier than the value this node's last renewal (or claim) of the same
    lease wrote, and then remembers only the rows given: a lease not
    renewed now is forgotten.
    """

    def __init__(self, node_id: str, metrics: Metrics) -> None:
        self._node_id = node_id
        self._metrics = metrics
        self._written: dict[int, tuple[int, datetime]] = {}

    def claimed(self, rows: list[dict]) -> None:
        """Remember what a claim wrote (``partition_id``, ``owner_epoch``, ``renewed_at``)."""
        for row in rows:
            self._written[row["partition_id"]] = (row["owner_epoch"], row["renewed_at"])

    def check(self, rows: list[dict]) -> None:
        """Compare a renewal's rows with what was written before; report; remember these rows only."""
        found = []
        for row in rows:
            pid, prior = row["partition_id"], row["prior_renewed_at"]
            written = self._written.get(pid)
            if written is not None and written[0] == row["owner_epoch"] and prior is not None and prior < written[1]:
                found.append((pid, written[1], prior))
        self._written = {row["partition_id"]: (row["owner_epoch"], row["renewed_at"]) for row in rows}
        report(self._metrics, self._node_id, "renewal", sorted(found))


class RunMarks:
    """The last run this node committed per partition, checked after a reconnect (the firer).

    An entry is ``partition -> (job_id, nominal_time, epoch)``; at most one per
    partition (0..1023). :meth:`committed` takes a firing statement's answer
    (its ``mark_*`` arrays: per partition, the highest run it inserted);
    :meth:`params` are the ``select_runs_present`` parameters (ascending
    partitions); :meth:`check` compares that query's rows, reports
    (``seen="runs"``) and forgets the rewound partitions. Used by one thread
    (the firing loop). See the module docstring for what it catches and not.
    """

    def __init__(self, node_id: str, metrics: Metrics) -> None:
        self._node_id = node_id
        self._metrics = metrics
        self._last: dict[int, tuple[Any, datetime, int]] = {}

    def __len__(self) -> int:
        return len(self._last)

    def remembered(self) -> dict[int, tuple[Any, datetime, int]]:
        """A copy of the entries: ``{partition: (job_id, nominal_time, epoch)}``."""
        return dict(self._last)

    def committed(self, row: dict) -> None:
        """Remember the runs a committed firing statement reports (``mark_pids``,
        ``mark_jobs``, ``mark_nominals``, ``mark_epochs``: parallel arrays), each
        replacing its partition's entry. A row without them (no run inserted) changes nothing."""
        for pid, jid, nominal, epoch in zip(
            row.get("mark_pids") or (),
            row.get("mark_jobs") or (),
            row.get("mark_nominals") or (),
            row.get("mark_epochs") or (),
            strict=True,
        ):
            self._last[pid] = (jid, nominal, epoch)

    def params(self) -> dict[str, list]:
        """``select_runs_present``'s parameters: ``pids``, ``jids``, ``nominals`` (by partition)."""
        pids = sorted(self._last)
        return {
            "pids": pids,
            "jids": [self._last[pid][0] for pid in pids],
            "nominals": [self._last[pid][1] for pid in pids],
        }

    def check(self, rows: list[dict]) -> list[int]:
        """``select_runs_present`` rows for :meth:`params`: report and forget the rewound partitions.

        A remembered run is rewound if it is missing while its job exists
        with its slot (``next_nominal_at``) at or before the run's nominal
        time, or present under another node or epoch. Rows of entries
        replaced since the query was sent are ignored. Returns the rewound
        partitions, ascending.
        """
        found = []
        for row in rows:
            pid = row["partition_id"]
            entry = self._last.get(pid)
            if entry is None or (str(entry[0]), entry[1]) != (str(row["job_id"]), row["nominal_time"]):
                continue
            jid, nominal, epoch = entry
            if row["run_node"] is None:
                slot = row["next_nominal_at"]
                if not row["job_exists"] or slot is None or slot > nominal:
                    continue  # pruned, or its job moved past it: not fired again
                store: object = "missing"
            elif row["run_node"] != self._node_id or row["run_epoch"] != epoch:
                store = f"fired again by {row['run_node']} at epoch {row['run_epoch']}"
            else:
                continue
            found.append((pid, f"run of job {jid} at {nominal.isoformat()}, epoch {epoch}", store))
            del self._last[pid]
        found.sort()
        report(self._metrics, self._node_id, "runs", found)
        return [pid for pid, _, _ in found]
