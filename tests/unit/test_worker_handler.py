"""The pull worker's handler contract without a store (scheduler/delivery/worker.py):
loading ``package.module:function``, sync or async, and how a raised exception becomes a nack."""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from datetime import UTC, datetime

import pytest

from scheduler.delivery import lifecycle, worker
from scheduler.delivery.lifecycle import RunKey
from scheduler.delivery.worker import DoNotRetry, RetryAfter, Run, load_handler
from scheduler.errors import StoreError, ValidationError

NOMINAL = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)


def in_flight() -> worker._InFlight:
    key = RunKey.of(uuid.UUID(int=7), NOMINAL)
    claimed = lifecycle.Claimed(
        key=key, tenant="acme", queue="default", job_name=None, origin="schedule", scheduled_at=NOMINAL,
        attempt=1, token=uuid.UUID(int=9), leased_until=NOMINAL, claimed_at=NOMINAL,
    )  # fmt: skip
    run = Run(key.run_id, key.job_id, None, "acme", "default", NOMINAL, NOMINAL, 1, None, "schedule")
    return worker._InFlight(claimed, run)


def test_load_handler_imports_a_dotted_attribute_path() -> None:
    assert load_handler("json:dumps") is json.dumps
    assert load_handler("json.decoder:JSONDecoder.decode") is json.decoder.JSONDecoder.decode


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("json", "handler: must be package.module:function (a Python import path) (got 'json')"),
        ("json:", "handler: must be package.module:function (a Python import path) (got 'json:')"),
        ("json:du mps", "handler: must be package.module:function (a Python import path) (got 'json:du mps')"),
        ("json:nope", "handler: module 'json' has no attribute 'nope'"),
        ("math:pi", "handler: math:pi must be callable (a function taking a Run)"),
        ("nomodule:fn", "handler: cannot import module 'nomodule' (No module named 'nomodule')"),
        ("json.nomodule:fn", "handler: cannot import module 'json.nomodule' (No module named 'json.nomodule')"),
    ],
)
def test_load_handler_refuses_with_one_line_naming_the_rule(spec: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        load_handler(spec)
    assert str(caught.value) == message


def test_a_module_failing_at_import_is_named_with_the_error_type_once(tmp_path, monkeypatch) -> None:
    (tmp_path / "broken_handlers.py").write_text("raise RuntimeError('no config\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValidationError) as caught:
        load_handler("broken_handlers:fn")
    assert str(caught.value) == "handler: cannot import module 'broken_handlers' (RuntimeError: no config)"


def test_sync_and_async_handlers_are_told_apart() -> None:
    async def coroutine_function(run: Run) -> None:
        return None

    class AsyncCallable:
        async def __call__(self, run: Run) -> None:
            return None

    assert worker._is_async(coroutine_function)
    assert worker._is_async(AsyncCallable())
    assert not worker._is_async(print)
    assert not worker._is_async(lambda run: None)


def test_an_exception_becomes_a_retryable_nack_with_its_type_and_message() -> None:
    f = in_flight()
    nack = worker._nack_of(f, ValueError("bad\nthing"))
    assert nack == lifecycle.Nack(f.run_id, uuid.UUID(int=9), "ValueError: bad\nthing", True, None)
    assert worker._nack_of(f, KeyError()).error == "KeyError"


def test_do_not_retry_and_retry_after_set_the_nack() -> None:
    f = in_flight()
    assert worker._nack_of(f, DoNotRetry("no")).retryable is False
    later = worker._nack_of(f, RetryAfter(60))
    assert (later.retryable, later.retry_after_s, later.error) == (True, 60.0, "RetryAfter: retry after 60 s")


@pytest.mark.parametrize("value", [-1, math.nan, math.inf, True, "60", None])
def test_a_retry_after_s_that_is_not_a_finite_number_of_seconds_is_ignored(value: object) -> None:
    error = RuntimeError("x")
    error.retry_after_s = value  # type: ignore[attr-defined]
    assert worker._nack_of(in_flight(), error).retry_after_s is None


def test_an_error_text_is_cut_to_the_stored_length() -> None:
    assert len(worker._nack_of(in_flight(), RuntimeError("x" * 5000)).error or "") == worker.ERROR_MAX_CHARS


def test_a_raising_handler_is_logged_once_as_a_warning_without_its_payload(caplog) -> None:
    import asyncio
    import logging

    w = worker.Worker("postgresql://unused", "acme", handler=print, worker_id="w1")
    w._wake, w._flush_now = asyncio.Event(), asyncio.Event()
    plain = in_flight()
    f = worker._InFlight(plain.claimed, dataclasses.replace(plain.run, payload={"card": "4111-PAYLOAD"}))
    w._inflight[f.run_id], w._running = f, 1
    caplog.set_level(logging.DEBUG, logger="scheduler")
    w._finished(f, ValueError("bad " + "x" * 300 + "\nsecond line"))
    failed = [r for r in caplog.records if getattr(r, "event", None) == "handler_failed"]
    assert [(r.levelno, r.fields) for r in failed] == [
        (
            logging.WARNING,
            {
                "worker": "w1",
                "run_id": f.run_id,
                "attempt": 1,
                "error_type": "ValueError",
                "error": "bad " + "x" * (worker.HANDLER_ERROR_LOG_CHARS - 5) + "…",
            },
        )
    ]
    assert "PAYLOAD" not in caplog.text and "second line" not in caplog.text
    assert [n.run_id for n in w._nacks] == [f.run_id]
    g = in_flight()
    w._inflight[g.run_id], w._running = g, 1
    caplog.clear()
    w._finished(g, None)
    assert [r for r in caplog.records if getattr(r, "event", None) == "handler_failed"] == []


@pytest.mark.parametrize(
    "exc, text",
    [
        (StoreError("connection lost: the server closed it"), "StoreError: connection lost: the server closed it"),
        (OSError("Cannot connect to host x:1 ssl:default [Connect call failed ('127.0.0.1', 1)]"),
         "OSError: Cannot connect to host x:1 ssl:default [Connect call failed ('127.0.0.1', 1)]"),
        (StoreError("first line\nsecond line"), "StoreError: first line\\nsecond line"),
    ],
)  # fmt: skip
def test_a_failed_store_call_logs_its_error_as_plain_text_not_quoted(caplog, exc, text) -> None:
    """The HTTP and store transports' failures were logged as a repr: ``error="'StoreError: …'"``."""
    import logging

    from scheduler.log import TextFormatter

    w = worker.Worker("postgresql://unused", "acme", handler=print, worker_id="w1")
    caplog.set_level(logging.DEBUG, logger="scheduler")
    assert w._store_failed("claim", exc, 0.5) == 1.0
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "worker_store_error"]
    assert record.fields == {"worker": "w1", "operation": "claim", "error": text, "retry_in_s": 0.5}
    assert f"error={json.dumps(text)} " in TextFormatter().format(record)


def test_a_failed_store_call_cuts_a_long_error_to_300_characters_with_an_ellipsis(caplog) -> None:
    import logging

    w = worker.Worker("postgresql://unused", "acme", handler=print, worker_id="w1")
    caplog.set_level(logging.DEBUG, logger="scheduler")
    w._store_failed("ack", StoreError("y" * 1000), 0.5)
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "worker_store_error"]
    assert record.fields["error"] == "StoreError: " + "y" * (300 - len("StoreError: ") - 1) + "…"


