"""Attempts record where their GPUs are: ``placement`` (node id -> GPUs) and ``placement_group``.

The scheduler's per-node placement is stored when an attempt starts; the runtime's ``placed`` event
replaces it with where the gang actually landed (and names its placement group). The controller's
scheduler snapshot reads each job's allocation from here alone.

Revision ID: 0003_attempt_placement
Revises: 0002_attempt_epoch
Create Date: 2026-12-01 14:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_attempt_placement"
down_revision: str | None = "0002_attempt_epoch"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("placement", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("placement_group", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("placement_group")
        batch.drop_column("placement")
