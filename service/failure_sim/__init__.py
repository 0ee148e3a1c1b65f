"""Goodput of one large training job under failures: a discrete-event simulator.

Not to be confused with :mod:`service.scheduler.goodput` (the scheduler's throughput-vs-GPUs curves)
or :mod:`service.scheduler.workload_sim` (the multi-tenant scheduler simulator). Modules:

- ``causes``: failure causes and their rates (Llama 3's table, Meta RSC's rate), repair times (their
  one home is ``planner.failure_rates``);
- ``trace``: failure traces (Poisson per cause, or periodic for the self-check);
- ``recovery``: recovery cost by phase (``planner.recovery_cost``): this cluster's recorded phases or the
  published prior, scaled to the job's size;
- ``throughput``: tokens/s on the nodes that remain, from ``planner.replan``, cached per shape;
- ``policies``: the recovery policies compared;
- ``events``: the event loop that plays one policy on one trace;
- ``closed_form``: ETTR ≈ 1 − (R + C·MTTF/τ + τ/2)/MTTF, Young's and Daly's intervals;
- ``simulation``: configuration, validation, all policies on one trace, the cluster-size sweep;
- ``report``: the JSON document, the table and the plot.

Pure Python plus numpy; no torch, no ray.
"""
