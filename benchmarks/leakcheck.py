"""`runwatch bench leakcheck`: precision, recall, time and memory of `runwatch leakcheck`.

Writes a synthetic train and eval set of short texts (pseudo-words, 14–24 per text), plants
into train a copy of some eval rows — exact after normalisation (case, punctuation, spacing
changed) or near (one or two words replaced, inserted or dropped) — and *hard negatives*
(half of an eval row's words kept, the rest new), then runs the real command in a child
process and scores the eval rows it reports against the planted ones.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from connectors.training.leakcheck import jaccard, normalise, shingles

SYLLABLES = [c + v for c in "bcdfghklmnprstvz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


def _vocabulary(rng: random.Random, size: int = 30000) -> list[str]:
    words = set()
    while len(words) < size:
        words.add("".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))))
    return sorted(words)


def _text(rng: random.Random, vocab: list[str]) -> list[str]:
    return rng.choices(vocab, k=rng.randint(14, 24))


def _exact_variant(rng: random.Random, words: list[str]) -> str:
    text = " ".join(w.upper() if rng.random() < 0.2 else w for w in words)
    return "  " + text.replace(" ", rng.choice([", ", "  ", " - ", "\t"]), 3) + rng.choice(
        ["!", "?", ".", " ..."])


def _near_variant(rng: random.Random, words: list[str], vocab: list[str]) -> list[str]:
    words = list(words)
    for _ in range(rng.choice((1, 1, 2))):
        at = rng.randrange(len(words))
        edit = rng.choice(("replace", "insert", "drop"))
        if edit == "replace":
            words[at] = rng.choice(vocab)
        elif edit == "insert":
            words.insert(at, rng.choice(vocab))
        else:
            del words[at]
    return words


def _jaccard(a: str, b: str) -> float:
    return jaccard(shingles(normalise(a)), shingles(normalise(b)))


def write_sets(root: Path, train_rows: int, eval_rows: int, planted: float = 0.05,
               seed: int = 0) -> dict[str, Any]:
    """Write train.jsonl and eval.jsonl; return the planted eval rows and their Jaccards."""
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    evals = [_text(rng, vocab) for _ in range(eval_rows)]
    chosen = rng.sample(range(eval_rows), int(eval_rows * planted * 2))
    exact, near = chosen[:len(chosen) // 4], chosen[len(chosen) // 4:len(chosen) // 2]
    negatives = chosen[len(chosen) // 2:]
    plants: list[str] = []
    near_jaccards = []
    for row in exact:
        plants.append(_exact_variant(rng, evals[row]))
    for row in near:
        text = " ".join(_near_variant(rng, evals[row], vocab))
        near_jaccards.append(_jaccard(text, " ".join(evals[row])))
        plants.append(text)
    negative_jaccards = []
    for row in negatives:
        half = len(evals[row]) // 2
        text = " ".join(evals[row][:half] + _text(rng, vocab)[:len(evals[row]) - half])
        negative_jaccards.append(_jaccard(text, " ".join(evals[row])))
        plants.append(text)
    positions = set(rng.sample(range(train_rows), len(plants)))
    with open(root / "train.jsonl", "w") as handle:
        queue = iter(plants)
        for i in range(train_rows):
            text = next(queue) if i in positions else " ".join(_text(rng, vocab))
            handle.write(json.dumps({"text": text}) + "\n")
    with open(root / "eval.jsonl", "w") as handle:
        for words in evals:
            handle.write(json.dumps({"text": " ".join(words)}) + "\n")
    near_jaccards.sort()
    negative_jaccards.sort()
    return {"exact": set(exact), "near": set(near), "negatives": set(negatives),
            "near jaccard min": near_jaccards[0] if near_jaccards else None,
            "near jaccard median": near_jaccards[len(near_jaccards) // 2]
            if near_jaccards else None,
            "negative jaccard max": negative_jaccards[-1] if negative_jaccards else None}


def bench_leakcheck(train_rows: int = 1_000_000, eval_rows: int = 10_000, seed: int = 0,
                    threshold: float = 0.7) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        truth = write_sets(root, train_rows, eval_rows, seed=seed)
        written_s = time.perf_counter() - t0
        size_mb = (root / "train.jsonl").stat().st_size / 1e6
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "bot.cli", "leakcheck", str(root / "train.jsonl"),
             str(root / "eval.jsonl"), "--threshold", str(threshold), "--json"],
            capture_output=True, text=True, check=False)
        wall_s = time.perf_counter() - t0
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak_mb = usage.ru_maxrss / 1024
        cpu_s = usage.ru_utime + usage.ru_stime
    if done.returncode not in (0, 1):
        raise RuntimeError(f"runwatch leakcheck failed ({done.returncode}): {done.stderr}")
    report = json.loads(done.stdout)
    found = set(report["matched_rows"])
    planted = truth["exact"] | truth["near"]
    true_positive = len(found & planted)
    return {
        "train rows": train_rows, "eval rows": eval_rows,
        "train file MB": round(size_mb, 1),
        "planted exact (after normalisation)": len(truth["exact"]),
        "planted near (1–2 word edits)": len(truth["near"]),
        "hard negatives (half the words shared)": len(truth["negatives"]),
        "near Jaccard min / median": f"{truth['near jaccard min']:.2f} / "
                                     f"{truth['near jaccard median']:.2f}",
        "hard negative Jaccard max": round(truth["negative jaccard max"], 2),
        "threshold": threshold,
        "precision": true_positive / len(found) if found else 0.0,
        "recall": true_positive / len(planted) if planted else 0.0,
        "recall exact": len(found & truth["exact"]) / len(truth["exact"]),
        "recall near": len(found & truth["near"]) / len(truth["near"]),
        "hard negatives flagged": len(found & truth["negatives"]),
        "check wall s (child process, incl. start)": round(wall_s, 1),
        "check s (reported)": report["seconds"],
        # the machine is shared: CPU seconds of the child say what the check costs on a
        # free core, whatever else is running
        "check CPU s (child process)": round(cpu_s, 1),
        "train rows per CPU s": round(train_rows / cpu_s),
        "peak RSS MB (child process)": round(peak_mb),
        "load average (1 min) at the end": round(os.getloadavg()[0], 1),
        "data generation s (not in the figure)": round(written_s, 1),
    }
