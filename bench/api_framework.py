"""FastAPI vs Litestar on the API's hot path, without a store: ``python -m bench.api_framework``.

Two endpoints shaped like the worker's calls (docs/api.md, "Why this
framework"):

* claim-like: ``POST /claim`` ``{"queue", "max": 1000, "lease_s"}`` answers
  1,000 runs (run id, schedule, nominal time, attempt, lease token, a small
  payload) through a typed response model;
* ack-like: ``POST /ack`` with 1,000 ``{"run_id", "lease_token"}`` items
  validated into a typed request model, answering the count.

Each framework's app runs under uvicorn (one process, the same options) in
a subprocess, all at once; a client sends 100 sequential requests per
endpoint over one keep-alive connection to each in turn, 5 rounds, and
the medians of requests/s (runs/s: × 1,000) and of the server's CPU
milliseconds per request are printed as JSON. Needs
``pip install litestar`` (not a dependency of the project: only this
measurement uses it). FastAPI uses pydantic models, Litestar its native
msgspec structs: each at its best.
"""

# No `from __future__ import annotations`: both frameworks read the handlers' annotations at runtime.

import json
import socket
import statistics
import subprocess
import sys
import time
from typing import Annotated, Any

BATCH = 1000

_RUN = {
    "schedule": "nightly-report",
    "nominal_time": "2026-01-01T02:00:00Z",
    "attempt": 1,
    "payload": {"kind": "report", "day": "2026-01-01"},
}


def _runs() -> list[dict[str, Any]]:
    return [
        {"run_id": f"0b5e8a1c-2f43-4a4e-9d7c-{i:012d}.1767232800000000", "lease_token": f"{i:032x}", **_RUN}
        for i in range(BATCH)
    ]


def fastapi_app() -> Any:
    """The FastAPI app (pydantic models), as the engine's API writes its handlers (sync ``def``)."""
    from fastapi import FastAPI
    from pydantic import BaseModel

    class Claim(BaseModel):
        queue: str = "default"
        max: int = 100
        lease_s: float = 30.0

    class Run(BaseModel):
        run_id: str
        schedule: str
        nominal_time: str
        attempt: int
        lease_token: str
        payload: dict[str, Any] | None

    class Claimed(BaseModel):
        items: list[Run]

    class Token(BaseModel):
        run_id: str
        lease_token: str

    class Ack(BaseModel):
        items: list[Token]

    class Acked(BaseModel):
        acked: int

    runs = _runs()
    app = FastAPI()

    @app.post("/claim", response_model=Claimed)
    def claim(body: Claim) -> Any:
        return {"items": runs[: body.max]}

    @app.post("/ack", response_model=Acked)
    def ack(body: Ack) -> Any:
        return {"acked": len(body.items)}

    return app


def fastapi_tuned_app() -> Any:
    """FastAPI with the hot path written for speed: the claim's answer serialized in one
    ``TypeAdapter.dump_json`` call (pydantic-core, no per-item model), the ack's body
    parsed by ``TypeAdapter.validate_json`` straight from the bytes (an async dependency);
    the models still document both in the OpenAPI schema."""
    from fastapi import Depends, FastAPI, Request, Response
    from pydantic import BaseModel, TypeAdapter
    from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

    class Claim(BaseModel):
        queue: str = "default"
        max: int = 100
        lease_s: float = 30.0

    class Run(TypedDict):
        run_id: str
        schedule: str
        nominal_time: str
        attempt: int
        lease_token: str
        payload: dict[str, Any] | None

    class Claimed(TypedDict):
        items: list[Run]

    class Token(BaseModel):
        run_id: str
        lease_token: str

    class Ack(BaseModel):
        items: list[Token]

    class Acked(BaseModel):
        acked: int

    claimed = TypeAdapter(Claimed)
    ack_body = TypeAdapter(Ack)
    runs = _runs()
    app = FastAPI()

    async def parsed_ack(request: Request) -> Ack:
        return ack_body.validate_json(await request.body())

    @app.post("/claim", response_model=Claimed)
    def claim(body: Claim) -> Response:
        return Response(claimed.dump_json({"items": runs[: body.max]}), media_type="application/json")

    @app.post(
        "/ack",
        response_model=Acked,
        openapi_extra={"requestBody": {"content": {"application/json": {"schema": Ack.model_json_schema()}}}},
    )
    def ack(body: Annotated[Ack, Depends(parsed_ack)]) -> Response:
        return Response(b'{"acked":%d}' % len(body.items), media_type="application/json")

    return app


