"""llama.cpp's RPC backend: the offload path (weights, KV cache, features and borrowed head tensors in a non-host
device's buffers) keeps every lossless guarantee, and failures are one clear line.

Tests marked ``rpc`` need an RPC build of llama-cpp-python and are deselected by default; run them with
``bash benchmarks/rpc_check.sh`` (builds it, starts two loopback servers, runs ``pytest -m rpc``). Servers come from
``EAGLE2_RPC_SERVERS`` (``HOST:PORT,HOST:PORT``) or are started here. The servers run one thread: like the
host CPU backend, their kernels are batch-invariant only then (NOTES.md#lossless).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from eagle2_local.decoding.target import Target
from eagle2_local.errors import Eagle2Error
from eagle2_local.llamacpp import rpc
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.llamacpp.settings import ContextSettings
from eagle2_local.tree.draft_tree import TreeParams, tree_leaves
from tests.support.helpers import (assert_one_line_error, check_thousand_rounds_leak_no_cells, path_to, random_tree,
                                   run_cli, sequential_logits, synthetic_head)
from tests.support.prompts import load_prompts

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ default tier: no RPC build needed
def test_parse_servers():
    assert rpc.parse_servers("127.0.0.1:50052, localhost:7") == ("127.0.0.1:50052", "localhost:7")
    assert rpc.parse_servers(["a:1,b:2", "c:3"]) == ("a:1", "b:2", "c:3")
    assert rpc.parse_servers(None) == ()
    for bad in ("127.0.0.1", ":50052", "h:0", "h:99999", "h:x", "a:1,a:1", ""):
        with pytest.raises(rpc.RPCError):
            rpc.parse_servers(bad)


def test_loopback_detection():
    assert rpc.is_loopback("127.0.0.1") and rpc.is_loopback("localhost")
    assert not rpc.is_loopback("0.0.0.0") and not rpc.is_loopback("192.0.2.1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rpc_flag_fails_in_one_line(synth_q8):
    """``--rpc`` on a build without RPC says so (and how to get one); on an RPC build, an endpoint nobody
    serves is a clear error too, not llama.cpp's abort."""
    port = _free_port()
    proc = run_cli("generate", "--model", str(synth_q8), "--rpc", f"127.0.0.1:{port}", "-p", "the cat", "-n", "4")
    assert proc.returncode == 1
    if rpc.supports_rpc():
        assert_one_line_error(proc, f"cannot reach RPC server 127.0.0.1:{port}")
    else:
        assert_one_line_error(proc, "this llama-cpp-python build has no RPC support")
        assert 'CMAKE_ARGS="-DGGML_RPC=on"' in proc.stderr
    assert proc.stdout == ""
    assert_one_line_error(run_cli("generate", "--model", str(synth_q8), "--rpc", "nohost", "-p", "x"),
                          "bad RPC server 'nohost'")


@pytest.mark.skipif(rpc.supports_rpc(), reason="this build has RPC; the rpc tier serves for real")
def test_rpc_server_on_non_rpc_build_fails_in_one_line():
    proc = run_cli("rpc-server", "--port", str(_free_port()))
    assert proc.returncode == 1
    assert_one_line_error(proc, "no RPC support")


