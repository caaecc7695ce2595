-- Named queries of the trigger engine. Loaded once by scheduler/store.py.
-- Rules (DESIGN.md §7, the PostgreSQL/CockroachDB common subset):
--   * store time (now(), statement_timestamp()) is the only clock for leases
--     and due times; never clock_timestamp();
--   * every write that depends on owning a partition carries node and epoch
--     in its WHERE clause (the fence is inside the statement);
--   * ON CONFLICT names its conflict columns; no UPSERT, no advisory locks,
--     no LISTEN/NOTIFY; SKIP LOCKED only spreads work;
--   * arrays are bound as binary parameters (%(x)b).

-- ---------------------------------------------------------------- membership

-- name: upsert_heartbeat
-- Membership heartbeat of one node process; returns the store's clock.
INSERT INTO nodes (node_id, incarnation, host, pid, started_at, heartbeat_at)
VALUES (%(node_id)s, %(incarnation)s, %(host)s, %(pid)s, now(), now())
ON CONFLICT (node_id) DO UPDATE
SET incarnation = excluded.incarnation,
    host = excluded.host,
    pid = excluded.pid,
    started_at = CASE WHEN nodes.incarnation = excluded.incarnation
                      THEN nodes.started_at ELSE excluded.started_at END,
    heartbeat_at = excluded.heartbeat_at
RETURNING now() AS store_now;

-- name: list_live_nodes
-- Nodes whose heartbeat is younger than %(ttl_s)s seconds, by store time.
SELECT node_id, incarnation
FROM nodes
WHERE heartbeat_at > now() - %(ttl_s)s * interval '1 second'
ORDER BY node_id;

-- name: delete_heartbeat
-- Graceful leave: only this incarnation's row (a successor may own the id).
DELETE FROM nodes WHERE node_id = %(node_id)s AND incarnation = %(incarnation)s;

-- name: prune_nodes
-- Rows of nodes dead for longer than prune_after_s.
DELETE FROM nodes WHERE heartbeat_at < now() - %(prune_after_s)s * interval '1 second';

-- ---------------------------------------------------------------- leases

-- name: claim_partitions
-- Claim up to %(limit)s free or expired partitions and bump their epoch in
-- the same statement. The outer WHERE re-checks "free or expired" after the
-- row lock, so of concurrent claimers exactly one wins each row; SKIP LOCKED
-- only spreads claimers over different rows. The order is a per-node
-- pseudo-random permutation, so racing claimers rarely collide.
UPDATE partitions
SET owner_node = %(node_id)s,
    owner_epoch = owner_epoch + 1,
    lease_expires_at = now() + %(ttl_s)s * interval '1 second',
    acquired_at = now(),
    renewed_at = now()
WHERE partition_id IN (
        SELECT partition_id
        FROM partitions
        WHERE owner_node IS NULL OR lease_expires_at <= now()
        ORDER BY md5(%(node_id)s || partition_id::text)
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED)
  AND (owner_node IS NULL OR lease_expires_at <= now())
RETURNING partition_id, owner_epoch;

