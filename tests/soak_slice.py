"""Which ``soak`` tests a CI run takes: the soak tier split into ``n`` slices of about equal time.

``.ci/run`` runs slice ``I = (number of commits in HEAD's history) % 5`` after the default suite:
consecutive commits of a branch have consecutive counts, so any 5 consecutive CI runs (one per commit)
take all 5 slices and every soak test runs at least once among them (a hash of the commit would not
promise that). ``python -m tests.soak_slice I N`` lists slice ``I`` of ``N``; ``./dev test --soak-slice
I/N`` runs it.

The split is deterministic: the soak tests pytest collects, longest first (by ``ESTIMATED_S``, the
seconds each took in the runs recorded in the docs and results; 180 s when unknown), each put into
the slice with the least time so far (ties: the lower slice). A new soak test joins a slice by itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_S = 180.0
#: seconds per soak test on the shared 2-core machine (its call, rounded up; the runs of 2026-12-07, a
#: quiet machine, after the link-timing fix: the slices' calls then take 230-240 s each, against
#: 190-330 s with the older, up to 3x, estimates)
ESTIMATED_S = {
    "tests/e2e/test_finetune_example.py::test_finetune_example_runs_as_written": 60.0,
    "tests/e2e/test_getting_started.py::test_getting_started_guide_runs_as_written[postgres]": 35.0,
    "tests/engine/test_equivalence_8ranks.py::test_more_eight_rank_layouts_match_single_process": 45.0,
    "tests/engine/test_replica_ft.py::test_survivors_keep_going_group_of_one": 15.0,
    "tests/runtime/test_replica_fallback_cluster.py::test_a_replica_job_that_loses_every_group_replans_from_memory_and_finishes[pp2]": 20.0,
    "tests/runtime/test_replica_layouts_cluster.py::test_a_group_is_replaced_from_a_peer_and_the_losses_stay[dp2-zero1]": 40.0,
    "tests/netns/test_netns_chaos.py::test_job_survives_90_s_of_random_network_faults": 225.0,
    "tests/netns/test_netns_runtime.py::test_partition_healed_before_the_deadline_costs_only_a_stall": 35.0,
    "tests/netns/test_netns_runtime.py::test_spec_network_faults_healed_partition_lossy_link_then_slow_link": 80.0,
    "tests/netns/test_netns_runtime.py::test_lossy_link_the_job_survives": 40.0,
    "tests/netns/test_netns_runtime.py::test_slow_link_shows_as_a_link_straggler_and_is_replanned_around": 110.0,
    "tests/netns/test_netns_runtime.py::test_capped_links_the_planner_keeps_tp_inside_nodes_and_step_times_order_as_it_predicts": 80.0,
    "tests/netns/test_netns_runtime.py::test_partition_from_one_peer_is_routed_around": 70.0,
    "tests/netns/test_netns_runtime.py::test_slow_link_under_tp_moves_tp_inside_nodes_first": 205.0,
    "tests/runtime/test_elastic_cluster.py::test_node_loss_replans_onto_8_gpus_and_matches_the_no_failure_loss": 85.0,
    "tests/runtime/test_recovery_peers.py::test_torchft_peer_replaces_a_lost_replica_group": 25.0,
    "tests/runtime/test_recovery_peers.py::test_torchft_used_directly_replaces_a_lost_group_in_plain_processes": 10.0,
}


def split(tests: list[str], n: int, estimate: dict[str, float] | None = None) -> list[list[str]]:
    """``tests`` in ``n`` slices of about equal estimated time (pure, deterministic)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    est = ESTIMATED_S if estimate is None else estimate
    slices: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for t in sorted(set(tests), key=lambda t: (-est.get(t, DEFAULT_S), t)):
        i = min(range(n), key=lambda k: (load[k], k))
        slices[i].append(t)
        load[i] += est.get(t, DEFAULT_S)
    return slices


def collect_soak() -> list[str]:
    """The soak tests pytest collects here (node ids)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "soak", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if out.returncode not in (0, 5) or not ids:
        raise SystemExit(f"soak_slice: collecting the soak tests failed ({out.returncode}):\n{out.stdout[-2000:]}"
                         f"{out.stderr[-2000:]}")
    return ids


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(a.isdigit() for a in argv) or not 0 <= int(argv[0]) < int(argv[1]):
        print("usage: python -m tests.soak_slice I N   (0 <= I < N): the soak tests of slice I of N", file=sys.stderr)
        return 2
    i, n = int(argv[0]), int(argv[1])
    for t in split(collect_soak(), n)[i]:
        print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
