"""``transformers``' Llama as an outside oracle: a random ``LlamaForCausalLM`` (GQA, rotary
``llama3`` scaling, tied and untied embeddings) saved with ``save_pretrained``, imported by every
rank reading only its slices, gives the same loss on the same windows as ``transformers`` (1e-4
relative) in one process and under TP (KV heads replicated at tp=4), PP, CP, FSDP and combinations
(the 4D layouts: tests/engine/test_equivalence_8ranks.py). Evaluation (``forward_loss``, what
``orthoplex eval`` and a job's ``val_loss`` run) gives the same loss with no backward pass and no
autograd graph under every one of these layouts."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from hf_fixtures import hf_window_loss, make_hf_llama, train_then_eval_loss

from planner.layout import Layout
from workers.engine.config import TrainConfig
from workers.engine.hf import HFCheckpoint, model_config_from_hf, read_hf_config
from workers.engine.launch import run_ranks

pytestmark = pytest.mark.timeout(1800)

SEQ = 64
SPECS = ["tp=4", "cp=4", "pp=4", "tp=2,cp=2", "tp=2,dp=2,zero=3", "pp=2,cp=2", "tp=2,pp=2"]
EXPORT_SPECS = ["tp=2,dp=2,zero=3", "tp=2,pp=2"]  # FSDP's strided shards; stages writing their own files


def _windows(n: int) -> torch.Tensor:
    """``n`` windows of real text (this file's own bytes), each S inputs and their S next tokens."""
    data = torch.tensor(list(Path(__file__).read_bytes()), dtype=torch.long)
    return torch.stack([data[i * SEQ:i * SEQ + SEQ + 1] for i in range(n)])


def _check_reads_only_its_slices(trainer: object, path: str, spec: str) -> None:
    """The elements this rank fetched from the checkpoint are its local shards' (a loader that read
    whole tensors and cut them in memory would count far more), plus at most two partly held heads
    per q/k slice (fetched whole for the rotary permutation, as under FSDP inside TP); fewer than
    the checkpoint holds wherever the layout splits parameters, all of it where it does not."""
    from torch.distributed.tensor import DTensor

    from workers.engine.hf.weights import is_rotary, local_ranges

    ckpt = HFCheckpoint(path)
    total = sum(math.prod(ckpt.shapes[name]) for name in ckpt.where)
    local = slack = 0
    for name, p in trainer.parts.named_parameters():
        local += (p.to_local() if isinstance(p, DTensor) else p).numel()
        if is_rotary(name):
            c0, c1 = local_ranges(p)[1]
            slack += 2 * trainer.cfg.model.head_dim * (c1 - c0)
    read = trainer.parts.hf_elements_read
    assert local <= read <= local + slack, (spec, read, local, slack)
    layout = Layout.parse(spec)
    splits = layout.tp > 1 or layout.pp > 1 or layout.zero == 3
    assert (read < total) if splits else (read == total), (spec, read, total)


def _oracle_body(rank: int, world: int, cases: list[tuple[str, dict]], specs: list[str],
                 batch: torch.Tensor, export: dict[str, str]) -> list[tuple[str, str, float]]:
    """Every (checkpoint, layout): import, loss of ``batch``; for the layouts in ``export`` also an
    export of the untouched weights (no optimizer step ran) to ``export[spec]/<checkpoint>``.
    Each layout also evaluates ``batch`` forward only (``forward_loss``) with backward passes made
    to raise: it must give the training path's loss with no module run under autograd."""
    from workers.engine.trainer import RankTrainer

    torch.set_num_threads(1)
    out = []
    for path, cfg_dict in cases:
        cfg = TrainConfig.from_dict(cfg_dict)
        for spec in specs:
            trainer = RankTrainer(cfg, Layout.parse(spec).with_global_batch(cfg.global_batch), rank, world)
            try:
                _check_reads_only_its_slices(trainer, path, spec)
                loss, evaluated = train_then_eval_loss(trainer, batch)
                assert abs(evaluated - loss) <= 1e-6 * loss, (spec, evaluated, loss)
                out.append((path, spec, loss))
                if spec in export:
                    trainer.export_hf(str(Path(export[spec]) / Path(path).name))
            finally:
                trainer.close()
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {"untied": make_hf_llama(root / "untied", tied=False, seed=1, shard_size="100KB"),
            "tied": make_hf_llama(root / "tied", tied=True, seed=2)}


def _train_cfg(path: Path) -> TrainConfig:
    model = model_config_from_hf(read_hf_config(path), seq_len=SEQ, name=path.name)
    return TrainConfig(model=dataclasses.replace(model, hf=str(path)), steps=1, global_batch=8)


@pytest.mark.engine
def test_checkpoints_cover_sharding_tying_and_llama3_rope(checkpoints: dict[str, Path]) -> None:
    untied, tied = checkpoints["untied"], checkpoints["tied"]
    assert (untied / "model.safetensors.index.json").is_file()  # sharded with its index
    assert len(list(untied.glob("*.safetensors"))) > 1
    assert "lm_head.weight" not in HFCheckpoint(tied)
    for p in (untied, tied):
        cfg = _train_cfg(p).model
        assert cfg.rope_scaling_factor == 8.0 and cfg.kv_heads == 2
        assert cfg.tie_embeddings == (p == tied)


@pytest.mark.engine
def test_import_matches_transformers_and_export_round_trips(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    batch = _windows(8)
    expected = {str(p): hf_window_loss(p, batch) for p in checkpoints.values()}
    for v in expected.values():  # far from uniform logits: the comparison has teeth
        assert abs(v - torch.log(torch.tensor(256.0)).item()) > 0.05, v
    cases = [(str(p), _train_cfg(p).to_dict()) for p in checkpoints.values()]
    exports = {spec: str(tmp_path / spec.replace(",", "_").replace("=", "")) for spec in EXPORT_SPECS}
    single = run_ranks(_oracle_body, 1, cases, ["tp=1"], batch, {})[0]
    parallel = run_ranks(_oracle_body, 4, cases, SPECS, batch, exports, timeout_s=1500)
    rows = single + parallel[0]
    for rank_rows in parallel[1:]:  # the loss is identical on every rank
        assert [r[2] for r in rank_rows] == [r[2] for r in parallel[0]]
    for path, spec, loss in rows:
        rel = abs(loss - expected[path]) / expected[path]
        print(f"{Path(path).name:<7} {spec:<18} orthoplex {loss:.6f} transformers {expected[path]:.6f} rel {rel:.1e}")
        assert rel < 1e-4, (path, spec, loss, expected[path])
    assert len(rows) == 2 * (1 + len(SPECS))
    # import, then export with no training: bit-identical tensors (tied: embed_tokens only, with
    # tie_word_embeddings true, as transformers writes it), a directory transformers loads, and the
    # same loss from it
    from safetensors import safe_open

    for spec, root in exports.items():
        for src in checkpoints.values():
            out = Path(root) / src.name
            assert (out / "model.safetensors.index.json").is_file() and (out / "config.json").is_file()
            ours = HFCheckpoint(out)
            orig = HFCheckpoint(src)
            for name in orig.where:
                with safe_open(str(src / orig.where[name]), "pt") as f:
                    a = f.get_tensor(name)
                with safe_open(str(out / ours.where[name]), "pt") as f:
                    b = f.get_tensor(name)
                assert a.dtype == b.dtype and torch.equal(a, b), (spec, src.name, name)
            assert set(ours.where) == set(orig.where)
            assert read_hf_config(out)["tie_word_embeddings"] == (src.name == "tied")
            rel = abs(hf_window_loss(out, batch) - expected[str(src)]) / expected[str(src)]
            assert rel < 1e-6, (spec, src.name, rel)
