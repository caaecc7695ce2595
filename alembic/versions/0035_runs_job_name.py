"""Runs carry their job's name as of firing (``runs.job_name``).

A worker's claim returned the job's name by a probe into ``jobs`` per
claimed run: among 5 M jobs ~5 µs of the store's CPU per run, about a third
of a claim (docs/performance.md, "2026-12-02, night"). The firing statements
now write the name beside the run's tenant and queue, which a run already
copies from its job when it is created: ``''`` for a job without a name. A
run written before this revision (NULL) is looked up in ``jobs`` at claim
time as before, so nothing needs a backfill and nodes of the previous
revision may keep firing during a rolling upgrade.

Revision ID: 0035
Revises: 0034
"""

from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE runs ADD COLUMN IF NOT EXISTS job_name text")


def downgrade() -> None:
    op.execute("ALTER TABLE runs DROP COLUMN IF EXISTS job_name")
