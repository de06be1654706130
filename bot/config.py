"""Configuration: ``runwatch.toml`` validated on load, secrets from the environment.

An unknown key or a value of the wrong type is a :class:`ConfigError` whose message names
the key and the file, so ``runwatch config check`` can say exactly what to fix.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from analyzers import build as build_analyzers
from connectors.aliases import CANONICAL_TAGS, STEP, TIME
from connectors.formats import LinePattern
from connectors.registry import open_source

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
        return LinePattern(**self.model_dump())


class SlackConfig(_Strict):
    channel: str = Field("#training-alerts", description="Channel for alerts")
    mode: Literal["auto", "socket", "http"] = Field(
        "auto", description="auto: Socket Mode when SLACK_APP_TOKEN is set, HTTP otherwise")
    host: str = Field("0.0.0.0", description="HTTP mode: address to listen on")
    port: int = Field(3000, ge=0, le=65535,
                      description="HTTP mode: port to listen on (0: any free port)")
    path: str = Field("/slack/events", description="HTTP mode: request URL path")


class OutboxConfig(_Strict):
    max_attempts: int = Field(8, ge=1, description="Sends tried before a message is given up")
    backoff_seconds: float = Field(5.0, gt=0, description="First retry delay; doubles each try")
    backoff_max_seconds: float = Field(300.0, gt=0, description="Longest retry delay")


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
        build_analyzers(value)
        return value


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


def parse_config(data: dict[str, Any], source: str) -> Config:
    try:
        return Config.model_validate(data)
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
    config = parse_config(data, config_path or "(defaults)")
    db_path = env.get("RUNWATCH_DB") or config.db or DEFAULT_DB
    return Settings(config=config, secrets=Secrets.from_env(env), config_path=config_path,
                    db_path=db_path)
