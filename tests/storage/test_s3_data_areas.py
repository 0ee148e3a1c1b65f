"""Tenants' data areas and shared roots on ``s3://`` storage (against the session's S3 server).

Each tenant's area is the prefix ``<storage>/tenants/<id>/data``: its data paths select keys under it
only (a forged path, a URL or ``..``, is refused before the store is asked), a shared root on the
object store is readable by name, and the engine reads what a job selects from a node-local copy
(a token file together with its sidecar).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from workers import object_store
from workers.data_area import DataArea, DataPathError, resolve_data_paths, tenant_area

pytestmark = pytest.mark.s3


@pytest.mark.parametrize("forged", [
    "../2/data/secret.txt", "corpus/../../../2/data/secret.txt", "/tenants/2/data/secret.txt",
    "s3://{bucket}/st/tenants/2/data/secret.txt", "shared:other/secret.txt", "~/secret.txt",
])
def test_a_tenant_selects_only_keys_under_its_own_prefix(s3_bucket: str, forged: str) -> None:
    storage = f"{s3_bucket}/st"
    mine, theirs = DataArea(root=tenant_area(storage, 1)), tenant_area(storage, 2)
    assert mine.root == f"{storage}/tenants/1/data"
    object_store.write_bytes(f"{mine.root}/corpus/a.txt", b"mine " * 20)
    object_store.write_bytes(f"{mine.root}/corpus/.uploads/part", b"half an upload")
    object_store.write_bytes(f"{theirs}/secret.txt", b"theirs")
    assert resolve_data_paths(["corpus"], mine) == [f"{mine.root}/corpus/a.txt"]
    with pytest.raises(DataPathError) as exc:
        resolve_data_paths([forged.format(bucket=s3_bucket.split("://")[1])], mine)
    assert exc.value.index == 0 and "secret" not in exc.value.msg


def test_a_shared_root_on_the_object_store_and_a_token_file_read_from_a_local_copy(s3_bucket: str) -> None:
    from workers.engine.data.build import build_dataset

    area = DataArea(root=tenant_area(f"{s3_bucket}/st", 1), shared={"corpora": f"{s3_bucket}/corpora"})
    tokens = np.arange(1000, dtype=np.uint16) % 250
    object_store.write_bytes(f"{s3_bucket}/corpora/web/part-0.tok", tokens.tobytes())
    object_store.write_bytes(f"{s3_bucket}/corpora/web/part-0.tok.json",
                             json.dumps({"dtype": "uint16", "vocab_size": 250}).encode())
    assert resolve_data_paths(["shared:corpora/web/*.tok"], area) == [f"{s3_bucket}/corpora/web/part-0.tok"]
    ds = build_dataset({"kind": "tokens", "paths": ["shared:corpora/web"], "area": area.to_dict()}, 8)
    assert ds.sources == ["shared:corpora/web"] and ds.vocab_size == 250  # the sidecar came along
    assert len(ds) == (1000 - 1) // 8 and ds[0].tolist() == tokens[:9].tolist()  # samples of 8 + 1
