"""Server settings from INFER_* variables: parsed, validated, one clear message when wrong."""

from __future__ import annotations

import pytest

from core.durations import format_duration, parse_duration
from gateway.policy.access import is_operator_key
from core.settings import ServerSettings, SettingsError, parse_host


@pytest.mark.parametrize("text,expected", [
    ("127.0.0.1:11434", ("127.0.0.1", 11434)), ("0.0.0.0", ("0.0.0.0", 11434)),
    ("http://example.com", ("example.com", 80)), ("https://example.com", ("example.com", 443)),
    ("http://10.0.0.2:8080/path", ("10.0.0.2", 8080)), ("[::1]:9000", ("::1", 9000)), (":7000", ("127.0.0.1", 7000)),
])
def test_host_grammar_is_ollamas(text, expected):
    assert parse_host(text) == expected


def test_defaults(tmp_path):
    s = ServerSettings.from_env({"INFER_HOME": str(tmp_path)})
    assert (s.host, s.port, s.keep_alive, s.num_parallel) == ("127.0.0.1", 11434, 300.0, 1)
    assert s.database_url == f"sqlite:///{tmp_path / 'usage.db'}"
    assert s.is_loopback


def test_values_from_env(tmp_path):
    s = ServerSettings.from_env({"INFER_HOME": str(tmp_path), "INFER_HOST": "0.0.0.0:9999", "INFER_KEEP_ALIVE": "1h",
                                 "INFER_NUM_PARALLEL": "4", "INFER_API_KEYS": "k1, k2", "INFER_ORIGINS": "chrome-extension://*",
                                 "INFER_DATABASE_URL": "sqlite:///x.db"})
    assert (s.port, s.keep_alive, s.num_parallel, s.database_url) == (9999, 3600.0, 4, "sqlite:///x.db")
    assert is_operator_key("k2", s.api_key_hashes) and not is_operator_key("k3", s.api_key_hashes)
    assert "k1" not in str(s.api_key_hashes) and "k1" not in s.model_dump_json()  # hashes only, in memory too
    assert s.origin_allowed("chrome-extension://abc") and s.origin_allowed("app://x")
    assert not s.origin_allowed("https://evil.example")
    assert not s.is_loopback


@pytest.mark.parametrize("env,word", [({"INFER_NUM_PARALLEL": "many"}, "INFER_NUM_PARALLEL"),
                                      ({"INFER_KEEP_ALIVE": "soon"}, "INFER_KEEP_ALIVE"),
                                      ({"INFER_HOST": "host:port"}, "INFER_HOST"),
                                      ({"INFER_NUM_PARALLEL": "0"}, "INFER_NUM_PARALLEL: Input should be greater"),
                                      ({"INFER_ENGINE": "vllm"}, "INFER_ENGINE")])
def test_bad_settings_fail_at_start_with_the_name(env, word, tmp_path):
    with pytest.raises(SettingsError, match=word):
        ServerSettings.from_env({"INFER_HOME": str(tmp_path), **env})


@pytest.mark.parametrize("seconds,text", [(3.104227711, "3.104227711s"), (0.199402, "199.402ms"), (65.2, "1m5.2s"),
                                          (0.000012, "12µs"), (0, "0s"), (3600.5, "1h0m0.5s"), (2.0, "2s")])
def test_go_duration_strings(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text,seconds", [("5m", 300), ("1h30m", 5400), ("300", 300), ("-1", -1), ("0", 0),
                                          ("1.5s", 1.5), ("250ms", 0.25), (45, 45)])
def test_keep_alive_values(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "5 minutes", "m5", "1x", True])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)
