"""Configuration: ``runwatch.toml`` validated on load, secrets from the environment.

An unknown key or a value of the wrong type is a :class:`ConfigError` whose message names
the key and the file, so ``runwatch config check`` can say exactly what to fix.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from bot.alerting.lifecycle import (
    ALERT_LABELS,
    DEFAULT_ESCALATE_AFTER,
    DEFAULT_GROUP_INTERVAL,
    DEFAULT_GROUP_WAIT,
    DEFAULT_INHIBIT_RULES,
    DEFAULT_REPEAT_INTERVAL,
    InhibitRule,
    LifecycleError,
    Matcher,
    Route,
    Rule,
    Timing,
)
from bot.qa.config import ModelConfig
from connectors.aliases import CANONICAL_TAGS, STEP, TIME

if TYPE_CHECKING:
    from connectors.formats import LinePattern

# The analyzers (pandas, numpy) and the sources' readers are imported where a configuration
# is validated, not with this module: every command imports it, `runwatch --help` included.

DEFAULT_CONFIG_NAME = "runwatch.toml"
DEFAULT_DB = "runwatch.db"


class ConfigError(ValueError):
    """A configuration problem a user can fix; the message says where and what."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, validate_default=True)


class SourceConfig(_Strict):
    path: str = Field(description="A log file, a folder whose runs are picked up as they "
                                  "appear, or a URI such as tb://logdir")
    run: str | None = Field(None, description="Run name for one file (default: the file's name)")


class PatternConfig(_Strict):
    """A line pattern for text logs (see connectors.formats.LinePattern)."""

    name: str = Field(description="Format family; patterns sharing a name are one format")
    regex: str = Field(description="Searched in each line; named groups step, total, time, "
                                   "stride, epoch…, others are metrics")
    names: dict[str, str] = Field(default_factory=dict,
                                  description="Group or pair key → metric name ('' drops it)")
    pairs: str | None = Field(None, description="Regex with key/value groups for the rest "
                                                "of the line")
    counts_steps: bool = Field(False, description="Each match is the next logged step")

    @model_validator(mode="after")
    def _compiles(self) -> PatternConfig:
        self.line_pattern()
        return self

    def line_pattern(self) -> LinePattern:
        from connectors.formats import LinePattern

        return LinePattern(**self.model_dump())


class SlackConfig(_Strict):
    channel: str = Field("#training-alerts", description="Channel for alerts")
    mode: Literal["auto", "socket", "http"] = Field(
        "auto", description="auto: Socket Mode when SLACK_APP_TOKEN is set, HTTP otherwise")
    host: str = Field("0.0.0.0", description="HTTP mode: address to listen on")
    port: int = Field(3000, ge=0, le=65535,
                      description="HTTP mode: port to listen on (0: any free port)")
    path: str = Field("/slack/events", description="HTTP mode: request URL path")
    digest_cron: str | None = Field(
        None, description="When to post the daily digest to the channel, as a crontab "
                          "(UTC), e.g. '0 9 * * *'; none: no digest (`/run digest` still works)")

    @field_validator("digest_cron")
    @classmethod
    def _digest_cron_parses(cls, value: str | None) -> str | None:
        if value is not None:
            from apscheduler.triggers.cron import CronTrigger

            try:
                CronTrigger.from_crontab(value, timezone="UTC")
            except ValueError as exc:
                raise ValueError(f"digest_cron {value!r} is not a crontab ({exc}); write five "
                                 f"fields, e.g. '0 9 * * *' for 09:00 every day") from None
        return value


class OutboxConfig(_Strict):
    max_attempts: int = Field(8, ge=1, description="Sends tried before a message is given up")
    backoff_seconds: float = Field(5.0, gt=0, description="First retry delay; doubles each try")
    backoff_max_seconds: float = Field(300.0, gt=0, description="Longest retry delay")


class StoreConfig(_Strict):
    url: str | None = Field(None, description="Where the store lives: a SQLite file (the "
                            "default, see `db`), or postgresql://user@host:port/db to keep "
                            "it on a database server (one `runwatch serve` a database)")
    keep_points_days: float | None = Field(
        None, gt=0, description="Finished runs keep every point this many days, then "
        "min/max/last per bucket (spikes and NaN kept); unset: every point forever")


class Permission(_Strict):
    """Who may ask for one action. A user is allowed when listed or in a listed user group,
    and only from the listed channels when any are listed. Empty: nobody (from Slack)."""

    users: list[str] = Field(default_factory=list, description="Slack user ids (U…)")
    usergroups: list[str] = Field(default_factory=list, description="Slack user group ids (S…)")
    channels: list[str] = Field(default_factory=list,
                                description="Channel ids (C…) it may be asked from; empty: any")


