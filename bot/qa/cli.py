"""`runwatch ask RUN QUESTION`: the same service Slack calls, printed to the terminal."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from bot.config import Settings


def model_config(settings: Settings, spec: str | None, base_url: str | None):
    """The ``[qa]`` section of runwatch.toml (when the config has one), overridden by flags."""
    from bot.qa.config import ModelConfig

    config = getattr(settings.config, "qa", None) or ModelConfig(backend="none")
    updates: dict = {}
    if spec:
        updates = ({"backend": "none"} if spec == "none" else
                   {"backend": "openai" if base_url else "transformers", "model": spec})
    if base_url:
        updates["base_url"] = base_url
    return config.model_copy(update=updates)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run name")
    parser.add_argument("question", nargs="+", help="the question, e.g. 'what changed at "
                                                    "step 2000?'")
    parser.add_argument("--model", help="model that phrases the answer: 'smollm2', a model "
                                        "folder or .gguf file, a served model's name with "
                                        "--base-url, or 'none' for the deterministic answer "
                                        "(default: [qa] in runwatch.toml, else none)")
    parser.add_argument("--base-url", help="an OpenAI-compatible server, e.g. "
                                           "http://localhost:8000/v1")
    parser.add_argument("--verbose", action="store_true",
                        help="print every fact behind the answer after it (Slack's Details)")


@contextmanager
def streaming(console: Console, model: bool) -> Iterator[Callable[[str], None] | None]:
    """In a terminal, the model's checked sentences as they come, cleared when the answer
    is printed (which may be the facts' own); piped output gets the answer alone."""
    if not (model and console.is_terminal):
        yield None
        return
    from rich.live import Live
    from rich.text import Text

    with Live(Text(""), console=console, transient=True, auto_refresh=False) as live:
        yield lambda text: live.update(Text(text, style="dim"), refresh=True)


def run_ask(args: argparse.Namespace, settings: Settings, console: Console,
            err_console: Console) -> int:
    from bot.pgstore import StoreUnavailable, open_store
    from bot.qa.models import ModelError, build_chat_model
    from bot.qa.service import ask
    from bot.store import UnknownRun, is_postgres

    if not is_postgres(settings.db_path) and not Path(settings.db_path).exists():
        err_console.print(f"no runwatch database at {settings.db_path}; start `runwatch serve` "
                          f"first or set RUNWATCH_DB")
        return 1
    try:
        model = build_chat_model(model_config(settings, args.model, args.base_url))
        with streaming(console, model is not None) as on_partial:
            answer = ask(open_store(settings.db_path), args.run, " ".join(args.question),
                         model=model, on_partial=on_partial)
    except (UnknownRun, ModelError, StoreUnavailable) as exc:
        err_console.print(str(exc))
        return 1
    console.print(answer.render(verbose=args.verbose), markup=False, highlight=False)
    if answer.fallback:
        err_console.print(f"(deterministic answer: {answer.fallback})")
    return 0
