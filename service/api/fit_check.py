"""The submission path's fit check and the dry run of ``POST /v1/plans`` (the planner spec itself
comes from the one builder, ``workers.planner_spec.to_planner_spec``). Both also say what the job's
``recovery`` block comes to on the best plan (``planner.recovery_choice``, the one rule; computed
after the cache, which holds the plans only).

The planner (``planner.plan``) is imported lazily. Its ``SpecError.field`` (``model.heads``,
``parallel.tp``, ``cluster.num_gpus``, ...) is mapped to the job-spec field the user wrote, so a
422 names it. The fit check asks only "is there any plan for some GPU count in min..max" on the
configured GPU profile (``engine_only``: layouts the engine runs) and caches answers per spec. It
never fails open: when the planner is busy, exceeds its time budget or breaks, the submission is
refused with :class:`PlannerUnavailable` (503 with ``Retry-After``), never accepted unchecked. At
most two searches run at once. Concurrent submissions of the same planner spec share one search
(single flight); a submission waits up to ``plan_timeout_s`` for a free slot before it is refused
as busy, while a dry run finding both slots busy is shed at once (429), and one overrunning its
budget is 422 (``max_gpus``: the range is too large to plan within ``dryrun_timeout_s``).

Every answer is cached by the planner's input (the model shape, batch, layout hint and cluster
profile, plus ``top_k`` for a dry run), and concurrent identical questions share one search: a
dry run, a dashboard explain or a submission asked again costs no search. Callers hold no database
connection while a search runs: :func:`_plan` refuses to start one otherwise (a programming error,
``service.db.session.connections_held``), since an open SQLite transaction would hold the write
lock for the whole search.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, status

from service.api.config import ApiSettings
from service.api.schemas import JobSpec, PlanOut
from service.db.session import connections_held
from service.log import get_logger
from service.settings import get_settings

log = get_logger("service.api.fit_check")

_WORKERS = 2
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="planner")
#: searches in flight (a search that overran its budget keeps its slot until it ends: no backlog)
_SLOTS = threading.BoundedSemaphore(_WORKERS)
#: answers by question ("fit " or "dry <top_k> " + the planner spec as JSON): FitResult or PlanOut
_CACHE: OrderedDict[str, Any] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 2048
#: questions in flight: a concurrent identical one waits for the leader's answer
_INFLIGHT: dict[str, concurrent.futures.Future[Any]] = {}
#: how long a dry run waits for a planner slot before it is shed
_DRYRUN_SLOT_WAIT_S = 0.05

# planner field -> where it sits in the job spec
_FIELD_MAP = {
    "cluster.num_gpus": ("max_gpus",),
    "cluster.min_gpus": ("min_gpus",),
    "cluster": ("max_gpus",),
    "parallel.global_batch": ("global_batch",),
    "training.global_batch": ("global_batch",),
    "parallel.micro_batch": ("layout_hint", "micro_batch"),
}


class PlannerUnavailable(Exception):
    """The planner cannot answer now (busy, over its budget, or broken): 503, retry later."""

    retry_after = 2


class PlannerBusy(PlannerUnavailable):
    """Every planner slot is taken by a running search; try again shortly."""


class PlannerTimeout(PlannerUnavailable):
    """The search did not finish within its budget (the spec's GPU range is too large to plan now)."""


class PlannerRefused(Exception):
    """The planner rejected the spec: ``loc`` is the job-spec field, ``msg`` why."""

    def __init__(self, loc: tuple[str, ...], msg: str) -> None:
        super().__init__(msg)
        self.loc = loc
        self.msg = msg


def planner_unavailable(exc: PlannerUnavailable) -> HTTPException:
    """The 503 (with ``Retry-After``) a route answers when the planner cannot answer now."""
    return HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"{exc}; retry shortly",
                         headers={"Retry-After": str(exc.retry_after)})


@dataclass(frozen=True)
class FitResult:
    ok: bool
    loc: tuple[str, ...] = ()
    msg: str = ""
    plan: dict[str, Any] | None = None  # the best plan found (``Plan.to_dict()``), for the recovery choice


