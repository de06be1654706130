"""The `runwatch` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.highlighter import NullHighlighter
from rich.logging import RichHandler
from rich.pretty import Pretty

from bot.config import ConfigError, Settings, load_settings

if TYPE_CHECKING:
    pass

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def setup_logging(level: int = logging.INFO) -> None:
    """Timestamped lines on stderr. Rich's default highlighter runs regular expressions over
    each message, and one of them backtracks quadratically on long words: a log line quoting
    what a stranger sent (100 KB) held the GIL for minutes. Lines are printed as they are."""
    logging.basicConfig(level=level, format="%(name)s: %(message)s", datefmt="[%Y-%m-%d %X]",
                        handlers=[RichHandler(console=err_console, show_path=False,
                                              rich_tracebacks=True,
                                              highlighter=NullHighlighter())], force=True)
    for noisy in ("apscheduler", "slack_bolt", "slack_sdk", "urllib3"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    # waitress warns of its task queue's depth on every burst of requests (20 people
    # clicking at once); the requests are served, so that is not news
    logging.getLogger("waitress.queue").setLevel(max(level, logging.ERROR))


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(getattr(args, "config", None))


def cmd_config_check(args: argparse.Namespace) -> int:
    settings = _settings(args)
    console.print(Pretty(settings.effective(), expand_all=True))
    console.print("[green]configuration is valid[/]")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    return _run_subcommand(args, ["status", args.run])


def cmd_changes(args: argparse.Namespace) -> int:
    """`/run changes` on the terminal: the same words, the same answer."""
    return _run_subcommand(args, ["changes", args.run, *([args.other] if args.other else [])])


def _open_store(url: str) -> Any:
    """The store ``url`` names (SQLite file or PostgreSQL); one line and exit 1 when a
    PostgreSQL server cannot be reached."""
    from bot.pgstore import StoreUnavailable, open_store

    try:
        return open_store(url)
    except StoreUnavailable as exc:
        err_console.print(str(exc))
        raise SystemExit(1) from None


def _run_subcommand(args: argparse.Namespace, words: list[str]) -> int:
    """Answer a `/run` sub-command from the bot's database, printed on the terminal."""
    import shlex

    from bot.commands import handle_run_command
    from bot.console import render_message
    from bot.store import is_postgres

    settings = _settings(args)
    if not is_postgres(settings.db_path) and not Path(settings.db_path).exists():
        err_console.print(f"no runwatch database at {settings.db_path}; start `runwatch serve` "
                          f"first or set RUNWATCH_DB")
        return 1
    message = handle_run_command(shlex.join(words), _open_store(settings.db_path))
    if message.kind == "error":
        err_console.print(message.text)
        return 1
    console.print(render_message(message))
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
    from bot.qa.cli import run_ask

    return run_ask(args, _settings(args), console, err_console)


def cmd_analyze(args: argparse.Namespace) -> int:
    from bot.console import render_message
    from bot.inspection import analyzed
    from bot.views.alerts import alert_message

    settings = _settings(args)
    if "://" not in args.source and not Path(args.source).exists():
        err_console.print(f"{args.source}: no such file or directory")
        return 2
    try:
        with analyzed(settings, args.source) as (engine, ingested, findings):
            for run in sorted(ingested):
                info = engine.store.run(run)
                if info and info["malformed_lines"]:
                    err_console.print(f"{run}: {info['malformed_lines']} malformed lines "
                                      f"skipped, first at line {info['first_malformed_line']}: "
                                      f"{info['first_malformed_error']}")
    except ValueError as exc:  # an unknown scheme, or a file runwatch cannot read
        err_console.print(str(exc))
        return 2
    if args.json:
        for finding in findings:
            sys.stdout.write(json.dumps(finding.to_dict()) + "\n")
        return 0
    if not ingested:
        err_console.print(f"{args.source}: no metric points found")
        return 1
    for finding in findings:
        console.print(render_message(alert_message(finding.to_dict())))
    points = sum(r.new_points for r in ingested.values())
    console.print(f"{_count(len(findings), 'finding')} in {_count(len(ingested), 'run')} "
                  f"({_count(points, 'point')})")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from bot.inspection import inspect_source, render

    settings = _settings(args)
    if "://" not in args.source and not Path(args.source).exists():
        err_console.print(f"{args.source}: no such file or directory")
        return 2
    logger = logging.getLogger("runwatch")
    level = logger.level
    if not args.verbose:  # the report holds every notice the engine would log
        logger.setLevel(logging.ERROR)
    try:
        report = inspect_source(settings, args.source)
    except ValueError as exc:  # an unknown scheme, or a file runwatch cannot read
        err_console.print(str(exc))
        return 2
    finally:
        logger.setLevel(level)
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        console.print(render(report))
    return 0 if report["points"] else 1


