"""LeaseLoop (scheduler/coordination/loop.py) on a manual clock with a fake coordinator: no store, no sleeping.

:class:`FakeCoordinator` implements the coordinator interface in memory
(who owns each partition at which epoch; claims hand out the lowest free
partition ids and bump the epoch by one); it fakes the coordinator, not the
store. The tests drive :meth:`LeaseLoop.run_once` (and once :meth:`LeaseLoop.run`)
at chosen instants of a :class:`~scheduler.clock.ManualClock` and assert
exactly which partitions are held, draining, firable and released.

Timings: TTL 10 s, renew every 3 s, poll every 1 s, safety margin 1 s; the
clock starts at 1000.0, so a lease claimed or renewed at ``t`` has the local
deadline ``t + 10`` and stops being firable at ``t + 9``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from scheduler.clock import ManualClock
from scheduler.coordination import CoordinatorBase, Lease, LeaseLoop, LeaseTable
from scheduler.errors import StoreError
from scheduler.metrics import Metrics
from scheduler.partition import PARTITION_COUNT
from scheduler.settings import Settings

T0 = 1000.0
TTL_S = 10.0
RENEW_S = 3.0
POLL_S = 1.0
MARGIN_S = 1.0
ME = "n1"


class FakeCoordinator(CoordinatorBase):
    """The coordinator interface in memory (only the coordinator is faked, not the store).

    It does not watch membership (:class:`CoordinatorBase`'s defaults:
    ``watches_membership`` False, ``prune`` and ``preflight`` do nothing).

    ``owners`` maps a held partition to ``(node, epoch)``; ``epochs`` is every
    partition's last epoch (0 before its first claim). ``members`` is what
    :meth:`live_nodes` answers. ``calls`` records ``(manual time, method)``.
    ``renew_error`` (if set) is raised by :meth:`renew`; ``renew_takes_s``
    advances the clock inside :meth:`renew` (a slow store). ``hook(fake, method)``
    runs after every call is recorded. While ``down`` is set every call is
    recorded and then raises :class:`StoreError` (the store out of reach).
    """

    def __init__(self, clock: ManualClock, node_id: str = ME) -> None:
        self.node_id = node_id
        self.clock = clock
        self.owners: dict[int, tuple[str, int]] = {}
        self.fence_owner: dict[int, str] = {}
        self.epochs = [0] * PARTITION_COUNT
        self.members = [node_id]
        self.calls: list[tuple[float, str]] = []
        self.claim_limits: list[int] = []
        self.renewed: list[list[int]] = []
        self.released: list[list[Lease]] = []
        self.renew_error: Exception | None = None
        self.renew_takes_s = 0.0
        self.hook: Callable[[FakeCoordinator, str], None] | None = None
        self.down = False

    def _record(self, method: str) -> None:
        self.calls.append((self.clock.monotonic(), method))
        if self.down:
            raise StoreError("store out of reach")
        if self.hook is not None:
            self.hook(self, method)

    # -- test controls

    def take(self, node_id: str, pids: list[int]) -> None:
        """``node_id`` claims ``pids`` (free or not: a takeover bumps the epoch)."""
        for pid in pids:
            self.epochs[pid] += 1
            self.owners[pid] = (node_id, self.epochs[pid])
            self.fence_owner[pid] = node_id

    def free(self, pids: list[int]) -> None:
        """Whoever holds ``pids`` lets them go (released or expired)."""
        for pid in pids:
            self.owners.pop(pid, None)

    def mine(self) -> dict[int, int]:
        """``{partition: epoch}`` this node holds in the fake."""
        return {pid: epoch for pid, (node, epoch) in self.owners.items() if node == self.node_id}

    # -- the coordinator interface

    def join(self) -> None:
        self._record("join")

    def heartbeat(self) -> bool:
        self._record("heartbeat")
        return True

    def renew(self, leases: list[Lease]) -> list[tuple[int, int]]:
        self._record("renew")
        self.renewed.append([lease.partition_id for lease in leases])
        self.clock.advance(self.renew_takes_s)
        if self.renew_error is not None:
            raise self.renew_error
        return [
            (lease.partition_id, lease.epoch)
            for lease in leases
            if self.owners.get(lease.partition_id) == (self.node_id, lease.epoch)
        ]

    def live_nodes(self) -> list[str]:
        self._record("live_nodes")
        return sorted(self.members)

    def claim(self, limit: int) -> list[tuple[int, int]]:
        self._record("claim")
        self.claim_limits.append(limit)
        free = [pid for pid in range(PARTITION_COUNT) if pid not in self.owners][:limit]
        self.take(self.node_id, free)
        return [(pid, self.epochs[pid]) for pid in free]

    def release(self, leases: list[Lease]) -> list[int]:
        self._record("release")
        self.released.append(list(leases))
        gone = [
            lease.partition_id for lease in leases if self.owners.get(lease.partition_id) == (self.node_id, lease.epoch)
        ]
        self.free(gone)
        return gone

    def fences(self, partition_ids: list[int]) -> dict[int, tuple[str | None, int]]:
        """The fence of each partition: its last claimer (None before any) and epoch."""
        self._record("fences")
        return {pid: (self.fence_owner.get(pid), self.epochs[pid]) for pid in partition_ids}

    def leave(self) -> None:
        self._record("leave")

    def close(self) -> None:
        self._record("close")


class WatchingFakeCoordinator(FakeCoordinator):
    """A fake that watches membership (as etcd does): ``watches_membership`` is True
    and ``set_on_change`` keeps the callback."""

    def __init__(self, clock: ManualClock, node_id: str = ME) -> None:
        super().__init__(clock, node_id)
        self.on_change: Callable[[], None] | None = None

    @property
    def watches_membership(self) -> bool:
        return True

    def set_on_change(self, callback: Callable[[], None]) -> None:
        self.on_change = callback


class RenewBeatsFakeCoordinator(FakeCoordinator):
    """A fake whose renewal carries the heartbeat (as etcd's keep-alive does): ``heartbeat`` returns False."""

    def heartbeat(self) -> bool:
        self._record("heartbeat")
        return False


class OptionalPartsFakeCoordinator(FakeCoordinator):
    """A fake that does not watch membership but records the optional calls it gets."""

    def set_on_change(self, callback: Callable[[], None]) -> None:
        self._record("set_on_change")

    def prune(self) -> None:
        self._record("prune")


class Rig:
    """A lease loop, its table and a fake coordinator on one manual clock at ``T0``."""

    def __init__(self, fake_class: type[FakeCoordinator] = FakeCoordinator) -> None:
        self.settings = Settings(
            dsn="postgresql://unused/test",
            node_id=ME,
            lease_ttl_s=TTL_S,
            renew_interval_s=RENEW_S,
            poll_interval_s=POLL_S,
            safety_margin_s=MARGIN_S,
        ).validated()
        self.clock = ManualClock(start_s=T0)
        self.metrics = Metrics()
        self.fake = fake_class(self.clock)
        self.table = LeaseTable(self.clock, MARGIN_S)
        self.claimed_callbacks = 0
        self.loop = LeaseLoop(
            self.settings, self.fake, self.table, self.clock, self.metrics, on_claimed=self._on_claimed
        )

    def _on_claimed(self) -> None:
        self.claimed_callbacks += 1

    def at(self, instant: float) -> None:
        """Move the manual clock to ``instant`` (≥ now) and run one iteration there."""
        self.clock.advance(instant - self.clock.monotonic())
        self.loop.run_once()

    def held(self) -> dict[int, tuple[int, float]]:
        """``{partition: (epoch, local deadline)}`` of the table."""
        return {pid: (lease.epoch, lease.deadline_mono) for pid, lease in self.table.held().items()}

    def lease_events(self, kind: str) -> float:
        return self.metrics.registry.get_sample_value("scheduler_lease_events_total", {"kind": kind})

    def owned_gauge(self) -> float:
        return self.metrics.registry.get_sample_value("scheduler_lease_partitions_owned")


def every(pids, epoch: int) -> dict[int, int]:
    return {pid: epoch for pid in pids}


def test_claims_up_to_the_share_and_tops_up_as_partitions_come_free() -> None:
    rig = Rig()
    rig.fake.members = ["n1", "n2", "n3"]  # share ⌈1024 / 3⌉ = 342
    rig.fake.take("n2", list(range(900)))  # a peer holds 0..899: only 124 are free

    rig.at(T0)
    assert [method for _, method in rig.fake.calls] == ["join", "heartbeat", "renew", "live_nodes", "claim"]
    assert rig.fake.claim_limits == [342]
    assert rig.held() == {pid: (1, T0 + TTL_S) for pid in range(900, 1024)}
    assert rig.table.firable() == every(range(900, 1024), 1)
    assert (rig.claimed_callbacks, rig.lease_events("claimed"), rig.owned_gauge()) == (1, 124.0, 124.0)

    rig.at(T0 + 0.5)  # before the next poll: nothing is asked
    assert rig.fake.claim_limits == [342]

    rig.at(T0 + 1)  # the poll: still under the share, nothing free
    assert rig.fake.claim_limits == [342, 218]
    assert len(rig.table) == 124 and rig.claimed_callbacks == 1

    rig.fake.free(list(range(300)))  # the peer lets 0..299 go
    rig.at(T0 + 2)  # tops up to exactly the share, lowest free ids first
    assert rig.fake.claim_limits == [342, 218, 218]
    assert rig.held() == {
        **{pid: (2, T0 + 2 + TTL_S) for pid in range(218)},
        **{pid: (1, T0 + TTL_S) for pid in range(900, 1024)},
    }
    assert rig.claimed_callbacks == 2

    rig.at(T0 + 3)  # at the share: no claim (the renewal is due too)
    assert rig.fake.claim_limits == [342, 218, 218]
    assert sorted(rig.fake.renewed[-1]) == sorted(rig.table.held())
    assert set(rig.table.firable()) == set(range(218)) | set(range(900, 1024))


def test_excess_drains_at_once_and_is_released_only_after_the_tick_that_may_fire_it_ends() -> None:
    rig = Rig()
    rig.at(T0)  # alone: the share is all 1,024
    assert rig.table.firable() == every(range(PARTITION_COUNT), 1)

    tick, firable = rig.table.begin_tick()  # a firing tick starts with all of them
    assert (tick, firable) == (1, every(range(PARTITION_COUNT), 1))

    rig.fake.members = ["n1", "n2"]  # a peer joins: share 512
    rig.at(T0 + 1)
    assert rig.table.draining() == set(range(512, 1024))  # the highest ids drain
    assert rig.table.firable() == every(range(512), 1)
    assert rig.fake.released == []  # tick 1 may be firing them
    assert len(rig.table) == PARTITION_COUNT

    rig.at(T0 + 3)  # renewal: the draining leases are renewed too; still not released
    assert rig.fake.renewed[-1] == list(range(PARTITION_COUNT))
    assert rig.fake.released == []
    assert rig.held()[1023] == (1, T0 + 3 + TTL_S)

    tick2, firable2 = rig.table.begin_tick()  # a tick that begins after the drain never had them
    assert (tick2, firable2) == (2, every(range(512), 1))
    rig.at(T0 + 3.5)
    assert rig.fake.released == []  # tick 1 still running

    rig.table.end_tick(tick)
    rig.at(T0 + 3.5)  # the next iteration (no poll due) releases; tick 2 still running
    assert rig.fake.released == [[Lease(pid, 1, T0 + 3 + TTL_S) for pid in range(512, 1024)]]
    assert rig.fake.mine() == every(range(512), 1)
    assert rig.held() == {pid: (1, T0 + 3 + TTL_S) for pid in range(512)}
    assert rig.table.draining() == set()
    assert (rig.lease_events("released"), rig.owned_gauge()) == (512.0, 512.0)

    rig.at(T0 + 4)  # at the share now: nothing more drains or is released
    assert len(rig.fake.released) == 1 and rig.table.draining() == set()


def test_a_peer_leaving_undrains_what_was_not_yet_released() -> None:
    rig = Rig()
    rig.at(T0)
    tick, _ = rig.table.begin_tick()
    rig.fake.members = ["n1", "n2"]
    rig.at(T0 + 1)
    assert rig.table.draining() == set(range(512, 1024))
    rig.fake.members = ["n1"]  # the peer is gone before the tick ends
    rig.at(T0 + 2)
    rig.table.end_tick(tick)
    rig.at(T0 + 2.5)
    assert (rig.table.draining(), rig.fake.released) == (set(), [])
    assert rig.table.firable() == every(range(PARTITION_COUNT), 1)


def test_a_failing_renewal_loses_the_lease_at_its_local_deadline_less_the_margin() -> None:
    rig = Rig()
    rig.fake.members = ["n1", "n2", "n3", "n4"]  # share 256
    rig.at(T0)
    assert rig.held() == {pid: (1, T0 + TTL_S) for pid in range(256)}

    rig.fake.renew_error = StoreError("store unreachable")
    for second in range(1, 9):  # renewals at +3..+8 fail (retried every second once failing)
        rig.at(T0 + second)
        assert rig.table.firable() == every(range(256), 1), second
    assert [t for t, method in rig.fake.calls if method == "renew"] == [T0 + s for s in (0, 3, 4, 5, 6, 7, 8)]

    rig.at(T0 + 8.5)
    assert rig.table.firable() == every(range(256), 1)
    rig.clock.advance(0.5)  # T0 + 9: deadline T0 + 10 minus the margin
    assert rig.table.firable() == {}
    assert rig.table.begin_tick() == (1, {})
    # Still held (the store may yet renew it: nobody else claimed it), never fired.
    assert rig.held() == {pid: (1, T0 + TTL_S) for pid in range(256)}

    rig.fake.renew_error = None  # the store is back before anyone took them over
    rig.at(T0 + 9)
    assert rig.held() == {pid: (1, T0 + 9 + TTL_S) for pid in range(256)}
    assert rig.table.firable() == every(range(256), 1)
    assert rig.lease_events("lost") == 0.0


def test_a_renewal_returning_fewer_drops_the_missing_leases_at_once() -> None:
    rig = Rig()
    rig.fake.members = ["n1", "n2", "n3", "n4"]
    rig.at(T0)
    rig.fake.take("n2", [3, 5, 200])  # taken over behind our back (epoch 2)
    rig.at(T0 + 2)
    assert rig.table.firable() == every(range(256), 1)  # not known before the renewal
    rig.at(T0 + 3)
    kept = [pid for pid in range(256) if pid not in (3, 5, 200)]
    # Dropped at the renewal; the poll right after tops the share up with the next free ids.
    assert rig.held() == {pid: (1, T0 + 3 + TTL_S) for pid in kept + [256, 257, 258]}
    assert rig.table.firable() == every(kept + [256, 257, 258], 1)
    assert rig.fake.claim_limits == [256, 3]
    assert (rig.lease_events("lost"), rig.lease_events("renewed"), rig.lease_events("claimed")) == (3.0, 253.0, 259.0)


def test_the_deadline_counts_from_when_the_renewal_was_sent_and_the_margin_ends_firing_first() -> None:
    rig = Rig()
    rig.at(T0)
    rig.fake.renew_takes_s = 0.75  # a slow store: the renewal returns at +3.75
    rig.at(T0 + 3)
    assert rig.clock.monotonic() == T0 + 3.75
    assert rig.held()[0] == (1, T0 + 3 + TTL_S)  # sent + TTL, not returned + TTL

    rig.clock.advance(T0 + 11.75 - rig.clock.monotonic())  # no more renewals from here
    assert rig.table.firable() == every(range(PARTITION_COUNT), 1)
    rig.clock.advance(0.25)  # T0 + 12 = deadline - margin: not firable, a second before the deadline
    assert rig.table.firable() == {}
    assert rig.held()[0] == (1, T0 + 13)


def test_leave_releases_everything_and_withdraws_membership() -> None:
    rig = Rig()
    rig.at(T0)
    leases = sorted(rig.table.held().values(), key=lambda lease: lease.partition_id)
    rig.loop.leave()
    assert rig.fake.released == [leases]
    assert rig.fake.mine() == {}
    assert [method for _, method in rig.fake.calls][-2:] == ["release", "leave"]
    assert (len(rig.table), rig.owned_gauge(), rig.lease_events("released")) == (0, 0.0, 1024.0)


def test_leave_during_a_tick_still_withdraws_membership_and_leaves_those_leases_to_expire() -> None:
    rig = Rig()
    rig.at(T0)
    rig.table.begin_tick()  # the firing loop did not stop
    rig.loop.leave()
    assert rig.fake.released == []
    assert [method for _, method in rig.fake.calls][-1] == "leave"
    assert rig.fake.mine() == every(range(PARTITION_COUNT), 1)
    assert rig.table.firable() == {}  # all draining


def test_leave_never_raises() -> None:
    rig = Rig()
    rig.at(T0)

    def down(fake: FakeCoordinator, method: str) -> None:
        if method == "release":
            raise StoreError("store unreachable")

    rig.fake.hook = down
    rig.loop.leave()  # logged, not raised
    assert [method for _, method in rig.fake.calls][-1] == "release"


def test_stop_claiming_keeps_renewing_but_claims_nothing_more() -> None:
    rig = Rig()
    rig.fake.members = ["n1", "n2"]
    rig.at(T0)
    assert len(rig.table) == 512
    rig.loop.stop_claiming()
    rig.fake.members = ["n1"]  # under the share now
    rig.at(T0 + 1)
    rig.at(T0 + 3)
    assert rig.fake.claim_limits == [512]
    assert rig.fake.renewed[-1] == list(range(512))
    assert rig.held() == {pid: (1, T0 + 3 + TTL_S) for pid in range(512)}


def test_run_heartbeats_renews_and_polls_on_schedule_until_stopped() -> None:
    rig = Rig()
    stop = threading.Event()

    def stop_at_t0_plus_7(fake: FakeCoordinator, method: str) -> None:
        if method == "live_nodes" and fake.clock.monotonic() >= T0 + 7:
            stop.set()

    rig.fake.hook = stop_at_t0_plus_7
    rig.loop.run(stop)  # the manual clock's wait() advances time instead of sleeping
    assert rig.fake.calls == [
        (T0, "join"),
        (T0, "heartbeat"),
        (T0, "renew"),
        (T0, "live_nodes"),
        (T0, "claim"),
        (T0 + 1, "live_nodes"),
        (T0 + 2, "live_nodes"),
        (T0 + 3, "heartbeat"),
        (T0 + 3, "renew"),
        (T0 + 3, "live_nodes"),
        (T0 + 4, "live_nodes"),
        (T0 + 5, "live_nodes"),
        (T0 + 6, "heartbeat"),
        (T0 + 6, "renew"),
        (T0 + 6, "live_nodes"),
        (T0 + 7, "live_nodes"),
    ]
    assert rig.clock.monotonic() == T0 + 7  # no wait after stop was set
    assert rig.loop.last_heartbeat_mono == T0 + 6
    assert rig.held()[0] == (1, T0 + 6 + TTL_S)


@pytest.mark.parametrize("requested", [False, True])
def test_wake_runs_a_requested_poll_before_its_interval(requested: bool) -> None:
    rig = Rig(WatchingFakeCoordinator)
    assert rig.fake.on_change == rig.loop.wake  # the loop registered itself
    rig.fake.members = ["n1", "n2"]
    rig.at(T0)
    assert len(rig.table) == 512

    rig.fake.members = ["n1"]  # the peer left: the watch would report it
    if requested:
        rig.fake.on_change()
    rig.at(T0 + 0.25)
    polls = [t for t, method in rig.fake.calls if method == "live_nodes"]
    if requested:
        assert polls == [T0, T0 + 0.25]
        assert rig.fake.claim_limits == [512, 512]
        assert rig.table.firable() == every(range(PARTITION_COUNT), 1)
        rig.at(T0 + 1)  # the poll interval restarted at the requested poll
        assert [t for t, m in rig.fake.calls if m == "live_nodes"] == [T0, T0 + 0.25]
        rig.at(T0 + 1.25)
        assert [t for t, m in rig.fake.calls if m == "live_nodes"] == [T0, T0 + 0.25, T0 + 1.25]
    else:
        assert polls == [T0]  # not before the interval without a request
        assert rig.fake.claim_limits == [512]


def test_a_coordinator_that_does_not_watch_is_given_no_callback_and_pruned_every_minute() -> None:
    rig = Rig(OptionalPartsFakeCoordinator)
    rig.at(T0)
    assert rig.fake.calls == [
        (T0, "join"),
        (T0, "heartbeat"),
        (T0, "renew"),
        (T0, "live_nodes"),
        (T0, "claim"),
        (T0, "prune"),
    ]
    for instant in (T0 + 30, T0 + 59.5, T0 + 60, T0 + 61, T0 + 120):
        rig.at(instant)
    assert [t for t, method in rig.fake.calls if method == "prune"] == [T0, T0 + 60, T0 + 120]
    assert "set_on_change" not in {method for _, method in rig.fake.calls}


@pytest.mark.parametrize("fake_class", [FakeCoordinator, RenewBeatsFakeCoordinator])
def test_after_a_gap_over_the_responsiveness_interval_it_heartbeats_and_waits_before_claiming(fake_class) -> None:
    rig = Rig(fake_class)
    responsive = rig.settings.responsive_s
    assert responsive == 5.0  # min(TTL 10, renew 3 + 2 polls of 1)
    rig.fake.members = ["n1", "n2"]
    rig.fake.take("n2", list(range(512, 1024)))
    rig.at(T0)
    assert rig.held() == {pid: (1, T0 + TTL_S) for pid in range(512)}

    rig.fake.down = True  # the store goes away for 12 s (> TTL): every lease expires in it
    for instant in range(1, 12):
        rig.at(T0 + instant)
    rig.fake.down = False
    rig.fake.free(list(range(512, 1024)))  # n2's leases expired and n2 is gone
    rig.fake.members = ["n1"]
    assert rig.table.firable() == {}

    rig.fake.calls.clear()
    rig.at(T0 + 12)  # heartbeat and renewal succeed: the gap (12 s) is over 5 s, so no share yet
    assert [method for _, method in rig.fake.calls] == ["heartbeat", "renew", "fences"]  # fences: rewind check
    assert rig.held() == {pid: (1, T0 + 12 + TTL_S) for pid in range(512)}  # its own, renewed, fire again
    assert rig.table.firable() == every(range(512), 1)
    for instant in (13, 14, 15, 16, 16.99):
        rig.at(T0 + instant)
    assert [method for _, method in rig.fake.calls if method in ("live_nodes", "claim")] == []
    assert rig.fake.claim_limits == [512]  # the claim at T0 only

    rig.at(T0 + 17)  # one responsiveness interval after the heartbeat: the share is computed, the rest claimed
    assert rig.fake.claim_limits == [512, 512]
    assert len(rig.table) == 1024
    assert rig.lease_events("lost") == 0.0


def test_a_gap_within_the_responsiveness_interval_does_not_delay_claiming() -> None:
    rig = Rig()
    rig.at(T0)
    rig.fake.free(list(range(1024)))  # the node holds nothing any more (all released)
    rig.table.drop(range(1024))
    rig.fake.down = True
    rig.at(T0 + 3)  # the renewal at T0 + 3 fails: the last heartbeat stays T0
    rig.fake.down = False
    rig.fake.calls.clear()
    rig.at(T0 + 4.5)  # 4.5 s since the last heartbeat: within 5 s, the share is computed at once
    assert [method for _, method in rig.fake.calls] == ["heartbeat", "renew", "fences", "live_nodes", "claim"]
    assert rig.fake.claim_limits == [1024, 1024]


def rewinds(rig: Rig) -> float:
    return rig.metrics.registry.get_sample_value("scheduler_store_rewind_detected_total")


def rewound_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "store_rewound"]


