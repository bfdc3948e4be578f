"""Models and heads by Hugging Face repository name, against a local stand-in for the Hub (real HTTP, the real
``huggingface_hub`` client, ``HF_ENDPOINT`` and a private ``HF_HOME``): downloads, the head converted once,
offline runs without a request, resumed transfers, and one-line refusals that leave the cache usable."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from benchmarks.head_checkpoints import random_eagle3
from eagle2_local.hub.files import HubError, HubRef, choose_gguf
from tests.support.hub_standin import HubStandIn
from tests.support.synthetic_model import write_model

LAYERS = [0, 2, 3]
HEAD_SHAPE = dict(hidden=64, n_head=4, n_head_kv=2, ffn=128, draft_vocab=300, layers=LAYERS, scale=0.15,
                  norm_before_fc=True)
ARGS = ["--temperature", "0", "-n", "24", "--threads", "1", "--total-tokens", "8", "--depth", "3", "--json",
        "-p", "the cat sat on the mat and the dog"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 4-layer target in two quants, its EAGLE-3 head folder, and a head made for a wider model."""
    d = tmp_path_factory.mktemp("hub-files")
    q8 = write_model(d / "m-Q8_0.gguf", seed=3, n_layer=4, qtype="q8_0")
    other = write_model(d / "m-Q4_1.gguf", seed=4, n_layer=4, qtype="q8_0")
    head, _, _ = random_eagle3(d / "head", target_hidden=64, vocab=604, **HEAD_SHAPE)
    wide, _, _ = random_eagle3(d / "wide-head", target_hidden=96, vocab=604, **HEAD_SHAPE)
    return {"q8": q8, "q4_1": other, "head": head, "wide": wide, "dir": d}


@pytest.fixture
def hub(files):
    with HubStandIn() as standin:
        standin.add("org/M-GGUF", {"m-Q4_1.gguf": files["q4_1"], "m-Q8_0.gguf": files["q8"],
                                   "README.md": b"# M\n"})
        standin.add("org/M-EAGLE3", {**{name: files["head"] / name for name in ("config.json", "model.safetensors")},
                                     "pytorch_model.bin": b"the same weights again, never fetched",
                                     "README.md": b"# an EAGLE-3 head\n"})
        standin.add("org/WIDE-EAGLE3", {name: files["wide"] / name for name in ("config.json", "model.safetensors")})
        yield standin


@pytest.fixture
def env(hub, tmp_path):
    """The environment of a user whose Hub is the stand-in: a fresh HF_HOME and eagle2-local cache."""
    return {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "EAGLE2_LOCAL_CACHE": str(tmp_path / "cache"), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=300, env=env)


def assert_one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    """A refusal: a non-zero exit, no traceback, one error line (after at most a progress line) holding needle."""
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and proc.stderr.strip().endswith(errors[0]) and needle in errors[0], proc.stderr


