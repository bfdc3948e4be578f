"""`eagle2-local bench` runs end to end and writes the fields the benchmark record is built from."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import PROMPTS_DIR


def test_bench_json_fields(tmp_path, synth_q8):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "cli", "bench", "--model", str(synth_q8), "--draft-model",
                           str(synth_q8), "--prompts", str(PROMPTS_DIR), "--n", "2", "--max-tokens", "24",
                           "--total-tokens", "12", "--depth", "4", "--tree-top-k", "3", "--threads", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert set(report["sets"]) == {"alpaca", "gsm8k", "humaneval", "mt_bench", "qa", "sum"}
    for s in report["sets"].values():
        for key in ("speedup", "tau", "tokens_per_s_plain", "tokens_per_s_eagle", "identical_outputs",
                    "near_tie_divergences", "acceptance_per_depth", "time_split_eagle", "mean_tree_size"):
            assert key in s
        assert s["identical_outputs"] == 2  # one thread, quantized: bit-identical
        for mode in ("host_eagle", "host_plain"):  # the host's own time (wall minus llama.cpp) per round
            host = s[mode]
            assert host["rounds"] > 0 and host["llama_s"] > 0 and host["host_s"] > 0, host
            assert host["host_draft_ms_per_round"] >= 0 and host["host_verify_ms_per_round"] > 0, host
        assert s["host_eagle"]["host_us_per_node"] > 0 and s["host_plain"]["host_us_per_node"] is None
        assert s["tau"] > 1.5
    assert report["settings"]["model_sha256"] and report["machine"]["llama_cpp_python"]
    assert len(report["prompts"]) == 12
    assert "speedup" in proc.stdout and "host ms/round" in proc.stdout
    assert "projection from the measured host time" in proc.stdout


def test_projected_speedup_is_tau_when_the_host_is_free_and_falls_with_host_time():
    from eagle2_local.bench import projected_speedup
    from eagle2_local.console import projection_lines

    assert projected_speedup(3.0, 0.0, 10.0) == 3.0
    assert projected_speedup(3.0, 10.0, 10.0) == 1.5  # 3 tokens in 20 ms against 1 in 10 ms
    assert projected_speedup(3.0, 10.0, 10.0, plain_host_ms=2.0) == 3.0 * 12.0 / 20.0
    host = {"host_draft_ms_per_round": 6.0, "host_verify_ms_per_round": 2.0}
    plain = {"host_draft_ms_per_round": 0.0, "host_verify_ms_per_round": 0.1}
    lines = projection_lines({"sets": {"qa": {"tau": 3.5, "host_eagle": host, "host_plain": plain}}})
    assert lines[1].startswith("qa") and "host 8.00 ms/round" in lines[1]
    assert lines[1].endswith("/".join(f"{projected_speedup(3.5, 8.0, t, 0.1):.2f}" for t in (5, 10, 20, 40)))
    assert projection_lines({"sets": {"qa": {"tau": 1.0}}}) == []  # reports made before host figures


def test_bench_needs_a_draft(synth_q8):
    proc = subprocess.run([sys.executable, "-m", "cli", "bench", "--model", str(synth_q8), "--prompts",
                           str(PROMPTS_DIR)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and "--draft-model" in proc.stderr


def test_bench_bad_prompt_file(tmp_path, synth_q8):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["ok"]}\nnot json\n')
    proc = subprocess.run([sys.executable, "-m", "cli", "bench", "--model", str(synth_q8), "--draft-model",
                           str(synth_q8), "--prompts", str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "bad.jsonl:2" in proc.stderr and "Traceback" not in proc.stderr
