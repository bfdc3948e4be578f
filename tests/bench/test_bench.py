"""`eagle2-local bench` runs end to end and writes the fields the benchmark record is built from."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.prompts import PROMPTS_DIR


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
    for rec in report["prompts"]:  # how busy the machine was, per record (None: no CPU tick passed in that mode)
        load = rec["machine_load"]
        assert load["load_1min"] >= 0, load
        assert all(load[k] is None or 0 <= load[k] <= 1 for k in ("steal_plain", "steal_eagle")), load
    assert report["machine"]["load_1min_median"] >= 0
    assert report["machine"]["steal_median"] is None or 0 <= report["machine"]["steal_median"] <= 1
    assert "speedup" in proc.stdout and "host ms/round" in proc.stdout
    assert "machine: load average" in proc.stdout
    assert "projection from the measured host time" in proc.stdout


def test_projected_speedup_is_tau_when_the_host_is_free_and_falls_with_host_time():
    from eagle2_local.bench.results import projected_speedup
    from eagle2_local.commands.console import projection_lines

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


def _chat_set(tmp_path):
    """Two records: a three-turn chat (tune) and a one-turn record (heldout)."""
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"turns": ["Here is my file: def f(x): return x", "Rename x to y.",
                                          "Now return the whole file."], "split": "tune"}) + "\n"
                    + json.dumps({"turns": ["Quote the first sentence."], "split": "heldout"}) + "\n")
    return path


def _bench(path, synth_q8, out, *args):
    return subprocess.run([sys.executable, "-m", "cli", "bench", "--model", str(synth_q8), "--draft-model",
                           str(synth_q8), "--prompts", str(path), "--max-tokens", "8", "--total-tokens", "12",
                           "--depth", "4", "--tree-top-k", "3", "--threads", "1", "--json", str(out), *args],
                          capture_output=True, text=True, timeout=600)


def test_bench_runs_a_chat_turn_by_turn_and_counts_every_turn(tmp_path, synth_q8):
    out = tmp_path / "bench.json"
    proc = _bench(_chat_set(tmp_path), synth_q8, out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    chat, single = report["prompts"]
    assert (chat["turns"], single["turns"]) == (3, 1) and report["sets"]["chats"]["n_turns"] == 4
    assert report["settings"]["split"] == "all" and report["settings"]["turns"] == "all"
    for mode in ("plain", "eagle"):
        # every turn's answer counts (8 tokens a turn: the synthetic model never ends early), and turns 2-3
        # reuse the conversation so far from the KV cache
        assert chat[mode]["n_tokens"] == 24 and single[mode]["n_tokens"] == 8
        assert chat[mode]["prompt_tokens_reused"] > 0 and single[mode]["prompt_tokens_reused"] == 0
    assert chat["eagle"]["target_passes"] < 24 and chat["identical"] and chat["divergence_turn"] is None
    assert report["sets"]["chats"]["identical_outputs"] == 2

    first = tmp_path / "first.json"
    proc = _bench(_chat_set(tmp_path), synth_q8, first, "--first-turn")
    assert proc.returncode == 0, proc.stderr
    assert [p["eagle"]["n_tokens"] for p in json.loads(first.read_text())["prompts"]] == [8, 8]


def test_bench_split_selects_the_records_of_that_split(tmp_path, synth_q8):
    out = tmp_path / "bench.json"
    proc = _bench(_chat_set(tmp_path), synth_q8, out, "--split", "heldout")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert [p["turns"] for p in report["prompts"]] == [1] and report["settings"]["split"] == "heldout"
    proc = _bench(_chat_set(tmp_path), synth_q8, out)  # all records: the held-out ones are also reported apart
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert [p["split"] for p in report["prompts"]] == ["tune", "heldout"]
    held = report["sets"]["chats"]["heldout"]
    assert held["n_prompts"] == 1 and held["speedup"] == report["prompts"][1]["speedup"]


def test_bench_prefill_once_restores_each_records_prompt_and_answers_as_fresh(tmp_path, synth_q8):
    """--prefill-once: the first turn's prompt is evaluated once per record and restored before every run
    (--repeat 2: four runs); the answers are plain decoding's, and every run reuses the restored cells."""
    path = tmp_path / "long.jsonl"
    passage = "The river rose in the spring and the town moved its market up the hill. " * 6
    path.write_text(json.dumps({"turns": [passage + "Quote the first sentence.", "Now the second."]}) + "\n"
                    + json.dumps({"prompt": passage + "How many times is the market named?"}) + "\n")
    out = tmp_path / "bench.json"
    proc = _bench(path, synth_q8, out, "--prefill-once", "--repeat", "2")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["settings"]["prefill_once"] is True
    chat, single = report["prompts"]
    assert chat["identical"] and single["identical"] and chat["turns"] == 2
    for mode in ("plain", "eagle"):
        assert single[mode]["prompt_tokens_reused"] > 64, single[mode]
        # both turns reuse nearly all of their prompts: the first from the restored cells, the second from the
        # conversation so far (without the restore, reuse would stay near half of the two prompts together)
        assert chat[mode]["prompt_tokens_reused"] > 0.8 * chat[mode]["prompt_tokens"], chat[mode]