-- name: claim_partitions_at_epoch
-- Coordinators with an external epoch source (etcd: the claim's revision).
-- Writes owner_epoch = %(epoch)s only where it is below it, so an owner that
-- paused before writing cannot overwrite a newer one. Returns the partitions
-- taken; a partition missing from the result has a stored epoch >= %(epoch)s.
UPDATE partitions
SET owner_node = %(node_id)s,
    owner_epoch = %(epoch)s,
    lease_expires_at = now() + %(ttl_s)s * interval '1 second',
    acquired_at = now(),
    renewed_at = now()
WHERE partition_id = ANY(%(partition_ids)b::int4[])
  AND owner_epoch < %(epoch)s
RETURNING partition_id, owner_epoch;

-- name: renew_leases
-- Renew all of one node's leases in one statement, keyed on (node, epoch):
-- a partition whose epoch moved on (taken over) is simply not returned.
UPDATE partitions AS p
SET lease_expires_at = now() + %(ttl_s)s * interval '1 second',
    renewed_at = now()
FROM unnest(%(partition_ids)b::int4[], %(epochs)b::int8[]) AS l (pid, epoch)
WHERE p.partition_id = l.pid
  AND p.owner_epoch = l.epoch
  AND p.owner_node = %(node_id)s
RETURNING p.partition_id, p.owner_epoch;

-- name: release_leases
-- Hand partitions back (graceful stop, or over the fair share). The epoch
-- stays; the next claimer bumps it.
UPDATE partitions AS p
SET owner_node = NULL,
    lease_expires_at = NULL
FROM unnest(%(partition_ids)b::int4[], %(epochs)b::int8[]) AS l (pid, epoch)
WHERE p.partition_id = l.pid
  AND p.owner_epoch = l.epoch
  AND p.owner_node = %(node_id)s
RETURNING p.partition_id;

-- name: partition_status
-- Every partition with its owner, epoch and lease age/remaining (seconds).
SELECT p.partition_id, p.owner_node, p.owner_epoch,
       extract(epoch FROM (p.lease_expires_at - now()))::float8 AS lease_left_s,
       extract(epoch FROM (now() - p.renewed_at))::float8 AS lease_age_s,
       (n.node_id IS NOT NULL) AS owner_live
FROM partitions AS p
LEFT JOIN nodes AS n
       ON n.node_id = p.owner_node
      AND n.heartbeat_at > now() - %(ttl_s)s * interval '1 second'
ORDER BY p.partition_id;

-- name: node_status
-- Every node row with its heartbeat age (seconds).
SELECT node_id, incarnation, host, pid, started_at,
       extract(epoch FROM (now() - heartbeat_at))::float8 AS heartbeat_age_s
FROM nodes
ORDER BY node_id;

-- ---------------------------------------------------------------- firing

-- name: select_due_jobs
-- Due timers of the node's firable partitions, per tenant, oldest due first
-- ((next_due_at, partition_id, job_id) order: jobs_tenant_due_part_idx), at
-- most %(quotas)s[i] for tenant %(tenants)s[i] (the fairness allocator's
-- quotas), after the cursor (%(after_due)s[i], %(after_pid)s[i],
-- %(after_job)s[i]) (a second pass in the same tick continues where the
-- first stopped; the first passes the NO_CURSOR sentinel of
-- scheduler/firing.py, older than any timer: a cursor that is never NULL
-- keeps the row comparison an index qualifier, so a scan starts at the
-- cursor instead of walking, and filtering, everything before it). Reads
-- only: the fence is in fire_runs. Returns the store's clock.
-- The column ORDER is part of the contract (scheduler/firing.py reads rows
-- as tuples); job_id comes as text, which is how fire_runs takes it back.
SELECT j.partition_id, j.job_id::text, j.tenant, j.kind, j.cron_expr, j.cron_dialect,
       j.tz, j.interval_s, j.anchor_at, j.fire_at, j.misfire,
       j.catchup_window_s, j.misfire_grace_s, j.jitter_s,
       j.next_nominal_at, j.next_due_at, j.revision,
       now() AS store_now
FROM unnest(%(tenants)b::text[], %(quotas)b::int8[], %(after_due)b::timestamptz[],
            %(after_pid)b::int4[], %(after_job)b::uuid[])
     AS q (tenant, quota, after_due, after_pid, after_job)
CROSS JOIN LATERAL (
    SELECT *
    FROM jobs AS d
    WHERE d.tenant = q.tenant
      AND d.next_due_at <= now()
      AND (d.next_due_at, d.partition_id, d.job_id) > (q.after_due, q.after_pid, q.after_job)
      AND d.partition_id = ANY(%(partition_ids)b::int4[])
    ORDER BY d.next_due_at, d.partition_id, d.job_id
    LIMIT q.quota
) AS j;

-- name: herd_heads
-- The herd finder (scheduler/firing.py, "Herds"). For each tenant
-- %(tenants)s[i]: the instant (next_due_at) of its oldest due timer in the
-- node's firable partitions after the cursor (%(after_due)s[i],
-- %(after_pid)s[i], %(after_job)s[i]) (never NULL, as in select_due_jobs),
-- returned only if at least
-- %(min_jobs)s of its timers there are due at that instant (after the
-- cursor). Index entries only (index-only scans of jobs_tenant_due_part_idx
-- while pages are all-visible): per tenant one ordered probe, then a walk
-- of at most %(min_jobs)s entries at the instant (small tenants stop there).
SELECT h.tenant, h.due
FROM (
    SELECT q.tenant, q.after_due, q.after_pid, q.after_job, f.next_due_at AS due
    FROM unnest(%(tenants)b::text[], %(after_due)b::timestamptz[], %(after_pid)b::int4[],
                %(after_job)b::uuid[]) AS q (tenant, after_due, after_pid, after_job)
    CROSS JOIN LATERAL (
        SELECT x.next_due_at
        FROM jobs AS x
        WHERE x.tenant = q.tenant
          AND x.next_due_at <= now()
          AND (x.next_due_at, x.partition_id, x.job_id) > (q.after_due, q.after_pid, q.after_job)
          AND x.partition_id = ANY(%(partition_ids)b::int4[])
        ORDER BY x.next_due_at, x.partition_id, x.job_id
        LIMIT 1
    ) AS f
) AS h
CROSS JOIN LATERAL (
    SELECT count(*) AS n
    FROM (
        SELECT 1
        FROM jobs AS y
        WHERE y.tenant = h.tenant
          AND y.next_due_at = h.due
          AND (y.next_due_at, y.partition_id, y.job_id) > (h.after_due, h.after_pid, h.after_job)
          AND y.partition_id = ANY(%(partition_ids)b::int4[])
        LIMIT %(min_jobs)s
    ) AS z
) AS e
WHERE e.n >= %(min_jobs)s;

-- name: herd_counts
-- A herd's size per partition: the timers of tenant %(tenant)s due at
-- %(due)s in each of partitions %(pids)s (after (%(after_pid)s,
-- %(after_job)s) when given), partitions with none left out. One exact
-- probe of jobs_tenant_due_part_idx per partition (a join with the list on
-- purpose: written as `partition_id = ANY(list)` the planner may, from row
-- estimates, walk the whole instant instead, other nodes' timers included:
-- 200,000 heap fetches for a 67,000-timer herd, seen at 4 nodes).
SELECT o.pid AS partition_id, c.n
FROM unnest(%(pids)b::int4[]) AS o (pid)
CROSS JOIN LATERAL (
    SELECT count(*) AS n
    FROM jobs AS d
    WHERE d.tenant = %(tenant)s
      AND d.next_due_at = %(due)s
      AND d.partition_id = o.pid
      AND (%(after_pid)s::int4 IS NULL
           OR (d.partition_id, d.job_id) > (%(after_pid)s::int4, %(after_job)s::uuid))
) AS c
WHERE c.n > 0;

