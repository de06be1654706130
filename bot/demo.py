"""`runwatch demo`: the whole loop on the CPU, no Slack account needed.

A real PyTorch training process (``bot.demo_train``) logs JSONL and saves checkpoints; a
fault is injected at a set step. The bot watches it in console mode, polling every second:
the spike alert appears with its numbers, fixes and rollback target, and ``/run status demo``
can be typed at the prompt while it trains.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from rich.console import Console

from bot.config import Config, Secrets, Settings, SourceConfig
from bot.serve import PROMPT_HINT, Bot, console_prompt

RUN_NAME = "demo"


def demo_settings(workdir: Path) -> Settings:
    config = Config(poll_interval=1.0, sources=[SourceConfig(path=str(workdir / "runs"))],
                    slack={"channel": "#training-alerts"})
    return Settings(config=config, secrets=Secrets(), config_path=None,
                    db_path=str(workdir / "runwatch.db"))


def trainer_command(run_dir: Path, *, steps: int, step_delay: float, fault: str,
                    fault_step: int) -> list[str]:
    return [sys.executable, "-m", "bot.demo_train", "--run-dir", str(run_dir),
            "--steps", str(steps), "--step-delay", str(step_delay), "--fault", fault,
            "--fault-step", str(fault_step)]


def run_demo(*, workdir: str | None = None, steps: int = 300, step_delay: float = 0.1,
             fault: str = "bad_batch", fault_step: int = 150, console: Console | None = None,
             stdin=None) -> int:
    console = console or Console()
    stdin = stdin or sys.stdin
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="runwatch-demo-"))
    run_dir = root / "runs" / RUN_NAME
    run_dir.mkdir(parents=True, exist_ok=True)
    console.rule("[bold]runwatch demo")
    console.print(f"Training a small character-level language model for {steps} steps on the "
                  f"CPU (fault: {fault} at step {fault_step}).\nLog and checkpoints: {run_dir}\n"
                  f"runwatch polls every second and prints alerts here; {PROMPT_HINT}.")
    bot = Bot(demo_settings(root), console=console).start()  # watching before the run starts
    trainer = subprocess.Popen(
        trainer_command(run_dir, steps=steps, step_delay=step_delay, fault=fault,
                        fault_step=fault_step),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        if stdin.isatty():
            finished = threading.Thread(target=_announce_end, args=(trainer, bot, console),
                                        daemon=True)
            finished.start()
            console_prompt(bot.store, console, stdin)
        else:
            trainer.wait()
            bot.engine.poll()
            _report_exit(trainer, console)
            console_prompt(bot.store, console, stdin, prompt=False)
    finally:
        if trainer.poll() is None:
            trainer.terminate()
            trainer.wait(timeout=10)
        bot.stop()
    return 0 if trainer.returncode in (0, -15) else 1


def _report_exit(trainer: subprocess.Popen, console: Console) -> None:
    if trainer.returncode == 0:
        console.print("[green]training finished[/]")
    else:
        console.print(f"[red]training exited with code {trainer.returncode}[/]\n"
                      f"{(trainer.stderr.read() if trainer.stderr else '')[-2000:]}")


def _announce_end(trainer: subprocess.Popen, bot: Bot, console: Console) -> None:
    trainer.wait()
    bot.engine.poll()
    _report_exit(trainer, console)
    console.print(f"{PROMPT_HINT}")
