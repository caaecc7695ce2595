"""Schedule writes through the tenant API while a herd fires: ``bench deliver --put-rate R``.

Issue #15's target: ``PUT /v1/schedules/{name}`` answers within 50 ms at the
99th percentile while a herd fires. :class:`PutProbe` is a thread with one
keep-alive HTTP connection that sends ``R`` PUTs a second (a new schedule
each, cron ``0 3 * * *``, never due during the bench) from the herd's
instant until :meth:`PutProbe.stop`, each timed from the request's first
byte to the response's last. Sends are paced on a fixed schedule (request
``i`` at ``start + i / R``): a slow answer delays the next send, and the
time it was late is not added to anyone's latency (so the figure is the
service time of a request, not a queue the probe built; it also reports how
many sends fell behind their slot).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import threading
import time
import urllib.parse

from bench.report import percentile

CRON = "0 3 * * *"
"""The probe's schedules fire at 03:00 UTC: never inside a bench's window by design of the
bench's clock (the herd's instant is minutes from the load), and harmless if one did."""


@dataclasses.dataclass
class PutFigures:
    """What the probe measured, milliseconds: ``count`` PUTs answered, ``errors`` (status
    outside 200/201 or a connection error: listed by status in ``statuses``), and
    percentiles of the answered ones; ``behind``: sends that left after their slot."""

    count: int
    errors: int
    statuses: dict[str, int]
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    behind: int


class PutProbe:
    """PUTs at ``rate`` per second to ``api_url`` with ``token`` (a tenant key), from the
    wall-clock instant ``start_at`` (Unix seconds) until :meth:`stop`."""

    def __init__(self, api_url: str, token: str, rate: float, start_at: float) -> None:
        if not rate > 0:
            raise ValueError(f"--put-rate must be > 0, not {rate!r}")
        self.url = urllib.parse.urlsplit(api_url)
        self.token = token
        self.rate = rate
        self.start_at = start_at
        self.latencies_ms: list[float] = []
        self.statuses: dict[str, int] = {}
        self.behind = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="put-probe", daemon=True)

    def start(self) -> PutProbe:
        self._thread.start()
        return self

    def stop(self) -> PutFigures:
        """Stop sending and return the figures (waits for the request in flight)."""
        self._stop.set()
        self._thread.join(timeout=30)
        answered = sorted(self.latencies_ms)
        errors = sum(n for status, n in self.statuses.items() if status not in ("200", "201"))
        return PutFigures(
            count=len(answered),
            errors=errors,
            statuses=dict(self.statuses),
            p50_ms=percentile(answered, 0.50) if answered else None,
            p99_ms=percentile(answered, 0.99) if answered else None,
            max_ms=answered[-1] if answered else None,
            behind=self.behind,
        )

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.url.hostname or "127.0.0.1", self.url.port, timeout=30)

    def _run(self) -> None:
        self._stop.wait(max(0.0, self.start_at - time.time()))
        conn = self._connect()
        body = json.dumps({"cron": CRON, "tz": "UTC", "queue": "default"}).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        t0 = time.monotonic()
        i = 0
        while not self._stop.is_set():
            slot = t0 + i / self.rate
            wait = slot - time.monotonic()
            if wait > 0:
                if self._stop.wait(wait):
                    break
            elif wait < -1 / self.rate:
                self.behind += 1
            started = time.monotonic()
            try:
                conn.request("PUT", f"/v1/schedules/bench-put-{i}", body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                status = str(resp.status)
                if resp.status in (200, 201):
                    self.latencies_ms.append((time.monotonic() - started) * 1000)
            except (OSError, http.client.HTTPException) as exc:
                status = type(exc).__name__
                conn.close()
                conn = self._connect()
            self.statuses[status] = self.statuses.get(status, 0) + 1
            i += 1
        conn.close()
