-- The bench's own named queries (python -m bench): measurements the engine never
-- runs, loaded with the engine's loader (scheduler.store.load_queries("bench",
-- "sql/queries.sql")) and run by bench/queries.py. Same rules as
-- scheduler/sql/queries.sql: named, parameterized, in the PostgreSQL/CockroachDB
-- common subset (tests/unit/test_sql_subset.py scans both files).

-- name: count_owned_partitions
-- Partitions whose lease is held by a live-looking owner (not expired).
SELECT count(*) AS owned FROM leases
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
-- Partitions whose lease names the node (expired or not).
SELECT partition_id FROM leases WHERE owner_node = %(node_id)s ORDER BY partition_id;

-- name: count_orphans_among
-- Of the given partitions, those not (yet) owned by another node with a live lease.
SELECT count(*) AS orphans FROM leases
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
WHERE relname IN ('partitions', 'leases', 'nodes');

-- name: partition_claims
-- Lease owner, epoch, claim time and lease expiry (store time) of the given
-- partitions.
SELECT partition_id, owner_node, owner_epoch, acquired_at, lease_expires_at
FROM leases
WHERE partition_id = ANY(%(partition_ids)s::int4[]);

-- name: store_transactions
-- Transactions this database has run so far, every session (PostgreSQL
-- statistics; the bench compares coordinators' and poll intervals' load).
SELECT (xact_commit + xact_rollback)::int8 AS xacts
FROM pg_stat_database
WHERE datname = current_database();

-- name: delete_jobs_created_at
-- Forget the jobs created at one instant: a bench herd once measured, so
-- that its timers that fire again (every minute, every hour, ...) stay out of
-- the next herd of the same run. A scan of jobs, run while nothing is due.
DELETE FROM jobs WHERE created_at = %(created)s;

-- name: set_jobs_pushed
-- bench deliver --mode push: the jobs loaded at one creation time target an
-- HTTP endpoint instead of a queue (queue NULL; the URL is in job_delivery).
UPDATE jobs SET queue = NULL WHERE created_at = %(created)s;

-- name: insert_push_targets
-- bench deliver --mode push: each job loaded at one creation time POSTs to
-- %(url)s, with the engine's default retry policy (what `jobs add --url`
-- writes for a job that names no other).
INSERT INTO job_delivery (partition_id, job_id, url, method, max_attempts, backoff_base_s, backoff_cap_s)
SELECT j.partition_id, j.job_id, %(url)s, 'POST', %(max_attempts)s, %(backoff_base_s)s, %(backoff_cap_s)s
FROM jobs AS j
WHERE j.created_at = %(created)s
ON CONFLICT (partition_id, job_id) DO NOTHING;

-- name: delivery_rows
-- bench deliver: one row per run of the nominal times [since, until): its
-- tenant, delivery state, attempts started, dispatch lag (first claim −
-- scheduled) and ack lag (finished − scheduled), and when it finished
-- (epoch s); lags NULL while not claimed / not finished.
SELECT tenant,
       state,
       attempt,
       extract(epoch FROM (first_claimed_at - scheduled_at))::float8 AS dispatch_s,
       extract(epoch FROM (finished_at - scheduled_at))::float8 AS ack_s,
       extract(epoch FROM finished_at)::float8 AS finished_s
FROM runs
WHERE nominal_time >= %(since)s AND nominal_time < %(until)s;

-- name: any_unsettled
-- bench deliver: whether a run of the nominal times [since, until) is still
-- on its way (pending, leased or failed). Polled during delivery, so each
-- probe walks one of the small partial indexes of unfinished runs
-- (runs_pending_idx, runs_push_idx, runs_inflight_idx: the ORDER BY names
-- the index) and stops at the first match: a scan of `runs` by nominal time
-- (no index) would take the store's CPU from the delivery it measures.
SELECT EXISTS (
           SELECT 1 FROM runs
           WHERE state = 'pending' AND queue IS NOT NULL
             AND nominal_time >= %(since)s AND nominal_time < %(until)s
           ORDER BY tenant, queue, available_at
           LIMIT 1
       )
       OR EXISTS (
           SELECT 1 FROM runs
           WHERE state = 'pending' AND queue IS NULL
             AND nominal_time >= %(since)s AND nominal_time < %(until)s
           ORDER BY partition_id, available_at
           LIMIT 1
       )
       OR EXISTS (
           SELECT 1 FROM runs
           WHERE state IN ('leased', 'failed')
             AND nominal_time >= %(since)s AND nominal_time < %(until)s
           ORDER BY partition_id, leased_until
           LIMIT 1
       ) AS unsettled;

-- name: any_unclaimed
-- bench compare (ours-e2e): whether a queue run of the nominal times
-- [since, until) was never claimed (pending, first attempt), through the
-- partial index of pending queue runs (see any_unsettled).
SELECT EXISTS (
    SELECT 1 FROM runs
    WHERE state = 'pending' AND queue IS NOT NULL AND first_claimed_at IS NULL
      AND nominal_time >= %(since)s AND nominal_time < %(until)s
    ORDER BY tenant, queue, available_at
    LIMIT 1
) AS unclaimed;

-- name: free_connections
-- Client connections the server still accepts (max_connections less the
-- backends now open, background processes included: an underestimate).
SELECT current_setting('max_connections')::int - (SELECT count(*) FROM pg_stat_activity)::int AS free;

-- name: runs_fired_since
-- Every run fired at or after an instant, with what identifies its commit
-- (storefailover: the runs one primary held, compared with its successor's).
SELECT job_id, nominal_time, fired_at, node_id, epoch
FROM runs
WHERE fired_at >= %(since)s;

-- name: first_write_after
-- The earliest store write of a node seen after an instant: a heartbeat, a
-- lease claimed, a run fired (NULL if none yet). Heartbeats are overwritten,
-- so polled often it is the first one's time within the poll interval.
SELECT min(t) AS first_write FROM (
    SELECT min(heartbeat_at) AS t FROM nodes WHERE heartbeat_at > %(after)s
    UNION ALL
    SELECT min(acquired_at) FROM leases WHERE acquired_at > %(after)s
    UNION ALL
    SELECT min(fired_at) FROM runs WHERE fired_at > %(after)s
) AS w;

-- name: first_run_fired_after
-- The first run fired after an instant (NULL if none yet).
SELECT min(fired_at) AS fired_at FROM runs WHERE fired_at > %(after)s;

-- name: lateness_in_window
-- Lateness of every run whose slot lies in [since, until).
SELECT extract(epoch FROM (fired_at - scheduled_at))::float8 AS lateness_s
FROM runs
WHERE nominal_time >= %(since)s AND nominal_time < %(until)s;

-- name: count_unfired_before
-- Active jobs with a slot before an instant still unfired (0: caught up).
SELECT count(*) AS n FROM jobs
WHERE deleted_at IS NULL AND NOT paused AND next_nominal_at < %(until)s;
