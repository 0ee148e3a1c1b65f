"""The controller of the control plane: leader election, the loop that applies the scheduler's
decisions to Ray, event pulling, crash-safe reconciliation. See ``docs/controller.md``.

Modules: ``lease`` (leader election), ``cluster`` (the Ray cluster view, also for GET /v1/cluster),
``snapshot`` (job store + cluster → scheduler snapshot), ``apply`` (admit / preempt / resize / new
attempts), ``events_pull`` (supervisor events → events, metrics, checkpoints, states),
``reconcile`` (on becoming leader), ``supervisors`` (Ray actor handles), ``context`` (shared state
and the lease-guarded transaction), ``loop`` (:class:`~service.controller.loop.Controller`),
``runner`` (``run_in_background``).

Heavy imports (ray) happen inside functions, so importing this package is cheap.
"""
