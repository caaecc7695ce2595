-- Named queries of the trigger engine. Loaded once by scheduler/store/queries.py
-- (the bench's own measurements are in bench/sql/queries.sql).
-- Rules (docs/design.md §7, the PostgreSQL/CockroachDB common subset):
--   * store time (now(), statement_timestamp()) is the only clock for leases
--     and due times; never clock_timestamp();
--   * the store clock can be pinned (tests): a time-dependent query takes a
--     nullable %(now)s and reads coalesce(%(now)s::timestamptz, now()), or
--     statement_timestamp() in the firing statements' place (River's
--     pattern). A node passes its clock's pin (scheduler/clock.py, "The
--     pinned store clock"), which is always NULL in production;
--   * every write that depends on owning a partition carries node and epoch
--     in its WHERE clause (the fence is inside the statement);
--   * ON CONFLICT names its conflict columns; no UPSERT, no advisory locks,
--     no LISTEN/NOTIFY; SKIP LOCKED only spreads work;
--   * arrays are bound as binary parameters (%(x)b).

-- ---------------------------------------------------------------- membership

-- name: upsert_heartbeat
-- Membership heartbeat of one node process at store time %(now)s (NULL:
-- now()); returns that clock.
INSERT INTO nodes (node_id, incarnation, host, pid, started_at, heartbeat_at)
VALUES (%(node_id)s, %(incarnation)s, %(host)s, %(pid)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (node_id) DO UPDATE
SET incarnation = excluded.incarnation,
    host = excluded.host,
    pid = excluded.pid,
    started_at = CASE WHEN nodes.incarnation = excluded.incarnation
                      THEN nodes.started_at ELSE excluded.started_at END,
    heartbeat_at = excluded.heartbeat_at
RETURNING coalesce(%(now)s::timestamptz, now()) AS store_now;

-- name: list_live_nodes
-- Nodes whose heartbeat is younger than %(max_age_s)s seconds, by store
-- time (the lease loop passes Settings.responsive_s: the nodes shares are
-- computed over). %(now)s: the store clock's pin (NULL: now()).
SELECT node_id, incarnation
FROM nodes
WHERE heartbeat_at > coalesce(%(now)s::timestamptz, now()) - %(max_age_s)s * interval '1 second'
ORDER BY node_id;

-- name: delete_heartbeat
-- Graceful leave: only this incarnation's row (a successor may own the id).
DELETE FROM nodes WHERE node_id = %(node_id)s AND incarnation = %(incarnation)s;

-- name: prune_nodes
-- Rows of nodes dead for longer than prune_after_s (at %(now)s; NULL: now()).
DELETE FROM nodes
WHERE heartbeat_at < coalesce(%(now)s::timestamptz, now()) - %(prune_after_s)s * interval '1 second';

-- ---------------------------------------------------------------- leases

-- name: claim_partitions
-- Claim up to %(limit)s free or expired leases and bump their partitions'
-- epoch, in one statement:
--   picked  free or expired lease rows, locked. SKIP LOCKED only spreads
--           concurrent claimers over different rows (the order is a per-node
--           pseudo-random permutation); the lock re-reads the row and
--           re-checks "free or expired", so of concurrent claimers exactly
--           one gets each row, and a renewal that committed first wins;
--   bumped  owner_epoch + 1 on the partition rows (the fence). This UPDATE
--           waits for the share locks of an in-flight firing statement of the
--           previous owner: the takeover waits for its commit (docs/design.md §2);
--   the lease rows get owner, epoch copy and expiry (re-checked: a row that
--           is no longer free or expired keeps its lease; its partition's
--           epoch moved on, which only fences its holder out).
-- "Expired" and the new expiry are judged at %(now)s (NULL: now()).
WITH picked AS (
    SELECT partition_id
    FROM leases
    WHERE owner_node IS NULL OR lease_expires_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY md5(%(node_id)s || partition_id::text)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), bumped AS (
    UPDATE partitions AS p
    SET owner_node = %(node_id)s,
        owner_epoch = p.owner_epoch + 1
    FROM picked
    WHERE p.partition_id = picked.partition_id
    RETURNING p.partition_id, p.owner_epoch
)
UPDATE leases AS l
SET owner_node = %(node_id)s,
    owner_epoch = b.owner_epoch,
    lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(ttl_s)s * interval '1 second',
    acquired_at = coalesce(%(now)s::timestamptz, now()),
    renewed_at = coalesce(%(now)s::timestamptz, now())
FROM bumped AS b
WHERE l.partition_id = b.partition_id
  AND (l.owner_node IS NULL OR l.lease_expires_at <= coalesce(%(now)s::timestamptz, now()))
RETURNING l.partition_id, l.owner_epoch, l.renewed_at;

-- name: claim_partitions_at_epoch
-- Coordinators with an external epoch source (etcd: the claim's revision).
-- Writes owner_epoch = %(epoch)s on the partition rows only where it is
-- below it, so an owner that paused before writing cannot overwrite a newer
-- one, and the lease rows of the partitions so taken (owner, epoch copy,
-- expiry; informational: etcd holds the lease itself). Returns the
-- partitions taken; a partition missing from the result has a stored epoch
-- >= %(epoch)s. Lease times are store time %(now)s (NULL: now()).
WITH bumped AS (
    UPDATE partitions
    SET owner_node = %(node_id)s,
        owner_epoch = %(epoch)s
    WHERE partition_id = ANY(%(partition_ids)b::int4[])
      AND owner_epoch < %(epoch)s
    RETURNING partition_id, owner_epoch
)
UPDATE leases AS l
SET owner_node = %(node_id)s,
    owner_epoch = b.owner_epoch,
    lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(ttl_s)s * interval '1 second',
    acquired_at = coalesce(%(now)s::timestamptz, now()),
    renewed_at = coalesce(%(now)s::timestamptz, now())
FROM bumped AS b
WHERE l.partition_id = b.partition_id
RETURNING l.partition_id, l.owner_epoch;

-- name: renew_leases
-- Renew all of one node's leases in one statement, keyed on (node, epoch):
-- a lease whose epoch moved on (taken over) is simply not returned. Writes
-- only lease rows, never the partition rows the firing fence locks, so the
-- fence's share locks cannot make a renewal wait. The new expiry counts
-- from store time %(now)s (NULL: now()). Returns, per lease renewed, its
-- renewed_at before (prior_renewed_at: the statement's snapshot, through
-- the self-join) and after: the node compares the prior value with what its
-- last renewal wrote, to notice a store that lost that write
-- (scheduler/coordination/rewind.py).
UPDATE leases AS l
SET lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(ttl_s)s * interval '1 second',
    renewed_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(partition_ids)b::int4[], %(epochs)b::int8[]) AS r (pid, epoch), leases AS prior
WHERE l.partition_id = r.pid
  AND l.owner_epoch = r.epoch
  AND l.owner_node = %(node_id)s
  AND prior.partition_id = l.partition_id
RETURNING l.partition_id, l.owner_epoch, prior.renewed_at AS prior_renewed_at, l.renewed_at;

-- name: release_leases
-- Hand leases back (graceful stop, or over the fair share), keyed on (node,
-- epoch). Lease rows only: the partition row keeps its owner and epoch
-- (the fence) until the next claimer bumps the epoch.
UPDATE leases AS l
SET owner_node = NULL,
    lease_expires_at = NULL
FROM unnest(%(partition_ids)b::int4[], %(epochs)b::int8[]) AS r (pid, epoch)
WHERE l.partition_id = r.pid
  AND l.owner_epoch = r.epoch
  AND l.owner_node = %(node_id)s
RETURNING l.partition_id;

-- name: select_fences
-- The fence rows (owner, epoch) of %(partition_ids)s, by partition: the
-- lease loop compares them with the epochs it was granted, after a renewal
-- missed leases and after a reconnect (scheduler/coordination/rewind.py).
SELECT partition_id, owner_node, owner_epoch
FROM partitions
WHERE partition_id = ANY(%(partition_ids)b::int4[])
ORDER BY partition_id;

-- name: select_runs_present
-- The rewind check of the firer's marks (scheduler/coordination/rewind.py,
-- RunMarks): per remembered run (pids[i], jids[i], nominals[i]), what the
-- store holds of it now: the run's node_id and epoch (NULL: no such run) and
-- its job's slot (job_exists false: no such job row). One primary-key probe
-- of runs and one of jobs per key; at most one key per partition.
SELECT a.pid AS partition_id, a.jid AS job_id, a.nominal AS nominal_time,
       r.node_id AS run_node, r.epoch AS run_epoch,
       j.job_id IS NOT NULL AS job_exists, j.next_nominal_at
FROM unnest(%(pids)b::int4[], %(jids)b::uuid[], %(nominals)b::timestamptz[]) AS a (pid, jid, nominal)
LEFT JOIN runs AS r ON r.partition_id = a.pid AND r.job_id = a.jid AND r.nominal_time = a.nominal
LEFT JOIN jobs AS j ON j.partition_id = a.pid AND j.job_id = a.jid
ORDER BY a.pid;

-- name: partition_status
-- Every partition with its lease's owner, the fence's epoch, and the
-- lease's time left and age (seconds, at store time %(now)s; NULL: now()).
SELECT p.partition_id, l.owner_node, p.owner_epoch,
       extract(epoch FROM (l.lease_expires_at - coalesce(%(now)s::timestamptz, now())))::float8
           AS lease_left_s,
       extract(epoch FROM (coalesce(%(now)s::timestamptz, now()) - l.renewed_at))::float8
           AS lease_age_s
FROM partitions AS p
JOIN leases AS l ON l.partition_id = p.partition_id
ORDER BY p.partition_id;

-- name: node_status
-- Every node row with its heartbeat age (seconds, at store time %(now)s;
-- NULL: now()).
SELECT node_id, incarnation, host, pid, started_at,
       extract(epoch FROM (coalesce(%(now)s::timestamptz, now()) - heartbeat_at))::float8
           AS heartbeat_age_s
FROM nodes
ORDER BY node_id;

-- ---------------------------------------------------------------- firing

