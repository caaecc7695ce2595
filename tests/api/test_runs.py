"""``/v1/runs…`` over HTTP: list, claim, heartbeat, ack, nack, redrive (docs/api.md, "Runs and workers").

Each test checks the exact rows the store holds afterwards (state, attempt,
worker, error), not only the answers; another tenant's run must be exactly a
missing one (404, or ``lost`` in a batch) and change nothing.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
from helpers import pending_run, run_row, store_now

from scheduler import jobs, store
from scheduler.api import keys
from scheduler.delivery.lifecycle import RunKey
from scheduler.spec import JobSpec

JOB = "6c9f0f0e-8d3b-4f7e-9a43-1f0b0c1d2e3f"
RUN_ID_RULE = "must be <job id>.<nominal time in Unix microseconds> (a run's id as a claim returned it)"

S = timedelta(seconds=1)
PAYLOAD = '{"report": "sales", "to": ["ops@example.com"]}'


@pytest.fixture
def db(api) -> psycopg.Connection:
    with store.connect(api.dsn, application_name="pytest-runs") as conn:
        yield conn


def add_job(conn: psycopg.Connection, tenant: str, name: str, payload: str | None = None) -> uuid.UUID:
    job_id = jobs.add_job(conn, JobSpec.build(tenant=tenant, name=name, interval_s=3600)).job_id
    if payload is not None:
        conn.execute(
            "INSERT INTO job_delivery (partition_id, job_id, payload, max_attempts, backoff_base_s, backoff_cap_s)"
            " SELECT partition_id, job_id, %s, 5, 1, 300 FROM jobs WHERE job_id = %s",
            (payload, job_id),
        )
    return job_id


def due(conn: psycopg.Connection, job_id: uuid.UUID, seconds_ago: int) -> RunKey:
    """A pending run of ``job_id`` in queue ``default`` whose nominal time is ``seconds_ago`` before the store's now."""
    return pending_run(conn, job_id, store_now(conn).replace(microsecond=0) - seconds_ago * S)


def key_id(token: str) -> str:
    return token.split("_")[1]


def post(api, path: str, token: str, body: object) -> httpx.Response:
    """POST ``body`` as JSON (a str: sent as it is, as JSON)."""
    headers = {"Authorization": f"Bearer {token}"}
    if isinstance(body, str):
        return httpx.post(f"{api.url}{path}", content=body, headers={**headers, "Content-Type": "application/json"})
    return httpx.post(f"{api.url}{path}", json=body, headers=headers)


def get(api, path: str, token: str, **params: str) -> httpx.Response:
    return httpx.get(f"{api.url}{path}", params=params, headers={"Authorization": f"Bearer {token}"})


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def problem(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    return resp.json()


# ---------------------------------------------------------------- claim, ack, heartbeat, nack


def test_a_worker_key_claims_the_tenants_runs_then_acks_them_in_one_batch(api, db) -> None:
    worker = api.key("acme", "worker")
    job_id = add_job(db, "acme", "nightly", PAYLOAD)
    older, newer = due(db, job_id, 20), due(db, job_id, 10)
    add_job(db, "acme", "elsewhere")  # no run: nothing else to claim

    resp = post(api, "/v1/runs:claim", worker, {"queue": "default", "max": 10, "lease_s": 30, "worker": "w1"})
    assert resp.status_code == 200, resp.text
    runs = resp.json()["runs"]
    assert [r["id"] for r in runs] == [older.run_id, newer.run_id]
    first = runs[0]
    stored = run_row(db, older)
    assert first == {
        "id": older.run_id,
        "schedule": "nightly",
        "job_id": str(job_id),
        "tenant": "acme",
        "queue": "default",
        "origin": "schedule",
        "nominal_time": iso(older.nominal_time),
        "scheduled_at": iso(older.nominal_time),
        "attempt": 1,
        "payload": {"report": "sales", "to": ["ops@example.com"]},
        "lease_token": str(stored["lease_token"]),
        "leased_until": iso(stored["leased_until"]),
        "claimed_at": iso(stored["claimed_at"]),
    }
    assert stored["leased_until"] - stored["claimed_at"] == 30 * S
    assert (stored["state"], stored["attempt"], stored["worker"]) == ("leased", 1, f"api:{key_id(worker)}:w1")
    # Nothing left: a second claim is empty.
    assert post(api, "/v1/runs:claim", worker, {"max": 10}).json() == {"runs": []}

    acks = [{"id": r["id"], "lease_token": r["lease_token"]} for r in runs]
    resp = post(api, "/v1/runs:ack", worker, {"runs": acks})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "results": [{"id": older.run_id, "answer": "succeeded"}, {"id": newer.run_id, "answer": "succeeded"}]
    }
    for key in (older, newer):
        done = run_row(db, key)
        assert (done["state"], done["attempt"], done["leased_until"]) == ("succeeded", 1, None)
    # An ack re-sent with the token that succeeded (a lost reply) answers succeeded again, changing nothing.
    again = post(api, f"/v1/runs/{older.run_id}:ack", worker, {"lease_token": runs[0]["lease_token"]})
    assert again.status_code == 200, again.text
    assert again.json() == {"id": older.run_id, "answer": "succeeded"}
    # The list shows who claimed each run: the key id and the label the claim gave.
    listed = get(api, "/v1/runs", api.key("acme", "tenant")).json()["items"]
    label = f"api:{key_id(worker)}:w1"
    assert [(i["id"], i["state"], i["worker"]) for i in listed] == [
        (newer.run_id, "succeeded", label),
        (older.run_id, "succeeded", label),
    ]