def cmd_sources(args: argparse.Namespace) -> int:
    from rich.table import Table

    from analyzers.fmt import fmt_duration
    from bot.engine import Engine

    settings = _settings(args)
    if not settings.config.sources:
        err_console.print(f"no sources configured; add [[sources]] path = \"…\" to "
                          f"{settings.config_path or 'runwatch.toml'}")
        return 1
    engine = Engine(settings, store=_open_store(settings.db_path))
    engine.readers()  # a live look now, recorded beside what the bot has counted
    table = Table("source", "state", "runs", "last ok", "errors", "malformed lines",
                  "skipped values", "last error", title="sources")
    now = engine.clock()
    for row in engine.store.sources():
        style = {"ok": "green", "missing": "yellow"}.get(row["state"], "red")
        last_ok = (fmt_duration(now - row["last_ok_at"]) + " ago") if row["last_ok_at"] \
            else "never"
        last_error = row["last_error"] or ""
        if last_error and row["last_error_at"]:
            last_error = f"{fmt_duration(now - row['last_error_at'])} ago: {last_error}"
        table.add_row(row["uri"], f"[{style}]{row['state']}[/]", str(row["runs"]), last_ok,
                      str(row["errors"]), str(row["malformed_lines"]),
                      str(row["skipped_values"]), last_error)
    console.print(table)
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def cmd_serve(args: argparse.Namespace) -> int:
    from bot.serve import serve

    return serve(_settings(args))


def cmd_demo(args: argparse.Namespace) -> int:
    from bot.demo.script import run_demo

    return run_demo(workdir=args.workdir, steps=args.steps, step_delay=args.step_delay,
                    fault=args.fault, fault_step=args.fault_step, console=console,
                    auto_rollback=not args.no_rollback, llm=not args.no_llm)


def cmd_bench(args: argparse.Namespace) -> int:
    from benchmarks.run import run_bench

    try:
        return run_bench(args.which, output=args.output, console=console,
                         samples=args.samples, runs=args.runs, points=args.points,
                         seed=args.seed, repeats=args.repeats, speed=args.speed,
                         model=args.model, signals=args.signal, seeds=args.seeds,
                         outcomes=args.outcomes, oracle=args.oracle, limit=args.limit,
                         train_rows=args.train_rows,
                         minutes=args.minutes, max_history=args.max_history)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in ("bot", "benchmarks", "analyzers", "connectors"):
            raise
        console.print(f"runwatch bench {args.which} needs the test extras ({exc.name} is not "
                      "installed): pip install 'runwatch[test]'", markup=False)
        return 2


def cmd_launch(args: argparse.Namespace) -> int:
    """Start the training command under runwatch's supervisor (the `process` backend)."""
    import signal

    from connectors.training.launcher import Launcher, TemplateError, Templates

    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        err_console.print("[red]runwatch launch:[/] give the training command after --, e.g. "
                          "runwatch launch --run exp1 --run-dir out -- python train.py")
        return 2
    try:
        templates = Templates.from_strings(args.resume_args, args.skip_args, args.lr_args)
    except (TemplateError, ValueError) as exc:
        err_console.print(f"[red]runwatch launch:[/] {exc}")
        return 2
    for option, path in (("--data", args.data), ("--eval-data", args.eval_data),
                         ("--model", args.model)):
        if path is not None and not os.path.exists(path):
            err_console.print(f"[red]runwatch launch:[/] {option} {path}: no such file or "
                              f"folder (give the local path the training reads)")
            return 2
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    launcher = Launcher(args.run, argv, args.run_dir, templates=templates,
                        grace_s=args.grace, linger_s=args.linger, versions=args.versions,
                        data=args.data, eval_data=args.eval_data, model=args.model,
                        leak_field=args.leak_field)
    try:
        return launcher.serve(should_exit=lambda: bool(stop))
    except FileNotFoundError as exc:
        err_console.print(f"[red]runwatch launch:[/] {exc.filename}: command not found")
        return 127


