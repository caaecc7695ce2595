"""Push under a node's death (docs/delivery.md, "Push"): real node processes, a real receiver.

A node killed with attempts in flight loses none of them: once its leases
(partitions) pass to the survivor and the attempts' own leases (timeout + 5 s)
expire, the survivor's settle step retries them and its push loop sends them
again under the same ``Idempotency-Key``. The receiver sees each run once,
except the attempts that were in flight at the kill, which it may see twice
(at least once, never more: a run acked is never sent again).
"""

from __future__ import annotations

from collections import Counter
from operator import not_

from harness import AFTERMATH_S, MARGIN_S, TIMINGS, Cluster, backend_pids, delivery_states, owned_by
from helpers import Receiver

from scheduler import jobs
from scheduler.delivery.lifecycle import PUSH_LEASE_MARGIN_S, RunKey
from scheduler.delivery.ssrf import AddressPolicy
from scheduler.delivery.targets import DeliverySpec
from scheduler.partition import partition_of
from scheduler.spec import JobSpec

JOBS = 6
"""HTTP jobs firing every second (at least half of them in each node's partitions): about 3
attempts in flight per node at any time."""

TIMEOUT_S = 4
"""Per-attempt deadline of the jobs: an attempt's lease is this + PUSH_LEASE_MARGIN_S. Far
above ANSWER_S: an attempt that timed out is retried, a second delivery unrelated to the
kill (a CI run under load saw one with 2 s)."""

ANSWER_S = 1.0
"""The receiver answers every request after this long."""


def run_id(row: dict) -> str:
    return RunKey(row["partition_id"], row["job_id"], row["nominal_time"]).run_id


def test_a_node_killed_while_pushing_is_redelivered_by_the_new_owner_with_the_same_key(cluster: Cluster) -> None:
    receiver = Receiver(delay_s=ANSWER_S)
    try:
        spec = DeliverySpec.build(url=receiver.url(), timeout_s=TIMEOUT_S)
        since = cluster.now()
        for node_id in ("n1", "n2"):
            cluster.spawn(node_id, ["--push-allow", "127.0.0.1/32"])
        cluster.wait_balanced(["n1", "n2"])
        # Jobs added one by one until each node's partitions hold half of JOBS: six
        # random ids all land in n2's one time in 64, and n1 then never pushed (a
        # CI run saw it).
        n1_partitions = set(owned_by(cluster.conn, "n1"))
        job_ids: list = []

        def fewest_on_a_node() -> int:
            on_n1 = sum(partition_of(job_id) in n1_partitions for job_id in job_ids)
            return min(on_n1, len(job_ids) - on_n1)

        while fewest_on_a_node() < JOBS // 2:
            job_ids += jobs.add_jobs(
                cluster.conn,
                [JobSpec.build(tenant="push", interval_s=1, delivery=spec)],
                push_policy=AddressPolicy.parse("127.0.0.1/32"),
            )

        def leased_by_n1() -> set[str]:
            return {
                run_id(r)
                for r in delivery_states(cluster.conn, job_ids)
                if r["state"] == "leased" and r["worker"] == "n1"
            }

        def received() -> set[str]:
            return {r["headers"]["idempotency-key"] for r in list(receiver.requests)}

        # Killed while the receiver holds (for ANSWER_S) a request n1 sent.
        cluster.wait_for("a request of n1 at the receiver", lambda: leased_by_n1() & received(), timeout_s=15)
        assert backend_pids(cluster.conn, "scheduler-push:n1"), "n1's push session not found"
        cluster.nodes["n1"].kill()
        killed_at = cluster.now()
        # A transaction n1 sent before it died (an ack) may still commit: read once its sessions are
        # gone (the push loop claims on one and records outcomes on another).
        cluster.wait_for(
            "n1's push sessions to end",
            lambda: (
                backend_pids(cluster.conn, "scheduler-push:n1") + backend_pids(cluster.conn, "scheduler-push-record:n1")
            ),
            not_,
            timeout_s=10,
        )
        in_flight = leased_by_n1()  # final: n1 records nothing any more
        sent_before_kill = in_flight & received()
        assert sent_before_kill, "no request of n1 was at the receiver at the kill"

        # n2 takes n1's partitions after the TTL; the attempts' leases end at most
        # timeout + margin after their claim; then settle, a backoff (< 1 s), the push.
        bound_s = TIMINGS.lease_ttl_s + TIMEOUT_S + PUSH_LEASE_MARGIN_S + 1 + ANSWER_S + MARGIN_S + 5
        cluster.wait_for(
            "n1's attempts in flight to be redelivered and acked by n2",
            lambda: {run_id(r): (r["state"], r["worker"]) for r in delivery_states(cluster.conn, job_ids)},
            lambda states: all(states[k] == ("succeeded", "n2") for k in in_flight),
            timeout_s=bound_s,
        )
        history = cluster.finish(since, covering=killed_at)
        for job_id in job_ids:
            jobs.set_paused(cluster.conn, job_id, True)
        rows = cluster.wait_for(
            "every run delivered",
            lambda: delivery_states(cluster.conn, job_ids),
            lambda rows: all(r["state"] == "succeeded" for r in rows),
            timeout_s=TIMEOUT_S + PUSH_LEASE_MARGIN_S + AFTERMATH_S + MARGIN_S + 5,
        )
        cluster.stop_all()
    finally:
        receiver.close()

    seen = Counter(r["headers"]["idempotency-key"] for r in receiver.requests)
    assert set(seen) == {run_id(r) for r in rows}, "a run acked that the receiver never saw, or vice versa"
    twice = {key for key, n in seen.items() if n > 1}
    assert max(seen.values()) <= 2
    by_key = {run_id(r): r for r in rows}
    assert sent_before_kill <= twice, "a run in flight at the kill was not delivered again"
    assert twice <= in_flight, [
        ("delivered twice, not in flight at the kill", key, by_key[key]["attempt"], by_key[key]["last_error"])
        for key in twice - in_flight
    ]
    attempts: dict[str, list[str]] = {}
    for request in receiver.requests:
        attempts.setdefault(request["headers"]["idempotency-key"], []).append(request["headers"]["scheduler-attempt"])
    for key in in_flight:
        assert attempts[key] in (["1", "2"], ["2"]), (key, attempts[key])
        assert by_key[key]["attempt"] == 2
    for key in set(by_key) - in_flight:
        assert seen[key] == 1 and by_key[key]["attempt"] == 1
    print(
        f"\npush kill -9: {len(rows)} runs delivered, {len(in_flight)} in flight at the kill, "
        f"{len(twice)} of them seen twice; window {history.report}"
    )