def test_a_tenant_key_may_claim_too_and_the_tenant_is_always_the_keys(api, db) -> None:
    tenant = api.key("acme", "tenant")
    api.key("other", "tenant")
    mine = due(db, add_job(db, "acme", "a"), 10)
    theirs = due(db, add_job(db, "other", "b"), 20)
    resp = post(api, "/v1/runs:claim", tenant, {"max": 10})
    assert [r["id"] for r in resp.json()["runs"]] == [mine.run_id]
    assert run_row(db, theirs)["state"] == "pending"
    # The tenant is never a body field: naming one is refused, not obeyed.
    resp = post(api, "/v1/runs:claim", tenant, {"max": 10, "tenant": "other"})
    assert problem(resp, 422)["field"] == "tenant"
    assert run_row(db, theirs)["state"] == "pending"


def test_heartbeat_extends_the_lease_and_nack_fails_the_attempt(api, db) -> None:
    worker = api.key("acme", "worker")
    key = due(db, add_job(db, "acme", "nightly"), 10)
    (claimed,) = post(api, "/v1/runs:claim", worker, {"lease_s": 5}).json()["runs"]
    token = claimed["lease_token"]
    before = run_row(db, key)

    resp = post(api, f"/v1/runs/{key.run_id}:heartbeat", worker, {"lease_token": token, "lease_s": 600})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"id": key.run_id, "answer": "leased"}
    after = run_row(db, key)
    assert after["leased_until"] - before["claimed_at"] >= 600 * S
    assert (after["state"], after["attempt"]) == ("leased", 1)

    batch = post(api, "/v1/runs:heartbeat", worker, {"lease_s": 60, "runs": [{"id": key.run_id, "lease_token": token}]})
    assert batch.json() == {"results": [{"id": key.run_id, "answer": "leased"}]}

    resp = post(
        api,
        f"/v1/runs/{key.run_id}:nack",
        worker,
        {"lease_token": token, "error": "upstream 503", "retryable": True, "retry_after_s": 120},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"id": key.run_id, "answer": "failed"}
    failed = run_row(db, key)
    assert (failed["state"], failed["attempt"], failed["retryable"], failed["last_error"]) == (
        "failed", 1, True, "upstream 503",
    )  # fmt: skip
    assert failed["available_at"] - failed["leased_until"] == 120 * S


def test_a_batch_nack_with_retryable_false_and_answers_in_input_order(api, db) -> None:
    worker = api.key("acme", "worker")
    job_id = add_job(db, "acme", "nightly")
    a, b = due(db, job_id, 20), due(db, job_id, 10)
    ra, rb = post(api, "/v1/runs:claim", worker, {"max": 2}).json()["runs"]
    stranger = str(uuid.uuid4())
    resp = post(
        api,
        "/v1/runs:nack",
        worker,
        {
            "runs": [
                {"id": b.run_id, "lease_token": stranger, "error": "x"},
                {"id": a.run_id, "lease_token": ra["lease_token"], "error": "bad payload", "retryable": False},
            ]
        },
    )
    assert resp.json() == {"results": [{"id": b.run_id, "answer": "lost"}, {"id": a.run_id, "answer": "failed"}]}
    assert (run_row(db, a)["state"], run_row(db, a)["retryable"]) == ("failed", False)
    assert (run_row(db, b)["state"], run_row(db, b)["lease_token"]) == ("leased", uuid.UUID(rb["lease_token"]))


