"""Delivery: runs reach the code that executes them, at least once (docs/delivery.md).

* :mod:`scheduler.delivery.worker` — pull workers: claim a tenant's queue, run a
  handler per run, heartbeat, ack/nack in batches (``scheduler worker``);
* :mod:`scheduler.delivery.targets` — a job's target, payload, retry and overlap
  policy (validated at save, stored with the job);
* :mod:`scheduler.delivery.ssrf` — which addresses a push target may reach;
* :mod:`scheduler.delivery.lifecycle` — claim, heartbeat, ack, nack (fenced by
  the attempt's lease token) and the partition owner's settle step;
* :mod:`scheduler.delivery.manual` — run now, backfill, and the release of a
  waiting ``buffer_one`` run (overlap policies: docs/delivery.md);
* :mod:`scheduler.delivery.views` — seeing it: run ids, ``jobs describe``,
  ``runs redrive``, the node's delivery gauges;
* :mod:`scheduler.delivery.push` — the node's push loop: HTTP attempts of the
  runs of URL targets (libcurl, SSRF rule at connect, per-host bounds);
* :mod:`scheduler.delivery.signing` — the ``Scheduler-Signature`` header and
  :func:`~scheduler.delivery.signing.verify` for receivers;
* :mod:`scheduler.delivery.tenant_secrets` — per-tenant signing secrets (rotate, list).
"""