def test_a_renewal_missing_leases_whose_fence_went_back_counts_a_rewind_per_partition(caplog) -> None:
    caplog.set_level(logging.INFO, logger="scheduler")
    rig = Rig()
    rig.at(T0)  # claims 0..1023 at epoch 1
    # The store goes back: 0..9 were never claimed (epoch 0, no owner); 10 is n2's at epoch 1
    # (the same number under another node); 11 is taken over by n2 the healthy way (epoch 2).
    for pid in range(10):
        rig.fake.epochs[pid] = 0
        rig.fake.fence_owner.pop(pid)
        rig.fake.owners.pop(pid)
    rig.fake.owners[10] = ("n2", 1)
    rig.fake.fence_owner[10] = "n2"
    rig.fake.take("n2", [11])

    rig.at(T0 + 3)  # the renewal misses 0..11: their fences are read; the poll claims 0..9 again (epoch 1 again)
    assert rig.lease_events("lost") == 12.0
    assert rig.held()[0] == (1, T0 + 3 + TTL_S) and 10 not in rig.held()
    assert rewinds(rig) == 11.0
    [record] = rewound_records(caplog)
    assert record.levelno == logging.WARNING
    assert record.fields["seen"] == "fence" and record.fields["partitions"] == 11
    assert record.fields["sample"][:2] == [
        {"partition": 0, "had": 1, "store": 0},
        {"partition": 1, "had": 1, "store": 0},
    ]
    assert "same run id" in record.fields["note"]

    rig.fake.free([10])  # n2's lease goes; the node claims it at epoch 2
    rig.at(T0 + 4)
    assert rig.held()[10] == (2, T0 + 4 + TTL_S)
    assert rewinds(rig) == 11.0  # forgotten once found: not counted again at the claims
    rig.at(T0 + 6)
    assert rewinds(rig) == 11.0 and len(rewound_records(caplog)) == 1


