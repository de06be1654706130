"""App Home through Bolt's real request verification: a signed ``app_home_opened`` event
publishes the overview of the runs, their health and last alert."""

import json
import re
import time

import pytest

from benchmarks.devslack import event_callback_body, post_signed
from bot.config import Config, SourceConfig
from tests.helpers import running_bot

SECRET = "home-secret"


def post_event(bot, event, event_id):
    url = f"http://127.0.0.1:{bot.http_port}/slack/events"
    return post_signed(url, event_callback_body(event, event_id), SECRET)[0]


def home_event(tab="home"):
    return {"type": "app_home_opened", "user": "U1", "channel": "D1", "tab": tab}


def published_view(call):
    view = call.args["view"]
    return view if isinstance(view, dict) else json.loads(view)


def bot_config(runs):
    return Config(poll_interval=3600, sources=[SourceConfig(path=str(runs))],
                  slack={"channel": "C0ALERTS", "host": "127.0.0.1", "port": 0})


@pytest.mark.slow
def test_opening_the_home_tab_publishes_every_run_with_its_last_alert(tmp_path):
    runs = tmp_path / "runs"
    for name, last in (("exp1", "2.5"), ("exp2", "NaN")):
        (runs / name).mkdir(parents=True)
        lines = [json.dumps({"step": s, "loss": 3.0 - 0.01 * s, "time": time.time()})
                 for s in range(1, 40)]
        (runs / name / "metrics.jsonl").write_text(
            "\n".join(lines) + f'\n{{"step": 40, "loss": {last}, "time": {time.time()}}}\n')
    with running_bot(tmp_path, bot_config(runs), SECRET) as (bot, local):
        assert post_event(bot, home_event(), "Ev01") == 200
        [call] = local.wait_for("views.publish")
        # the messages tab is not the home tab: nothing to draw
        post_event(bot, home_event("messages"), "Ev02")
        time.sleep(0.5)
    assert len(local.calls_to("views.publish")) == 1
    assert call.args["user_id"] == "U1"
    view = published_view(call)
    assert view["type"] == "home"
    text = json.dumps(view["blocks"])
    assert "*exp1* " in text and "*exp2* " in text
    # exp2's NaN is open trouble of its kind; exp1 has none and shows its last alert
    assert "Not learning well" in text and "spike at step 40" in text
    assert "no alerts yet" in text


def _write_run(folder, lines):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")


def test_home_groups_runs_by_the_kind_of_their_open_alerts(tmp_path):
    """A starved data loader is *slow*, a NaN loss is *not learning well*, a healthy run has
    no trouble: each under its own section, with the alert of that kind beside it."""
    runs, now = tmp_path / "runs", time.time()
    _write_run(runs / "fast", [{"step": s, "loss": 3.0 - 0.001 * s,
                                "tokens_per_second": 1000.0 + (s % 7), "time": now}
                               for s in range(1, 301)])
    _write_run(runs / "starved", [{"step": s, "loss": 3.0 - 0.001 * s,
                                   "tokens_per_second": (1000.0 if s < 200 else 450.0)
                                   + (s % 7), "time": now} for s in range(1, 301)])
    _write_run(runs / "nan", [{"step": s, "loss": 3.0 - 0.001 * s if s < 300 else "NaN",
                               "time": now} for s in range(1, 301)])
    with running_bot(tmp_path, bot_config(runs), SECRET) as (bot, local):
        assert post_event(bot, home_event(), "Ev03") == 200
        [call] = local.wait_for("views.publish")
    view = published_view(call)
    texts = [b["text"]["text"] if "text" in b and isinstance(b["text"], dict) else
             b.get("elements", [{}])[0].get("text", "") for b in view["blocks"]]
    joined = "\n".join(texts)

    def section(title):
        start = next(i for i, t in enumerate(texts) if title in t)
        end = next((i for i in range(start + 1, len(texts))
                    if any(k in texts[i] for k in ("*Slow*", "*Not learning well*",
                                                   "*Keeps stopping*", "*No open trouble*"))),
                   len(texts))
        return "\n".join(texts[start:end])

    assert "*Keeps stopping*" not in joined  # no run is in that trouble
    slow, learning, quiet = (section("*Slow*"), section("*Not learning well*"),
                             section("*No open trouble*"))
    assert "*starved*" in slow and "throughput_drop at step 200" in slow
    assert "*nan*" not in slow and "*fast*" not in slow
    assert "*nan*" in learning and "spike at step 300" in learning
    assert "*starved*" not in learning
    assert "*fast*" in quiet and "no alerts yet" in quiet
    # sections come in the digest's order of kinds
    assert joined.index("*Slow*") < joined.index("*Not learning well*") \
        < joined.index("*No open trouble*")


def test_home_keeps_within_slacks_block_limit_and_counts_who_is_left_out():
    from bot.services.runs import RunHealth, RunList
    from bot.views.home import MAX_BLOCKS, home_view

    troubled = [RunHealth(f"r{i:02d}", "running", 1, 10, None, None, 1, "warning", 1.0,
                          (("slow", "throughput_drop", "warning", 5, "tokens/s fell"),))
                for i in range(30)]
    quiet = [RunHealth(f"q{i:02d}", "running", 1, 10, None, None, 0, None, 1.0)
             for i in range(40)]
    view = home_view(RunList(troubled + quiet, finished=2), {}, now=0.0)
    assert len(view["blocks"]) <= MAX_BLOCKS
    shown = set(re.findall(r"\*([rq]\d\d)\* running", json.dumps(view["blocks"])))
    footer = view["blocks"][-1]["elements"][0]["text"]
    assert 20 < len(shown) < 70
    assert f"{70 - len(shown)} more runs: `/run list`" in footer and "2 finished" in footer
    assert "*r00*" in json.dumps(view["blocks"])  # troubled runs come first