def litestar_app() -> Any:
    """The Litestar app (msgspec structs), sync handlers in its thread pool as the FastAPI one."""
    import msgspec
    from litestar import Litestar, post

    class Claim(msgspec.Struct):
        queue: str = "default"
        max: int = 100
        lease_s: float = 30.0

    class Run(msgspec.Struct):
        run_id: str
        schedule: str
        nominal_time: str
        attempt: int
        lease_token: str
        payload: dict[str, Any] | None

    class Claimed(msgspec.Struct):
        items: list[Run]

    class Token(msgspec.Struct):
        run_id: str
        lease_token: str

    class Ack(msgspec.Struct):
        items: list[Token]

    class Acked(msgspec.Struct):
        acked: int

    runs = [Run(**r) for r in _runs()]

    @post("/claim", sync_to_thread=True, status_code=200)
    def claim(data: Claim) -> Claimed:
        return Claimed(items=runs[: data.max])

    @post("/ack", sync_to_thread=True, status_code=200)
    def ack(data: Ack) -> Acked:
        return Acked(acked=len(data.items))

    return Litestar([claim, ack])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(factory: str, port: int) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "uvicorn", f"bench.api_framework:{factory}", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    return subprocess.Popen(cmd)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (:func:`bench.cpu.cpu_s`; the server runs)."""
    from bench.cpu import cpu_s

    spent = cpu_s(pid)
    assert spent is not None, f"process {pid} is gone"
    return spent


def _measure(url: str, path: str, body: bytes, requests: int, pid: int) -> tuple[float, float]:
    """``(requests/s, server CPU ms per request)`` of ``requests`` sequential POSTs of ``body``."""
    import httpx

    with httpx.Client(base_url=url, headers={"content-type": "application/json"}) as client:
        for _ in range(5):  # warm up
            client.post(path, content=body).raise_for_status()
        cpu = _cpu_s(pid)
        start = time.perf_counter()
        for _ in range(requests):
            response = client.post(path, content=body)
            response.raise_for_status()
            response.read()
        wall = time.perf_counter() - start
        return requests / wall, (_cpu_s(pid) - cpu) * 1000 / requests


FRAMEWORKS = (("fastapi", "fastapi_app"), ("fastapi_tuned", "fastapi_tuned_app"), ("litestar", "litestar_app"))


def run(requests: int = 100, rounds: int = 5) -> dict[str, dict[str, float]]:
    """``{framework: {claim/ack req/s, runs/s, server CPU ms per request}}``: medians over ``rounds``.

    The three servers run at once and every round measures each in turn
    (interleaved), so a neighbour's load on the machine falls on all of them
    alike; the server's CPU time per request is the steadier figure on a
    shared machine.
    """
    import httpx

    claim = json.dumps({"queue": "default", "max": BATCH, "lease_s": 30}).encode()
    ack = json.dumps({"items": [{"run_id": r["run_id"], "lease_token": r["lease_token"]} for r in _runs()]}).encode()
    procs: dict[str, tuple[subprocess.Popen, str]] = {}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name, _ in FRAMEWORKS}
    try:
        for name, factory in FRAMEWORKS:
            port = _free_port()
            procs[name] = (_serve(factory, port), f"http://127.0.0.1:{port}")
        for name, (proc, url) in procs.items():
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.post(f"{url}/ack", content=b'{"items": []}', headers={"content-type": "application/json"})
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"{name} did not start") from None
                    time.sleep(0.1)
        for _ in range(rounds):
            for name, (proc, url) in procs.items():
                for label, path, body in (("claim", "/claim", claim), ("ack", "/ack", ack)):
                    rate, cpu_ms = _measure(url, path, body, requests, proc.pid)
                    samples[name].setdefault(f"{label}_req_per_s", []).append(rate)
                    samples[name].setdefault(f"{label}_cpu_ms_per_req", []).append(cpu_ms)
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(10)
    out: dict[str, dict[str, float]] = {}
    for name, figures in samples.items():
        out[name] = {key: round(statistics.median(values), 2) for key, values in figures.items()}
        for label in ("claim", "ack"):
            out[name][f"{label}_runs_per_s"] = round(out[name][f"{label}_req_per_s"] * BATCH)
    return out


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
