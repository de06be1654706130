"""Frozen dev/test split of the real corpus (issue 22, part 2).

A file's half is a function of its path inside this folder only (e.g.
``files/hf_trainer_state/foo.json``): the first byte of sha256(path) even -> dev, odd -> test.
It never depends on content, labels or detector output, so it is fixed before any tuning and a
file never moves when others are added. The test half is never used for tuning.

    python tests/realcorpus/split.py files/x/y.json ...   # print path and split
    python tests/realcorpus/split.py --check              # MANIFEST.csv split column matches
"""

from __future__ import annotations

import csv
import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def split_of(path: str) -> str:
    """'dev' or 'test' for a path relative to tests/realcorpus/ (forward slashes)."""
    digest = hashlib.sha256(path.replace("\\", "/").encode("utf-8")).digest()
    return "dev" if digest[0] % 2 == 0 else "test"


def check(manifest: Path = HERE / "MANIFEST.csv") -> list[str]:
    bad = []
    with manifest.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if split_of(row["path"]) != row["split"]:
                bad.append(f"{row['path']}: manifest says {row['split']}, "
                           f"hash says {split_of(row['path'])}")
    return bad


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        problems = check()
        print("\n".join(problems) or "split column matches the hash")
        sys.exit(1 if problems else 0)
    for p in sys.argv[1:]:
        print(p, split_of(p))
