"""Firing's thresholds (:class:`FiringLimits`) and fixed choices.

A :class:`~scheduler.firing.tick.Firer` takes its thresholds as one
:class:`FiringLimits` (default :data:`DEFAULT_LIMITS`, the measured values
below); tests pass their own (e.g. herds of 20 timers) instead of patching
module constants.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class FiringLimits:
    """The firing loop's size thresholds (counts of jobs, partitions, rows, connections)."""

    chunk_jobs: int = 5_000
    """Jobs per firing statement (and transaction): small enough that the first
    chunk of a herd commits within tens of milliseconds and each statement stays
    far below statement_timeout; large enough to amortise the round trip."""

    first_chunk_jobs: int = 1_000
    """Jobs in a tick's first per-timer chunk; each further chunk holds twice as
    many as the one before, up to ``chunk_jobs`` (a slow start). A run becomes
    visible to workers when its chunk commits, and a chunk is planned before it
    is sent: with 5,000-job chunks the first runs of a steady 12,000 runs/s
    were claimable ~0.25 s after their second, the last ~0.55 s. Small first
    chunks let the workers start while the rest is planned and written; the
    later ones stay large to amortise the statement's fixed costs (the fence
    check of every partition it touches)."""

    write_lanes: int = 2
    """Write connections a tick's chunks are spread over, round robin, each in
    pipeline mode, while the node holds more than half of the partitions (one
    otherwise, so a fleet opens about the same number of firing writers
    whatever its size). Measured on the 2-core box (docs/performance.md): the
    store's share of a run (~25 µs of backend CPU) is the longest stage, so a
    lone node with one write backend left the second core idle (300,000-run
    herd: 9.4-10 s with one, 5.6-6.9 s with two; three gained nothing), while
    four nodes with two each oversubscribed it (37-43 k runs/s against 47 k
    with one each). A node's chunks touch disjoint jobs and runs, so lanes never
    block each other; at SERIALIZABLE on PostgreSQL, whose predicate locks are
    page-grained, two lanes' chunks can still fail with 40001, which takes the
    retry path (the tick ends after re-sending what did not commit)."""

    stream_rows: int = 1_000
    """Rows per network chunk when streaming the due scan."""

    stream_page_jobs: int = 10_000
    """Due timers one statement of the per-timer due scan reads at most; the
    pass reads page after page, each resuming after the last timer read
    (:meth:`~scheduler.firing.tick.Firer._stream`). A page's statement stays
    open while its rows are planned and their chunks queued (two chunks of
    ``chunk_jobs``, whose sends wait while the store is busy): one statement
    for a whole pass was cancelled by statement_timeout once an overloaded
    node's ticks held 100,000 timers (steady 12,000 runs/s on a machine too
    slow for it, docs/performance.md "2026-12-03, evening"), and every tick
    after it failed the same way. A page costs a statement and one index
    descent per tenant in it."""

    herd_min_jobs: int = 1_000
    """A tenant's timers due at one instant form a *herd* (fired by ``fire_group``,
    see :mod:`scheduler.firing.herds`) when at least this many of them are in one
    pass's fair set; smaller groups go through the per-timer path, whose fixed
    costs are lower. Each herd costs a few index probes per firable partition
    (``herd_heads``, ``herd_schedule_keys``, ``fire_group``): ~6 ms with 1,024
    partitions, what the per-timer path spends on ~300 timers. Tenants with a
    smaller quota are not probed; the others' size is tested by walking at most
    this many index entries first."""

    first_pass_herd_quota: int = 10_000
    """The first pass of a tick looks for herds only among tenants whose fair share
    is at least this large; the others' first-pass share (all of a small
    tenant's due work) goes per timer, and a big tenant's herd is found in the
    surplus pass, where only saturated tenants are looked at. Looking costs
    index probes per tenant whose heap checks, at the start of a midnight tick
    when every node is updating the same pages, took up to a second per node
    for 51 tenants (4 nodes on 2 cores); the per-timer path serves a 2,000-run
    share in a few tens of milliseconds."""

    herd_max_schedules: int = 32_768
    """Schedule keys planned per herd at most (the most common first); their plans
    travel with every chunk of the herd (12 bytes a key). Timers of rarer keys
    stay due and form the next tick's herd, or go per timer. Planning a key
    the node has not seen costs ~40-60 µs (its zone's first use ~3 ms more),
    once per (key, instant)."""

    herd_spec_cache: int = 200_000
    """Schedule specs (``schedules`` rows) a node keeps for planning
    herds; past it the cache starts over."""

    lookahead_s: float = 5.0
    """How far ahead (seconds) the firer prepares the schedules of timers falling
    due, in the waits between ticks (:mod:`scheduler.firing.lookahead`)."""

    lookahead_max_keys: int = 50_000
    """(tenant, schedule key, instant) rows read per look-ahead read at most."""

    lookahead_herd_rows: int = 20_000
    """Rows (one per herd and partition) a look-ahead read of the coming herds
    (``lookahead_herds``) returns at most, and the most a firer keeps in all
    (the herds of the oldest instants are dropped past it); a read cut there
    is not used (its herds are counted at their instant, as without it).
    20,000 holds ~20 herds spread over all 1,024 partitions (a few MB)."""

    herd_count_batch: int = 256
    """Partitions counted per ``herd_counts`` query while sizing a herd."""


DEFAULT_LIMITS = FiringLimits()
"""The measured thresholds (docs/performance.md): what a node runs with."""

FIRE_RUNS_PREPARE = False
"""Never prepare ``fire_runs`` (nor ``fire_group``) server-side. psycopg prepares a
statement on its 5th execution, and PostgreSQL then switches to a generic plan,
whose per-row cost for this statement was measured at twice the custom plan's
(the herd's second and later ticks ran at half speed). Planning it costs
~1 ms per 5,000-job chunk."""

LOOKAHEAD_MIN_WAIT_S = 0.05
"""The firer looks ahead only in a wait longer than this, and stops this long
before the wait ends (so the next tick starts on time)."""

TICK_PHASE_S = 0.02
"""Ticks start this long after each wall-clock second, when second-aligned
timers have just become due."""