-- name: select_due_jobs
-- Due timers of the node's firable partitions, per tenant, oldest due first
-- ((next_due_at, partition_id, job_id) order: jobs_due_schedule_idx), at
-- most %(quotas)s[i] for tenant %(tenants)s[i] (the fairness allocator's
-- quotas), after the cursor (%(after_due)s[i], %(after_pid)s[i],
-- %(after_job)s[i]) (a second pass in the same tick continues where the
-- first stopped; the first passes the NO_CURSOR sentinel of
-- scheduler/firing/state.py, older than any timer: a cursor that is never NULL
-- keeps the row comparison an index qualifier, so a scan starts at the
-- cursor instead of walking, and filtering, everything before it). Reads
-- only: the fence is in fire_runs. Due means next_due_at <= %(now)s (the
-- store clock's pin; NULL: now()), which is returned as the store's clock.
-- The column ORDER is part of the contract (scheduler/firing/batch.py reads rows
-- as tuples); job_id comes as text, which is how fire_runs takes it back.
SELECT j.partition_id, j.job_id::text, j.tenant, j.kind, j.cron_expr, j.cron_dialect,
       j.tz, j.interval_s, j.anchor_at, j.fire_at, j.misfire,
       j.catchup_window_s, j.misfire_grace_s, j.jitter_s,
       j.next_nominal_at, j.next_due_at, j.revision,
       coalesce(%(now)s::timestamptz, now()) AS store_now
FROM unnest(%(tenants)b::text[], %(quotas)b::int8[], %(after_due)b::timestamptz[],
            %(after_pid)b::int4[], %(after_job)b::uuid[])
     AS q (tenant, quota, after_due, after_pid, after_job)
CROSS JOIN LATERAL (
    SELECT *
    FROM jobs AS d
    WHERE d.tenant = q.tenant
      AND d.next_due_at <= coalesce(%(now)s::timestamptz, now())
      AND (d.next_due_at, d.partition_id, d.job_id) > (q.after_due, q.after_pid, q.after_job)
      AND d.partition_id = ANY(%(partition_ids)b::int4[])
    ORDER BY d.next_due_at, d.partition_id, d.job_id
    LIMIT q.quota
) AS j;

-- name: herd_heads
-- The herd finder (scheduler/firing/herds.py). For each tenant
-- %(tenants)s[i]: the instant (next_due_at) of its oldest due timer in the
-- node's firable partitions after the cursor (%(after_due)s[i],
-- %(after_pid)s[i], %(after_job)s[i]) (never NULL, as in select_due_jobs),
-- returned only if at least %(min_jobs)s of its timers there are due at
-- that instant (after the cursor). Due: next_due_at <= %(now)s (the store
-- clock's pin; NULL: now()). Index entries only (index-only scans of
-- jobs_due_schedule_idx while pages are all-visible): per tenant one
-- ordered probe, then a walk of at most %(min_jobs)s entries at the instant
-- (small tenants stop there). Returns each herd's tenant and instant, and the
-- store's clock (%(now)s; NULL: now()), the `now` its plans are made for.
SELECT h.tenant, h.due, coalesce(%(now)s::timestamptz, now()) AS store_now
FROM (
    SELECT q.tenant, q.after_due, q.after_pid, q.after_job, f.next_due_at AS due
    FROM unnest(%(tenants)b::text[], %(after_due)b::timestamptz[], %(after_pid)b::int4[],
                %(after_job)b::uuid[]) AS q (tenant, after_due, after_pid, after_job)
    CROSS JOIN LATERAL (
        SELECT x.next_due_at
        FROM jobs AS x
        WHERE x.tenant = q.tenant
          AND x.next_due_at <= coalesce(%(now)s::timestamptz, now())
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

-- name: lookahead_schedule_keys
-- The firer's look-ahead (scheduler/firing/lookahead.py): the distinct
-- (tenant, schedule key, due instant) triples of the timers of tenants
-- %(tenants)s due in (%(after)s, %(until)s] in the node's firable partitions
-- %(partition_ids)s, each with its timer count n (which tenants have a herd
-- coming, without a second walk), at most %(max_keys)s, by due instant.
-- Due-index entries only (schedule_key is the last column of
-- jobs_due_schedule_idx): one range walk per tenant.
SELECT d.tenant, d.schedule_key, d.next_due_at AS due, count(*)::int8 AS n
FROM unnest(%(tenants)b::text[]) AS t (tenant)
CROSS JOIN LATERAL (
    SELECT x.tenant, x.schedule_key, x.next_due_at
    FROM jobs AS x
    WHERE x.tenant = t.tenant
      AND x.next_due_at > %(after)s
      AND x.next_due_at <= %(until)s
      AND x.partition_id = ANY(%(partition_ids)b::int4[])
      AND x.schedule_key IS NOT NULL
) AS d
GROUP BY d.next_due_at, d.tenant, d.schedule_key
ORDER BY d.next_due_at
LIMIT %(max_keys)s;

-- name: lookahead_herds
-- The herds of the coming seconds, measured ahead (scheduler/firing/herds.py,
-- HerdFinder.read_ahead; asked only for the tenants lookahead_schedule_keys
-- showed with a herd coming): for each tenant of %(tenants)s and instant in
-- (%(after)s, %(until)s] at which at least %(min_jobs)s of its timers in the
-- node's firable partitions %(partition_ids)s fall due, one row per partition
-- holding some of them, in (tenant, due, partition_id) order: their count n,
-- and their schedule keys (ascending) with each key's count (timers without a
-- key count in n only). At most %(max_rows)s rows (a cut read is not used).
-- Due-index entries only (jobs_due_schedule_idx), one range walk per tenant,
-- the same walk as lookahead_schedule_keys: read before the instant, while
-- the pages are all-visible, what herd_counts and herd_schedule_keys would
-- read at it, when the first pass's updates make every entry a heap visit.
WITH e AS MATERIALIZED (
    SELECT t.tenant, x.next_due_at AS due, x.partition_id, x.schedule_key
    FROM unnest(%(tenants)b::text[]) AS t (tenant)
    CROSS JOIN LATERAL (
        SELECT y.next_due_at, y.partition_id, y.schedule_key
        FROM jobs AS y
        WHERE y.tenant = t.tenant
          AND y.next_due_at > %(after)s
          AND y.next_due_at <= %(until)s
          AND y.partition_id = ANY(%(partition_ids)b::int4[])
    ) AS x
), herds AS (
    SELECT e.tenant, e.due
    FROM e
    GROUP BY e.tenant, e.due
    HAVING count(*) >= %(min_jobs)s
), per_key AS (
    SELECT e.tenant, e.due, e.partition_id, e.schedule_key, count(*) AS n
    FROM e
    JOIN herds AS h ON h.tenant = e.tenant AND h.due = e.due
    GROUP BY e.tenant, e.due, e.partition_id, e.schedule_key
)
SELECT k.tenant, k.due, k.partition_id, sum(k.n)::int8 AS n,
       coalesce(array_agg(k.schedule_key ORDER BY k.schedule_key)
                FILTER (WHERE k.schedule_key IS NOT NULL), '{}') AS keys,
       coalesce(array_agg(k.n ORDER BY k.schedule_key)
                FILTER (WHERE k.schedule_key IS NOT NULL), '{}') AS key_counts
FROM per_key AS k
GROUP BY k.tenant, k.due, k.partition_id
ORDER BY k.tenant, k.due, k.partition_id
LIMIT %(max_rows)s;

-- name: herd_counts
-- A herd's size per partition: the timers of tenant %(tenant)s due at
-- %(due)s in each of partitions %(pids)s (after (%(after_pid)s,
-- %(after_job)s) when given), partitions with none left out. One exact
-- probe of jobs_due_schedule_idx per partition (a join with the list on
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

-- name: herd_schedule_keys
-- The schedules of a herd (the timers of tenant %(tenant)s due at %(due)s in
-- partitions %(pids)s, after (%(after_pid)s, %(after_job)s) when given),
-- with their timer counts, most common first, at most %(max_keys)s: index
-- entries only (schedule_key is the last column of jobs_due_schedule_idx;
-- one exact probe per partition, as in herd_counts). Timers without a key
-- (a collision, or not yet given one) are left out: they fire per timer.
-- (The `now` the plans are made for is herd_heads' store_now.)
SELECT d.schedule_key, count(*)::int8 AS n
FROM unnest(%(pids)b::int4[]) AS o (pid)
CROSS JOIN LATERAL (
    SELECT x.schedule_key
    FROM jobs AS x
    WHERE x.tenant = %(tenant)s
      AND x.next_due_at = %(due)s
      AND x.partition_id = o.pid
      AND x.schedule_key IS NOT NULL
      AND (%(after_pid)s::int4 IS NULL
           OR (x.partition_id, x.job_id) > (%(after_pid)s::int4, %(after_job)s::uuid))
) AS d
GROUP BY d.schedule_key
ORDER BY n DESC, d.schedule_key
LIMIT %(max_keys)s;

-- name: select_schema_version
-- The store's schema revision(s) as alembic recorded them (the node's start-up
-- check compares them with the code's head; a missing table means no schema).
SELECT version_num FROM alembic_version;

-- name: store_now
-- The store's clock: %(now)s when the caller pins it (tests), else now().
SELECT coalesce(%(now)s::timestamptz, now()) AS store_now;

-- name: store_read_only
-- Whether this session may write ('on': a standby, or default_transaction_
-- read_only): the readiness probe's second question (a store that answers
-- reads and refuses every write lets a node fire nothing).
SELECT current_setting('transaction_read_only') AS read_only;

-- name: fire_runs
-- The fenced firing statement (docs/design.md §4). One statement, so atomic:
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
--            is fenced, nobody edited it since it was read (revision), its
--            slot is still the one the plan was made from (p_from) and the
--            new slot is later: a compare-and-set that only moves forward,
--            so a chunk whose client gave up but which the store commits
--            after a later tick advanced the job changes nothing (and cannot
--            fire again a slot whose run retention pruned);
--            returns its tenant, fencing epoch and its plan's fires/skip;
--   skipped  records misfire decisions of advanced jobs;
--   inserted writes one run per (job, nominal time) of advanced jobs whose
--            overlap policy is allow; the primary key makes a duplicate
--            impossible. The run is born with its delivery state
--            (docs/delivery.md): pending, available from its fired_at, to the
--            job's queue (NULL: pushed to its URL).
--   guarded  the fires of advanced jobs whose overlap policy is not allow
--            (docs/delivery.md, "Overlap policy"), each with k, its place
--            among its plan's fires, and busy, the job's unfinished runs
--            (0, 1 or 2+: runs_overlap_idx, read only for these jobs, so
--            allow jobs pay nothing); fate: run, buffer (pending, available_at
--            NULL, so no claim takes it, until the owner's release step), replaced (replace:
--            a catch-up fire followed by a later one in the same plan, born
--            canceled) or skip;
--   doomed / replaced  the unfinished runs of replace jobs that fire, found
--            by a probe per job (a LATERAL over runs_overlap_idx, so the walk
--            starts from the job, never from the index's whole extent),
--            canceled (their token stops working: heartbeat and ack answer
--            canceled);
--   overlap_ins / overlap_skipped  the guarded runs (runs.overlap = the
--            policy), and one skip range per job for the skipped fires
--            (reason overlap; a suffix of its plan's fires, so the range
--            ends at its next slot).
-- A run's fired_at and a skip's recorded_at are the statement's timestamp,
-- or the store clock's pin %(now)s when given (tests: exact lateness).
-- Shape of the parameters (scheduler/firing/batch.py, Batch): a job is four
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
-- Returns the fenced partitions, the counts and the runs' lateness, and
-- the rewind marks (scheduler/coordination/rewind.py, RunMarks): per
-- partition with a run inserted, ascending, its highest run (nominal time,
-- then job id) and the epoch it was fired under (mark_pids, mark_jobs,
-- mark_nominals, mark_epochs: parallel arrays, one aggregate over the
-- statement's own inserted rows, no read).
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
      AND j.next_nominal_at = (%(p_from)b::timestamptz[])[a.plan]
      AND ((%(p_next_nominal)b::timestamptz[])[a.plan] IS NULL
           OR (%(p_next_nominal)b::timestamptz[])[a.plan] > j.next_nominal_at)
      AND (fd.pids[a.fpos] = a.pid OR a.pid = ANY(fd.pids))
    RETURNING j.partition_id, j.job_id, j.tenant, j.queue, j.overlap, j.next_nominal_at,
              coalesce(j.name, '') AS job_name,
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
           coalesce(%(now)s::timestamptz, statement_timestamp()), %(node_id)s, ad.epoch
    FROM advanced AS ad
    WHERE ad.skip > 0
    ON CONFLICT (partition_id, job_id, first_nominal) DO NOTHING
    RETURNING 1
), fires AS (
    SELECT ad.partition_id, ad.job_id, ad.tenant, ad.queue, ad.job_name, ad.epoch,
           generate_series(ad.fire_lo, ad.fire_hi) AS i
    FROM advanced AS ad
    WHERE ad.overlap = 'allow'
), inserted AS (
    INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at,
                      fired_at, node_id, epoch, state, queue, origin, available_at, job_name)
    SELECT r.partition_id, r.job_id, (%(f_nominal)b::timestamptz[])[r.i], r.tenant,
           (%(f_scheduled)b::timestamptz[])[r.i],
           coalesce(%(now)s::timestamptz, statement_timestamp()), %(node_id)s, r.epoch,
           'pending', r.queue, 'schedule', coalesce(%(now)s::timestamptz, statement_timestamp()),
           r.job_name
    FROM fires AS r
    ON CONFLICT (partition_id, job_id, nominal_time) DO NOTHING
    RETURNING partition_id, job_id, nominal_time, epoch,
              extract(epoch FROM (fired_at - scheduled_at))::float8 AS lag_s
), guarded AS (
    SELECT ad.partition_id, ad.job_id, ad.tenant, ad.queue, ad.job_name, ad.epoch, ad.overlap, ad.next_nominal_at,
           (%(f_nominal)b::timestamptz[])[g.i] AS nominal, (%(f_scheduled)b::timestamptz[])[g.i] AS scheduled,
           (%(f_nominal)b::timestamptz[])[ad.fire_hi] AS last_nominal,
           CASE WHEN ad.overlap = 'replace' THEN
                  CASE WHEN g.i = ad.fire_hi THEN 'run' ELSE 'replaced' END
                WHEN b.busy + g.k = 1 THEN 'run'
                WHEN ad.overlap = 'buffer_one' AND b.busy + g.k = 2 THEN 'buffer'
                ELSE 'skip' END AS fate
    FROM advanced AS ad
    CROSS JOIN LATERAL generate_series(ad.fire_lo, ad.fire_hi) WITH ORDINALITY AS g (i, k)
    CROSS JOIN LATERAL (
        SELECT count(*) AS busy
        FROM (SELECT 1 FROM runs AS u
              WHERE u.partition_id = ad.partition_id AND u.job_id = ad.job_id
                AND u.overlap IS NOT NULL AND u.state IN ('pending', 'leased', 'failed')
              LIMIT 2) AS x
    ) AS b
    WHERE ad.overlap <> 'allow'
), doomed AS MATERIALIZED (
    SELECT x.partition_id, x.job_id, x.nominal_time, gd.nominal AS by_nominal
    FROM guarded AS gd
    CROSS JOIN LATERAL (
        SELECT u.partition_id, u.job_id, u.nominal_time
        FROM runs AS u
        WHERE u.partition_id = gd.partition_id AND u.job_id = gd.job_id
          AND u.overlap IS NOT NULL AND u.state IN ('pending', 'leased', 'failed')
        OFFSET 0  -- a fence: the probe stays per job (not flattened into a walk of the index)
    ) AS x
    WHERE gd.overlap = 'replace' AND gd.fate = 'run'
), replaced AS (
    UPDATE runs AS u
    SET state = 'canceled',
        finished_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
        leased_until = NULL,
        last_error = 'replaced by run ' || d.job_id::text || '.'
                     || (floor(extract(epoch FROM date_trunc('second', d.by_nominal)))::int8 * 1000000
                         + mod(extract(microseconds FROM d.by_nominal)::int8, 1000000))::text
    FROM doomed AS d
    WHERE u.partition_id = d.partition_id AND u.job_id = d.job_id AND u.nominal_time = d.nominal_time
      AND u.state IN ('pending', 'leased', 'failed')
    RETURNING 1
), overlap_ins AS (
    INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at,
                      fired_at, node_id, epoch, state, queue, origin, available_at, overlap,
                      finished_at, last_error, job_name)
    SELECT gd.partition_id, gd.job_id, gd.nominal, gd.tenant, gd.scheduled,
           coalesce(%(now)s::timestamptz, statement_timestamp()), %(node_id)s, gd.epoch,
           CASE gd.fate WHEN 'replaced' THEN 'canceled' ELSE 'pending' END, gd.queue, 'schedule',
           CASE gd.fate WHEN 'buffer' THEN NULL
                ELSE coalesce(%(now)s::timestamptz, statement_timestamp()) END,
           gd.overlap,
           CASE gd.fate WHEN 'replaced' THEN coalesce(%(now)s::timestamptz, statement_timestamp()) END,
           CASE gd.fate WHEN 'replaced' THEN
             'replaced by run ' || gd.job_id::text || '.'
             || (floor(extract(epoch FROM date_trunc('second', gd.last_nominal)))::int8 * 1000000
                 + mod(extract(microseconds FROM gd.last_nominal)::int8, 1000000))::text END,
           gd.job_name
    FROM guarded AS gd
    WHERE gd.fate <> 'skip'
    ON CONFLICT (partition_id, job_id, nominal_time) DO NOTHING
    RETURNING partition_id, job_id, nominal_time, epoch,
              extract(epoch FROM (fired_at - scheduled_at))::float8 AS lag_s
), overlap_skipped AS (
    INSERT INTO skips (partition_id, job_id, first_nominal, until_nominal, slots,
                       reason, recorded_at, node_id, epoch)
    SELECT gd.partition_id, gd.job_id, min(gd.nominal),
           coalesce(min(gd.next_nominal_at), max(gd.nominal) + interval '1 microsecond'),
           count(*), 'overlap', coalesce(%(now)s::timestamptz, statement_timestamp()), %(node_id)s,
           min(gd.epoch)
    FROM guarded AS gd
    WHERE gd.fate = 'skip'
    GROUP BY gd.partition_id, gd.job_id
    ON CONFLICT (partition_id, job_id, first_nominal) DO NOTHING
    RETURNING 1
), marks AS (
    SELECT m.partition_id, max(m.nominal_time) AS nominal_time, max(m.epoch) AS epoch,
           (array_agg(m.job_id ORDER BY m.nominal_time DESC, m.job_id DESC))[1] AS job_id
    FROM (SELECT partition_id, job_id, nominal_time, epoch FROM inserted
          UNION ALL SELECT partition_id, job_id, nominal_time, epoch FROM overlap_ins) AS m
    GROUP BY m.partition_id
)
SELECT (SELECT pids FROM fenced) AS fenced,
       (SELECT count(*) FROM advanced) AS advanced,
       (SELECT count(*) FROM skipped) + (SELECT count(*) FROM overlap_skipped) AS skipped,
       (SELECT count(*) FROM inserted) + (SELECT count(*) FROM overlap_ins) AS inserted,
       (SELECT coalesce(array_agg(lag_s), '{}') FROM (SELECT lag_s FROM inserted
                                                    UNION ALL SELECT lag_s FROM overlap_ins) AS l) AS lags_s,
       (SELECT coalesce(array_agg(partition_id ORDER BY partition_id), '{}') FROM marks) AS mark_pids,
       (SELECT coalesce(array_agg(job_id ORDER BY partition_id), '{}') FROM marks) AS mark_jobs,
       (SELECT coalesce(array_agg(nominal_time ORDER BY partition_id), '{}') FROM marks) AS mark_nominals,
       (SELECT coalesce(array_agg(epoch ORDER BY partition_id), '{}') FROM marks) AS mark_epochs;

-- name: fire_group
-- The fenced firing statement for one herd chunk (scheduler/firing/herds.py):
-- the jitter-free timers of tenant %(tenant)s due at %(due)s in partitions
-- %(pids)s (a slice of the node's firable ones, ascending; after the cursor
-- (%(lo_pid)s, %(lo_job)s) when given) whose schedule key is one of the
-- plans' (%(schedule_keys)s[i], planned in the node beforehand: fire the
-- slot %(due)s, then move to %(next_nominals)s[i]). A key covers everything
-- the planner reads of a timer but its id and slot (scheduler/identity.py),
-- so every timer of a key at this slot has that plan. No per-timer data
-- travels: the store finds the timers by exact probes of
-- jobs_due_schedule_idx, one per fenced partition of the slice (the fenced
-- list is only known when the statement runs, so the planner cannot trade
-- the probes for a walk of the whole instant), and updates them in place;
-- other nodes' partitions are never read. Same guarantees as fire_runs
-- (docs/design.md §4):
--   fence    locks the chunk's partition rows FOR SHARE where owner and
--            epoch are still ours (evaluated once; the epoch is a subscript
--            of %(epochs)s, so no join whose plan follows the partitions
--            table's statistics: a nested loop over an unnest there cost
--            15 ms a chunk);
--   advanced moves each timer of a fenced partition whose slot is still
--            %(due)s and whose key is a plan's (an edit since the plan
--            changes the key or the slot, or nulls next_due_at; a timer
--            edited to another planned key at the same slot gets that key's
--            plan, which is its own) to the plan's next slot;
--   inserted one run per advanced timer, epoch from %(epochs)s (indexed by
--            partition id + 1); the runs primary key makes a duplicate
--            impossible, and re-sending the chunk finds nothing left to advance;
--            born pending for delivery, like fire_runs' runs; only timers
--            whose overlap policy is allow;
--   guarded  the other timers, as in fire_runs (one fire each, k = 1): busy
--            from runs_overlap_idx, fate run, buffer or skip; doomed,
--            replaced, overlap_ins and overlap_skipped as in fire_runs.
-- Every run of the statement has the same lateness (fired_at is the
-- statement's timestamp, or the store clock's pin %(now)s when given;
-- scheduled_at is the instant), returned once as lag_s. The plans are a
-- MATERIALIZED CTE joined by hash. Returns the fenced partitions, the counts
-- and the runs' lateness, and the rewind marks as fire_runs does (here every
-- run's nominal time is %(due)s; per partition, the highest job id).
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
    FROM unnest(%(schedule_keys)b::int8[], %(next_nominals)b::timestamptz[]) AS p (schedule_key, next_nominal)
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
      AND j.schedule_key = p.schedule_key
      AND j.next_nominal_at = %(due)s
      AND j.jitter_s = 0
    RETURNING j.partition_id, j.job_id, j.tenant, j.queue, j.overlap, j.next_nominal_at,
              coalesce(j.name, '') AS job_name
), inserted AS (
    INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at,
                      fired_at, node_id, epoch, state, queue, origin, available_at, job_name)
    SELECT ad.partition_id, ad.job_id, %(due)s, ad.tenant, %(due)s,
           coalesce(%(now)s::timestamptz, statement_timestamp()),
           %(node_id)s, (%(epochs)s::int8[])[ad.partition_id + 1],
           'pending', ad.queue, 'schedule', coalesce(%(now)s::timestamptz, statement_timestamp()),
           ad.job_name
    FROM advanced AS ad
    WHERE ad.overlap = 'allow'
    ON CONFLICT (partition_id, job_id, nominal_time) DO NOTHING
    RETURNING partition_id, job_id
), guarded AS (
    SELECT ad.partition_id, ad.job_id, ad.tenant, ad.queue, ad.job_name, ad.overlap, ad.next_nominal_at,
           (%(epochs)s::int8[])[ad.partition_id + 1] AS epoch,
           CASE WHEN ad.overlap = 'replace' OR b.busy = 0 THEN 'run'
                WHEN ad.overlap = 'buffer_one' AND b.busy = 1 THEN 'buffer'
                ELSE 'skip' END AS fate
    FROM advanced AS ad
    CROSS JOIN LATERAL (
        SELECT count(*) AS busy
        FROM (SELECT 1 FROM runs AS u
              WHERE u.partition_id = ad.partition_id AND u.job_id = ad.job_id
                AND u.overlap IS NOT NULL AND u.state IN ('pending', 'leased', 'failed')
              LIMIT 2) AS x
    ) AS b
    WHERE ad.overlap <> 'allow'
), doomed AS MATERIALIZED (
    SELECT x.partition_id, x.job_id, x.nominal_time
    FROM guarded AS gd
    CROSS JOIN LATERAL (
        SELECT u.partition_id, u.job_id, u.nominal_time
        FROM runs AS u
        WHERE u.partition_id = gd.partition_id AND u.job_id = gd.job_id
          AND u.overlap IS NOT NULL AND u.state IN ('pending', 'leased', 'failed')
        OFFSET 0  -- a fence: the probe stays per job (not flattened into a walk of the index)
    ) AS x
    WHERE gd.overlap = 'replace'
), replaced AS (
    UPDATE runs AS u
    SET state = 'canceled',
        finished_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
        leased_until = NULL,
        last_error = 'replaced by run ' || d.job_id::text || '.'
                     || (floor(extract(epoch FROM date_trunc('second', %(due)s::timestamptz)))::int8 * 1000000
                         + mod(extract(microseconds FROM %(due)s::timestamptz)::int8, 1000000))::text
    FROM doomed AS d
    WHERE u.partition_id = d.partition_id AND u.job_id = d.job_id AND u.nominal_time = d.nominal_time
      AND u.state IN ('pending', 'leased', 'failed')
    RETURNING 1
), overlap_ins AS (
    INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at,
                      fired_at, node_id, epoch, state, queue, origin, available_at, overlap, job_name)
    SELECT gd.partition_id, gd.job_id, %(due)s, gd.tenant, %(due)s,
           coalesce(%(now)s::timestamptz, statement_timestamp()), %(node_id)s, gd.epoch,
           'pending', gd.queue, 'schedule',
           CASE gd.fate WHEN 'buffer' THEN NULL
                ELSE coalesce(%(now)s::timestamptz, statement_timestamp()) END,
           gd.overlap, gd.job_name
    FROM guarded AS gd
    WHERE gd.fate <> 'skip'
    ON CONFLICT (partition_id, job_id, nominal_time) DO NOTHING
    RETURNING partition_id, job_id
), overlap_skipped AS (
    INSERT INTO skips (partition_id, job_id, first_nominal, until_nominal, slots,
                       reason, recorded_at, node_id, epoch)
    SELECT gd.partition_id, gd.job_id, %(due)s,
           coalesce(gd.next_nominal_at, %(due)s::timestamptz + interval '1 microsecond'), 1, 'overlap',
           coalesce(%(now)s::timestamptz, statement_timestamp()), %(node_id)s, gd.epoch
    FROM guarded AS gd
    WHERE gd.fate = 'skip'
    ON CONFLICT (partition_id, job_id, first_nominal) DO NOTHING
    RETURNING 1
), marks AS (
    SELECT m.partition_id, (array_agg(m.job_id ORDER BY m.job_id DESC))[1] AS job_id
    FROM (SELECT partition_id, job_id FROM inserted
          UNION ALL SELECT partition_id, job_id FROM overlap_ins) AS m
    GROUP BY m.partition_id
)
SELECT (SELECT pids FROM fenced) AS fenced,
       (SELECT count(*) FROM advanced) AS advanced,
       (SELECT count(*) FROM inserted) + (SELECT count(*) FROM overlap_ins) AS inserted,
       (SELECT count(*) FROM overlap_skipped) AS skipped,
       extract(epoch FROM (coalesce(%(now)s::timestamptz, statement_timestamp())
                           - %(due)s::timestamptz))::float8 AS lag_s,
       (SELECT coalesce(array_agg(partition_id ORDER BY partition_id), '{}') FROM marks) AS mark_pids,
       (SELECT coalesce(array_agg(job_id ORDER BY partition_id), '{}') FROM marks) AS mark_jobs,
       (SELECT coalesce(array_agg(%(due)s::timestamptz), '{}') FROM marks) AS mark_nominals,
       (SELECT coalesce(array_agg((%(epochs)s::int8[])[partition_id + 1] ORDER BY partition_id), '{}')
        FROM marks) AS mark_epochs;

