"""The `/run status` reply and the help text."""

from __future__ import annotations

from slack_sdk.models.blocks import ContextBlock, HeaderBlock, MarkdownTextObject, SectionBlock

from analyzers.fmt import fmt_duration
from bot.services.status import RunStatus, fmt_value, progress_bar
from bot.views.message import Message

TAG_LABELS = {"train/loss": "train loss", "eval/loss": "eval loss", "lr": "LR",
              "grad_norm": "grad norm", "throughput": "throughput", "gpu_mem": "GPU memory"}

HELP = """*`/run` — runwatch*
`/run status RUN` — state, progress, latest metrics, last checkpoint, open alerts
`/run list` — active runs, one line of health each
`/run plot RUN [METRICS…] [A-B]` — the time-aligned chart (loss, LR, grad norm, throughput, \
memory; checkpoints and earlier attempts), uploaded to the channel
`/run compare RUN RUN [METRICS…]` — settings that differ, metrics at equal steps, an overlay chart
`/run changes RUN [STEP|RUN]` — what was changed then: config, data, model, code, environment
`/run stoploss RUN ["3 evals < 0.5% on eval/loss"]` — the run's agreed stop-loss rule, or declare it
`/run digest` — the day: runs, alerts, best evals, by kind of trouble (slow, not learning \
well, keeps stopping)
`/run rollback RUN [STEP] [--skip A-B|no] [--lr-scale X]` — roll back (asks to confirm)
`/run stop RUN` — stop the run (asks to confirm)
`/run confirm ID` / `/run cancel ID` — answer a pending rollback or stop
`/run alerts [RUN]` — what is pending or firing; `/run ack FINGERPRINT` — acknowledge one
`/run silence MATCHERS DURATION REASON` — e.g. `run=exp1 signal=plateau 2h flaky eval`
`/run silences` — active silences; `/run silence expire ID` ends one
`/run ask RUN QUESTION` — e.g. `/run ask exp1 what changed at step 2000?` (or reply in an
alert's thread, or mention @runwatch with a run name)
`/run help` — this message"""


def status_lines(s: RunStatus) -> dict[str, str]:
    """The facts of a status as label → text, shared by Slack and the terminal."""
    lines: dict[str, str] = {"state": s.state + (f" (attempt {s.attempt})" if s.attempt > 1
                                                 else "")}
    if s.step is not None:
        if s.total_steps:
            lines["progress"] = (f"`{progress_bar(s.progress or 0)}` step {s.step} of "
                                 f"{s.total_steps} ({(s.progress or 0):.0%})")
        else:
            lines["progress"] = f"step {s.step} (total unknown)"
    if s.eta_seconds is not None:
        lines["ETA"] = fmt_duration(s.eta_seconds)
    for tag, label in TAG_LABELS.items():
        if tag in s.latest:
            step, value = s.latest[tag]
            lines[label] = fmt_value(value) + (f" (step {step})" if step != s.step else "")
    if s.last_checkpoint:
        cp = s.last_checkpoint
        lines["last checkpoint"] = f"step {cp['step']}, {fmt_duration(cp['age_seconds'])} ago"
    else:
        lines["last checkpoint"] = "none found"
    if s.open_alerts:
        lines["open alerts"] = "; ".join(f"{a['severity']} {a['signal']} since step "
                                         f"{a['onset_step']}" for a in s.open_alerts)
    else:
        lines["open alerts"] = "none"
    if s.malformed_lines:
        lines["log problems"] = (f"{s.malformed_lines} malformed lines skipped, first at line "
                                 f"{s.first_malformed_line}: {s.first_malformed_error}")
    if s.skipped_values:
        lines["skipped values"] = f"{s.skipped_values} non-numeric values ignored"
    if s.last_notice:
        lines["last notice"] = s.last_notice
    lines.update({k: str(v) for k, v in s.extra.items()})
    return lines


def status_message(s: RunStatus) -> Message:
    lines = status_lines(s)
    fields = [MarkdownTextObject(text=f"*{k}*\n{v}") for k, v in lines.items()
              if k not in ("progress", "open alerts", "log problems")]
    blocks = [HeaderBlock(text=f"{s.run}: {s.state}"[:150])]
    if "progress" in lines:
        blocks.append(SectionBlock(text=MarkdownTextObject(text=lines["progress"])))
    for i in range(0, len(fields), 10):
        blocks.append(SectionBlock(fields=fields[i:i + 10]))
    blocks.append(SectionBlock(text=MarkdownTextObject(text=f"*open alerts*\n"
                                                            f"{lines['open alerts']}")))
    if "log problems" in lines:
        blocks.append(ContextBlock(elements=[MarkdownTextObject(
            text=f":warning: {lines['log problems']}")]))
    text = f"{s.run}: " + "; ".join(f"{k} {v}" for k, v in lines.items())
    return Message(text=text.replace("`", ""), blocks=[b.to_dict() for b in blocks],
                   kind="status", data={"status": s})


def help_message(note: str | None = None) -> Message:
    text = (f"{note}\n" if note else "") + HELP
    return Message(text=text, blocks=[SectionBlock(text=MarkdownTextObject(text=text)).to_dict()],
                   kind="help")
