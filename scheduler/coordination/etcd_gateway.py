"""etcd through its JSON gateway (HTTP on the client port, no gRPC client needed).

Operations tools, not the coordinator's protocol (that is
:mod:`scheduler.coordination.etcd`, over gRPC):

* :func:`range_prefix`: every key under a prefix, with etcd's revision
  (tests and benchmarks read the coordinator's keys with it);
* :func:`raise_revision`: put a key until etcd's revision is above a number;
* :func:`raise_above_store`: what ``scheduler etcd raise-revision`` does
  before a fleet switches from the SQL coordinator to etcd, or starts on an
  etcd rebuilt from scratch: raise etcd's revision above the largest
  ``owner_epoch`` in the store, so every claim's epoch (its revision) fences
  the previous owners (docs/operations.md, 'Switching coordinators').

Every put is one revision; a put costs a round trip (about a thousand a
second on a local network). Endpoints are plain ``host:port`` over HTTP, as
the etcd coordinator's.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass

import psycopg

from scheduler import store
from scheduler.errors import CoordinatorError, StoreError

BUMP_KEY = "/scheduler-revision-bump"
"""The key :func:`raise_revision` puts (outside the default prefix ``/scheduler/``: no watch sees it)."""

TIMEOUT_S = 5.0
"""Timeout of each HTTP request to etcd (seconds)."""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _post(endpoint: str, path: str, body: dict) -> dict:
    """POST ``body`` (JSON) to ``http://<endpoint><path>``; the decoded JSON answer."""
    request = urllib.request.Request(f"http://{endpoint}{path}", method="POST", data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return json.loads(response.read())


def _first_line(exc: BaseException) -> str:
    """``exc`` as one line: its type and the first line of its text (a URLError's reason)."""
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        text = str(exc.reason).strip()
    else:
        text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def range_prefix(endpoint: str, prefix: str) -> tuple[int, list[dict]]:
    """``(revision, [{"key", "value", "lease", "create_revision"}])`` of every key under
    ``prefix`` (a non-empty string), keys in etcd's order (bytewise ascending).

    Raises ``OSError`` (``urllib.error.URLError``) if ``endpoint`` does not answer.
    """
    start = prefix.encode()
    end = start[:-1] + bytes([start[-1] + 1])
    body = _post(endpoint, "/v3/kv/range", {"key": _b64(start), "range_end": _b64(end)})
    kvs = [
        {
            "key": base64.b64decode(kv["key"]).decode(errors="replace"),
            "value": base64.b64decode(kv.get("value", "")).decode(errors="replace"),
            "lease": int(kv.get("lease", 0)),
            "create_revision": int(kv.get("create_revision", 0)),
        }
        for kv in body.get("kvs", [])
    ]
    return int(body["header"]["revision"]), kvs


def raise_revision(endpoint: str, above: int, key: str = BUMP_KEY) -> int:
    """Put ``key`` until etcd's revision is above ``above``; return the revision (> ``above``).

    No put if it already is. The key is left in place (a delete is one more
    revision; :func:`raise_above_store` deletes it). Raises ``OSError`` if
    ``endpoint`` does not answer.
    """
    body = {"key": _b64(key.encode()), "value": _b64(b"bump")}
    revision, _ = range_prefix(endpoint, key)
    while revision <= above:
        revision = int(_post(endpoint, "/v3/kv/put", body)["header"]["revision"])
    return revision


@dataclass(frozen=True)
class RevisionRaise:
    """What :func:`raise_above_store` found and did.

    ``top_epoch``: the store's largest ``owner_epoch`` (``partition``: a
    partition that has it, the smallest id); ``before``/``after``: etcd's
    revision before and after (``after > top_epoch``; equal to ``before``
    when nothing was put); ``endpoint``: the ``host:port`` that answered.
    """

    top_epoch: int
    partition: int
    before: int
    after: int
    endpoint: str


def store_top_epoch(conn: psycopg.Connection) -> tuple[int, int]:
    """``(owner_epoch, partition_id)``: the store's largest fence epoch and a partition holding it
    (the smallest id). Raises ``psycopg.errors.UndefinedTable`` for a store never migrated,
    StoreError if it has no partition rows."""
    rows = store.execute(conn, "partition_status", {"now": None})
    if not rows:
        raise StoreError("partitions: the store has no partition rows (migration 0002 seeds them)")
    top = max(rows, key=lambda row: (row["owner_epoch"], -row["partition_id"]))
    return top["owner_epoch"], top["partition_id"]


def raise_above_store(conn: psycopg.Connection, endpoints: list[tuple[str, int]]) -> RevisionRaise:
    """Raise etcd's revision above the store's largest ``owner_epoch`` (read from ``conn``).

    ``endpoints``: ``[(host, port)]`` of one etcd cluster
    (:func:`scheduler.coordination.etcd_keys.parse_endpoints`), tried in order
    until one answers. The bump key is deleted afterwards. Safe to run at any
    time and to re-run (a revision only grows). Raises
    :class:`~scheduler.errors.CoordinatorError` if no endpoint answers (the
    error of each, one line), psycopg errors if the store fails.
    """
    top_epoch, partition = store_top_epoch(conn)
    failures = []
    for host, port in endpoints:
        endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            before, _ = range_prefix(endpoint, BUMP_KEY)
            after = raise_revision(endpoint, top_epoch)
            if after != before:
                after = int(
                    _post(endpoint, "/v3/kv/deleterange", {"key": _b64(BUMP_KEY.encode())})["header"]["revision"]
                )
        except (OSError, ValueError, KeyError) as exc:  # unreachable, or not etcd's JSON gateway
            failures.append(f"{endpoint}: {_first_line(exc)}")
            continue
        return RevisionRaise(top_epoch=top_epoch, partition=partition, before=before, after=after, endpoint=endpoint)
    raise CoordinatorError("etcd_endpoints: no endpoint answered (" + "; ".join(failures) + ")")
