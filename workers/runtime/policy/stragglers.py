"""Straggler scoring: each rank's speed against the median, over a window (after NVRx).

A rank's *busy time* per step (its own compute, not time blocked in collectives) is turned into two
scores in ``(0, 1+]``, lower meaning slower:

* relative: ``median(busy of ranks with the same role) / busy``, where the role is the pipeline
  stage (ranks of one stage do the same work);
* individual: ``baseline / busy`` against the rank's own median over the first window, normalised by
  the median of that ratio over all ranks, so a machine-wide slowdown scores nobody.

A rank's score is the smaller of the two; a node's score for a step is the median over its ranks,
and for a window the median over the window's steps. A node is a straggler when its window score is
below ``threshold`` *and* at least ``persist_fraction`` of the window's steps are below it, so a
one-step blip or a few percent of jitter never triggers. A slowdown that starts mid-window is
caught at the end of the next window at the latest (two windows). Pure Python.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StragglerFinding:
    node: str
    score: float
    window: int
    first_step: int
    last_step: int
    ranks: tuple[int, ...]
    cause: str = "compute"  # compute (busy time) | link (heartbeat round trips)

    def to_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "cause": self.cause,
            "score": round(self.score, 4),
            "window": self.window,
            "steps": [self.first_step, self.last_step],
            "ranks": list(self.ranks),
        }


def median(xs: list[float]) -> float:
    if not xs:
        raise ValueError("median of an empty list")
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


@dataclass
class StragglerScorer:
    rank_nodes: Mapping[int, str]
    rank_roles: Mapping[int, Hashable]
    window: int = 5
    threshold: float = 0.7
    persist_fraction: float = 0.6
    warmup_steps: int = 1
    ignore_nodes: frozenset[str] = frozenset()
    windows_closed: int = 0
    last_scores: dict[str, float] = field(default_factory=dict)
    _seen: int = 0
    _baseline_obs: dict[int, list[float]] = field(default_factory=dict)
    _baseline: dict[int, float] = field(default_factory=dict)
    _win: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ValueError("window must be >= 2 steps")
        if not 0 < self.threshold < 1:
            raise ValueError("threshold must be in (0, 1)")

    def _rank_scores(self, times: Mapping[int, float]) -> dict[int, float]:
        by_role: dict[Hashable, list[float]] = {}
        for r, t in times.items():
            by_role.setdefault(self.rank_roles[r], []).append(t)
        role_median = {k: median(v) for k, v in by_role.items()}
        rel = {r: role_median[self.rank_roles[r]] / t for r, t in times.items()}
        if len(self._baseline) < len(times):
            return rel
        ratio = {r: self._baseline[r] / t for r, t in times.items()}
        norm = median(list(ratio.values()))
        return {r: min(rel[r], ratio[r] / norm) for r in times}

    def observe(self, step: int, busy_s: Mapping[int, float]) -> list[StragglerFinding]:
        """Feed one step's busy time per rank; returns findings when a window closes."""
        times = {int(r): max(float(t), 1e-9) for r, t in busy_s.items()}
        self._seen += 1
        if self._seen <= self.warmup_steps:
            return []
        if len(self._baseline) < len(times):
            for r, t in times.items():
                self._baseline_obs.setdefault(r, []).append(t)
            if min(len(v) for v in self._baseline_obs.values()) >= self.window:
                self._baseline = {r: median(v) for r, v in self._baseline_obs.items()}
        scores = self._rank_scores(times)
        per_node: dict[str, list[float]] = {}
        for r, s in scores.items():
            per_node.setdefault(self.rank_nodes[r], []).append(s)
        self._win.append((step, {n: median(v) for n, v in per_node.items()}))
        if len(self._win) < self.window:
            return []
        return self._close_window()

    def _close_window(self) -> list[StragglerFinding]:
        win, self._win = self._win, []
        self.windows_closed += 1
        nodes = sorted({n for _, d in win for n in d})
        findings: list[StragglerFinding] = []
        self.last_scores = {}
        for node in nodes:
            series = [d[node] for _, d in win if node in d]
            score = median(series)
            self.last_scores[node] = round(score, 4)
            below = sum(1 for s in series if s < self.threshold) / len(series)
            if node in self.ignore_nodes:
                continue
            if score < self.threshold and below >= self.persist_fraction:
                ranks = tuple(sorted(r for r, n in self.rank_nodes.items() if n == node))
                findings.append(StragglerFinding(node, score, self.windows_closed, win[0][0], win[-1][0], ranks))
        return findings


