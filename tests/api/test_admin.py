"""Admin endpoints over HTTP: tenants, keys, status, verify (as the CLI commands they mirror)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from scheduler import jobs, store
from scheduler.api import keys
from scheduler.status import cluster_status


@pytest.fixture
def admin(api):
    token = api.key(None, "admin")
    client = httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"})
    yield client
    client.close()


def _problem(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    return response.json()


def test_tenants_create_list_page_and_update(admin, api):
    for name, weight in (("b-team", 2), ("a-team", 1), ("c/team:x@y", 5)):
        response = admin.post("/v1/tenants", json={"tenant": name, "weight": weight})
        assert response.status_code == 201, response.text
        created = response.json()
        assert created == {
            "tenant": name,
            "weight": weight,
            "max_rate": None,
            "max_schedules": None,
            "jobs": 0,
            "created_at": created["created_at"],
        }
        assert created["created_at"].endswith("Z")
    first = admin.get("/v1/tenants", params={"limit": 2}).json()
    assert [t["tenant"] for t in first["items"]] == ["a-team", "b-team"]
    assert first["items"][0]["jobs"] == 0 and first["items"][0]["created_at"].endswith("Z")
    second = admin.get("/v1/tenants", params={"limit": 2, "cursor": first["next_cursor"]}).json()
    assert [t["tenant"] for t in second["items"]] == ["c/team:x@y"]
    assert second["next_cursor"] is None

    changed = admin.patch("/v1/tenants/c/team:x@y", json={"weight": 7, "max_rate": 2.5})
    assert changed.status_code == 200, changed.text
    assert changed.json() == second["items"][0] | {"weight": 7, "max_rate": 2.5}
    cleared = admin.patch("/v1/tenants/c/team:x@y", json={"max_rate": None}).json()
    assert (cleared["weight"], cleared["max_rate"]) == (7, None)
    with store.connect(api.dsn) as conn:
        assert {r["tenant"]: (r["weight"], r["max_rate"]) for r in jobs.list_tenants(conn)} == {
            "a-team": (1, None),
            "b-team": (2, None),
            "c/team:x@y": (7, None),
        }


def _listed(admin, tenant: str) -> dict:
    [item] = [t for t in admin.get("/v1/tenants").json()["items"] if t["tenant"] == tenant]
    return item


def test_tenant_write_responses_are_what_a_get_returns(admin, api):
    """POST and PATCH answered ``jobs`` and ``created_at`` null (or a made-up 0) where the
    list shows the stored values: every tenant response is the same read of the row."""
    created = admin.post("/v1/tenants", json={"tenant": "acme", "weight": 3, "max_rate": 1.5})
    assert created.status_code == 201, created.text
    assert created.json() == _listed(admin, "acme")
    schedule = httpx.put(
        f"{api.url}/v1/schedules/hourly",
        json={"kind": "interval", "interval_s": 3600},
        headers={"Authorization": f"Bearer {api.key('acme', 'tenant')}"},
    )
    assert schedule.status_code in (200, 201), schedule.text
    changed = admin.patch("/v1/tenants/acme", json={"weight": 4})
    assert changed.status_code == 200, changed.text
    assert changed.json() == _listed(admin, "acme")
    assert (changed.json()["jobs"], changed.json()["weight"], changed.json()["max_rate"]) == (1, 4, 1.5)
    assert changed.json()["created_at"] == created.json()["created_at"]


def test_patch_sets_and_clears_the_schedule_quota(admin, api):
    """``tenants set --max-schedules`` had no HTTP form: PATCH takes ``max_schedules`` (a
    whole number 0-100000000; null: back to the default quota) and every tenant response
    shows it; PUT then refuses a schedule over it."""
    admin.post("/v1/tenants", json={"tenant": "acme"})
    changed = admin.patch("/v1/tenants/acme", json={"max_schedules": 1})
    assert changed.status_code == 200, changed.text
    assert changed.json()["max_schedules"] == 1
    assert _listed(admin, "acme")["max_schedules"] == 1
    tenant = {"Authorization": f"Bearer {api.key('acme', 'tenant')}"}
    spec = {"kind": "interval", "interval_s": 60}
    assert httpx.put(f"{api.url}/v1/schedules/one", json=spec, headers=tenant).status_code == 201
    over = httpx.put(f"{api.url}/v1/schedules/two", json=spec, headers=tenant)
    assert (over.status_code, over.json()["field"]) == (422, "max_schedules"), over.text
    # Other fields are kept; null is the default quota again (jobs.DEFAULT_MAX_SCHEDULES).
    kept = admin.patch("/v1/tenants/acme", json={"weight": 2}).json()
    assert (kept["weight"], kept["max_schedules"]) == (2, 1)
    cleared = admin.patch("/v1/tenants/acme", json={"max_schedules": None}).json()
    assert (cleared["weight"], cleared["max_schedules"]) == (2, None)
    assert httpx.put(f"{api.url}/v1/schedules/two", json=spec, headers=tenant).status_code == 201
    assert admin.patch("/v1/tenants/acme", json={"max_schedules": 0}).json()["max_schedules"] == 0
    with store.connect(api.dsn) as conn:
        assert [r["max_schedules"] for r in jobs.list_tenants(conn)] == [0]


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (-1, "max_schedules: must be a whole number from 0 to 100000000 (got -1)"),
        (100_000_001, "max_schedules: must be a whole number from 0 to 100000000 (got 100000001)"),
        (1.5, "max_schedules: must be a whole number (got 1.5)"),
        ("5", "max_schedules: must be a whole number (got '5')"),
        (True, "max_schedules: must be a whole number (got true)"),
        (10**40, "max_schedules: must be a whole number from 0 to 100000000 (got " + str(10**40) + ")"),
    ],
)
def test_a_bad_schedule_quota_is_422_naming_it_nothing_written(admin, api, value, detail):
    admin.post("/v1/tenants", json={"tenant": "acme"})
    body = _problem(admin.patch("/v1/tenants/acme", json={"max_schedules": value, "weight": 5}), 422)
    assert (body["field"], body["detail"]) == ("max_schedules", detail)
    assert _listed(admin, "acme")["weight"] == 1 and _listed(admin, "acme")["max_schedules"] is None


def test_a_request_with_several_errors_names_every_field_and_its_rule(admin):
    """It said ``tenant: is required (and 1 more)``: the unknown field went unnamed; then
    ``(and 1 more: name)``, which read as if ``name`` were required too (a trial)."""
    body = _problem(admin.post("/v1/tenants", json={"name": "x"}), 422)
    assert (body["field"], body["detail"]) == (
        "tenant",
        "tenant: is required (and 1 more: name: is not a known field (got 'x'))",
    )
    body = _problem(admin.post("/v1/tenants", json={"colour": 1, "name": "x"}), 422)
    assert (body["field"], body["detail"]) == (
        "tenant",
        "tenant: is required (and 2 more: colour: is not a known field (got 1); name: is not a known field (got 'x'))",
    )


def test_tenant_errors_name_the_field(admin):
    assert admin.post("/v1/tenants", json={"tenant": "dup"}).status_code == 201
    body = _problem(admin.post("/v1/tenants", json={"tenant": "dup"}), 409)
    assert (body["field"], body["detail"]) == ("tenant", "tenant: 'dup' exists; PATCH /v1/tenants/dup to change it")
    body = _problem(admin.post("/v1/tenants", json={"tenant": "-bad"}), 422)
    assert body["field"] == "tenant"
    assert body["detail"] == (
        "tenant: must be 1-200 characters of letters, digits and . _ : @ / -, starting with a letter or digit "
        "(got '-bad')"
    )
    # A final newline met the rule's `$` (Python matches it before one): tenant "yy\n" was created.
    body = _problem(admin.post("/v1/tenants", json={"tenant": "yy\n"}), 422)
    assert (body["field"], body["detail"].endswith("(got 'yy\\n')")) == ("tenant", True)
    assert "yy\n" not in [t["tenant"] for t in admin.get("/v1/tenants").json()["items"]]
    body = _problem(admin.post("/v1/tenants", json={"tenant": "w", "weight": 0}), 422)
    assert (body["field"], body["detail"]) == ("weight", "weight: must be a whole number from 1 to 1000 (got 0)")
    body = _problem(admin.post("/v1/tenants", json={"tenant": "w", "max_rate": -1}), 422)
    assert body["field"] == "max_rate"
    # 1e308 is finite, and it overflowed every node's token bucket (every tick crashed).
    for value in (1e308, 1000000001):
        body = _problem(admin.post("/v1/tenants", json={"tenant": "w", "max_rate": value}), 422)
        assert (body["field"], body["detail"]) == (
            "max_rate",
            f"max_rate: must be a number of runs per second > 0 and <= 1000000000 (got {float(value)!r})",
        )
        body = _problem(admin.patch("/v1/tenants/dup", json={"max_rate": value}), 422)
        assert body["field"] == "max_rate"
    assert _listed(admin, "dup")["max_rate"] is None
    body = _problem(admin.post("/v1/tenants", json={"tenant": "w", "colour": "red"}), 422)
    assert (body["field"], body["detail"]) == ("colour", "colour: is not a known field (got 'red')")
    body = _problem(admin.patch("/v1/tenants/nobody", json={"weight": 2}), 404)
    assert body["detail"] == "tenant: no tenant 'nobody'"
    body = _problem(admin.patch("/v1/tenants/dup", json={}), 422)
    assert (body["field"], body["detail"]) == ("body", "body: give weight, max_rate and/or max_schedules")


def test_keys_create_list_revoke_and_the_new_key_works(admin, api):
    admin.post("/v1/tenants", json={"tenant": "acme"})
    created = admin.post("/v1/keys", json={"role": "worker", "tenant": "acme", "name": "ci worker"})
    assert created.status_code == 201, created.text
    assert created.headers["cache-control"] == "no-store"
    body = created.json()
    token, key = body["token"], body["key"]
    assert keys.parse_token(token)[0] == key["key_id"]
    assert (key["tenant"], key["role"], key["name"], key["revoked_at"]) == ("acme", "worker", "ci worker", None)
    explain = {"cron": "* * * * *", "count": "1"}
    as_worker = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{api.url}/v1/explain", params=explain, headers=as_worker).status_code == 200

    listed = admin.get("/v1/keys", params={"tenant": "acme"}).json()
    assert [k["key_id"] for k in listed["items"]] == [key["key_id"]]
    assert "token" not in listed["items"][0] and "secret_hash" not in listed["items"][0]
    everything = admin.get("/v1/keys").json()["items"]
    assert sorted(k["role"] for k in everything) == ["admin", "worker"]
    assert token.split("_", 2)[2] not in str(everything)

    revoked = admin.post(f"/v1/keys/{key['key_id']}:revoke")
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["revoked_at"].endswith("Z")
    again = admin.post(f"/v1/keys/{key['key_id']}:revoke").json()
    assert again["revoked_at"] == revoked.json()["revoked_at"]
    assert httpx.get(f"{api.url}/v1/explain", params=explain, headers=as_worker).status_code == 401


def test_key_errors_name_the_field(admin):
    body = _problem(admin.post("/v1/keys", json={"role": "tenant"}), 422)
    assert (body["field"], body["detail"]) == ("tenant", "tenant: is required for a tenant key")
    body = _problem(admin.post("/v1/keys", json={"role": "tenant", "tenant": "ghost"}), 404)
    assert body["detail"] == "tenant: no tenant 'ghost' (create it with `POST /v1/tenants`)"
    admin.post("/v1/tenants", json={"tenant": "acme"})
    body = _problem(admin.post("/v1/keys", json={"role": "admin", "tenant": "acme"}), 422)
    assert body["field"] == "tenant"
    body = _problem(admin.post("/v1/keys", json={"role": "root", "tenant": "acme"}), 422)
    assert (body["field"], body["detail"]) == ("role", "role: must be one of admin, tenant or worker (got 'root')")
    body = _problem(admin.post("/v1/keys", json={"role": "tenant", "tenant": "acme", "name": "a\nb"}), 422)
    assert body["field"] == "name"
    body = _problem(admin.post("/v1/keys/zzz:revoke"), 422)
    assert body["field"] == "key_id"
    body = _problem(admin.post("/v1/keys/0123456789abcdef:revoke"), 404)
    assert body["detail"] == "key_id: no key '0123456789abcdef'"
    body = _problem(admin.get("/v1/keys", params={"cursor": "!!!"}), 422)
    assert (body["field"], body["detail"]) == (
        "cursor",
        "cursor: must be a next_cursor value returned by this list (got '!!!')",
    )


def test_keys_page_by_key_id(admin, api):
    tokens = [api.key("acme", "tenant") for _ in range(3)]
    ids = sorted(keys.parse_token(t)[0] for t in tokens)
    admin_id = admin.get("/v1/keys", params={"tenant": "acme"}).json()
    assert [k["key_id"] for k in admin_id["items"]] == ids
    first = admin.get("/v1/keys", params={"tenant": "acme", "limit": 2}).json()
    second = admin.get("/v1/keys", params={"tenant": "acme", "limit": 2, "cursor": first["next_cursor"]}).json()
    assert [k["key_id"] for k in first["items"] + second["items"]] == ids
    assert second["next_cursor"] is None


def test_status_is_scheduler_status(admin, api):
    response = admin.get("/v1/status")
    assert response.status_code == 200, response.text
    body = response.json()
    with store.connect(api.dsn) as conn:
        expected = cluster_status(conn, 10.0, 5.0)
    assert body["partitions_total"] == expected["partitions_total"]
    assert body["nodes"] == [] and body["lease_ttl_s"] == 10.0 and body["responsive_s"] == 5.0
    body = _problem(admin.get("/v1/status", params={"lease_ttl_s": "-1"}), 422)
    assert (body["field"], body["detail"]) == (
        "lease_ttl_s",
        "lease_ttl_s: must be a number of seconds > 0 and <= 86400 (got -1.0)",
    )


def test_verify_is_scheduler_verify_over_at_most_a_day(admin, api):
    with store.connect(api.dsn) as conn:
        now = store.now(conn)
    since = (now - timedelta(hours=2)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    until = (now - timedelta(hours=1)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    response = admin.get("/v1/verify", params={"since": since, "until": until, "delivery": "true"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["ok"], body["expected"], body["runs"], body["missing"]) == (True, 0, 0, 0)
    assert body["delivery"]["ok"] is True
    body = _problem(
        admin.get("/v1/verify", params={"since": "2024-01-01T00:00:00Z", "until": "2024-01-03T00:00:00Z"}), 422
    )
    assert body["field"] == "until"
    assert body["detail"] == (
        "until: the window may span at most 1 day over the API (use `scheduler verify` for longer) "
        "(got '2024-01-03T00:00:00Z')"
    )
    later = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = _problem(admin.get("/v1/verify", params={"since": until, "until": later}), 422)
    assert body["field"] == "until"
    body = _problem(admin.get("/v1/verify", params={"since": "noon", "until": until}), 422)
    assert body["field"] == "since"
    body = _problem(admin.get("/v1/verify", params={"since": until, "until": since}), 422)
    assert (body["field"], body["detail"]) == (
        "until",
        f"until: must be later than since (got {since[:-1] + '+00:00'!r})",
    )
    body = _problem(admin.get("/v1/verify", params={"since": since}), 422)
    assert (body["field"], body["detail"]) == ("until", "until: is required")
