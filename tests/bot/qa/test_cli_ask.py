"""`runwatch ask RUN QUESTION` over a real database."""

from bot.cli import main
from tests.helpers import WordByWord


def test_ask_prints_the_answer_and_its_sources(store, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNWATCH_DB", store.path)
    assert main(["ask", "exp2", "why", "did", "it", "alert?", "--model", "none"]) == 0
    out = capsys.readouterr().out
    assert "Alert spike on exp2" in out and "Sources: exp2 step 1500 alert" in out


def test_ask_about_an_unknown_run_is_one_line(store, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNWATCH_DB", store.path)
    assert main(["ask", "nope", "how is it?"]) == 1
    assert "unknown run 'nope'" in capsys.readouterr().err


def test_ask_shows_checked_sentences_as_they_come_in_a_terminal(store, monkeypatch, tmp_path):
    """In a terminal the model's checked sentences are drawn as they pass the claim check,
    then replaced by the answer; a rejected sentence is never drawn."""
    import io

    from rich.console import Console

    import bot.cli
    import bot.qa.models

    good = "exp1 is running at step 2000 of 3000. Its train/loss was 1.995 at step 2000."
    reply = good.replace(" Its", " It has used 7 GPUs. Its")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNWATCH_DB", store.path)
    monkeypatch.setattr(bot.qa.models, "build_chat_model", lambda config: WordByWord(
        responses=[reply], delay=0.01))
    out = io.StringIO()
    monkeypatch.setattr(bot.cli, "console", Console(file=out, force_terminal=True, width=200))
    assert main(["ask", "exp1", "how", "is", "exp1", "doing?", "--model", "fake"]) == 0
    drawn = out.getvalue()
    assert drawn.count("exp1 is running at step 2000 of 3000.") >= 2  # drawn, then printed
    assert "GPU" not in drawn
    assert f"{good}\n\nSources: exp1 step 2000" in drawn
