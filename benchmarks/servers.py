"""llama-server and eagle2-local's server side by side: the same requests over the same HTTP API, one run.

    python benchmarks/servers.py --bin "$(benchmarks/build_llama_cpp.sh)" --model GGUF
        [--prompts benchmarks/prompts/extract_schema.jsonl] [--split tune] [--n 8] [--max-tokens 128] [--threads 2] [--eagle "--draft lookup"]
        [--llama-spec "--spec-type ngram-simple"] [--json OUT]

Every server starts first and stays up; then each prompt goes to every server in turn, in an order that rotates
per prompt, so a change in the machine's load falls on all of them alike. The servers:

* ``llama-server``: llama.cpp's own server, plain decoding (the binary ``benchmarks/build_llama_cpp.sh`` builds
  from the llama.cpp that llama-cpp-python vendors: the same ggml kernels);
* ``llama-server+spec``: the same with ``--llama-spec`` options (its n-gram drafting), when given;
* ``eagle2-local plain`` and ``eagle2-local`` (``eagle2-local serve --plain`` / ``serve`` with ``--eagle``).

A record's ``schema`` goes as llama-server's ``json_schema`` request field and its ``grammar`` as ``grammar``,
which both servers take; a record with several turns sends its first. Greedy, prompt cache off, one discarded
warm-up request per server. Speed is each server's own decode figure (prompt processing excluded): llama-server's
``timings.predicted_per_second``, eagle2-local's ``eagle.tokens_per_s``. Printed per server: median tokens/s,
median speed-up over llama-server's plain run, and how many answers equal that run's.
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
from dataclasses import dataclass
from pathlib import Path

from eagle2_local.errors import Eagle2Error

ROOT = Path(__file__).resolve().parents[1]

BASELINE = "llama-server"


class RunError(Exception):
    """A server that would not start or answer, reported as one line."""


@dataclass
class Server:
    name: str
    cmd: list[str]
    port: int
    proc: subprocess.Popen | None = None


def server_commands(args) -> list[Server]:
    """The servers to compare, each on its own port."""
    common = ["-m", str(args.model), "-t", str(args.threads), "--n-ctx", str(args.n_ctx), "--host", "127.0.0.1"]
    llama = [str(args.bin / "llama-server"), "-m", str(args.model), "-t", str(args.threads), "-tb",
             str(args.threads), "-c", str(args.n_ctx), "-np", "1", "--no-webui", "--no-cache-prompt",
             "--host", "127.0.0.1"]
    eagle = [str(Path(sys.executable).parent / "eagle2-local"), "serve", *common, "--no-cache-prompt"]
    servers = [Server(BASELINE, llama, 0)]
    if args.llama_spec:
        servers.append(Server("llama-server+spec", llama + shlex.split(args.llama_spec), 0))
    servers.append(Server("eagle2-local plain", eagle + ["--plain"], 0))
    servers.append(Server("eagle2-local", eagle + shlex.split(args.eagle), 0))
    for i, s in enumerate(servers):
        s.port = args.port + i
        s.cmd = s.cmd + ["--port", str(s.port)]
    return servers


def start(server: Server, log: Path) -> None:
    print("$ " + shlex.join(server.cmd), flush=True)
    server.proc = subprocess.Popen(server.cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RunError(f"{server.name} exited with code {server.proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RunError(f"{server.name} did not become healthy in 600 s; see {log}")


def request_body(turn: str, max_tokens: int, constraint: dict) -> dict:
    """One greedy chat request, the record's constraint in llama-server's own fields."""
    return {"messages": [{"role": "user", "content": turn}], "max_tokens": max_tokens, "temperature": 0.0,
            "cache_prompt": False, **constraint}


def complete(server: Server, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/chat/completions",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=3600) as r:
            reply = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise RunError(f"{server.name} answered {exc.code}: {exc.read()[:300]!r}") from None
    text = reply["choices"][0]["message"]["content"]
    if "eagle" in reply:
        e = reply["eagle"]
        return {"text": text, "n": e["n_tokens"], "tokens_per_s": e["tokens_per_s"], "tau": e["tau"]}
    t = reply["timings"]
    return {"text": text, "n": t["predicted_n"], "tokens_per_s": t["predicted_per_second"],
            "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0)}


def load_jobs(path: str, split: str, n: int | None) -> list[tuple[str, dict]]:
    """Each record's first user turn and its constraint as request fields (``schema`` -> ``json_schema``,
    ``grammar`` -> ``grammar``); ``split`` as in ``eagle2-local bench`` (records without one are tune)."""
    jobs = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if split != "all" and rec.get("split", "tune") != split:
            continue
        turns = rec.get("turns") or [rec["prompt"]]
        constraint = ({"json_schema": rec["schema"]} if rec.get("schema") is not None
                      else {"grammar": rec["grammar"]} if rec.get("grammar") is not None else {})
        jobs.append((turns[0], constraint))
    return jobs[:n] if n is not None else jobs


def summarize(results: dict[str, list[dict]]) -> dict:
    base = results[BASELINE]
    out = {}
    for name, rs in results.items():
        out[name] = {"tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rs),
                     "speedup_vs_llama_server_median": statistics.median(
                         r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(rs, base)),
                     "identical_to_llama_server": sum(r["text"] == b["text"] for r, b in zip(rs, base))}
        if "tau" in rs[0]:
            out[name]["tau_median"] = statistics.median(r["tau"] for r in rs)
        if "drafted" in rs[0] and sum(r["drafted"] for r in rs):
            out[name]["accepted/drafted"] = f"{sum(r['accepted'] for r in rs)}/{sum(r['drafted'] for r in rs)}"
    plain = results.get("eagle2-local plain")
    if plain is not None:
        out["eagle2-local"]["speedup_vs_eagle2_local_plain_median"] = statistics.median(
            r["tokens_per_s"] / p["tokens_per_s"] for r, p in zip(results["eagle2-local"], plain))
        out["eagle2-local"]["identical_to_eagle2_local_plain"] = sum(
            r["text"] == p["text"] for r, p in zip(results["eagle2-local"], plain))
    return out


def run(args) -> tuple[dict[str, list[dict]], list[Server]]:
    jobs = load_jobs(args.prompts, args.split, args.n)
    if not jobs:
        raise RunError(f"no records in {args.prompts} (split {args.split})")
    servers = server_commands(args)
    logs = Path(tempfile.mkdtemp(prefix="servers-"))
    results: dict[str, list[dict]] = {s.name: [] for s in servers}
    try:
        for s in servers:
            start(s, logs / f"{s.name.replace(' ', '_')}.log")
            complete(s, request_body(jobs[0][0], 4, jobs[0][1]))  # warm-up, discarded
        for i, (turn, constraint) in enumerate(jobs):
            order = servers[i % len(servers):] + servers[:i % len(servers)]
            for s in order:
                results[s.name].append(complete(s, request_body(turn, args.max_tokens, constraint)))
            line = ", ".join(f"{s.name} {results[s.name][-1]['tokens_per_s']:.2f}" for s in servers)
            print(f"prompt {i}: {line} tok/s", flush=True)
    finally:
        for s in servers:
            if s.proc is not None:
                s.proc.terminate()
                s.proc.wait(timeout=60)
    return results, servers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="folder with llama-server (build_llama_cpp.sh prints it)")
    ap.add_argument("--model", type=Path, required=True, help="target GGUF")
    ap.add_argument("--prompts", default=str(ROOT / "benchmarks" / "prompts" / "extract_schema.jsonl"))
    ap.add_argument("--split", choices=["all", "tune", "heldout"], default="all")
    ap.add_argument("--n", type=int, default=None, help="first N prompts")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--port", type=int, default=8391, help="first port (one per server)")
    ap.add_argument("--eagle", default="--draft lookup", help="eagle2-local serve options of the speculative run")
    ap.add_argument("--llama-spec", default="", help="also run llama-server with these options (its n-gram drafting)")
    ap.add_argument("--json", type=Path, help="write per-prompt results and the summary here "
                                              "(benchmarks/results/servers-*.json: make_record.py shows it)")
    ap.add_argument("--note", default=None, help="a remark stored in the JSON (e.g. the machine's load)")
    args = ap.parse_args(argv)
    missing = [str(p) for p in (args.bin / "llama-server", args.model, Path(args.prompts)) if not p.is_file()]
    if missing:
        print(f"error: not found: {', '.join(missing)}", file=sys.stderr)
        return 1
    try:
        results, servers = run(args)
    except (RunError, Eagle2Error, OSError, KeyError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    summary = summarize(results)
    print(json.dumps(summary, indent=1))
    if args.json:
        def portable(cmd: list[str]) -> str:
            """A command as a reader can run it: no paths of this machine's folders."""
            return " ".join(c.replace(str(args.bin), "$LLAMA_CPP_BIN").replace(
                str(Path(sys.executable).parent / "eagle2-local"), "eagle2-local") for c in cmd)
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                         "command": portable(["python", "benchmarks/servers.py",
                                                              *map(shlex.quote, argv or sys.argv[1:])]),
                                         "servers": {s.name: portable(list(map(shlex.quote, s.cmd)))
                                                     for s in servers},
                                         "summary": summary, "results": results,
                                         **({"note": args.note} if args.note else {})}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
