"""FastAPI vs Litestar on the API's hot path, without a store: ``python -m bench.api_framework``.

Two endpoints shaped like the worker's calls (docs/api.md, "Why this
framework"):

* claim-like: ``POST /claim`` ``{"queue", "max": 1000, "lease_s"}`` answers
  1,000 runs (run id, schedule, nominal time, attempt, lease token, a small
  payload) through a typed response model;
* ack-like: ``POST /ack`` with 1,000 ``{"run_id", "lease_token"}`` items
  validated into a typed request model, answering the count.

Each framework's app runs under uvicorn (one process, the same options) in
a subprocess; a client sends ``--requests`` sequential requests per
endpoint over one keep-alive connection, ``--rounds`` times, and the
median requests/s (and runs/s: × 1,000) is printed as JSON. Needs
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


def _measure(url: str, path: str, body: bytes, requests: int) -> float:
    """Requests/s of ``requests`` sequential POSTs of ``body`` to ``url + path``."""
    import httpx

    with httpx.Client(base_url=url, headers={"content-type": "application/json"}) as client:
        for _ in range(5):  # warm up
            client.post(path, content=body).raise_for_status()
        start = time.perf_counter()
        for _ in range(requests):
            response = client.post(path, content=body)
            response.raise_for_status()
            response.read()
        return requests / (time.perf_counter() - start)


def run(requests: int = 200, rounds: int = 3) -> dict[str, dict[str, float]]:
    """``{framework: {"claim_req_per_s", "ack_req_per_s"}}``: medians over ``rounds``."""
    import httpx

    claim = json.dumps({"queue": "default", "max": BATCH, "lease_s": 30}).encode()
    ack = json.dumps({"items": [{"run_id": r["run_id"], "lease_token": r["lease_token"]} for r in _runs()]}).encode()
    out: dict[str, dict[str, float]] = {}
    for name, factory in (
        ("fastapi", "fastapi_app"),
        ("fastapi_tuned", "fastapi_tuned_app"),
        ("litestar", "litestar_app"),
    ):
        port = _free_port()
        proc = _serve(factory, port)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    httpx.post(f"{url}/ack", content=b'{"items": []}', headers={"content-type": "application/json"})
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"{name} did not start") from None
                    time.sleep(0.1)
            claims = [_measure(url, "/claim", claim, requests) for _ in range(rounds)]
            acks = [_measure(url, "/ack", ack, requests) for _ in range(rounds)]
        finally:
            proc.terminate()
            proc.wait(10)
        out[name] = {
            "claim_req_per_s": round(statistics.median(claims), 1),
            "ack_req_per_s": round(statistics.median(acks), 1),
            "claim_runs_per_s": round(statistics.median(claims) * BATCH),
            "ack_runs_per_s": round(statistics.median(acks) * BATCH),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
