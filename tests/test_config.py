"""Settings: defaults < config file < RUNNERD_* env < flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from runnerd.config import load_settings
from runnerd.errors import ConfigError


def test_layers_override_in_order(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('port = 9000\nhost = "0.0.0.0"\ndata_dir = "/srv/a"\n')
    assert load_settings(env={}).port == 8686
    assert load_settings(config_file=config, env={}).port == 9000
    s = load_settings(
        config_file=config, env={"RUNNERD_PORT": "9100"}, flags={"data_dir": Path("/srv/b")}
    )
    assert (s.port, s.host, s.data_dir) == (9100, "0.0.0.0", Path("/srv/b"))
    assert s.toolchain_path == Path("/srv/b/toolchain")


def test_config_file_from_env_and_bad_values_are_named(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("port = 9000\n")
    assert load_settings(env={"RUNNERD_CONFIG": str(config)}).port == 9000
    with pytest.raises(ConfigError, match="port"):
        load_settings(env={"RUNNERD_PORT": "eighty"})
    config.write_text("port = \n")
    with pytest.raises(ConfigError, match=str(config)):
        load_settings(config_file=config, env={})


def test_database_settings_are_checked_and_named() -> None:
    assert load_settings(env={}).database_connections == 8
    with pytest.raises(ConfigError, match="database_connections: 0"):
        load_settings(env={"RUNNERD_DATABASE_CONNECTIONS": "0"})
    with pytest.raises(ConfigError, match=r"database_url: 'mysql://u:\*\*\*@h/db'"):
        load_settings(env={"RUNNERD_DATABASE_URL": "mysql://u:secret@h/db"})
