"""The search: every TP x CP x PP x DP factorization, then the knobs, best first.

Exact with respect to the cost model, but it skips what provably cannot win:

- *dominance*: for the same other knobs, SP on (tp > 1) costs no more time and less memory than
  off; ZeRO-1 no more than ZeRO-0 when DP x CP > 1; 1F1B no more than GPipe; a cheaper recompute
  mode that fits is faster than a costlier one, so recompute stops at the first that fits;
  memory grows with the micro-batch, so once nothing fits, larger micro-batches are not tried.
- *bounds*: factorizations (and micro-batch/vpp choices) are visited in order of a lower bound on
  their step time (compute at the GEMM efficiency ceiling, no communication, the smallest bubble
  any knob allows) and dropped once the bound exceeds the k-th best step time found.
- *layer:N by bisection*: every ``layer:N`` the cost model accepts (N from 2 to the busiest stage's
  layers, :func:`planner.constraints.layer_checkpoint_cap`) is in the space. For one layout, memory
  grows with N and recompute time falls with it, so the fastest that fits is the largest N that
  fits: found in closed form (:meth:`Searcher.largest_layer_n`) instead of costing each N.

Replica groups (``dp_replicate``, HSDP) are tried for ZeRO layouts in the form that can pay off
(shard groups inside a node, see :func:`replica_options`), each with its own recompute sweep.

A field the spec fixes is never pruned away: dominance is applied only to free fields.
Skipped candidates still count in ``searched``; ``evaluated`` counts those fully costed.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner import constraints as C
from planner.engine_rules import recompute_rule
from planner.flops import layer_matmul_params, model_flops_per_token, recompute_flops_per_token
from planner.grid import block_fits, gpu_histogram, rank_grid
from planner.layout import Layout
from planner.memory import (
    estimate_memory,
    head_layer_equivalents,
    largest_checkpoint_interval,
    memory_limit_gb,
    memory_total_gb,
    stage_layers,
    states_floor_gb,
)
from planner.result import Estimate, Plan, PlanResult, Rejection
from planner.spec import NodeSpec, PlanSpec
from planner.timing import (
    Hardware,
    Links,
    estimate_time,
    group_link,
    hardware_for,
    head_time,
    layer_times,
    p2p_floor,
    p2p_time,
    replica_allreduce_s,
    stage_param_count,
    zero3_traffic_s,
)

MAX_LISTED_REJECTIONS = 200
MAX_MICRO_BATCH = 64
LAYER_FAMILY = "layer:N"  # every layer:N, N = 2 .. the busiest stage's layers (resolved per layout)
RECOMPUTE_ORDER = ("none", "selective", "op", LAYER_FAMILY, "full")  # the free search's recompute space
# the candidates the engine runs (the rule's one home: planner.engine_rules.recompute_rule); the
# layer:N family stands for its members, asked of the rule as layer:2
ENGINE_RECOMPUTE = tuple(rc for rc in RECOMPUTE_ORDER
                         if recompute_rule("layer:2" if rc == LAYER_FAMILY else rc) is None)



def _memory_key(lay: Layout) -> tuple[Any, ...]:
    """Every field of a layout memory depends on, but the recompute mode (and the CP method, which
    does not change memory)."""
    return (lay.tp, lay.pp, lay.cp, lay.dp, lay.vpp, lay.micro_batch, lay.num_micro_batches, lay.sp, lay.zero,
            lay.schedule, lay.dp_replicate)

def divisors(n: int) -> list[int]:
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i * i != n:
                large.append(n // i)
        i += 1
    return small + large[::-1]


@dataclass
class World:
    """A set of GPUs to plan for: the nodes used (in spec order) and their slowest speed."""

    size: int
    nodes: tuple[NodeSpec, ...]
    speed: float
    gpus: tuple[tuple[int, int], ...]  # histogram: (GPUs per node, node count)


def candidate_worlds(spec: PlanSpec) -> list[World]:
    """World sizes to try, each on the fastest nodes that hold it (a slow node can be left out)."""
    c = spec.cluster
    order = sorted(range(len(c.nodes)), key=lambda i: -c.nodes[i].speed)
    if c.min_gpus <= 0:
        sizes = [c.num_gpus]
    elif c.num_gpus <= 64:
        sizes = list(range(c.num_gpus, c.min_gpus - 1, -1))
    else:
        g = c.gpus_per_node
        sizes = sorted({c.num_gpus, c.min_gpus, *range(g * (c.min_gpus // g or 1), c.num_gpus, g)}, reverse=True)
        sizes = [s for s in sizes if c.min_gpus <= s <= c.num_gpus]
    worlds = []
    for size in sizes:
        chosen: list[int] = []
        total = 0
        for i in order:
            if total >= size:
                break
            chosen.append(i)
            total += c.nodes[i].gpus
        chosen.sort()
        nodes = tuple(c.nodes[i] for i in chosen)
        # GPUs actually used per node (the last chosen node may be partly used)
        worlds.append(World(size, nodes, min(n.speed for n in nodes), gpu_histogram([n.gpus for n in nodes])))
    return worlds


def links_for(hw: Hardware, tp: int, cp: int, dp: int, pp: int, gpus: tuple[tuple[int, int], ...],
              dp_replicate: int = 1) -> Links:
    """Links of each group kind under :func:`planner.grid.rank_grid`'s placement.

    TP and CP groups that leave a node are priced at one NIC per rank (conservative: they are on
    the critical path and share the NICs with DP and PP traffic); DP groups get one NIC per member
    on a node (NCCL rings over every NIC); pipeline point-to-point gets one NIC. With replica
    groups the ZeRO shard group (``tp*cp*dp_shard`` consecutive ranks per block) is priced like a
    DP group of its own, and the cross-replica all-reduce gets one NIC per member on a node (its
    members are ``tp*cp*dp_shard`` ranks apart).
    """
    world = tp * cp * dp * pp
    per_node = min(g for g, _ in gpus)
    links = Links(
        tp=group_link(hw, block_fits(tp, world, gpus), 1),
        cp=group_link(hw, block_fits(tp * cp, world, gpus), 1),
        dp=group_link(hw, block_fits(tp * cp * dp, world, gpus), per_node // tp),
        pp=group_link(hw, block_fits(world, world, gpus), 1),
    )
    block = tp * cp * (dp // dp_replicate)
    links = dataclasses.replace(links, zero3=group_link(hw, block_fits(block, world, gpus), 1))
    if dp_replicate > 1:
        links = dataclasses.replace(
            links, dp_shard=group_link(hw, block_fits(block, world, gpus), per_node // tp),
            dp_replicate=group_link(hw, block_fits(tp * cp * dp, world, gpus), per_node // block))
    return links


def replica_options(spec: PlanSpec, tp: int, cp: int, dp: int, pp: int, gpus: tuple[tuple[int, int], ...]
                    ) -> list[int]:
    """Replica-group counts (``dp_replicate``) the search tries for a shape with ZeRO: the fixed one,
    else 1 (plain ZeRO over all of DP x CP) and the fewest replica groups whose shard group
    (``tp*cp*dp_shard`` consecutive ranks) fits inside a node.

    Why only those: ring collectives move ``(n-1)/n`` of their bytes, so every split of DP moves the
    same bytes per rank (all-gather and reduce-scatter over ``dp_shard`` plus the all-reduce of a
    ``1/dp_shard`` shard over ``dp_replicate`` add up to the reduce-scatter/all-gather over ``dp``);
    splits differ in which link each part runs on, in hop latency, and in memory (more replica groups,
    more state per GPU). The split that matters is the one that puts the shard collectives on a
    node's link while plain ZeRO's group crosses nodes: the fewest replica groups that do that (the
    most sharding, the least memory). Splits inside one link class differ only by hop latency and
    are left out (fix ``dp_replicate`` to get one); so is any split when plain ZeRO's group already
    fits in a node.
    """
    if "dp_replicate" in spec.fixed:
        return [spec.fixed["dp_replicate"]]
    world = tp * cp * dp * pp
    out = [1]
    for shard in sorted(divisors(dp), reverse=True):
        if shard < dp and block_fits(tp * cp * shard, world, gpus):
            if not block_fits(tp * cp * dp, world, gpus):  # else the plain shard group is inside a node too
                out.append(dp // shard)
            break
    return out


def build_estimate(spec: PlanSpec, hw: Hardware, lay: Layout, gpus: tuple[tuple[int, int], ...]) -> Estimate:
    mem = estimate_memory(spec, lay)
    t = estimate_time(spec, hw, lay, links_for(hw, lay.tp, lay.cp, lay.dp, lay.pp, gpus, lay.dp_replicate))
    m = spec.model
    tokens = spec.global_batch * m.seq_len
    tps = tokens / t.step_time_s
    world = lay.world_size
    model_flops = model_flops_per_token(m) * tps
    hw_flops = model_flops + recompute_flops_per_token(m, lay.recompute) * tps
    return Estimate(
        step_time_s=t.step_time_s,
        tokens_per_s=tps,
        tokens_per_s_per_gpu=tps / world,
        mfu=model_flops / (world * hw.peak),
        hfu=hw_flops / (world * hw.peak),
        memory_gb_per_gpu=mem.total_gb,
        bubble_fraction=t.bubble_fraction,
        time_breakdown_s=t.components,
        hidden_comm_s=t.hidden,
        memory_breakdown_gb=mem.components,
    )


@dataclass(order=True)
class _Found:
    step: float
    tie: tuple[Any, ...]
    layout: Layout = field(compare=False)
    world: World = field(compare=False)


class Searcher:
    def __init__(self, spec: PlanSpec, top_k: int) -> None:
        self.spec = spec
        self.top_k = max(1, top_k)
        self.best_by_shape: dict[tuple[int, ...], _Found] = {}
        self.rejected: list[Rejection] = []
        self.rejected_counts: dict[str, int] = {}
        self.searched = 0
        self.evaluated = 0
        self.limit_gb = memory_limit_gb(spec)
        self._threshold = math.inf
        self._rc_costs: dict[tuple[Any, ...], dict[str, float]] = {}
        self._mem_cache: dict[tuple[Any, ...], float] = {}
        self._layer_n_cache: dict[tuple[Any, ...], int] = {}

    # ------------------------------------------------------------------ bookkeeping
    def reject(self, layout: dict[str, Any] | Layout, kind: str, reason: str, count: int = 1) -> None:
        self.rejected_counts[kind] = self.rejected_counts.get(kind, 0) + count
        if len(self.rejected) < MAX_LISTED_REJECTIONS:
            as_dict = layout.to_dict() if isinstance(layout, Layout) else layout
            self.rejected.append(Rejection(as_dict, reason, kind))

    def found(self, step: float, lay: Layout, world: World) -> None:
        key = (world.size, lay.tp, lay.pp, lay.cp, lay.dp)
        entry = _Found(step, (-world.size, lay.vpp, lay.micro_batch, lay.zero), lay, world)
        old = self.best_by_shape.get(key)
        if old is None or entry < old:
            self.best_by_shape[key] = entry
            if len(self.best_by_shape) >= self.top_k and step < self._threshold:
                self._threshold = heapq.nsmallest(self.top_k, (f.step for f in self.best_by_shape.values()))[-1]

    # ------------------------------------------------------------------ knob candidates
    def _free(self, name: str) -> bool:
        return name not in self.spec.fixed

    def _options(self, name: str, default: Sequence[Any]) -> list[Any]:
        return [self.spec.fixed[name]] if name in self.spec.fixed else list(default)

    def factorizations(self, world: int) -> Iterator[tuple[int, int, int, int]]:
        f = self.spec.fixed
        for tp in divisors(world):
            if "tp" in f and f["tp"] != tp:
                continue
            for cp in divisors(world // tp):
                if "cp" in f and f["cp"] != cp:
                    continue
                rest = world // (tp * cp)
                for pp in divisors(rest):
                    dp = rest // pp
                    if ("pp" in f and f["pp"] != pp) or ("dp" in f and f["dp"] != dp):
                        continue
                    yield tp, cp, pp, dp

    def lower_bound(self, hw: Hardware, tp: int, cp: int, pp: int, dp: int, nmb: int, vmax: int) -> float:
        m = self.spec.model
        samples = self.spec.global_batch / dp
        per_token = 6.0 * layer_matmul_params(m) + 6.0 * m.seq_len * m.hidden * 0.5
        flops = samples * m.seq_len * per_token * (m.layers / pp) / (tp * cp)
        compute = flops / (max(hw.peak, hw.peak_bf16) * hw.eff * hw.speed)
        return compute * (1 + (pp - 1) / (vmax * nmb))

    # ------------------------------------------------------------------ the search
    def run_world(self, world: World) -> None:
        spec = self.spec
        refused = recompute_rule(spec.fixed.get("recompute", "none")) if spec.engine_only else None
        if refused:
            self.reject({"recompute": spec.fixed["recompute"]}, *refused)
            return
        hw = hardware_for(spec, world.speed)
        gb = spec.global_batch
        entries = []
        shapes = list(self.factorizations(world.size))
        if not shapes:
            fixed = {k: v for k, v in spec.fixed.items() if k in ("tp", "pp", "cp", "dp")}
            self.reject({"world_size": world.size, **fixed}, "gpus",
                        f"{world.size} GPUs cannot be split as tp*pp*cp*dp with {fixed}")
        for tp, cp, pp, dp in shapes:
            shape = {"tp": tp, "pp": pp, "cp": cp, "dp": dp}
            bad = C.check_tp(spec, tp) or C.check_cp(spec, cp)
            if bad is None and pp > spec.model.layers:
                bad = ("layers", f"pp {pp} exceeds the {spec.model.layers} layers")
            if bad is None and gb % dp:
                bad = ("global_batch", f"global_batch {gb} not divisible by dp {dp}")
            if bad is None and dp % spec.fixed.get("dp_replicate", 1):
                bad = ("dp_replicate", f"dp_replicate {spec.fixed['dp_replicate']} does not divide dp {dp}")
            if bad:
                self.reject(shape, bad[0], bad[1])
                self.searched += 1
                continue
            mbs = [b for b in self._options("micro_batch", divisors(gb // dp)) if (gb // dp) % b == 0
                   and (b <= MAX_MICRO_BATCH or not self._free("micro_batch"))]
            if not mbs:
                self.reject(shape, "global_batch", f"micro_batch does not divide global_batch/dp = {gb // dp}")
                self.searched += 1
                continue
            vpps = self._vpp_options(pp)
            lb = self.lower_bound(hw, tp, cp, pp, dp, gb // (dp * mbs[0]), max(vpps))
            entries.append((lb, tp, cp, pp, dp, mbs, vpps))
        entries.sort(key=lambda e: e[0])
        for lb, tp, cp, pp, dp, mbs, vpps in entries:
            if lb > self._threshold:
                self.searched += len(mbs) * self._space(tp, cp, dp, pp, vpps)
                continue
            self._search_shape(world, hw, tp, cp, pp, dp, mbs, vpps)

    def _recompute_options(self) -> list[str]:
        return self._options("recompute", ENGINE_RECOMPUTE if self.spec.engine_only else RECOMPUTE_ORDER)

    def _n_modes(self, recs: Sequence[str], pp: int, v: int) -> int:
        """Recompute modes in ``recs`` for a stage split, the layer:N family counted as its members."""
        if LAYER_FAMILY not in recs:
            return len(recs)
        return len(recs) - 1 + max(0, C.layer_checkpoint_cap(self.spec, pp, v) - 1)

    def _space(self, tp: int, cp: int, dp: int, pp: int, vpps: Sequence[int]) -> int:
        """Candidates per micro-batch of a shape (for ``searched``): SP x ZeRO x CP method x
        recompute, summed over the vpp choices."""
        knobs = (len(self._options("sp", [True] if tp > 1 else [False]))
                 * len(self._options("zero", [1, 3] if dp * cp > 1 else [0]))
                 * len(self._options("cp_method", ["ring", "ulysses"] if cp > 1 else ["ring"])))
        recs = self._recompute_options()
        return knobs * sum(self._n_modes(recs, pp, v) for v in vpps)

    def largest_layer_n(self, lay: Layout) -> int:
        """The largest N in 2 .. :func:`planner.constraints.layer_checkpoint_cap` for which ``lay`` with
        ``recompute=layer:N`` fits in memory (0 when none does): the fastest layer:N that fits, in
        closed form (:func:`planner.memory.largest_checkpoint_interval`) instead of one costing per N."""
        key = _memory_key(lay)
        n = self._layer_n_cache.get(key)
        if n is None:
            n = self._layer_n_cache[key] = largest_checkpoint_interval(
                self.spec, lay, self.limit_gb, C.layer_checkpoint_cap(self.spec, lay.pp, lay.vpp))
        return n

    def memory_gb(self, lay: Layout, recompute: str | None = None) -> float:
        """:func:`planner.memory.memory_total_gb` of ``lay`` (with ``recompute`` instead of its own),
        remembered: the CP method does not change memory, so ring and Ulysses candidates share one
        evaluation."""
        rc = recompute or lay.recompute
        key = (*_memory_key(lay), rc)
        mem = self._mem_cache.get(key)
        if mem is None:
            mem = self._mem_cache[key] = memory_total_gb(self.spec, lay, rc)
        return mem

    def _vpp_options(self, pp: int) -> list[int]:
        """Virtual stages per rank: every count the cost model accepts, uneven chunks included.

        1 is the plain (1F1B) pipeline; interleaving means ``vpp >= 2``, so a spec that fixes
        ``schedule: interleaved`` leaves 1 out. Chunk counts the model cannot split (the last
        stage would be empty) and, for ``engine_only``, uneven ones are rejected by
        :func:`planner.constraints.check_pp` with their reason.
        """
        if "vpp" in self.spec.fixed:
            return [self.spec.fixed["vpp"]]
        sched = self.spec.fixed.get("schedule")
        if pp == 1 or sched in ("1f1b", "gpipe"):
            return [1]
        top = self.spec.model.layers // pp
        return list(range(2 if sched == "interleaved" else 1, top + 1)) or [2]

    def tight_bound(self, hw: Hardware, links_by_rep: dict[int, Links], shape: dict[str, int], b: int, nmb: int,
                    sps: list[bool], cpms: list[str], vpps: list[int], zero3_only: bool) -> list[tuple[float, int]]:
        """A cheap lower bound on the step time of every remaining knob, per vpp: the pipeline with
        its point-to-point, no recompute, no DP exposure; ZeRO-3's gathers when only ZeRO-3 fits
        (the cheapest over the replica-group options, without their cross-replica all-reduce)."""
        m = self.spec.model
        tp, cp, pp = shape["tp"], shape["cp"], shape["pp"]
        links = links_by_rep[min(links_by_rep)]
        head = head_time(m, hw, b, tp, cp)
        layer = min(layer_times(m, self.spec.precision, hw, b, tp, cp, sp, "none", cpm, links.tp, links.cp).total
                    for sp in sps for cpm in cpms)
        p2p = p2p_time(m, b, tp, cp, pp, 1, links.pp)  # per chunk, exposed in a plain pipeline
        heq = head_layer_equivalents(m)
        out = []
        for v in vpps:
            first, last = stage_layers(m.layers, pp, v, heq)
            stage = max(first * layer, last * layer + head) if pp > 1 else first * layer + head
            if zero3_only:  # the gathers and the reduce-scatter bound a micro-batch
                floor = math.inf
                for r, lk in links_by_rep.items():
                    shard = shape["dp"] // r * cp
                    params = stage_param_count(m, min(first, last), tp)
                    ag, rs = zero3_traffic_s(self.spec.precision, params, shard, lk.zero3 or lk.dp_shard or lk.dp) \
                        if shard > 1 else (0.0, 0.0)
                    rs += replica_allreduce_s(self.spec.precision, params, shard, r, lk.dp_replicate or lk.dp)
                    floor = min(floor, 2 * ag + rs)
                stage = max(stage, floor)
            # interleaved transfers hide under compute: only their latencies are certain
            out.append(((nmb + (pp - 1) / v) * (stage + (v * p2p if v == 1 else p2p_floor(pp, v, links.pp))), v))
        return out

    def _limit(self, key: tuple[int, ...]) -> float:
        """What a candidate must beat: this shape's best so far (only the best plan per shape is
        kept) or, before that, the k-th best overall."""
        shape_best = self.best_by_shape.get(key)
        return min(self._threshold, shape_best.step if shape_best else math.inf)

    def _search_shape(self, world: World, hw: Hardware, tp: int, cp: int, pp: int, dp: int,
                      mbs: list[int], vpps: list[int]) -> None:
        spec = self.spec
        shape = {"tp": tp, "pp": pp, "cp": cp, "dp": dp}
        sps = self._options("sp", [True] if tp > 1 else [False])
        zeros = self._options("zero", [1, 3] if dp * cp > 1 else [0])
        recs = self._recompute_options()
        cpms = self._options("cp_method", ["ring", "ulysses"] if cp > 1 else ["ring"])
        reps = replica_options(spec, tp, cp, dp, pp, world.gpus) if dp > 1 else [1]
        links_by_rep = {r: links_for(hw, tp, cp, dp, pp, world.gpus, r) for r in reps}
        key = (world.size, tp, pp, cp, dp)
        fitting = [z for z in zeros if states_floor_gb(spec, tp, pp, dp * cp, z) <= self.limit_gb]
        if not fitting:
            least = states_floor_gb(spec, tp, pp, dp * cp, max(zeros))
            n = self._space(tp, cp, dp, pp, vpps) * len(mbs)
            self.reject(shape, "memory", f"needs at least {least:.1f} GiB per GPU for the model states alone > "
                        f"{self.limit_gb:.1f} GiB usable", n)
            self.searched += n
            return
        zeros = fitting
        zero3_only = min(zeros) >= 3
        splittable = []
        for v in vpps:  # stage splits depend on v alone
            bad = C.check_pp(spec, pp, v)
            if bad:
                self.reject({**shape, "vpp": v}, bad[0], bad[1], len(mbs))
                self.searched += self._space(tp, cp, dp, pp, [v]) * len(mbs)
            else:
                splittable.append(v)
        per_mb = self._space(tp, cp, dp, pp, splittable)
        probe = Layout(tp=tp, pp=pp, cp=cp, dp=dp, vpp=2, schedule="interleaved") if pp > 1 else None
        for i, b in enumerate(mbs):
            nmb = spec.global_batch // (dp * b)
            any_fit = False
            self.searched += per_mb
            vs = []
            for v in splittable:
                bad = C.check_schedule(spec, probe, nmb) if v > 1 and probe is not None else None
                if bad:
                    self.reject({**shape, "vpp": v, "micro_batch": b}, bad[0], bad[1])
                    any_fit = True  # not a memory failure: keep trying larger micro-batches
                else:
                    vs.append(v)
            # most promising first: the shape's best so far then rules out more of the rest
            for bound, v in sorted(self.tight_bound(hw, links_by_rep, shape, b, nmb, sps, cpms, vs, zero3_only)):
                if bound > self._limit(key):
                    any_fit = True  # unknown whether it fits: do not stop on memory grounds
                    continue
                for sched in self._options("schedule", ["interleaved"] if v > 1 else ["1f1b"]):
                    for sp in sps:
                        for cpm in cpms:
                            if self._try_knobs(world, hw, links_by_rep, shape, b, nmb, v, sched, sp, cpm, zeros,
                                               recs):
                                any_fit = True
            if not any_fit and "micro_batch" not in spec.fixed:
                # memory only grows with the micro-batch: larger ones cannot fit either
                self.searched += (len(mbs) - i - 1) * per_mb
                break

    def _try_knobs(self, world: World, hw: Hardware, links_by_rep: dict[int, Links], shape: dict[str, int], b: int,
                   nmb: int, v: int, sched: str, sp: bool, cpm: str, zeros: list[int], recs: list[str]) -> bool:
        """ZeRO x replica groups x recompute for one (b, v, schedule, sp, cp_method); True unless only
        memory failed.

        Recompute modes are tried cheapest (recompute time) first and stop at the first that fits; the
        layer:N family enters that order at its cheapest member and is resolved, when reached, to the
        largest N that fits (:meth:`largest_layer_n`). ZeRO-1 (or 0) first: once it fits with a mode
        of recompute time r, ZeRO-3 (more communication) only needs modes cheaper than r (per
        replica-group count: the same argument holds for each).
        """
        spec = self.spec
        links = links_by_rep[min(links_by_rep)]

        costs = self._rc_costs.setdefault((hw, b, shape["tp"], shape["cp"], sp, cpm, links.tp, links.cp), {})

        def rc_cost(mode: str) -> float:
            cost = costs.get(mode)
            if cost is None:
                cost = costs[mode] = layer_times(spec.model, spec.precision, hw, b, shape["tp"], shape["cp"], sp,
                                                 mode, cpm, links.tp, links.cp).rc
            return cost

        cap = C.layer_checkpoint_cap(spec, shape["pp"], v)
        concrete = [r for r in recs if r != LAYER_FAMILY]
        family = LAYER_FAMILY in recs and cap >= 2
        # the leanest combination first (memory falls with the ZeRO stage; full recompute keeps least):
        # when even it does not fit, no combination does
        if "full" in concrete:
            lean_rc = "full"
        elif concrete or family:
            lean_rc = max(concrete + (["layer:2"] if family else []), key=rc_cost)
        else:  # only the layer:N family, and no layer:N applies to this stage split
            self.reject({**shape, "vpp": v, "schedule": sched}, "recompute",
                        f"layer:N needs N <= the busiest stage's {cap} layer(s)")
            return True
        try:
            lean = Layout(tp=shape["tp"], pp=shape["pp"], cp=shape["cp"], dp=shape["dp"], vpp=v, micro_batch=b,
                          num_micro_batches=nmb, sp=sp, zero=max(zeros), recompute=lean_rc, schedule=sched,
                          cp_method=cpm)
        except ValueError as exc:
            self.reject({**shape, "vpp": v, "schedule": sched}, "layout", str(exc))
            return True
        bad = C.check_schedule(spec, lean, nmb) or C.check_knobs(spec, lean)
        if bad:
            self.reject(lean, bad[0], bad[1])
            return True
        n_modes = len(concrete) + (cap - 1 if family else 0)
        mem = self.memory_gb(lean)
        if mem > self.limit_gb:
            self.reject(lean, "memory", f"needs {mem:.1f} GiB per GPU > {self.limit_gb:.1f} GiB usable "
                        "(with the least memory any ZeRO stage and recompute mode allow)", len(zeros) * n_modes)
            return False
        tie = itertools.count()
        order = sorted((rc_cost(r), next(tie), r) for r in concrete)
        if family:  # the family's cheapest member stands for it until it is reached
            order.append((rc_cost(f"layer:{cap}"), next(tie), LAYER_FAMILY))
            order.sort()
        cutoff = {r: math.inf for r in links_by_rep}  # recompute time a ZeRO-3 mode must beat, per replica count
        # per ZeRO stage, what plain ZeRO (dp_replicate=1) learnt: modes up to this recompute time did not
        # fit (strict) or the first that fit had it; more replica groups hold more state, so modes
        # below it cannot fit with them either
        floor: dict[int, tuple[float, bool]] = {}
        fitted_any = False
        for zero, rep in [(z, r) for z in zeros for r in (sorted(links_by_rep) if z else [1])]:
            base = lean if (zero, rep) == (lean.zero, 1) else dataclasses.replace(lean, zero=zero, dp_replicate=rep)
            if base is not lean:
                mem = self.memory_gb(base)
                if mem > self.limit_gb:  # not even the leanest recompute mode fits at this stage
                    self.reject({**shape, "vpp": v, "micro_batch": b, "zero": zero, "dp_replicate": rep}, "memory",
                                f"needs {mem:.1f} GiB per GPU > {self.limit_gb:.1f} GiB usable with recompute "
                                f"{lean_rc}", n_modes)
                    continue
            queue = list(order)
            while queue:
                cost, _, rc = heapq.heappop(queue)
                if cost >= cutoff[rep]:
                    break
                if rc == LAYER_FAMILY:
                    n = self.largest_layer_n(base)
                    if n:
                        heapq.heappush(queue, (rc_cost(f"layer:{n}"), next(tie), f"layer:{n}"))
                    else:
                        mem = self.memory_gb(base, "layer:2")
                        self.reject(dataclasses.replace(base, recompute="layer:2"), "memory",
                                    f"needs {mem:.1f} GiB per GPU > {self.limit_gb:.1f} GiB usable with every "
                                    f"layer:N (N = 2..{cap})", cap - 1)
                    continue
                if rep > 1 and zero in floor and (cost < floor[zero][0] or (cost == floor[zero][0]
                                                                             and floor[zero][1])):
                    continue
                # the general structural checks passed for the lean layout and do not depend on the ZeRO
                # stage, the replica groups or the recompute mode (every mode here is within the layer:N
                # cap); the engine's own rules are checked per mode (they may name a recompute mode)
                if spec.engine_only:
                    lay = dataclasses.replace(base, recompute=rc)
                    bad = C.check_schedule(spec, lay, nmb) or C.check_knobs(spec, lay)
                    if bad:
                        self.reject(lay, bad[0], bad[1])
                        return True
                mem = self.memory_gb(base, rc)
                if mem > self.limit_gb:
                    self.reject({**shape, "vpp": v, "micro_batch": b, "zero": zero, "dp_replicate": rep,
                                 "recompute": rc}, "memory",
                                f"needs {mem:.1f} GiB per GPU > {self.limit_gb:.1f} GiB usable")
                    if rep == 1:
                        floor[zero] = (cost, True)
                    continue
                fitted_any = True
                if rep == 1:
                    floor[zero] = (cost, False)
                lay = dataclasses.replace(base, recompute=rc)
                self.evaluated += 1
                self.found(estimate_time(spec, hw, lay, links_by_rep[rep], detail=False).step_time_s, lay, world)
                if zero < 3:
                    cutoff[rep] = cost
                break
        return fitted_any

    # ------------------------------------------------------------------ results
    def top(self) -> list[_Found]:
        return sorted(self.best_by_shape.values())[: self.top_k]


def make_plan(spec: PlanSpec, lay: Layout, world: World) -> Plan:
    hw = hardware_for(spec, world.speed)
    est = build_estimate(spec, hw, lay, world.gpus)
    slots, groups, counts = rank_grid(lay, world.nodes)
    return Plan(layout=lay, estimate=est, global_batch=spec.global_batch, num_gpus=world.size,
                rank_grid=slots, spanning_groups=groups, spanning_counts=counts,
                nodes_used=tuple(n.id for n in world.nodes))


def search(spec: PlanSpec, top_k: int = 5) -> PlanResult:
    t0 = time.perf_counter()
    searcher = Searcher(spec, top_k)
    for world in candidate_worlds(spec):
        searcher.run_world(world)
    plans = tuple(make_plan(spec, f.layout, f.world) for f in searcher.top())
    return PlanResult(plans=plans, rejected=tuple(searcher.rejected), searched=searcher.searched,
                      evaluated=searcher.evaluated, search_time_s=time.perf_counter() - t0,
                      rejected_counts=dict(searcher.rejected_counts))


def evaluate_on(spec: PlanSpec, layout: Layout, nodes: Sequence[NodeSpec] | None) -> Plan | Rejection:
    """Cost one given layout on ``nodes`` (default: the fastest nodes that hold it): a plan, or
    the reason it is invalid or does not fit."""
    if nodes is None:
        if layout.world_size > spec.cluster.num_gpus:
            return Rejection(layout.to_dict(), f"needs {layout.world_size} GPUs, the cluster has "
                             f"{spec.cluster.num_gpus}", "gpus")
        chosen, total = [], 0
        for i in sorted(range(len(spec.cluster.nodes)), key=lambda i: -spec.cluster.nodes[i].speed):
            if total >= layout.world_size:
                break
            chosen.append(i)
            total += spec.cluster.nodes[i].gpus
        nodes = [spec.cluster.nodes[i] for i in sorted(chosen)]
    if sum(n.gpus for n in nodes) < layout.world_size:
        return Rejection(layout.to_dict(), f"needs {layout.world_size} GPUs, the nodes have "
                         f"{sum(n.gpus for n in nodes)}", "gpus")
    world = World(layout.world_size, tuple(nodes), min(n.speed for n in nodes),
                  gpu_histogram([n.gpus for n in nodes]))
    lay = layout
    if not lay.num_micro_batches and spec.global_batch % (lay.dp * lay.micro_batch) == 0:
        lay = lay.with_global_batch(spec.global_batch)
    bad = C.check_all(spec, lay)
    if bad:
        return Rejection(lay.to_dict(), bad[1], bad[0])
    limit = memory_limit_gb(spec)
    mem = memory_total_gb(spec, lay)
    if mem > limit:
        return Rejection(lay.to_dict(), f"needs {mem:.1f} GiB per GPU > {limit:.1f} GiB usable", "memory")
    return make_plan(spec, lay, world)


def evaluate(spec: PlanSpec, layout: Layout) -> Plan | Rejection:
    """Cost one given layout on the spec's fastest nodes: a plan, or the reason it is invalid."""
    return evaluate_on(spec, layout, None)