@dataclass
class LinkScorer:
    """Slow or lossy *links*, which busy time cannot see (a rank blocked on a slow link is idle).

    The supervisor's heartbeats to a rank cross that rank's node link; a capped or lossy link queues
    or retransmits them, so their round trip grows on that node only, while a slow GPU leaves it
    alone (and shows in busy time instead): the two causes are told apart. Every step is an
    observation. In a step during which heartbeats came back from two nodes or more, a node's value
    is the median round trip of its ranks and its score the median over the *other* nodes divided by
    its own (lower is slower); a step without them (it ended before a heartbeat was due or came
    back: no link held it up) scores every node 1. At the end of a window of ``window`` consecutive
    steps a node is flagged when its median round trip is above ``floor_s``, its median score below
    ``1 / factor``, and its score below ``1 / factor`` on at least ``persist_fraction`` of the steps.

    Windows are consecutive steps, not consecutive heartbeat-bearing steps: heartbeats are sent only
    while a step is still running after ``heartbeat_s``, so on a fast job only disturbed steps bear
    any, and a window of those alone made a stall (a partition healed within the deadline) and a few
    retransmits of a lossy link, steps apart, look persistent: a healthy link re-planned around.

    The floor (0.1 s) is absolute: round trips are timed at their return (``watchdog.gather``), and
    a healthy link reads 4-6 ms on the netns cluster, so any jitter passes the relative test; a link
    capped at 2 Mbit/s under TP traffic reads 0.17-0.23 s, one at 1 Mbit/s 0.4 s and more.
    """

    rank_nodes: Mapping[int, str]
    window: int = 5
    factor: float = 3.0
    floor_s: float = 0.1
    persist_fraction: float = 0.6
    ignore_nodes: frozenset[str] = frozenset()
    windows_closed: int = 0
    _win: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def observe(self, step: int, rtt_s: Mapping[int, float]) -> list[StragglerFinding]:
        per_node: dict[str, list[float]] = {}
        for r, t in rtt_s.items():
            per_node.setdefault(self.rank_nodes[int(r)], []).append(float(t))
        # one node alone: nothing to compare against; none: no heartbeat was late. Either way the step
        # counts, with no node slow in it
        self._win.append((step, {n: median(v) for n, v in per_node.items()} if len(per_node) >= 2 else {}))
        if len(self._win) < self.window:
            return []
        win, self._win = self._win, []
        self.windows_closed += 1
        findings = []
        for node in sorted({n for _, d in win for n in d} - set(self.ignore_nodes)):
            scores, rtts = [], []
            for _, d in win:
                others = [v for n, v in d.items() if n != node]
                if node in d and others:
                    rtts.append(d[node])
                    scores.append(median(others) / max(d[node], 1e-9))
                else:
                    scores.append(1.0)  # no round trip of its ranks was slow in this step
            if not rtts:
                continue
            slow = sum(1 for s in scores if s < 1 / self.factor) / len(scores)
            if median(rtts) > self.floor_s and median(scores) < 1 / self.factor and slow >= self.persist_fraction:
                ranks = tuple(sorted(r for r, n in self.rank_nodes.items() if n == node))
                findings.append(StragglerFinding(node, median(scores), self.windows_closed, win[0][0], win[-1][0],
                                                 ranks, cause="link"))
        return findings
