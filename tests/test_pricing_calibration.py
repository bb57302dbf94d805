"""Which bench run calibrates a backend: its label, its model, or its URL and model; the newest wins;
a run without decode data (or another file) is no calibration."""

from __future__ import annotations

import json

from pricing.calibration import latest_calibration


def run(home, name: str, date: str, points: list[dict], **summary) -> None:
    path = home / "bench" / name
    path.mkdir(parents=True)
    body = {"date": date, "base_url": "http://10.0.0.5:8000", "model_id": "llama", "label": {}, "load_points": points,
            **summary}
    (path / "summary.json").write_text(json.dumps(body))


def test_the_newest_matching_run_at_its_busiest_point(tmp_path):
    run(tmp_path, "a", "2026-11-20T10:00:00Z", [{"load_point": "synchronous", "prefill_decode_ratio": 3.0,
                                                 "total_token_throughput": 10}])
    run(tmp_path, "b", "2026-11-21T10:00:00Z", [{"load_point": "synchronous", "prefill_decode_ratio": 4.0,
                                                 "total_token_throughput": 10},
                                                {"load_point": "throughput", "prefill_decode_ratio": 6.5,
                                                 "total_token_throughput": 90}])
    run(tmp_path, "c", "2026-11-22T10:00:00Z", [{"load_point": "x", "prefill_decode_ratio": None}])  # no decode
    run(tmp_path, "d", "2026-11-23T10:00:00Z", [{"load_point": "x", "prefill_decode_ratio": 9.0}],
        model_id="other")
    (tmp_path / "bench" / "junk").mkdir()
    (tmp_path / "bench" / "junk" / "summary.json").write_text("not json")
    found = latest_calibration(tmp_path, {"vllm-a"}, ("http://10.0.0.5:8000/v1", "llama"))
    assert (found.output_weight, found.path.name, found.load_point) == (6.5, "b", "throughput")
    assert found.describe().startswith("output_weight 6.5 measured by infer bench at 2026-11-21T10:00:00Z from ")
    assert latest_calibration(tmp_path, {"vllm-a"}, ("http://10.0.0.6:8000", "llama")) is None  # another server
    assert latest_calibration(tmp_path, {"other"}).output_weight == 9.0  # benched through infer serve by name
    run(tmp_path, "e", "2026-11-24T10:00:00Z", [{"load_point": "x", "prefill_decode_ratio": 2.0}],
        base_url="http://127.0.0.1:11434", model_id="tiny", label={"backend": "local"})
    assert latest_calibration(tmp_path, {"local", "llamacpp"}).output_weight == 2.0  # --label backend=local
