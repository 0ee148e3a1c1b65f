"""The job-file reference of ``docs/getting-started.md``, generated from the API's own schema.

``python -m service.api.jobspec_reference`` prints the Markdown table: every field of a job file
(nested ones as ``data.paths``), its type, default, limits and meaning. A test checks that the guide
holds exactly this text, so the reference cannot drift from what ``POST /v1/jobs`` accepts. Meanings
come from the schema's ``description`` where it has one, else from :data:`MEANINGS`.
"""

from __future__ import annotations

import json
from typing import Any

#: What a field means, for fields whose schema has no description (keyed by dotted path).
MEANINGS: dict[str, str] = {
    "name": "a label for the job (letters, digits, `._-` and spaces)",
    "steps": "optimizer steps to train",
    "global_batch": "sequences per optimizer step, over all data-parallel ranks",
    "min_gpus": "the fewest GPUs the job may start or keep running on",
    "max_gpus": "the most GPUs the job may use",
    "preemptible": "may be stopped (after a checkpoint) to give borrowed GPUs back; `false`: runs only within quota",
    "seed": "random seed of the weights and the data order",
    "lr": "peak learning rate (AdamW)",
    "min_lr": "learning rate at the end of the cosine decay",
    "warmup_steps": "linear warm-up steps",
    "weight_decay": "AdamW weight decay",
    "grad_clip": "clip the global gradient norm to this (0: off)",
    "keep_checkpoints": "verified checkpoints kept on storage",
    "data": "where the tokens come from (default: the built-in corpus)",
    "data.kind": "`builtin` corpus, `text` files (byte tokens; with `tokenizer`: `.txt`/`.md`, `.jsonl` with a "
                 "`text` field, `.parquet` with a `text` column) or `tokens` memmaps",
    "data.paths": "files to read (see the data section above)",
    "data.dtype": "element type of `tokens` files",
    "eval_data.kind": "as `data.kind` (not `builtin`)",
    "eval_data.paths": "held-out files in your data area (the same rules as `data.paths`)",
    "eval_data.dtype": "element type of `tokens` files",
    "export": "write the final weights for use outside Orthoplex (listed in the job's artifacts)",
    "tracking": "MLflow logging of the job's metrics",
    "tracking.experiment": "the MLflow experiment the job's run goes into",
    "checkpoint": "checkpoint cadence",
    "checkpoint.min_every_steps": "checkpoint at most this often",
    "checkpoint.max_every_steps": "checkpoint at least this often",
    "checkpoint.mtbf_s": "expected seconds between failures (Young's interval uses it)",
    "layout_hint": "parallel layout fields fixed in the first plan; the planner picks the rest",
    "layout_hint.tp": "tensor-parallel degree",
    "layout_hint.pp": "pipeline-parallel degree",
    "layout_hint.cp": "context-parallel degree",
    "layout_hint.dp": "data-parallel degree",
    "layout_hint.dp_replicate": "replica groups inside dp (HSDP): ZeRO shards inside a group, plain replication across groups; must divide dp",
    "layout_hint.vpp": "virtual pipeline stages per rank (interleaved schedule)",
    "layout_hint.micro_batch": "sequences per micro-batch",
    "layout_hint.sp": "sequence parallelism with TP",
    "layout_hint.zero": "ZeRO stage: 0 replicate, 1 shard the optimizer, 3 shard everything (FSDP)",
    "layout_hint.recompute": "activation recomputation: none, selective, op, layer:N (N >= 2), full (aliases layer, selective_op, selective_layer); the engine runs them all",
    "layout_hint.schedule": "pipeline schedule",
    "layout_hint.cp_method": "context-parallel attention: `ring` or `ulysses` (all-to-all)",
    "recovery.snapshots": "in-memory snapshots of every rank's state, so a re-plan restores from memory, not storage",
    "model.name": "a label for the shape",
    "model.layers": "decoder layers",
    "model.hidden": "hidden size",
    "model.heads": "attention heads",
    "model.kv_heads": "key/value heads (GQA when fewer than `heads`)",
    "model.ffn": "feed-forward (SwiGLU) inner size",
    "model.vocab": "vocabulary size",
    "model.seq_len": "tokens per sequence",
    "model.rope_theta": "rotary embedding base",
}


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref:
        return schema["$defs"][ref.rsplit("/", 1)[-1]]
    return node


