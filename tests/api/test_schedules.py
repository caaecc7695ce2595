"""``/v1/schedules`` over HTTP (scheduler/api/schedules.py): every endpoint's happy path
with the exact rows it leaves in the store, ETag / If-Match, apply (dry run, prune, one
transaction), the per-tenant quota, scoping (another tenant: 404; worker and admin keys:
403) and bad input of every field (422 naming the field, nothing written)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from scheduler import jobs, store
from scheduler.delivery.lifecycle import RunKey
from scheduler.errors import clip
from scheduler.schedule import format_instant

BERLIN = ZoneInfo("Europe/Berlin")
YEARLY = {"cron": "0 0 1 1 *", "tz": "Europe/Berlin"}
"""A cron schedule whose fires are easy to state exactly: midnight of every 1 January in Berlin."""


def client(api, token: str) -> httpx.Client:
    return httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


@pytest.fixture
def acme(api) -> httpx.Client:
    with client(api, api.key("acme", "tenant")) as c:
        yield c


@pytest.fixture
def db(api):
    with psycopg.connect(api.dsn, autocommit=True, row_factory=dict_row) as conn:
        yield conn


def rows(db, sql: str, *params) -> list[dict]:
    return db.execute(sql, params).fetchall()


def job(db, name: str, tenant: str = "acme") -> dict:
    found = rows(db, "SELECT * FROM jobs WHERE tenant = %s AND name = %s AND deleted_at IS NULL", tenant, name)
    assert len(found) == 1, found
    return found[0]


def iso(instant: datetime) -> str:
    return format_instant(instant)


def yearly_fires(now: datetime, count: int = 10) -> list[dict]:
    """The next ``count`` fires of :data:`YEARLY` strictly after ``now`` (nominal = scheduled: no jitter)."""
    first = now.astimezone(BERLIN).year + 1
    instants = [datetime(first + k, 1, 1, tzinfo=BERLIN).astimezone(UTC) for k in range(count)]
    return [{"nominal_time": iso(t), "scheduled_at": iso(t)} for t in instants]


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def fires_of(body: list[dict]) -> list[dict]:
    """Fires as returned, normalized to format_instant text."""
    return [{k: iso(parse(v)) for k, v in fire.items()} for fire in body]


def count_writes(db) -> dict[str, int]:
    return rows(
        db,
        "SELECT (SELECT count(*) FROM jobs) AS jobs, (SELECT count(*) FROM job_revisions) AS revisions,"
        " (SELECT count(*) FROM job_delivery) AS deliveries, (SELECT count(*) FROM runs) AS runs,"
        " (SELECT count(*) FROM run_requests) AS requests, (SELECT count(*) FROM skips) AS skips",
    )[0]


# ---------------------------------------------------------------- PUT


def test_put_creates_then_is_idempotent_then_replaces(acme, db):
    spec = {**YEARLY, "queue": "reports", "payload": {"b": [1, 2], "a": 1e2}, "max_attempts": 3}
    created = acme.put("/v1/schedules/nightly", json=spec)
    assert created.status_code == 201, created.text
    body = created.json()
    assert created.headers["location"] == "/v1/schedules/nightly"
    etag = created.headers["etag"]
    assert etag == body["schedule"]["etag"] and len(etag) == 34 and etag.startswith('"')
    row = job(db, "nightly")
    assert (row["kind"], row["cron_expr"], row["tz"], row["cron_dialect"], row["queue"], row["revision"]) == (
        "cron",
        "0 0 1 1 *",
        "Europe/Berlin",
        "unix",
        "reports",
        1,
    )
    assert body["outcome"] == "created"
    assert fires_of(body["next_fires"]) == yearly_fires(row["created_at"])
    assert row["next_nominal_at"] == parse(body["next_fires"][0]["nominal_time"])
    delivery = rows(db, "SELECT payload, max_attempts FROM job_delivery WHERE job_id = %s", row["job_id"])
    assert delivery == [{"payload": {"a": 100.0, "b": [1, 2]}, "max_attempts": 3}]
    assert body["schedule"] | {"created_at": None, "changed_at": None, "next_fire": None} == {
        "name": "nightly",
        "etag": etag,
        "kind": "cron",
        "cron": "0 0 1 1 *",
        "tz": "Europe/Berlin",
        "dialect": "unix",
        "interval_s": None,
        "at": None,
        "misfire": "all",
        "catchup_window_s": 86400,
        "misfire_grace_s": 60,
        "jitter_s": 0,
        "queue": "reports",
        "url": None,
        "method": None,
        "header_names": [],
        "timeout_s": None,
        "payload": {"a": 100.0, "b": [1, 2]},
        "max_attempts": 3,
        "backoff_base_s": 1.0,
        "backoff_cap_s": 300.0,
        "max_age_s": None,
        "overlap": "allow",
        "paused": False,
        "next_fire": None,
        "revision": 1,
        "created_at": None,
        "changed_at": None,
    }

    # The same spec again (keys in another order, 100 for 1e2): nothing written.
    before = count_writes(db)
    again = acme.put("/v1/schedules/nightly", json={**spec, "payload": {"a": 100, "b": [1, 2]}, "kind": "cron"})
    assert again.status_code == 200, again.text
    assert again.json()["outcome"] == "unchanged"
    assert again.headers["etag"] == etag
    assert count_writes(db) == before
    assert job(db, "nightly") == row

    # A change: replaced in place, revision bumped, the superseded revision kept.
    changed = acme.put("/v1/schedules/nightly", json={**spec, "jitter_s": 30})
    assert changed.status_code == 200, changed.text
    assert changed.json()["outcome"] == "replaced"
    assert changed.headers["etag"] not in (etag, None)
    edited = job(db, "nightly")
    assert (edited["job_id"], edited["revision"], edited["jitter_s"]) == (row["job_id"], 2, 30)
    assert rows(db, "SELECT revision, jitter_s FROM job_revisions WHERE job_id = %s", row["job_id"]) == [
        {"revision": 1, "jitter_s": 0}
    ]
    # The schedule is unchanged: its pending slot is kept, now with jitter.
    assert edited["next_nominal_at"] == row["next_nominal_at"]
    fires = changed.json()["next_fires"]
    assert [parse(f["nominal_time"]) for f in fires] == [
        parse(f["nominal_time"]) for f in yearly_fires(row["created_at"])
    ]
    assert parse(fires[0]["scheduled_at"]) == edited["next_due_at"]


def test_put_interval_and_one_shot_next_fires_are_exact(acme, db):
    interval = acme.put("/v1/schedules/every-90s", json={"interval_s": 90})
    assert interval.status_code == 201, interval.text
    row = job(db, "every-90s")
    anchor = row["created_at"].replace(microsecond=0)
    assert row["anchor_at"] == anchor
    assert fires_of(interval.json()["next_fires"]) == [
        {
            "nominal_time": iso(anchor + timedelta(seconds=90 * k)),
            "scheduled_at": iso(anchor + timedelta(seconds=90 * k)),
        }
        for k in range(1, 11)
    ]
    once = acme.put(
        "/v1/schedules/launch", json={"at": "2031-03-04T05:06:07+02:00", "url": "https://93.184.216.34/hook"}
    )
    assert once.status_code == 201, once.text
    assert fires_of(once.json()["next_fires"]) == [
        {"nominal_time": "2031-03-04T03:06:07Z", "scheduled_at": "2031-03-04T03:06:07Z"}
    ]
    stored = job(db, "launch")
    assert (stored["kind"], stored["fire_at"], stored["queue"]) == (
        "once",
        datetime(2031, 3, 4, 3, 6, 7, tzinfo=UTC),
        None,
    )
    assert once.json()["schedule"]["method"] == "POST"
    # The same instant written with another offset is the same spec.
    same = acme.put("/v1/schedules/launch", json={"at": "2031-03-04T03:06:07Z", "url": "https://93.184.216.34/hook"})
    assert (same.status_code, same.json()["outcome"], same.headers["etag"]) == (200, "unchanged", once.headers["etag"])


def test_if_match_and_if_none_match(acme, db):
    first = acme.put("/v1/schedules/s", json={"interval_s": 60})
    etag = first.headers["etag"]
    second = acme.put("/v1/schedules/s", json={"interval_s": 120}, headers={"If-Match": etag})
    assert second.status_code == 200, second.text
    current = second.headers["etag"]
    before = count_writes(db)

    stale = acme.put("/v1/schedules/s", json={"interval_s": 300}, headers={"If-Match": etag})
    assert stale.status_code == 412, stale.text
    assert stale.headers["etag"] == current
    assert stale.headers["content-type"] == "application/problem+json"
    assert stale.json()["field"] == "If-Match"
    weak = acme.put("/v1/schedules/s", json={"interval_s": 300}, headers={"If-Match": f"W/{current}"})
    assert weak.status_code == 412  # If-Match compares strongly: a weak tag never matches
    absent = acme.put("/v1/schedules/new", json={"interval_s": 300}, headers={"If-Match": "*"})
    assert absent.status_code == 412
    exists = acme.put("/v1/schedules/s", json={"interval_s": 300}, headers={"If-None-Match": "*"})
    assert exists.status_code == 412
    none_match = acme.put("/v1/schedules/s", json={"interval_s": 300}, headers={"If-None-Match": f'"x", W/{current}'})
    assert none_match.status_code == 412  # If-None-Match compares weakly
    malformed = acme.put("/v1/schedules/s", json={"interval_s": 300}, headers={"If-Match": "abc"})
    assert (malformed.status_code, malformed.json()["field"]) == (422, "If-Match")
    assert count_writes(db) == before
    assert job(db, "s")["interval_s"] == 120

    listed = acme.put("/v1/schedules/s", json={"interval_s": 300}, headers={"If-Match": f'"nope", {current}'})
    assert listed.status_code == 200, listed.text
    star = acme.put("/v1/schedules/s", json={"interval_s": 600}, headers={"If-Match": "*"})
    assert star.status_code == 200
    create_only = acme.put("/v1/schedules/new", json={"interval_s": 60}, headers={"If-None-Match": "*"})
    assert create_only.status_code == 201
    assert job(db, "s")["interval_s"] == 600


# ---------------------------------------------------------------- GET, list, DELETE


def test_get_describes_the_schedule(acme, db):
    acme.put("/v1/schedules/hourly", json={"cron": "0 * * * *", "headers": None})
    row = job(db, "hourly")
    now = store.now(db)
    since = (now - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    filled = acme.post(
        "/v1/schedules/hourly:backfill", json={"since": iso(since), "until": iso(since + timedelta(hours=2))}
    )
    assert filled.status_code == 200, filled.text
    got = acme.get("/v1/schedules/hourly")
    assert got.status_code == 200, got.text
    body = got.json()
    assert got.headers["etag"] == body["schedule"]["etag"]
    assert body["schedule"]["name"] == "hourly"
    first = row["next_nominal_at"]
    assert [parse(f["nominal_time"]) for f in body["next_fires"]] == [first + timedelta(hours=k) for k in range(10)]
    assert [(r["run_id"], r["state"], r["origin"], r["attempt"]) for r in body["recent_runs"]] == [
        (RunKey.of(row["job_id"], since + timedelta(hours=h)).run_id, "pending", "backfill", 0) for h in (1, 0)
    ]
    # Each recent run is named as GET /v1/runs names it (id; run_id kept) and shows its worker.
    claimed = acme.post("/v1/runs:claim", json={"max": 1, "worker": "box-1"})
    assert claimed.status_code == 200, claimed.text
    worker = "api:" + acme.headers["Authorization"].split("_")[1] + ":box-1"
    recent = acme.get("/v1/schedules/hourly").json()["recent_runs"]
    assert [(r["id"], r["run_id"], r["state"], r["worker"]) for r in recent] == [
        (RunKey.of(row["job_id"], since + timedelta(hours=h)).run_id,) * 2 + state
        for h, state in ((1, ("pending", None)), (0, ("leased", worker)))
    ]
    assert body["counters"]["runs"] == {
        "pending": 2,
        "leased": 0,
        "failed": 0,
        "succeeded": 0,
        "dead": 0,
        "canceled": 0,
        "predelivery": 0,
    }
    assert body["counters"]["in_flight"] == 0
    assert body["counters"]["skips"] == {}
    assert acme.get("/v1/schedules/missing").status_code == 404


def test_list_pages_by_name_with_filters(acme, db):
    for name, spec in (
        ("c", {"interval_s": 60, "queue": "q2"}),
        ("a", {"cron": "0 2 * * *"}),
        ("b", {"interval_s": 60}),
        ("e:x", {"at": "2035-01-01T00:00:00Z", "queue": "q2"}),
        ("d", {"cron": "0 3 * * *"}),
    ):
        assert acme.put(f"/v1/schedules/{name}", json=spec).status_code == 201
    assert acme.post("/v1/schedules/d:pause").status_code == 200
    jobs.add_job(db, jobs.JobSpec.build(tenant="acme", interval_s=60))  # unnamed: not an API schedule

    names, cursor = [], None
    for _ in range(5):
        page = acme.get("/v1/schedules", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        names.append([item["name"] for item in page.json()["items"]])
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert names == [["a", "b"], ["c", "d"], ["e:x"]]

    def listed(**params) -> list[str]:
        got = acme.get("/v1/schedules", params=params)
        assert got.status_code == 200, got.text
        return [item["name"] for item in got.json()["items"]]

    assert listed(paused="true") == ["d"]
    assert listed(paused="false") == ["a", "b", "c", "e:x"]
    assert listed(kind="interval") == ["b", "c"]
    assert listed(queue="q2") == ["c", "e:x"]
    assert listed(name_prefix="e:") == ["e:x"]
    assert listed(kind="cron", paused="false") == ["a"]
    bad = acme.get("/v1/schedules", params={"cursor": "not-a-cursor"})
    assert (bad.status_code, bad.json()["field"]) == (422, "cursor")
    other = acme.get("/v1/schedules", params={"cursor": "eyJ4IjoxfQ"})  # {"x":1}: a cursor of no list of ours
    assert (other.status_code, other.json()["field"]) == (422, "cursor")
    assert acme.get("/v1/schedules", params={"kind": "daily"}).status_code == 422
    assert acme.get("/v1/schedules", params={"limit": 501}).status_code == 422


def test_delete(acme, db):
    acme.put("/v1/schedules/gone", json={"interval_s": 60})
    row = job(db, "gone")
    deleted = acme.delete("/v1/schedules/gone")
    assert deleted.status_code == 204 and deleted.content == b""
    stored = rows(db, "SELECT deleted_at, next_nominal_at, revision FROM jobs WHERE job_id = %s", row["job_id"])[0]
    assert stored["deleted_at"] is not None and stored["next_nominal_at"] is None and stored["revision"] == 2
    assert acme.get("/v1/schedules/gone").status_code == 404
    again = acme.delete("/v1/schedules/gone")
    assert again.status_code == 404
    assert again.json() == {
        "type": "about:blank",
        "title": "Not Found",
        "status": 404,
        "detail": "name: no schedule 'gone'",
        "field": "name",
    }
    # Preconditions as for PUT: a stale If-Match deletes nothing.
    first = acme.put("/v1/schedules/guarded", json={"interval_s": 60}).headers["etag"]
    current = acme.put("/v1/schedules/guarded", json={"interval_s": 30}).headers["etag"]
    stale = acme.delete("/v1/schedules/guarded", headers={"If-Match": first})
    assert (stale.status_code, stale.headers["etag"], stale.json()["field"]) == (412, current, "If-Match")
    assert acme.delete("/v1/schedules/guarded", headers={"If-None-Match": "*"}).status_code == 412
    assert job(db, "guarded")["interval_s"] == 30
    assert acme.delete("/v1/schedules/guarded", headers={"If-Match": current}).status_code == 204
    assert acme.delete("/v1/schedules/guarded", headers={"If-Match": "*"}).status_code == 404
    # The name is free again: a new schedule, a new id.
    assert acme.put("/v1/schedules/gone", json={"interval_s": 60}).status_code == 201
    assert job(db, "gone")["job_id"] != row["job_id"]


# ---------------------------------------------------------------- pause, resume, trigger, backfill


def test_pause_and_resume(acme, db):
    acme.put("/v1/schedules/p", json=YEARLY)
    row = job(db, "p")
    paused = acme.post("/v1/schedules/p:pause")
    assert paused.status_code == 200, paused.text
    assert (paused.json()["paused"], paused.json()["next_fire"]) == (True, None)
    assert paused.headers["etag"] == paused.json()["etag"]
    stored = job(db, "p")
    assert (stored["paused"], stored["next_nominal_at"], stored["revision"]) == (True, None, 2)
    again = acme.post("/v1/schedules/p:pause")
    assert again.status_code == 200 and job(db, "p")["revision"] == 2  # pausing a paused one changes nothing
    resumed = acme.post("/v1/schedules/p:resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["backfilled"] == []
    stored = job(db, "p")
    assert (stored["paused"], stored["revision"]) == (False, 3)
    assert stored["next_nominal_at"] == row["next_nominal_at"]  # the next 1 January after now
    assert parse(resumed.json()["schedule"]["next_fire"]) == row["next_nominal_at"]


def test_resume_with_backfill_catches_up_the_slots_missed_while_paused(acme, db):
    acme.put("/v1/schedules/tick", json={"interval_s": 1})
    row = job(db, "tick")
    assert acme.post("/v1/schedules/tick:pause").status_code == 200
    time.sleep(2.5)
    resumed = acme.post("/v1/schedules/tick:resume", json={"catch_up": "backfill", "max_runs": 100})
    assert resumed.status_code == 200, resumed.text
    paused_at = rows(db, "SELECT valid_until FROM job_revisions WHERE job_id = %s AND NOT paused", row["job_id"])
    resumed_at = job(db, "tick")["changed_at"]
    anchor = row["anchor_at"]
    expected = [
        anchor + timedelta(seconds=k)
        for k in range(1, 100)
        if paused_at[0]["valid_until"] < anchor + timedelta(seconds=k) <= resumed_at
    ]
    assert len(expected) >= 2
    assert resumed.json()["backfilled"] == [RunKey.of(row["job_id"], t).run_id for t in expected]
    assert rows(db, "SELECT nominal_time, origin, state FROM runs WHERE job_id = %s ORDER BY 1", row["job_id"]) == [
        {"nominal_time": t, "origin": "backfill", "state": "pending"} for t in expected
    ]
    bad = acme.post("/v1/schedules/tick:resume", json={"catch_up": "all"})
    assert (bad.status_code, bad.json()["field"], bad.json()["detail"]) == (
        422,
        "catch_up",
        "catch_up: must be one of none, backfill (got 'all')",
    )


def test_trigger_is_deduplicated_by_request_id(acme, db):
    acme.put("/v1/schedules/t", json={"interval_s": 3600, "overlap": "forbid"})
    row = job(db, "t")
    first = acme.post("/v1/schedules/t:trigger", json={"request_id": "deploy-42"})
    assert first.status_code == 202, first.text  # no node runs here: queued
    assert first.json() == {"request_id": "deploy-42", "created": True, "force": False, "outcome": None, "run_id": None}
    again = acme.post("/v1/schedules/t:trigger", json={"request_id": "deploy-42", "force": True})
    assert again.json() == {
        "request_id": "deploy-42",
        "created": False,
        "force": False,
        "outcome": None,
        "run_id": None,
    }
    fresh = acme.post("/v1/schedules/t:trigger")
    assert fresh.status_code == 202 and fresh.json()["created"] is True
    assert str(uuid.UUID(fresh.json()["request_id"])) == fresh.json()["request_id"]
    assert rows(
        db, "SELECT request_id, force, outcome FROM run_requests WHERE job_id = %s ORDER BY 1", row["job_id"]
    ) == sorted(
        [
            {"request_id": "deploy-42", "force": False, "outcome": None},
            {"request_id": fresh.json()["request_id"], "force": False, "outcome": None},
        ],
        key=lambda r: r["request_id"],
    )
    for body, field in (
        ({"request_id": ""}, "request_id"),
        ({"request_id": "x" * 201}, "request_id"),
        ({"request_id": "a\nb"}, "request_id"),
        ({"wait_s": 11}, "wait_s"),
        ({"wait_s": "soon"}, "wait_s"),
        ({"force": "yes"}, "force"),
        ({"colour": 1}, "colour"),
    ):
        bad = acme.post("/v1/schedules/t:trigger", json=body)
        assert (bad.status_code, bad.json()["field"]) == (422, field), (body, bad.text)
    # A request id of another type says the type it must be (it said "must be 1 to 200
    # characters (got 5)"; a trial).
    for value, shown in ((5, "5"), (True, "true")):
        bad = acme.post("/v1/schedules/t:trigger", json={"request_id": value})
        assert (bad.status_code, bad.json()["detail"]) == (422, f"request_id: must be a string (got {shown})")
    assert count_writes(db)["requests"] == 2


def test_trigger_reports_the_owners_outcome(api, acme, db):
    from helpers import OneNode

    from scheduler.delivery import owner

    acme.put("/v1/schedules/t", json={"interval_s": 3600, "overlap": "forbid"})
    row = job(db, "t")
    assert acme.post("/v1/schedules/t:trigger", json={"request_id": "a"}).status_code == 202
    node = OneNode(api.dsn)
    try:
        epochs = {pid: node.epoch(pid) for pid in range(1024)}
        owner.fire_requests(db, "t1", epochs)
        fired = rows(db, "SELECT nominal_time, origin, state FROM runs WHERE job_id = %s", row["job_id"])
        assert [(r["origin"], r["state"]) for r in fired] == [("manual", "pending")]
        run_id = RunKey.of(row["job_id"], fired[0]["nominal_time"]).run_id
        again = acme.post("/v1/schedules/t:trigger", json={"request_id": "a"})
        assert again.status_code == 200, again.text
        assert again.json() == {
            "request_id": "a",
            "created": False,
            "force": False,
            "outcome": "fired",
            "run_id": run_id,
        }
        # forbid: a second manual run while the first is unfinished is skipped, unless forced.
        assert acme.post("/v1/schedules/t:trigger", json={"request_id": "b"}).status_code == 202
        owner.fire_requests(db, "t1", epochs)
        skipped = acme.post("/v1/schedules/t:trigger", json={"request_id": "b"})
        assert (skipped.status_code, skipped.json()["outcome"], skipped.json()["run_id"]) == (200, "skipped", None)

        # wait_s: the request waits for the owner (here 0.5 s later), then answers 200 with the run.
        def owner_step() -> None:
            with psycopg.connect(api.dsn, autocommit=True, row_factory=dict_row) as conn:
                owner.fire_requests(conn, "t1", epochs)

        timer = threading.Timer(0.5, owner_step)
        timer.start()
        waited = acme.post("/v1/schedules/t:trigger", json={"request_id": "c", "force": True, "wait_s": 8})
        timer.join()
        assert (waited.status_code, waited.json()["outcome"], waited.json()["force"]) == (200, "fired", True)
    finally:
        node.close()
    runs = rows(db, "SELECT nominal_time FROM runs WHERE job_id = %s ORDER BY 1", row["job_id"])
    assert [RunKey.of(row["job_id"], r["nominal_time"]).run_id for r in runs] == [run_id, waited.json()["run_id"]]


def test_backfill_creates_the_missing_runs_once(acme, db):
    acme.put("/v1/schedules/h", json={"cron": "30 * * * *"})
    row = job(db, "h")
    now = store.now(db)
    until = now.replace(minute=0, second=0, microsecond=0)
    since = until - timedelta(hours=4)
    slots = [since + timedelta(hours=k, minutes=30) for k in range(4)]
    ids = [RunKey.of(row["job_id"], t).run_id for t in slots]
    window = {"since": iso(since), "until": iso(until)}
    dry = acme.post("/v1/schedules/h:backfill", json={**window, "dry_run": True})
    assert dry.json() == {"slots": 4, "created": ids, "dry_run": True}
    assert count_writes(db)["runs"] == 0
    real = acme.post("/v1/schedules/h:backfill", json=window)
    assert real.json() == {"slots": 4, "created": ids, "dry_run": False}
    assert rows(db, "SELECT nominal_time, origin, node_id FROM runs WHERE job_id = %s ORDER BY 1", row["job_id"]) == [
        {"nominal_time": t, "origin": "backfill", "node_id": "backfill"} for t in slots
    ]
    assert acme.post("/v1/schedules/h:backfill", json=window).json() == {"slots": 4, "created": [], "dry_run": False}
    for body, field, detail in (
        (
            {**window, "max_runs": 3},
            "max_runs",
            "max_runs: the range holds more than 3 slots: narrow since/until or raise max_runs (got 3)",
        ),
        (
            {**window, "max_runs": 0},
            "max_runs",
            "max_runs: must be a whole number from 1 to 100000 in ASCII digits (got 0)",
        ),
        ({"since": iso(since), "until": iso(now + timedelta(hours=1))}, "until", None),
        ({"since": iso(until), "until": iso(since)}, "until", f"until: must be later than since (got {clip(since)})"),
        ({"since": "2024-01-01T00:00:00", "until": iso(until)}, "since", None),
        ({"since": "yesterday", "until": iso(until)}, "since", None),
        ({"until": iso(until)}, "since", None),
        ({**window, "dry_run": "no"}, "dry_run", None),
    ):
        bad = acme.post("/v1/schedules/h:backfill", json=body)
        assert (bad.status_code, bad.json()["field"]) == (422, field), (body, bad.text)
        if detail:
            assert bad.json()["detail"] == detail
    assert count_writes(db)["runs"] == 4


# ---------------------------------------------------------------- names


def test_names_with_colons_route_to_the_action_after_the_last_colon(acme, db):
    for name in ("import:abc:1", "a:pause"):
        put = acme.put(f"/v1/schedules/{name}", json={"interval_s": 60})
        assert put.status_code == 201, put.text
        assert acme.get(f"/v1/schedules/{name}").json()["schedule"]["name"] == name
    assert acme.post("/v1/schedules/a:pause:pause").status_code == 200
    assert job(db, "a:pause")["paused"] is True
    assert job(db, "import:abc:1")["paused"] is False
    assert acme.post("/v1/schedules/import:abc:1:pause").json()["name"] == "import:abc:1"
    assert job(db, "import:abc:1")["paused"] is True
    assert acme.post("/v1/schedules/a:pause:resume").json()["schedule"]["name"] == "a:pause"
    # Percent-encoded names: a space, a question mark.
    assert acme.put("/v1/schedules/two%20words%3F", json={"interval_s": 60}).status_code == 201
    assert acme.get("/v1/schedules/two%20words%3F").json()["schedule"]["name"] == "two words?"
    # An unknown action is not a schedule's POST.
    assert acme.post("/v1/schedules/a:pause:explode").status_code == 405
    # A name with / cannot be one path segment: refused where it could be written.
    assert acme.put("/v1/schedules/a%2Fb", json={"interval_s": 60}).status_code == 422
    slash = acme.post("/v1/schedules:apply", json={"items": [{"name": "a/b", "interval_s": 60}]})
    assert (slash.status_code, slash.json()["field"]) == (422, "items[0].name")
    dots = acme.post("/v1/schedules:apply", json={"items": [{"name": "..", "interval_s": 60}]})
    assert (dots.status_code, dots.json()["field"]) == (422, "items[0].name")


# ---------------------------------------------------------------- apply


def test_apply_dry_run_then_apply_then_prune(acme, db):
    items = [
        {"name": "a", "interval_s": 60},
        {"name": "b", "cron": "0 2 * * *", "tz": "Europe/Berlin"},
        {"name": "c", "at": "2032-01-01T00:00:00Z"},
    ]
    dry = acme.post("/v1/schedules:apply", json={"items": items, "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert dry.json() == {"created": ["a", "b", "c"], "changed": [], "unchanged": [], "deleted": [], "dry_run": True}
    assert count_writes(db)["jobs"] == 0
    done = acme.post("/v1/schedules:apply", json={"items": items})
    assert done.json() == {"created": ["a", "b", "c"], "changed": [], "unchanged": [], "deleted": [], "dry_run": False}
    ids = {name: job(db, name)["job_id"] for name in "abc"}
    assert acme.post("/v1/schedules:apply", json={"items": items}).json()["unchanged"] == ["a", "b", "c"]
    assert count_writes(db)["revisions"] == 0

    changed = [items[0], {**items[1], "tz": "Europe/Paris"}, {"name": "d", "interval_s": 30}]
    dry_prune = acme.post("/v1/schedules:apply", json={"items": changed, "prune": True, "dry_run": True})
    assert dry_prune.json() == {
        "created": ["d"],
        "changed": ["b"],
        "unchanged": ["a"],
        "deleted": ["c"],
        "dry_run": True,
    }
    assert sorted(r["name"] for r in rows(db, "SELECT name FROM jobs WHERE deleted_at IS NULL")) == ["a", "b", "c"]
    pruned = acme.post("/v1/schedules:apply", json={"items": changed, "prune": True})
    assert pruned.json() == {"created": ["d"], "changed": ["b"], "unchanged": ["a"], "deleted": ["c"], "dry_run": False}
    live = rows(db, "SELECT name, job_id, tz, revision FROM jobs WHERE deleted_at IS NULL ORDER BY name")
    assert [(r["name"], r["revision"]) for r in live] == [("a", 1), ("b", 2), ("d", 1)]
    assert live[0]["job_id"] == ids["a"] and live[1]["job_id"] == ids["b"] and live[1]["tz"] == "Europe/Paris"
    assert rows(db, "SELECT deleted_at IS NOT NULL AS deleted FROM jobs WHERE job_id = %s", ids["c"]) == [
        {"deleted": True}
    ]
    # Without prune, the others stay.
    kept = acme.post("/v1/schedules:apply", json={"items": [items[0]]})
    assert kept.json()["deleted"] == [] and len(rows(db, "SELECT 1 FROM jobs WHERE deleted_at IS NULL")) == 3


def test_apply_with_a_bad_item_writes_nothing(acme, db):
    acme.put("/v1/schedules/keep", json={"interval_s": 60})
    before = count_writes(db)
    good = {"name": "fine", "interval_s": 60}
    for items, field, detail in (
        (
            [good, {"name": "x", "interval_s": 0}],
            "items[1].interval_s",
            "items[1]: interval_s: must be positive (at least 1 second) (got 0)",
        ),
        ([good, {"name": "fine", "interval_s": 5}], "items[1].name", "items[1]: name: is given twice (got 'fine')"),
        ([good, {"name": "x", "at": "2001-01-01T00:00:00Z"}], "items[1].at", None),
        ([good, {"interval_s": 60}], "items[1].name", None),
        (
            [good, {"name": 5, "interval_s": 60}],
            "items[1].name",
            "items[1]: name: must be 1-200 printable characters (got 5)",
        ),
        ([good, {"name": "x", "interval_s": 60, "url": "http://127.0.0.1:8080/hook"}], "items[1].url", None),
        ([good, {"name": "bad", "interval_s": "60"}], "items[1].interval_s", None),
    ):
        bad = acme.post("/v1/schedules:apply", json={"items": items, "prune": True})
        assert bad.status_code == 422, bad.text
        assert bad.json()["field"] == field, bad.text
        if detail:
            assert bad.json()["detail"] == detail
        assert count_writes(db) == before


def test_prune_deletes_every_named_job_however_made_and_no_items_needs_allow_empty(api, acme, db):
    """``prune`` deletes the tenant's named jobs whatever made them (``jobs add --name``,
    ``jobs import`` lines), never unnamed ones; ``items: []`` with ``prune`` (every named
    job deleted) is refused, nothing written, dry run or not, unless ``allow_empty``."""
    from scheduler.spec import JobSpec

    with store.connect(api.dsn) as conn:
        jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60, name="cli-named"))
        unnamed = jobs.add_job(conn, JobSpec.build(tenant="acme", interval_s=60)).job_id
        imported = jobs.import_name("acme", "0 2 * * *", "unix", "UTC", 1)
        jobs.import_jobs(conn, [JobSpec.build(tenant="acme", cron="0 2 * * *", name=imported)])
    assert acme.put("/v1/schedules/api-made", json={"interval_s": 60}).status_code == 201
    before = count_writes(db)
    refusal = {
        "field": "items",
        "detail": "items: must not be empty with prune (it would delete every named schedule)"
        " unless allow_empty is set",
    }
    for body in ({"items": [], "prune": True}, {"items": [], "prune": True, "dry_run": True}):
        refused = acme.post("/v1/schedules:apply", json=body)
        assert refused.status_code == 422, refused.text
        assert {key: refused.json()[key] for key in refusal} == refusal
    assert count_writes(db) == before
    # allow_empty without prune deletes nothing.
    assert acme.post("/v1/schedules:apply", json={"items": [], "allow_empty": True}).json()["deleted"] == []
    kept = acme.post("/v1/schedules:apply", json={"items": [{"name": "api-made", "interval_s": 60}], "prune": True})
    assert kept.json()["deleted"] == sorted(["cli-named", imported])
    assert acme.put("/v1/schedules/again", json={"interval_s": 60}).status_code == 201
    for dry_run in (True, False):
        body = {"items": [], "prune": True, "allow_empty": True, "dry_run": dry_run}  # the dry run first
        assert acme.post("/v1/schedules:apply", json=body).json() == {
            "created": [],
            "changed": [],
            "unchanged": [],
            "deleted": ["again", "api-made"],
            "dry_run": dry_run,
        }
    live = rows(db, "SELECT job_id, name FROM jobs WHERE tenant = 'acme' AND deleted_at IS NULL")
    assert live == [{"job_id": unnamed, "name": None}]


def test_concurrent_applies_with_prune_are_one_serial_order(api, db):
    """Three applies with prune, each declaring one other schedule, all in flight at once:
    apply read the set it prunes before it locked the tenant row, so each missed the
    others' new schedules and all three survived. Held at the tenant row (a transaction of
    the test locks it) until all three wait, then let go: exactly one survives, and the
    ``deleted`` lists chain them in one serial order (the first deletes ``old``, each next
    one the schedule of the one before it)."""
    token = api.key("acme", "tenant")
    with client(api, token) as acme:
        assert acme.put("/v1/schedules/old", json={"interval_s": 60}).status_code == 201
    names = ["setA-1", "setB-1", "setC-1"]
    results: dict[str, httpx.Response] = {}

    def apply(name: str) -> None:
        with client(api, token) as c:
            results[name] = c.post(
                "/v1/schedules:apply", json={"items": [{"name": name, "interval_s": 60}], "prune": True}
            )

    with psycopg.connect(api.dsn, row_factory=dict_row) as holder:
        holder.execute("SELECT tenant FROM tenants WHERE tenant = 'acme' FOR UPDATE")
        threads = [threading.Thread(target=apply, args=(name,)) for name in names]
        for thread in threads:
            thread.start()
        waiting_sql = (
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        deadline = time.monotonic() + 30
        while rows(db, waiting_sql) != [{"n": 3}]:
            assert time.monotonic() < deadline, rows(db, waiting_sql)
            time.sleep(0.02)
        holder.commit()
    for thread in threads:
        thread.join(60)
    assert sorted(results) == names and all(r.status_code == 200 for r in results.values()), results
    deleted = {name: results[name].json()["deleted"] for name in names}
    survivors = [r["name"] for r in rows(db, "SELECT name FROM jobs WHERE tenant = 'acme' AND deleted_at IS NULL")]
    order: list[str] = []  # each next apply deleted exactly the schedule before it
    for _ in names:
        after = [name for name in names if deleted[name] == [order[-1] if order else "old"]]
        if len(after) != 1:
            break
        order += after
    assert (len(order), survivors) == (3, [order[-1]]), (deleted, survivors)
    gone = rows(db, "SELECT name FROM jobs WHERE tenant = 'acme' AND deleted_at IS NOT NULL ORDER BY name")
    assert sorted(r["name"] for r in gone) == sorted(["old", *order[:-1]])


# ---------------------------------------------------------------- quota


def test_schedule_quota(api, acme, db):
    jobs.set_tenant(db, "acme", max_schedules=2)
    assert acme.put("/v1/schedules/one", json={"interval_s": 60}).status_code == 201
    assert acme.put("/v1/schedules/two", json={"interval_s": 60}).status_code == 201
    over = acme.put("/v1/schedules/three", json={"interval_s": 60})
    assert over.status_code == 422
    assert over.json()["field"] == "max_schedules"
    assert (
        over.json()["detail"]
        == "max_schedules: tenant 'acme' may have at most 2 schedules; it has 2 and this request would make 3"
    )
    # Editing one at the quota is fine; apply counts what prune removes.
    assert acme.put("/v1/schedules/two", json={"interval_s": 120}).status_code == 200
    items = [{"name": n, "interval_s": 60} for n in ("one", "two", "three")]
    assert acme.post("/v1/schedules:apply", json={"items": items, "dry_run": True}).status_code == 422
    assert acme.post("/v1/schedules:apply", json={"items": items}).json()["field"] == "max_schedules"
    swap = acme.post("/v1/schedules:apply", json={"items": [items[0], items[2]], "prune": True})
    assert swap.status_code == 200, swap.text
    assert swap.json()["created"] == ["three"] and swap.json()["deleted"] == ["two"]
    assert sorted(r["name"] for r in rows(db, "SELECT name FROM jobs WHERE deleted_at IS NULL")) == ["one", "three"]
    # Back to the default quota.
    jobs.set_tenant(db, "acme", clear_max_schedules=True)
    assert acme.put("/v1/schedules/four", json={"interval_s": 60}).status_code == 201
    assert rows(db, "SELECT max_schedules FROM tenants WHERE tenant = 'acme'") == [{"max_schedules": None}]


def test_the_quota_check_reads_at_most_quota_plus_one_jobs(api, acme, db):
    """A PUT counted every live job of its tenant to check the quota, with no index to use:
    every schedule write read the whole jobs table (over a second per PUT while a herd fired).
    It counts up to the quota + 1: below the quota as exactly as before, and a tenant whose
    quota was lowered below what it has is told so without a full count."""
    db.execute(
        "INSERT INTO jobs (partition_id, job_id, tenant, name, kind, interval_s, anchor_at, next_due_at, created_at)"
        " SELECT g % 1024, gen_random_uuid(), 'acme', 'old-' || g, 'interval', 3600, now(),"
        " now() + interval '1 hour', now()"
        " FROM generate_series(1, 500) AS g"
    )
    jobs.set_tenant(db, "acme", max_schedules=50)
    over = acme.put("/v1/schedules/one", json={"interval_s": 60})
    assert (over.status_code, over.json()["detail"]) == (
        422,
        "max_schedules: tenant 'acme' may have at most 50 schedules; it has more than 50 and this request would add 1",
    )
    assert rows(db, "SELECT count(*) AS n FROM jobs WHERE name = 'one'") == [{"n": 0}]
    jobs.set_tenant(db, "acme", max_schedules=600)
    assert acme.put("/v1/schedules/one", json={"interval_s": 60}).status_code == 201
    jobs.set_tenant(db, "acme", max_schedules=501)
    over = acme.put("/v1/schedules/two", json={"interval_s": 60})
    assert over.json()["detail"] == (
        "max_schedules: tenant 'acme' may have at most 501 schedules; it has 501 and this request would make 502"
    )


def test_url_targets_follow_the_operators_push_allow(api, api_factory, db):
    """A URL target is checked when saved with the operator's push_allow (as ``jobs add
    --push-allow``): loopback is refused by default, accepted where it is allowed."""
    from scheduler.settings import ApiSettings

    token = api.key("acme", "tenant")
    spec = {"interval_s": 60, "url": "http://127.0.0.1:9/hook"}
    with client(api, token) as default:
        refused = default.put("/v1/schedules/local", json=spec)
    assert (refused.status_code, refused.json()["field"]) == (422, "url")
    assert count_writes(db)["jobs"] == 0
    allowing = api_factory(ApiSettings(rate_per_s=100_000.0, burst=100_000, pool_size=2, push_allow="127.0.0.0/8"))
    with client(allowing, token) as c:
        assert c.put("/v1/schedules/local", json=spec).status_code == 201
    assert rows(db, "SELECT url FROM job_delivery") == [{"url": "http://127.0.0.1:9/hook"}]


def test_concurrent_creators_never_exceed_the_quota(api, db):
    """The quota is counted with the tenant row locked: 8 concurrent PUTs of new names
    against a quota of 3 leave exactly 3 schedules."""
    from concurrent.futures import ThreadPoolExecutor

    token = api.key("acme", "tenant")
    jobs.set_tenant(db, "acme", max_schedules=3)

    def put(n: int) -> int:
        with client(api, token) as c:
            return c.put(f"/v1/schedules/s{n}", json={"interval_s": 60}).status_code

    with ThreadPoolExecutor(8) as pool:
        statuses = sorted(pool.map(put, range(8)))
    assert statuses == [201] * 3 + [422] * 5
    assert len(rows(db, "SELECT 1 FROM jobs WHERE tenant = 'acme' AND deleted_at IS NULL")) == 3


def test_quota_cli(api, db):
    from click.testing import CliRunner

    from scheduler.cli import cli

    api.key("acme", "tenant")
    result = CliRunner().invoke(cli, ["tenants", "set", "acme", "--max-schedules", "7", "--dsn", api.dsn])
    assert result.output.strip().endswith("max_schedules=7"), result.output
    assert rows(db, "SELECT max_schedules FROM tenants WHERE tenant = 'acme'") == [{"max_schedules": 7}]


# ---------------------------------------------------------------- scoping and roles


def test_another_tenants_schedule_is_404_for_reads_and_writes(api, acme, db):
    acme.put("/v1/schedules/secret", json={"interval_s": 60})
    row = job(db, "secret")
    before = count_writes(db)
    with client(api, api.key("globex", "tenant")) as other:
        for method, path, body in (
            ("GET", "/v1/schedules/secret", None),
            ("DELETE", "/v1/schedules/secret", None),
            ("POST", "/v1/schedules/secret:pause", None),
            ("POST", "/v1/schedules/secret:resume", None),
            ("POST", "/v1/schedules/secret:trigger", {"request_id": "x"}),
            (
                "POST",
                "/v1/schedules/secret:backfill",
                {"since": "2024-01-01T00:00:00Z", "until": "2024-01-02T00:00:00Z"},
            ),
        ):
            got = other.request(method, path, json=body)
            assert got.status_code == 404, (method, path, got.text)
            assert got.json()["detail"] == "name: no schedule 'secret'"
        assert other.get("/v1/schedules").json() == {"items": [], "next_cursor": None}
        # PUT under the same name is the other tenant's own schedule, never acme's.
        assert other.put("/v1/schedules/secret", json={"interval_s": 5}, headers={"If-Match": "*"}).status_code == 412
        assert other.put("/v1/schedules/secret", json={"interval_s": 5}).status_code == 201
        pruned = other.post("/v1/schedules:apply", json={"items": [], "prune": True, "allow_empty": True})
        assert pruned.json()["deleted"] == ["secret"]
    assert job(db, "secret") == row
    assert count_writes(db)["runs"] == before["runs"] and count_writes(db)["requests"] == before["requests"]


@pytest.mark.parametrize("role", ["worker", "admin"])
def test_worker_and_admin_keys_are_403(api, db, role):
    token = api.key("acme" if role == "worker" else None, role)
    with client(api, api.key("acme", "tenant")) as acme:
        acme.put("/v1/schedules/s", json={"interval_s": 60})
    before = count_writes(db)
    with client(api, token) as c:
        for method, path, body in (
            ("GET", "/v1/schedules", None),
            ("GET", "/v1/schedules/s", None),
            ("PUT", "/v1/schedules/s", {"interval_s": 5}),
            ("DELETE", "/v1/schedules/s", None),
            ("POST", "/v1/schedules/s:pause", None),
            ("POST", "/v1/schedules/s:resume", None),
            ("POST", "/v1/schedules/s:trigger", None),
            ("POST", "/v1/schedules/s:backfill", {"since": "2024-01-01T00:00:00Z", "until": "2024-01-02T00:00:00Z"}),
            ("POST", "/v1/schedules:apply", {"items": [], "prune": True}),
        ):
            got = c.request(method, path, json=body)
            assert got.status_code == 403, (method, path, got.text)
    assert count_writes(db) == before
    assert httpx.get(f"{api.url}/v1/schedules").status_code == 401


# ---------------------------------------------------------------- bad input


BAD_FIELDS = [
    ({"interval_s": "60"}, "interval_s"),  # a string is not a JSON integer, even if it reads as one
    ({"interval_s": " 60 "}, "interval_s"),
    ({"interval_s": 60, "max_attempts": "5"}, "max_attempts"),
    ({"interval_s": 60, "jitter_s": "1"}, "jitter_s"),
    ({"interval_s": 60, "backoff_base_s": "1"}, "backoff_base_s"),
    ({"interval_s": 60, "max_age_s": True}, "max_age_s"),
    ({"cron": "61 * * * *"}, "cron"),
    ({"cron": 5}, "cron"),
    ({"cron": "0 2 * * *", "tz": "Mars/Olympus"}, "tz"),
    ({"cron": "0 2 * * *", "tz": ""}, "tz"),
    ({"cron": "0 2 * * *", "dialect": "quartz"}, "dialect"),
    ({"interval_s": 60, "tz": "UTC"}, "tz"),
    ({"interval_s": 0}, "interval_s"),
    ({"interval_s": 1.5}, "interval_s"),
    ({"interval_s": "٦٠"}, "interval_s"),
    ({"interval_s": True}, "interval_s"),
    ({"interval_s": 10**400}, "interval_s"),
    ({"at": "2030-01-01T00:00:00"}, "at"),
    ({"at": "2001-01-01T00:00:00Z"}, "at"),
    ({"at": 5}, "at"),
    ({}, "schedule"),
    ({"cron": "0 2 * * *", "interval_s": 60}, "schedule"),
    ({"interval_s": 60, "kind": "cron"}, "kind"),
    ({"interval_s": 60, "kind": "weekly"}, "kind"),
    ({"interval_s": 60, "misfire": "sometimes"}, "misfire"),
    ({"interval_s": 60, "misfire": "skip", "catchup_window_s": 10}, "catchup_window_s"),
    ({"interval_s": 60, "catchup_window_s": -1}, "catchup_window_s"),
    ({"interval_s": 60, "misfire_grace_s": 5}, "misfire_grace_s"),
    ({"interval_s": 60, "jitter_s": 60}, "jitter_s"),
    ({"interval_s": 60, "jitter_s": -1}, "jitter_s"),
    ({"interval_s": 60, "queue": "no spaces"}, "queue"),
    ({"interval_s": 60, "queue": "q", "url": "https://93.184.216.34/"}, "target"),
    ({"interval_s": 60, "url": "ftp://93.184.216.34/"}, "url"),
    ({"interval_s": 60, "url": "http://127.0.0.1/"}, "url"),
    ({"interval_s": 60, "url": "https://93.184.216.34/", "method": "GET"}, "method"),
    ({"interval_s": 60, "method": "POST"}, "method"),
    ({"interval_s": 60, "url": "https://93.184.216.34/", "headers": {"Host": "x"}}, "headers"),
    ({"interval_s": 60, "url": "https://93.184.216.34/", "headers": {"X-A": "a\nb"}}, "headers"),
    ({"interval_s": 60, "url": "https://93.184.216.34/", "headers": ["X-A: b"]}, "headers"),
    ({"interval_s": 60, "url": "https://93.184.216.34/", "timeout_s": 0}, "timeout_s"),
    ({"interval_s": 60, "url": "https://93.184.216.34/", "timeout_s": 301}, "timeout_s"),
    ({"interval_s": 60, "payload": "x" * 70_000}, "payload"),
    ({"interval_s": 60, "payload": {"s": "\u0000"}}, "payload"),
    ({"interval_s": 60, "max_attempts": 0}, "max_attempts"),
    ({"interval_s": 60, "max_attempts": 101}, "max_attempts"),
    ({"interval_s": 60, "backoff_base_s": 0}, "backoff_base_s"),
    ({"interval_s": 60, "backoff_base_s": 10, "backoff_cap_s": 5}, "backoff_base_s"),
    ({"interval_s": 60, "backoff_cap_s": 90_000}, "backoff_cap_s"),
    ({"interval_s": 60, "max_age_s": 0}, "max_age_s"),
    ({"interval_s": 60, "max_age_s": "31d"}, "max_age_s"),
    ({"interval_s": 60, "overlap": "queue"}, "overlap"),
    ({"interval_s": 60, "colour": "red"}, "colour"),
]


def test_bad_input_of_every_field_is_422_naming_it_and_writes_nothing(acme, db):
    before = count_writes(db)
    for body, field in BAD_FIELDS:
        got = acme.put("/v1/schedules/bad", json=body)
        assert got.status_code == 422, (body, got.text)
        assert got.headers["content-type"] == "application/problem+json"
        assert got.json()["field"] == field, (body, got.text)
        assert "\n" not in got.json()["detail"]
    assert count_writes(db) == before


def test_a_body_sent_as_another_content_type_is_told_so(acme, db):
    """A JSON object sent as text/plain was refused as 'must be a JSON object' with the bytes'
    Python repr echoed; the detail names the content type instead."""
    got = acme.put("/v1/schedules/ct", content=b'{"interval_s": 60}', headers={"Content-Type": "text/plain"})
    assert (got.status_code, got.json()["field"]) == (422, "body")
    assert got.json()["detail"] == "body: must be a JSON object, sent with Content-Type: application/json"
    assert acme.get("/v1/schedules/ct").status_code == 404


def test_messages_are_the_clis_naming_the_apis_fields(acme):
    """The CLI's rules, led by the body field; a rule naming another input names the body field,
    never a CLI flag."""

    def detail(body):
        return acme.put("/v1/schedules/bad", json=body).json()["detail"]

    assert detail({"interval_s": 0}) == "interval_s: must be positive (at least 1 second) (got 0)"
    assert detail({"cron": "0 2 * * *", "tz": "EST"}).startswith("tz: ")
    assert detail({}) == "schedule: give exactly one of cron, interval_s or at (got 'none')"
    assert detail({"interval_s": None}) == "schedule: give exactly one of cron, interval_s or at (got 'none')"
    assert detail({"interval_s": 60, "tz": "UTC"}) == "tz: applies to cron schedules only"
    assert detail({"interval_s": 60, "misfire": "all", "misfire_grace_s": 5}) == (
        "misfire_grace_s: misfire_grace_s is ignored by misfire all (it applies to once and skip)"
    )
    assert detail({"interval_s": 60, "misfire": "skip", "catchup_window_s": 5}) == (
        "catchup_window_s: catchup_window_s is ignored by misfire skip (it applies to all only)"
    )
    assert detail({"interval_s": 60, "queue": "q", "url": "https://example.com/"}) == (
        "target: give either queue or url, not both"
    )
    assert detail({"interval_s": 60, "timeout_s": 5}) == "timeout_s: applies to url targets only"
    assert detail({"interval_s": 60, "headers": {"X": "y"}}) == "headers: applies to url targets only"
    assert detail({"interval_s": 60, "backoff_base_s": 10, "backoff_cap_s": 5}) == (
        "backoff_base_s: must not exceed backoff_cap_s (5 s) (got 10)"
    )
    assert detail({"interval_s": 60, "max_attempts": 0}) == (
        "max_attempts: must be a whole number from 1 to 100 in ASCII digits (got 0)"
    )


def test_hostile_bodies_are_never_a_5xx(acme, db):
    before = count_writes(db)
    for content in (
        b"{",
        b"[]",
        b"null",
        b'"text"',
        b"\xff\xfe",
        b'{"interval_s": NaN}',
        b'{"interval_s": 60, "payload": NaN}',
        b'{"interval_s": 60, "payload": 1e999}',
        b'{"interval_s": 60, "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"interval_s": 60, "headers": {"X": 5}, "url": "https://93.184.216.34/"}',
        b'{"interval_s": 60, "payload": 1' + b"0" * 5000 + b"}",
        b'{"interval_s": "1' + b"0" * 5000 + b'"}',
    ):
        got = acme.put("/v1/schedules/bad", content=content, headers={"Content-Type": "application/json"})
        assert 400 <= got.status_code < 500, (content[:60], got.status_code, got.text)
    for name in ("x" * 201, "tab%09here"):
        got = acme.put(f"/v1/schedules/{name}", json={"interval_s": 60})
        assert (got.status_code, got.json()["field"]) == (422, "name")
    assert count_writes(db) == before


def test_text_the_store_cannot_keep_is_refused_or_not_found(acme, db):
    """NUL and unpaired surrogates reach no statement (PostgreSQL refuses them: it was a 5xx)."""
    acme.put("/v1/schedules/s", json={"interval_s": 60})
    before = count_writes(db)
    for path in ("/v1/schedules/a%00b", "/v1/schedules/" + "x" * 5000):
        status = 422 if "%00" in path else 404  # a NUL in a path is refused before any read
        assert acme.get(path).status_code == status
        assert acme.delete(path).status_code == status
        assert acme.post(path + ":pause").status_code == status
    for text in ("a\\u0000b", "\\ud800"):  # JSON escapes
        for path, body, field in (
            ("/v1/schedules/s:trigger", f'{{"request_id": "{text}"}}', "request_id"),
            ("/v1/schedules:apply", f'{{"items": [{{"name": "{text}", "interval_s": 60}}]}}', "items[0].name"),
            ("/v1/schedules/x", f'{{"interval_s": 60, "payload": {{"{text}": 1}}}}', "payload"),
        ):
            method = "PUT" if path == "/v1/schedules/x" else "POST"
            got = acme.request(method, path, content=body.encode(), headers={"Content-Type": "application/json"})
            assert (got.status_code, got.json()["field"]) == (422, field), (path, body, got.text)
    for params, field in (
        ({"queue": "a\x00b"}, "queue"),
        ({"name_prefix": "a\x00b"}, "name_prefix"),
        ({"cursor": "eyJuYW1lIjoiXHUwMDAwIn0"}, "cursor"),  # {"name":"\\u0000"}
    ):
        got = acme.get("/v1/schedules", params=params)
        assert (got.status_code, got.json()["field"]) == (422, field), (params, got.text)
    assert count_writes(db) == before


def test_a_field_given_as_null_is_the_same_as_left_out(acme, db):
    """docs/api.md, "The spec": null takes the default, like an omitted field."""
    spec = {**YEARLY, "queue": "reports", "max_attempts": 3}
    assert acme.put("/v1/schedules/nightly", json=spec).status_code == 201
    before = count_writes(db)
    nulls = dict.fromkeys(
        ["kind", "dialect", "interval_s", "at", "misfire", "catchup_window_s", "misfire_grace_s", "jitter_s", "url"]
        + ["method", "headers", "timeout_s", "payload", "backoff_base_s", "backoff_cap_s", "max_age_s", "overlap"]
    )
    same = acme.put("/v1/schedules/nightly", json={**spec, **nulls})
    assert (same.status_code, same.json()["outcome"]) == (200, "unchanged"), same.text
    assert count_writes(db) == before
    reset = acme.put("/v1/schedules/nightly", json={**spec, "max_attempts": None})
    assert (reset.status_code, reset.json()["outcome"]) == (200, "replaced"), reset.text
    assert reset.json()["schedule"]["max_attempts"] == 5
    # Every delivery field at its default again: no delivery row is kept for the job.
    assert rows(db, "SELECT max_attempts FROM job_delivery WHERE job_id = %s", job(db, "nightly")["job_id"]) == []