def test_the_run_a_handler_gets_is_the_one_run_would_build_field_by_field() -> None:
    # run_of (and the claim's Claimed) skip the frozen dataclass's __init__ for speed:
    # every field must still be set, equal to Run(...)'s, and each run gets its own Abandoned.
    c = in_flight().claimed
    built = Run(c.run_id, c.job_id, None, c.tenant, "default", c.nominal_time, c.scheduled_at, 1, None, "schedule")
    fast, other = worker.run_of(c, "default"), worker.run_of(c, "default")
    assert {f.name: getattr(fast, f.name) for f in dataclasses.fields(Run) if f.name != "abandoned"} == {
        f.name: getattr(built, f.name) for f in dataclasses.fields(Run) if f.name != "abandoned"
    }
    assert set(vars(fast)) == {f.name for f in dataclasses.fields(Run)}
    assert (fast, repr(fast)) == (built, repr(built))
    assert isinstance(fast.abandoned, worker.Abandoned) and fast.abandoned is not other.abandoned
    assert not fast.abandoned.is_set()
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.attempt = 2  # type: ignore[misc]
    unnamed = dataclasses.replace(c, queue=None)
    assert worker.run_of(unnamed, "reports").queue == "reports"


def test_frozen_of_sets_every_field_of_a_claimed_attempt() -> None:
    c = in_flight().claimed
    fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(lifecycle.Claimed)}
    fast = lifecycle.frozen_of(lifecycle.Claimed, dict(fields))
    assert (fast, repr(fast), fast.run_id, fast.nominal_time) == (c, repr(c), c.run_id, c.nominal_time)


def test_a_run_with_a_json_object_or_list_payload_is_hashable() -> None:
    """A handler may keep runs in a set or as dict keys (e.g. to spot a redelivery
    within the process): a frozen Run is hashable whatever its JSON payload holds,
    and two attempts of one run with the same payload are equal and hash alike."""
    c = dataclasses.replace(in_flight().claimed, payload={"report": ["daily", {"rows": 3}]})
    first, again = worker.run_of(c, "default"), worker.run_of(c, "default")
    assert {first, again} == {first} and hash(first) == hash(again)
    listed = worker.run_of(dataclasses.replace(c, payload=[1, 2]), "default")
    assert len({first, listed}) == 2