class RunActions(_Strict):
    """How actions reach the runs whose name matches ``run`` (a glob pattern)."""

    run: str = Field(description="Run name or glob pattern, e.g. 'exp*'")
    backend: Literal["auto", "control", "process", "command"] = Field(
        "auto", description="auto: the launcher when `runwatch launch` started the run, the "
                            "training-side callbacks' control files otherwise")
    dir: str | None = Field(None, description="The run's directory (default: its log's folder)")
    stop: list[str] = Field(default_factory=list,
                            description="command backend: argv template to stop the run")
    rollback: list[str] = Field(default_factory=list,
                                description="command backend: argv template to resume it")
    values: dict[str, str] = Field(default_factory=dict,
                                   description="command backend: fixed placeholder values "
                                               "(e.g. job_id)")
    timeout_s: float = Field(300.0, gt=0, description="command backend: seconds per command")

    @model_validator(mode="after")
    def _templates_valid(self) -> RunActions:
        from connectors.training.launcher import check_template

        for name in ("stop", "rollback"):
            check_template(name, getattr(self, name))
        for key, value in self.values.items():
            if not key.isidentifier() or not value or any(ord(c) < 32 for c in value):
                raise ValueError(f"values.{key}: a placeholder value must be a non-empty "
                                 f"single-line string under an identifier")
        if self.backend == "command" and not (self.stop or self.rollback):
            raise ValueError(f"run {self.run!r}: the command backend needs a stop or rollback "
                             f"template")
        return self


class ActionsConfig(_Strict):
    dry_run: bool = Field(False, description="Record and show what would run; run nothing")
    confirm_within_s: float = Field(900.0, gt=0,
                                    description="A request not confirmed within this expires")
    ack_timeout_s: float = Field(120.0, gt=0, description="Seconds to wait for the training "
                                                          "process to answer a request")
    skip_batches: bool = Field(True, description="Rollbacks offered from an alert skip the "
                                                 "batches from the checkpoint to the trouble")
    lr_scale: float = Field(1.0, gt=0, le=1, description="Rollbacks offered from an alert "
                                                         "scale the LR by this (OPT used 0.9)")
    console: bool = Field(True, description="The local console (no Slack) may act")
    permissions: dict[Literal["rollback", "stop"], Permission] = Field(default_factory=dict)
    runs: list[RunActions] = Field(default_factory=list)


class SignalRuleConfig(_Strict):
    """Hysteresis for one signal's alerts (see bot.alerting.lifecycle.Rule)."""

    pending_steps: int = Field(0, ge=0, description="Steps a finding must persist before it "
                                                    "fires")
    pending_evaluations: int = Field(0, ge=0, description="Further polls that must report it "
                                                          "before it fires")
    keep_firing_steps: int = Field(0, ge=0, description="Steps it stays firing after the "
                                                        "analyzer resolves it (against flapping)")


class RouteConfig(_Strict):
    """Alerts whose labels match go to ``channel``; the first matching route wins."""

    channel: str = Field(description="Channel for these alerts")
    run: str | None = Field(None, description="Regular expression the run name must match")
    project: str | None = Field(None, description="The run's `project` (from its metadata)")
    team: str | None = Field(None, description="The run's `team` (from its metadata)")
    severity: list[Literal["critical", "warning", "info"]] = Field(default_factory=list)
    signal: list[str] = Field(default_factory=list)
    oncall: str | None = Field(None, description="User group (S…) mentioned on escalation")

    @field_validator("run")
    @classmethod
    def _run_regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"run {value!r} is not a regular expression: {exc}") from None
        return value

    def route(self) -> Route:
        matchers = [Matcher("run", "=~", self.run)] if self.run else []
        matchers += [Matcher(name, "=", value) for name, value in
                     (("project", self.project), ("team", self.team)) if value is not None]
        matchers += [Matcher(name, "=~", "|".join(map(re.escape, values)))
                     for name, values in (("severity", self.severity), ("signal", self.signal))
                     if values]
        return Route(self.channel, tuple(matchers), self.oncall)