# ---------------------------------------------------------------- refusals


def test_a_stale_token_is_refused_409_and_changes_nothing(api, db) -> None:
    worker = api.key("acme", "worker")
    key = due(db, add_job(db, "acme", "nightly"), 10)
    (claimed,) = post(api, "/v1/runs:claim", worker, {}).json()["runs"]
    before = run_row(db, key)
    stale = str(uuid.uuid4())
    for verb, body in (
        ("ack", {"lease_token": stale}),
        ("heartbeat", {"lease_token": stale}),
        ("nack", {"lease_token": stale, "error": "x"}),
    ):
        body_ = problem(post(api, f"/v1/runs/{key.run_id}:{verb}", worker, body), 409)
        assert body_["field"] == "lease_token"
        assert body_["detail"] == (
            f"lease_token: refused (lost): this token no longer holds run {key.run_id} (it is leased: another "
            f"attempt holds it, or it finished); the {verb} changed nothing"
        )
    assert run_row(db, key) == before
    # The batch form answers lost for the same.
    resp = post(api, "/v1/runs:ack", worker, {"runs": [{"id": key.run_id, "lease_token": stale}]})
    assert resp.json() == {"results": [{"id": key.run_id, "answer": "lost"}]}
    # After the ack, the same token cannot nack it.
    assert post(api, f"/v1/runs/{key.run_id}:ack", worker, {"lease_token": claimed["lease_token"]}).status_code == 200
    detail = problem(post(api, f"/v1/runs/{key.run_id}:nack", worker, {"lease_token": claimed["lease_token"]}), 409)
    assert "(it is succeeded:" in detail["detail"]
    assert run_row(db, key)["state"] == "succeeded"


def test_a_canceled_run_refuses_its_token_409_canceled(api, db) -> None:
    worker = api.key("acme", "worker")
    key = due(db, add_job(db, "acme", "nightly"), 10)
    (claimed,) = post(api, "/v1/runs:claim", worker, {}).json()["runs"]
    db.execute(
        "UPDATE runs SET state = 'canceled' WHERE partition_id = %s AND job_id = %s AND nominal_time = %s",
        (key.partition_id, key.job_id, key.nominal_time),
    )
    body = problem(post(api, f"/v1/runs/{key.run_id}:heartbeat", worker, {"lease_token": claimed["lease_token"]}), 409)
    assert body["detail"].startswith(f"lease_token: refused (canceled): run {key.run_id} was canceled")
    batch = post(api, "/v1/runs:ack", worker, {"runs": [{"id": key.run_id, "lease_token": claimed["lease_token"]}]})
    assert batch.json() == {"results": [{"id": key.run_id, "answer": "canceled"}]}
    assert run_row(db, key)["state"] == "canceled"


def test_another_tenants_run_is_404_exactly_like_a_missing_one_and_stays_untouched(api, db) -> None:
    acme = api.key("acme", "worker")
    other_worker, other_tenant = api.key("other", "worker"), api.key("other", "tenant")
    key = due(db, add_job(db, "acme", "nightly"), 10)
    (claimed,) = post(api, "/v1/runs:claim", acme, {}).json()["runs"]
    token = claimed["lease_token"]
    before = run_row(db, key)
    missing = RunKey.of(uuid.uuid4(), key.nominal_time).run_id
    for run_id in (key.run_id, missing):
        for verb, body in (
            ("ack", {"lease_token": token}),
            ("heartbeat", {"lease_token": token}),
            ("nack", {"lease_token": token}),
        ):
            body_ = problem(post(api, f"/v1/runs/{run_id}:{verb}", other_worker, body), 404)
            assert (body_["field"], body_["detail"]) == ("id", f"id: no run {run_id}")
        body_ = problem(post(api, f"/v1/runs/{run_id}:redrive", other_tenant, None), 404)
        assert body_["detail"] == f"id: no run {run_id}"
    # Even with the right token, the batch forms answer lost and change nothing.
    for verb in ("ack", "nack", "heartbeat"):
        resp = post(api, f"/v1/runs:{verb}", other_worker, {"runs": [{"id": key.run_id, "lease_token": token}]})
        assert resp.json() == {"results": [{"id": key.run_id, "answer": "lost"}]}
    assert get(api, "/v1/runs", other_tenant).json() == {"items": [], "next_cursor": None}
    assert post(api, "/v1/runs:claim", other_worker, {"max": 10}).json() == {"runs": []}
    assert run_row(db, key) == before