-- name: herd_schedules
-- The distinct schedules of a herd (the jitter-free timers of tenant
-- %(tenant)s due at %(due)s in partitions %(pids)s), read from a sample: at
-- most %(per_partition)s timers of each partition (exact probes of
-- jobs_tenant_due_part_idx; the LIMIT keeps the lateral a nested loop). A
-- schedule the sample misses is simply not in fire_group's plans: its
-- timers stay due, and once too few of them are left at the instant to
-- form a herd, the per-timer path fires them (as it does jittered timers).
-- Returns the store's clock, the `now` the plans are made for.
SELECT s.kind, s.cron_expr, s.cron_dialect, s.tz, s.interval_s, s.anchor_at, s.fire_at,
       s.misfire, s.catchup_window_s, s.misfire_grace_s, count(*)::int8 AS sampled,
       now() AS store_now
FROM unnest(%(pids)b::int4[]) AS o (pid)
CROSS JOIN LATERAL (
    SELECT d.kind, d.cron_expr, d.cron_dialect, d.tz, d.interval_s, d.anchor_at, d.fire_at,
           d.misfire, d.catchup_window_s, d.misfire_grace_s
    FROM jobs AS d
    WHERE d.tenant = %(tenant)s
      AND d.next_due_at = %(due)s
      AND d.partition_id = o.pid
      AND d.jitter_s = 0
      AND d.next_nominal_at = d.next_due_at
    LIMIT %(per_partition)s
) AS s
GROUP BY s.kind, s.cron_expr, s.cron_dialect, s.tz, s.interval_s, s.anchor_at, s.fire_at,
         s.misfire, s.catchup_window_s, s.misfire_grace_s;

-- name: select_schema_version
-- The store's schema revision(s) as alembic recorded them (the node's start-up
-- check compares them with the code's head; a missing table means no schema).
SELECT version_num FROM alembic_version;

-- name: store_now
SELECT now() AS store_now;

