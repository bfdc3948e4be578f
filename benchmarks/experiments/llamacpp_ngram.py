"""llama.cpp's own n-gram lookup drafting vs its plain decoding, same prompts, same binary (llama-server).

    python benchmarks/experiments/llamacpp_ngram.py --bin DIR --model GGUF [--prompts benchmarks/prompts/code_edit.jsonl]
        [--n 20] [--max-tokens 256] [--threads 2] [--spec "--spec-type ngram-simple"] [--json OUT]

One llama-server runs plain, a second one with the --spec options; each prompt goes as one user message to
/v1/chat/completions (the server applies the GGUF's chat template), greedy, prompt cache off, after one
discarded warm-up request. The server's own timings give decode tokens/s (prompt processing excluded) and
drafted/accepted token counts. Use benchmarks/experiments/llamacpp_ngram.sh, which builds the binaries first.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from eagle2_local.bench.prompt_sets import load_prompt_sets
from eagle2_local.errors import Eagle2Error

ROOT = Path(__file__).resolve().parents[2]


class RunError(Exception):
    """A server that would not start or answer, reported as one line."""


def start_server(binary: Path, model: Path, port: int, threads: int, n_ctx: int, extra: list[str],
                 log: Path) -> subprocess.Popen:
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "-tb", str(threads), "-c", str(n_ctx), "-np", "1", "--no-webui", "--no-cache-prompt", *extra]
    print("$ " + shlex.join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RunError(f"llama-server exited with code {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    proc.terminate()
    raise RunError(f"llama-server did not become healthy in 300 s; see {log}")


def complete(port: int, prompt: str, max_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0.0,
            "cache_prompt": False}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        reply = json.loads(r.read())
    t = reply["timings"]
    return {"text": reply["choices"][0]["message"]["content"], "n": t["predicted_n"],
            "tokens_per_s": t["predicted_per_second"], "drafted": t.get("draft_n", 0),
            "accepted": t.get("draft_n_accepted", 0)}


def run_mode(args, extra: list[str], prompts: list[str], log: Path) -> list[dict]:
    proc = start_server(args.bin / "llama-server", args.model, args.port, args.threads, args.n_ctx, extra, log)
    try:
        complete(args.port, prompts[0], 4)  # warm-up, discarded: the first request pays one-time setup
        return [complete(args.port, p, args.max_tokens) for p in prompts]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def summarize(plain: list[dict], spec: list[dict]) -> dict:
    drafted = sum(r["drafted"] for r in spec)
    return {"prompts": len(plain),
            "tokens_per_s_plain_median": statistics.median(r["tokens_per_s"] for r in plain),
            "tokens_per_s_ngram_median": statistics.median(r["tokens_per_s"] for r in spec),
            "speedup_median": statistics.median(s["tokens_per_s"] / p["tokens_per_s"] for p, s in zip(plain, spec)),
            "drafted": drafted, "accepted": sum(r["accepted"] for r in spec),
            "acceptance": sum(r["accepted"] for r in spec) / drafted if drafted else 0.0,
            "identical_outputs": sum(p["text"] == s["text"] for p, s in zip(plain, spec))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="folder with llama-server (build_llama_cpp.sh prints it)")
    ap.add_argument("--model", type=Path, required=True, help="target GGUF")
    ap.add_argument("--prompts", default=str(ROOT / "benchmarks" / "prompts" / "code_edit.jsonl"))
    ap.add_argument("--n", type=int, default=None, help="first N prompts")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--port", type=int, default=8391)
    ap.add_argument("--spec", default="--spec-type ngram-simple",
                    help="llama-server options of the drafting run (default: %(default)s with llama.cpp's "
                         "sizes; its draft length is --spec-draft-n-max, default 3)")
    ap.add_argument("--json", type=Path, help="write per-prompt results and the summary here")
    args = ap.parse_args(argv)
    try:
        if not (args.bin / "llama-server").is_file():
            raise RunError(f"no llama-server in {args.bin}")
        if not args.model.is_file():
            raise RunError(f"no model file at {args.model}")
        sets = load_prompt_sets([args.prompts], args.n)
        prompts = [p for s in sets for p in s.prompts]
        logs = Path(tempfile.mkdtemp()) / "llamacpp_ngram"
        plain = run_mode(args, [], prompts, Path(f"{logs}.plain.log"))
        spec = run_mode(args, shlex.split(args.spec), prompts, Path(f"{logs}.ngram.log"))
    except (RunError, Eagle2Error, OSError, KeyError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for i, (p, s) in enumerate(zip(plain, spec)):
        print(f"prompt {i}: plain {p['tokens_per_s']:.2f} tok/s ({p['n']} tokens), ngram {s['tokens_per_s']:.2f} "
              f"tok/s ({s['n']} tokens), accepted {s['accepted']}/{s['drafted']}, "
              f"{'same' if p['text'] == s['text'] else 'DIFFERENT'} text")
    summary = summarize(plain, spec)
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                         "command": shlex.join(["benchmarks/experiments/llamacpp_ngram.py",
                                                                *(argv or sys.argv[1:])]),
                                         "settings": {k: str(v) for k, v in vars(args).items()},
                                         "summary": summary, "plain": plain, "ngram": spec}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
