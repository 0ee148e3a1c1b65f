"""Supervision of one job attempt: the JobSupervisor actor, its state machine, launch and tracking."""
