"""Questions written outside the project, asked of bench qa's histories: quality on data the
router, the retrieval and the claim check were not tuned on.

``benchmarks/data/qa_heldout.json`` holds 60 questions a separate session wrote from a
one-paragraph description of the runs (no code, no bench questions seen), with a split frozen
before any tuning: even ids ``dev`` (tune on these), odd ids ``test`` (report these, never
tune on them). There is no automatic verdict: an answer's facts may miss what was asked, which
no check against those facts can see, so the answers are written with their facts for a
reading by hand (`tests/bot/qa/handchecked.md` has the verdicts of stop 32).

``benchmarks/data/qa_heldout_b.json`` (``--set b``) holds 60 more, written the same way at the
start of stop 33, all ``test``: frozen before the tuning on set a's dev half, and read only
after it, so they measure that tuning on phrasings its author never saw.
``benchmarks/data/qa_heldout_c.json`` (``--set c``) holds 80 more, all ``dev``, written by
another session in the voices of eight kinds of team member, to tune on. Once set b was
measured and read it was tuned on too; ``benchmarks/data/qa_heldout_d.json`` (``--set d``,
60, all ``test``) was written and frozen then, before that tuning, and read only after it.
Once set d was read it was tuned on too (stop 34); ``benchmarks/data/qa_heldout_e.json``
(``--set e``, 60, all ``test``) was written and frozen before that tuning. Once set e was
measured and read it was tuned on too, and its rightly answered questions became labelled
examples of the router (``bot/qa/intent_examples.json``); ``benchmarks/data/qa_heldout_f.json``
(``--set f``, 60, all ``test``) was written and frozen before that. Set f, once measured and
read, was tuned on; ``benchmarks/data/qa_heldout_g.json`` (``--set g``, 60, all ``test``) was
written and frozen before that tuning. Set g, once measured and read, was tuned on;
``benchmarks/data/qa_heldout_i.json`` (``--set i``, 60, all ``test``; no set h, as set a's
ids already start with H) was written and frozen before that tuning (stop 35).

    python -m benchmarks.qa_heldout --split test --json heldout.json [--model none] [--set b]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.qa import NOW, build_store, histories, load_model

DATA = Path(__file__).resolve().parent / "data"
SETS = {"a": DATA / "qa_heldout.json", "b": DATA / "qa_heldout_b.json",
        "c": DATA / "qa_heldout_c.json", "d": DATA / "qa_heldout_d.json",
        "e": DATA / "qa_heldout_e.json", "f": DATA / "qa_heldout_f.json",
        "g": DATA / "qa_heldout_g.json", "i": DATA / "qa_heldout_i.json"}


def questions(split: str = "test", which: str = "a") -> list[dict[str, str]]:
    rows = json.loads(SETS[which].read_text(encoding="utf-8"))
    return [q for q in rows if split == "all" or q["split"] == split]


def ask_all(qs: list[dict[str, str]], model: Any) -> list[dict[str, Any]]:
    """Each question asked as Slack asks it (streamed), with its answer, facts and times."""
    from bot.qa import ask
    from bot.qa.claims import review
    from bot.qa.service import known_sentences

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        store = build_store(Path(tmp), histories())
        try:
            for q in qs:
                started = time.perf_counter()
                first: list[float] = []

                def heard(_: str, first: list[float] = first, started: float = started) -> None:
                    if not first:
                        first.append(time.perf_counter() - started)

                answer = ask(store, q["run"], q["question"], model=model, now=NOW,
                             on_partial=heard)
                took = time.perf_counter() - started
                rejected = review(answer.text, answer.facts, q["question"],
                                  all_runs=store.run_names(),
                                  known=known_sentences(answer.facts)).rejected
                out.append({**q, "intent": answer.facts.intent, "model": answer.model,
                            "answer": answer.render(), "seconds": round(took, 3),
                            "first sentence s": round(first[0] if first else took, 3),
                            "facts": [f.text for f in answer.facts.facts]
                            + [f"NOT IN THE RECORD: {g}" for g in answer.facts.gaps],
                            "claim check": [r.describe() for r in rejected]})
        finally:
            store.close()
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def q(p: float, values: list[float]) -> float:
        values = sorted(values)
        return values[min(len(values) - 1, int(round(p * (len(values) - 1))))]

    took = [r["seconds"] for r in rows]
    first = [r["first sentence s"] for r in rows]
    return {"questions": len(rows),
            "posted in the model's words": sum(r["model"] != "deterministic" for r in rows),
            "latency p50 s": statistics.median(took), "latency p95 s": q(0.95, took),
            "first sentence p50 s": statistics.median(first)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.qa_heldout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="test", choices=["dev", "test", "all"])
    parser.add_argument("--set", default="a", choices=sorted(SETS), dest="which",
                        help="a: 60 questions split dev/test; b: 60 more, all test (then "
                             "tuned on); c: 80 more, all dev; d: 60 more, all test (then "
                             "tuned on); e: 60 more, all test (then tuned on); f: 60 more, "
                             "all test (then tuned on); g: 60 more, all test (then tuned on); "
                             "i: 60 more, all test")
    parser.add_argument("--model", default="smollm2", help="as bench qa's --model ('none': "
                                                           "the facts' answers only)")
    parser.add_argument("--json", required=True, help="answers with their facts, to read")
    args = parser.parse_args(argv)
    rows = ask_all(questions(args.split, args.which), load_model(args.model))
    Path(args.json).write_text(json.dumps({"summary": summary(rows), "answers": rows},
                                          indent=1, ensure_ascii=False))
    print(json.dumps(summary(rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