def test_a_worker_key_can_claim_and_ack_but_not_list_or_redrive(api, db) -> None:
    worker = api.key("acme", "worker")
    admin = api.key(None, "admin")
    key = due(db, add_job(db, "acme", "nightly"), 10)
    for resp in (get(api, "/v1/runs", worker), post(api, f"/v1/runs/{key.run_id}:redrive", worker, None)):
        body = problem(resp, 403)
        assert body["detail"] == "role: a worker key cannot use this endpoint (it needs a tenant key)"
    body = problem(post(api, "/v1/runs:claim", admin, {}), 403)
    assert body["detail"].startswith("role: ")
    assert run_row(db, key)["state"] == "pending"


def test_no_key_or_a_revoked_key_is_401(api, db) -> None:
    worker = api.key("acme", "worker")
    assert httpx.post(f"{api.url}/v1/runs:claim", json={}).status_code == 401
    with store.connect(api.dsn) as conn:
        keys.revoke(conn, key_id(worker))
    resp = post(api, "/v1/runs:claim", worker, {})
    assert problem(resp, 401) == {"type": "about:blank", "title": "Unauthorized", "status": 401}


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/runs:claim", {"max": 0}, "max"),
        ("/v1/runs:claim", {"max": 1001}, "max"),
        ("/v1/runs:claim", {"max": "ten"}, "max"),
        ("/v1/runs:claim", {"lease_s": 0}, "lease_s"),
        ("/v1/runs:claim", {"lease_s": 0.0001}, "lease_s"),
        ("/v1/runs:claim", {"lease_s": 3601}, "lease_s"),
        ("/v1/runs:claim", {"queue": "no spaces"}, "queue"),
        ("/v1/runs:claim", {"queue": "q" * 101}, "queue"),
        ("/v1/runs:claim", {"worker": "w" * 101}, "worker"),
        ("/v1/runs:claim", [], "body"),
        ("/v1/runs:ack", {"runs": [{"id": "nope", "lease_token": str(uuid.uuid4())}]}, "runs[0].id"),
        ("/v1/runs:ack", {"runs": [{"id": f"{uuid.uuid4()}.1", "lease_token": "x"}]}, "runs[0].lease_token"),
        ("/v1/runs:ack", {"runs": [{"id": f"{uuid.uuid4()}.1", "lease_token": str(uuid.uuid4())}] * 1001}, "runs"),
        ("/v1/runs:ack", {}, "runs"),
        (
            "/v1/runs:ack",
            {"runs": [{"id": "00000000-0000-0000-0000-000000000001.1", "lease_token": str(uuid.uuid4())}] * 2},
            "runs[1].id",
        ),
        ("/v1/runs:claim", {"max": True}, "max"),
        ("/v1/runs:claim", {"max": "5"}, "max"),
        ("/v1/runs:claim", '{"lease_s": NaN}', "lease_s"),  # Python's JSON reads NaN
        ("/v1/runs:claim", '{"lease_s": 1e999}', "lease_s"),
        (
            "/v1/runs:nack",
            {"runs": [{"id": f"{uuid.uuid4()}.1", "lease_token": str(uuid.uuid4()), "retryable": "no"}]},
            "runs[0].retryable",
        ),
        (
            "/v1/runs:nack",
            {"runs": [{"id": f"{uuid.uuid4()}.1", "lease_token": str(uuid.uuid4()), "retry_after_s": -1}]},
            "runs[0].retry_after_s",
        ),
        (
            "/v1/runs:nack",
            {"runs": [{"id": f"{uuid.uuid4()}.1", "lease_token": str(uuid.uuid4()), "error": "e" * 2001}]},
            "runs[0].error",
        ),
        ("/v1/runs:heartbeat", {"lease_s": -5, "runs": []}, "lease_s"),
        ("/v1/runs:heartbeat", {"lease_s": 0.0001, "runs": []}, "lease_s"),
        (f"/v1/runs/{uuid.uuid4()}.1:ack", {}, "lease_token"),
        ("/v1/runs/not-a-run:ack", {"lease_token": str(uuid.uuid4())}, "id"),
        (f"/v1/runs/{str(uuid.uuid4()).upper()}.1:ack", {"lease_token": str(uuid.uuid4())}, "id"),
        (f"/v1/runs/{uuid.uuid4()}.123456789012345678:heartbeat", {"lease_token": str(uuid.uuid4())}, "id"),
        ("/v1/runs/x.1:redrive", None, "id"),
    ],
)
def test_bad_input_is_422_naming_the_field(api, path, body, field) -> None:
    token = api.key("acme", "tenant")
    resp = post(api, path, token, body)
    assert problem(resp, 422)["field"] == field, resp.text