class InhibitConfig(_Strict):
    """A firing alert matching ``source`` mutes alerts matching ``target`` that share the
    ``equal`` labels. Values are one label value or a list of them."""

    source: dict[str, str | list[str]]
    target: dict[str, str | list[str]]
    equal: list[str] = Field(default_factory=lambda: ["run"])
    within_steps: int | None = Field(None, ge=0, description="Onsets at most this many steps "
                                                             "apart")

    def rule(self) -> InhibitRule:
        return InhibitRule.from_dict(self.source, self.target, self.equal, self.within_steps)


class AlertingConfig(_Strict):
    """The alert lifecycle: timing, per-signal hysteresis, routing and inhibition."""

    group_wait: float = Field(DEFAULT_GROUP_WAIT, ge=0,
                              description="Seconds a new group waits for alerts to join")
    group_interval: float = Field(DEFAULT_GROUP_INTERVAL, gt=0,
                                  description="Seconds alerts join a group's message in place")
    repeat_interval: float = Field(DEFAULT_REPEAT_INTERVAL, gt=0,
                                   description="Seconds before an unacknowledged critical "
                                               "alert is posted again")
    escalate_after: float = Field(DEFAULT_ESCALATE_AFTER, gt=0,
                                  description="Seconds before an unacknowledged critical "
                                              "alert mentions the on-call group")
    oncall: str | None = Field(None, description="Slack user group (S…) to mention on "
                                                 "escalation; none: no escalation")
    min_severity: Literal["critical", "warning", "info"] = Field(
        "warning", description="Lowest severity posted to a channel; alerts below it are "
                               "kept (/run status, App Home, answers) but not posted")
    signals: dict[str, SignalRuleConfig] = Field(default_factory=dict)
    routes: list[RouteConfig] = Field(default_factory=list)
    inhibit: list[InhibitConfig] | None = Field(None, description="Inhibition rules (default: "
                                                                  "bot.alerting.lifecycle's)")

    @model_validator(mode="after")
    def _valid(self) -> AlertingConfig:
        from analyzers import REGISTRY, load
        from analyzers.catalog import CATALOG

        known = sorted(set(CATALOG) | set(load()) | set(REGISTRY))
        for signal in self.signals:
            if signal not in known:
                raise ValueError(f"alerting.signals.{signal}: unknown signal; known: "
                                 f"{', '.join(known)}")
        for i, rule in enumerate(self.inhibit or []):
            try:
                rule.rule()
            except LifecycleError as exc:
                raise ValueError(f"alerting.inhibit[{i}]: {exc}") from None
            unknown = [name for name in rule.equal if name not in ALERT_LABELS]
            if unknown:
                raise ValueError(f"alerting.inhibit[{i}].equal: label {unknown[0]!r} unknown; "
                                 f"known: {', '.join(ALERT_LABELS)}")
        return self

    def rule(self, signal: str) -> Rule:
        spec = self.signals.get(signal)
        return Rule(**spec.model_dump()) if spec else Rule()

    def timing(self) -> Timing:
        return Timing(self.group_wait, self.group_interval, self.repeat_interval,
                      self.escalate_after)

    def inhibit_rules(self) -> tuple[InhibitRule, ...]:
        return DEFAULT_INHIBIT_RULES if self.inhibit is None else \
            tuple(r.rule() for r in self.inhibit)