-- name: last_handled
-- Per job (pids[i], jids[i]): the latest nominal time of its runs and the
-- latest end of its skip ranges (scheduler/tzreplan.py, the true slot).
-- One primary-key probe each.
SELECT a.pid AS partition_id, a.jid AS job_id,
       (SELECT max(r.nominal_time) FROM runs AS r
        WHERE r.partition_id = a.pid AND r.job_id = a.jid) AS last_run,
       (SELECT max(s.until_nominal) FROM skips AS s
        WHERE s.partition_id = a.pid AND s.job_id = a.jid) AS last_skip_until
FROM unnest(%(pids)b::int4[], %(jids)b::uuid[]) AS a (pid, jid);

-- name: jobs_by_keys
-- The jobs rows of (pids[i], jids[i]).
SELECT j.*
FROM unnest(%(pids)b::int4[], %(jids)b::uuid[]) AS a (pid, jid)
JOIN jobs AS j ON j.partition_id = a.pid AND j.job_id = a.jid;

-- name: replan_slots
-- Move jobs to their true slot (scheduler/tzreplan.py): a compare-and-set on
-- the revision and the stored slot read, so a concurrent edit or firing
-- advance wins. Returns the jobs moved.
UPDATE jobs AS j
SET next_nominal_at = a.nominal, next_due_at = a.due
FROM unnest(%(pids)b::int4[], %(jids)b::uuid[], %(revs)b::int8[], %(froms)b::timestamptz[],
            %(nominals)b::timestamptz[], %(dues)b::timestamptz[])
     AS a (pid, jid, rev, from_nominal, nominal, due)
WHERE j.partition_id = a.pid
  AND j.job_id = a.jid
  AND j.revision = a.rev
  AND j.next_nominal_at = a.from_nominal
RETURNING j.partition_id, j.job_id;

-- name: cron_jobs_page
-- Cron jobs with a pending slot after the key (after_pid, after_job), in
-- primary-key order: one page of the tzdata replan pass.
SELECT partition_id, job_id, revision, kind, cron_expr, cron_dialect, tz, interval_s,
       anchor_at, fire_at, jitter_s, next_nominal_at, created_at, changed_at
FROM jobs
WHERE (partition_id, job_id) > (%(after_pid)s::int4, %(after_job)s::uuid)
  AND kind = 'cron'
  AND next_nominal_at IS NOT NULL
ORDER BY partition_id, job_id
LIMIT %(limit)s;

-- name: get_store_meta
SELECT value, updated_at FROM store_meta WHERE key = %(key)s;

-- name: set_store_meta
INSERT INTO store_meta (key, value, updated_at) VALUES (%(key)s, %(value)s, now())
ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at;

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
-- tenants set: each of weight, max_rate, max_schedules (alembic revision
-- 0033) kept when its parameter is NULL, max_rate and max_schedules cleared
-- (NULL: no cap / the default quota) by their clear_ flags.
UPDATE tenants
SET weight = coalesce(%(weight)s, weight),
    max_rate = CASE WHEN %(clear_max_rate)s THEN NULL ELSE coalesce(%(max_rate)s, max_rate) END,
    max_schedules = CASE WHEN %(clear_max_schedules)s THEN NULL
                         ELSE coalesce(%(max_schedules)s, max_schedules) END
WHERE tenant = %(tenant)s
RETURNING tenant, weight, max_rate, max_schedules;

-- name: list_tenants
SELECT t.tenant, t.weight, t.max_rate, t.max_schedules, t.created_at,
       (SELECT count(*) FROM jobs AS j WHERE j.tenant = t.tenant AND j.deleted_at IS NULL) AS jobs
FROM tenants AS t
ORDER BY t.tenant;

-- name: tenant_weights
SELECT tenant, weight, max_rate FROM tenants;

-- ---------------------------------------------------------------- tenant signing secrets

-- name: lock_tenant
-- The tenant row, locked until commit: rotations of one tenant's secrets
-- run one after the other.
SELECT tenant FROM tenants WHERE tenant = %(tenant)s FOR UPDATE;

-- name: limit_tenant_secrets
-- A rotation: every secret of %(tenant)s still valid at store time %(now)s
-- (NULL: now()) stays valid only until %(now)s + %(grace_s)s seconds (an
-- earlier expiry is kept). Returns the secret ids it changed.
UPDATE tenant_secrets
SET expires_at = coalesce(%(now)s::timestamptz, now()) + %(grace_s)s * interval '1 second'
WHERE tenant = %(tenant)s
  AND (expires_at IS NULL
       OR expires_at > coalesce(%(now)s::timestamptz, now()) + %(grace_s)s * interval '1 second')
RETURNING secret_id;