@pytest.mark.parametrize(
    ("path", "body", "detail"),
    [
        # A person's rule, never the regular expression behind it.
        (
            "/v1/runs:claim",
            {"queue": "no spaces"},
            "queue: must be 1-100 characters of letters, digits and . _ - (got 'no spaces')",
        ),
        ("/v1/runs:claim", {"worker": "a b"}, "worker: must be printable ASCII without spaces (got 'a b')"),
        (
            "/v1/runs:ack",
            {"runs": [{"id": "nope", "lease_token": str(uuid.uuid4())}]},
            "runs[0].id: must be <job id>.<nominal time in Unix microseconds> (a run's id as a claim returned it)"
            " (got 'nope')",
        ),
        # Bounds as written (3600, not 3600.0); JSON's spelling of what was sent (true, not True).
        ("/v1/runs:claim", {"lease_s": 3601}, "lease_s: must be <= 3600 (got 3601)"),
        ("/v1/runs:claim", {"lease_s": 0.5}, "lease_s: must be >= 1 (got 0.5)"),
        ("/v1/runs:claim", {"max": True}, "max: must be a whole number (got true)"),
        (  # a large bound in digits, not 2.592e+06
            f"/v1/runs/{uuid.uuid4()}.1:nack",
            {"lease_token": str(uuid.uuid4()), "error": "x", "retry_after_s": 1e308},
            "retry_after_s: must be <= 2592000 (got 1e+308)",
        ),
        (
            f"/v1/runs/{uuid.uuid4()}.1:ack",
            {"lease_token": "nope"},
            "lease_token: must be a UUID (32 hex digits as 8-4-4-4-12) (got 'nope')",
        ),
        # Another spelling of a run id (a leading zero, -0, before the year 1) is refused in
        # the API's words, not the CLI's ("as listed by `scheduler runs list`").
        *(
            (
                f"/v1/runs/{JOB}.{time}:heartbeat",
                {"lease_token": str(uuid.uuid4())},
                f"id: {RUN_ID_RULE} (got '{JOB}.{time}')",
            )
            for time in ("01", "-0", "00", "-62135596800000001")
        ),
        *(
            (
                f"/v1/runs/{JOB}.-62135596800000001:{action}",  # the pattern's, before the year 1
                None,
                f"id: {RUN_ID_RULE} (got '{JOB}.-62135596800000001')",
            )
            for action in ("cancel", "redrive")
        ),
        (
            "/v1/runs:ack",
            {"runs": [{"id": f"{JOB}.0100", "lease_token": str(uuid.uuid4())}]},
            f"runs[0].id: {RUN_ID_RULE} (got '{JOB}.0100')",
        ),
    ],
)
def test_bad_input_details_read_as_rules(api, path, body, detail) -> None:
    token = api.key("acme", "tenant")
    assert problem(post(api, path, token, body), 422)["detail"] == detail


@pytest.mark.parametrize(
    ("params", "detail"),
    [
        ({"since": "garbage"}, "since: not an ISO 8601 instant (expected e.g. 2024-01-01T00:00:00Z) (got 'garbage')"),
        (
            {"until": "2030-01-01T00:00:00"},
            "until: instant has no UTC offset; add Z or an offset such as +01:00 (got '2030-01-01T00:00:00')",
        ),
    ],
)
def test_bad_instants_read_as_the_clis_rules(api, params, detail) -> None:
    token = api.key("acme", "tenant")
    resp = httpx.get(f"{api.url}/v1/runs", params=params, headers={"Authorization": f"Bearer {token}"})
    assert problem(resp, 422)["detail"] == detail


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"state": "bogus"}, "state"),
        ({"since": "2030-01-01T00:00:00"}, "since"),  # no offset: ambiguous
        ({"until": "tomorrow"}, "until"),
        ({"cursor": "!!"}, "cursor"),
        ({"cursor": "bm90LWEta2V5"}, "cursor"),  # base64 of JSON-less text
        ({"cursor": "IngiIg"}, "cursor"),  # base64 of the JSON string "x": not a run id
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"schedule": ""}, "schedule"),
    ],
)
def test_bad_list_parameters_are_422_naming_the_field(api, params, field) -> None:
    token = api.key("acme", "tenant")
    assert problem(get(api, "/v1/runs", token, **params), 422)["field"] == field


