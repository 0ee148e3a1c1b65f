"""The recovery policies' names: one home for the planner, the runtime and the failure simulator.

They live in ``planner/`` because the planner (pure Python, importing nothing outside itself) chooses a
job's recovery policy (:mod:`planner.goodput`); the runtime's
:class:`~workers.runtime.policy.recovery.RecoveryPolicy`, the job spec's recovery choice and the goodput
simulator (``service.failure_sim.policies``) import them from here.

- ``restart``: the whole job restarts from a storage checkpoint with its fixed layout once the failed
  node is back or replaced (the Llama 3 baseline). The simulator models it; the runtime has no such
  mode (a failure on live nodes restarts the gang there, a :class:`~workers.runtime.policy.recovery.Restart`).
- ``replan_storage``: re-plan onto the nodes left and load the newest storage checkpoint.
- ``replan_memory``: the same, from the newest complete in-memory snapshot on the surviving nodes
  (storage when none survived).
- ``replica_group``: replica groups; a lost group is dropped and replaced while the others step on.
"""

from __future__ import annotations

RESTART = "restart"
REPLAN_STORAGE = "replan_storage"
REPLAN_MEMORY = "replan_memory"
REPLICA_GROUP = "replica_group"

#: every policy, in the simulator's order
POLICY_NAMES: tuple[str, ...] = (RESTART, REPLAN_STORAGE, REPLAN_MEMORY, REPLICA_GROUP)
#: the policies the runtime carries out (``restart`` is the simulator's baseline only)
RUNTIME_POLICIES: tuple[str, ...] = (REPLAN_STORAGE, REPLAN_MEMORY, REPLICA_GROUP)

#: where each policy restores the state from after a failure (a replica group heals from a live
#: peer's memory)
SOURCES: dict[str, str] = {RESTART: "storage", REPLAN_STORAGE: "storage", REPLAN_MEMORY: "memory",
                           REPLICA_GROUP: "memory"}


def check_name(name: str) -> str:
    """``name`` when it names a policy; ``ValueError`` naming the choices otherwise."""
    if name not in POLICY_NAMES:
        raise ValueError(f"policy: unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    return name


# ------------------------------------------------------------------ the job spec's names (issue #38)
# A job spec names its policy (``recovery.policy``, :data:`JOB_POLICIES`) in the user's words: ``auto``
# (the control plane picks from the plan: ``planner.recovery_choice``), ``replica_groups``
# (= ``replica_group``), ``replan`` (= ``replan_memory`` with snapshots, ``replan_storage`` without)
# and ``restart`` (the storage path, no snapshots). :func:`runtime_policy` and :func:`job_policy`
# translate between the two sets of names.

AUTO = "auto"
REPLICA_GROUPS = "replica_groups"
REPLAN = "replan"
#: the job spec's ``recovery.policy`` names (REST, CLI job files, dashboard)
JOB_POLICIES: tuple[str, ...] = (AUTO, REPLICA_GROUPS, REPLAN, RESTART)
#: the concrete policies a choice ends in (``auto`` resolved)
CHOSEN_POLICIES: tuple[str, ...] = (REPLICA_GROUPS, REPLAN, RESTART)


def runtime_policy(job_policy_name: str, snapshots: bool) -> str:
    """The simulator's/runtime's name of a concrete job policy (``replan`` with ``snapshots``:
    ``replan_memory``)."""
    if job_policy_name == REPLICA_GROUPS:
        return REPLICA_GROUP
    if job_policy_name == REPLAN:
        return REPLAN_MEMORY if snapshots else REPLAN_STORAGE
    if job_policy_name == RESTART:
        return RESTART
    raise ValueError(f"policy: {job_policy_name!r} is not a concrete policy; choose from {', '.join(CHOSEN_POLICIES)}")


def job_policy(name: str) -> str:
    """The job spec's name of a policy named either way (``replan_memory`` -> ``replan``)."""
    if name in CHOSEN_POLICIES:
        return name
    check_name(name)
    return {REPLICA_GROUP: REPLICA_GROUPS, REPLAN_MEMORY: REPLAN, REPLAN_STORAGE: REPLAN}.get(name, name)