def recovery_choice(spec: JobSpec, api: ApiSettings, plan: dict[str, Any],
                    model: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``spec``'s recovery block comes to on ``plan`` (the one rule, ``planner.recovery_choice``),
    priced on the plan's GPU count; :class:`PlannerRefused` naming the field when it cannot hold."""
    from planner.recovery_choice import ChoiceError, choose
    from service.recovery import runnable

    block = spec.recovery.model_dump(mode="json", exclude_none=True) if spec.recovery is not None else None
    groups = int((block or {}).get("groups") or 0)
    try:
        if groups and int(plan["layout"]["dp"]) % groups:  # named groups: the plan whose dp they divide
            from service.recovery import plan_recovery

            profile = get_settings()
            choice = plan_recovery(spec.stored(), spec.max_gpus, gpu_type=profile.gpu_type,
                                   gpus_per_node=profile.gpus_per_node, model=model)
        else:
            choice = choose(plan, block, planner_spec(spec, api, int(plan["num_gpus"]), model))
        # as the runtime will run it: auto re-plans where the runtime has no replica path for the plan
        return runnable(spec.stored(), choice, strict=True).to_dict()
    except ChoiceError as exc:
        raise PlannerRefused(tuple(exc.field.split(".")), exc.msg) from None


def planner_spec(spec: JobSpec, api: ApiSettings, gpus: int | None = None,
                 model: dict[str, Any] | None = None, goodput: dict[str, Any] | None = None) -> dict[str, Any]:
    """The planner's input for ``spec`` on the configured cluster profile: ``gpus`` exactly, or any
    count in ``min_gpus..max_gpus`` when ``gpus`` is None. ``model``: the engine shape to plan
    (``workers.job_inputs.check_inputs``: an HF model's shape comes from its ``config.json``).
    ``goodput``: ``failure_rates`` and ``recovery_phases`` resolved from the event store
    (``service.cluster_history.planner_inputs``): with the spec's ``duration_days`` the plans are ranked
    by effective tokens/s; without it (the submission's fit check) by healthy speed."""
    from workers.planner_spec import PlanCluster, to_planner_spec

    top = gpus or spec.max_gpus
    profile = get_settings()
    ranged = gpus is None and spec.min_gpus < spec.max_gpus
    cluster = PlanCluster(gpu_type=profile.gpu_type, num_gpus=top, min_gpus=spec.min_gpus if ranged else None,
                          gpus_per_node=profile.gpus_per_node)
    if model is None:
        model = spec.model if isinstance(spec.model, str) else spec.model.model_dump()
    hint = spec.layout_hint.model_dump(exclude_none=True) if spec.layout_hint is not None else None
    job: dict[str, Any] = {"model": model, "global_batch": spec.global_batch, "layout_hint": hint}
    if spec.duration_days is not None and goodput is not None:  # the fit check plans healthy speed only
        job["duration_days"] = spec.duration_days
        job.update(goodput)
    return to_planner_spec(job, cluster)


def _loc(field: str) -> tuple[str, ...]:
    if field in _FIELD_MAP:
        return _FIELD_MAP[field]
    head, _, rest = field.partition(".")
    if head == "model":
        return ("model", rest) if rest else ("model",)
    if head == "parallel":
        return ("layout_hint", rest) if rest else ("layout_hint",)
    if head == "cluster":
        return ("max_gpus",)
    return (field,) if field else ("body",)


def _summary(result: Any, spec: JobSpec, api: ApiSettings) -> str:
    counts = dict(getattr(result, "rejected_counts", {}) or {})
    reasons = [r.reason for r in result.rejected[:1]]
    where = f"{spec.min_gpus}..{spec.max_gpus}" if spec.min_gpus < spec.max_gpus else str(spec.max_gpus)
    detail = f"; e.g. {reasons[0]}" if reasons else ""
    kinds = f" ({', '.join(f'{k}: {v}' for k, v in list(counts.items())[:3])})" if counts else ""
    return (f"no parallel layout fits on {where} {get_settings().gpu_type} GPU(s): {result.searched} candidates "
            f"rejected{kinds}{detail}")


def _run_plan(pspec: dict[str, Any], top_k: int) -> Any:
    import planner

    return planner.plan(pspec, top_k=top_k)


def _plan(pspec: dict[str, Any], top_k: int, timeout_s: float, slot_wait_s: float) -> Any:
    """``planner.plan`` with a time budget and a bounded number of searches in flight.

    Raises :class:`PlannerRefused` for the spec's field errors, :class:`PlannerBusy` when every
    slot stays taken for ``slot_wait_s``, :class:`PlannerTimeout` when the budget runs out (the
    search finishes in the background and then frees its slot)."""
    from planner.layout import LayoutError
    from planner.spec import SpecError

    if connections_held():
        raise RuntimeError("a database connection is held while planning; end the transaction first")
    if not _SLOTS.acquire(timeout=slot_wait_s):
        raise PlannerBusy("the planner is busy")
    try:
        future = _POOL.submit(_run_plan, pspec, top_k)
    except BaseException:
        _SLOTS.release()
        raise
    future.add_done_callback(lambda _: _SLOTS.release())
    try:
        return future.result(timeout=timeout_s)
    except SpecError as exc:
        raise PlannerRefused(_loc(exc.field), str(exc)) from None
    except LayoutError as exc:
        raise PlannerRefused(("layout_hint",), str(exc)) from None
    except concurrent.futures.TimeoutError:
        raise PlannerTimeout(f"the planner did not finish within {timeout_s:g} s") from None


def _search_fit(spec: JobSpec, api: ApiSettings, pspec: dict[str, Any],
                model: dict[str, Any] | None) -> FitResult:
    """The fit check's search (no cache): the largest count first, then the whole range."""
    try:
        # the largest count first: one size is cheap and usually fits; then the whole range
        result = _plan(planner_spec(spec, api, spec.max_gpus, model), 1, api.plan_timeout_s, api.plan_timeout_s)
        if not result.plans and spec.min_gpus < spec.max_gpus:
            result = _plan(pspec, 1, api.plan_timeout_s, api.plan_timeout_s)
        if not result.plans:
            return FitResult(False, ("max_gpus",), _summary(result, spec, api))
        return FitResult(True, plan=result.plans[0].to_dict())
    except PlannerRefused as exc:
        return FitResult(False, exc.loc, exc.msg)
    except PlannerUnavailable as exc:
        log.warning("fit check could not run; refusing the job for now", extra={"why": str(exc)})
        raise
    except Exception as exc:  # a planner bug refuses (503), it never lets an unchecked job in
        log.exception("fit check failed; refusing the job for now")
        raise PlannerUnavailable("the planner failed; retry later") from exc


def check_fit(spec: JobSpec, api: ApiSettings, before_planning: Callable[[], None] | None = None,
              model: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Raise :class:`PlannerRefused` when no GPU count in ``min..max`` has a plan for ``spec``, or its
    recovery block cannot hold on the best one (a named ``replica_groups`` with no room); else the
    recovery choice on that plan. ``before_planning`` runs only when the answer is not cached, right
    before the search (a caller's cheap refusal, e.g. a tenant over its limits, that should not wait
    for planning)."""
    pspec = planner_spec(spec, api, model=model)
    key = "fit " + json.dumps(pspec, sort_keys=True)
    hit = _cached(key)
    if hit is None:
        if before_planning is not None:
            before_planning()
        hit = _once(key, lambda: _search_fit(spec, api, pspec, model), 4 * api.plan_timeout_s + 1)
    if not hit.ok:
        raise PlannerRefused(hit.loc, hit.msg)
    return recovery_choice(spec, api, hit.plan, model) if hit.plan is not None else None


def _cached(key: str) -> Any:
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
        return hit


def _once(key: str, search: Callable[[], Any], wait_s: float) -> Any:
    """The answer for ``key``, searched once however many requests ask at the same time; a
    follower waits up to ``wait_s`` for the leader's. Errors (busy, timed out) are not cached."""
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            return hit
        running = _INFLIGHT.get(key)
        leader = None
        if running is None:
            leader = _INFLIGHT[key] = concurrent.futures.Future()
    if leader is None:
        try:
            return running.result(timeout=wait_s)
        except concurrent.futures.TimeoutError:
            raise PlannerTimeout("the planner did not finish in time") from None
    hit = None
    try:
        hit = search()
    except BaseException as exc:
        leader.set_exception(exc)
        raise
    finally:
        with _CACHE_LOCK:
            _INFLIGHT.pop(key, None)
            if hit is not None:
                _CACHE[key] = hit
                while len(_CACHE) > _CACHE_SIZE:
                    _CACHE.popitem(last=False)
    leader.set_result(hit)
    return hit


def dry_run(spec: JobSpec, api: ApiSettings, top_k: int, model: dict[str, Any] | None = None,
            goodput: dict[str, Any] | None = None, note: str = "") -> PlanOut:
    """``POST /v1/plans`` and the dashboard's explain: the ranked plans for ``spec`` (any GPU count
    in min..max), cached by the planner's input and ``top_k``. ``goodput``/``note``: the event store's
    failure rates and recovery phases (:func:`planner_spec`) and what to say about them."""
    pspec = planner_spec(spec, api, model=model, goodput=goodput)
    key = f"dry {top_k} " + json.dumps(pspec, sort_keys=True)
    hit = _cached(key)
    if hit is None:
        hit = _once(key, lambda: _search_dry(spec, api, pspec, top_k), api.dryrun_timeout_s + _DRYRUN_SLOT_WAIT_S + 1)
    if isinstance(hit, FitResult):
        raise PlannerRefused(hit.loc, hit.msg)
    if note and hit.goodput is not None:
        hit = hit.model_copy(update={"goodput": {**hit.goodput, "note": note}})
    return hit.model_copy(update={"recovery": recovery_choice(spec, api, hit.plans[0], model)})


def _search_dry(spec: JobSpec, api: ApiSettings, pspec: dict[str, Any], top_k: int) -> PlanOut | FitResult:
    """A dry run's search (no cache): the plans, or the refusal (a :class:`FitResult`, cached too)."""
    try:
        result = _plan(pspec, top_k, api.dryrun_timeout_s, _DRYRUN_SLOT_WAIT_S)
    except PlannerTimeout as exc:
        raise PlannerRefused(("max_gpus",), f"{exc}; narrow min_gpus..max_gpus or give layout_hint") from None
    except PlannerRefused as exc:
        return FitResult(False, exc.loc, exc.msg)
    d = result.to_dict()
    gpus = max((p["layout"]["tp"] * p["layout"]["pp"] * p["layout"]["cp"] * p["layout"]["dp"]
                for p in d["plans"]), default=spec.max_gpus)
    if not d["plans"]:
        return FitResult(False, ("max_gpus",), _summary(result, spec, api))
    return PlanOut(gpus=gpus, plans=d["plans"][:top_k], rejected=d["rejected"][:50],
                   searched=int(d["searched"]), search_time_s=float(d["search_time_s"]), goodput=d.get("goodput"))