def test_bench_prefill_once_refuses_llama_cpp_tools_before_loading(tmp_path, synth_q8):
    """llama.cpp's tools are compared end to end (their prompt evaluation included): with --prefill-once that
    comparison would be wrong, so the pair is refused in one line, before the model loads."""
    out = tmp_path / "bench.json"
    proc = _bench(_chat_set(tmp_path), synth_q8, out, "--prefill-once", "--llama-cpp-bin", str(tmp_path))
    assert proc.returncode != 0 and not out.exists()
    assert "drop one of --prefill-once and --llama-cpp-bin" in proc.stderr and "Traceback" not in proc.stderr
    assert "calibration" not in proc.stderr


def test_load_prompt_sets_split_defaults_unmarked_records_to_tune(tmp_path):
    from eagle2_local.bench.prompt_sets import load_prompt_sets
    from eagle2_local.errors import Eagle2Error

    (tmp_path / "marked.jsonl").write_text(_chat_set(tmp_path).read_text())
    (tmp_path / "plain.jsonl").write_text('{"prompt": "a"}\n{"turns": ["b", "c"]}\n')
    (tmp_path / "chats.jsonl").unlink()
    every = {s.name: [s.turns(i) for i in range(len(s.prompts))] for s in load_prompt_sets([str(tmp_path)], None)}
    assert every["plain"] == [["a"], ["b", "c"]] and len(every["marked"]) == 2
    tune = {s.name: s.prompts for s in load_prompt_sets([str(tmp_path)], None, "tune")}
    assert tune == {"marked": ["Here is my file: def f(x): return x"], "plain": ["a", "b"]}
    held = load_prompt_sets([str(tmp_path)], None, "heldout")
    assert [(s.name, s.prompts) for s in held] == [("marked", ["Quote the first sentence."])]
    with pytest.raises(Eagle2Error, match="no heldout records"):
        load_prompt_sets([str(tmp_path / "plain.jsonl")], None, "heldout")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "split": "test"}\n')
    with pytest.raises(Eagle2Error, match="bad.jsonl:1: split must be tune or heldout"):
        load_prompt_sets([str(tmp_path / "bad.jsonl")], None)


def test_llama_cpp_ngram_modes_summarise_against_completion_and_the_best_mode():
    """Per set: each n-gram mode's median speed-up over llama-completion (decode-only and end to end), its
    acceptance, which mode was best and eagle2-local against it; the table prints them. Needs
    --llama-cpp-bin to run for real (llama.cpp's binaries), so only the bookkeeping is tested here."""
    from eagle2_local.bench.llamacpp_bench import binaries_summary
    from eagle2_local.bench.results import PromptResult
    from eagle2_local.commands.console import _binaries_lines
    from eagle2_local.decoding.stats import GenerationStats

    def tools(simple: float, mod: float) -> dict:
        return {"completion_tokens_per_s": 10.0, "completion_e2e_tokens_per_s": 8.0,
                "ngram": {"ngram-simple": {"tokens_per_s": simple, "e2e_tokens_per_s": simple * 0.8, "tokens": 64,
                                           "drafted": 40, "accepted": 30},
                          "ngram-mod": {"tokens_per_s": mod, "e2e_tokens_per_s": mod * 0.8, "tokens": 64,
                                        "drafted": 10, "accepted": 2}}}

    plain, eagle = GenerationStats(n_tokens=10, total_s=1.0), GenerationStats(n_tokens=14, total_s=1.0)
    rs = [PromptResult("s", i, plain, eagle, True, llama_cpp=tools(s, m))
          for i, (s, m) in enumerate([(12.0, 9.0), (11.0, 9.5), (13.0, 8.0)])]
    t = binaries_summary(rs)
    assert t["best_ngram"] == "ngram-simple" and t["ngram"]["ngram-simple"]["speedup"] == pytest.approx(1.2)
    assert t["ngram"]["ngram-simple"]["speedup_e2e"] == pytest.approx(1.2)
    assert t["ngram"]["ngram-mod"]["accept_rate"] == pytest.approx(0.2)
    assert t["speedup_eagle_vs_best_ngram"] == pytest.approx(14 / 12, abs=1e-4)
    assert "tokens_per_s_draft_simple" not in t  # no draft model: draft-simple was not run
    lines = _binaries_lines({"llama_cpp": t, "speedup_e2e": 1.3})
    assert any("ngram-simple: 12.0 tok/s, x1.20" in line for line in lines)
    assert "x1.17 against ngram-simple" in lines[-1]


