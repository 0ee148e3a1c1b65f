"""Property tests (hypothesis) of the scheduling policy's invariants."""

from __future__ import annotations

import dataclasses
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.scheduler.policy import decide
from service.scheduler.types import Admit, Grow, JobState, Shrink
from tests.scheduler.helpers import check_round, held_by_tenant, settle
from tests.scheduler.strategies import backfill_snapshots, snapshots
from workers.states import ACTIVE

pytestmark = pytest.mark.unit

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALL_STATES = tuple(JobState)


@SETTINGS
@given(snapshots(quotas_fit=False, states=ALL_STATES))
def test_no_gpu_given_twice_and_only_healthy_free_gpus(s):
    """Held GPUs plus everything admitted or grown fit every healthy node; one decision per job."""
    check_round(s, decide(s))


@SETTINGS
@given(snapshots(quotas_fit=False, states=ALL_STATES))
def test_every_admitted_job_gets_between_its_min_and_max(s):
    jobs = {j.id: j for j in s.jobs}
    for d in decide(s):
        job = jobs[d.job_id]
        if isinstance(d, (Admit, Grow, Shrink)):
            assert job.min_gpus <= d.gpus <= job.max_gpus, d
            assert sum(d.placement.values()) == d.gpus
        if isinstance(d, (Grow, Shrink)):
            assert job.elastic or d.gpus <= job.max_gpus


@SETTINGS
@given(snapshots(quotas_fit=False, states=ALL_STATES), st.integers(0, 2**32 - 1))
def test_deterministic_and_independent_of_input_order(s, seed):
    rnd = random.Random(seed)
    first = decide(s)
    assert decide(s) == first
    jobs = [
        dataclasses.replace(
            j,
            allocated=dict(reversed(list(j.allocated.items()))),
            throughput=None if j.throughput is None else dict(reversed(list(j.throughput.items()))),
        )
        for j in s.jobs
    ]
    tenants, nodes = list(s.tenants), list(s.nodes)
    rnd.shuffle(jobs)
    rnd.shuffle(tenants)
    rnd.shuffle(nodes)
    permuted = dataclasses.replace(s, jobs=jobs, tenants=tenants, nodes=nodes)
    assert decide(permuted) == first
    assert [d.reason for d in decide(permuted)] == [d.reason for d in first]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(quotas_fit=True))
def test_no_tenant_below_quota_with_demand_while_another_borrows(s):
    """Decide and apply until nothing changes (at most a few rounds: a reclaim needs one round to
    checkpoint). Then a tenant with a queued job that fits in its unused quota never sees another
    tenant holding GPUs beyond its quota."""
    s, _, n_rounds = settle(s, rounds=12)
    assert n_rounds <= 12, "the policy did not settle"
    held = held_by_tenant(s)
    quota = {t.id: t.gpu_quota for t in s.tenants}
    limit = {t.id: t.max_jobs for t in s.tenants}
    active = {
        t.id: sum(1 for j in s.jobs if j.tenant_id == t.id and j.state in ACTIVE) for t in s.tenants
    }
    borrowers = [t for t in quota if held[t] > quota[t]]
    for j in s.jobs:
        t = j.tenant_id
        if j.state != JobState.PENDING or (limit[t] is not None and active[t] >= limit[t]):
            continue
        if j.min_gpus <= quota[t] - held[t]:
            assert not [b for b in borrowers if b != t], (
                f"tenant {t} holds {held[t]}/{quota[t]} with job {j.id} (min {j.min_gpus}) queued "
                f"while {borrowers} borrow: {held}"
            )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(backfill_snapshots())
def test_backfill_never_delays_the_head_jobs_estimated_start(s):
    """Play the run-time estimates forward: at the head job's estimated start, the GPUs free then
    (after this round's admissions and grows) still cover its minimum."""
    decisions = decide(s)
    heads = [d for d in decisions if d.kind == "wait" and "estimated start at" in d.reason]
    if not heads:
        return
    (head,) = heads
    start = float(re.search(r"estimated start at ([0-9.e+-]+)\)", head.reason).group(1))
    jobs = {j.id: j for j in s.jobs}
    healthy = {n.id for n in s.nodes if n.healthy}
    touched = {d.job_id for d in decisions if d.kind in ("shrink", "preempt")}
    used = sum(
        k
        for j in s.jobs
        if j.state in ACTIVE or j.state == JobState.PREEMPTED
        for n, k in j.allocated.items()
        if n in healthy
    )
    free_at_start = sum(n.gpus for n in s.nodes if n.healthy) - used
    for j in s.jobs:
        if j.state in ACTIVE and j.id not in touched and j.est_end is not None and j.est_end <= start:
            free_at_start += sum(k for n, k in j.allocated.items() if n in healthy)
    for d in decisions:
        if isinstance(d, Admit):
            if s.now + jobs[d.job_id].est_duration > start:
                free_at_start -= d.gpus
        elif isinstance(d, Grow):
            free_at_start -= sum(d.added.values())
    assert free_at_start >= jobs[head.job_id].min_gpus