-- name: fire_runs
-- The fenced firing statement (DESIGN.md §4). One statement, so atomic:
--   fence    locks the partition rows FOR SHARE where owner and epoch are
--            still ours: a concurrent takeover (which UPDATEs owner_epoch)
--            waits for this transaction's commit, or has already committed
--            and the re-checked row no longer matches. Evaluated once. The
--            epoch expected of partition p is %(epochs)s[p + 1] (all 1,024,
--            NULL where not held): a subscript, not a join whose plan follows
--            the partitions table's statistics (a nested loop over an
--            unnest there cost 15 ms a chunk).
--   fenced   the same as one row: the fenced partition ids, ascending;
--   advanced moves each job to its plan's next slot, only if its partition
--            is fenced and nobody edited it since it was read (revision);
--            returns its tenant, fencing epoch and its plan's fires/skip;
--   skipped  records misfire decisions of advanced jobs;
--   inserted writes one run per (job, nominal time) of advanced jobs; the
--            primary key makes a duplicate impossible.
-- Shape of the parameters (scheduler/firing.py, _Batch): a job is four
-- scalars, partition, id, revision and plan number, plus the 1-based
-- position (fpos) of its partition in the sorted fence arrays. What to do
-- is in the plan arrays, one entry per distinct outcome: next slot, the
-- range p_fire_lo..p_fire_hi of its runs in the f_* arrays, its skip number
-- in the s_* arrays (0: none). In a herd thousands of jobs share one plan.
-- Every per-row lookup is an array subscript, O(1), never a join between
-- two unindexed sets: such a join's plan depends on row estimates (the
-- partitions table's statistics change as leases move) and a nested loop
-- over CTE scans costs seconds per chunk. The fence check is
-- `fenced[fpos] = pid`, which holds unless a partition was refused (then
-- the exact `= ANY` test runs for that chunk's rows).
-- Per-job arrays are array literals in text (one str.join in the node:
-- psycopg's binary list dumper costs ~1 µs per element in Python); the
-- small per-plan arrays are binary.
-- Returns the fenced partitions, the counts and the runs' lateness.
WITH fence AS (
    SELECT p.partition_id
    FROM partitions AS p
    WHERE p.partition_id = ANY(%(fence_pids)b::int4[])
      AND p.owner_node = %(node_id)s
      AND p.owner_epoch = (%(epochs)s::int8[])[p.partition_id + 1]
    FOR SHARE OF p
), fenced AS (
    SELECT coalesce(array_agg(partition_id ORDER BY partition_id), '{}') AS pids FROM fence
), advanced AS (
    UPDATE jobs AS j
    SET next_nominal_at = (%(p_next_nominal)b::timestamptz[])[a.plan],
        next_due_at = (%(p_next_due)b::timestamptz[])[a.plan]
    FROM unnest(%(pids)s::int4[], %(jids)s::uuid[], %(revs)s::int8[], %(plans)s::int4[],
                %(fpos)s::int4[]) AS a (pid, jid, rev, plan, fpos)
    CROSS JOIN fenced AS fd
    WHERE j.partition_id = a.pid
      AND j.job_id = a.jid
      AND j.revision = a.rev
      AND (fd.pids[a.fpos] = a.pid OR a.pid = ANY(fd.pids))
    RETURNING j.partition_id, j.job_id, j.tenant,
              (%(fence_epochs)b::int8[])[a.fpos] AS epoch,
              (%(p_fire_lo)b::int4[])[a.plan] AS fire_lo,
              (%(p_fire_hi)b::int4[])[a.plan] AS fire_hi,
              (%(p_skip)b::int4[])[a.plan] AS skip
), skipped AS (
    INSERT INTO skips (partition_id, job_id, first_nominal, until_nominal, slots,
                       reason, recorded_at, node_id, epoch)
    SELECT ad.partition_id, ad.job_id,
           (%(s_first)b::timestamptz[])[ad.skip], (%(s_until)b::timestamptz[])[ad.skip],
           (%(s_slots)b::int8[])[ad.skip], (%(s_reasons)b::text[])[ad.skip],
           statement_timestamp(), %(node_id)s, ad.epoch
    FROM advanced AS ad
    WHERE ad.skip > 0
    ON CONFLICT (partition_id, job_id, first_nominal) DO NOTHING
    RETURNING 1
), fires AS (
    SELECT ad.partition_id, ad.job_id, ad.tenant, ad.epoch,
           generate_series(ad.fire_lo, ad.fire_hi) AS i
    FROM advanced AS ad
), inserted AS (
    INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at,
                      fired_at, node_id, epoch)
    SELECT r.partition_id, r.job_id, (%(f_nominal)b::timestamptz[])[r.i], r.tenant,
           (%(f_scheduled)b::timestamptz[])[r.i], statement_timestamp(), %(node_id)s, r.epoch
    FROM fires AS r
    ON CONFLICT (partition_id, job_id, nominal_time) DO NOTHING
    RETURNING extract(epoch FROM (fired_at - scheduled_at))::float8 AS lag_s
)
SELECT (SELECT pids FROM fenced) AS fenced,
       (SELECT count(*) FROM advanced) AS advanced,
       (SELECT count(*) FROM skipped) AS skipped,
       (SELECT count(*) FROM inserted) AS inserted,
       (SELECT coalesce(array_agg(lag_s), '{}') FROM inserted) AS lags_s;

-- name: fire_group
-- The fenced firing statement for one herd chunk (scheduler/firing.py,
-- "Herds"): the timers of tenant %(tenant)s due at %(due)s in partitions
-- %(pids)s (a slice of the node's firable ones, ascending; after the
-- cursor (%(lo_pid)s, %(lo_job)s) when given), whose schedule is one of the
-- plan rows, all
-- planned in the node beforehand: each such timer fires one run at %(due)s
-- (no jitter: its nominal time is its due time) and moves to the plan's
-- next slot. No per-timer data travels: the store finds the timers by
-- exact probes of jobs_tenant_due_part_idx, one per fenced partition of the
-- slice (the fenced list is only known when the statement runs, so the
-- planner cannot trade the probes for a walk of the whole instant), and
-- updates them in place; other nodes' partitions are never read. Same guarantees as fire_runs (DESIGN.md §4):
--   fence    locks the chunk's partition rows FOR SHARE where owner and
--            epoch are still ours (evaluated once; the epoch is a subscript
--            of %(epochs)s, so no join whose plan follows the partitions
--            table's statistics: a nested loop over an unnest there cost
--            15 ms a chunk);
--   advanced moves each matching timer of a fenced partition whose slot is
--            still %(due)s and whose schedule still equals the plan's (the
--            re-check that replaces fire_runs' revision test: an edit since
--            the plan changes one of them, or nulls next_due_at);
--   inserted one run per advanced timer, epoch from %(epochs)s (indexed by
--            partition id + 1); the runs primary key makes a duplicate
--            impossible, and re-sending the chunk finds nothing left to advance.
-- Every run of the statement has the same lateness (fired_at is the
-- statement's timestamp, scheduled_at the instant), returned once as lag_s.
-- Nullable schedule columns compare through coalesce() to values no timer
-- can hold ('' is no valid expression, dialect or zone; intervals are > 0;
-- the API cannot store -infinity), so NULLs match NULLs and the join with
-- the plans can hash. Returns the fenced partitions, the counts and
-- the runs' lateness.
WITH fence AS (
    SELECT p.partition_id
    FROM partitions AS p
    WHERE p.partition_id = ANY(%(pids)b::int4[])
      AND p.owner_node = %(node_id)s
      AND p.owner_epoch = (%(epochs)s::int8[])[p.partition_id + 1]
    FOR SHARE OF p
), fenced AS (
    SELECT coalesce(array_agg(partition_id ORDER BY partition_id), '{}') AS pids FROM fence
), plans AS MATERIALIZED (
    SELECT *
    FROM unnest(%(kinds)b::text[], %(cron_exprs)b::text[], %(cron_dialects)b::text[],
                %(tzs)b::text[], %(interval_ss)b::int8[], %(anchor_ats)b::timestamptz[],
                %(fire_ats)b::timestamptz[], %(misfires)b::text[], %(catchup_window_ss)b::int4[],
                %(misfire_grace_ss)b::int4[], %(next_nominals)b::timestamptz[])
         AS p (kind, cron_expr, cron_dialect, tz, interval_s, anchor_at, fire_at, misfire,
               catchup_window_s, misfire_grace_s, next_nominal)
), advanced AS (
    UPDATE jobs AS j
    SET next_nominal_at = p.next_nominal,
        next_due_at = p.next_nominal
    FROM plans AS p, fenced AS fd
    WHERE j.tenant = %(tenant)s
      AND j.next_due_at = %(due)s
      AND j.partition_id = ANY(fd.pids)
      AND (%(lo_pid)s::int4 IS NULL
           OR (j.partition_id, j.job_id) > (%(lo_pid)s::int4, %(lo_job)s::uuid))
      AND j.next_nominal_at = %(due)s
      AND j.jitter_s = 0
      AND j.kind = p.kind
      AND coalesce(j.cron_expr, '') = coalesce(p.cron_expr, '')
      AND coalesce(j.cron_dialect, '') = coalesce(p.cron_dialect, '')
      AND coalesce(j.tz, '') = coalesce(p.tz, '')
      AND coalesce(j.interval_s, 0) = coalesce(p.interval_s, 0)
      AND coalesce(j.anchor_at, '-infinity') = coalesce(p.anchor_at, '-infinity')
      AND coalesce(j.fire_at, '-infinity') = coalesce(p.fire_at, '-infinity')
      AND j.misfire = p.misfire
      AND j.catchup_window_s = p.catchup_window_s
      AND j.misfire_grace_s = p.misfire_grace_s
    RETURNING j.partition_id, j.job_id, j.tenant
), inserted AS (
    INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at,
                      fired_at, node_id, epoch)
    SELECT ad.partition_id, ad.job_id, %(due)s, ad.tenant, %(due)s, statement_timestamp(),
           %(node_id)s, (%(epochs)s::int8[])[ad.partition_id + 1]
    FROM advanced AS ad
    ON CONFLICT (partition_id, job_id, nominal_time) DO NOTHING
    RETURNING 1
)
SELECT (SELECT pids FROM fenced) AS fenced,
       (SELECT count(*) FROM advanced) AS advanced,
       (SELECT count(*) FROM inserted) AS inserted,
       extract(epoch FROM (statement_timestamp() - %(due)s::timestamptz))::float8 AS lag_s;