-- name: insert_tenant_secret
-- A new secret of %(tenant)s, numbered one above the tenant's highest id,
-- created at %(now)s (NULL: now()), never expiring until the next rotation.
-- With %(only_if_none)s, only if the tenant has no secret valid at that
-- time (the push loop's first secret). No row back: a concurrent insert took
-- the number (run again), or (only_if_none) a valid secret exists.
INSERT INTO tenant_secrets (tenant, secret_id, secret, created_at, expires_at)
SELECT %(tenant)s, coalesce(max(s.secret_id), 0) + 1, %(secret)s, coalesce(%(now)s::timestamptz, now()), NULL
FROM tenant_secrets AS s
WHERE s.tenant = %(tenant)s
HAVING NOT %(only_if_none)s::boolean
    OR NOT coalesce(bool_or(s.expires_at IS NULL OR s.expires_at > coalesce(%(now)s::timestamptz, now())), false)
ON CONFLICT (tenant, secret_id) DO NOTHING
RETURNING secret_id, created_at;

-- name: list_tenant_secrets
-- The secrets of %(tenant)s without their values, newest first; valid:
-- not expired at %(now)s (NULL: now()).
SELECT secret_id, created_at, expires_at,
       (expires_at IS NULL OR expires_at > coalesce(%(now)s::timestamptz, now())) AS valid
FROM tenant_secrets
WHERE tenant = %(tenant)s
ORDER BY secret_id DESC;

-- name: valid_tenant_secrets
-- The signing secrets of %(tenants)s valid at %(now)s (NULL: now()): per
-- tenant, newest first (the push loop signs with every one).
SELECT tenant, secret_id, secret
FROM tenant_secrets
WHERE tenant = ANY(%(tenants)b::text[])
  AND (expires_at IS NULL OR expires_at > coalesce(%(now)s::timestamptz, now()))
ORDER BY tenant, secret_id DESC;

-- ---------------------------------------------------------------- HTTP API keys

-- name: insert_api_key
-- A new key of the HTTP API (scheduler/api/keys.py): %(secret_hash)s is the
-- SHA-256 of its secret (never the secret). A colliding random key_id
-- returns no row (the caller draws another).
INSERT INTO api_keys (key_id, tenant, role, name, secret_hash, created_at)
VALUES (%(key_id)s, %(tenant)s, %(role)s, %(name)s, %(secret_hash)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (key_id) DO NOTHING
RETURNING key_id, tenant, role, name, created_at, revoked_at, last_used_at;

-- name: get_api_key
-- What a request's key authenticates as: its tenant, role, hash and revocation.
SELECT key_id, tenant, role, secret_hash, revoked_at
FROM api_keys
WHERE key_id = %(key_id)s;

-- name: list_api_keys
-- Keys (never the hash) of tenant %(tenant)s (NULL: all), by key_id, the
-- page after %(after)s (NULL: from the start), at most %(limit)s rows.
SELECT key_id, tenant, role, name, created_at, revoked_at, last_used_at
FROM api_keys
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
  AND (%(after)s::text IS NULL OR key_id > %(after)s)
ORDER BY key_id
LIMIT %(limit)s;

-- name: revoke_api_key
-- Revoke key %(key_id)s at %(now)s (NULL: now()); an already revoked key
-- keeps its first revocation time. No row: no such key.
UPDATE api_keys
SET revoked_at = coalesce(revoked_at, coalesce(%(now)s::timestamptz, now()))
WHERE key_id = %(key_id)s
RETURNING key_id, tenant, role, name, created_at, revoked_at, last_used_at;

-- name: touch_api_key
-- Record that key %(key_id)s was used at %(now)s (NULL: now()), unless it
-- was recorded less than a minute before (the column is coarse on purpose:
-- one write per key per minute at most).
UPDATE api_keys
SET last_used_at = coalesce(%(now)s::timestamptz, now())
WHERE key_id = %(key_id)s
  AND (last_used_at IS NULL
       OR last_used_at < coalesce(%(now)s::timestamptz, now()) - INTERVAL '60 seconds');

-- name: list_tenants_page
-- Tenants after %(after)s (NULL: from the first) by name, at most %(limit)s,
-- only %(tenant)s unless NULL, with weight, rate cap, schedule quota (NULL:
-- the default) and live job count (the HTTP API's paged list, and its
-- answer to a tenant write).
SELECT t.tenant, t.weight, t.max_rate, t.max_schedules, t.created_at,
       (SELECT count(*) FROM jobs AS j WHERE j.tenant = t.tenant AND j.deleted_at IS NULL) AS jobs
FROM tenants AS t
WHERE (%(after)s::text IS NULL OR t.tenant > %(after)s)
  AND (%(tenant)s::text IS NULL OR t.tenant = %(tenant)s)
ORDER BY t.tenant
LIMIT %(limit)s;

-- ---------------------------------------------------------------- jobs

-- name: register_schedules
-- Register the specs timers are about to carry (scheduler/identity.py): one
-- row per key (%(schedule_keys)s[i], its canonical text and spec), kept if
-- the key exists already (rows are never updated). The caller then reads
-- the keys back with schedules_by_keys and gives a job its key only if the
-- stored canonical text is its own (a collision: no key).
INSERT INTO schedules (schedule_key, canonical, kind, cron_expr, cron_dialect, tz, interval_s,
                       anchor_at, fire_at, misfire, catchup_window_s, misfire_grace_s, jitter_s)
SELECT *
FROM unnest(%(schedule_keys)b::int8[], %(canonicals)b::text[], %(kinds)b::text[],
            %(cron_exprs)b::text[], %(cron_dialects)b::text[], %(tzs)b::text[],
            %(interval_ss)b::int8[], %(anchor_ats)b::timestamptz[], %(fire_ats)b::timestamptz[],
            %(misfires)b::text[], %(catchup_window_ss)b::int4[], %(misfire_grace_ss)b::int4[],
            %(jitter_ss)b::int4[])
ON CONFLICT (schedule_key) DO NOTHING;

-- name: schedule_zones
-- The zones of the cron schedules registered at or after %(since)s (NULL:
-- all), and the store's clock: a node warms their transition tables
-- (scheduler/zones.py warm()) at start and then every few seconds, asking
-- for what was registered since its last look (minus a margin for
-- transactions that committed late). schedules_zone_idx keeps it to the new
-- rows.
SELECT DISTINCT s.tz
FROM schedules AS s
WHERE s.tz IS NOT NULL
  AND (%(since)s::timestamptz IS NULL OR s.created_at >= %(since)s::timestamptz);

-- name: schedules_by_keys
-- The schedules rows of keys %(schedule_keys)s (primary-key probes).
SELECT * FROM schedules WHERE schedule_key = ANY(%(schedule_keys)b::int8[]);

-- name: insert_job
-- A new job; queue (NULL: an HTTP target, see job_delivery) and overlap are
-- its delivery columns (alembic revision 0023).
INSERT INTO jobs (partition_id, job_id, tenant, name, kind, cron_expr, cron_dialect, tz,
                  interval_s, anchor_at, fire_at, misfire, catchup_window_s,
                  misfire_grace_s, jitter_s, next_nominal_at, next_due_at,
                  created_at, changed_at, schedule_key, queue, overlap)
VALUES (%(partition_id)s, %(job_id)s, %(tenant)s, %(name)s, %(kind)s, %(cron_expr)s,
        %(cron_dialect)s, %(tz)s, %(interval_s)s, %(anchor_at)s, %(fire_at)s, %(misfire)s,
        %(catchup_window_s)s, %(misfire_grace_s)s, %(jitter_s)s, %(next_nominal_at)s,
        %(next_due_at)s, %(created_at)s, %(created_at)s, %(schedule_key)s, %(queue)s,
        %(overlap)s);

-- name: upsert_job_delivery
-- The delivery settings of a job that names anything but the defaults
-- (scheduler/delivery/targets.py, DeliverySpec.delivery_row): written in
-- the transaction that writes the job; headers and payload are JSON texts.
INSERT INTO job_delivery (partition_id, job_id, url, method, headers, timeout_s, payload,
                          max_attempts, backoff_base_s, backoff_cap_s, max_age_s)
VALUES (%(partition_id)s, %(job_id)s, %(url)s, %(method)s, %(headers)s::jsonb, %(timeout_s)s,
        %(payload)s::jsonb, %(max_attempts)s, %(backoff_base_s)s, %(backoff_cap_s)s,
        %(max_age_s)s)
ON CONFLICT (partition_id, job_id) DO UPDATE
SET url = excluded.url, method = excluded.method, headers = excluded.headers,
    timeout_s = excluded.timeout_s, payload = excluded.payload,
    max_attempts = excluded.max_attempts, backoff_base_s = excluded.backoff_base_s,
    backoff_cap_s = excluded.backoff_cap_s, max_age_s = excluded.max_age_s;

-- name: delete_job_delivery
-- An edit back to the default delivery settings: the job keeps no row.
DELETE FROM job_delivery WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s;

-- name: delete_job_deliveries_by_keys
-- The delivery rows of the jobs (pids[i], jids[i]) retention just pruned
-- (prune_jobs), in its transaction.
DELETE FROM job_delivery
WHERE (partition_id, job_id) IN (
    SELECT a.pid, a.jid FROM unnest(%(pids)b::int4[], %(jids)b::uuid[]) AS a (pid, jid));

-- name: get_job_delivery
-- The delivery settings of one job (no row: the defaults).
SELECT * FROM job_delivery WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s;

-- name: job_deliveries_by_keys
-- The delivery rows of the jobs (pids[i], jids[i]) that have one (jobs
-- import compares them with the file's lines: one read per batch).
SELECT d.*
FROM unnest(%(pids)b::int4[], %(jids)b::uuid[]) AS a (pid, jid)
JOIN job_delivery AS d ON d.partition_id = a.pid AND d.job_id = a.jid;

-- name: find_job_by_name
SELECT * FROM jobs
WHERE tenant = %(tenant)s AND name = %(name)s AND deleted_at IS NULL
FOR UPDATE;

-- name: replace_job_spec
-- Edit a job in place (jobs add --replace): new spec and next slot (the
-- caller keeps the pending slot when the schedule is unchanged, see
-- scheduler/jobs.py), delivery columns (queue, overlap; the caller writes
-- or deletes the job_delivery row in the same transaction), revision bumped
-- so an in-flight firing of the old spec does not advance it.
UPDATE jobs
SET kind = %(kind)s, cron_expr = %(cron_expr)s, cron_dialect = %(cron_dialect)s, tz = %(tz)s,
    interval_s = %(interval_s)s, anchor_at = %(anchor_at)s, fire_at = %(fire_at)s,
    misfire = %(misfire)s, catchup_window_s = %(catchup_window_s)s,
    misfire_grace_s = %(misfire_grace_s)s, jitter_s = %(jitter_s)s,
    schedule_key = %(schedule_key)s, queue = %(queue)s, overlap = %(overlap)s,
    next_nominal_at = CASE WHEN paused THEN NULL ELSE %(next_nominal_at)s::timestamptz END,
    next_due_at = CASE WHEN paused THEN NULL ELSE %(next_due_at)s::timestamptz END,
    revision = revision + 1, changed_at = %(changed_at)s
WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s AND deleted_at IS NULL;

-- name: insert_job_revisions
-- Keep the revisions rewrites (replace, pause, resume, delete) supersede:
-- the jobs (pids[i], jids[i]) as they are, in force from their changed_at
-- until %(now)s (alembic revision 0013). Same transaction as the rewrite,
-- before it.
INSERT INTO job_revisions (partition_id, job_id, revision, valid_from, valid_until, tenant, kind,
                           cron_expr, cron_dialect, tz, interval_s, anchor_at, fire_at, misfire,
                           catchup_window_s, misfire_grace_s, jitter_s, paused)
SELECT j.partition_id, j.job_id, j.revision, j.changed_at, %(now)s, j.tenant, j.kind,
       j.cron_expr, j.cron_dialect, j.tz, j.interval_s, j.anchor_at, j.fire_at, j.misfire,
       j.catchup_window_s, j.misfire_grace_s, j.jitter_s, j.paused
FROM unnest(%(pids)b::int4[], %(jids)b::uuid[]) AS a (pid, jid)
JOIN jobs AS j ON j.partition_id = a.pid AND j.job_id = a.jid
ON CONFLICT (partition_id, job_id, revision) DO NOTHING;

-- name: insert_rewrite_skip
-- Slots [first, until) that were due when a rewrite dropped them (reason
-- edited, paused or deleted), recorded at the rewrite's store time by no
-- node (node_id 'operator', epoch 0).
INSERT INTO skips (partition_id, job_id, first_nominal, until_nominal, slots, reason,
                   recorded_at, node_id, epoch)
VALUES (%(partition_id)s, %(job_id)s, %(first)s, %(until)s, %(slots)s, %(reason)s, %(now)s,
        'operator', 0)
ON CONFLICT (partition_id, job_id, first_nominal) DO NOTHING;

-- name: find_jobs_by_names
-- Live jobs of the (tenant, name) pairs %(tenants)s[i], %(names)s[i] (jobs
-- import: one lookup per batch, never one per line), locked like
-- find_job_by_name.
SELECT j.*
FROM jobs AS j
JOIN unnest(%(tenants)b::text[], %(names)b::text[]) AS k (tenant, name)
  ON j.tenant = k.tenant AND j.name = k.name
WHERE j.deleted_at IS NULL
FOR UPDATE OF j;

-- name: get_job
-- One job; with %(tenant)s (the API's principal) only if it is that tenant's
-- (NULL: any tenant, the operator's CLI).
SELECT * FROM jobs
WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text);

-- name: get_job_for_update
-- A job about to be rewritten: locked, so a firing statement waits (or has
-- committed and the rewrite sees its advance). Scoped by %(tenant)s as get_job.
SELECT * FROM jobs
WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s
  AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
FOR UPDATE;

-- name: get_job_by_name
-- The live job %(name)s of %(tenant)s (not locked: the API resolves a
-- schedule's name, then acts on its id scoped by the same tenant).
SELECT * FROM jobs
WHERE tenant = %(tenant)s AND name = %(name)s AND deleted_at IS NULL;

-- name: list_schedules
-- One page of a tenant's schedules (its live named jobs) for the API, by
-- name after %(after)s (NULL: the first page), with their delivery row's
-- columns (has_delivery false: none, the defaults), filtered by paused,
-- kind, queue and a literal name prefix (each NULL: no filter). Served by
-- jobs_tenant_name_idx.
SELECT j.*, d.job_id IS NOT NULL AS has_delivery, d.url, d.method, d.headers, d.timeout_s,
       d.payload, d.max_attempts, d.backoff_base_s, d.backoff_cap_s, d.max_age_s
FROM jobs AS j
LEFT JOIN job_delivery AS d ON d.partition_id = j.partition_id AND d.job_id = j.job_id
WHERE j.tenant = %(tenant)s
  AND j.name IS NOT NULL
  AND j.deleted_at IS NULL
  AND (%(after)s::text IS NULL OR j.name > %(after)s::text)
  AND (%(paused)s::boolean IS NULL OR j.paused = %(paused)s::boolean)
  AND (%(kind)s::text IS NULL OR j.kind = %(kind)s::text)
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(name_prefix)s::text IS NULL
       OR left(j.name, length(%(name_prefix)s::text)) = %(name_prefix)s::text)
ORDER BY j.name
LIMIT %(limit)s;

-- name: jobs_of_tenant_except
-- apply's prune: the live named jobs of %(tenant)s whose name is not one of
-- %(names)s, locked (the caller retires and deletes them in its transaction).
SELECT *
FROM jobs
WHERE tenant = %(tenant)s
  AND name IS NOT NULL
  AND deleted_at IS NULL
  AND NOT (name = ANY(%(names)s::text[]))
ORDER BY partition_id, job_id
FOR UPDATE;

-- name: lock_tenant_quota
-- apply: the tenant row locked until commit, before any read of the
-- tenant's jobs (so two applies of one tenant read, prune and count the
-- quota one after the other), with its quota (max_schedules NULL: the
-- default).
SELECT tenant, max_schedules FROM tenants WHERE tenant = %(tenant)s FOR UPDATE;

-- name: paused_since
-- When a paused job was paused: the end of its last revision in force
-- while it was not paused (NULL: none kept).
SELECT max(valid_until) AS paused_at
FROM job_revisions
WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s
  AND tenant = %(tenant)s AND NOT paused;

-- name: list_jobs
-- Live jobs with their push target's url and method (NULL for a queue).
SELECT j.*, d.url, d.method
FROM jobs AS j
LEFT JOIN job_delivery AS d ON d.partition_id = j.partition_id AND d.job_id = j.job_id
WHERE j.deleted_at IS NULL
  AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s::text)
ORDER BY j.tenant, j.created_at, j.job_id
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

-- name: jobs_of_tenant_page
-- Bulk soft delete (jobs delete --tenant T --all / --name-prefix P): at most
-- %(limit)s live jobs of one tenant, those whose name starts with
-- %(name_prefix)s (taken literally; NULL: every job), locked; the caller
-- deletes them (delete_jobs_by_keys) and repeats, one transaction per
-- batch, until fewer come back.
SELECT *
FROM jobs
WHERE tenant = %(tenant)s
  AND deleted_at IS NULL
  AND (%(name_prefix)s::text IS NULL
       OR left(name, length(%(name_prefix)s::text)) = %(name_prefix)s::text)
ORDER BY partition_id, job_id
LIMIT %(limit)s
FOR UPDATE;

-- name: delete_jobs_by_keys
-- The update of delete_job for the live jobs (pids[i], jids[i]).
UPDATE jobs AS j
SET deleted_at = %(changed_at)s, changed_at = %(changed_at)s,
    next_nominal_at = NULL, next_due_at = NULL, revision = revision + 1
FROM unnest(%(pids)b::int4[], %(jids)b::uuid[]) AS a (pid, jid)
WHERE j.partition_id = a.pid AND j.job_id = a.jid AND j.deleted_at IS NULL
RETURNING j.partition_id, j.job_id;

-- name: count_jobs_of_tenant
-- Live jobs of one tenant, optionally only those whose name starts with
-- %(name_prefix)s (as jobs_of_tenant_page selects them).
SELECT count(*) AS n
FROM jobs
WHERE tenant = %(tenant)s
  AND deleted_at IS NULL
  AND (%(name_prefix)s::text IS NULL
       OR left(name, length(%(name_prefix)s::text)) = %(name_prefix)s::text);

-- name: count_named_jobs_of_tenant_upto
-- Live named jobs (schedules) of one tenant, counted up to %(limit)s: what a
-- quota check needs, read from jobs_tenant_name_idx alone. Counting every
-- live job had no index to use: a sequential scan of the whole jobs table
-- on every schedule write (a second of store CPU on 5 M jobs); an index for
-- it would cost every fired job one more index entry.
SELECT count(*) AS n
FROM (
    SELECT 1
    FROM jobs
    WHERE tenant = %(tenant)s
      AND name IS NOT NULL
      AND deleted_at IS NULL
    LIMIT %(limit)s
) AS j;

-- name: unknown_tenants
-- Those of %(tenants)s with no tenants row, in the order given.
SELECT t.tenant
FROM unnest(%(tenants)s::text[]) WITH ORDINALITY AS t (tenant, i)
WHERE NOT EXISTS (SELECT 1 FROM tenants AS x WHERE x.tenant = t.tenant)
ORDER BY t.i;

-- name: tenant_exists
SELECT tenant FROM tenants WHERE tenant = %(tenant)s;

-- name: list_runs
-- Runs, newest nominal time first, each filter optional (NULL: any): one
-- job's (a primary-key range), since a nominal time (inclusive), until one
-- (exclusive), in one delivery state,
-- of one tenant. Without a job it reads runs by nominal time: an operator's
-- command, bounded by %(limit)s rows returned, not by rows read. job_name is
-- the run's own (runs.job_name, the job's name when the run was created; ''
-- for none: NULL), as in claim_runs: only a run written before revision 0035
-- (NULL) looks its job's current name up in jobs.
SELECT r.partition_id, r.job_id, r.nominal_time, r.tenant, r.scheduled_at, r.fired_at,
       r.node_id, r.epoch, r.state, r.queue, r.origin, r.attempt, r.available_at,
       r.leased_until, r.worker, r.first_claimed_at, r.finished_at, r.last_error,
       extract(epoch FROM (r.fired_at - r.scheduled_at))::float8 AS lateness_s,
       CASE WHEN r.job_name IS NOT NULL THEN nullif(r.job_name, '')
            ELSE (SELECT j.name FROM jobs AS j
                  WHERE j.partition_id = r.partition_id AND j.job_id = r.job_id) END AS job_name
FROM runs AS r
WHERE (%(job_id)s::uuid IS NULL OR (r.partition_id = %(partition_id)s AND r.job_id = %(job_id)s::uuid))
  AND (%(since)s::timestamptz IS NULL OR r.nominal_time >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR r.nominal_time < %(until)s::timestamptz)
  AND (%(state)s::text IS NULL OR r.state = %(state)s::text)
  AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s::text)
ORDER BY r.nominal_time DESC, r.job_id
LIMIT %(limit)s;

-- ---------------------------------------------------------------- delivery views
-- scheduler/delivery/views.py: jobs describe, runs redrive, the node's
-- delivery gauges. Every per-job statement is scoped by (partition_id, job_id).

-- name: count_job_runs_by_state
-- A job's runs per delivery state (NULL: fired before delivery existed).
SELECT r.state, count(*) AS runs
FROM runs AS r
WHERE r.partition_id = %(partition_id)s AND r.job_id = %(job_id)s
GROUP BY r.state;

-- name: count_job_skips_by_reason
-- A job's skip ranges per reason: ranges, the slots they counted, and the
-- ranges too long to count (slots NULL).
SELECT s.reason, count(*) AS ranges, coalesce(sum(s.slots), 0)::int8 AS slots,
       (count(*) - count(s.slots))::int8 AS uncounted
FROM skips AS s
WHERE s.partition_id = %(partition_id)s AND s.job_id = %(job_id)s
GROUP BY s.reason
ORDER BY s.reason;

-- name: recent_job_runs
-- A job's last %(limit)s runs, newest nominal time first, with lateness
-- (fired − scheduled) and dispatch lag (first claim − scheduled; NULL until
-- claimed), in seconds; worker is the last claim's label; available_at NULL
-- for a pending run is a buffer_one run held behind an unfinished one.
SELECT r.nominal_time, r.scheduled_at, r.fired_at, r.state, r.origin, r.attempt,
       r.first_claimed_at, r.finished_at, r.last_error, r.worker, r.available_at,
       extract(epoch FROM (r.fired_at - r.scheduled_at))::float8 AS lateness_s,
       extract(epoch FROM (r.first_claimed_at - r.scheduled_at))::float8 AS dispatch_lag_s