def answer_of(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def answer(proc: subprocess.CompletedProcess, engine: str = "eagle3:") -> dict:
    """A generate --json answer drafted by ``engine`` (a head unless told)."""
    out = answer_of(proc)
    assert out["stats"]["engine"].startswith(engine), out["stats"]["engine"]
    return {"text": out["text"], "tokens": out["tokens"]}


def test_generate_by_name_answers_as_paths_and_runs_offline(hub, env, files, tmp_path):
    by_name = cli(env, "generate", "--hf-repo", "org/M-GGUF", "--hf-file", "*Q4_1.gguf", "--head-hf",
                  "org/M-EAGLE3", *ARGS)
    got = answer(by_name)
    assert "converting the head org/M-EAGLE3" in by_name.stderr
    fetched = [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]
    assert not [r for r in fetched if r.endswith(("m-Q8_0.gguf", ".bin", "README.md"))], fetched  # only what runs
    head = tmp_path / "head.gguf"
    converted = cli(env, "convert", str(files["head"]), "-o", str(head), "--target", str(files["q4_1"]))
    assert converted.returncode == 0, converted.stderr
    by_path = answer(cli(env, "generate", "--model", str(files["q4_1"]), "--head", str(head), *ARGS))
    assert got == by_path
    seen = hub.network_requests()
    offline = cli({**env, "HF_HUB_OFFLINE": "1"}, "generate", "--hf-repo", "org/M-GGUF", "--hf-file",
                  "*Q4_1.gguf", "--head-hf", "org/M-EAGLE3", *ARGS)
    assert answer(offline) == got
    assert "converting" not in offline.stderr  # the converted head was reused
    assert hub.network_requests() == seen, hub.requests[seen:]
    # offline, what the cache lacks is one line naming the download
    missing = cli({**env, "HF_HUB_OFFLINE": "1"}, "generate", "--hf-repo", "org/OTHER-GGUF", *ARGS)
    assert_one_line_error(missing, "hf download org/OTHER-GGUF --include")
    assert hub.network_requests() == seen


def test_bad_names_and_downloads_are_one_line_and_leave_the_cache_usable(hub, env, files):
    assert_one_line_error(cli(env, "generate", "--hf-repo", "org/NOPE-GGUF", *ARGS), "no such model repository")
    assert_one_line_error(cli(env, "generate", "--hf-repo", "org/M-GGUF", "--hf-file", "*.gguf", *ARGS),
                          "several files match")
    assert_one_line_error(cli(env, "generate", "--hf-repo", "org/M-GGUF:Q2_K", *ARGS), "m-Q4_1.gguf, m-Q8_0.gguf")
    hub.bad_sha.add("m-Q8_0.gguf")
    assert_one_line_error(cli(env, "generate", "--hf-repo", "org/M-GGUF:Q8_0", *ARGS), "checksum mismatch")
    blobs = list((env_path(env) / "hub" / "models--org--M-GGUF" / "blobs").iterdir())
    assert [b for b in blobs if b.stat().st_size > 0 and not b.name.endswith(".incomplete")] == []  # nothing bad kept
    hub.bad_sha.clear()
    assert_one_line_error(cli(env, "generate", "--hf-repo", "org/M-GGUF:Q8_0", "--head-hf", "org/WIDE-EAGLE3",
                              *ARGS), "hidden size 96")
    answer(cli(env, "generate", "--hf-repo", "org/M-GGUF:Q8_0", "--head-hf", "org/M-EAGLE3", *ARGS))


def env_path(env: dict):
    from pathlib import Path
    return Path(env["HF_HOME"])


def test_a_draft_model_by_name_and_the_options_on_every_command(hub, env):
    out = answer_of(cli(env, "generate", "--hf-repo", "org/M-GGUF:Q8_0", "--draft-model-hf", "org/M-GGUF:Q4_1",
                        *ARGS))
    assert out["stats"]["engine"].startswith("draft-model:m-Q4_1.gguf"), out["stats"]["engine"]
    for command in ("chat", "generate", "serve", "bench"):
        usage = cli(env, command, "--help").stdout
        assert all(option in usage for option in ("--hf-repo", "--hf-file", "--head-hf", "--draft-model-hf"))


def test_without_huggingface_hub_paths_work_and_names_say_what_to_install(env, files, tmp_path):
    """The optional extra missing (an import of huggingface_hub fails): models by path run as before, a name is one
    line naming the extra."""
    blocked = tmp_path / "blocked" / "huggingface_hub"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('huggingface_hub is not installed')\n")
    env = {**env, "PYTHONPATH": os.pathsep.join([str(blocked.parent), env.get("PYTHONPATH", "")])}
    answer(cli(env, "generate", "--model", str(files["q8"]), "--draft", "lookup", *ARGS), engine="lookup")
    assert_one_line_error(cli(env, "generate", "--hf-repo", "org/M-GGUF", *ARGS), "pip install 'eagle2-local[hub]'")


def test_serve_by_name_answers_the_official_client(hub, env, tmp_path):
    """``serve --hf-repo --head-hf``: the files come down before the port opens; the openai client's answer is
    ``generate --chat``'s for the same names."""
    import httpx
    import openai

    runtime = ["--hf-repo", "org/M-GGUF:Q8_0", "--head-hf", "org/M-EAGLE3", "--threads", "1", "--total-tokens", "8",
               "--depth", "3"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--port", str(port), *runtime], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
        served = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "the cat sat"}],
                                                max_tokens=24, temperature=0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    assert served.model == "m-Q8_0"  # the downloaded file's name, as for a path
    generated = answer(cli(env, "generate", *runtime, "-n", "24", "--temperature", "0", "--chat", "--json", "-p",
                           "the cat sat"))
    assert served.choices[0].message.content == generated["text"]


FROM_PRETRAINED = """
import json, sys
from eagle2_local import Eagle2
kw = json.loads(sys.argv[1])
with Eagle2.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "*Q4_1.gguf",
                            head_repo_id="org/SmolLM2-135M-Instruct-EAGLE3-GGUF", **kw) as llm:
    out = llm.create_completion(PROMPT, max_tokens=24, temperature=0)
print(json.dumps({"text": out["choices"][0]["text"], "usage": out["usage"], "engine": llm.engine_name}))
"""