-- ---------------------------------------------------------------- tenants

-- name: ensure_tenant
INSERT INTO tenants (tenant) VALUES (%(tenant)s)
ON CONFLICT (tenant) DO NOTHING;

-- name: ensure_tenants
INSERT INTO tenants (tenant) SELECT t FROM unnest(%(tenants)s::text[]) AS t
ON CONFLICT (tenant) DO NOTHING;

-- name: insert_tenant
INSERT INTO tenants (tenant, weight, max_rate)
VALUES (%(tenant)s, %(weight)s, %(max_rate)s)
ON CONFLICT (tenant) DO NOTHING
RETURNING tenant;

-- name: update_tenant
UPDATE tenants
SET weight = coalesce(%(weight)s, weight),
    max_rate = CASE WHEN %(clear_max_rate)s THEN NULL ELSE coalesce(%(max_rate)s, max_rate) END
WHERE tenant = %(tenant)s
RETURNING tenant, weight, max_rate;

-- name: list_tenants
SELECT t.tenant, t.weight, t.max_rate, t.created_at,
       (SELECT count(*) FROM jobs AS j WHERE j.tenant = t.tenant AND j.deleted_at IS NULL) AS jobs
FROM tenants AS t
ORDER BY t.tenant;

-- name: tenant_weights
SELECT tenant, weight, max_rate FROM tenants;

-- ---------------------------------------------------------------- jobs

-- name: insert_job
INSERT INTO jobs (partition_id, job_id, tenant, name, kind, cron_expr, cron_dialect, tz,
                  interval_s, anchor_at, fire_at, misfire, catchup_window_s,
                  misfire_grace_s, jitter_s, next_nominal_at, next_due_at,
                  created_at, changed_at)
VALUES (%(partition_id)s, %(job_id)s, %(tenant)s, %(name)s, %(kind)s, %(cron_expr)s,
        %(cron_dialect)s, %(tz)s, %(interval_s)s, %(anchor_at)s, %(fire_at)s, %(misfire)s,
        %(catchup_window_s)s, %(misfire_grace_s)s, %(jitter_s)s, %(next_nominal_at)s,
        %(next_due_at)s, %(created_at)s, %(created_at)s);

-- name: find_job_by_name
SELECT * FROM jobs
WHERE tenant = %(tenant)s AND name = %(name)s AND deleted_at IS NULL
FOR UPDATE;