FROM runs AS r
WHERE r.partition_id = %(partition_id)s AND r.job_id = %(job_id)s
ORDER BY r.nominal_time DESC
LIMIT %(limit)s;

-- name: get_run_state
-- One run's delivery state (explains a redrive, or the HTTP API's refused
-- heartbeat/ack/nack), of tenant %(tenant)s (NULL: any): another tenant's
-- run is no row, like a missing one.
SELECT r.state FROM runs AS r
WHERE r.partition_id = %(partition_id)s AND r.job_id = %(job_id)s AND r.nominal_time = %(nominal_time)s
  AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s::text);

-- name: list_tenant_runs
-- The HTTP API's run list: runs of tenant %(tenant)s, newest nominal time
-- first (ties by job id), %(limit)s at most, each filter optional (NULL:
-- any): of its live job named %(job_name)s, nominal time at or after
-- %(since)s and before %(until)s, in delivery state %(state)s; after the
-- page ending at (%(after_nominal)s, %(after_job)s) (keyset paging in this
-- order); worker is the last claim's label. Read per job of the tenant
-- (jobs_tenant_due_idx, then each job's primary-key range backward, at most
-- %(limit)s rows each), so a page costs the tenant's own jobs, never a scan
-- of every tenant's runs. Runs of a job pruned from jobs are not listed.
-- job_name is the run's own, as in list_runs and claim_runs (the filter
-- %(job_name)s is the job's current name: it finds the job).
SELECT r.partition_id, r.job_id, r.nominal_time, r.scheduled_at, r.fired_at, r.state, r.queue,
       r.origin, r.attempt, r.available_at, r.leased_until, r.first_claimed_at, r.finished_at,
       r.last_error, r.lateness_s, r.worker,
       CASE WHEN r.recorded_name IS NOT NULL THEN nullif(r.recorded_name, '') ELSE j.name END AS job_name
FROM jobs AS j
CROSS JOIN LATERAL (
    SELECT x.partition_id, x.job_id, x.nominal_time, x.scheduled_at, x.fired_at, x.state, x.queue,
           x.origin, x.attempt, x.available_at, x.leased_until, x.first_claimed_at, x.finished_at,
           x.last_error, x.worker, extract(epoch FROM (x.fired_at - x.scheduled_at))::float8 AS lateness_s,
           x.job_name AS recorded_name
    FROM runs AS x
    WHERE x.partition_id = j.partition_id AND x.job_id = j.job_id
      AND x.tenant = %(tenant)s::text
      AND (%(since)s::timestamptz IS NULL OR x.nominal_time >= %(since)s::timestamptz)
      AND (%(until)s::timestamptz IS NULL OR x.nominal_time < %(until)s::timestamptz)
      AND (%(state)s::text IS NULL OR x.state = %(state)s::text)
      AND (%(after_nominal)s::timestamptz IS NULL
           OR x.nominal_time < %(after_nominal)s::timestamptz
           OR (x.nominal_time = %(after_nominal)s::timestamptz AND x.job_id > %(after_job)s::uuid))
    ORDER BY x.nominal_time DESC
    LIMIT %(limit)s
) AS r
WHERE j.tenant = %(tenant)s::text
  AND (%(job_name)s::text IS NULL OR (j.name = %(job_name)s::text AND j.deleted_at IS NULL))
ORDER BY r.nominal_time DESC, r.job_id
LIMIT %(limit)s;

-- name: redrive_runs
-- Back to pending, available now (store time): one run
-- (%(nominal_time)s) or the oldest %(limit)s of a job, only those whose state
-- is in %(states)s (dead, canceled), and only while the job is live: a run of
-- a deleted job (or of one retention pruned from jobs) is not redriven (it
-- would be delivered again to the deleted job's queue or URL, which nothing
-- expects any more, or, once pruned, with no target at all). A redrive is a
-- fresh retry budget: attempt 0 and first_claimed_at NULL (max_attempts and
-- max_age_s count from the redrive), lease and outcome cleared; last_error is
-- kept (until an attempt succeeds: ack_runs clears it). The state is
-- re-checked by the UPDATE, so a concurrent change wins. Only runs (and the
-- job) of tenant %(tenant)s (NULL: any; the HTTP API passes its key's).
-- Returns each run picked: redriven true, or false when its job is not live
-- (nothing written). One probe of the job's jobs row per statement.
WITH live AS (
    SELECT EXISTS (
        SELECT 1 FROM jobs AS j
        WHERE j.partition_id = %(partition_id)s AND j.job_id = %(job_id)s
          AND j.deleted_at IS NULL
          AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s::text)) AS live
), picked AS (
    SELECT r.partition_id, r.job_id, r.nominal_time
    FROM runs AS r
    WHERE r.partition_id = %(partition_id)s AND r.job_id = %(job_id)s
      AND (%(nominal_time)s::timestamptz IS NULL OR r.nominal_time = %(nominal_time)s::timestamptz)
      AND r.state = ANY(%(states)s::text[])
      AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s::text)
    ORDER BY r.nominal_time
    LIMIT %(limit)s
), moved AS (
    UPDATE runs
    SET state = 'pending', attempt = 0, available_at = now(),
        lease_token = NULL, leased_until = NULL, worker = NULL, claimed_at = NULL,
        first_claimed_at = NULL, finished_at = NULL, retryable = NULL
    WHERE (partition_id, job_id, nominal_time) IN (SELECT p.partition_id, p.job_id, p.nominal_time FROM picked AS p)
      AND state = ANY(%(states)s::text[])
      AND (SELECT l.live FROM live AS l)
    RETURNING nominal_time
)
SELECT m.nominal_time, true AS redriven FROM moved AS m
UNION ALL
SELECT p.nominal_time, false AS redriven FROM picked AS p WHERE NOT (SELECT l.live FROM live AS l);

-- name: cancel_run
-- An operator's cancel of one unfinished run (state in %(states)s: pending,
-- leased, failed) of tenant %(tenant)s (NULL: any): canceled, finished now
-- (store time, or the pin %(now)s), the lease ended; lease_token is kept, so
-- the worker holding it hears 'canceled' at its next heartbeat and its ack or
-- nack is refused, as after overlap replace. last_error says who (%(reason)s). The state is checked by
-- the UPDATE itself, so a concurrent ack or settle wins or loses whole. No
-- fence: like a redrive it is a user's state change, not the partition
-- owner's lease work. Returns the run when canceled, no row otherwise.
UPDATE runs AS r
SET state = 'canceled',
    finished_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
    leased_until = NULL,
    last_error = %(reason)s
WHERE r.partition_id = %(partition_id)s AND r.job_id = %(job_id)s AND r.nominal_time = %(nominal_time)s
  AND r.state = ANY(%(states)s::text[])
  AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s::text)
RETURNING r.nominal_time;

-- name: delivery_depths
-- The node's delivery gauges, one read of the partial indexes: pending runs
-- per tenant (pull runs by runs_pending_idx, push runs by runs_push_idx), and
-- runs in flight per state (runs_inflight_idx). kind: 'pending' (per tenant)
-- or the state ('leased', 'failed'; tenant NULL).
SELECT 'pending' AS kind, r.tenant, count(*) AS runs
FROM runs AS r
WHERE r.state = 'pending' AND r.queue IS NOT NULL
GROUP BY r.tenant
UNION ALL
SELECT 'pending' AS kind, r.tenant, count(*) AS runs
FROM runs AS r
WHERE r.state = 'pending' AND r.queue IS NULL
GROUP BY r.tenant
UNION ALL
SELECT r.state AS kind, NULL AS tenant, count(*) AS runs
FROM runs AS r
WHERE r.state IN ('leased', 'failed')
GROUP BY r.state;

-- ---------------------------------------------------------------- audit

-- name: create_audit_versions
-- The audit's working tables are temporary and dropped at commit.
-- audit_versions: the known history of every job that may have runs with
-- nominal time in [since, until), one row per revision: the superseded ones
-- from job_revisions and the current jobs row (in force from changed_at, to
-- deleted_at or open-ended: valid_until NULL). Only the unbroken run of
-- revision numbers ending at the current one is kept (revisions rewritten
-- before job_revisions existed are unknown); audit_from is the instant from
-- which the job's history is known (NULL: since creation); is_current marks
-- the jobs row (one per job). Each revision's
-- slots lie after slots_from (strictly, or from it inclusive when the
-- revision continues the previous one's schedule seamlessly: same schedule
-- columns, previous not paused) and before valid_until; none while paused.
CREATE TEMPORARY TABLE audit_versions ON COMMIT DROP AS
WITH candidates AS (
    SELECT partition_id, job_id, created_at, revision AS current_revision
    FROM jobs
    WHERE created_at < %(until)s AND (deleted_at IS NULL OR deleted_at >= %(since)s)
), versions AS (
    -- only rewritten jobs (revision > 1) have a history to chain; the others
    -- (nearly all, usually) are read once below, without sorting
    SELECT j.partition_id, j.job_id, j.revision, j.changed_at AS valid_from, j.deleted_at AS valid_until,
           j.kind, j.cron_expr, j.cron_dialect, j.tz, j.interval_s, j.anchor_at, j.fire_at, j.misfire,
           j.catchup_window_s, j.misfire_grace_s, j.jitter_s, j.paused, c.created_at, c.current_revision
    FROM candidates AS c
    JOIN jobs AS j ON j.partition_id = c.partition_id AND j.job_id = c.job_id
    WHERE c.current_revision > 1
    UNION ALL
    SELECT v.partition_id, v.job_id, v.revision, v.valid_from, v.valid_until,
           v.kind, v.cron_expr, v.cron_dialect, v.tz, v.interval_s, v.anchor_at, v.fire_at, v.misfire,
           v.catchup_window_s, v.misfire_grace_s, v.jitter_s, v.paused, c.created_at, c.current_revision
    FROM candidates AS c
    JOIN job_revisions AS v ON v.partition_id = c.partition_id AND v.job_id = c.job_id
    WHERE c.current_revision > 1 AND v.revision < c.current_revision
), numbered AS (
    SELECT versions.*,
           row_number() OVER (PARTITION BY partition_id, job_id ORDER BY revision DESC) AS rn
    FROM versions
), known AS (
    SELECT * FROM numbered WHERE current_revision - revision = rn - 1
), chained AS (
    SELECT known.*,
           lag(kind) OVER w AS p_kind, lag(cron_expr) OVER w AS p_cron_expr,
           lag(cron_dialect) OVER w AS p_cron_dialect, lag(tz) OVER w AS p_tz,
           lag(interval_s) OVER w AS p_interval_s, lag(anchor_at) OVER w AS p_anchor_at,
           lag(fire_at) OVER w AS p_fire_at, lag(paused) OVER w AS p_paused,
           first_value(revision) OVER w AS first_revision,
           first_value(valid_from) OVER w AS first_valid_from
    FROM known
    WINDOW w AS (PARTITION BY partition_id, job_id ORDER BY revision)
), all_versions AS (
    SELECT partition_id, job_id, revision, valid_from, valid_until, kind, cron_expr, cron_dialect, tz,
           interval_s, anchor_at, fire_at, misfire, catchup_window_s, misfire_grace_s, jitter_s, paused,
           CASE WHEN first_revision = 1 THEN NULL ELSE first_valid_from END AS audit_from,
           CASE WHEN revision = 1 THEN created_at ELSE valid_from END AS slots_from,
           (revision > first_revision AND NOT p_paused AND p_kind = kind
            AND p_cron_expr IS NOT DISTINCT FROM cron_expr AND p_cron_dialect IS NOT DISTINCT FROM cron_dialect
            AND p_tz IS NOT DISTINCT FROM tz AND p_interval_s IS NOT DISTINCT FROM interval_s
            AND p_anchor_at IS NOT DISTINCT FROM anchor_at AND p_fire_at IS NOT DISTINCT FROM fire_at)
             AS seamless,
           revision = current_revision AS is_current
    FROM chained
    UNION ALL
    SELECT j.partition_id, j.job_id, j.revision, j.changed_at, j.deleted_at, j.kind, j.cron_expr,
           j.cron_dialect, j.tz, j.interval_s, j.anchor_at, j.fire_at, j.misfire, j.catchup_window_s,
           j.misfire_grace_s, j.jitter_s, j.paused, NULL, j.created_at, false, true
    FROM jobs AS j
    WHERE j.revision = 1 AND j.created_at < %(until)s AND (j.deleted_at IS NULL OR j.deleted_at >= %(since)s)
)
SELECT all_versions.*,
       NOT paused AND (valid_until IS NULL OR valid_until > %(since)s) AND slots_from < %(until)s AS has_slots
FROM all_versions;

-- name: create_audit_tables
CREATE TEMPORARY TABLE audit_cut ON COMMIT DROP AS
SELECT partition_id, job_id, audit_from FROM audit_versions WHERE is_current AND audit_from IS NOT NULL;
CREATE TEMPORARY TABLE audit_cron_slots (
    cron_expr TEXT NOT NULL,
    cron_dialect TEXT NOT NULL,
    tz TEXT NOT NULL,
    nominal_time TIMESTAMPTZ NOT NULL
) ON COMMIT DROP;
CREATE TEMPORARY TABLE audit_expected (
    partition_id INTEGER NOT NULL,
    job_id UUID NOT NULL,
    nominal_time TIMESTAMPTZ NOT NULL,
    scheduled_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (partition_id, job_id, nominal_time)
) ON COMMIT DROP;
CREATE TEMPORARY TABLE audit_oracle (
    partition_id INTEGER NOT NULL,
    job_id UUID NOT NULL,
    nominal_time TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (partition_id, job_id, nominal_time)
) ON COMMIT DROP;

-- name: audit_cron_schedules
-- The distinct cron schedules of jitter-free revisions with slots in the
-- window: computed once per schedule, however many jobs share it.
SELECT DISTINCT cron_expr, cron_dialect, tz
FROM audit_versions
WHERE has_slots AND kind = 'cron' AND jitter_s = 0;

-- name: audit_segments
-- Revisions whose slots are computed one at a time: interval, one-shot and
-- jittered ones (jitter depends on the job), and with %(all)s every one (the
-- independent oracle of verify --exhaustive), ordered by job.
SELECT partition_id, job_id, revision, kind, cron_expr, cron_dialect, tz, interval_s, anchor_at, fire_at,
       jitter_s, slots_from, seamless, valid_until
FROM audit_versions
WHERE has_slots AND (%(all)s OR kind <> 'cron' OR jitter_s > 0)
ORDER BY partition_id, job_id, revision;

-- name: analyze_audit_slots
-- Statistics for the expansion's join (temporary tables are never analyzed
-- by autovacuum): unanalyzed, PostgreSQL estimated both sides at a few
-- rows and joined 5 M revisions with 1,000 schedules' slots by a nested
-- loop (verify of one herd second ran for over 9 minutes).
ANALYZE audit_versions;
ANALYZE audit_cron_slots;

-- name: expand_audit_cron_slots
-- Every jitter-free cron revision gets its schedule's slots inside its
-- interval (a job's revisions' intervals are disjoint: no slot twice).
INSERT INTO audit_expected (partition_id, job_id, nominal_time, scheduled_at)
SELECT v.partition_id, v.job_id, s.nominal_time, s.nominal_time
FROM audit_versions AS v
JOIN audit_cron_slots AS s
  ON s.cron_expr = v.cron_expr AND s.cron_dialect = v.cron_dialect AND s.tz = v.tz
WHERE v.has_slots AND v.kind = 'cron' AND v.jitter_s = 0
  AND (s.nominal_time > v.slots_from OR (v.seamless AND s.nominal_time = v.slots_from))
  AND (v.valid_until IS NULL OR s.nominal_time < v.valid_until);

