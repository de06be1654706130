"""`runwatch demo`: the whole loop on the CPU, no Slack account needed.

A real PyTorch training process (``bot.demo.trainer``) logs JSONL and saves checkpoints; a
fault is injected at a set step. It runs under runwatch's launcher (the ``process`` backend,
as ``runwatch launch`` would run it). The bot watches it in console mode, polling every
second: the spike alert appears with its numbers, fixes and rollback target; the demo then
types ``/run rollback demo`` and confirms it, as the person on call would; the launcher
restarts training from the checkpoint before the spike, skipping the bad batches; the alert
resolves and runwatch follows up with "recovered". ``/run status demo`` and the other
commands can be typed at the prompt all along (``--no-rollback`` leaves the rollback to you).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console

from bot.commands import handle_run_command
from bot.config import Config, Secrets, Settings, SourceConfig
from bot.console import render_message
from bot.qa.models import SMOLLM2_PACKAGE, ModelConfig
from bot.serve import PROMPT_HINT, Bot, console_context, console_prompt
from connectors.training.launcher import Launcher, Templates

RUN_NAME = "demo"


def demo_settings(workdir: Path, *, llm: bool = True) -> Settings:
    """One watched folder, 1 s polls, the console; SmolLM2 phrases answers when installed."""
    use_llm = llm and importlib.util.find_spec(SMOLLM2_PACKAGE) is not None
    config = Config(poll_interval=1.0, sources=[SourceConfig(path=str(workdir / "runs"))],
                    slack={"channel": "#training-alerts"},
                    qa=ModelConfig(backend="transformers" if use_llm else "none"))
    return Settings(config=config, secrets=Secrets(), config_path=None,
                    db_path=str(workdir / "runwatch.db"))


def trainer_command(run_dir: Path, *, steps: int, step_delay: float, fault: str,
                    fault_step: int) -> list[str]:
    return [sys.executable, "-m", "bot.demo.trainer", "--run-dir", str(run_dir),
            "--steps", str(steps), "--step-delay", str(step_delay), "--fault", fault,
            "--fault-step", str(fault_step)]


# The demo trainer's resume options, as a team would pass them to `runwatch launch`.
RESUME = Templates.from_strings("--resume-from {checkpoint}",
                                "--skip-batches {skip_first}-{skip_last}",
                                "--lr-scale {lr_scale}")
# After training ends the launcher waits this long for a rollback (typed, or the demo's own
# on a loaded machine) before the demo ends; once the demo has rolled back it ends at once.
LINGER_S = 30.0


def run_demo(*, workdir: str | None = None, steps: int = 300, step_delay: float = 0.1,
             fault: str = "bad_batch", fault_step: int = 150, console: Console | None = None,
             stdin=None, auto_rollback: bool = True, llm: bool = True) -> int:
    console = console or Console()
    stdin = stdin or sys.stdin
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="runwatch-demo-"))
    run_dir = root / "runs" / RUN_NAME
    run_dir.mkdir(parents=True, exist_ok=True)
    console.rule("[bold]runwatch demo")
    console.print(f"Training a small character-level language model for {steps} steps on the "
                  f"CPU (fault: {fault} at step {fault_step}).\nLog and checkpoints: {run_dir}\n"
                  f"runwatch polls every second and prints alerts here; {PROMPT_HINT}.")
    bot = Bot(demo_settings(root, llm=llm), console=console).start()  # watching before it starts
    launcher = Launcher(RUN_NAME, trainer_command(run_dir, steps=steps, step_delay=step_delay,
                                                  fault=fault, fault_step=fault_step),
                        run_dir, templates=RESUME, grace_s=10, linger_s=LINGER_S, echo=None,
                        log=lambda text: console.print(f"[dim]launcher: {text}[/]"))
    done = threading.Event()
    status: list[int] = []
    supervisor = threading.Thread(target=lambda: status.append(launcher.serve(done.is_set)),
                                  name="demo-launcher", daemon=True)
    supervisor.start()
    if auto_rollback:
        threading.Thread(target=_roll_back_when_alerted,
                         args=(bot, console, supervisor, launcher),
                         name="demo-rollback", daemon=True).start()
    try:
        if stdin.isatty():
            threading.Thread(target=_announce_end,
                             args=(supervisor, bot, console, status, fault_step),
                             daemon=True).start()
            console_prompt(bot.store, console, stdin, actions=bot.actions, answerer=bot.answerer)
        else:
            _announce_end(supervisor, bot, console, status, fault_step)
            console_prompt(bot.store, console, stdin, prompt=False, actions=bot.actions,
                           answerer=bot.answerer)
    finally:
        done.set()
        supervisor.join(timeout=30)
        bot.stop()
    return 0 if status and status[0] in (0, -15) else 1


def _roll_back_when_alerted(bot: Bot, console: Console, supervisor: threading.Thread,
                            launcher: Launcher) -> None:
    """Type what the person on call would: roll back to the offered checkpoint, confirm."""
    while supervisor.is_alive():
        spikes = [f for f in bot.store.findings(RUN_NAME) if f["signal"] == "spike"]
        if spikes:  # firing, or (at a fast --step-delay) over between two polls
            break
        time.sleep(0.2)
    else:
        return
    ctx = console_context(bot.actions, bot.answerer)
    line = f"rollback {RUN_NAME}"
    for _ in range(2):  # ask, then confirm the request the answer names
        console.print(f"[bold cyan]runwatch>[/] /run {line}   [dim](typed by the demo)[/]")
        answer = handle_run_command(line, bot.store, ctx)
        console.print(render_message(answer))
        if "request" not in answer.data:  # refused: nothing to confirm
            return
        line = f"confirm {answer.data['request']}"
    launcher.linger_s = 0.0  # rolled back: the demo ends with the resumed run


def _announce_end(supervisor: threading.Thread, bot: Bot, console: Console,
                  status: list[int], fault_step: int) -> None:
    supervisor.join()
    bot.engine.poll()
    bot.engine.poll()  # the follow-up reads what the first poll stored
    if status and status[0] == 0:
        console.print("[green]training finished[/]")
    else:
        console.print(f"[red]training exited with code {status[0] if status else '?'}[/] "
                      f"(its output: {bot.actions.run_dir(RUN_NAME) / '.runwatch-launch'})")
    # the question a teammate would ask in the alert's thread, answered from the history
    question = f"what happened at step {fault_step}?"
    model = "SmolLM2-135M" if bot.answerer.model is not None else "the facts alone"
    console.print(f"[bold cyan]runwatch>[/] /run ask {RUN_NAME} {question}   "
                  f"[dim](typed by the demo; {model} answers)[/]")
    answer = bot.answerer.answer(RUN_NAME, question, channel=None)
    console.print(render_message(answer))
    if answer.data.get("fallback"):  # said, so the facts are not taken for the model's words
        console.print(f"[dim](answered from the facts alone: {answer.data['fallback']})[/]")
    # and the other half of seed §1.2: what was changed then (the rollback's resume)
    console.print(f"[bold cyan]runwatch>[/] /run changes {RUN_NAME}   [dim](typed by the demo)[/]")
    console.print(render_message(handle_run_command(f"changes {RUN_NAME}", bot.store)))
    console.print(f"{PROMPT_HINT}")
