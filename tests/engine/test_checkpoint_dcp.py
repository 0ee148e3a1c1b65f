"""DCP checkpoints: single-process round trips, torn/corrupt fallback with real DCP files, and resharding
across layouts with spawned gloo ranks (TP=2 save -> 1 process and FSDP2 dp=2 x TP=2 loads, exact)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # when run as the writer script
    sys.path.insert(0, str(REPO))

from workers.engine.checkpoint import (  # noqa: E402
    Checkpointer,
    ModelOptimizerState,
    find_latest_verified,
    load_latest,
    save_checkpoint,
)


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.w1 = nn.Linear(16, 32)
        self.w2 = nn.Linear(32, 16)
        self.out = nn.Linear(16, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.w2(torch.relu(self.w1(self.emb(x)))))


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 32, (4, 6), generator=g)
        y = torch.randint(0, 8, (4, 6), generator=g)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()


def _full(t: Any) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()  # never alias live state


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    """Full (unsharded) params and AdamW state by FQN (collective for DTensors)."""
    out = {}
    for name, p in model.named_parameters():
        st = opt.state[p]
        out[name] = {"param": _full(p), "exp_avg": _full(st["exp_avg"]), "exp_avg_sq": _full(st["exp_avg_sq"]),
                     "step": _full(st["step"])}
    return out


def _assert_exact(got: dict, ref: dict) -> None:
    assert sorted(got) == sorted(ref)
    for name in ref:
        for key in ref[name]:
            assert torch.equal(got[name][key], ref[name][key]), (name, key)


def _fresh() -> tuple[Toy, torch.optim.Optimizer]:
    torch.manual_seed(123)  # different from the saved weights
    m = Toy()
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


# ---------------------------------------------------------------- single process


@pytest.mark.unit
def test_round_trip_and_pipeline_parts(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Toy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt, 2)
    ref = _snapshot(model, opt)
    info = save_checkpoint(tmp_path, 2, ModelOptimizerState(model, opt, extra={"step": 2, "sampler": {"step": 2}}),
                           manifest_extra={"layout": {"tp": 1, "pp": 1}, "data": {"step": 2}, "run": "x"})
    assert info.committed and info.bytes > 0 and info.path.endswith("step-00000002")

    m1, o1 = _fresh()
    st = ModelOptimizerState(m1, o1)
    res = load_latest(tmp_path, st)
    assert res is not None and res.step == 2 and res.skipped == []
    assert res.manifest.layout == {"tp": 1, "pp": 1} and res.manifest.data == {"step": 2}
    assert res.manifest.extra == {"run": "x"} and "torch" in res.manifest.rng
    assert st.extra == {"step": 2, "sampler": {"step": 2}}
    _assert_exact(_snapshot(m1, o1), ref)

    # the same state split into two "pipeline stages" with an optimizer each, saved, loaded whole
    m2, _ = _fresh()
    part_a, part_b = nn.Module(), nn.Module()
    part_a.emb, part_a.w1 = m2.emb, m2.w1
    part_b.w2, part_b.out = m2.w2, m2.out
    opts = [torch.optim.AdamW(part_a.parameters(), lr=1e-2), torch.optim.AdamW(part_b.parameters(), lr=1e-2)]
    assert load_latest(tmp_path, ModelOptimizerState([part_a, part_b], opts)).step == 2
    staged = {**_snapshot(part_a, opts[0]), **_snapshot(part_b, opts[1])}
    _assert_exact(staged, ref)
    save_checkpoint(tmp_path, 3, ModelOptimizerState([part_a, part_b], opts))
    m3, o3 = _fresh()
    assert load_latest(tmp_path, ModelOptimizerState(m3, o3)).step == 3
    _assert_exact(_snapshot(m3, o3), ref)
    # one optimizer over both stages (virtual stages on one rank), each stage with its own
    # parameter-less helper of the same name (like the engine's rotary tables)
    m4, _ = _fresh()
    pa, pb = nn.Module(), nn.Module()
    pa.emb, pa.w1, pb.w2, pb.out = m4.emb, m4.w1, m4.w2, m4.out
    pa.rope, pb.rope = nn.Identity(), nn.Identity()
    o4 = torch.optim.AdamW(m4.parameters(), lr=1e-2)
    assert load_latest(tmp_path, ModelOptimizerState([pa, pb], o4)).step == 3
    _assert_exact(_snapshot(m4, o4), ref)
    with pytest.raises(ValueError, match="2 optimizers for 3 model parts"):
        ModelOptimizerState([pa, pb, nn.Linear(2, 2)], opts)
    pc = nn.Module()
    pc.w2 = nn.Linear(32, 16)
    with pytest.raises(ValueError, match="'w2' with parameters"):
        ModelOptimizerState([pb, pc], o4)


@pytest.mark.unit
def test_corrupt_dcp_shard_falls_back(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Toy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt, 1)
    ref = _snapshot(model, opt)
    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save(1, ModelOptimizerState(model, opt))
    _train(model, opt, 1)
    ckpt.save(2, ModelOptimizerState(model, opt))
    shard = tmp_path / "step-00000002" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x40
    shard.write_bytes(bytes(data))
    m1, o1 = _fresh()
    res = ckpt.load_latest(ModelOptimizerState(m1, o1))
    assert res is not None and res.step == 1
    assert res.skipped == [(str(tmp_path / "step-00000002"), "sha256 of __0_0.distcp does not match the manifest "
                                                             "(corrupted)")]
    _assert_exact(_snapshot(m1, o1), ref)


@pytest.mark.unit
def test_writer_killed_after_dcp_write(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, __file__, "kill", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    (torn,) = list(tmp_path.glob("step-00000002.tmp-*"))
    assert (torn / ".metadata").is_file() and not (torn / "manifest.json").exists()  # DCP finished, no commit
    m1, o1 = _fresh()
    res = load_latest(tmp_path, ModelOptimizerState(m1, o1))
    assert res is not None and res.step == 1
    assert [p for p, _ in res.skipped] == [str(torn)] and "uncommitted" in res.skipped[0][1]
    torch.manual_seed(0)
    model = Toy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt, 1)
    _assert_exact(_snapshot(m1, o1), _snapshot(model, opt))


def _kill_writer(root: str) -> None:
    torch.manual_seed(0)
    model = Toy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt, 1)
    save_checkpoint(root, 1, ModelOptimizerState(model, opt))
    _train(model, opt, 1)

    def fault(point: str) -> None:
        if point == "dcp:written":
            os.kill(os.getpid(), signal.SIGKILL)

    save_checkpoint(root, 2, ModelOptimizerState(model, opt), _fault=fault)


# ---------------------------------------------------------------- resharding across processes


def _init(rank: int, world: int, init_file: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=180))


def _save_tp2(rank: int, root: str, init_file: str, ref_file: str) -> None:
    import time

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _init(rank, 2, init_file)
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        torch.manual_seed(0)
        model = parallelize_module(Toy(), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train(model, opt, 2)
        ckpt = Checkpointer(root, rank=rank, world_size=2, keep=2, async_save=True)
        state = ModelOptimizerState(model, opt, extra={"step": 2})
        sync = ckpt.save(2, state, manifest_extra={"layout": {"tp": 2}})
        _train(model, opt, 1)
        state.extra = {"step": 3}
        t0 = time.perf_counter()
        pending = ckpt.save(3, state, manifest_extra={"layout": {"tp": 2}}, async_save=True)
        assert not pending.committed and time.perf_counter() - t0 < 30
        ref = _snapshot(model, opt)  # taken before the async write is known to be done
        _train(model, opt, 1)  # training goes on while the background thread writes step 3
        done = pending.wait()
        assert done.committed and done.step == 3 and done.bytes > 0 and sync.committed
        if rank == 0:
            torch.save(ref, ref_file)
        ckpt.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _load_fsdp_tp(rank: int, root: str, init_file: str, ref_file: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _init(rank, 4, init_file)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(123)
        model = parallelize_module(Toy(), mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        state = ModelOptimizerState(model, opt)
        res = load_latest(root, state)
        assert res is not None and res.step == 3 and state.extra == {"step": 3}
        assert res.manifest.layout == {"tp": 2} and res.manifest.world_size == 2
        got = _snapshot(model, opt)
        if rank == 0:
            _assert_exact(got, torch.load(ref_file))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.engine
@pytest.mark.timeout(900)  # 6 spawned ranks: about 30 s on an idle 2-core machine, far more when it is shared
def test_reshard_tp2_to_single_process_and_fsdp_tp(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    root, ref_file = str(tmp_path / "ckpt"), str(tmp_path / "ref.pt")
    mp.start_processes(_save_tp2, args=(root, str(tmp_path / "pg1"), ref_file), nprocs=2, start_method="spawn")
    rec, skipped = find_latest_verified(root)
    assert rec is not None and rec.step == 3 and skipped == []
    assert sorted(rec.manifest.files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    ref = torch.load(ref_file)

    m1, o1 = _fresh()  # TP=2 -> one process, no process group
    res = load_latest(root, ModelOptimizerState(m1, o1))
    assert res is not None and res.step == 3
    _assert_exact(_snapshot(m1, o1), ref)

    # TP=2 -> FSDP2 dp=2 x TP=2 on 4 ranks
    mp.start_processes(_load_fsdp_tp, args=(root, str(tmp_path / "pg2"), ref_file), nprocs=4, start_method="spawn")


if __name__ == "__main__":
    assert sys.argv[1] == "kill"
    _kill_writer(sys.argv[2])
    sys.exit(3)
