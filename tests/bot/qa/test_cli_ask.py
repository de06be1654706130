"""`runwatch ask RUN QUESTION` over a real database."""

from bot.cli import main


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
