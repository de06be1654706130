"""`runwatch bench versions`: what recording a run's versions costs a training start, and that
it costs nothing per step.

In a fresh Python process that has imported torch (as a training script has), a
:class:`connectors.training.torchloop.RunLogger` is opened in a git checkout with a training
file and a base-model folder (weights of the given size), first cold with versions, then with
``versions=False``; then 10,000 ``log`` calls of each are timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parents[1])  # this checkout's connectors, not another's
CHILD = r"""
import json, sys, time
from pathlib import Path
import torch
from connectors.training.torchloop import RunLogger
root = Path(sys.argv[1])
kwargs = dict(config={"lr": 3e-4, "epochs": 3}, data=root / "train.jsonl",
              model=root / "base")
t = time.perf_counter()
with_versions = RunLogger(root / "run_a", **kwargs)
start_with = time.perf_counter() - t
t = time.perf_counter()
without = RunLogger(root / "run_b", versions=False, **kwargs)
start_without = time.perf_counter() - t
per_step = {}
for name, logger in (("with", with_versions), ("without", without)):
    t = time.perf_counter()
    for step in range(1, 10001):
        logger.log(step, loss=1.0, lr=3e-4)
    per_step[name] = (time.perf_counter() - t) / 10000
print(json.dumps({"start_with": start_with, "start_without": start_without,
                  "per_step": per_step}))
"""


def bench_versions(weights_mb: int = 500, data_mb: int = 100) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        (root / "train.py").write_text("print('train')\n")
        subprocess.run(["git", "-C", str(root), "add", "train.py"], check=True)
        subprocess.run(["git", "-C", str(root), "-c", "user.name=b", "-c", "user.email=b@b",
                        "commit", "-qm", "b"], check=True)
        with open(root / "train.jsonl", "wb") as handle:
            handle.write(b'{"text": "x"}\n' * (data_mb * (1 << 20) // 14))
        (root / "base").mkdir()
        for i in range(2):
            with open(root / "base" / f"model-{i}.safetensors", "wb") as handle:
                handle.truncate(weights_mb * (1 << 20) // 2)
        done = subprocess.run([sys.executable, "-c", CHILD, str(root)], cwd=root,
                              capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  filter(None, [ROOT, os.environ.get("PYTHONPATH")]))})
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "training file MB": data_mb, "base model weights MB (2 files)": weights_mb,
        "RunLogger start with versions s (cold)": round(result["start_with"], 3),
        "RunLogger start without versions s": round(result["start_without"], 4),
        "log() per step with versions µs": round(result["per_step"]["with"] * 1e6, 1),
        "log() per step without versions µs": round(result["per_step"]["without"] * 1e6, 1),
    }