-- name: create_audit_runs
-- The audited runs: nominal time in the window, not before a job's known
-- history (audit_from), and not jittered past the window (a slot scheduled
-- after until is not expected yet, so its run, if auditing the past found it
-- fired, is not audited either). expected_at is the scheduled time the audit
-- computed for the slot (NULL: the run is unexpected). Only the schedule's
-- own runs (origin schedule, or NULL: fired before delivery existed): a
-- manual run (jobs trigger) is at no slot, a backfilled one is late by
-- design; both still count as a slot's run in audit_unfired.
CREATE TEMPORARY TABLE audit_runs ON COMMIT DROP AS
SELECT r.partition_id, r.job_id, r.nominal_time, r.scheduled_at, r.fired_at, e.scheduled_at AS expected_at
FROM runs AS r
LEFT JOIN audit_expected AS e
  ON e.partition_id = r.partition_id AND e.job_id = r.job_id AND e.nominal_time = r.nominal_time
WHERE r.nominal_time >= %(since)s AND r.nominal_time < %(until)s
  AND coalesce(r.origin, 'schedule') = 'schedule'
  AND r.scheduled_at <= %(until)s
  AND NOT EXISTS (SELECT 1 FROM audit_cut AS c
                  WHERE c.partition_id = r.partition_id AND c.job_id = r.job_id
                    AND r.nominal_time <= c.audit_from);

-- name: create_audit_skips
-- Every skip of an audited job whose range meets the window, checked against
-- its rule (invalid_because NULL: valid), with the policy in force at
-- recorded_at (the revision whose [valid_from, valid_until) holds it):
-- catchup_window (misfire all): every expected slot in the range older than
-- recorded_at - catchup_window_s; grace (misfire skip) and once (misfire
-- once): every one scheduled more than misfire_grace_s before recorded_at,
-- and for once a run at until_nominal (the collapsed run carries the latest
-- missed slot); edited, paused, deleted: recorded at a rewrite of the job
-- (a job_revisions.valid_until) and no slot in the range after it; any other
-- reason is invalid; overlap (docs/delivery.md) needs a run of the job
-- under an overlap policy (runs.overlap set) unfinished at recorded_at
-- (fired by then, not finished before); so is any skip whose range holds a
-- run the schedule fired (a slot cannot be both fired and skipped; a
-- backfilled or manual run may fill a skipped slot). A skip recorded while
-- the job's history is unknown is only checked for its reason and its runs.
CREATE TEMPORARY TABLE audit_skips ON COMMIT DROP AS
SELECT s.partition_id, s.job_id, s.first_nominal, s.until_nominal, s.reason, s.recorded_at,
       CASE
         WHEN s.reason NOT IN ('catchup_window', 'grace', 'once', 'edited', 'paused', 'deleted', 'overlap')
           THEN 'unknown reason'
         WHEN EXISTS (SELECT 1 FROM runs AS r
                      WHERE r.partition_id = s.partition_id AND r.job_id = s.job_id
                        AND r.nominal_time >= s.first_nominal AND r.nominal_time < s.until_nominal
                        AND coalesce(r.origin, 'schedule') = 'schedule')
           THEN 'a run exists in the range (the slot fired and was skipped)'
         WHEN s.reason = 'overlap' THEN
           CASE WHEN NOT EXISTS (SELECT 1 FROM runs AS r
                                 WHERE r.partition_id = s.partition_id AND r.job_id = s.job_id
                                   AND r.overlap IS NOT NULL AND r.fired_at <= s.recorded_at
                                   AND (r.finished_at IS NULL OR r.finished_at >= s.recorded_at))
             THEN 'no unfinished run of the job under an overlap policy at recorded_at' END
         WHEN s.reason IN ('edited', 'paused', 'deleted') THEN
           CASE
             WHEN NOT EXISTS (SELECT 1 FROM job_revisions AS jr
                              WHERE jr.partition_id = s.partition_id AND jr.job_id = s.job_id
                                AND jr.valid_until = s.recorded_at)
               THEN 'no rewrite of the job (job_revisions.valid_until) at recorded_at'
             WHEN EXISTS (SELECT 1 FROM audit_expected AS e
                          WHERE e.partition_id = s.partition_id AND e.job_id = s.job_id
                            AND e.nominal_time >= s.first_nominal AND e.nominal_time < s.until_nominal
                            AND e.nominal_time > s.recorded_at)
               THEN 'a slot in the range was later than the rewrite'
           END
         WHEN p.misfire IS NULL THEN NULL
         WHEN p.misfire <> CASE s.reason WHEN 'catchup_window' THEN 'all' WHEN 'grace' THEN 'skip'
                                         ELSE 'once' END
           THEN 'reason ' || s.reason || ' needs misfire '
                || CASE s.reason WHEN 'catchup_window' THEN 'all' WHEN 'grace' THEN 'skip' ELSE 'once' END
                || ' (the job''s policy was ' || p.misfire || ')'
         WHEN s.reason = 'catchup_window' AND EXISTS (
                SELECT 1 FROM audit_expected AS e
                WHERE e.partition_id = s.partition_id AND e.job_id = s.job_id
                  AND e.nominal_time >= s.first_nominal AND e.nominal_time < s.until_nominal
                  AND e.nominal_time >= s.recorded_at - p.catchup_window_s * interval '1 second')
           THEN 'a slot in the range was not older than the catch-up window at recorded_at'
         WHEN s.reason IN ('grace', 'once') AND EXISTS (
                SELECT 1 FROM audit_expected AS e
                WHERE e.partition_id = s.partition_id AND e.job_id = s.job_id
                  AND e.nominal_time >= s.first_nominal AND e.nominal_time < s.until_nominal
                  AND e.scheduled_at >= s.recorded_at - p.misfire_grace_s * interval '1 second')
           THEN 'a slot in the range was not past the misfire grace at recorded_at'
         WHEN s.reason = 'once' AND NOT EXISTS (
                SELECT 1 FROM runs AS r
                WHERE r.partition_id = s.partition_id AND r.job_id = s.job_id
                  AND r.nominal_time = s.until_nominal)
           THEN 'no run at until_nominal (where the collapsed run belongs)'
       END AS invalid_because
FROM skips AS s
JOIN audit_versions AS c ON c.partition_id = s.partition_id AND c.job_id = s.job_id AND c.is_current
LEFT JOIN LATERAL (
    SELECT v.misfire, v.catchup_window_s, v.misfire_grace_s
    FROM audit_versions AS v
    WHERE v.partition_id = s.partition_id AND v.job_id = s.job_id
      AND v.valid_from <= s.recorded_at AND (v.valid_until IS NULL OR s.recorded_at < v.valid_until)
    ORDER BY v.revision DESC
    LIMIT 1
) AS p ON true
WHERE s.first_nominal < %(until)s AND s.until_nominal > %(since)s;

-- name: create_audit_unfired
-- Expected slots without a run; skipped when a valid skip covers them (a slot
-- covered only by invalid skips is missing).
CREATE TEMPORARY TABLE audit_unfired ON COMMIT DROP AS
SELECT e.partition_id, e.job_id, e.nominal_time, e.scheduled_at,
       EXISTS (SELECT 1 FROM audit_skips AS s
               WHERE s.partition_id = e.partition_id AND s.job_id = e.job_id
                 AND e.nominal_time >= s.first_nominal AND e.nominal_time < s.until_nominal
                 AND s.invalid_because IS NULL) AS skipped
FROM audit_expected AS e
WHERE NOT EXISTS (SELECT 1 FROM runs AS r
                  WHERE r.partition_id = e.partition_id AND r.job_id = e.job_id
                    AND r.nominal_time = e.nominal_time);

-- name: analyze_audit_tables
ANALYZE audit_cut;
ANALYZE audit_expected;
ANALYZE audit_oracle;

-- name: analyze_audit_results
ANALYZE audit_runs;
ANALYZE audit_skips;
ANALYZE audit_unfired;

-- name: summarize_audit
-- The counts of scheduler/audit.py's report. early: a run fired before its
-- scheduled time (the stored one, or the one the audit computed, or its
-- nominal time, whichever is latest). expected_disagreements: slots only one
-- of the schedule code and the oracle produce (NULL unless %(exhaustive)s).
SELECT (SELECT count(*) FROM audit_expected) AS expected,
       (SELECT count(*) FROM audit_runs) AS runs,
       (SELECT count(*) FROM audit_unfired WHERE NOT skipped) AS missing,
       (SELECT count(*) FROM audit_unfired WHERE skipped) AS skipped,
       (SELECT count(*) FROM (SELECT 1 FROM audit_runs
                              GROUP BY partition_id, job_id, nominal_time
                              HAVING count(*) > 1) AS d) AS duplicates,
       (SELECT count(*) FROM audit_runs WHERE expected_at IS NULL) AS unexpected,
       (SELECT count(*) FROM audit_runs
        WHERE fired_at < scheduled_at OR fired_at < nominal_time
           OR fired_at < coalesce(expected_at, scheduled_at)) AS early,
       (SELECT count(*) FROM audit_skips WHERE invalid_because IS NOT NULL) AS skips_invalid,
       CASE WHEN %(exhaustive)s THEN
         (SELECT count(*) FROM audit_expected AS e
          WHERE NOT EXISTS (SELECT 1 FROM audit_oracle AS o
                            WHERE o.partition_id = e.partition_id AND o.job_id = e.job_id
                              AND o.nominal_time = e.nominal_time))
         + (SELECT count(*) FROM audit_oracle AS o
            WHERE NOT EXISTS (SELECT 1 FROM audit_expected AS e
                              WHERE e.partition_id = o.partition_id AND e.job_id = o.job_id
                                AND e.nominal_time = o.nominal_time))
       END AS expected_disagreements,
       (SELECT count(*) FROM audit_versions WHERE is_current)
         - (SELECT count(*) FROM audit_cut WHERE audit_from >= %(since)s) AS jobs_audited,
       (SELECT count(*) FROM audit_cut WHERE audit_from >= %(since)s) AS jobs_excluded,
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM (fired_at - scheduled_at))::float8)
        FROM audit_runs) AS lateness_p50_s,
       (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM (fired_at - scheduled_at))::float8)
        FROM audit_runs) AS lateness_p99_s,
       (SELECT max(extract(epoch FROM (fired_at - scheduled_at))::float8) FROM audit_runs) AS lateness_max_s;

-- name: list_audit_missing
-- The first %(limit)s missing slots, by job then nominal time.
SELECT job_id, nominal_time, scheduled_at
FROM audit_unfired WHERE NOT skipped
ORDER BY job_id, nominal_time
LIMIT %(limit)s;

-- name: list_audit_duplicates
SELECT job_id, nominal_time, count(*) AS runs
FROM audit_runs
GROUP BY partition_id, job_id, nominal_time
HAVING count(*) > 1
ORDER BY job_id, nominal_time
LIMIT %(limit)s;

-- name: list_audit_early
-- scheduled_at: the latest of the stored and the computed scheduled time.
SELECT job_id, nominal_time,
       CASE WHEN coalesce(expected_at, scheduled_at) > scheduled_at THEN expected_at ELSE scheduled_at END
         AS scheduled_at,
       fired_at
FROM audit_runs
WHERE fired_at < scheduled_at OR fired_at < nominal_time OR fired_at < coalesce(expected_at, scheduled_at)
ORDER BY job_id, nominal_time
LIMIT %(limit)s;

-- name: list_audit_unexpected
SELECT job_id, nominal_time, fired_at
FROM audit_runs WHERE expected_at IS NULL
ORDER BY job_id, nominal_time
LIMIT %(limit)s;

-- name: list_audit_skips_invalid
SELECT job_id, first_nominal, until_nominal, reason, recorded_at, invalid_because AS rule
FROM audit_skips WHERE invalid_because IS NOT NULL
ORDER BY job_id, first_nominal
LIMIT %(limit)s;

-- name: list_audit_disagreements
-- Slots only the schedule code (only_in 'schedule') or only the oracle
-- (only_in 'oracle') produces.
SELECT job_id, nominal_time, only_in FROM (
    SELECT e.job_id, e.nominal_time, 'schedule' AS only_in
    FROM audit_expected AS e
    WHERE NOT EXISTS (SELECT 1 FROM audit_oracle AS o
                      WHERE o.partition_id = e.partition_id AND o.job_id = e.job_id
                        AND o.nominal_time = e.nominal_time)
    UNION ALL
    SELECT o.job_id, o.nominal_time, 'oracle' AS only_in
    FROM audit_oracle AS o
    WHERE NOT EXISTS (SELECT 1 FROM audit_expected AS e
                      WHERE e.partition_id = o.partition_id AND e.job_id = o.job_id
                        AND e.nominal_time = o.nominal_time)
) AS d
ORDER BY job_id, nominal_time
LIMIT %(limit)s;

-- name: summarize_delivery_audit
-- verify --delivery (scheduler/audit.py, verify_delivery): the runs with
-- nominal time in [since, until) by delivery state. The delivery era starts,
-- as far as the window shows, at the earliest fired_at of a run carrying a
-- state: a run without one fired then or later is lost (the firing statement
-- writes the state with the run), one fired before predates delivery.
-- stale: leased or failed runs whose lease ended before %(stale_before)s
-- (their partition's owner should have settled them).
WITH w AS (
    SELECT r.state, r.fired_at, r.leased_until
    FROM runs AS r
    WHERE r.nominal_time >= %(since)s AND r.nominal_time < %(until)s
), era AS (
    SELECT min(w.fired_at) AS since FROM w WHERE w.state IS NOT NULL
)
SELECT count(*) AS runs,
       count(*) FILTER (WHERE w.state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE w.state = 'dead') AS dead,
       count(*) FILTER (WHERE w.state = 'canceled') AS canceled,
       count(*) FILTER (WHERE w.state = 'pending') AS pending,
       count(*) FILTER (WHERE w.state = 'leased') AS leased,
       count(*) FILTER (WHERE w.state = 'failed') AS failed,
       count(*) FILTER (WHERE w.state IS NULL AND w.fired_at >= era.since) AS lost,
       count(*) FILTER (WHERE w.state IS NULL AND (era.since IS NULL OR w.fired_at < era.since)) AS predelivery,
       count(*) FILTER (WHERE w.state IN ('leased', 'failed') AND w.leased_until < %(stale_before)s) AS stale,
       min(era.since) AS state_since
FROM w CROSS JOIN era;

-- name: list_delivery_audit
-- The first %(limit)s runs of one finding of summarize_delivery_audit
-- (%(kind)s: lost, dead, canceled or stale), by job id then nominal time.
WITH era AS (
    SELECT min(r.fired_at) AS since
    FROM runs AS r
    WHERE r.nominal_time >= %(since)s AND r.nominal_time < %(until)s AND r.state IS NOT NULL
)
SELECT r.job_id, r.nominal_time, r.state, r.attempt, r.fired_at, r.leased_until, r.worker, r.last_error
FROM runs AS r CROSS JOIN era
WHERE r.nominal_time >= %(since)s AND r.nominal_time < %(until)s
  AND ((%(kind)s = 'lost' AND r.state IS NULL AND r.fired_at >= era.since)
       OR (%(kind)s IN ('dead', 'canceled') AND r.state = %(kind)s)
       OR (%(kind)s = 'stale' AND r.state IN ('leased', 'failed') AND r.leased_until < %(stale_before)s))
ORDER BY r.job_id, r.nominal_time
LIMIT %(limit)s;

-- name: recent_lag
-- Runs fired in the last %(window_s)s seconds and their lateness p99 (live views).
SELECT count(*) AS runs,
       percentile_cont(0.99) WITHIN GROUP (
           ORDER BY extract(epoch FROM (fired_at - scheduled_at))::float8) AS p99_s
FROM runs
WHERE fired_at > now() - %(window_s)s * interval '1 second';

-- ---------------------------------------------------------------- delivery
-- The run lifecycle of docs/delivery.md. Every statement here names the
-- runs it changes by primary key and checks the state it expects, so a
-- statement that loses a race changes nothing: the lease token (claim,
-- heartbeat, ack, nack) or the partition owner's epoch (claim_push,
-- settle_runs) is the fence, never SKIP LOCKED. Times are the statement's
-- timestamp, or the store clock's pin %(now)s when given (tests).

