"""The QA benchmark's deterministic half runs in the suite: it is the regression test."""

from benchmarks.qa import NOW, contains, questions, score
from bot.qa.embeddings import MiniLMEmbedder, TfidfEmbedder, minilm_path
from bot.qa.service import ask


def test_deterministic_answerer_meets_the_target(store, bench_runs):
    qs = questions(store, bench_runs)
    assert len(qs) >= 300
    assert {q.kind for q in qs} >= {"status", "value", "min", "max", "range", "time", "why",
                                    "rollback", "changed", "compare", "similar",
                                    "after_rollback", "uncovered", "where", "summary",
                                    "next_step", "eta", "better", "trap_value",
                                    "trap_config", "trap_instruction"}
    result = score(store, qs, "deterministic", lambda q: ask(store, q.run, q.text, now=NOW))
    assert result.ungrounded == 0 and result.wrong_claims == 0
    assert result.correct == result.questions, result.failures
    assert result.summary()["median words"] <= 60


def test_scoring_reads_numbers_as_written():
    assert contains("loss 2.43 at step 1,200", 1200)
    assert contains("loss 2.43 at step 1,200", 2.4301)
    assert not contains("loss 2.5", 2.43)
    assert contains("No Reward points", "no reward")


def test_embeddings_rank_the_same_trouble_first():
    texts = ["spike on train/loss: loss jumped to 9.5 at step 1500",
             "throughput fell 55% from step 1000",
             "spike on train/loss: loss jumped to 11.0 at step 800"]
    embedders = [TfidfEmbedder()] + ([MiniLMEmbedder()] if minilm_path() else [])
    for embedder in embedders:
        vecs = embedder.embed(texts)
        assert vecs[0] @ vecs[2] > vecs[0] @ vecs[1], embedder.name