def test_a_far_future_run_id_is_404_not_a_5xx(api) -> None:
    worker = api.key("acme", "worker")
    run_id = f"{uuid.uuid4()}.99999999999999999"
    resp = post(api, f"/v1/runs/{run_id}:ack", worker, {"lease_token": str(uuid.uuid4())})
    assert problem(resp, 404)["detail"] == f"id: no run {run_id}"


# ---------------------------------------------------------------- list


def test_list_pages_newest_first_with_filters(api, db) -> None:
    tenant = api.key("acme", "tenant")
    worker = api.key("acme", "worker")
    nightly, hourly = add_job(db, "acme", "nightly"), add_job(db, "acme", "hourly")
    n1, n2 = due(db, nightly, 300), due(db, nightly, 100)
    h1 = due(db, hourly, 200)
    add_job(db, "other", "nightly")  # same name, another tenant: never listed
    due(db, jobs.add_job(db, JobSpec.build(tenant="other", name="x", interval_s=60)).job_id, 150)

    seen, cursor = [], None
    while True:
        params = {"limit": "1"} | ({"cursor": cursor} if cursor else {})
        page = get(api, "/v1/runs", tenant, **params).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [n2.run_id, h1.run_id, n1.run_id]

    page = get(api, "/v1/runs", tenant, schedule="nightly").json()
    assert [i["id"] for i in page["items"]] == [n2.run_id, n1.run_id]
    assert page["next_cursor"] is None
    item = page["items"][0]
    assert {k: item[k] for k in ("schedule", "job_id", "queue", "state", "origin", "attempt")} == {
        "schedule": "nightly", "job_id": str(nightly), "queue": "default", "state": "pending",
        "origin": "schedule", "attempt": 0,
    }  # fmt: skip
    assert item["nominal_time"] == iso(n2.nominal_time)

    since, until = iso(n1.nominal_time + S), iso(n2.nominal_time)
    window = get(api, "/v1/runs", tenant, since=since, until=until).json()
    assert [i["id"] for i in window["items"]] == [h1.run_id]

    (claimed,) = post(api, "/v1/runs:claim", worker, {}).json()["runs"]
    assert claimed["id"] == n1.run_id
    leased = get(api, "/v1/runs", tenant, state="leased").json()
    assert [(i["id"], i["state"], i["attempt"], i["worker"]) for i in leased["items"]] == [
        (n1.run_id, "leased", 1, f"api:{key_id(worker)}")
    ]
    assert item["worker"] is None  # never claimed
    assert get(api, "/v1/runs", tenant, schedule="nope").json() == {"items": [], "next_cursor": None}


def test_a_listed_run_shows_the_schedule_name_it_was_fired_under_as_its_claim_does(api, db) -> None:
    """A schedule renamed after a run was fired: the run keeps its name in the list, as in a
    claim and in ``scheduler runs list`` (docs/delivery.md); ``?schedule=`` still finds the
    schedule's runs by its current name."""
    tenant = api.key("acme", "tenant")
    worker = api.key("acme", "worker")
    job_id = add_job(db, "acme", "nightly")
    old = due(db, job_id, 200)
    db.execute(
        "UPDATE runs SET job_name = 'nightly' WHERE partition_id = %s AND job_id = %s AND nominal_time = %s",
        (old.partition_id, old.job_id, old.nominal_time),
    )  # as the firing statement writes it
    db.execute("UPDATE jobs SET name = 'daily' WHERE job_id = %s", (job_id,))
    new = due(db, job_id, 100)
    db.execute(
        "UPDATE runs SET job_name = 'daily' WHERE partition_id = %s AND job_id = %s AND nominal_time = %s",
        (new.partition_id, new.job_id, new.nominal_time),
    )
    page = get(api, "/v1/runs", tenant, schedule="daily").json()
    assert [(i["id"], i["schedule"]) for i in page["items"]] == [(new.run_id, "daily"), (old.run_id, "nightly")]
    assert get(api, "/v1/runs", tenant, schedule="nightly").json()["items"] == []
    claimed = post(api, "/v1/runs:claim", worker, {"max": 2}).json()["runs"]
    assert [(c["id"], c["schedule"]) for c in claimed] == [(old.run_id, "nightly"), (new.run_id, "daily")]


# ---------------------------------------------------------------- redrive


def mark_dead(db, key) -> None:
    """Run ``key`` dead after 5 attempts, last error 'boom'."""
    db.execute(
        "UPDATE runs SET state = 'dead', attempt = 5, last_error = 'boom', finished_at = now()"
        " WHERE partition_id = %s AND job_id = %s AND nominal_time = %s",
        (key.partition_id, key.job_id, key.nominal_time),
    )


