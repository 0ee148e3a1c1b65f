"""Elastic runtime on Ray: gang placement, topology-aware ranks, failure and straggler handling.

Modules (one concept each): ``events`` (the event log), ``cadence`` (Young's checkpoint interval),
``straggler`` (per-rank speed scoring), ``ranks`` (rank assignment after placement), ``placement``
(placement groups and the cluster view), ``rendezvous`` (torch.distributed bootstrap), ``worker``
(the RankWorker actor), ``watchdog`` (deadlines, heartbeats, failure classification), ``faults``
(test/demo fault injection), ``planning`` (the bridge to ``planner``), ``supervisor`` (the
JobSupervisor actor), ``launch`` (start/find/stop a supervisor), ``local_cluster`` (local clusters
with declared GPUs).

Heavy imports (ray, torch) happen inside the modules that need them, never here.
"""