def _variants(schema: dict[str, Any], prop: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of a property (``anyOf``/``oneOf``), resolved."""
    alts = prop.get("anyOf") or prop.get("oneOf")
    if not alts:
        return [_resolve(schema, prop)]
    return [_resolve(schema, a) for a in alts if a.get("type") != "null"]


def _type(v: dict[str, Any]) -> str:
    if "enum" in v:
        return " \\| ".join(f"`{json.dumps(e)}`" for e in v["enum"])
    if v.get("type") == "array":
        return f"list of {_type(v.get('items', {}))}"
    if v.get("type") == "object" or "properties" in v:
        return "object"
    return v.get("type", "any")


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _limits(v: dict[str, Any]) -> str:
    out = []
    if "minimum" in v:
        out.append(f"≥ {_num(v['minimum'])}")
    if "exclusiveMinimum" in v:
        out.append(f"> {_num(v['exclusiveMinimum'])}")
    if "maximum" in v:
        out.append(f"≤ {_num(v['maximum'])}")
    if "maxLength" in v:
        out.append(f"≤ {v['maxLength']} characters")
    if "maxItems" in v:
        out.append(f"≤ {v['maxItems']} items")
    if v.get("type") == "array":
        inner = _limits(v.get("items", {}))
        if inner:
            out.append(f"each {inner}")
    return ", ".join(out)


def _engine_defaults() -> dict[str, Any]:
    """The engine's own defaults (``TrainConfig``) for fields a job file may leave out."""
    import dataclasses

    from workers.engine.config import TrainConfig

    return {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}


def _default(path: str, prop: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if prop.get("default") is not None:
        return f"`{json.dumps(prop['default'])}`"
    engine = _engine_defaults()
    if path in engine and engine[path] is not None:
        return f"`{json.dumps(engine[path])}` (engine)"
    return "unset"


def rows() -> list[tuple[str, str, str, str, str]]:
    """``(field, type, default, limits, meaning)`` for every field of a job file, nested ones dotted."""
    from service.api.schemas import JobSpec

    schema = JobSpec.model_json_schema()
    out: list[tuple[str, str, str, str, str]] = []
    seen: set[str] = set()

    def walk(obj: dict[str, Any], prefix: str) -> None:
        required = set(obj.get("required", []))
        hf = "hf" in obj.get("properties", {}) and prefix == "model."
        for name, prop in obj.get("properties", {}).items():
            path = f"{prefix}{name}"
            if hf and path in seen:  # the same name in the {"hf": DIR} form of model
                path = f"{path} (with model.hf)"
            seen.add(path)
            variants = _variants(schema, prop)
            meaning = prop.get("description") or MEANINGS.get(path, "")
            objects = [v for v in variants if "properties" in v]
            if path == "model":
                preset = next((v for v in variants if "enum" in v), None)
                kinds = f"preset name ({_type(preset)}) or object" if preset else "object"
                out.append((path, kinds, _default(path, prop, name in required), "", meaning))
                for v in objects:
                    walk(v, f"{path}.")
                continue
            types = " or ".join(_type(v) for v in variants)
            limits = "; ".join(x for x in (_limits(v) for v in variants) if x)
            out.append((path, types, _default(path, prop, name in required), limits, meaning))
            for v in objects:
                walk(v, f"{path}.")

    walk(schema, "")
    return out


def markdown() -> str:
    lines = ["| field | type | default | limits | meaning |", "|---|---|---|---|---|"]
    for field, typ, default, limits, meaning in rows():
        lines.append(f"| `{field}` | {typ} | {default} | {limits} | {meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - a maintenance command
    print(markdown(), end="")
