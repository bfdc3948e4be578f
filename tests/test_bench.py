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