-- name: replace_job_spec
-- Edit a job in place (jobs add --replace): new spec, next slot recomputed,
-- revision bumped so an in-flight firing of the old spec does not advance it.
UPDATE jobs
SET kind = %(kind)s, cron_expr = %(cron_expr)s, cron_dialect = %(cron_dialect)s, tz = %(tz)s,
    interval_s = %(interval_s)s, anchor_at = %(anchor_at)s, fire_at = %(fire_at)s,
    misfire = %(misfire)s, catchup_window_s = %(catchup_window_s)s,
    misfire_grace_s = %(misfire_grace_s)s, jitter_s = %(jitter_s)s,
    next_nominal_at = CASE WHEN paused THEN NULL ELSE %(next_nominal_at)s::timestamptz END,
    next_due_at = CASE WHEN paused THEN NULL ELSE %(next_due_at)s::timestamptz END,
    revision = revision + 1, changed_at = %(changed_at)s
WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s AND deleted_at IS NULL;

-- name: get_job
SELECT * FROM jobs WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s;

-- name: list_jobs
SELECT * FROM jobs
WHERE deleted_at IS NULL
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
ORDER BY tenant, created_at, job_id
LIMIT %(limit)s;

-- name: set_job_paused
-- Pause (next slot cleared) or resume (next slot recomputed from now by the
-- caller). Slots that pass while paused are not misfires: they never run.
UPDATE jobs
SET paused = %(paused)s,
    next_nominal_at = %(next_nominal_at)s,
    next_due_at = %(next_due_at)s,
    revision = revision + 1,
    changed_at = %(changed_at)s
WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s AND deleted_at IS NULL
RETURNING job_id;

-- name: delete_job
-- Soft delete: the row stays (so audits can tell why runs stopped) until pruned.
UPDATE jobs
SET deleted_at = %(changed_at)s, changed_at = %(changed_at)s,
    next_nominal_at = NULL, next_due_at = NULL, revision = revision + 1
WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s AND deleted_at IS NULL
RETURNING job_id;

-- name: list_runs
SELECT r.partition_id, r.job_id, r.nominal_time, r.tenant, r.scheduled_at, r.fired_at,
       r.node_id, r.epoch,
       extract(epoch FROM (r.fired_at - r.scheduled_at))::float8 AS lateness_s
FROM runs AS r
WHERE (%(job_id)s::uuid IS NULL OR (r.partition_id = %(partition_id)s AND r.job_id = %(job_id)s::uuid))
  AND (%(since)s::timestamptz IS NULL OR r.nominal_time >= %(since)s::timestamptz)
ORDER BY r.nominal_time DESC, r.job_id
LIMIT %(limit)s;

-- ---------------------------------------------------------------- audit

-- name: create_audit_candidates
-- The audit's working tables (dropped at commit). audit_candidates holds
-- every job that may have runs with nominal time in [since, until):
-- "excluded" = changed (paused, resumed, edited, deleted) inside the window,
-- or edited after it (its current spec may not be the one that fired; a
-- deletion after the window keeps the spec and does not exclude);
-- "counted_from" = the instant after which the current spec's slots count;
-- "paused_before" = paused before the window began (no slots expected).
CREATE TEMPORARY TABLE audit_candidates ON COMMIT DROP AS
SELECT partition_id, job_id, kind, cron_expr, cron_dialect, tz, jitter_s,
       paused AND changed_at < %(since)s AS paused_before,
       CASE WHEN changed_at < %(until)s THEN changed_at ELSE created_at END AS counted_from,
       (changed_at > created_at AND changed_at >= %(since)s
        AND NOT (deleted_at IS NOT NULL AND deleted_at = changed_at AND deleted_at >= %(until)s))
         AS excluded
FROM jobs
WHERE created_at < %(until)s
  AND (deleted_at IS NULL OR deleted_at >= %(since)s);

-- name: create_audit_tables
CREATE TEMPORARY TABLE audit_excluded ON COMMIT DROP AS
SELECT partition_id, job_id FROM audit_candidates WHERE excluded;
CREATE TEMPORARY TABLE audit_cron_slots (
    cron_expr TEXT NOT NULL,
    cron_dialect TEXT NOT NULL,
    tz TEXT NOT NULL,
    nominal_time TIMESTAMPTZ NOT NULL
) ON COMMIT DROP;
CREATE TEMPORARY TABLE audit_expected_tmp (
    partition_id INTEGER NOT NULL,
    job_id UUID NOT NULL,
    nominal_time TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (partition_id, job_id, nominal_time)
) ON COMMIT DROP;

-- name: audit_cron_schedules
-- The distinct cron schedules of audited jobs without jitter: their slots are
-- computed once per schedule, however many jobs share it.
SELECT DISTINCT cron_expr, cron_dialect, tz
FROM audit_candidates
WHERE kind = 'cron' AND jitter_s = 0 AND NOT excluded AND NOT paused_before;

-- name: audit_per_job
-- Audited jobs whose slots are computed one job at a time (interval, one-shot,
-- or jittered: jitter depends on the job).
SELECT c.partition_id, c.job_id, c.kind, c.counted_from, j.cron_expr, j.cron_dialect, j.tz,
       j.interval_s, j.anchor_at, j.fire_at, j.jitter_s
FROM audit_candidates AS c
JOIN jobs AS j ON j.partition_id = c.partition_id AND j.job_id = c.job_id
WHERE NOT c.excluded AND NOT c.paused_before AND (c.kind <> 'cron' OR c.jitter_s > 0);