@pytest.mark.smollm2
def test_from_pretrained_resumes_and_answers_as_the_same_files_by_path(smollm2_path, smollm2_head, tmp_path):
    """The default model and its shipped head (an eagle3 GGUF repository) by name, in a process whose HF_ENDPOINT
    is the stand-in: the model's first transfer is cut past huggingface_hub's 10 MiB read size, so the download
    resumes with a Range request; the answer is Eagle2(path)'s."""
    from eagle2_local import Eagle2

    kw = dict(n_threads=1, total_tokens=8, depth=3, n_ctx=512)
    prompt = "The capital of France is"
    with HubStandIn() as hub:
        hub.add("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", {smollm2_path.name: smollm2_path})
        hub.add("org/SmolLM2-135M-Instruct-EAGLE3-GGUF", {smollm2_head.name: smollm2_head})
        hub.cut_once.add(smollm2_path.name)
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"),
               "HF_HUB_DISABLE_TELEMETRY": "1", "EAGLE2_LOCAL_CACHE": str(tmp_path / "cache")}
        proc = subprocess.run([sys.executable, "-c", FROM_PRETRAINED.replace("PROMPT", repr(prompt)),
                               json.dumps(kw)], capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
        assert [r for r in hub.ranges if r.startswith(smollm2_path.name)], hub.requests
    named = json.loads(proc.stdout.strip().splitlines()[-1])
    assert named["engine"].startswith("eagle3:")
    with Eagle2(smollm2_path, head_path=smollm2_head, **kw) as llm:
        by_path = llm.create_completion(prompt, max_tokens=24, temperature=0)
    assert named["text"] == by_path["choices"][0]["text"] and named["text"].strip()
    assert named["usage"] == by_path["usage"]


@pytest.mark.parametrize("names, ref, expected", [
    (["a-Q8_0.gguf", "a-Q4_K_M.gguf", "a-Q4_0.gguf"], HubRef("o/r"), "a-Q4_K_M.gguf"),  # llama.cpp's default
    (["a-Q8_0.gguf", "a-Q4_0.gguf", "mmproj-a-f16.gguf"], HubRef("o/r"), "a-Q4_0.gguf"),
    (["mmproj-a-f16.gguf", "b.F16.gguf", "a.F16.gguf"], HubRef("o/r"), "a.F16.gguf"),  # else the first GGUF
    (["a-q8_0.gguf", "a-Q4_0.gguf"], HubRef("o/r", quant="Q8_0"), "a-q8_0.gguf"),  # any case
    (["x/a-Q4_K_M-00002-of-00002.gguf", "x/a-Q4_K_M-00001-of-00002.gguf"], HubRef("o/r", quant="Q4_K_M"),
     "x/a-Q4_K_M-00001-of-00002.gguf"),  # a split model: its first shard
])
def test_which_file_a_name_means(names, ref, expected):
    assert choose_gguf("o/r", names, ref) == expected


def test_names_that_mean_no_file_or_several():
    with pytest.raises(HubError, match="several files match.*it holds a-Q4_0.gguf, b-Q4_0.gguf"):
        choose_gguf("o/r", ["a-Q4_0.gguf", "b-Q4_0.gguf"], HubRef("o/r", quant="Q4_0"))
    with pytest.raises(HubError, match="nothing matches"):
        choose_gguf("o/r", ["config.json"], HubRef("o/r"))
    for bad in ("noslash", "a/b/c", "/b"):
        with pytest.raises(HubError, match="ORG/NAME"):
            HubRef.parse(bad)
    assert HubRef.parse("o/r:Q4_K_M") == HubRef("o/r", quant="Q4_K_M")


def test_network_errors_are_told_from_other_errors():
    """An unreachable Hub sends a name to the cache (as llama.cpp's -hf does); any other error is not hidden."""
    import importlib.util

    from eagle2_local.hub.files import network_error

    # the HTTP library of huggingface_hub 2.x (httpx2), else 1.x's (httpx, a test dependency anyway)
    http = importlib.import_module("httpx2" if importlib.util.find_spec("httpx2") else "httpx")
    assert network_error(http.ConnectError("refused")) and network_error(http.ReadTimeout("slow"))
    assert network_error(ConnectionResetError()) and not network_error(ValueError("a bug"))
