"""A route's runtime policies come from its config entry, whose defaults are the only ones: a config
file's values reach the router, and what the file leaves out is the schema's default."""

from __future__ import annotations

from gateway.backends_config import load_config
from routing.build import route_policy

CONFIG = """\
backends:
  - {name: a, type: vllm, base_url: "http://127.0.0.1:9", model: m}
routes:
  - name: plain
    backends: [a]
  - name: tuned
    backends: [a]
    strategy: prefix
    retries: 3
    first_token_timeout_ms: 250
    slo: {ttft_ms: 400, target: 0.99, window_s: 60}
    prefix: {block_chars: 64, max_blocks: 32, load_slack: 0}
"""


def policies(tmp_path):
    path = tmp_path / "routes.yaml"
    path.write_text(CONFIG)
    return {entry.name: route_policy(entry) for entry in load_config(path).routes}


def test_a_route_left_plain_takes_the_schemas_defaults(tmp_path):
    plain = policies(tmp_path)["plain"]
    assert (plain.strategy, plain.retries, plain.shed, plain.first_token_timeout_s, plain.disagg) == \
        ("slo", 1, False, None, None)
    assert (plain.slo.ttft_ms, plain.slo.target, plain.slo.window_s) == (None, 0.95, 300.0)
    assert (plain.prefix.block_chars, plain.prefix.max_blocks, plain.prefix.capacity_tokens) == (128, 512, 500_000)


def test_the_files_values_reach_the_router(tmp_path):
    tuned = policies(tmp_path)["tuned"]
    assert (tuned.strategy, tuned.retries, tuned.first_token_timeout_s) == ("prefix", 3, 0.25)
    assert (tuned.slo.ttft_ms, tuned.slo.target, tuned.slo.window_s) == (400.0, 0.99, 60.0)
    assert (tuned.prefix.block_chars, tuned.prefix.max_blocks, tuned.prefix.load_slack) == (64, 32, 0)
