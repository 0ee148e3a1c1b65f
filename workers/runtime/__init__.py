"""Elastic runtime on Ray: one job attempt supervised from plan to end, in five rooms.

* ``contract``: what crosses the runtime's border: the job spec it accepts (``job_spec``), its
  faults list (``fault_spec``) and the typed events it emits (``events``).
* ``supervision``: the JobSupervisor actor (``supervisor``), the attempt's state machine
  (``attempt_machine``, its state ``attempt_state``, its replica-group phases ``replica_attempt``),
  starting and finding supervisors (``launch``) and a job's tracking.
* ``policy``: decisions, no Ray: re-plans (``replanner``, ``planning``), straggler scores
  (``stragglers``), checkpoint cadence (``checkpoint_cadence``) and the recovery policy (``recovery``,
  its names re-exported from ``planner.recovery_names``, their one home).
* ``cluster``: mechanism: the port to the cluster (``port``) and its Ray implementation
  (``ray_port``), placement groups, ranks, the RankWorker actor, the warm pool, rendezvous, the
  watchdog, reachability and the environment of the processes Orthoplex starts.
* ``recovery``: state that outlives a rank: memory snapshots and their transport, replica groups and
  their quorum service, fencing.

Development tooling (fault injection, network faults, local and namespaced clusters, reference runs)
lives in :mod:`workers.testbed`, outside the production runtime.

Heavy imports (ray, torch) happen inside the modules that need them, never here.
"""
