"""Drained nodes: ``node_drains`` (an operator's drain notice per Ray node, until undrained).

A row says the node takes no new work and every job on it moves off before ``deadline_at``
(``POST /v1/cluster/nodes/{node}/drain``); undrain deletes it. Kept in the database so a drain
survives a restart of the service.

Revision ID: 0005_node_drains
Revises: 0004_metric_val_loss
Create Date: 2026-12-07 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_node_drains"
down_revision: str | None = "0004_metric_val_loss"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_drains",
        sa.Column("node_id", sa.String(length=128), nullable=False),
        sa.Column("deadline_s", sa.Float(), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("deadline_s > 0", name=op.f("ck_node_drains_deadline_pos")),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_node_drains")),
    )


def downgrade() -> None:
    op.drop_table("node_drains")