def test_a_claim_returning_an_epoch_not_above_one_held_counts_a_rewind() -> None:
    rig = Rig()
    rig.at(T0)  # claims 0..1023 at epoch 1
    rig.fake.members = ["n1", "n2"]
    rig.at(T0 + 1)  # share 512: 512..1023 drain and, no tick running, are released
    assert sorted(rig.table.held()) == list(range(512))
    for pid in range(512, 1024):  # the store goes back to before their claim
        rig.fake.epochs[pid] = 0
        rig.fake.fence_owner.pop(pid)
    rig.fake.members = ["n1"]
    rig.at(T0 + 2)  # claims them again: epoch 1, not above the 1 it held
    assert len(rig.table) == 1024
    assert rewinds(rig) == 512.0
    rig.at(T0 + 3)
    assert rewinds(rig) == 512.0


def test_after_a_store_error_every_partition_remembered_is_checked_once() -> None:
    rig = Rig()
    rig.at(T0)
    rig.fake.members = ["n1", "n2"]
    rig.at(T0 + 1)  # 512..1023 released: remembered at epoch 1, no longer held
    rig.fake.down = True
    rig.at(T0 + 3)
    rig.fake.down = False
    for pid in range(600, 610):  # the store we reconnect to never saw their claim
        rig.fake.epochs[pid] = 0
        rig.fake.fence_owner.pop(pid)
    rig.fake.calls.clear()
    rig.at(T0 + 4)
    assert [method for _, method in rig.fake.calls][:3] == ["heartbeat", "renew", "fences"]
    assert rewinds(rig) == 10.0
    rig.fake.calls.clear()
    rig.at(T0 + 7)  # the next renewal reads no fence: nothing missed, no store error since
    assert "fences" not in [method for _, method in rig.fake.calls]
    assert rewinds(rig) == 10.0