def test_load_prompt_sets_reads_each_records_schema_or_grammar(tmp_path):
    from eagle2_local.bench.prompt_sets import load_prompt_sets
    from eagle2_local.decoding.grammar import Grammar
    from eagle2_local.errors import Eagle2Error

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    (tmp_path / "mixed.jsonl").write_text(json.dumps({"prompt": "a", "schema": schema}) + "\n"
                                          + json.dumps({"prompt": "b"}) + "\n"
                                          + json.dumps({"prompt": "c", "grammar": 'root ::= "yes" | "no"'}) + "\n")
    (tmp_path / "free.jsonl").write_text('{"prompt": "d"}\n')
    sets = {s.name: s for s in load_prompt_sets([str(tmp_path)], None)}
    mixed = sets["mixed"]
    assert mixed.grammar(0) == Grammar.from_json_schema(schema) and mixed.grammar(1) is None
    assert mixed.grammar(2) == Grammar('root ::= "yes" | "no"') and sets["free"].grammar(0) is None
    assert load_prompt_sets([str(tmp_path / "mixed.jsonl")], 1)[0].grammars == [Grammar.from_json_schema(schema)]
    for i, (bad, why) in enumerate([({"schema": "x"}, "'schema' must be a JSON schema object"),
                                    ({"grammar": " "}, "'grammar' must be non-empty GBNF text"),
                                    ({"schema": schema, "grammar": "root ::= \"a\""}, "not both"),
                                    ({"schema": {"type": "object", "properties": {"n": {"type": "nonsense"}}}},
                                     "")]):
        path = tmp_path / f"bad{i}.jsonl"
        path.write_text('{"prompt": "ok"}\n' + json.dumps({"prompt": "a", **bad}) + "\n")
        with pytest.raises(Eagle2Error, match=rf"bad{i}.jsonl:2: .*{why}"):
            load_prompt_sets([str(path)], None)


def test_bench_runs_a_model_without_draft_on_constrained_prompts(tmp_path, synth_q8):
    """Records with a grammar need no draft: forced tokens are one, counted as their own source; the answers
    equal plain decoding's (one thread)."""
    prompts = tmp_path / "forced.jsonl"
    grammar = 'root ::= "the answer is" (" yes" | " no") ", because " [a-z ]+'
    prompts.write_text("".join(json.dumps({"prompt": p, "grammar": grammar}) + "\n" for p in ("a", "b")))
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "cli", "bench", "--model", str(synth_q8), "--no-lookup", "--prompts",
                           str(prompts), "--max-tokens", "24", "--total-tokens", "12", "--threads", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(out.read_text())["sets"]["forced"]
    assert s["identical_outputs"] == 2 and s["tau"] > 1.0, s
    assert s["accepted_by_source"].get("forced", 0) >= 4, s


def test_bench_with_history_adds_each_records_first_eagle_answer_after_its_runs(synth_q8):
    """`bench --history`: a record's runs never draft from the same record's earlier run (its answers join the
    history after all of them, the first eagle run's only; plain runs add nothing); a later record asking the
    same thing drafts from it."""
    from eagle2_local.api import Eagle2
    from eagle2_local.bench.harness import Bench
    from eagle2_local.tree.sampling import SamplingParams
    with Eagle2(str(synth_q8), draft="lookup", history=True, n_threads=1, total_tokens=12) as llm:
        b = Bench(llm, sampling=SamplingParams(temperature=0.0), max_tokens=24, repeat=2, chat=False)
        first = b.run_prompt("s", 0, "x y z")
        assert len(llm.history) == 1 and llm.history.accepted == 0
        second = b.run_prompt("s", 1, "x y z")
        assert len(llm.history) == 2 and llm.history.accepted > 0
    assert first.identical and second.identical
    assert second.eagle.tau > first.eagle.tau
