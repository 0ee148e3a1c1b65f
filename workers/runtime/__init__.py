"""Elastic runtime on Ray: gang placement, topology-aware ranks, failure and straggler handling.

Modules (one concept each): ``events`` (the typed event registry and log), ``cadence`` (Young's
checkpoint interval), ``straggler`` (per-rank speed scoring), ``ranks`` (rank assignment after
placement), ``placement`` (placement groups and the cluster view), ``rendezvous`` (torch.distributed
bootstrap), ``worker`` (the RankWorker actor), ``watchdog`` (deadlines, heartbeats, failure
classification), ``cluster_port`` (the one port to the cluster), ``faults`` (fault injection, a
wrapper of that port), ``planner_bridge`` (the bridge to ``planner``), ``job_plans`` (the
``Replanner``), ``lifecycle`` (the attempt's state machine), ``supervisor`` (the JobSupervisor actor
around it), ``launch`` (start/find/stop a supervisor), ``local_cluster`` (local clusters with
declared GPUs).

Heavy imports (ray, torch) happen inside the modules that need them, never here.
"""
