"""EAGLE-1/2 heads in generation: refused when they do not fit the target, lossless when they do."""

from __future__ import annotations

import json

import gguf
import pytest
from click.testing import CliRunner

from eagle2_local import Eagle2
from eagle2_local.errors import Eagle2Error, IncompatibleDraftError, ModelError
from tests.support.eagle_heads import chat_turn_outputs
from tests.support.helpers import assert_one_line_error, run_cli, synthetic_head
from tests.support.prompts import load_prompts
from tests.support.synthetic_model import vocab

SYNTH_VOCAB = len(vocab()[0])


def greedy_texts(llm: Eagle2, prompts: list[str], max_tokens: int) -> list[str]:
    return [llm.create_completion(p, max_tokens=max_tokens, temperature=0)["choices"][0]["text"] for p in prompts]


def greedy_chats(llm: Eagle2, prompts: list[str], max_tokens: int) -> list[str]:
    return [llm.create_chat_completion([{"role": "user", "content": p}], max_tokens=max_tokens,
                                       temperature=0)["choices"][0]["message"]["content"] for p in prompts]


def test_mismatched_heads_are_refused_before_generation(tmp_path, synth_q8):
    wrong_hidden = synthetic_head(tmp_path, "h32", hidden=32, vocab=SYNTH_VOCAB)
    with pytest.raises(IncompatibleDraftError, match="hidden size is 32 but synth-q8.gguf has 64"):
        Eagle2(synth_q8, head_path=wrong_hidden)
    wrong_vocab = synthetic_head(tmp_path, "v", hidden=64, vocab=SYNTH_VOCAB + 1)
    with pytest.raises(IncompatibleDraftError, match=f"{SYNTH_VOCAB + 1} tokens but synth-q8.gguf has {SYNTH_VOCAB}"):
        Eagle2(synth_q8, head_path=wrong_vocab)
    with pytest.raises(ModelError, match="architecture 'llama' is not a draft head"):
        Eagle2(synth_q8, head_path=synth_q8)
    e3 = tmp_path / "e3.gguf"
    w = gguf.GGUFWriter(str(e3), "eagle3")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="not a complete eagle3 head: missing eagle3.target_layers"):
        Eagle2(synth_q8, head_path=e3)


@pytest.mark.parametrize("variant", ["vicuna", "llama3", "qwen2"])
def test_lossless_greedy_synthetic_target(tmp_path, synth_q8, variant):
    head = synthetic_head(tmp_path, variant, variant=variant, hidden=64, vocab=SYNTH_VOCAB)
    prompts = ["the cat sat on", "def code(x): return", "people who find water"]
    with Eagle2(synth_q8, n_ctx=512, n_threads=1) as plain:
        want = greedy_texts(plain, prompts, 40)
    with Eagle2(synth_q8, head_path=head, n_ctx=512, n_threads=1, total_tokens=24, depth=5, tree_top_k=6) as llm:
        assert llm.engine_name.startswith("eagle1-numpy:")
        assert llm.target.ctx.embeddings
        got = greedy_texts(llm, prompts, 40)
        assert llm.stats()["target_passes"] > 0
        sampled = llm.create_completion(prompts[0], max_tokens=20, temperature=0.9, seed=1)  # sampling path runs
        assert sampled["usage"]["completion_tokens"] > 0
    assert got == want


@pytest.mark.smollm2
def test_generate_head_on_smollm2_is_lossless(tmp_path, smollm2_path):
    """A random head with SmolLM2's shape (H 576, 9/3 heads, vocab 49152), converted and run through --head."""
    head = synthetic_head(tmp_path, "smol", variant="vicuna", hidden=576, vocab=49152, n_head=9, ff=1536)
    prompts = load_prompts(3)
    kw = dict(n_ctx=1024, n_threads=1, total_tokens=8, depth=3, tree_top_k=3)
    with Eagle2(smollm2_path, **kw) as plain:
        want = greedy_chats(plain, prompts, 16)
    with Eagle2(smollm2_path, head_path=head, **kw) as llm:
        got = greedy_chats(llm, prompts, 16)
        assert llm.stats()["n_tokens"] == 16
    assert got == want
    from cli import main
    res = CliRunner().invoke(main, ["generate", "--head", head, "-p", prompts[0], "-n", "8", "--temperature", "0",
                                    "--threads", "1", "--n-ctx", "1024", "--total-tokens", "8", "--depth", "3",
                                    "--tree-top-k", "3", "--chat", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["stats"]["engine"].startswith("eagle1-numpy:")
    assert len(out["tokens"]) == 8 and want[0].startswith(out["text"])


def test_cli_refuses_mismatched_head_in_one_line(tmp_path, synth_q8):

    head = synthetic_head(tmp_path, "h32", hidden=32, vocab=SYNTH_VOCAB)
    proc = run_cli("generate", "--model", str(synth_q8), "--head", head, "-p", "the cat", "-n", "4")
    assert_one_line_error(proc, "hidden size is 32")
    assert proc.stdout == ""


def test_kv_reuse_across_plain_and_speculative_calls_keeps_head_features(tmp_path, synth_q8):
    """Calls that reuse the previous text (chat turns), alternating plain and speculative: output stays lossless
    and the head holds (or will be handed) the target's features of every committed position, none lost."""
    import numpy as np

    from eagle2_local.decoding.target import Target
    from eagle2_local.drafts import MergedDraft
    from eagle2_local.llamacpp.llama import LlamaModel
    from eagle2_local.llamacpp.settings import ContextSettings

    head = synthetic_head(tmp_path, "h", hidden=64, vocab=SYNTH_VOCAB)
    seen = {}

    def inspect(llm):
        gen = llm.generator
        seen["text"] = gen.tokens
        # what the head holds, then what the generator keeps for it (the last round's rows)
        rows, start = gen.backlog.take()
        head_engine = gen.engine.neural if isinstance(gen.engine, MergedDraft) else gen.engine  # lookup merged
        seen["held"] = np.concatenate([head_engine._feats.view()[:start], rows])

    outputs = chat_turn_outputs(synth_q8, head, inspect, total_tokens=12, depth=4, tree_top_k=3)
    text, held = seen["text"], seen["held"]
    assert outputs["eagle"] == outputs["plain"]
    model = LlamaModel(synth_q8)
    target = Target(model, ContextSettings(n_ctx=512, n_batch=32, n_seq_max=4, n_threads=1, embeddings=True))
    fresh = target.prefill(text).features
    target.close()
    model.close()
    assert len(held) == len(text)
    np.testing.assert_allclose(held, fresh, rtol=0, atol=1e-4)
