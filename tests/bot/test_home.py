"""App Home through Bolt's real request verification: a signed ``app_home_opened`` event
publishes the overview of the runs, their health and last alert."""

import json
import time

import pytest

from benchmarks.devslack import event_callback_body, post_signed
from bot.config import Config, SourceConfig
from tests.helpers import running_bot

SECRET = "home-secret"


def post_event(bot, event, event_id):
    url = f"http://127.0.0.1:{bot.http_port}/slack/events"
    return post_signed(url, event_callback_body(event, event_id), SECRET)[0]


@pytest.mark.slow
def test_opening_the_home_tab_publishes_every_run_with_its_last_alert(tmp_path):
    runs = tmp_path / "runs"
    for name, last in (("exp1", "2.5"), ("exp2", "NaN")):
        (runs / name).mkdir(parents=True)
        lines = [json.dumps({"step": s, "loss": 3.0 - 0.01 * s, "time": time.time()})
                 for s in range(1, 40)]
        (runs / name / "metrics.jsonl").write_text(
            "\n".join(lines) + f'\n{{"step": 40, "loss": {last}, "time": {time.time()}}}\n')
    config = Config(poll_interval=3600, sources=[SourceConfig(path=str(runs))],
                    slack={"channel": "C0ALERTS", "host": "127.0.0.1", "port": 0})
    with running_bot(tmp_path, config, SECRET) as (bot, local):
        assert post_event(bot, {"type": "app_home_opened", "user": "U1",
                                "channel": "D1", "tab": "home"}, "Ev01") == 200
        [call] = local.wait_for("views.publish")
        # the messages tab is not the home tab: nothing to draw
        post_event(bot, {"type": "app_home_opened", "user": "U1",
                         "channel": "D1", "tab": "messages"}, "Ev02")
        time.sleep(0.5)
    assert len(local.calls_to("views.publish")) == 1
    assert call.args["user_id"] == "U1"
    view = call.args["view"] if isinstance(call.args["view"], dict) else \
        json.loads(call.args["view"])
    assert view["type"] == "home"
    text = json.dumps(view["blocks"])
    assert "*exp1* " in text and "*exp2* " in text
    assert "last alert" in text and "spike at step 40 (firing" in text  # exp2's NaN
    assert "no alerts yet" in text  # exp1
