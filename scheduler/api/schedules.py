"""``/v1/schedules…``: a tenant's schedules over HTTP (docs/api.md, "Schedules")."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
