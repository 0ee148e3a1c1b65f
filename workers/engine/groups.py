"""Process groups of one layout, built from the Layout's rank grid, with a timeout on every group.

One :class:`ParallelGroups` object owns every sub-group a trainer uses; nothing is stored in module
globals, so a process can ``close()`` one and build another for a different layout.

The groups live in a 4-D :class:`~torch.distributed.device_mesh.DeviceMesh` whose mesh tensor is
the Layout's rank grid indexed ``[pp, dp, cp, tp]`` (Megatron order: tp fastest). The DTensor
pieces (TP/SP, FSDP2) need a DeviceMesh; the flattened ``dp_cp`` dimension is the group that
reduces gradients of parameters replicated over DP *and* CP. Every dimension, including the
flattened one, is created with explicit backend options carrying the timeout: the default-group
timeout given to ``init_process_group`` does not reach sub-groups (docs/feasibility.md §1).

Replica groups (``layout.dp_replicate = R > 1``, HSDP): the mesh is 5-D, ``[pp, dp_replicate,
dp_shard, cp, tp]`` (the dp index is ``shard_i + dp_shard * replica_i``, so this is a reshape of
the same grid), with three flattened dimensions: ``dp`` (replicate x shard), ``dp_cp`` (the whole
data-parallel group, as before) and ``dp_shard_cp`` (one replica group's ZeRO shard group). ZeRO
shards over ``dp_shard_cp``; gradients of the shards are all-reduced over ``dp_replicate``. With
``R = 1`` the mesh is the 4-D one and ``dp_shard_cp`` is ``dp_cp``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from planner.layout import Layout

MESH_DIMS: tuple[str, ...] = ("pp", "dp", "cp", "tp")
HSDP_MESH_DIMS: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def backend_options(backend: str, timeout_s: float) -> tuple[str, Any]:
    """``(backend, options)`` with the timeout set, for ``backend_override``."""
    td = timedelta(seconds=timeout_s)
    if backend == "nccl":
        opts: Any = dist.ProcessGroupNCCL.Options()
    else:
        opts = dist.ProcessGroupGloo._Options()
    opts._timeout = td
    return backend, opts


def rank_grid(layout: Layout) -> torch.Tensor:
    """The Layout's ranks as an int tensor indexed ``[pp, dp, cp, tp]``."""
    grid = torch.empty(layout.pp, layout.dp, layout.cp, layout.tp, dtype=torch.int)
    for r in range(layout.world_size):
        c = layout.coords(r)
        grid[c.pp, c.dp, c.cp, c.tp] = r
    return grid


