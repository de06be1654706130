"""Text from logs and people is shown in Slack as text (issue 23's security review): a run
folder named ``<!channel>`` or a question quoting a link must not notify a channel or hide
a link when runwatch repeats it."""

import json

import pytest

from benchmarks.devslack import LocalSlack, post_signed, slash_command_body
from bot.config import Config, Secrets, Settings, SourceConfig
from bot.serve import Bot
from bot.slack.text import neutralize, neutralize_blocks, neutralize_payload

SECRET = "test-signing-secret"
ACTIVE = ("<!channel>", "<!here>", "<!everyone>", "<!subteam^S0OTHER>",
          "<https://evil.example|the runbook>", "<mailto:x@evil.example|mail>")


@pytest.mark.parametrize("token", ACTIVE)
def test_every_special_mention_and_link_is_escaped(token):
    text = neutralize(f"loss of {token} rose")
    assert token not in text and "&lt;" + token[1:-1] + "&gt;" in text


def test_the_configured_oncall_group_and_people_mentions_are_kept():
    text = "<!subteam^S0ONCALL> <@U0ASKER> look at <!subteam^S0OTHER>"
    assert neutralize(text, {"<!subteam^S0ONCALL>"}) == (
        "<!subteam^S0ONCALL> <@U0ASKER> look at &lt;!subteam^S0OTHER&gt;")


def test_blocks_as_objects_and_as_form_encoded_json_are_neutralized():
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "run <!here>"},
               "fields": [{"type": "mrkdwn", "text": "<https://x.example|y>"}]}]
    assert "<!here>" not in json.dumps(neutralize_blocks(blocks))
    form = neutralize_payload({"channel": "C1", "text": "<!channel>",
                               "blocks": json.dumps(blocks)})
    assert form["channel"] == "C1" and form["text"] == "&lt;!channel&gt;"
    assert "<!here>" not in form["blocks"] and "&lt;!here&gt;" in form["blocks"]


def _settings(tmp_path, local):
    config = Config(poll_interval=3600.0, sources=[SourceConfig(path=str(tmp_path / "runs"))],
                    slack={"channel": "C0ALERTS", "host": "127.0.0.1", "port": 0},
                    alerting={"oncall": "S0ONCALL"})
    secrets = Secrets(slack_bot_token="xoxb-test", slack_signing_secret=SECRET,
                      slack_api_url=local.api_url)
    return Settings(config=config, secrets=secrets, config_path=None,
                    db_path=str(tmp_path / "runwatch.db"))


@pytest.mark.slow
def test_a_run_named_by_whoever_writes_logs_notifies_nobody(tmp_path):
    run = tmp_path / "runs" / "<!channel> see <https:evil.example|docs>"
    run.mkdir(parents=True)
    lines = [json.dumps({"step": s, "loss": 3.0 - 0.02 * s}) for s in range(1, 30)]
    (run / "metrics.jsonl").write_text("\n".join(lines + ['{"step": 30, "loss": NaN}']) + "\n")
    with LocalSlack(signing_secret=SECRET) as local, \
            Bot(_settings(tmp_path, local)).start(poll=False) as bot:
        bot.engine.poll()
        [alert] = local.wait_for("chat.postMessage", timeout=10)
        url = f"http://127.0.0.1:{bot.http_port}/slack/events"
        body = slash_command_body(text="status <!everyone>",
                                  response_url=local.new_response_url())
        assert post_signed(url, body, SECRET)[0] == 200
        [reply] = local.wait_for("response_url", timeout=10)
        local.wait_for("files.completeUploadExternal", timeout=10)
    # what Slack renders as mrkdwn (a file's title is plain text, shown as it is)
    sent = json.dumps([alert.args, reply.args, *(c.args["initial_comment"] for c in
                                                 local.calls_to("files.completeUploadExternal"))])
    assert "NaN" in alert.args["text"] and "&lt;!channel&gt;" in alert.args["text"]
    for token in ("<!channel>", "<https:evil.example|docs>", "<!everyone>"):
        assert token not in sent
