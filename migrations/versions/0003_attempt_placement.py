"""Attempts record where their GPUs are: ``placement`` (node id -> GPUs) and ``placement_group``.

The scheduler's per-node placement is stored when an attempt starts; the runtime's ``placed`` event
replaces it with where the gang actually landed (and names its placement group). The controller's
scheduler snapshot reads each job's allocation from here alone.

Revision ID: 0003
Revises: 0001 (chain it on the attempt->epoch rename, 0002, when both are merged)
Create Date: 2026-12-01 14:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0001"
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