def cmd_leakcheck(args: argparse.Namespace) -> int:
    """Eval rows that also sit in train: 0 when none, 1 when some, 2 on input it cannot use."""
    from bot.leakcheck_cli import run_leakcheck

    return run_leakcheck(args, console, err_console)


def cmd_audit(args: argparse.Namespace) -> int:
    """Print the audit log of actions (who asked, who confirmed, what ran, the result)."""
    from rich.table import Table

    from bot.actions import Actions

    settings = _settings(args)
    store = _open_store(settings.db_path)
    try:
        rows = Actions(store, settings.config.actions, workers=1).audit_log(args.run,
                                                                            args.limit)
    finally:
        store.close()
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    if not rows:
        console.print("no actions recorded" + (f" for {args.run}" if args.run else ""))
        return 0
    table = Table("time", "run", "action", "request", "who", "status", "detail")
    for row in rows:
        when = datetime.fromtimestamp(row["at"]).strftime("%Y-%m-%d %H:%M:%S")
        detail = (row["detail"] or "")
        if row.get("exit_status") is not None:
            detail += f" (exit status {row['exit_status']})"
        table.add_row(when, row["run"], row["action"], row.get("request_id") or "-",
                      row["actor"], row["status"], detail[:200])
    console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runwatch", description="Watch training runs, alert in Slack with fixes.")
    parser.add_argument("--config", help="runwatch.toml to use (default: RUNWATCH_CONFIG or "
                                         "./runwatch.toml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="run the bot: Slack when tokens are set, console otherwise")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", help="the end-to-end demo: a real training run with a fault")
    p.add_argument("--workdir", help="where the demo run and database go (default: a temp dir)")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--step-delay", type=float, default=0.1,
                   help="seconds per step, so there is time to watch (default 0.1)")
    p.add_argument("--fault", default="bad_batch", choices=["bad_batch", "lr", "nan", "none"],
                   help="fault injected into the training run: corrupted batches (default), "
                        "an LR burst, a NaN, or none")
    p.add_argument("--fault-step", type=int, default=150, help="step of the fault (default 150)")
    p.add_argument("--no-llm", action="store_true",
                   help="answer the demo's question from the facts alone, without SmolLM2")
    p.add_argument("--no-rollback", action="store_true",
                   help="do not roll back by itself: type /run rollback demo at the prompt")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("analyze", help="one-shot: read a log file or folder, print findings")
    p.add_argument("source", help="a log file, a folder of runs, or a URI (tb://, mlflow://, "
                                  "wandb://, hf://)")
    p.add_argument("--json", action="store_true", help="one JSON object per finding")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("inspect", help="what runwatch reads from a log file or folder: "
                                       "format, runs, tags, steps, malformed lines")
    p.add_argument("source", help="a log file, a folder of runs, or a URI (tb://, mlflow://, "
                                  "wandb://, hf://)")
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("sources", help="the configured sources and their health")
    p.set_defaults(func=cmd_sources)

    p = sub.add_parser("status", help="a run's state, progress, latest metrics and alerts")
    p.add_argument("run", help="run name")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("changes", help="what was changed then: a run's change events, the "
                                       "change in force at a step, or two runs side by side")
    p.add_argument("run", help="run name")
    p.add_argument("other", nargs="?", metavar="STEP|RUN",
                   help="a step (the change in force then) or a second run to compare with")
    p.set_defaults(func=cmd_changes)

    p = sub.add_parser("ask", help="answer a question about a run from its history")
    from bot.qa.cli import add_arguments as add_ask_arguments

    add_ask_arguments(p)
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("launch", help="run a training command under runwatch, so stop and "
                                      "rollback can restart it",
                       description="Start COMMAND and supervise it: runwatch's stop sends "
                                   "SIGTERM (SIGKILL after --grace), rollback stops it and "
                                   "starts it again with the resume arguments.")
    p.add_argument("--run", required=True, help="the run's name, as runwatch shows it")
    p.add_argument("--run-dir", required=True,
                   help="the run's directory (its log and checkpoints)")
    p.add_argument("--resume-args", help="arguments that resume from a checkpoint, e.g. "
                                         "'--resume-from {checkpoint}' ({checkpoint}, {step})")
    p.add_argument("--skip-args", help="arguments that skip batches, e.g. "
                                       "'--skip-batches {skip_first}-{skip_last}'")
    p.add_argument("--lr-args", help="arguments that scale the LR, e.g. '--lr-scale {lr_scale}'")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds between SIGTERM and SIGKILL (default 30)")
    p.add_argument("--linger", type=float, default=0.0,
                   help="seconds to stay after the command ends, for a rollback (default 0)")
    p.add_argument("--data", help="the training data's file or folder, hashed into the "
                                  "run's versions at each start")
    p.add_argument("--eval-data", help="the evaluation data's file or folder, likewise; with "
                                       "--data, the leakage check runs at the first start "
                                       "(30 s at most)")
    p.add_argument("--leak-field", default="text",
                   help="the text field the leakage check compares (default text)")
    p.add_argument("--model", help="the base model's folder (its weight files are hashed)")
    p.add_argument("--no-versions", dest="versions", action="store_false",
                   help="record no versions (command-line settings, data, model, code, "
                        "environment) at each start")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND …")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("leakcheck", help="eval rows that also appear in the training data "
                                         "(exact and near duplicates)")
    from bot.leakcheck_cli import add_arguments as add_leakcheck_arguments

    add_leakcheck_arguments(p)
    p.set_defaults(func=cmd_leakcheck)

    p = sub.add_parser("audit", help="the audit log of rollbacks and stops")
    p.add_argument("--run", help="only this run")
    p.add_argument("--limit", type=int, default=100, help="most recent rows (default 100)")
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("config", help="configuration tools")
    config_sub = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_sub.add_parser("check", help="validate and print the effective "
                                                "configuration (secrets masked)")
    check.set_defaults(func=cmd_config_check)

    p = sub.add_parser("bench", help="measure latency, poll cost and detection quality; "
                                     "results to BENCHMARKS.md")
    p.add_argument("which", choices=["latency", "poll", "ingest", "idle", "detect", "alerts",
                                     "ack", "chart", "qa", "hardening", "chaos", "real", "startup",
                                     "leakcheck", "versions", "store", "scale", "all"],
                   help="what to measure; 'all' is every speed figure (not detect or real)")
    p.add_argument("--output", default="BENCHMARKS.md", help="file to write results to")
    p.add_argument("--samples", type=int, default=20,
                   help="latency: spikes to time; chaos: SIGKILL cycles")
    p.add_argument("--runs", type=int, default=None,
                   help="poll: watched runs (default 100); scale: live runs (default 1000); "
                        "store: runs backfilled (default 100; 1000: 8M points)")
    p.add_argument("--train-rows", type=int, default=1_000_000,
                   help="leakcheck: training texts, against 10,000 eval texts (default 1M)")
    p.add_argument("--minutes", type=float, default=5.0,
                   help="scale: minutes of load (a writer appending to every run)")
    p.add_argument("--max-history", type=int, default=1_000_000,
                   help="scale: the longest history timed per poll (1000, 100000, 1000000)")
    p.add_argument("--points", type=int, default=10, help="poll: new points per run")
    p.add_argument("--seed", type=int, default=0, help="detect: seed of the synthetic suite")
    p.add_argument("--repeats", type=int, default=4,
                   help="detect: synthetic runs per signal, variant and strength")
    p.add_argument("--speed", action="store_true",
                   help="detect: also time a 1M-point run and 100 new points on 10k/1M")
    p.add_argument("--seeds", type=int, default=1,
                   help="detect: also draw the suite with this many seeds from --seed on and "
                        "table F1, delay and the targets met on each")
    p.add_argument("--signal", action="append", metavar="SIGNAL",
                   help="detect: score and explain only this signal (repeatable), case by "
                        "case; writes nothing")
    p.add_argument("--outcomes", action="store_true",
                   help="real: the dev half alone, with its missed events and false alarms "
                        "per file, to guide tuning (the test half is not read)")
    p.add_argument("--oracle", action="store_true",
                   help="real: the dev half alone: which labelled events an oracle with "
                        "hindsight detects from the logged points, and which are label or "
                        "format issues")
    p.add_argument("--model", default="smollm2",
                   help="qa: the model scored beside the deterministic answerer ('smollm2', a "
                        "model folder or .gguf file, or 'none')")
    p.add_argument("--limit", type=int,
                   help="qa: ask the model only N questions, spread over every kind")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return args.func(args)
    except ConfigError as exc:
        err_console.print(f"[red]config error:[/] {exc}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
