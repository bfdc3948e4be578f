"""The extra CPU weight buffers a model load may use: AMX left out (its kernel crashes on some machines), the
rest kept, and a model still loads and decodes after a type is dropped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from eagle2_local import cpu_buffers


def _run(code: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **env}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_runtime_loads_no_amx_buffers():
    assert "AMX" not in cpu_buffers.extra_buffer_types()


def test_an_unknown_type_changes_nothing():
    before = cpu_buffers.extra_buffer_types()
    assert cpu_buffers.drop_buffer_type("NO_SUCH_BUFFER") is False
    assert cpu_buffers.extra_buffer_types() == before


def test_dropping_a_type_keeps_the_others_and_models_still_decode(smollm2_path):
    """In a child process (the list is the process's): every type is dropped in turn, the rest keep their order,
    and the model then loads into plain CPU buffers and greedy-decodes."""
    got = _run(f"""
import json
from eagle2_local import cpu_buffers, llama
from eagle2_local.api import Eagle2
llama.ensure_backend()
kept = cpu_buffers.extra_buffer_types()
steps = []
for name in list(kept):
    before = cpu_buffers.extra_buffer_types()
    steps.append([cpu_buffers.drop_buffer_type(name), before, cpu_buffers.extra_buffer_types()])
llm = Eagle2({str(smollm2_path)!r}, plain=True, n_threads=1)
text = llm.create_completion("The capital of France is", max_tokens=4, temperature=0)["choices"][0]["text"]
print(json.dumps({{"kept": kept, "steps": steps, "text": text, "left": cpu_buffers.extra_buffer_types()}}))
""")
    for dropped, before, after in got["steps"]:
        assert dropped is True
        assert after == before[1:]
    assert got["left"] == []
    assert got["text"].strip()


def test_amx_kept_on_request():
    """``EAGLE2_LOCAL_AMX=1`` leaves llama.cpp's list as the build made it (no model is loaded here: on the
    machines it crashes on, it would)."""
    got = _run("""
import json
from eagle2_local import cpu_buffers, llama
raw = cpu_buffers.extra_buffer_types()
llama.ensure_backend()
print(json.dumps([raw, cpu_buffers.extra_buffer_types()]))
""", EAGLE2_LOCAL_AMX="1")
    assert got[0] == got[1]


def test_a_build_without_the_device_api_loads_as_before(monkeypatch):
    """A llama.cpp whose library lacks ggml's device functions: nothing is left out, nothing raises."""
    def missing(name):
        raise AttributeError(f"undefined symbol: {name}")

    monkeypatch.delenv(cpu_buffers.AMX_ENV, raising=False)
    monkeypatch.setattr(cpu_buffers, "_ggml", missing)
    cpu_buffers.keep_amx_out()
