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
    result = score(store, qs, "deterministic",
                   lambda q, heard: ask(store, q.run, q.text, now=NOW))
    assert result.ungrounded == 0 and result.wrong_claims == 0
    assert result.correct == result.questions, result.failures
    assert result.summary()["median words"] <= 60


def test_the_first_checked_sentence_is_timed_when_it_is_streamed(store):
    """Slack shows a model's first checked sentence before the whole answer: the benchmark
    times both; an answer that streams nothing shows its first sentence with the whole."""
    import time

    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from benchmarks.qa import Question

    class Slow(FakeListChatModel):
        sleep: float = 0.01  # a character at a time

    model = Slow(responses=["exp1 is running at step 2000 of 3000. Its train/loss was "
                            "1.995 at step 2000. No alerts are open on exp1."])
    qs = [Question("exp1", "How is exp1 doing?", "status", ["2000"])]
    result = score(store, qs, "fake", lambda q, heard: ask(store, q.run, q.text, model=model,
                                                          now=NOW, on_partial=heard))
    summary = result.summary()
    assert result.streamed == 1 and result.correct == 1
    assert summary["first sentence p50 s"] < summary["latency p50 s"] - 0.3
    started = time.perf_counter()
    result = score(store, qs, "facts", lambda q, heard: ask(store, q.run, q.text, now=NOW))
    assert result.streamed == 0 and result.first_sentences == result.latencies
    assert result.latencies[0] <= time.perf_counter() - started


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


def test_the_held_out_questions_keep_their_frozen_split_and_are_each_answered():
    """The held-out set's split is fixed by id (tune on dev, report test); every question
    gets an answer with the facts it was built from, for the reading by hand."""
    from benchmarks.qa_heldout import ask_all, questions

    every = questions("all")
    assert len(every) == 60
    assert all(q["split"] == ("dev" if int(q["id"][1:]) % 2 == 0 else "test") for q in every)
    rows = ask_all(questions("test")[:5], model=None)
    assert [r["id"] for r in rows] == [q["id"] for q in questions("test")[:5]]
    assert all(r["answer"].strip() and r["facts"] and r["claim check"] == [] for r in rows)
    second = questions("all", "b")
    assert len(second) == 60 and {q["split"] for q in second} == {"test"}
    assert not {q["question"] for q in second} & {q["question"] for q in every}
    tuning = questions("all", "c")
    assert len(tuning) == 80 and {q["split"] for q in tuning} == {"dev"}
    assert not {q["question"] for q in tuning} & {q["question"] for q in second}
    fresh = questions("all", "d")
    assert len(fresh) == 60 and {q["split"] for q in fresh} == {"test"}
