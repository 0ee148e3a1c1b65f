"""Alembic migrations of the job store (``service.db.migrate`` runs them programmatically)."""
