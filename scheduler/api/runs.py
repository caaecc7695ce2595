"""``/v1/runs…``: runs, claim, heartbeat, ack, nack, redrive over HTTP (docs/api.md, "Runs and workers")."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
