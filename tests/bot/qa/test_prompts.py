"""Prompts are data: each template's variables are exactly what the code renders it with."""

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from bot.qa import prompts
from bot.qa.facts import FactSheet, Source
from bot.qa.grounding import Violation
from bot.qa.service import messages_for, retry_messages, summarize_alert

FINDING = {"run": "exp1", "signal": "spike", "severity": "critical", "metric": "train/loss",
           "onset_step": 1500, "detected_step": 1500, "resolved_step": None, "state": "firing",
           "attempt": 1, "fingerprint": "abc123", "kind": "not_learning",
           "summary": "train/loss jumped to 9.50 at step 1500",
           "evidence": {"peak": 9.5}, "fixes": [{"text": "Roll back", "source": "000",
                                                 "request": "rollback"}]}


@pytest.fixture
def rendered(monkeypatch):
    """Every (template, variables) the code renders, through the strict loader."""
    seen = {}
    real = prompts.Prompt.render

    def spy(self, **values):
        seen[self.name] = set(values)
        return real(self, **values)

    monkeypatch.setattr(prompts.Prompt, "render", spy)
    return seen


def test_every_template_is_rendered_with_exactly_its_variables(rendered):
    sheet = FactSheet(question="q", run="exp1", kinds=["value"])
    sheet.add("value", "train/loss of exp1 at step 10: 2.5.", 2.5, 10, source=Source("exp1", 10))
    first = messages_for(sheet, "what was the loss at step 10?")
    retry_messages(sheet, "q", first, "It was 3.", [Violation("number", "3")])
    summarize_alert(FINDING, FakeListChatModel(responses=["train/loss jumped to 9.50."]))
    assert set(rendered) == set(prompts.names()) == {"system", "answer", "regenerate",
                                                     "alert_summary"}
    for name, supplied in rendered.items():
        assert supplied == prompts.load(name).variables, name


def test_loading_is_strict(tmp_path):
    (tmp_path / "t.yaml").write_text("template: 'Hello $name'\n")
    prompt = prompts.load("t", tmp_path)
    assert prompt.render(name="x") == "Hello x"
    with pytest.raises(prompts.PromptError, match="needs name"):
        prompt.render()
    with pytest.raises(prompts.PromptError, match="does not use extra"):
        prompt.render(name="x", extra=1)
    with pytest.raises(prompts.PromptError, match="missing"):
        prompts.load("absent", tmp_path)
    (tmp_path / "bad.yaml").write_text("text: 'no template key'\n")
    with pytest.raises(prompts.PromptError, match="needs a 'template'"):
        prompts.load("bad", tmp_path)
    (tmp_path / "dollar.yaml").write_text("template: 'costs $ 5'\n")
    with pytest.raises(prompts.PromptError, match=r"\$\$"):
        prompts.load("dollar", tmp_path)