-- name: expand_audit_cron_slots
-- Every audited jitter-free cron job gets its schedule's slots after counted_from.
INSERT INTO audit_expected_tmp (partition_id, job_id, nominal_time)
SELECT c.partition_id, c.job_id, s.nominal_time
FROM audit_candidates AS c
JOIN audit_cron_slots AS s
  ON s.cron_expr = c.cron_expr AND s.cron_dialect = c.cron_dialect AND s.tz = c.tz
WHERE c.kind = 'cron' AND c.jitter_s = 0 AND NOT c.excluded AND NOT c.paused_before
  AND s.nominal_time > c.counted_from;

-- name: analyze_audit_tables
ANALYZE audit_excluded;
ANALYZE audit_expected_tmp;

-- name: compare_audit
-- Set-based comparison of expected slots with runs (see scheduler/audit.py).
WITH audited_runs AS (
    SELECT r.partition_id, r.job_id, r.nominal_time,
           extract(epoch FROM (r.fired_at - r.scheduled_at))::float8 AS lateness_s
    FROM runs AS r
    WHERE r.nominal_time >= %(since)s AND r.nominal_time < %(until)s
      -- a slot jittered past the window is not expected yet, so its run is
      -- not audited either (it may already have fired when auditing the past)
      AND r.scheduled_at <= %(until)s
      AND NOT EXISTS (SELECT 1 FROM audit_excluded AS x
                      WHERE x.partition_id = r.partition_id AND x.job_id = r.job_id)
), unfired AS (
    SELECT e.partition_id, e.job_id, e.nominal_time,
           EXISTS (SELECT 1 FROM skips AS s
                   WHERE s.partition_id = e.partition_id AND s.job_id = e.job_id
                     AND e.nominal_time >= s.first_nominal AND e.nominal_time < s.until_nominal)
             AS skipped
    FROM audit_expected_tmp AS e
    WHERE NOT EXISTS (SELECT 1 FROM runs AS r
                      WHERE r.partition_id = e.partition_id AND r.job_id = e.job_id
                        AND r.nominal_time = e.nominal_time)
)
SELECT (SELECT count(*) FROM audit_expected_tmp) AS expected,
       (SELECT count(*) FROM audited_runs) AS runs,
       (SELECT count(*) FROM unfired WHERE NOT skipped) AS missing,
       (SELECT count(*) FROM unfired WHERE skipped) AS skipped,
       (SELECT count(*) FROM (SELECT 1 FROM audited_runs
                              GROUP BY partition_id, job_id, nominal_time
                              HAVING count(*) > 1) AS d) AS duplicates,
       (SELECT count(*) FROM audited_runs AS a
        WHERE NOT EXISTS (SELECT 1 FROM audit_expected_tmp AS e
                          WHERE e.partition_id = a.partition_id AND e.job_id = a.job_id
                            AND e.nominal_time = a.nominal_time)) AS unexpected,
       (SELECT count(*) FROM audit_candidates) - (SELECT count(*) FROM audit_excluded) AS jobs_audited,
       (SELECT count(*) FROM audit_excluded) AS jobs_excluded,
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lateness_s) FROM audited_runs) AS lateness_p50_s,
       (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness_s) FROM audited_runs) AS lateness_p99_s,
       (SELECT max(lateness_s) FROM audited_runs) AS lateness_max_s;

-- name: recent_lag
-- Runs fired in the last %(window_s)s seconds and their lateness p99 (live views).
SELECT count(*) AS runs,
       percentile_cont(0.99) WITHIN GROUP (
           ORDER BY extract(epoch FROM (fired_at - scheduled_at))::float8) AS p99_s
FROM runs
WHERE fired_at > now() - %(window_s)s * interval '1 second';

-- ---------------------------------------------------------------- measurement

-- name: count_owned_partitions
-- Partitions whose lease is held by a live-looking owner (not expired).
SELECT count(*) AS owned FROM partitions
WHERE owner_node IS NOT NULL AND lease_expires_at > now();

-- name: count_due_at
-- Jobs still due at or before an instant. One range scan of
-- jobs_tenant_due_idx per tenant, over the due entries only: its cost falls
-- as a herd drains, so the bench can poll it during one. (A plain
-- `WHERE next_due_at <= t` has no index to use and scans the whole table:
-- 1.3 s of store CPU per poll on 5 M jobs, stolen from the herd it measures.)
SELECT coalesce(sum(c.n), 0)::int8 AS due
FROM tenants AS t
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM jobs AS d
    WHERE d.tenant = t.tenant AND d.next_due_at <= %(nominal)s
) AS c;

-- name: any_due_at
-- Whether any job is still due at or before an instant: one index probe per
-- tenant (the bench's drain check, polled twice a second).
SELECT EXISTS (
    SELECT 1 FROM tenants AS t
    WHERE EXISTS (SELECT 1 FROM jobs AS d WHERE d.tenant = t.tenant AND d.next_due_at <= %(nominal)s)
) AS due;

-- name: herd_stats
-- Drain time (last fired_at − nominal) and lateness of the runs of one
-- nominal instant, overall and for the 'big' tenant vs the others.
SELECT count(*) AS runs,
       extract(epoch FROM (max(fired_at) - %(nominal)s::timestamptz))::float8 AS drain_s,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM (fired_at - scheduled_at))::float8) AS lag_p50_s,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM (fired_at - scheduled_at))::float8) AS lag_p99_s,
       max(extract(epoch FROM (fired_at - scheduled_at))::float8) AS lag_max_s,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM (fired_at - scheduled_at))::float8)
           FILTER (WHERE tenant = 'big') AS big_p99_s,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM (fired_at - scheduled_at))::float8)
           FILTER (WHERE tenant <> 'big') AS small_p99_s