-- name: tenants_with_pending_runs
-- Of %(tenants)s, the tenants with a pending run of queue %(queue)s available
-- now: one probe of runs_pending_idx each, which stops at the first entry
-- (LIMIT 1). A worker serving several tenants asks this once a round and
-- claims only from those, instead of an empty claim per idle tenant. The
-- LATERAL ... LIMIT 1 makes it a loop over the tenants, and the probe
-- settings it runs with (no sequential scan, lifecycle.tenants_with_runs)
-- leave each tenant one index probe, whatever runs' statistics say. Written
-- as a semi-join (WHERE EXISTS), it was planned from them, and with those of
-- the minutes before a herd (few pending runs) it hashed, or on a probe
-- session nested-looped over, every pending run of the queue at each probe;
-- as a LATERAL without the settings, current statistics made each tenant's
-- probe a sequential scan (tests/integration/test_store_plans.py).
SELECT t.tenant
FROM unnest(%(tenants)s::text[]) AS t (tenant)
CROSS JOIN LATERAL (
    SELECT 1
    FROM runs AS r
    WHERE r.tenant = t.tenant
      AND r.queue = %(queue)s
      AND r.state = 'pending'
      AND r.queue IS NOT NULL
      AND r.available_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
    LIMIT 1
) AS found;

-- name: tenants_next_due
-- When the next timer of %(tenants)s whose runs go to queue %(queue)s falls
-- due: seconds from the store's now (%(now)s when pinned) to the earliest
-- next_due_at among them, NULL if none is due from %(late_s)s seconds ago on
-- (a timer overdue longer than that waits for a node, not for a worker).
-- An idle worker sleeps until then instead of its idle backoff (docs/delivery.md,
-- "Claims"). One walk of jobs_due_schedule_idx per tenant from the earliest
-- due entry, its first %(scan)s entries at most, keeping those of the queue
-- (the index has no queue: a tenant whose first entries are all of other
-- queues or pushed answers nothing, and its worker keeps its backoff).
SELECT extract(epoch FROM (min(d.next_due_at)
                           - coalesce(%(now)s::timestamptz, statement_timestamp())))::float8 AS due_in_s
FROM unnest(%(tenants)s::text[]) AS t (tenant)
CROSS JOIN LATERAL (
    SELECT e.next_due_at
    FROM (SELECT j.next_due_at, j.queue
          FROM jobs AS j
          WHERE j.tenant = t.tenant
            AND j.next_due_at IS NOT NULL
            AND j.next_due_at >= coalesce(%(now)s::timestamptz, statement_timestamp())
                                 - %(late_s)s::float8 * interval '1 second'
          ORDER BY j.next_due_at
          LIMIT %(scan)s) AS e
    WHERE e.queue = %(queue)s
    ORDER BY e.next_due_at
    LIMIT 1
) AS d;

-- name: claim_runs
-- A worker's claim: up to %(limit)s pending runs of queue %(queue)s of tenant
-- %(tenant)s available now, oldest available first (runs_pending_idx), each
-- leased to %(worker)s for %(lease_s)s seconds with a new random token and
-- attempt + 1. SKIP LOCKED spreads concurrent claimers over different runs;
-- the re-check of state in the UPDATE makes a run leased by a concurrent
-- claim (READ COMMITTED re-evaluation) drop out. Returns the runs with what
-- the handler needs: the job's name and the job_delivery row's payload. The
-- name is the run's own (runs.job_name, written when the run was created:
-- '' for a job without one), so a claim reads nothing of the 5 M-row jobs
-- table; a run written before revision 0035 (NULL) is looked up in jobs.
WITH picked AS (
    SELECT r.partition_id, r.job_id, r.nominal_time
    FROM runs AS r
    WHERE r.tenant = %(tenant)s
      AND r.queue = %(queue)s
      AND r.state = 'pending'
      AND r.queue IS NOT NULL
      AND r.available_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
    ORDER BY r.available_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE runs AS r
    SET state = 'leased',
        attempt = r.attempt + 1,
        lease_token = gen_random_uuid(),
        leased_until = coalesce(%(now)s::timestamptz, statement_timestamp())
                       + %(lease_s)s::float8 * interval '1 second',
        worker = %(worker)s,
        claimed_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
        first_claimed_at = coalesce(r.first_claimed_at, coalesce(%(now)s::timestamptz, statement_timestamp())),
        retryable = NULL
    FROM picked AS p
    WHERE r.partition_id = p.partition_id
      AND r.job_id = p.job_id
      AND r.nominal_time = p.nominal_time
      AND r.state = 'pending'
    RETURNING r.partition_id, r.job_id, r.nominal_time, r.tenant, r.queue, r.origin, r.scheduled_at,
              r.attempt, r.lease_token, r.leased_until, r.claimed_at, r.job_name AS recorded_name
)
SELECT c.partition_id, c.job_id, c.nominal_time, c.tenant, c.queue, c.origin, c.scheduled_at,
       c.attempt, c.lease_token, c.leased_until, c.claimed_at,
       CASE WHEN c.recorded_name IS NOT NULL THEN nullif(c.recorded_name, '')
            ELSE (SELECT j.name FROM jobs AS j
                  WHERE j.partition_id = c.partition_id AND j.job_id = c.job_id) END AS job_name,
       d.payload, d.url, d.method, d.headers, d.timeout_s
FROM claimed AS c
LEFT JOIN job_delivery AS d ON d.partition_id = c.partition_id AND d.job_id = c.job_id
ORDER BY c.nominal_time, c.job_id;

-- name: due_push_partitions
-- The partitions, among %(pids)s, of the %(limit)s pushed runs (no queue)
-- pending longest and available at %(now)s (NULL: now()) — the runs
-- claim_push would pick. runs_push_idx is on available_at alone, so the scan
-- reads due entries oldest first and stops after %(limit)s of ours: about
-- limit × the nodes sharing the partitions, however long the backlog (an
-- index led by partition_id made PostgreSQL read every due entry and keep the
-- top: the whole backlog at each poll). "partition_id + 0" keeps the
-- partition test a filter on the entries read in order, never an index
-- condition (over runs_pkey it would read every run of the partitions, then
-- sort; so would claim_push's). The push loop then fences only these
-- partitions in claim_push, which locks its partitions rows FOR SHARE: an
-- idle loop locks none, a busy one a few, never every partition it holds.
SELECT DISTINCT s.partition_id
FROM (
    SELECT r.partition_id
    FROM runs AS r
    WHERE r.state = 'pending'
      AND r.queue IS NULL
      AND r.available_at <= coalesce(%(now)s::timestamptz, now())
      AND r.partition_id + 0 = ANY(%(pids)s::int4[])
    ORDER BY r.available_at
    LIMIT %(limit)s
) AS s;

-- name: claim_push
-- The partition owner's claim of pushed runs (HTTP targets): up to
-- %(limit)s pending runs with no queue of the fenced partitions among
-- %(pids)s, available now (runs_push_idx), leased to the node %(node_id)s
-- until now + the job's per-attempt timeout (%(default_timeout_s)s without
-- one) + %(margin_s)s. Fenced like fire_runs: the partitions rows locked FOR
-- SHARE where owner and epoch (%(epochs)s[p + 1]) are still ours, so a node
-- that lost a partition claims none of its runs. The oldest due runs are
-- read in order from runs_push_idx (on available_at), skipping other
-- partitions' (see due_push_partitions). SKIP LOCKED only spreads two
-- claimers (an old and a new owner for a moment) over different runs; the
-- state re-check in the UPDATE is what keeps a run leased once. The job's
-- name comes from the run, as in claim_runs.
WITH fence AS (
    SELECT p.partition_id
    FROM partitions AS p
    WHERE p.partition_id = ANY(%(pids)s::int4[])
      AND p.owner_node = %(node_id)s
      AND p.owner_epoch = (%(epochs)s::int8[])[p.partition_id + 1]
    FOR SHARE OF p
), fenced AS (
    SELECT coalesce(array_agg(partition_id), '{}'::int4[]) AS pids FROM fence
), picked AS (
    SELECT r.partition_id, r.job_id, r.nominal_time
    FROM runs AS r
    WHERE r.state = 'pending'
      AND r.queue IS NULL
      AND r.available_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
      AND r.partition_id + 0 = ANY((SELECT pids FROM fenced)::int4[])
    ORDER BY r.available_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE runs AS r
    SET state = 'leased',
        attempt = r.attempt + 1,
        lease_token = gen_random_uuid(),
        leased_until = coalesce(%(now)s::timestamptz, statement_timestamp())
                       + (coalesce(d.timeout_s, %(default_timeout_s)s::float8) + %(margin_s)s::float8)
                         * interval '1 second',
        worker = %(node_id)s,
        claimed_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
        first_claimed_at = coalesce(r.first_claimed_at, coalesce(%(now)s::timestamptz, statement_timestamp())),
        retryable = NULL
    FROM picked AS p
    LEFT JOIN job_delivery AS d ON d.partition_id = p.partition_id AND d.job_id = p.job_id
    WHERE r.partition_id = p.partition_id
      AND r.job_id = p.job_id
      AND r.nominal_time = p.nominal_time
      AND r.state = 'pending'
    RETURNING r.partition_id, r.job_id, r.nominal_time, r.tenant, r.queue, r.origin, r.scheduled_at,
              r.attempt, r.lease_token, r.leased_until, r.claimed_at, r.job_name AS recorded_name
)
SELECT c.partition_id, c.job_id, c.nominal_time, c.tenant, c.queue, c.origin, c.scheduled_at,
       c.attempt, c.lease_token, c.leased_until, c.claimed_at,
       CASE WHEN c.recorded_name IS NOT NULL THEN nullif(c.recorded_name, '')
            ELSE (SELECT j.name FROM jobs AS j
                  WHERE j.partition_id = c.partition_id AND j.job_id = c.job_id) END AS job_name,
       d.payload, d.url, d.method, d.headers, d.timeout_s
FROM claimed AS c
LEFT JOIN job_delivery AS d ON d.partition_id = c.partition_id AND d.job_id = c.job_id
ORDER BY c.nominal_time, c.job_id;

-- name: heartbeat_runs
-- Extend the leases of runs (pids[i], jids[i], nominals[i]) whose current
-- token is tokens[i] and which are still leased, to now + %(lease_s)s.
-- Answers every pair, in input order: 'leased' (extended), 'canceled' (the
-- run was canceled while this token held it: stop working on it) or 'lost'
-- (another token holds it, it finished, or it is unknown). The answer of a
-- run this statement did not extend comes from the statement's snapshot.
-- Whether a pair was changed is asked of its ordinal with IN (a hashed
-- subplan), not by a join with the data-modifying CTE: the planner
-- estimates that CTE at one row and nested-loops it, quadratic in the
-- batch (130 ms for 450 acks). Only a pair not changed reads its run
-- again (the CASE branch's subquery), to say why. %(tenant)s (NULL: any)
-- scopes every read and write to one tenant (the HTTP API's key): another
-- tenant's run answers 'lost', exactly like a missing one. So do
-- ack_runs and nack_runs. The state test is written through coalesce so
-- that no partial index matches it: runs_inflight_idx (leased runs) has
-- statistics that are stale for a minute after a herd's claims (none
-- leased), and the planner then read every leased run per batch. With
-- store.execute_probing, each pair is one runs_pkey probe. So in ack_runs
-- and nack_runs.
WITH a AS (
    SELECT *
    FROM unnest(%(pids)b::int4[], %(jids)b::uuid[], %(nominals)b::timestamptz[], %(tokens)b::uuid[])
         WITH ORDINALITY AS a (pid, jid, nominal, token, i)
), extended AS (
    UPDATE runs AS r
    SET leased_until = coalesce(%(now)s::timestamptz, statement_timestamp())
                       + %(lease_s)s::float8 * interval '1 second'
    FROM a
    WHERE r.partition_id = a.pid AND r.job_id = a.jid AND r.nominal_time = a.nominal
      AND r.lease_token = a.token
      AND coalesce(r.state, '') = 'leased'
      AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s::text)
    RETURNING a.i
)
SELECT a.i,
       CASE WHEN a.i IN (SELECT i FROM extended) THEN 'leased'
            ELSE coalesce((SELECT CASE WHEN r.state = 'canceled' AND r.lease_token = a.token THEN 'canceled' END
                      FROM runs AS r
                      WHERE r.partition_id = a.pid AND r.job_id = a.jid AND r.nominal_time = a.nominal
                        AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s::text)), 'lost') END AS answer
FROM a
ORDER BY a.i;

-- name: ack_runs
-- Record attempts that succeeded: runs (pids[i], jids[i], nominals[i]) whose
-- current token is tokens[i] and which are still leased become succeeded,
-- with last_error cleared (an earlier attempt's error, or the one a redriven
-- run died of, is not what a succeeded run shows).
-- Answers every pair in input order: 'succeeded' (now, or already by this
-- very token: an ack re-sent after a lost reply), 'canceled' or 'lost'
-- (refused: see heartbeat_runs). Changed pairs are found with IN, as in
-- heartbeat_runs.
WITH a AS (
    SELECT *
    FROM unnest(%(pids)b::int4[], %(jids)b::uuid[], %(nominals)b::timestamptz[], %(tokens)b::uuid[])
         WITH ORDINALITY AS a (pid, jid, nominal, token, i)
), done AS (
    UPDATE runs AS r
    SET state = 'succeeded',
        finished_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
        leased_until = NULL,
        last_error = NULL
    FROM a
    WHERE r.partition_id = a.pid AND r.job_id = a.jid AND r.nominal_time = a.nominal
      AND r.lease_token = a.token
      AND coalesce(r.state, '') = 'leased'
      AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s::text)
    RETURNING a.i
)
SELECT a.i,
       CASE WHEN a.i IN (SELECT i FROM done) THEN 'succeeded'
            ELSE coalesce((SELECT CASE WHEN r.lease_token = a.token AND r.state IN ('succeeded', 'canceled') THEN r.state END
                      FROM runs AS r
                      WHERE r.partition_id = a.pid AND r.job_id = a.jid AND r.nominal_time = a.nominal
                        AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s::text)), 'lost') END AS answer
FROM a
ORDER BY a.i;

-- name: nack_runs
-- Record attempts that failed: runs (pids[i], jids[i], nominals[i]) whose
-- current token is tokens[i] and which are still leased become failed, with
-- retryables[i], the error errors[i] and the earliest retry now +
-- retry_after_s[i] (NULL: no wish). The partition owner's settle_runs then
-- decides: pending after a backoff, or dead. Answers as ack_runs
-- ('failed', or already 'failed' by this token). Changed pairs are found with
-- IN, as in heartbeat_runs.
WITH a AS (
    SELECT *
    FROM unnest(%(pids)b::int4[], %(jids)b::uuid[], %(nominals)b::timestamptz[], %(tokens)b::uuid[],
                %(retryables)b::bool[], %(errors)b::text[], %(retry_after_s)b::float8[])
         WITH ORDINALITY AS a (pid, jid, nominal, token, retryable, error, retry_after_s, i)
), failed AS (
    UPDATE runs AS r
    SET state = 'failed',
        retryable = a.retryable,
        last_error = a.error,
        available_at = coalesce(%(now)s::timestamptz, statement_timestamp())
                       + coalesce(a.retry_after_s, 0) * interval '1 second',
        leased_until = coalesce(%(now)s::timestamptz, statement_timestamp())
    FROM a
    WHERE r.partition_id = a.pid AND r.job_id = a.jid AND r.nominal_time = a.nominal
      AND r.lease_token = a.token
      AND coalesce(r.state, '') = 'leased'
      AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s::text)
    RETURNING a.i
)
SELECT a.i,
       CASE WHEN a.i IN (SELECT i FROM failed) THEN 'failed'
            ELSE coalesce((SELECT CASE WHEN r.lease_token = a.token AND r.state IN ('failed', 'canceled') THEN r.state END
                      FROM runs AS r
                      WHERE r.partition_id = a.pid AND r.job_id = a.jid AND r.nominal_time = a.nominal
                        AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s::text)), 'lost') END AS answer
FROM a
ORDER BY a.i;

