"""Rename ``attempt`` to ``epoch`` in events, checkpoints and metrics.

Those columns always held the fencing epoch of the attempt that wrote the row, while ``attempt``
elsewhere (``jobs.attempt``, ``attempts.number``, runtime event sources ``runtime:a<N>``) is the
attempt's number. After this revision each word means one thing. The metrics unique constraint is
renamed with its column (the naming convention derives it from the column names).

Batch mode: PostgreSQL gets plain ``ALTER TABLE ... RENAME COLUMN``; SQLite gets Alembic's
copy-and-move table rebuild. Data is kept both ways.

Revision ID: 0002_attempt_epoch
Revises: 0001
Create Date: 2026-12-01 14:40:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002_attempt_epoch"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _rename(old: str, new: str) -> None:
    for table in ("events", "checkpoints"):
        with op.batch_alter_table(table) as batch:
            batch.alter_column(old, new_column_name=new)
    with op.batch_alter_table("metrics") as batch:
        batch.drop_constraint(f"uq_metrics_job_id_step_{old}", type_="unique")
        batch.alter_column(old, new_column_name=new)
    # a second batch: SQLite's rebuild drops a constraint created on a column renamed in the same batch
    with op.batch_alter_table("metrics") as batch:
        batch.create_unique_constraint(f"uq_metrics_job_id_step_{new}", ["job_id", "step", new])


def upgrade() -> None:
    _rename("attempt", "epoch")


def downgrade() -> None:
    _rename("epoch", "attempt")
