"""Format every report in benchmarks/results/ (the JSON reports, and last the Markdown ones) as one record.

    python benchmarks/make_record.py            # writes BENCHMARKS.md and benchmarks/ARCHIVE.md

`benchmarks/benchmarks_table.py` splits the record: the current figures and the reports behind them go to
BENCHMARKS.md, everything else to benchmarks/ARCHIVE.md (this script calls it to write both files).

Reports come from `eagle2-local bench --json ...` (files named bench-*.json),
`eagle2-local verify-cost --json > verify-*.json` and the server load test (server-load-*.json, written by
tests/server/test_server.py when EAGLE2_LOCAL_SERVER_RECORD names the file). Nothing here is typed by hand: every figure is read from a
report, next to the exact command that produced it.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from eagle2_local.measure.machine_load import describe

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _records(st: dict) -> str:
    """Which records ran, for reports that say (bench --split, --first-turn); nothing for older reports, which
    ran every record's first turn."""
    out = f", split {st['split']}" if st.get("split", "all") != "all" else ""
    return out + {"first": ", first turns only", "all": ", every turn of multi-turn records"}.get(st.get("turns"), "")


def _load(machine: dict, threads: int) -> str:
    """'; load average 1.08 over the records at 1 llama.cpp thread(s): ...' where a report has the readings."""
    text = describe(machine.get("load_1min_median"), machine.get("steal_median"), threads)
    return f"; {text}" if text else ""