def test_redrive_a_dead_run_back_to_pending_and_409_for_a_live_one(api, db) -> None:
    tenant = api.key("acme", "tenant")
    worker = api.key("acme", "worker")
    job_id = add_job(db, "acme", "nightly")
    dead, live = due(db, job_id, 20), due(db, job_id, 10)
    mark_dead(db, dead)
    resp = post(api, f"/v1/runs/{dead.run_id}:redrive", tenant, None)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"id": dead.run_id, "state": "pending"}
    row = run_row(db, dead)
    assert (row["state"], row["attempt"], row["last_error"], row["finished_at"]) == ("pending", 0, "boom", None)

    body = problem(post(api, f"/v1/runs/{live.run_id}:redrive", tenant, None), 409)
    assert body["field"] == "id"
    assert body["detail"] == (
        f"id: run {live.run_id} is pending; only a dead or canceled run can be redriven (nothing changed)"
    )
    # The redriven run is claimable again, as attempt 1 of a fresh budget.
    claimed = post(api, "/v1/runs:claim", worker, {"max": 5}).json()["runs"]
    assert [(r["id"], r["attempt"]) for r in claimed] == [(dead.run_id, 1), (live.run_id, 1)]


def test_a_redriven_run_that_succeeds_shows_no_error(api, db) -> None:
    """The trial: a dead run, redriven and then acked, still listed its old last_error."""
    tenant = api.key("acme", "tenant")
    worker = api.key("acme", "worker")
    job_id = add_job(db, "acme", "nightly")
    dead = due(db, job_id, 20)
    mark_dead(db, dead)
    assert post(api, f"/v1/runs/{dead.run_id}:redrive", tenant, None).status_code == 200
    (claimed,) = post(api, "/v1/runs:claim", worker, {"max": 5}).json()["runs"]
    acked = post(api, "/v1/runs:ack", worker, {"runs": [{"id": dead.run_id, "lease_token": claimed["lease_token"]}]})
    assert acked.json() == {"results": [{"id": dead.run_id, "answer": "succeeded"}]}
    listed = get(api, "/v1/runs", tenant, schedule="nightly").json()["items"]
    assert [(r["id"], r["state"], r["last_error"]) for r in listed] == [(dead.run_id, "succeeded", None)]
    described = get(api, "/v1/schedules/nightly", tenant).json()["recent_runs"]
    assert [(r["id"], r["state"], r["last_error"]) for r in described] == [(dead.run_id, "succeeded", None)]


def test_a_held_buffer_one_run_shows_no_available_at_in_both_listings(api, db) -> None:
    """A buffer_one run waiting behind an unfinished one is pending with available_at null:
    `GET /v1/runs` showed it, a schedule's recent runs did not (the re-trial)."""
    tenant = api.key("acme", "tenant")
    job_id = add_job(db, "acme", "nightly")
    ready = due(db, job_id, 20)
    held = due(db, job_id, 10)
    db.execute(
        "UPDATE runs SET available_at = NULL WHERE partition_id = %s AND job_id = %s AND nominal_time = %s",
        (held.partition_id, held.job_id, held.nominal_time),
    )  # as the firing statement writes a buffer_one run behind an unfinished one
    listed = get(api, "/v1/runs", tenant, schedule="nightly").json()["items"]
    described = get(api, "/v1/schedules/nightly", tenant).json()["recent_runs"]
    for runs in (listed, described):
        assert [(r["id"], r["state"], r["available_at"]) for r in runs] == [
            (held.run_id, "pending", None),
            (ready.run_id, "pending", iso(ready.nominal_time)),
        ]


