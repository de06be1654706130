"""What people said in an alert's thread is part of the incident: "have we seen this before?"
finds it, through the embedding search, on the runs the asker may see."""

import json

from bot.config import Config, Secrets, Settings, SourceConfig
from bot.engine import Engine
from bot.qa import ask


def nan_run(root, name, nan_at):
    run = root / "runs" / name
    run.mkdir(parents=True)
    lines = [json.dumps({"step": s, "loss": 3.0 - 0.01 * s}) for s in range(1, nan_at)]
    lines.append(f'{{"step": {nan_at}, "loss": NaN}}')
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_a_similar_incidents_thread_is_quoted_in_the_answer(tmp_path):
    nan_run(tmp_path, "old", 40)
    engine = Engine(Settings(config=Config(sources=[SourceConfig(path=str(tmp_path / "runs"))]),
                             secrets=Secrets(), config_path=None,
                             db_path=str(tmp_path / "rw.db")))
    engine.poll(dispatch=False)
    [old] = engine.store.findings("old")
    said = "it was a corrupt shard 17, we skipped batches 30-45 and it recovered"
    for ts in ("1.1", "1.1"):  # a redelivered event is kept once
        engine.store.add_thread_message(channel="C1", thread_ts="1.0", ts=ts,
                                        fingerprint=old["fingerprint"], run="old", user="U1",
                                        text=said, at=1.5)
    assert len(engine.store.thread_messages(old["fingerprint"])) == 1
    nan_run(tmp_path, "new", 55)
    engine.poll(dispatch=False)
    answer = ask(engine.store, "new", "have we seen this before?")
    facts = " ".join(f.text for f in answer.facts.facts)
    assert "corrupt shard 17" in facts and "old" in facts
    assert "corrupt shard 17" in answer.render()
    hidden = ask(engine.store, "new", "have we seen this before?", visible_runs={"new"})
    assert "corrupt shard" not in hidden.render()  # a run the asker cannot see stays unseen
