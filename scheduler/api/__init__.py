"""The tenant HTTP API (docs/api.md): schedules, runs and workers over authenticated HTTP.

Modules: :mod:`~scheduler.api.app` (:func:`create_app`, the FastAPI
application), :mod:`~scheduler.api.deps` (keys, roles, the store, paging),
:mod:`~scheduler.api.errors` (problem+json), :mod:`~scheduler.api.limits`
(body size, rate), :mod:`~scheduler.api.keys` (API keys in the store; used
by ``scheduler keys`` too), :mod:`~scheduler.api.server` (uvicorn: ``scheduler
api``, ``scheduler node --api-port``), :mod:`~scheduler.api.schema` (the
committed OpenAPI document), and the routers :mod:`~scheduler.api.schedules`,
:mod:`~scheduler.api.runs`, :mod:`~scheduler.api.explain`,
:mod:`~scheduler.api.admin`.

This package imports FastAPI only in its submodules: ``scheduler.api.keys``
needs nothing beyond the store.
"""
