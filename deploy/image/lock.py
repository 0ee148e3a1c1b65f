"""Write ``deploy/image/requirements.lock``: every runtime dependency of the installed ``orthoplex``
(``[project] dependencies`` and theirs, extras such as ``ray[train]`` followed, markers evaluated
for this interpreter and platform: Linux, CPython 3.11, as in the image), pinned to the versions
installed here. Run it in an environment where the test suite passes:

    python deploy/image/lock.py > deploy/image/requirements.lock

Local version labels are dropped (``torch 2.13.0+cpu`` -> ``torch==2.13.0``): the image installs
torch first from PyTorch's index, and that build then satisfies the pin.
"""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HEADER = """\
# Every runtime dependency of orthoplex (pyproject's [project] dependencies, ray[train] included),
# pinned to the versions the test suite runs with. The image installs torch first from the PyTorch
# index (CPU or CUDA build of the same version), then this file, then orthoplex with --no-deps.
# tests/deploy/test_image.py checks it against pyproject.toml. Regenerate with deploy/image/lock.py.
"""


def closure(root: str = "orthoplex") -> dict[str, tuple[str, str]]:
    """canonical name -> (distribution name, installed version) for every runtime dependency."""
    seen: dict[str, tuple[str, str]] = {}
    extras_done: dict[str, set[str]] = {}

    def walk(name: str, extras: frozenset[str]) -> None:
        key = canonicalize_name(name)
        dist = metadata.distribution(name)
        done = extras_done.setdefault(key, set())
        if key in seen and extras <= done:
            return
        seen[key] = (dist.metadata["Name"], dist.version)
        done |= extras
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not any(
                    req.marker.evaluate({"extra": e}) for e in (extras | {""})):
                continue
            walk(req.name, frozenset(req.extras))

    walk(root, frozenset())
    seen.pop(canonicalize_name(root))
    return seen


def render() -> str:
    pins = sorted(closure().values(), key=lambda nv: nv[0].lower())
    return HEADER + "".join(f"{name}=={version.split('+')[0]}\n" for name, version in pins)


if __name__ == "__main__":
    sys.stdout.write(render())
