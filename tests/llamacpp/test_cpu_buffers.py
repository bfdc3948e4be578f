"""The extra CPU weight buffers a model load may use: AMX left out (its kernel crashes on some machines), the
rest kept in order, and a model still loads and decodes after a type is dropped."""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import subprocess
import sys

import pytest

from eagle2_local.llamacpp import cpu_buffers

FAKE = {11: "AMX", 22: "CPU_REPACK", 33: "KLEIDIAI"}  # buffer-type "addresses" -> names


def extra_buffer_types() -> list[str]:
    """Names of the extra CPU buffer types a model load may use now, in the loader's order."""
    arr = cpu_buffers._extra_list()
    return [cpu_buffers._name(b) for b in cpu_buffers._entries(arr)] if arr else []


@pytest.fixture
def fake_list(monkeypatch):
    """llama.cpp's NULL-terminated array, faked: three types, a NULL, and a slot past it that must stay."""
    arr = (ctypes.c_void_p * 5)(11, 22, 33, None, 99)
    monkeypatch.setattr(cpu_buffers, "_extra_list", lambda: arr)
    monkeypatch.setattr(cpu_buffers, "_name", lambda b: FAKE[b])
    return arr


def test_dropping_shifts_the_rest_up_in_order(fake_list):
    assert cpu_buffers.drop_buffer_type("CPU_REPACK") is True
    assert list(fake_list) == [11, 33, None, None, 99]
    assert extra_buffer_types() == ["AMX", "KLEIDIAI"]
    assert cpu_buffers.drop_buffer_type("AMX") is True
    assert list(fake_list) == [33, None, None, None, 99]


def test_an_unknown_name_writes_nothing(fake_list):
    assert cpu_buffers.drop_buffer_type("NO_SUCH_BUFFER") is False
    assert list(fake_list) == [11, 22, 33, None, 99]


def test_amx_left_out_unless_asked_to_keep_it(fake_list, monkeypatch):
    monkeypatch.setenv(cpu_buffers.AMX_ENV, "1")
    cpu_buffers.keep_amx_out()
    assert extra_buffer_types() == ["AMX", "CPU_REPACK", "KLEIDIAI"]
    monkeypatch.delenv(cpu_buffers.AMX_ENV)
    cpu_buffers.keep_amx_out()
    assert extra_buffer_types() == ["CPU_REPACK", "KLEIDIAI"]


def test_a_build_without_the_device_api_loads_as_before(monkeypatch):
    """A llama.cpp whose libraries lack ggml's device functions: nothing is left out, nothing raises."""
    def missing():
        raise AttributeError("undefined symbol: ggml_backend_dev_backend_reg")

    monkeypatch.delenv(cpu_buffers.AMX_ENV, raising=False)
    monkeypatch.setattr(cpu_buffers, "_extra_list", missing)
    cpu_buffers.keep_amx_out()


def test_the_runtime_loads_no_amx_buffers():
    """This build's real list, after the test session set llama.cpp up (conftest) as the runtime does."""
    if os.environ.get(cpu_buffers.AMX_ENV) == "1":
        pytest.skip(f"{cpu_buffers.AMX_ENV}=1 keeps AMX on purpose")
    assert "AMX" not in extra_buffer_types()


@pytest.mark.smollm2
def test_every_real_type_dropped_and_the_model_still_decodes(smollm2_path):
    """In a child process (the list is the process's): this build's real types dropped one by one, each time
    the rest kept in order, then the model loads into plain CPU buffers and answers as with them (greedy)."""
    code = f"""
import json
from eagle2_local.llamacpp import cpu_buffers, runtime
from eagle2_local.api import Eagle2
{inspect.getsource(extra_buffer_types)}
def answer():
    with Eagle2({str(smollm2_path)!r}, plain=True, n_threads=1) as llm:
        return llm.create_completion("The capital of France is", max_tokens=6, temperature=0)["choices"][0]["text"]
runtime.ensure_backend()
with_them, steps = answer(), []
for name in extra_buffer_types():
    before = extra_buffer_types()
    steps.append([cpu_buffers.drop_buffer_type(name), before, extra_buffer_types()])
print(json.dumps({{"steps": steps, "with": with_them, "without": answer(),
                  "left": extra_buffer_types()}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for dropped, before, after in got["steps"]:
        assert dropped is True and after == before[1:]
    assert got["left"] == []
    assert got["without"].strip() and got["without"] == got["with"]
