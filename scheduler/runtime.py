"""Process-wide settings of a long-running engine process (``scheduler node``, ``scheduler worker``).

Only the functions that own a process call these (``Node.run_until_signalled``,
``Worker.run_until_signalled``, both also the ones that install signal
handlers); a :class:`~scheduler.delivery.worker.Worker` embedded with
:meth:`~scheduler.delivery.worker.Worker.run` leaves the host process's
settings alone.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Move every object the collector tracks now into its permanent generation; return how many.

    A worker creates and drops ~10 container objects per run (the claimed row,
    the :class:`~scheduler.delivery.worker.Run`, its asyncio task and
    coroutine, the ack's arrays), thousands a second, so CPython's cyclic
    collector runs often, and each full (generation 2) collection walks every
    tracked object: the ~90,000 of the imported modules and their tables, none
    of which ever becomes garbage. :func:`gc.freeze` takes those out of every
    later collection (the technique CPython's documentation gives it for
    long-lived servers); objects created later are collected as before.
    Measured on one ``scheduler worker`` draining 100,000 runs with a no-op
    handler (docs/performance.md, "2026-12-02, night"): collections took
    0.81 s of the drain (8.1 µs/run, 0.61 s in 15 full ones) before, 0.18 s
    after. Call it once, after start-up imports and before serving. Never
    raises.
    """
    gc.freeze()
    return gc.get_freeze_count()
