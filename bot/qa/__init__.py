"""Question answering over the run history: facts first, a local LLM second.

``ask(store, run, question, model=..., visible_runs=...)`` is what the CLI and Slack call.
Imported lazily, so ``runwatch --help`` does not load LangChain.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Answer", "ask", "build_facts", "deterministic_answer", "runs_named", "submit",
           "summarize_alert", "warm"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from bot.qa import service

        return getattr(service, name)
    raise AttributeError(name)