# The analyzers that judge eval suites by name (``suites = [...]``, issue 26 part 4).
SUITE_ANALYZERS = ("forgetting", "business_flat")
_SUITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class EvalSuiteConfig(_Strict):
    """A named, versioned eval suite (seed §3.4, §5.3): a file of prompts or examples, whose
    content hash is its version, or the metrics under a prefix, with a declared version."""

    name: str = Field(description="The suite's name, used by `suites = [...]` of forgetting "
                                  "and business_flat")
    file: str | None = Field(None, description="A file of the suite's prompts or examples; "
                             "its sha256 (first 12 hex digits) is the version. Relative to "
                             "the config file's folder")
    metric_prefix: str | None = Field(None, description="Where the suite's metrics are "
                                      "logged (default eval/<name>/)")
    version: str | None = Field(None, description="With metric_prefix alone: the suite's "
                                "version, to bump when the suite changes")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _SUITE_NAME.match(value):
            raise ValueError(f"eval suite name {value!r}: use letters, digits, '_', '-' or '.', "
                             f"e.g. 'mmlu'")
        return value

    @field_validator("file")
    @classmethod
    def _file_readable(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        path = Path(value).expanduser()
        if not path.is_absolute() and info.context and info.context.get("config_dir"):
            path = Path(info.context["config_dir"]) / path
        if not path.is_file():
            raise ValueError(f"eval suite file {str(path)!r} not found; fix the path (a "
                             f"relative one is read from the config file's folder)")
        return str(path)

    @model_validator(mode="after")
    def _one_source(self) -> EvalSuiteConfig:
        if self.file is None and self.metric_prefix is None:
            raise ValueError(f"eval suite {self.name!r}: give `file` (its prompts; the content "
                             f"hash is the version) or `metric_prefix` (e.g. "
                             f"'eval/{self.name}/', with an optional `version`)")
        if self.file is not None and self.version is not None:
            raise ValueError(f"eval suite {self.name!r}: a file suite's version is its content "
                             f"hash; drop `version`, or drop `file` and keep `metric_prefix`")
        if self.metric_prefix is not None and not self.metric_prefix.strip("/"):
            raise ValueError(f"eval suite {self.name!r}: metric_prefix is empty; write where "
                             f"its metrics are logged, e.g. 'eval/{self.name}/'")
        return self

    @property
    def prefix(self) -> str:
        """Where the suite's metrics are: ``metric_prefix`` or ``eval/<name>/``."""
        return self.metric_prefix or f"eval/{self.name}/"

    def current_version(self) -> str | None:
        """The version now: the file's content hash (None when it cannot be read any more),
        or the declared version (None when none is declared)."""
        if self.file is None:
            return self.version
        from connectors.training.versions import suite_version

        try:
            return suite_version(self.file)
        except OSError:
            return None


class Config(_Strict):
    poll_interval: float = Field(30.0, gt=0, description="Seconds between polls of the sources")
    db: str | None = Field(None, description="SQLite file (default RUNWATCH_DB or runwatch.db)")
    patterns: list[PatternConfig] = Field(default_factory=list,
                                          description="Extra line patterns for text logs")
    sources: list[SourceConfig] = Field(default_factory=list)
    aliases: dict[str, str] = Field(default_factory=dict,
                                    description="Extra metric names mapped to canonical tags")
    analyzers: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                                 description="Per-signal analyzer parameters")
    slack: SlackConfig = Field(default_factory=SlackConfig)
    outbox: OutboxConfig = Field(default_factory=OutboxConfig)
    actions: ActionsConfig = Field(default_factory=ActionsConfig)
    qa: ModelConfig = Field(default_factory=lambda: ModelConfig(backend="none"),
                            description="The model that phrases answers (default: none, "
                                        "answers built from the facts alone)")
    alerting: AlertingConfig = Field(default_factory=AlertingConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    eval_suites: list[EvalSuiteConfig] = Field(
        default_factory=list, description="Named, versioned eval suites; forgetting and "
                                          "business_flat judge them by name (`suites`)")

    @field_validator("aliases")
    @classmethod
    def _aliases_target_canonical(cls, value: dict[str, str]) -> dict[str, str]:
        for name, tag in value.items():
            if tag not in (*CANONICAL_TAGS, STEP, TIME) and not tag.startswith("eval/"):
                raise ValueError(f"alias {name!r} maps to {tag!r}, which is not a canonical tag "
                                 f"({', '.join(CANONICAL_TAGS)}, eval/<suite>/<metric>) nor "
                                 f"'{STEP}' or '{TIME}'")
        return value

    @model_validator(mode="after")
    def _sources_readable(self) -> Config:
        from connectors.registry import open_source

        patterns = [p.line_pattern() for p in self.patterns]
        for i, source in enumerate(self.sources):
            try:
                open_source(source.path, source.run, patterns=patterns)
            except ValueError as exc:  # a scheme or a file runwatch cannot read
                raise ValueError(f"sources[{i}]: {exc}") from None
        return self

    @field_validator("analyzers")
    @classmethod
    def _analyzers_known(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        from analyzers import build

        build(value)
        return value

    @model_validator(mode="after")
    def _suites_declared(self) -> Config:
        names = [suite.name for suite in self.eval_suites]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"eval_suites: suite {twice[0]!r} is declared twice; give each "
                             f"suite one [[eval_suites]] entry")
        for signal, params in self.analyzers.items():
            suites = params.get("suites")
            if signal not in SUITE_ANALYZERS or suites is None:
                continue
            if not isinstance(suites, list) or not all(isinstance(s, str) for s in suites):
                raise ValueError(f"analyzers.{signal}.suites: a list of eval suite names, e.g. "
                                 f"suites = [\"mmlu\"]")
            unknown = [name for name in suites if name not in names]
            if unknown:
                known = f"known: {', '.join(names)}" if names else "none is declared yet"
                raise ValueError(f"analyzers.{signal}.suites: unknown eval suite {unknown[0]!r}; "
                                 f"declare it under [[eval_suites]] ({known})")
        return self

    def suite(self, name: str) -> EvalSuiteConfig | None:
        return next((s for s in self.eval_suites if s.name == name), None)

    def analyzer_settings(self) -> dict[str, dict[str, Any]]:
        """``analyzers`` as the analyzers take them: each ``suites`` list of names becomes a
        mapping of name → the suite's metric prefix."""
        settings = {signal: dict(params) for signal, params in self.analyzers.items()}
        for params in settings.values():
            if isinstance(params.get("suites"), list):
                params["suites"] = {name: suite.prefix for name in params["suites"]
                                    if (suite := self.suite(name)) is not None}
        return settings


class Secrets(BaseModel):
    """Secrets and endpoints from the environment; never written to the config file."""

    slack_bot_token: str | None = None
    slack_signing_secret: str | None = None
    slack_app_token: str | None = None
    slack_api_url: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Secrets:
        env = os.environ if env is None else env
        return cls(
            slack_bot_token=env.get("SLACK_BOT_TOKEN") or None,
            slack_signing_secret=env.get("SLACK_SIGNING_SECRET") or None,
            slack_app_token=env.get("SLACK_APP_TOKEN") or None,
            slack_api_url=env.get("SLACK_API_URL") or None,
        )

    @property
    def slack_enabled(self) -> bool:
        return bool(self.slack_bot_token)

    def masked(self) -> dict[str, str | None]:
        def mask(value: str | None) -> str | None:
            if not value:
                return None
            kind, dash, _ = value.partition("-")
            return f"{kind}-****" if dash and kind in ("xoxb", "xoxp", "xapp") else "****"

        return {
            "SLACK_BOT_TOKEN": mask(self.slack_bot_token),
            "SLACK_SIGNING_SECRET": mask(self.slack_signing_secret),
            "SLACK_APP_TOKEN": mask(self.slack_app_token),
            "SLACK_API_URL": self.slack_api_url,
        }


class Settings(BaseModel):
    """Everything the bot needs: the validated file, the secrets and where they came from."""

    config: Config
    secrets: Secrets
    config_path: str | None
    db_path: str

    def effective(self) -> dict[str, Any]:
        return {
            "config_file": self.config_path,
            "db": self.db_path,
            **self.config.model_dump(exclude={"db"}),
            "eval_suite_versions": {s.name: s.current_version() or "(not declared)"
                                    for s in self.config.eval_suites},
            "secrets": self.secrets.masked(),
        }


def _location(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1] = f"{parts[-1]}[{item}]" if parts else f"[{item}]"
        else:
            parts.append(str(item))
    return ".".join(parts) or "(top level)"


def parse_config(data: dict[str, Any], source: str, config_dir: str | None = None) -> Config:
    """Validate ``data`` read from ``source``; relative suite files are read from
    ``config_dir`` (the config file's folder)."""
    try:
        return Config.model_validate(data, context={"config_dir": config_dir})
    except ValidationError as exc:
        err = exc.errors()[0]
        key = _location(err["loc"])
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"{source}: unknown key '{key}'; check its spelling against "
                              f"`runwatch config check --help`") from None
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "value_error":
            where = "" if not err["loc"] or message.startswith(f"{key}.") else f"{key}: "
            raise ConfigError(f"{source}: {where}{message}") from None
        raise ConfigError(f"{source}: {key}: {message} (got {err.get('input')!r})") from None


def load_settings(path: str | os.PathLike[str] | None = None,
                  env: dict[str, str] | None = None) -> Settings:
    """Load ``path`` (or ``RUNWATCH_CONFIG``, or ``./runwatch.toml`` when present)."""
    env = os.environ if env is None else env
    explicit = path or env.get("RUNWATCH_CONFIG")
    candidate = Path(explicit) if explicit else Path(DEFAULT_CONFIG_NAME)
    data: dict[str, Any] = {}
    config_path: str | None = None
    if candidate.exists():
        config_path = str(candidate)
        try:
            data = tomllib.loads(candidate.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{candidate}: not valid TOML: {exc}") from None
    elif explicit:
        raise ConfigError(f"{candidate}: config file not found; create it or drop --config")
    config = parse_config(data, config_path or "(defaults)",
                          str(candidate.resolve().parent) if config_path else None)
    db_path = env.get("RUNWATCH_DB") or config.store.url or config.db or DEFAULT_DB
    return Settings(config=config, secrets=Secrets.from_env(env), config_path=config_path,
                    db_path=db_path)
