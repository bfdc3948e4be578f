"""RPC vs host CPU numerics: SmolLM2 + the default head, one loopback rpc-server, 1 thread on both sides.

    ~/.cache/eagle2-local/rpc-venv/bin/python benchmarks/experiments/rpc_numerics.py [PORT]   # needs the RPC build

Prints, per quantity, the largest |rpc - host| over one prompt of each EAGLE set (first 200 tokens);
NOTES.md#llamacpps-rpc-backend records the result.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from eagle2_local.api import Eagle2
from eagle2_local.bench.prompt_sets import interleaved, load_prompt_sets
from eagle2_local.llamacpp import rpc

ROOT = Path(__file__).resolve().parents[2]
EAGLE_SETS = ROOT / "benchmarks" / "prompts" / "eagle"  # EAGLE's six evaluation sets, vendored

QUANTITIES = ("layer-input features", "target logits after prefill", "head root logits",
              "target single-token logits")


def start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "cli", "rpc-server", "--port", str(port), "--threads", "1"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            rpc.hello(f"127.0.0.1:{port}", 2)
            return proc
        except rpc.RPCError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"rpc-server on port {port} did not come up")


def measure(servers: str | None) -> list[tuple[np.ndarray, ...]]:
    """Per prompt: features and target logits of a prefill, the head's root logits, three single-token decodes."""
    out = []
    with Eagle2(n_threads=1, n_ctx=1024, rpc_servers=servers, budget="fixed", total_tokens=20) as llm:
        for text in interleaved(load_prompt_sets([str(EAGLE_SETS)], None), 6):
            llm.generator.reset()
            llm.target.reset()
            tokens = llm.tokenize(text, add_bos=True, special=True)[:200]
            ver = llm.target.prefill(tokens)
            root = int(np.argmax(ver.logits[0]))
            engine = llm.generator.engine
            engine.reset()
            root_logits = engine.catch_up(np.array(tokens + [root]), ver.features, 0)
            singles = np.array([llm.target.decode_one(t).logits[0] for t in (root, 17, 99)])
            out.append(tuple(np.array(x) for x in (ver.features, ver.logits[0], root_logits, singles)))  # own copies
    return out


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 50177
    server = start_server(port)
    try:
        host, remote = measure(None), measure(f"127.0.0.1:{port}")
    finally:
        server.kill()
        server.wait()
    for i, name in enumerate(QUANTITIES):
        diffs, scales = [], []
        for a, b in zip(host, remote):
            finite = np.isfinite(a[i])
            diffs.append(float(np.abs(a[i][finite] - b[i][finite]).max()))
            scales.append(float(np.abs(a[i][finite]).max()))
        print(f"{name}: max |rpc-host| {max(diffs):.3g} (max |host| {max(scales):.3g}); "
              f"identical in {sum(d == 0 for d in diffs)}/{len(diffs)} prompts")


if __name__ == "__main__":
    main()