def test_cancel_an_unfinished_run_and_409_for_a_finished_one(api, db) -> None:
    """``POST /v1/runs/{id}:cancel``: the leased run ends canceled, its worker's heartbeat is
    refused ``canceled``; a pending one is never claimed; a finished one is a 409 naming its
    state; another tenant's is a 404; a worker key may not cancel (nothing changed)."""
    tenant = api.key("acme", "tenant")
    worker = api.key("acme", "worker")
    job_id = add_job(db, "acme", "nightly")
    leased, pending = due(db, job_id, 30), due(db, job_id, 20)
    (claimed,) = post(api, "/v1/runs:claim", worker, {"max": 1}).json()["runs"]
    assert claimed["id"] == leased.run_id
    theirs = due(db, add_job(db, "globex", "nightly"), 10)
    assert problem(post(api, f"/v1/runs/{leased.run_id}:cancel", worker, None), 403)["detail"].startswith("role: ")
    assert run_row(db, leased)["state"] == "leased"

    resp = post(api, f"/v1/runs/{leased.run_id}:cancel", tenant, None)
    assert (resp.status_code, resp.json()) == (200, {"id": leased.run_id, "state": "canceled"})
    row = run_row(db, leased)
    assert (row["state"], row["leased_until"]) == ("canceled", None)
    assert row["last_error"] == f"canceled by an API key {key_id(tenant)}"
    body = problem(
        post(api, f"/v1/runs/{leased.run_id}:heartbeat", worker, {"lease_token": claimed["lease_token"]}), 409
    )
    assert body["detail"].startswith(f"lease_token: refused (canceled): run {leased.run_id} was canceled")
    assert post(api, f"/v1/runs/{pending.run_id}:cancel", tenant, None).status_code == 200
    assert post(api, "/v1/runs:claim", worker, {"max": 5}).json()["runs"] == []

    body = problem(post(api, f"/v1/runs/{leased.run_id}:cancel", tenant, None), 409)
    assert (body["field"], body["detail"]) == (
        "id",
        f"id: run {leased.run_id} is canceled; only a pending, leased or failed run can be canceled (nothing changed)",
    )
    body = problem(post(api, f"/v1/runs/{theirs.run_id}:cancel", tenant, None), 404)
    assert (body["field"], body["detail"]) == ("id", f"id: no run {theirs.run_id}")
    assert run_row(db, theirs)["state"] == "pending"
    assert problem(post(api, "/v1/runs/nope:cancel", tenant, None), 422)["field"] == "id"


def test_a_run_of_a_deleted_schedule_is_not_redriven_409(api, db) -> None:
    tenant = api.key("acme", "tenant")
    job_id = add_job(db, "acme", "weekly")
    dead = due(db, job_id, 20)
    mark_dead(db, dead)
    deleted = httpx.delete(f"{api.url}/v1/schedules/weekly", headers={"Authorization": f"Bearer {tenant}"})
    assert deleted.status_code == 204
    before = run_row(db, dead)
    body = problem(post(api, f"/v1/runs/{dead.run_id}:redrive", tenant, None), 409)
    assert body["field"] == "id"
    assert body["detail"] == (
        f"id: run {dead.run_id} is of job {job_id}, which is deleted; only a run of a live job can be redriven"
        " (nothing changed)"
    )
    assert run_row(db, dead) == before


def test_the_apis_store_sessions_never_prepare_statements_server_side(api, db) -> None:
    # A generic plan made while runs was empty would seq-scan every run on each claim, ack and
    # heartbeat afterwards (scheduler/store/session.py PREPARE_THRESHOLD): the API's pool plans
    # each statement like the engine's own sessions.
    worker = api.key("acme", "worker")
    key = due(db, add_job(db, "acme", "nightly"), 10)
    for _ in range(8):  # past psycopg's default threshold (5 executions)
        assert post(api, "/v1/runs:claim", worker, {"queue": "empty"}).json() == {"runs": []}
    with api.server.app.state.pool.connection() as conn:
        assert conn.prepare_threshold is None
        assert conn.execute("SELECT count(*) AS n FROM pg_prepared_statements").fetchone()["n"] == 0
    assert run_row(db, key)["state"] == "pending"


def test_the_apis_store_sessions_read_times_in_utc_and_keep_the_dsns_options(pg_dsn) -> None:
    # As the engine's sessions (scheduler/store/session.py session_options): TimeZone UTC
    # whatever the server's default, the DSN's own options kept, the API's timeout on top.
    from datetime import UTC

    from scheduler.api.app import STATEMENT_TIMEOUT_S, _pool

    sep = "&" if "?" in pg_dsn else "?"
    pool = _pool(f"{pg_dsn}{sep}options=-c%20work_mem%3D7MB%20-c%20TimeZone%3DAsia/Tokyo", 1)
    pool.open(wait=True)
    try:
        with pool.connection() as conn:
            shown = {n: conn.execute(f"SHOW {n}").fetchone()[n] for n in ("work_mem", "TimeZone", "statement_timeout")}
            assert shown == {"work_mem": "7MB", "TimeZone": "UTC", "statement_timeout": f"{int(STATEMENT_TIMEOUT_S)}s"}
            assert conn.execute("SELECT now() AS t").fetchone()["t"].tzinfo is UTC
    finally:
        pool.close()