class ParallelGroups:
    """Every process group of one rank under one layout (plus its coordinates)."""

    def __init__(self, layout: Layout, rank: int, world_size: int, timeout_s: float = 60.0) -> None:
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized; call init_process_group first")
        if layout.world_size != world_size:
            raise ValueError(f"layout {layout.short()} needs {layout.world_size} ranks, world has {world_size}")
        if dist.get_rank() != rank:
            raise ValueError(f"rank {rank} does not match the process group rank {dist.get_rank()}")
        self.layout = layout
        self.rank = rank
        self.world_size = world_size
        self.timeout = timedelta(seconds=timeout_s)
        self.backend = dist.get_backend()
        self.device_type = "cuda" if self.backend == "nccl" else "cpu"
        self.coords = layout.coords(rank)
        override = backend_options(self.backend, timeout_s)
        # DTensor caches sharding decisions keyed by meshes, and meshes compare equal when their
        # ranks and dimension names do: a suffix unique to this mesh (the number of groups created
        # so far, identical on every rank) keeps a rebuilt trainer off the destroyed groups.
        self.tag = f"@{dist.distributed_c10d._world.group_count}"
        self.replicated = layout.dp_replicate > 1
        if not self.replicated:
            self.mesh = DeviceMesh(self.device_type, rank_grid(layout),
                                   mesh_dim_names=tuple(d + self.tag for d in MESH_DIMS),
                                   backend_override=(override,) * len(MESH_DIMS))
            self.dp_mesh = self.mesh[self._n("dp")]
            self.dp_cp_mesh = self.mesh[self._n("dp"), self._n("cp")]._flatten(self._n("dp_cp"),
                                                                              backend_override=override)
            self.dp_shard_cp_mesh = self.dp_cp_mesh
        else:
            grid = rank_grid(layout).reshape(layout.pp, layout.dp_replicate, layout.dp_shard, layout.cp, layout.tp)
            self.mesh = DeviceMesh(self.device_type, grid,
                                   mesh_dim_names=tuple(d + self.tag for d in HSDP_MESH_DIMS),
                                   backend_override=(override,) * len(HSDP_MESH_DIMS))
            rep, shard, cp = self._n("dp_replicate"), self._n("dp_shard"), self._n("cp")
            self.dp_mesh = self.mesh[rep, shard]._flatten(self._n("dp"), backend_override=override)
            self.dp_cp_mesh = self.mesh[rep, shard, cp]._flatten(self._n("dp_cp"), backend_override=override)
            self.dp_shard_cp_mesh = self.mesh[shard, cp]._flatten(self._n("dp_shard_cp"),
                                                                  backend_override=override)
        self._check_against_layout()
        self._embedding: dist.ProcessGroup | None = None
        self._embedding_made = False
        self._closed = False

    def _check_against_layout(self) -> None:
        # The mesh groups must be exactly the Layout's groups (guards the rank-order contract).
        lay = self.layout
        checks = [(("tp",), self.tp_mesh, lay.group_of(self.rank, "tp")),
                  (("cp",), self.cp_mesh, lay.group_of(self.rank, "cp")),
                  (("pp",), self.pp_mesh, lay.group_of(self.rank, "pp")),
                  (("dp",), self.dp_mesh, lay.group_of(self.rank, "dp")),
                  (("dp", "cp"), self.dp_cp_mesh, lay.group_of(self.rank, "dp", "cp")),
                  (("dp_shard", "cp"), self.dp_shard_cp_mesh,
                   next(g for g in lay.shard_groups() if self.rank in g))]
        if self.replicated:
            checks.append((("dp_replicate",), self.mesh[self._n("dp_replicate")],
                           next(g for g in lay.replicate_groups() if self.rank in g)))
        for dims, mesh, expected in checks:
            got = sorted(int(r) for r in mesh.mesh.flatten().tolist())
            if got != expected:
                raise RuntimeError(f"mesh group {dims} = {got} differs from the layout's {expected}")

    # ------------------------------------------------------------------ meshes and groups
    def _n(self, dim: str) -> str:
        return dim + self.tag

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.mesh[self._n("tp")]

    @property
    def cp_mesh(self) -> DeviceMesh:
        return self.mesh[self._n("cp")]

    @property
    def pp_mesh(self) -> DeviceMesh:
        return self.mesh[self._n("pp")]

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """FSDP2's mesh: ``dp_cp`` (1-D, plain FSDP), or ``(dp_replicate, dp_shard_cp)`` (2-D: HSDP)."""
        if self.replicated:
            return self.mesh[self._n("dp_replicate"), self._n("dp_shard_cp")]
        return self.dp_cp_mesh

    @property
    def tp(self) -> dist.ProcessGroup:
        return self.mesh.get_group(self._n("tp"))

    @property
    def cp(self) -> dist.ProcessGroup:
        return self.mesh.get_group(self._n("cp"))

    @property
    def dp(self) -> dist.ProcessGroup:
        return self.dp_mesh.get_group()

    @property
    def pp(self) -> dist.ProcessGroup:
        return self.mesh.get_group(self._n("pp"))

    @property
    def dp_cp(self) -> dist.ProcessGroup:
        return self.dp_cp_mesh.get_group()

    @property
    def dp_shard_cp(self) -> dist.ProcessGroup:
        """The ZeRO shard group: ``dp_cp`` itself without replica groups, else one replica's share."""
        return self.dp_shard_cp_mesh.get_group()

    @property
    def dp_replicate(self) -> dist.ProcessGroup | None:
        """The gradient all-reduce group across replica groups (None without replica groups)."""
        return self.mesh.get_group(self._n("dp_replicate")) if self.replicated else None

    def global_rank(self, dim: str, index: int) -> int:
        """Global rank of the peer at ``index`` along ``dim``, other coordinates equal to ours."""
        c = self.coords
        kw = {"pp": c.pp, "dp": c.dp, "cp": c.cp, "tp": c.tp}
        kw[dim] = index
        return self.layout.rank_of(**kw)

    def embedding_group(self) -> dist.ProcessGroup | None:
        """The first and the last pipeline rank with our other coordinates (tied embeddings: the two
        stages holding the shared weight sum its gradient here); None on a middle pipeline rank.
        Collective: every rank calls it (``pp > 1``); all pairs are created, in one order, everywhere."""
        if not self._embedding_made:
            self._embedding_made = True
            if self.layout.pp < 2:
                raise ValueError("embedding_group: needs pp > 1")
            _, opts = backend_options(self.backend, self.timeout.total_seconds())
            c = self.coords
            for dp in range(self.layout.dp):
                for cp in range(self.layout.cp):
                    for tp in range(self.layout.tp):
                        ranks = [self.layout.rank_of(pp=0, dp=dp, cp=cp, tp=tp),
                                 self.layout.rank_of(pp=self.layout.pp - 1, dp=dp, cp=cp, tp=tp)]
                        g = dist.new_group(ranks, timeout=self.timeout, pg_options=opts)
                        if (dp, cp, tp) == (c.dp, c.cp, c.tp) and c.pp in (0, self.layout.pp - 1):
                            self._embedding = g
        return self._embedding

    def all_groups(self) -> list[dist.ProcessGroup]:
        dims = HSDP_MESH_DIMS if self.replicated else MESH_DIMS
        extra = [self._embedding] if self._embedding is not None else []
        return [self.mesh.get_group(self._n(d)) for d in dims] + [self.dp, self.dp_cp, self.dp_shard_cp] + extra

    def close(self) -> None:
        """Barrier, then destroy every sub-group (never the default group)."""
        if self._closed:
            return
        self._closed = True
        dist.barrier()
        seen: set[int] = set()
        default = dist.distributed_c10d._get_default_group()
        for g in self.all_groups():
            if id(g) in seen or g is default:
                continue
            seen.add(id(g))
            dist.destroy_process_group(g)
