"""Metrics carry the validation loss of the steps a job evaluated on (``eval_every``).

Revision ID: 0004_metric_val_loss
Revises: 0003_attempt_placement
Create Date: 2026-12-01 18:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_metric_val_loss"
down_revision: str | None = "0003_attempt_placement"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        batch.add_column(sa.Column("val_loss", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        batch.drop_column("val_loss")
