"""Tied embeddings (``tie_word_embeddings: true``) stay one parameter, as in ``transformers``: an
imported tied ``LlamaForCausalLM`` trains with the single-process loss curve under TP, PP (the
first and last stages' copies summed and kept equal) and FSDP; a checkpoint written under PP
resumes under TP (and back) on the uninterrupted curve; the export has ``embed_tokens`` only, with
``tie_word_embeddings: true``, and ``transformers`` gives it the trainer's loss. Two ranks at most."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hf_fixtures import hf_window_loss, make_hf_llama

from planner.layout import Layout
from workers.engine.config import TrainConfig
from workers.engine.hf import HFCheckpoint, model_config_from_hf, read_hf_config
from workers.engine.launch import run_ranks

pytestmark = pytest.mark.timeout(900)
SEQ = 64
STEPS = 3
LAYOUTS = ["tp=2", "pp=2", "dp=2,zero=3"]


def _batch() -> torch.Tensor:
    data = torch.tensor(list(Path(__file__).read_bytes()), dtype=torch.long)
    return torch.stack([data[i * SEQ:i * SEQ + SEQ + 1] for i in range(8)])


def _train(rank: int, world: int, cfg_dict: dict, batch: torch.Tensor, specs: list[str], out: str
           ) -> list[tuple[str, list[float], float, bool]]:
    """Per layout: the losses of STEPS steps on ``batch``, the forward-only loss after them, whether
    the embedding and the head are one parameter here; then an export to ``out/<layout>``."""
    from workers.engine.trainer import RankTrainer

    torch.set_num_threads(1)
    cfg = TrainConfig.from_dict(cfg_dict)
    rows = []
    for spec in specs:
        t = RankTrainer(cfg, Layout.parse(spec).with_global_batch(cfg.global_batch), rank, world)
        try:
            m = t.parts.modules[0]
            one = m.tok_embeddings is not None and m.output is not None and m.output.weight is m.tok_embeddings.weight
            losses = [t.train_batch(batch).loss for _ in range(STEPS)]
            after = t.forward_loss(batch)
            t.export_hf(str(Path(out) / spec.replace(",", "_").replace("=", "")))
            rows.append((spec, losses, after, one))
        finally:
            t.close()
    return rows


def _resume(rank: int, world: int, cfg_dict: dict, batch: torch.Tensor, a: str, b: str, ck: str) -> list[float]:
    """Two steps under ``a``, a checkpoint in ``ck``, then the third step under ``b`` from it."""
    from workers.engine.trainer import RankTrainer

    cfg = TrainConfig.from_dict({**cfg_dict, "checkpoint_dir": ck})
    t = RankTrainer(cfg, Layout.parse(a).with_global_batch(cfg.global_batch), rank, world)
    losses = [t.train_batch(batch).loss for _ in range(STEPS - 1)]
    t.save()
    t.close()
    t = RankTrainer(cfg, Layout.parse(b).with_global_batch(cfg.global_batch), rank, world)
    try:
        t.next_step = t.restore()
        losses.append(t.train_batch(batch).loss)
        return losses
    finally:
        t.close()


def _two_ranks(rank: int, world: int, cfg_dict: dict, batch: torch.Tensor, out: str, ck: str) -> dict:
    """One spawned pair for everything: the layouts, then resharding both ways (PP -> TP, TP -> PP)."""
    rows = _train(rank, world, cfg_dict, batch, LAYOUTS, out)
    resumed = {f"{a}->{b}": _resume(rank, world, cfg_dict, batch, a, b, f"{ck}/{i}")
               for i, (a, b) in enumerate((("pp=2", "tp=2"), ("tp=2", "pp=2")))}
    return {"rows": rows, "resumed": resumed}


@pytest.mark.engine
def test_tied_embeddings_train_export_and_reshard_under_tp_and_pp(tmp_path: Path) -> None:
    hf = make_hf_llama(tmp_path / "tied", tied=True, seed=3, layers=2)
    mc = model_config_from_hf(read_hf_config(hf), SEQ, name="tied")
    assert mc.tie_embeddings and mc.num_params() == sum(
        t.numel() for t in (torch.empty(HFCheckpoint(hf).shapes[n]) for n in HFCheckpoint(hf).where))
    cfg = TrainConfig(model=dataclasses.replace(mc, hf=str(hf)), steps=STEPS, global_batch=8, warmup_steps=1, lr=1e-2)
    batch = _batch()
    out = tmp_path / "exports"
    (single,) = run_ranks(_train, 1, cfg.to_dict(), batch, ["tp=1"], str(out))[0]
    _, ref, ref_after, one = single
    assert one  # one parameter in one process
    assert abs(ref[0] - hf_window_loss(hf, batch)) / ref[0] < 1e-5  # the import, before any step
    assert ref[-1] < ref[0] - 0.5  # training moved the weights
    per_rank = run_ranks(_two_ranks, 2, cfg.to_dict(), batch, str(out), str(tmp_path / "ck"), timeout_s=800)
    for rank, res in enumerate(per_rank):
        for spec, losses, after, one in res["rows"]:
            rel = max(abs(a - b) / b for a, b in zip([*losses, after], [*ref, ref_after], strict=True))
            assert rel < 1e-5, (spec, rank, losses, ref)
            # one parameter where a rank holds both (not on a pipeline stage holding only one of them)
            assert one == (spec != "pp=2"), (spec, rank)
    for spec in ["tp=1", *LAYOUTS]:
        d = out / spec.replace(",", "_").replace("=", "")
        assert json.loads((d / "config.json").read_text())["tie_word_embeddings"] is True
        names = set(HFCheckpoint(d).where)
        assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names, spec
        theirs = hf_window_loss(d, batch)
        assert abs(theirs - ref_after) / ref_after < 1e-5, (spec, theirs, ref_after)
    # resharding: the optimizer state of the last stage's copy is the embedding's, both ways
    for pair, losses in per_rank[0]["resumed"].items():
        assert max(abs(x - y) / y for x, y in zip(losses, ref, strict=True)) < 1e-5, (pair, losses, ref)
