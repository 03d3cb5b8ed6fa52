"""The agent's settings: precedence flag > SHAREGPU_* environment > file > default, each value's
source, and clear errors for bad files and values."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharegpu.agent.config import format_config, load_config
from sharegpu.errors import ConfigError


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path), "SHAREGPU_CONFIG": str(tmp_path / "config.yaml"), **extra}


def test_precedence_and_sources(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("version: 1\nenforce: kill\nmetrics_port: 9500\nlog_level: debug\n")
    env = _env(tmp_path, SHAREGPU_METRICS_PORT="9600", SHAREGPU_LOG_FORMAT="json", SHAREGPU_TENANT="ignored")
    loaded = load_config({"metrics_port": 9700, "enforce": None}, environ=env)
    c = loaded.config
    assert (c.metrics_port, c.log_format, c.enforce, c.log_level) == (9700, "json", "kill", "debug")
    assert loaded.sources["metrics_port"] == "flag --metrics-port"
    assert loaded.sources["log_format"] == "env SHAREGPU_LOG_FORMAT"
    assert loaded.sources["enforce"] == f"file {tmp_path / 'config.yaml'}"
    assert loaded.sources["allow_overcommit"] == "default"
    text = format_config(loaded)
    assert "metrics_port: 9700" in text
    assert "# flag --metrics-port" in text
    assert "# default" in text


def test_the_default_file_may_be_absent(tmp_path: Path) -> None:
    loaded = load_config({}, environ={"HOME": str(tmp_path)}, file=None)
    assert loaded.config.enforce == "report"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("enforce: [unclosed", "not valid YAML"),
        ("- a list\n- of things\n", "expected a mapping"),
        ("version: 2\n", "config version 2"),
        ("enforse: kill\n", "invalid enforse"),
        ("metrics_port: 70000\n", "invalid metrics_port .*config.yaml"),
        ("enforce: sometimes\n", "invalid enforce"),
        ("cpu_wakeup_latency_us: -5\n", "invalid cpu_wakeup_latency_us"),
        ("cpu_wakeup_latency_us: soon\n", "invalid cpu_wakeup_latency_us"),
        ("cpu_wakeup_latency_while: sometimes\n", "invalid cpu_wakeup_latency_while"),
    ],
    ids=[
        "yaml",
        "not-a-mapping",
        "version",
        "unknown-key",
        "out-of-range",
        "bad-choice",
        "negative-latency",
        "latency-not-a-number",
        "latency-while-not-a-choice",
    ],
)
def test_a_bad_file_is_one_clear_error(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "config.yaml").write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_config({}, environ=_env(tmp_path))


def test_a_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="env SHAREGPU_METRICS_PORT"):
        load_config({}, environ={"HOME": str(tmp_path), "SHAREGPU_METRICS_PORT": "lots"})


def test_an_explicit_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config({}, environ={"HOME": str(tmp_path)}, file=tmp_path / "missing.yaml")


def test_the_cpu_wakeup_latency_request_is_off_unless_asked(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert load_config({}, environ=env, file=None).config.cpu_wakeup_latency_us is None
    loaded = load_config({"cpu_wakeup_latency_us": 0}, environ=env, file=None)
    assert loaded.config.cpu_wakeup_latency_us == 0
    assert loaded.sources["cpu_wakeup_latency_us"] == "flag --cpu-wakeup-latency-us"