def bench_section(path: Path, rep: dict) -> list[str]:
    st, m = rep["settings"], rep["machine"]
    lines = [f"### {path.stem}", "",
             f"- date: {rep['date']}; machine: {m['cpu']}, {m['cores']} cores; llama-cpp-python {m['llama_cpp_python']}"
             + _load(m, st["threads"]),
             f"- model: `{Path(st['model']).name}` (sha256 {st['model_sha256'][:12]}…); draft: `{st['engine']}`",
             f"- threads {st['threads']}, max_tokens {st['max_tokens']}, temperature {st['temperature']}, "
             f"tree {st['tree']}, repeat {st['repeat']}{_records(st)}",
             f"- command: `{st['command']}`"] + ([f"- note: {rep['note']}"] if rep.get("note") else []) + ["",
             "| set | prompts | plain tok/s | eagle tok/s | speedup (median) | tau | identical | near-ties | tree |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, s in rep["sets"].items():
        turns = f" ({s['n_turns']} turns)" if s.get("n_turns", 0) > s["n_prompts"] else ""
        lines.append(f"| {name} | {s['n_prompts']}{turns} | {s['tokens_per_s_plain']:.1f} | {s['tokens_per_s_eagle']:.1f} | "
                     f"{s['speedup']:.2f}x | {s['tau']:.2f} | {s['identical_outputs']} | "
                     f"{s['near_tie_divergences']} | {s['mean_tree_size']:.1f} |")
    tools = {k: s["llama_cpp"] for k, s in rep["sets"].items() if "llama_cpp" in s}
    simple = {k: t for k, t in tools.items() if "tokens_per_s_draft_simple" in t}
    if simple:
        lines += ["", f"llama.cpp's own tools on the same prompts (`draft-simple`, --spec-draft-n-max "
                      f"{st.get('spec_draft_n_max')}):", "",
                  "| set | llama-completion tok/s | draft-simple tok/s | draft-simple accept | draft-simple speedup | eagle2-local / llama-completion |",
                  "|---|---|---|---|---|---|"]
        for name, t in simple.items():
            lines.append(f"| {name} | {t['tokens_per_s_completion']:.1f} | {t['tokens_per_s_draft_simple']:.1f} | "
                         f"{t['draft_simple_accept_rate']:.0%} | {t['speedup_draft_simple']:.2f}x | "
                         f"{t['speedup_eagle_vs_completion']:.2f}x |")
    lines += ngram_lines(rep)
    lines += split_lines(rep)
    sources = {k: s["accepted_by_source"] for k, s in rep["sets"].items()
               if set(s.get("accepted_by_source") or {}) - {"model"}}
    if sources:
        lines += ["", "Accepted draft tokens by source (lookup branches, model draft, both, forced tokens): " +
                  "; ".join(f"{k}: " + ", ".join(f"{src} {n}" for src, n in sorted(v.items()))
                            for k, v in sources.items())]
    split = {k: s["time_split_eagle"] for k, s in rep["sets"].items()}
    lines += ["", "Time split of the eagle runs (seconds, all prompts): " +
              "; ".join(f"{k}: draft {v['draft_s']:.1f}, verify {v['verify_s']:.1f}, other {v['other_s']:.1f}"
                        for k, v in split.items()), ""]
    return lines


def ngram_lines(rep: dict) -> list[str]:
    """llama.cpp's n-gram modes timed in the same run (bench --llama-cpp-ngram): per set and mode, the median
    speed-up over llama-completion (decode-only and end to end) and acceptance, and eagle2-local against the best
    mode; end-to-end speed-ups (prompt evaluation included) of eagle2-local over plain beside them."""
    rows = [(k, s) for k, s in rep["sets"].items() if s.get("llama_cpp", {}).get("ngram")]
    if not rows:
        return []
    modes = rep["settings"].get("llama_cpp_ngram") or {}
    lines = ["", "llama.cpp's n-gram drafting (`llama-speculative-simple`) against `llama-completion` on the same "
             "prompts, alternating: " + "; ".join(f"{m}: `{' '.join(a)}`" for m, a in modes.items()), "",
             "| set | completion tok/s | mode | tok/s | speedup | end to end | accept |", "|---|---|---|---|---|---|---|"]
    for name, s in rows:
        t = s["llama_cpp"]
        for mode, m in t["ngram"].items():
            lines.append(f"| {name} | {t['tokens_per_s_completion']:.1f} | {mode} | {m['tokens_per_s']:.1f} | "
                         f"{m['speedup']:.2f}x | {m['speedup_e2e']:.2f}x | {m['accept_rate']:.0%} |")
    lines += [""] + [f"- {name}: eagle2-local {s['speedup']:.2f}x plain ({s['speedup_e2e']:.2f}x end to end), "
                     f"{s['llama_cpp']['speedup_eagle_vs_best_ngram']:.2f}x the best n-gram mode "
                     f"({s['llama_cpp']['best_ngram']})" for name, s in rows]
    return lines


def split_lines(rep: dict) -> list[str]:
    """Held-out records (bench --split all on a set with a held-out split) reported apart."""
    rows = [(k, s["heldout"]) for k, s in rep["sets"].items() if s.get("heldout")]
    prefill_once = rep["settings"].get("prefill_once")  # then each run evaluated only the prompt's last chunk
    out = []
    for name, h in rows:
        vs = (f", {h['llama_cpp']['speedup_eagle_vs_best_ngram']:.2f}x the best n-gram mode "
              f"({h['llama_cpp']['best_ngram']})" if h.get("llama_cpp", {}).get("ngram") else "")
        e2e = "" if prefill_once else f" ({h['speedup_e2e']:.2f}x end to end)"
        out.append(f"- {name}, held-out records only ({h['n_prompts']}): {h['speedup']:.2f}x plain{e2e}, "
                   f"tau {h['tau']:.2f}, identical {h['identical_outputs']}{vs}")
    return [""] + out if out else []


def verify_section(path: Path, rep: dict) -> list[str]:
    lines = [f"### {path.stem}", "", f"- model `{Path(rep['model']).name}`, {rep['threads']} threads, "
             f"{rep['context_tokens']} tokens of context", f"- command: `{rep.get('command', 'eagle2-local verify-cost')}`",
             "", "| nodes | ms | x one token |", "|---|---|---|"]
    for n, sec in rep["seconds"].items():
        lines.append(f"| {n} | {sec * 1e3:.1f} | {rep['relative_to_one_token'][n]:.2f} |")
    return lines + [""]


def eagle1_draft_section(path: Path, rep: dict) -> list[str]:
    """Numpy EAGLE-1/2 engine: draft time per tree level against the target's time per token."""
    m = rep["machine"]
    lines = [f"### {path.stem}", "",
             f"- date: {rep['date']}; machine: {m['cpu']}, {m['cores']} cores; model `{rep['model']}`; "
             f"{rep['threads']} thread(s); head: {rep['head']}",
             f"- tree {rep['tree']}, {rep['prompts']} prompts x {rep['max_tokens']} tokens",
             f"- command: `{rep['command']}`", "",
             f"Target: {rep['target_ms_per_token']:.1f} ms per token (plain decoding), "
             f"{rep['verify_ms_per_tree']:.0f} ms per tree verification. "
             f"Draft catch-up (new committed tokens): {rep['draft_ms_catch_up']:.1f} ms.", "",
             "| tree level | draft ms | x target token | calls |", "|---|---|---|---|"]
    for level, ms in rep["draft_ms_per_level"].items():
        lines.append(f"| {level} | {ms:.1f} | {rep['draft_ms_per_level_over_target_token'][level]:.2f} | "
                     f"{rep['calls_per_level'][level]} |")
    return lines + [""]


def draft_cost_section(reports: list[tuple[Path, dict]]) -> list[str]:
    """One row per `draft-cost --json` report: the draft's cost per level against one target token."""
    lines = ["| report | engine | threads | nodes per level | catch-up ms | level ms | target token ms | "
             "level / target token |", "|---|---|---|---|---|---|---|---|"]
    for path, r in reports:
        lines.append(f"| {path.stem} | `{r['engine']}` | {r.get('threads', '-')} | {r['width']} | {r['catch_up_ms']:.2f} | "
                     f"{r['level_ms']:.2f} | {r['target_token_ms']:.2f} | {r['level_over_target_token']:.3f} |")
    lines += [""] + [f"- {path.stem}: `{r['command']}`" + (f" ({r['note']})" if r.get("note") else "")
                     for path, r in reports] + [""]
    return lines


def budget_section(reports: list[tuple[Path, dict]]) -> list[str]:
    """`--budget auto` against a sweep of fixed tree sizes from the same model and draft (bench-budget-*.json):
    per set, the speedup over plain decoding of each, and how close auto comes to the best fixed size."""
    lines = []
    for path, rep in [(p, r) for p, r in reports if r["settings"]["tree"].get("budget") == "auto"]:
        same = (rep["settings"]["model_sha256"], rep["settings"]["draft_sha256"])
        fixed = sorted(((p, r) for p, r in reports if r["settings"]["tree"].get("budget") != "auto"
                        and (r["settings"]["model_sha256"], r["settings"]["draft_sha256"]) == same),
                       key=lambda pr: pr[1]["settings"]["tree"]["total_tokens"])
        sizes = [r["settings"]["tree"]["total_tokens"] for _, r in fixed]
        lines += [f"### {path.stem}: auto vs fixed tree sizes", "", f"- command: `{rep['settings']['command']}`"]
        lines += ["- fixed sizes from: " + ", ".join(f"`{p.stem}`" for p, _ in fixed)] if fixed else []
        if rep.get("note"):
            lines.append(f"- note: {rep['note']}")
        lines += budget_state_lines(rep)
        lines += ["", "| set | auto speedup | auto tree (mean) | auto plain steps | "
                  + " | ".join(f"fixed {n}" for n in sizes) + " | best fixed | auto / best fixed |",
                  "|---|---|---|---|" + "---|" * len(sizes) + "---|---|"]
        for name, s in rep["sets"].items():
            fx = [r["sets"][name]["speedup"] for _, r in fixed if name in r["sets"]]
            best = max(fx) if fx else None
            lines.append(f"| {name} | {s['speedup']:.2f}x | {s['mean_tree_size']:.1f} | {s.get('plain_steps', '-')} | "
                         + " | ".join(f"{x:.2f}x" for x in fx)
                         + (f" | {best:.2f}x | {s['speedup'] / best:.2f} |" if best else " | - | - |"))
        lines.append("")
    return lines


def budget_state_lines(rep: dict) -> list[str]:
    """The auto budget's calibration and learned state after the last prompt of a report."""
    b = rep["prompts"][-1]["eagle"].get("budget") if rep["prompts"] else None
    if not b:
        return []
    cal, now = b["calibration"], b["costs_now"]
    return [f"- calibration ({cal['source']}{', %.1f s' % cal['seconds'] if 'seconds' in cal else ''}): verify ms by "
            f"nodes {cal['verify_ms']}, draft root {cal['draft_root_ms']:.1f} ms, draft level {cal['draft_level_ms']:.1f} ms",
            f"- after the run: load factor {now['load']}, plain {b['plain_tokens_per_s']} tok/s, best conceivable "
            f"tree {b['ceiling_tokens_per_s']} tok/s, trees realised {b['tree_tokens_per_s']} tok/s "
            f"({b['nodes_observed']} drafted nodes observed)"]


def server_load_section(path: Path, rep: dict) -> list[str]:
    """`eagle2-local serve` under the load test of tests/server/test_server.py (server-load-*.json)."""
    m = rep["machine"]
    lines = [f"### {path.stem}", "",
             f"- date: {rep['date']}; machine: {m['cpu']}, {m['cores']} cores; 1/5/15-min load average "
             f"{m['load_average_at_start']} before, {m['load_average_at_end']} after",
             f"- server: `{rep['server']}`",
             f"- command: `{rep['command']}`"] + ([f"- note: {rep['note']}"] if rep.get("note") else []) + ["",
             "| clients x requests | abandoned early | finished | max_tokens | wall s | tokens/s (finished answers) "
             "| finished requests/s | decode tok/s per answer (mean) | mean tau | identical to `generate --plain` |",
             "|---|---|---|---|---|---|---|---|---|---|",
             f"| {rep['clients']} x {rep['requests_per_client']} | {rep['abandoned_early']} | {rep['finished']} | "
             f"{rep['max_tokens']} | {rep['wall_s']:.1f} | {rep['tokens_per_s']:.1f} | "
             f"{rep['finished_requests_per_s']:.2f} | {rep['mean_decode_tokens_per_s']:.1f} | {rep['mean_tau']:.2f} | "
             f"{rep['identical_to_plain_generate']}/{rep['finished']} |", ""]
    return lines


def prompt_cache_section(path: Path, rep: dict) -> list[str]:
    """Reproducible prompt reuse vs cache_prompt on one long chat (prompt-cache-*.json)."""
    m = rep["machine"]
    lines = [f"### {path.stem}", "",
             f"- date: {rep['date']}; machine: {m['cpu']}, {m['cores']} cores; threads {rep['threads']}; "
             f"load average {', '.join(f'{x:.1f}' for x in rep['load_average'])}; repeat {rep['repeat']} (medians)",
             f"- command: `{rep['command']}`", "",
             "| turn | default: reused / prompt tokens | default: prompt ms | cache_prompt: reused / prompt tokens "
             "| cache_prompt: prompt ms |", "|---|---|---|---|---|"]
    for row in rep["turns"]:
        e, c = row["exact"], row["cache_prompt"]
        lines.append(f"| {row['turn']} | {e['reused']} / {e['prompt_tokens']} | {e['prefill_s'] * 1000:.0f} | "
                     f"{c['reused']} / {c['prompt_tokens']} | {c['prefill_s'] * 1000:.0f} |")
    t, w = rep["prefill_s_total"], rep["chat_s_total"]
    lines += ["", f"Prompt time over the chat: default {t['exact']:.2f} s, cache_prompt {t['cache_prompt']:.2f} s; "
                  f"whole chat (answers included) {w['exact']:.2f} s vs {w['cache_prompt']:.2f} s.", ""]
    return lines


def lookup_tau_section(reports: list[tuple[Path, dict]]) -> list[str]:
    """tau of the same fixed tree shape with each draft (tau-lookup-*.json: bench reports of one shape)."""
    first = reports[0][1]
    st = first["settings"]
    lines = [f"- date: {first['date']}; model `{Path(st['model']).name}`; tree {st['tree']}; threads {st['threads']}, "
             f"max_tokens {st['max_tokens']}, temperature {st['temperature']}", "- commands:"]
    lines += [f"  - `{rep['settings']['command']}`" for _, rep in reports]
    names = [rep["settings"]["engine"] for _, rep in reports]
    lines += ["", "| set | " + " | ".join(f"tau `{n}`" for n in names) + " | accepted by source (each draft) |",
              "|---|" + "---|" * (len(names) + 1)]
    for set_name in first["sets"]:
        cells = [f"{rep['sets'][set_name]['tau']:.2f}" for _, rep in reports]
        by_source = ["/".join(f"{k} {v}" for k, v in sorted(rep["sets"][set_name].get("accepted_by_source",
                                                                                         {}).items()))
                     for _, rep in reports]
        lines.append(f"| {set_name} | " + " | ".join(cells) + " | " + "; ".join(by_source) + " |")
    same = [f"{rep['sets'][k]['identical_outputs']}/{rep['sets'][k]['n_prompts']}" for _, rep in reports
            for k in rep["sets"]]
    return lines + ["", f"Outputs identical to plain greedy (per draft and set, in order): {', '.join(same)}", ""]


def llamacpp_ngram_section(path: Path, rep: dict) -> list[str]:
    st, sm = rep["settings"], rep["summary"]
    return [f"### {path.stem}", "", f"- date: {rep.get('date', '?')}; model `{Path(st['model']).name}`; prompts "
            f"`{st['prompts']}` (first {st['n']}); max_tokens {st['max_tokens']}; threads {st['threads']}",
            f"- command: `{rep.get('command', '')}`", "",
            "| prompts | llama-server plain tok/s (median) | with n-gram drafting tok/s (median) | speedup (median) "
            "| drafted | accepted | identical |", "|---|---|---|---|---|---|---|",
            f"| {sm['prompts']} | {sm['tokens_per_s_plain_median']:.2f} | {sm['tokens_per_s_ngram_median']:.2f} | "
            f"{sm['speedup_median']:.2f}x | {sm['drafted']} | {sm['accepted']} | {sm['identical_outputs']} |", ""]


def servers_section(path: Path, rep: dict) -> list[str]:
    """llama-server and eagle2-local's server on the same requests: each server's median decode speed, its
    median speed-up over llama-server's plain run, and its answers equal to that run's."""
    lines = [f"### {path.stem}", "", f"- date: {rep['date']}", f"- command: `{rep['command']}`"]
    lines += [f"- {name}: `{cmd}`" for name, cmd in rep["servers"].items()]
    lines += ([f"- note: {rep['note']}"] if rep.get("note") else []) + ["",
              "| server | tok/s (median) | vs llama-server (median) | identical to llama-server | tau |",
              "|---|---|---|---|---|"]
    n = len(next(iter(rep["results"].values())))
    for name, s in rep["summary"].items():
        tau = f"{s['tau_median']:.2f}" if "tau_median" in s else ""
        lines.append(f"| {name} | {s['tokens_per_s_median']:.1f} | {s['speedup_vs_llama_server_median']:.2f}x | "
                     f"{s['identical_to_llama_server']}/{n} | {tau} |")
    e = rep["summary"].get("eagle2-local", {})
    if "speedup_vs_eagle2_local_plain_median" in e:
        lines += ["", f"eagle2-local vs its own plain decoding: {e['speedup_vs_eagle2_local_plain_median']:.2f}x "
                      f"(median), identical {e['identical_to_eagle2_local_plain']}/{n}."]
    return lines + [""]


def per_report(pattern: str, heading: list[str], section) -> list[str]:
    """``heading``, then ``section(path, report)`` for each report matching ``pattern``; nothing when none do."""
    paths = sorted(RESULTS.glob(pattern))
    if not paths:
        return []
    return heading + [line for p in paths for line in section(p, json.loads(p.read_text()))]


def grouped(pattern: str, heading: list[str], section) -> list[str]:
    """``heading``, then one ``section`` over all reports matching ``pattern`` (a table across them)."""
    paths = sorted(RESULTS.glob(pattern))
    return heading + section([(p, json.loads(p.read_text())) for p in paths]) if paths else []


LLAMA_CPP_BIN = re.compile(r"(--llama-cpp-bin|--bin) (/\S+)")


def portable(text: str) -> str:
    """Recorded commands name the vendored llama.cpp build by the script that prints its folder, not by this
    machine's path to it."""
    return LLAMA_CPP_BIN.sub(r'\1 "$(bash benchmarks/build_llama_cpp.sh)"', text)


def record() -> str:
    """The whole record: every report's section, in a fixed order of groups, each group by report file name."""
    out = ["# Benchmark record", "",
           "Generated by `python benchmarks/make_record.py` from `benchmarks/results/*.json`. Each table names the",
           "command that produced it; plain decoding and eagle2-local ran in the same process, alternating per",
           "prompt, on the same llama.cpp context. Speedup = median over prompts of eagle tok/s / plain tok/s.", ""]
    out += per_report("verify-*.json", ["## Cost of one-pass tree verification", ""], verify_section)
    out += per_report("bench-*.json", ["## eagle2-local vs plain decoding", ""], bench_section)
    out += per_report("eagle1-numpy-draft-time-*.json", ["## Numpy EAGLE-1/2 engine: draft time per tree level", ""],
                      eagle1_draft_section)
    out += grouped("draft-cost-*.json",
                   ["## Draft cost per tree level during real generations (`eagle2-local draft-cost`)", ""],
                   draft_cost_section)
    out += grouped("bench-budget-*.json", ["## Tree budget: auto vs fixed tree sizes", ""], budget_section)
    out += grouped("tau-lookup-*.json",
                   ["## Lookup drafts: tau of head, head + lookup and lookup alone (same fixed tree)", ""],
                   lookup_tau_section)
    out += per_report("llamacpp-ngram-*.json", ["## llama.cpp's own n-gram drafting (llama-server, same prompts)", ""],
                      llamacpp_ngram_section)
    out += per_report("servers-*.json",
                      ["## Side by side with llama-server (same HTTP requests, `benchmarks/servers.py`)", ""],
                      servers_section)
    out += per_report("grammar-*.json",
                      ["## Under a grammar: plain constrained vs speculative constrained decoding", ""], bench_section)
    out += per_report("prompt-cache-*.json", [
        "## Reproducible prompt reuse vs cache_prompt (long chat, plain decoding)", "",
        "By default a cached prefix is reused only where a fresh evaluation reproduces it bit for bit and",
        "the rest of a prompt is evaluated in aligned 32-token batches; `cache_prompt` reuses every cached",
        "token and evaluates the rest in full batches (`benchmarks/experiments/prompt_cache_cost.py`).", ""], prompt_cache_section)
    out += per_report("server-load-*.json", [
        "## Server load", "",
        "`eagle2-local serve` on loopback: concurrent streaming clients (official `openai` client), one",
        "model answering one request at a time; throughput counts the tokens of finished answers over the",
        "wall time of the whole run, abandoned requests included.", ""], server_load_section)
    for p in sorted(RESULTS.glob("*.md")):  # measurements recorded as text (no JSON report), in name order
        out += [p.read_text().rstrip("\n"), ""]
    return portable("\n".join(out)) + "\n"


def main() -> None:
    """Write BENCHMARKS.md and benchmarks/ARCHIVE.md through benchmarks_table.py's split."""
    spec = importlib.util.spec_from_file_location("benchmarks_table", Path(__file__).with_name("benchmarks_table.py"))
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    table.main([])
    print(f"from {len(list(RESULTS.glob('*.json')))} reports")


if __name__ == "__main__":
    main()
