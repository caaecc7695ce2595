"""docs/api.md's "A worker in shell" (bash, curl, jq) run as written against the real API:
the contract is language-neutral, and the documented script keeps working."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from helpers import pending_run, run_row, store_now

from scheduler import jobs, store
from scheduler.spec import JobSpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
S = timedelta(seconds=1)


def shell_worker() -> str:
    """The first bash block after the heading "## A worker in shell" in docs/api.md."""
    text = DOC.read_text()
    section = text[text.index("## A worker in shell") :]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "docs/api.md: no bash block under 'A worker in shell'"
    return match.group(1)


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_the_documented_shell_worker_claims_and_acks_a_run(api, tmp_path) -> None:
    token = api.key("acme", "worker")
    with store.connect(api.dsn) as conn:
        job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", name="nightly", interval_s=3600)).job_id
        conn.execute(
            "INSERT INTO job_delivery (partition_id, job_id, payload, max_attempts, backoff_base_s, backoff_cap_s)"
            " SELECT partition_id, job_id, %s, 5, 1, 300 FROM jobs WHERE job_id = %s",
            ('{"report": "sales"}', job_id),
        )
        now = store_now(conn).replace(microsecond=0)
        older = pending_run(conn, job_id, now - 20 * S)
        newer = pending_run(conn, job_id, now - 10 * S)
    script = tmp_path / "worker.sh"
    script.write_text(shell_worker())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env.update(API=api.url, SCHEDULER_API_KEY=token, ONCE="1")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        f'run {older.run_id} attempt 1 payload {{"report":"sales"}}',
        f'run {newer.run_id} attempt 1 payload {{"report":"sales"}}',
        json.dumps({"id": older.run_id, "answer": "succeeded"}, separators=(",", ":")),
        json.dumps({"id": newer.run_id, "answer": "succeeded"}, separators=(",", ":")),
    ]
    assert token not in done.stdout + done.stderr
    with store.connect(api.dsn) as conn:
        for key in (older, newer):
            row = run_row(conn, key)
            assert (row["state"], row["attempt"]) == ("succeeded", 1)
            assert row["worker"] == f"api:{token.split('_')[1]}"
