import pytest

from bot.config import ConfigError, load_settings


def write(tmp_path, text):
    path = tmp_path / "runwatch.toml"
    path.write_text(text)
    return path


def test_defaults_without_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = load_settings(env={})
    assert settings.config_path is None
    assert settings.config.poll_interval == 30
    assert settings.db_path == "runwatch.db"


def test_valid_file_and_env(tmp_path):
    path = write(tmp_path, 'poll_interval = 2\n[[sources]]\npath = "runs"\n'
                           '[aliases]\nce = "train/loss"\n[analyzers.spike]\nthreshold = 8\n'
                           '[slack]\nchannel = "#ml"\n')
    settings = load_settings(path, env={"RUNWATCH_DB": "/tmp/x.db",
                                        "SLACK_BOT_TOKEN": "xoxb-123456789"})
    assert settings.config.sources[0].path == "runs"
    assert settings.config.analyzers == {"spike": {"threshold": 8}}
    assert settings.db_path == "/tmp/x.db"
    assert settings.secrets.slack_enabled


def test_unknown_key_names_key_and_file(tmp_path):
    path = write(tmp_path, '[[sources]]\npath = "runs"\npth = "oops"\n')
    with pytest.raises(ConfigError) as err:
        load_settings(path, env={})
    assert str(path) in str(err.value) and "sources[0].pth" in str(err.value)


def test_wrong_type_names_key(tmp_path):
    path = write(tmp_path, 'poll_interval = "often"\n')
    with pytest.raises(ConfigError, match=r"runwatch.toml: poll_interval: .*'often'"):
        load_settings(path, env={})


def test_unknown_analyzer_and_parameter(tmp_path):
    with pytest.raises(ConfigError, match="unknown analyzer 'spikes'"):
        load_settings(write(tmp_path, "[analyzers.spikes]\nthreshold = 1\n"), env={})
    with pytest.raises(ConfigError, match="analyzers.spike"):
        load_settings(write(tmp_path, "[analyzers.spike]\nthreshhold = 1\n"), env={})


def test_alias_must_target_a_canonical_tag(tmp_path):
    with pytest.raises(ConfigError, match="not a canonical tag"):
        load_settings(write(tmp_path, '[aliases]\nce = "loss"\n'), env={})


def test_bad_toml_and_missing_explicit_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(write(tmp_path, "poll_interval = = 3"), env={})
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "nope.toml", env={})


def test_effective_config_masks_secrets(tmp_path):
    settings = load_settings(write(tmp_path, ""), env={
        "SLACK_BOT_TOKEN": "xoxb-1234567890-secret", "SLACK_SIGNING_SECRET": "abcdef123456"})
    shown = repr(settings.effective())
    assert "1234567890" not in shown and "abcdef" not in shown
    assert settings.effective()["secrets"]["SLACK_BOT_TOKEN"] == "xoxb-****"
    assert settings.effective()["secrets"]["SLACK_SIGNING_SECRET"] == "****"


def test_unreadable_source_and_bad_analyzer_value_name_the_key(tmp_path):
    other = tmp_path / "metrics.parquet"
    other.write_bytes(b"PAR1")
    with pytest.raises(ConfigError, match=r"sources\[0\]: .*unsupported log format"):
        load_settings(write(tmp_path, f'[[sources]]\npath = "{other}"\n'), env={})
    with pytest.raises(ConfigError, match=r"runwatch.toml: analyzers.spike: window must be"):
        load_settings(write(tmp_path, "[analyzers.spike]\nwindow = 1\n"), env={})


def test_patterns_read_a_custom_text_log(tmp_path):
    from bot.engine import Engine

    log = tmp_path / "train.log"
    log.write_text("it=1/100 ce=2.5\nit=2/100 ce=2.4\nnoise\n")
    path = write(tmp_path, "[[patterns]]\nname = \"mytrainer\"\n"
                           "regex = '^it=(?P<step>\\d+)/(?P<total>\\d+) ce=(?P<ce>\\S+)'\n"
                           "names = { ce = \"train/loss\" }\n"
                           f'[[sources]]\npath = "{log}"\nrun = "exp"\n')
    settings = load_settings(path, env={"RUNWATCH_DB": str(tmp_path / "rw.db")})
    engine = Engine(settings)
    engine.poll()
    assert engine.store.run_data("exp").series("train/loss").to_dict() == {1: 2.5, 2: 2.4}
    assert engine.store.run("exp")["total_steps"] == 100
    with pytest.raises(ConfigError, match=r"patterns\[0\]"):
        load_settings(write(tmp_path, "[[patterns]]\nname = 'x'\nregex = '(unclosed'\n"),
                      env={})


def test_the_store_url_names_the_database_and_a_postgresql_one_opens_the_pg_store(tmp_path):
    from bot.pgstore import open_store
    from bot.store import Store

    path = tmp_path / "runwatch.toml"
    path.write_text(f'[store]\nurl = "{tmp_path / "shared.db"}"\nkeep_points_days = 7\n')
    settings = load_settings(path, env={})
    assert settings.db_path == str(tmp_path / "shared.db")
    assert settings.config.store.keep_points_days == 7
    path.write_text('[store]\nurl = "postgresql://runwatch@db:5432/runwatch"\n')
    settings = load_settings(path, env={})
    with pytest.raises(ConfigError, match="open_store"):  # the SQLite class says where to go
        Store(settings.db_path)
    assert isinstance(open_store(str(tmp_path / "one.db")), Store)  # a URL: test_engine_pg