# ------------------------------------------------------------------ rpc tier
def _wait_serving(endpoint: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rpc-server exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            rpc.hello(endpoint, timeout=2)
            return
        except rpc.RPCError:
            time.sleep(0.2)
    raise RuntimeError(f"rpc-server on {endpoint} did not come up in {timeout:.0f} s")


def start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "cli", "rpc-server", "--port", str(port), "--threads", "1"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_serving(f"127.0.0.1:{port}", proc)
    return proc


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def servers():
    """Two loopback servers: from EAGLE2_RPC_SERVERS (rpc_check.sh starts them) or started for this session."""
    if not rpc.supports_rpc():
        pytest.fail(f"the rpc tier needs an RPC build: {rpc.INSTALL_HINT} (or run benchmarks/rpc_check.sh)")
    given = os.environ.get("EAGLE2_RPC_SERVERS")
    if given:
        endpoints = rpc.parse_servers(given)
        assert len(endpoints) >= 2, "EAGLE2_RPC_SERVERS needs two servers"
        yield endpoints[:2]
        return
    procs = [start_server(_free_port()) for _ in range(2)]
    try:
        yield tuple(f"127.0.0.1:{p.args[5]}" for p in procs)
    finally:
        for p in procs:
            stop_server(p)


@pytest.fixture(scope="module", params=[1, 2], ids=["one-server", "two-servers"])
def endpoints(request, servers) -> tuple[str, ...]:
    return servers[:request.param]


ONE_THREAD = ContextSettings(n_ctx=1024, n_batch=128, n_seq_max=80, n_threads=1)


def _load_logged(path, endpoints, caplog) -> tuple[LlamaModel, str]:
    with caplog.at_level("DEBUG", logger="eagle2_local.llamacpp.runtime"):
        model = LlamaModel(path, rpc_servers=endpoints)
    return model, "\n".join(r.getMessage() for r in caplog.records)


@pytest.mark.rpc
@pytest.mark.smollm2
def test_every_layer_lands_on_the_servers(endpoints, smollm2_path, caplog):
    model, log = _load_logged(smollm2_path, endpoints, caplog)
    assert model.n_gpu_layers == -1
    assert f"offloaded {model.n_layer + 1}/{model.n_layer + 1} layers" in log
    for endpoint in endpoints:  # each server holds part of the weights
        assert f"[{endpoint}] model buffer size" in log, log
    model.close()


@pytest.mark.rpc
def test_tree_logits_equal_sequential_decoding(endpoints, synth_q8, smollm2_path):

    rng = np.random.default_rng(5)
    for path, trees in ((synth_q8, [(63, 10), (30, 4), (5, 1)]), (smollm2_path, [(60, 8), (17, 16)])):
        model = LlamaModel(path, rpc_servers=endpoints)
        prefix = list(rng.integers(5, model.n_vocab, 12))
        for n, depth in trees:
            tree = random_tree(rng, model.n_vocab, n, depth)
            t = Target(model, ONE_THREAD)
            t.prefill(prefix)
            logits = t.verify(tree).logits
            t.abort_tree()
            t.close()
            for leaf in tree_leaves(tree.parents):
                nodes = path_to(tree, int(leaf))
                seq = sequential_logits(model, prefix, tree.tokens[nodes], ONE_THREAD)
                assert np.array_equal(seq, logits[nodes]), f"{path.name}: tree of {n}, leaf {leaf}"
        model.close()


@pytest.mark.rpc
def test_thousand_rounds_leak_no_cells(endpoints, synth_q8):

    model = LlamaModel(synth_q8, rpc_servers=endpoints)
    t, restores = check_thousand_rounds_leak_no_cells(model)
    assert restores.n > 0  # some commits moved accepted rows through the servers
    t.close()
    model.close()


def _greedy(llm, prompts: list[str], max_tokens: int) -> list[list[int]]:
    out = []
    for text in prompts:
        llm.reset()  # a fresh prefill per prompt, as plain greedy decoding of that prompt alone
        tokens = llm.tokenize(llm.render_chat([{"role": "user", "content": text}]), add_bos=True, special=True)
        got = []
        for chunk in llm.stream(tokens, max_tokens, _sampling()):
            got += chunk.tokens
        out.append(got)
    return out


def _sampling():
    from eagle2_local.tree.sampling import SamplingParams
    return SamplingParams(temperature=0.0)


def _plain_reference(endpoints, prompts, max_tokens, cache={}) -> list[list[int]]:
    """Plain greedy outputs on the same backend configuration (computed once per configuration)."""
    from eagle2_local.api import Eagle2

    key = (endpoints, tuple(prompts), max_tokens)
    if key not in cache:
        with Eagle2(plain=True, n_threads=1, n_ctx=1024, rpc_servers=endpoints) as llm:
            cache[key] = _greedy(llm, prompts, max_tokens)
    return cache[key]


LOSSLESS_PROMPTS = 6  # one first turn of each of EAGLE's six sets
LOSSLESS_TOKENS = 24


@pytest.mark.rpc
@pytest.mark.smollm2
@pytest.mark.parametrize("draft", ["default-head", "draft-model", "eagle1-head"])
def test_greedy_equals_plain_on_the_same_servers(endpoints, draft, smollm2_path, smollm2_weak, tmp_path):
    from eagle2_local.api import Eagle2

    prompts = load_prompts(LOSSLESS_PROMPTS)
    want = _plain_reference(endpoints, prompts, LOSSLESS_TOKENS)
    kw = dict(n_threads=1, n_ctx=1024, rpc_servers=endpoints, budget="fixed")
    if draft == "default-head":  # the shipped EAGLE-3 head: llama.cpp, on the servers, borrowing target tensors
        llm = Eagle2(total_tokens=16, **kw)
    elif draft == "draft-model":
        llm = Eagle2(smollm2_path, draft_model_path=smollm2_weak, total_tokens=10, depth=4, tree_top_k=3, **kw)
    else:  # EAGLE-1/2 head (numpy) reading the target's final hidden states from the servers
        head = synthetic_head(tmp_path, "smol", variant="vicuna", hidden=576, vocab=49152, n_head=9, ff=1536)
        llm = Eagle2(smollm2_path, head_path=head, total_tokens=8, depth=3, tree_top_k=3, **kw)
    with llm:
        got = _greedy(llm, prompts, LOSSLESS_TOKENS)
        assert llm.stats()["target_passes"] > 0
    for i, (a, b) in enumerate(zip(got, want)):
        assert a == b, f"prompt {i} ({prompts[i][:50]!r}) diverged"


@pytest.mark.rpc
@pytest.mark.smollm2
def test_layer_inputs_and_borrowed_embedding_on_the_servers(endpoints, smollm2_path, monkeypatch):
    """EAGLE-3 features (three layers' residual inputs) read back from the servers equal the host CPU's, and the
    default head, whose token embedding / LM head are the target's (on the servers), drafts the same tree."""
    from eagle2_local.api import Eagle2
    from eagle2_local.llamacpp import backend_topk

    monkeypatch.setattr(backend_topk, "IN_GRAPH_TOP_K", False)  # dense head rows, compared entry by entry

    prompt_text = load_prompts(1)[0]
    runs = {}
    for where, servers in (("host", None), ("rpc", endpoints)):
        with Eagle2(n_threads=1, n_ctx=512, rpc_servers=servers, budget="fixed", total_tokens=20,
                    lookup=False) as llm:
            tokens = llm.tokenize(prompt_text, add_bos=True, special=True)
            ver = llm.target.prefill(tokens)
            root = int(np.argmax(ver.logits[0]))
            engine = llm.generator.engine
            assert engine.name.startswith("eagle3")
            # copies: the engine's logits are views of llama.cpp buffers that die with the context (and, for the
            # root, with the next decode)
            root_logits = np.array(engine.catch_up(np.array(tokens + [root]), ver.features, 0).logits)
            top = np.argsort(root_logits)[-3:]
            level1 = engine.expand(np.arange(3), top, np.full(3, -1), 1).logits
            runs[where] = tuple(np.array(x) for x in (ver.features, ver.logits[0], root_logits, level1))
    host, remote = runs["host"], runs["rpc"]
    assert remote[0].shape == host[0].shape == (len(tokens), 3 * 576)
    for name, a, b in zip(("features", "target logits", "head root logits", "head level-1 logits"), host, remote):
        finite = np.isfinite(a)
        assert np.array_equal(finite, np.isfinite(b)), name
        scale = np.abs(a[finite]).max()
        diff = np.abs(a[finite] - b[finite]).max()
        print(f"{name}: max |rpc - host| = {diff:.3g} (max |host| {scale:.3g})")
        assert diff <= 1e-3 * scale, f"{name}: {diff} vs scale {scale}"
    assert np.argmax(remote[2]) == np.argmax(host[2])


@pytest.mark.rpc
@pytest.mark.smollm2
def test_cli_over_rpc_and_a_server_going_away(synth_q8, smollm2_path):
    """The CLI generates on a server of its own; when that server is killed mid-generation, the client stops
    within seconds with one ``error:`` line and exit code 1, not a hang or a core dump."""
    port = _free_port()
    server = start_server(port)
    try:
        ok = run_cli("generate", "--model", str(synth_q8), "--rpc", f"127.0.0.1:{port}", "--plain", "-p", "the cat",
                     "-n", "8", "--temperature", "0", "--threads", "1", "--json")
        assert ok.returncode == 0, ok.stderr
        # SmolLM2 continuing a story: hundreds of tokens before an end of text, so the kill lands mid-generation
        client = subprocess.Popen([sys.executable, "-m", "cli", "generate", "--model", str(smollm2_path), "--rpc",
                                   f"127.0.0.1:{port}", "--plain", "-p", "Once upon a time", "-n", "4000",
                                   "--n-ctx", "8192", "--temperature", "0", "--threads", "1", "--n-gpu-layers", "-1"],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = client.stdout.read(20)  # generation is under way
        assert first, client.stderr.read()
        server.kill()
        server.wait()
        try:
            _, err = client.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            client.kill()
            pytest.fail("the client hung after its RPC server went away")
        lines = [line for line in err.splitlines() if line.strip()]
        assert client.returncode == 1, err
        assert lines[-1].startswith("error: ") and "RPC" in lines[-1], err
        assert "Traceback" not in err
    finally:
        stop_server(server)


@pytest.mark.rpc
def test_unreachable_server_is_an_error_not_an_abort(synth_q8):
    port = _free_port()
    with pytest.raises(rpc.RPCError, match=f"cannot reach RPC server 127.0.0.1:{port}"):
        LlamaModel(synth_q8, rpc_servers=[f"127.0.0.1:{port}"])
    with pytest.raises(Eagle2Error, match="bad RPC server"):
        LlamaModel(synth_q8, rpc_servers=["nope"])
