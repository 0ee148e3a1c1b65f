"""Initial schema: tenants, api_tokens, jobs, attempts, events, checkpoints, metrics, leases.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29 10:44:13.312049
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('leases',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('holder', sa.String(length=255), nullable=False),
    sa.Column('epoch', sa.BigInteger(), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_leases'))
    )
    op.create_table('tenants',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('gpu_quota', sa.Integer(), nullable=False),
    sa.Column('weight', sa.Float(), nullable=False),
    sa.Column('max_jobs', sa.Integer(), nullable=False),
    sa.Column('submit_per_minute', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.CheckConstraint('gpu_quota >= 0', name=op.f('ck_tenants_gpu_quota_nonneg')),
    sa.CheckConstraint('max_jobs >= 1', name=op.f('ck_tenants_max_jobs_pos')),
    sa.CheckConstraint('submit_per_minute >= 1', name=op.f('ck_tenants_submit_rate_pos')),
    sa.CheckConstraint('weight > 0', name=op.f('ck_tenants_weight_pos')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tenants')),
    sa.UniqueConstraint('name', name=op.f('uq_tenants_name'))
    )
    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('tenant_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_api_tokens_tenant_id_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_api_tokens_token_hash'))
    )
    op.create_index(op.f('ix_api_tokens_tenant_id'), 'api_tokens', ['tenant_id'], unique=False)
    op.create_table('jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('tenant_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.String(length=1024), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('min_gpus', sa.Integer(), nullable=False),
    sa.Column('max_gpus', sa.Integer(), nullable=False),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=128), nullable=True),
    sa.Column('request_hash', sa.String(length=64), nullable=True),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('event_seq', sa.Integer(), nullable=False),
    sa.Column('gpus_allocated', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column('admitted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('final_loss', sa.Float(), nullable=True),
    sa.Column('final_step', sa.Integer(), nullable=True),
    sa.CheckConstraint("state IN ('PENDING', 'ADMITTED', 'RUNNING', 'RECOVERING', 'PREEMPTED', 'SUCCEEDED', 'FAILED', 'CANCELLED')", name=op.f('ck_jobs_state_valid')),
    sa.CheckConstraint('gpus_allocated >= 0', name=op.f('ck_jobs_gpus_allocated_nonneg')),
    sa.CheckConstraint('min_gpus >= 1 AND max_gpus >= min_gpus', name=op.f('ck_jobs_gpu_range')),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_jobs_tenant_id_tenants'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs')),
    sa.UniqueConstraint('tenant_id', 'idempotency_key', name=op.f('uq_jobs_tenant_id_idempotency_key'))
    )
    op.create_index(op.f('ix_jobs_state_priority_id'), 'jobs', ['state', 'priority', 'id'], unique=False)
    op.create_index(op.f('ix_jobs_tenant_id_id'), 'jobs', ['tenant_id', 'id'], unique=False)
    op.create_index(op.f('ix_jobs_tenant_id_state_id'), 'jobs', ['tenant_id', 'state', 'id'], unique=False)
    op.create_index(op.f('ix_jobs_tenant_id_created_at'), 'jobs', ['tenant_id', 'created_at'], unique=False)
    op.create_table('attempts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('plan', sa.JSON(), nullable=True),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('reason', sa.String(length=1024), nullable=False),
    sa.Column('supervisor', sa.String(length=255), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("state IN ('STARTING', 'RUNNING', 'RECOVERING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'PREEMPTED', 'LOST')", name=op.f('ck_attempts_state_valid')),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_attempts_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_attempts')),
    sa.UniqueConstraint('job_id', 'epoch', name=op.f('uq_attempts_job_id_epoch'))
    )
    op.create_table('checkpoints',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('location', sa.String(length=1024), nullable=False),
    sa.Column('layout', sa.JSON(), nullable=True),
    sa.Column('manifest_sha256', sa.String(length=64), nullable=True),
    sa.Column('bytes', sa.BigInteger(), nullable=True),
    sa.Column('verified', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_checkpoints_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_checkpoints')),
    sa.UniqueConstraint('job_id', 'step', name=op.f('uq_checkpoints_job_id_step'))
    )
    op.create_table('events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=True),
    sa.Column('source', sa.String(length=32), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('type', sa.String(length=32), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_events_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events')),
    sa.UniqueConstraint('job_id', 'source', 'seq', name=op.f('uq_events_job_id_source_seq'))
    )
    op.create_index(op.f('ix_events_job_id_id'), 'events', ['job_id', 'id'], unique=False)
    op.create_index(op.f('ix_events_type'), 'events', ['type'], unique=False)
    op.create_table('metrics',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('loss', sa.Float(), nullable=True),
    sa.Column('tokens_per_s', sa.Float(), nullable=True),
    sa.Column('ts', sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_metrics_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_metrics')),
    sa.UniqueConstraint('job_id', 'step', 'attempt', name=op.f('uq_metrics_job_id_step_attempt'))
    )


def downgrade() -> None:
    op.drop_table('metrics')
    op.drop_index(op.f('ix_events_type'), table_name='events')
    op.drop_index(op.f('ix_events_job_id_id'), table_name='events')
    op.drop_table('events')
    op.drop_table('checkpoints')
    op.drop_table('attempts')
    op.drop_index(op.f('ix_jobs_tenant_id_created_at'), table_name='jobs')
    op.drop_index(op.f('ix_jobs_tenant_id_state_id'), table_name='jobs')
    op.drop_index(op.f('ix_jobs_tenant_id_id'), table_name='jobs')
    op.drop_index(op.f('ix_jobs_state_priority_id'), table_name='jobs')
    op.drop_table('jobs')
    op.drop_index(op.f('ix_api_tokens_tenant_id'), table_name='api_tokens')
    op.drop_table('api_tokens')
    op.drop_table('tenants')
    op.drop_table('leases')
