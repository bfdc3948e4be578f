"""The Python API returns llama-cpp-python's (OpenAI) shapes for the same requests, plus an ``eagle`` field."""

from __future__ import annotations

import pytest

from eagle2_local.api import Eagle2
from eagle2_local.errors import Eagle2Error


def shape(obj):
    """Keys and value types, recursively (values themselves ignored)."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(obj[0])] if obj else []
    if obj is None:
        return None
    return type(obj).__name__


def without_eagle(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "eagle"}


@pytest.fixture(scope="module")
def pair(smollm2_path, smollm2_head):
    from llama_cpp import Llama
    ours = Eagle2(smollm2_path, head_path=smollm2_head, n_ctx=1024, n_threads=1, total_tokens=12, depth=4,
                  tree_top_k=3)
    theirs = Llama(str(smollm2_path), n_ctx=1024, n_threads=1, n_threads_batch=1, verbose=False)  # as ours
    yield ours, theirs
    ours.close()
    theirs.close()


@pytest.mark.smollm2
def test_completion_shape_matches_llama_cpp_python(pair):
    ours, theirs = pair
    a = ours.create_completion("The capital of France is", max_tokens=8, temperature=0)
    b = theirs.create_completion("The capital of France is", max_tokens=8, temperature=0)
    assert shape(without_eagle(a)) == shape(b)
    assert a["object"] == b["object"] == "text_completion"
    assert a["choices"][0]["finish_reason"] in ("stop", "length")
    assert a["usage"]["completion_tokens"] == a["eagle"]["n_tokens"] <= 8
    assert a["usage"]["total_tokens"] == a["usage"]["prompt_tokens"] + a["usage"]["completion_tokens"]
    for key in ("tau", "target_passes", "tokens_per_s"):
        assert key in a["eagle"]
    e = a["eagle"]  # every pass yields its accepted draft tokens and one of its own: tau follows exactly
    assert e["target_passes"] >= 1 and e["pass_tokens"] == e["target_passes"] + sum(e["accepted_per_depth"])
    assert e["tau"] == round(e["pass_tokens"] / e["target_passes"], 4) > 1.0  # the head's drafts were accepted


@pytest.mark.smollm2
def test_streaming_chunks_match(pair):
    ours, theirs = pair
    a = list(ours.create_completion("Once upon a time", max_tokens=12, temperature=0, stream=True))
    b = list(theirs.create_completion("Once upon a time", max_tokens=12, temperature=0, stream=True))
    assert shape(a[0]) == shape(b[0])
    assert a[-1]["choices"][0]["finish_reason"] == "length"
    full = ours.create_completion("Once upon a time", max_tokens=12, temperature=0)
    assert "".join(c["choices"][0]["text"] for c in a) == full["choices"][0]["text"]


@pytest.mark.smollm2
def test_chat_completion_shapes(pair):
    ours, theirs = pair
    msgs = [{"role": "user", "content": "Say hello."}]
    a = ours.create_chat_completion(msgs, max_tokens=16, temperature=0)
    b = theirs.create_chat_completion(msgs, max_tokens=16, temperature=0)
    assert shape(without_eagle(a)) == shape(b)
    assert a["choices"][0]["message"]["role"] == "assistant"
    assert a["choices"][0]["message"]["content"]
    sa = list(ours.create_chat_completion(msgs, max_tokens=16, temperature=0, stream=True))
    sb = list(theirs.create_chat_completion(msgs, max_tokens=16, temperature=0, stream=True))
    assert shape(sa[0]) == shape(sb[0]) and sa[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert shape(sa[1]) == shape(sb[1]) and "content" in sa[1]["choices"][0]["delta"]
    assert sa[-1]["choices"][0]["finish_reason"] in ("stop", "length") and sa[-1]["choices"][0]["delta"] == {}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in sa) == a["choices"][0]["message"]["content"]


@pytest.mark.smollm2
def test_tokenize_roundtrip_matches_llama_cpp_python(pair):
    ours, theirs = pair
    text = "Hello, world! ünïcödé 123"
    assert ours.tokenize(text.encode()) == theirs.tokenize(text.encode())
    assert ours.detokenize(ours.tokenize(text.encode(), add_bos=False)) == text.encode()


@pytest.mark.parametrize("threads, cache_prompt", [(1, False), (2, True)])
def test_multi_turn_reuses_kv_cache(synth_q8, threads, cache_prompt):
    """The whole first turn is reused: by default where the build is batch-invariant (one thread, Q8_0), and
    with cache_prompt at any thread count."""
    with Eagle2(synth_q8, n_ctx=1024, n_threads=threads, cache_prompt=cache_prompt) as llm:
        msgs = [{"role": "user", "content": "the cat sat"}]
        first = llm.create_chat_completion(msgs, max_tokens=8, temperature=0)
        msgs += [first["choices"][0]["message"], {"role": "user", "content": "and then"}]
        llm.create_chat_completion(msgs, max_tokens=8, temperature=0)
        stats = llm.stats()
        assert stats["prompt_tokens_reused"] >= first["usage"]["prompt_tokens"]


def test_stop_strings_and_head_errors(synth_q8):
    with Eagle2(synth_q8, draft_model_path=synth_q8, n_ctx=512, total_tokens=10, depth=4, tree_top_k=3) as llm:
        full = llm.create_completion("the cat", max_tokens=24, temperature=0)["choices"][0]["text"]
        stop = full[5:8]
        cut = llm.create_completion("the cat", max_tokens=24, temperature=0, stop=stop)
        assert cut["choices"][0]["text"] == full[: full.index(stop)]
        assert cut["choices"][0]["finish_reason"] == "stop"
    with pytest.raises(Eagle2Error, match="either a head or a draft model"):
        Eagle2(synth_q8, head_path=synth_q8, draft_model_path=synth_q8)


@pytest.mark.smollm2
def test_chat_lossless_through_template_and_kv_reuse(smollm2_path, smollm2_head):
    """Two-turn chats at T=0: speculative answers equal plain answers, with the KV cache reused across turns."""
    turns = ["Name three fruits.", "Which of them is the sweetest? Explain briefly."]
    answers = {}
    for mode in ("plain", "eagle"):
        kw = {"head_path": smollm2_head} if mode == "eagle" else {}
        with Eagle2(smollm2_path, n_ctx=2048, n_threads=1, total_tokens=10, depth=5, tree_top_k=2, **kw) as llm:
            msgs, outs = [], []
            for t in turns:
                msgs.append({"role": "user", "content": t})
                r = llm.create_chat_completion(msgs, max_tokens=96, temperature=0)
                outs.append(r["choices"][0]["message"]["content"])
                msgs.append(r["choices"][0]["message"])
            assert llm.stats()["prompt_tokens_reused"] > 0
            if mode == "eagle":  # drafts accepted (how many depends on the text, which near-ties move)
                assert llm.stats()["tau"] > 1
            answers[mode] = outs
    assert answers["plain"] == answers["eagle"]