-- name: settle_runs
-- Only partitions with something to settle are fenced (locked): an idle pass locks none.
-- The partition owner's settle step, fenced like fire_runs (the partitions
-- rows locked FOR SHARE where owner %(node_id)s and epoch %(epochs)s[p + 1]
-- are still ours): up to %(limit)s runs of the fenced partitions among
-- %(pids)s that are leased with an expired lease, or failed
-- (runs_inflight_idx, oldest first), each moved
--   to dead      when the failure is not retryable, its attempts reached the
--                job's max_attempts, or its retry would start later than
--                max_age_s after its first claim;
--   to pending   otherwise, available after a backoff with full jitter:
--                random() × min(cap, base × 2^(attempt − 1)) seconds, and
--                never before the failure's own wish (available_at of a
--                failed run: Retry-After, a nack's retry_after_s).
-- The job's policy comes from its job_delivery row, else the defaults
-- %(max_attempts)s, %(backoff_base_s)s, %(backoff_cap_s)s. An expired lease
-- leaves last_error 'lease expired'; a run dead by max_age_s gets, after
-- its error, why (nothing else says it: its attempts are under the max, its
-- error retryable). Returns one row per settled run: its new state, attempt
-- and whether its lease had expired (for metrics), its tenant, and for a run
-- now dead its last_error and why ('not retryable', 'max attempts',
-- 'max age'; the node logs them; NULL else).
WITH fence AS (
    SELECT p.partition_id
    FROM partitions AS p
    WHERE p.partition_id = ANY(%(pids)s::int4[])
      AND p.owner_node = %(node_id)s
      AND p.owner_epoch = (%(epochs)s::int8[])[p.partition_id + 1]
      AND EXISTS (SELECT 1 FROM runs AS w
                  WHERE w.partition_id = p.partition_id AND w.state IN ('leased', 'failed')
                    AND w.leased_until <= coalesce(%(now)s::timestamptz, statement_timestamp()))
    FOR SHARE OF p
), due AS (
    SELECT r.partition_id, r.job_id, r.nominal_time, r.state AS was, r.attempt, r.lease_token,
           r.first_claimed_at, r.retryable,
           CASE WHEN r.state = 'failed' THEN r.available_at END AS wish,
           coalesce(d.max_attempts, %(max_attempts)s) AS max_attempts,
           d.max_age_s,
           random() * least(coalesce(d.backoff_cap_s, %(backoff_cap_s)s::float8),
                            coalesce(d.backoff_base_s, %(backoff_base_s)s::float8)
                            * power(2::float8, greatest(r.attempt - 1, 0))) AS backoff_s
    FROM runs AS r
    LEFT JOIN job_delivery AS d ON d.partition_id = r.partition_id AND d.job_id = r.job_id
    WHERE r.partition_id IN (SELECT partition_id FROM fence)
      AND r.state IN ('leased', 'failed')
      AND r.leased_until <= coalesce(%(now)s::timestamptz, statement_timestamp())
    ORDER BY r.leased_until
    LIMIT %(limit)s
), timed AS (
    SELECT due.*,
           greatest(coalesce(due.wish, coalesce(%(now)s::timestamptz, statement_timestamp())),
                    coalesce(%(now)s::timestamptz, statement_timestamp())
                    + due.backoff_s * interval '1 second') AS retry_at
    FROM due
), decided AS (
    SELECT timed.*,
           CASE WHEN timed.retryable IS FALSE THEN 'not retryable'
                WHEN timed.attempt >= timed.max_attempts THEN 'max attempts'
                WHEN timed.max_age_s IS NOT NULL
                     AND timed.retry_at > coalesce(timed.first_claimed_at, timed.retry_at)
                                          + timed.max_age_s * interval '1 second' THEN 'max age'
           END AS dead_why
    FROM timed
), settled AS (
    UPDATE runs AS r
    SET state = CASE WHEN dd.dead_why IS NOT NULL THEN 'dead' ELSE 'pending' END,
        available_at = dd.retry_at,
        leased_until = NULL,
        finished_at = CASE WHEN dd.dead_why IS NOT NULL
                           THEN coalesce(%(now)s::timestamptz, statement_timestamp()) END,
        last_error = CASE WHEN dd.dead_why = 'max age'
                          THEN left(concat_ws(' ', CASE WHEN dd.was = 'leased' THEN 'lease expired'
                                                        ELSE r.last_error END,
                                              '(dead: retrying would pass max_age_s = '
                                              || dd.max_age_s::text || ' s)'),
                                    %(max_error_len)s)
                          WHEN dd.was = 'leased' THEN 'lease expired'
                          ELSE r.last_error END,
        retryable = NULL
    FROM decided AS dd
    WHERE r.partition_id = dd.partition_id
      AND r.job_id = dd.job_id
      AND r.nominal_time = dd.nominal_time
      AND r.state = dd.was
      AND r.lease_token IS NOT DISTINCT FROM dd.lease_token
      AND r.leased_until <= coalesce(%(now)s::timestamptz, statement_timestamp())
    RETURNING r.partition_id, r.job_id, r.nominal_time, r.state, r.attempt, dd.was, r.tenant,
              CASE WHEN r.state = 'dead' THEN r.last_error END AS last_error, dd.dead_why
)
SELECT * FROM settled;

-- ---------------------------------------------------------------- overlap, run now, backfill
-- docs/delivery.md, "Overlap policy", "Run now and backfill". A job's
-- unfinished runs of a policy other than allow are runs_overlap_idx's rows
-- (runs.overlap is the policy copied at firing, NULL for allow).

-- name: release_buffered_runs
-- Only partitions holding a waiting run are fenced (locked): an idle pass locks none.
-- The partition owner's release step (buffer_one), fenced like settle_runs:
-- up to %(limit)s waiting runs (pending, available_at NULL) of the
-- fenced partitions among %(pids)s whose job has no other unfinished run
-- but later waiting ones become available now. The re-check of state and
-- available_at makes a repeated or raced release change nothing. Returns
-- the released runs.
WITH fence AS (
    SELECT p.partition_id
    FROM partitions AS p
    WHERE p.partition_id = ANY(%(pids)s::int4[])
      AND p.owner_node = %(node_id)s
      AND p.owner_epoch = (%(epochs)s::int8[])[p.partition_id + 1]
      AND EXISTS (SELECT 1 FROM runs AS w
                  WHERE w.partition_id = p.partition_id AND w.overlap IS NOT NULL
                    AND w.state = 'pending' AND w.available_at IS NULL)
    FOR SHARE OF p
), waiting AS (
    SELECT w.partition_id, w.job_id, w.nominal_time
    FROM runs AS w
    WHERE w.partition_id IN (SELECT partition_id FROM fence)
      AND w.overlap IS NOT NULL AND w.state = 'pending'
      AND w.available_at IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM runs AS o
          WHERE o.partition_id = w.partition_id AND o.job_id = w.job_id
            AND o.overlap IS NOT NULL AND o.state IN ('pending', 'leased', 'failed')
            AND o.nominal_time <> w.nominal_time
            AND NOT (o.state = 'pending' AND o.available_at IS NULL
                     AND o.nominal_time > w.nominal_time))
    ORDER BY w.nominal_time
    LIMIT %(limit)s
)
UPDATE runs AS r
SET available_at = coalesce(%(now)s::timestamptz, statement_timestamp())
FROM waiting AS w
WHERE r.partition_id = w.partition_id AND r.job_id = w.job_id AND r.nominal_time = w.nominal_time
  AND r.state = 'pending' AND r.available_at IS NULL
RETURNING r.partition_id, r.job_id, r.nominal_time;

-- name: insert_run_request
-- `jobs trigger`: ask the partition owner for a manual run of job
-- (%(partition_id)s, %(job_id)s); a request id already used for the job
-- changes nothing (the first request stands). Returns the row inserted.
INSERT INTO run_requests (partition_id, job_id, request_id, force, requested_at)
VALUES (%(partition_id)s, %(job_id)s, %(request_id)s, %(force)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (partition_id, job_id, request_id) DO NOTHING
RETURNING request_id;

-- name: get_run_request
-- One run request (outcome NULL: not carried out yet).
SELECT * FROM run_requests
WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s AND request_id = %(request_id)s;

-- name: fire_run_requests
-- Only partitions with an open request are fenced (locked): a tick without requests locks none.
-- The partition owner's run-now step (the firing thread, after a tick's
-- chunks: serialized with the node's firing statements), fenced like
-- fire_runs (%(epochs)s[p + 1] of the partitions among %(pids)s). Takes the
-- oldest open request of each job of the fenced partitions (run_requests_open_idx;
-- at most %(limit)s jobs; a job's next request waits for the next tick, so
-- two manual runs never share a nominal time) and, for its job:
--   deleted  (no live job): outcome deleted;
--   fired    a manual run (origin manual) at nominal time now, scheduled at
--            now, with the overlap policy of the job applied as in fire_runs
--            unless the request forces it (force: delivered at once);
--            buffered runs wait (available_at NULL); replace cancels
--            the job's unfinished runs;
--   skipped  the policy forbids it (forbid with an unfinished run,
--            buffer_one with a waiting one).
-- A run whose nominal time is already taken (a run at exactly this
-- microsecond) leaves the request open for the next tick. Returns the
-- requests carried out.
WITH fence AS (
    SELECT p.partition_id
    FROM partitions AS p
    WHERE p.partition_id = ANY(%(pids)s::int4[])
      AND p.owner_node = %(node_id)s
      AND p.owner_epoch = (%(epochs)s::int8[])[p.partition_id + 1]
      AND EXISTS (SELECT 1 FROM run_requests AS o
                  WHERE o.partition_id = p.partition_id AND o.done_at IS NULL)
    FOR SHARE OF p
), picked AS (
    SELECT DISTINCT ON (q.partition_id, q.job_id) q.partition_id, q.job_id, q.request_id, q.force
    FROM run_requests AS q
    WHERE q.partition_id IN (SELECT partition_id FROM fence)
      AND q.done_at IS NULL
    ORDER BY q.partition_id, q.job_id, q.requested_at, q.request_id
    LIMIT %(limit)s
), decided AS (
    SELECT pk.partition_id, pk.job_id, pk.request_id, j.tenant, j.queue, j.overlap,
           coalesce(j.name, '') AS job_name,
           (%(epochs)s::int8[])[pk.partition_id + 1] AS epoch,
           coalesce(%(now)s::timestamptz, statement_timestamp()) AS nominal,
           CASE WHEN j.job_id IS NULL OR j.deleted_at IS NOT NULL THEN 'deleted'
                WHEN pk.force OR j.overlap IN ('allow', 'replace') OR b.busy = 0 THEN 'run'
                WHEN j.overlap = 'buffer_one' AND b.busy = 1 THEN 'buffer'
                ELSE 'skip' END AS fate
    FROM picked AS pk
    LEFT JOIN jobs AS j ON j.partition_id = pk.partition_id AND j.job_id = pk.job_id
    CROSS JOIN LATERAL (
        SELECT count(*) AS busy
        FROM (SELECT 1 FROM runs AS u
              WHERE u.partition_id = pk.partition_id AND u.job_id = pk.job_id
                AND u.overlap IS NOT NULL AND u.state IN ('pending', 'leased', 'failed')
              LIMIT 2) AS x
    ) AS b
), doomed AS MATERIALIZED (
    SELECT x.partition_id, x.job_id, x.nominal_time, dc.nominal AS by_nominal
    FROM decided AS dc
    CROSS JOIN LATERAL (
        SELECT u.partition_id, u.job_id, u.nominal_time
        FROM runs AS u
        WHERE u.partition_id = dc.partition_id AND u.job_id = dc.job_id
          AND u.overlap IS NOT NULL AND u.state IN ('pending', 'leased', 'failed')
          AND u.nominal_time <> dc.nominal
        OFFSET 0  -- a fence: the probe stays per job (not flattened into a walk of the index)
    ) AS x
    WHERE dc.overlap = 'replace' AND dc.fate = 'run'
), replaced AS (
    UPDATE runs AS u
    SET state = 'canceled',
        finished_at = d.by_nominal,
        leased_until = NULL,
        last_error = 'replaced by run ' || d.job_id::text || '.'
                     || (floor(extract(epoch FROM date_trunc('second', d.by_nominal)))::int8 * 1000000
                         + mod(extract(microseconds FROM d.by_nominal)::int8, 1000000))::text
    FROM doomed AS d
    WHERE u.partition_id = d.partition_id AND u.job_id = d.job_id AND u.nominal_time = d.nominal_time
      AND u.state IN ('pending', 'leased', 'failed')
    RETURNING 1
), inserted AS (
    INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at,
                      fired_at, node_id, epoch, state, queue, origin, available_at, overlap, job_name)
    SELECT dc.partition_id, dc.job_id, dc.nominal, dc.tenant, dc.nominal, dc.nominal, %(node_id)s, dc.epoch,
           'pending', dc.queue, 'manual',
           CASE dc.fate WHEN 'buffer' THEN NULL ELSE dc.nominal END,
           nullif(dc.overlap, 'allow'), dc.job_name
    FROM decided AS dc
    WHERE dc.fate IN ('run', 'buffer')
    ON CONFLICT (partition_id, job_id, nominal_time) DO NOTHING
    RETURNING partition_id, job_id, nominal_time
)
UPDATE run_requests AS q
SET done_at = dc.nominal,
    outcome = CASE dc.fate WHEN 'deleted' THEN 'deleted' WHEN 'skip' THEN 'skipped' ELSE 'fired' END,
    nominal_time = CASE WHEN dc.fate IN ('run', 'buffer') THEN dc.nominal END
FROM decided AS dc
WHERE q.partition_id = dc.partition_id AND q.job_id = dc.job_id AND q.request_id = dc.request_id
  AND q.done_at IS NULL
  AND (dc.fate NOT IN ('run', 'buffer')
       OR EXISTS (SELECT 1 FROM inserted AS i
                  WHERE i.partition_id = dc.partition_id AND i.job_id = dc.job_id))
RETURNING q.partition_id, q.job_id, q.request_id, q.outcome, q.nominal_time;

-- name: job_runs_between
-- The nominal times of job (%(partition_id)s, %(job_id)s)'s runs in
-- [%(since)s, %(until)s), ascending (a primary-key range).
SELECT nominal_time FROM runs
WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s
  AND nominal_time >= %(since)s AND nominal_time < %(until)s
ORDER BY nominal_time;

-- name: insert_backfill_runs
-- `jobs backfill`: a run (origin backfill, pending, available now, outside
-- the overlap policy: runs.overlap NULL) of job (%(partition_id)s,
-- %(job_id)s) at each nominal time %(nominals)s[i], scheduled at
-- %(scheduled)s[i]; a slot that has a run keeps it (the primary key), so a
-- repeated backfill writes nothing. Each run carries the job's name, as a
-- fired run does. Returns the runs written.
INSERT INTO runs (partition_id, job_id, nominal_time, tenant, scheduled_at,
                  fired_at, node_id, epoch, state, queue, origin, available_at, job_name)
SELECT %(partition_id)s, %(job_id)s, a.nominal, %(tenant)s, a.scheduled,
       coalesce(%(now)s::timestamptz, statement_timestamp()), %(node_id)s, 0,
       'pending', %(queue)s, 'backfill', coalesce(%(now)s::timestamptz, statement_timestamp()),
       (SELECT coalesce(j.name, '') FROM jobs AS j
        WHERE j.partition_id = %(partition_id)s AND j.job_id = %(job_id)s)
FROM unnest(%(nominals)s::timestamptz[], %(scheduled)s::timestamptz[]) AS a (nominal, scheduled)
ON CONFLICT (partition_id, job_id, nominal_time) DO NOTHING
RETURNING nominal_time;

-- ---------------------------------------------------------------- retention

-- name: prune_runs
-- One bounded batch of the retention walk (scheduler/retention.py): delete up
-- to %(limit)s runs of the given partitions whose nominal time is before
-- %(cutoff)s, walking the primary key after the keyset (%(after_pid)s,
-- %(after_job)s, %(after_time)s) (NULL: from the start). Returns the deleted
-- keys; the caller continues after the largest. Set-based and ctid-free, so
-- valid on CockroachDB; retried whole on 40001 (deleting is idempotent).
-- Never an unfinished run (state pending, leased or failed), whatever its
-- age: only finished runs (succeeded, dead, canceled) and runs fired before
-- delivery existed (state NULL) go.
DELETE FROM runs
WHERE (partition_id, job_id, nominal_time) IN (
    SELECT partition_id, job_id, nominal_time
    FROM runs
    WHERE partition_id = ANY(%(partition_ids)b::int4[])
      AND (%(after_pid)s::int4 IS NULL
           OR (partition_id, job_id, nominal_time)
              > (%(after_pid)s::int4, %(after_job)s::uuid, %(after_time)s::timestamptz))
      AND nominal_time < %(cutoff)s
      AND (state IS NULL OR state NOT IN ('pending', 'leased', 'failed'))
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

-- name: count_live_jobs
-- Jobs not deleted (what `db downgrade` would put at stake).
SELECT count(*) AS n FROM jobs WHERE deleted_at IS NULL;

-- name: get_schema_revision
-- The alembic revision the store's schema is at (no row: never migrated).
SELECT version_num FROM alembic_version;