FROM runs
WHERE nominal_time = %(nominal)s;

-- name: herd_series
-- Runs per 100 ms of fired_at, with max lateness, per tenant class (plots).
SELECT floor(extract(epoch FROM (fired_at - %(nominal)s::timestamptz)) * 10)::int AS bucket,
       (tenant = 'big') AS big,
       count(*) AS runs,
       max(extract(epoch FROM (fired_at - scheduled_at))::float8) AS lag_max_s
FROM runs
WHERE nominal_time = %(nominal)s
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: partitions_of_node
SELECT partition_id FROM partitions WHERE owner_node = %(node_id)s ORDER BY partition_id;

-- name: count_orphans_among
-- Of the given partitions, those not (yet) owned by another node with a live lease.
SELECT count(*) AS orphans FROM partitions
WHERE partition_id = ANY(%(partition_ids)s::int4[])
  AND (owner_node IS NULL OR owner_node = %(node_id)s OR lease_expires_at <= now());

-- name: lateness_in_partitions
SELECT extract(epoch FROM (fired_at - scheduled_at))::float8 AS lateness_s
FROM runs
WHERE partition_id = ANY(%(partition_ids)s::int4[])
  AND nominal_time >= %(since)s AND nominal_time < %(until)s;

-- name: coordination_writes
-- Row writes to the coordination tables so far (PostgreSQL statistics; the
-- bench's measure of what leases and heartbeats cost the store).
SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::int8 AS writes
FROM pg_stat_user_tables
WHERE relname IN ('partitions', 'nodes');

-- name: partition_claims
-- Owner, claim time and lease expiry (store time) of the given partitions.
SELECT partition_id, owner_node, owner_epoch, acquired_at, lease_expires_at
FROM partitions
WHERE partition_id = ANY(%(partition_ids)s::int4[]);

-- name: store_transactions
-- Transactions this database has run so far, every session (PostgreSQL
-- statistics; the bench compares coordinators' and poll intervals' load).
SELECT (xact_commit + xact_rollback)::int8 AS xacts
FROM pg_stat_database
WHERE datname = current_database();

-- ---------------------------------------------------------------- retention

-- name: prune_runs
-- One bounded batch of the retention walk (scheduler/retention.py): delete up
-- to %(limit)s runs of the given partitions whose nominal time is before
-- %(cutoff)s, walking the primary key after the keyset (%(after_pid)s,
-- %(after_job)s, %(after_time)s) (NULL: from the start). Returns the deleted
-- keys; the caller continues after the largest. Set-based and ctid-free, so
-- valid on CockroachDB; retried whole on 40001 (deleting is idempotent).
DELETE FROM runs
WHERE (partition_id, job_id, nominal_time) IN (
    SELECT partition_id, job_id, nominal_time
    FROM runs
    WHERE partition_id = ANY(%(partition_ids)b::int4[])
      AND (%(after_pid)s::int4 IS NULL
           OR (partition_id, job_id, nominal_time)
              > (%(after_pid)s::int4, %(after_job)s::uuid, %(after_time)s::timestamptz))
      AND nominal_time < %(cutoff)s
    ORDER BY partition_id, job_id, nominal_time
    LIMIT %(limit)s)
RETURNING partition_id, job_id, nominal_time AS key_time;

-- name: prune_skips
-- As prune_runs for skip ranges that ended before %(cutoff)s.
DELETE FROM skips
WHERE (partition_id, job_id, first_nominal) IN (
    SELECT partition_id, job_id, first_nominal
    FROM skips
    WHERE partition_id = ANY(%(partition_ids)b::int4[])
      AND (%(after_pid)s::int4 IS NULL
           OR (partition_id, job_id, first_nominal)
              > (%(after_pid)s::int4, %(after_job)s::uuid, %(after_time)s::timestamptz))
      AND until_nominal < %(cutoff)s
    ORDER BY partition_id, job_id, first_nominal
    LIMIT %(limit)s)
RETURNING partition_id, job_id, first_nominal AS key_time;

-- name: prune_jobs
-- As prune_runs for jobs soft-deleted before %(cutoff)s (their runs and skips
-- are older still, so they are pruned first). Jobs are keyed on
-- (partition_id, job_id): key_time is always NULL.
DELETE FROM jobs
WHERE (partition_id, job_id) IN (
    SELECT partition_id, job_id
    FROM jobs
    WHERE partition_id = ANY(%(partition_ids)b::int4[])
      AND (%(after_pid)s::int4 IS NULL
           OR (partition_id, job_id) > (%(after_pid)s::int4, %(after_job)s::uuid))
      AND deleted_at < %(cutoff)s
    ORDER BY partition_id, job_id
    LIMIT %(limit)s)
RETURNING partition_id, job_id, NULL::timestamptz AS key_time;

-- name: count_jobs
-- Jobs in the store, deleted ones included.
SELECT count(*) AS n FROM jobs;
