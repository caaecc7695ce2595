"""docs/api.md's examples of "Runs and workers" and "A worker in shell" (bash, curl, jq) run as
written against the real API: the contract is language-neutral, and what the page shows works."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from helpers import pending_run, run_row, store_now

from scheduler import jobs, store
from scheduler.spec import JobSpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
S = timedelta(seconds=1)


def block(heading: str, language: str) -> str:
    """The first ``language`` block of docs/api.md's section ``## heading`` (up to the next ``## ``)."""
    text = DOC.read_text()
    section = text[text.index(f"## {heading}\n") :]
    section = section[: section.find("\n## ", 4)] if "\n## " in section[4:] else section
    match = re.search(r"```" + language + r"\n(.*?)```", section, re.S)
    assert match, f"docs/api.md: no {language} block under {heading!r}"
    return match.group(1)


def shell_worker() -> str:
    """The worker script of "A worker in shell"."""
    return block("A worker in shell", "bash")


def nightly_report_due(api) -> tuple:
    """Tenant acme's schedule nightly-report (payload {"report": "sales"}) with two pending runs."""
    with store.connect(api.dsn) as conn:
        job_id = jobs.add_job(conn, JobSpec.build(tenant="acme", name="nightly-report", interval_s=3600)).job_id
        conn.execute(
            "INSERT INTO job_delivery (partition_id, job_id, payload, max_attempts, backoff_base_s, backoff_cap_s)"
            " SELECT partition_id, job_id, %s, 5, 1, 300 FROM jobs WHERE job_id = %s",
            ('{"report": "sales"}', job_id),
        )
        now = store_now(conn).replace(microsecond=0)
        return pending_run(conn, job_id, now - 20 * S), pending_run(conn, job_id, now - 10 * S)


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_the_runs_examples_claim_ack_list_and_refuse_a_redrive(api) -> None:
    older, newer = nightly_report_due(api)
    script = "set -euo pipefail\n" + block("Runs and workers", "sh").replace("http://127.0.0.1:8080", api.url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env |= {"SCHEDULER_DSN": api.dsn, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    compact = [json.dumps(json.loads(line), separators=(",", ":")) for line in done.stdout.splitlines()]
    ids = [older.run_id, newer.run_id]
    payload = {"report": "sales"}
    assert [json.loads(line) for line in compact] == [
        *({"id": i, "schedule": "nightly-report", "attempt": 1, "payload": payload} for i in ids),
        {"results": [{"id": i, "answer": "succeeded"} for i in ids]},
        *({"id": i, "state": "succeeded", "attempt": 1} for i in reversed(ids)),  # newest first
        {
            "type": "about:blank",
            "title": "Conflict",
            "status": 409,
            "detail": f"id: run {older.run_id} is succeeded; only a dead or canceled run can be redriven "
            "(nothing changed)",
            "field": "id",
        },
    ]


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="needs curl and jq")
def test_the_documented_shell_worker_claims_and_acks_a_run(api, tmp_path) -> None:
    token = api.key("acme", "worker")
    older, newer = nightly_report_due(api)
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
