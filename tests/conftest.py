"""Shared fixtures: synthetic GGUF models written on the fly, and the real SmolLM2 model when installed.

SmolLM2 tests are marked ``smollm2``. Outside CI they are skipped when the model wheel is missing; in CI
(``CI=true``) a missing model is an error, so they can never be skipped silently there.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from eagle2_local.formats.layer_draft import write_truncated
from eagle2_local.llamacpp.llama import LlamaModel
from tests.support.cpu_share import auto_workers, cpu_share, pin_worker, workers
from tests.support.synthetic_model import write_model


def pytest_configure(config) -> None:
    """Each pytest-xdist worker runs on its own share of the cores, before any model loads."""
    pin_worker()
    offload_from_env()


def offload_from_env() -> None:
    """``EAGLE2_LOCAL_TEST_GPU_LAYERS=N``: every model a test loads without naming ``n_gpu_layers`` offloads N
    layers, so the lossless tests run on a CUDA/Metal build's device (benchmarks/gpu_check.sh sets it)."""
    layers = os.environ.get("EAGLE2_LOCAL_TEST_GPU_LAYERS")
    if not layers:
        return
    load = LlamaModel.__init__

    @functools.wraps(load)
    def offloaded(self, path, n_gpu_layers=None, *args, **kwargs) -> None:
        load(self, path, int(layers) if n_gpu_layers is None else n_gpu_layers, *args, **kwargs)

    LlamaModel.__init__ = offloaded


def pytest_xdist_auto_num_workers(config) -> int:
    return auto_workers()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """``all_cores`` tests first (the rest keep their order): pytest-xdist hands tests out in this order, so they
    run one after another at the start, instead of each later one idling a worker until the test that other
    worker is running ends."""
    items.sort(key=lambda item: item.get_closest_marker("all_cores") is None)


@pytest.fixture(autouse=True)
def cores(request):
    """A test marked ``all_cores`` (2+ threads) runs alone with every core; the others share them (cpu_share)."""
    with cpu_share(request.node.get_closest_marker("all_cores") is not None):
        yield


@pytest.fixture(autouse=True, scope="session")
def private_cost_cache(tmp_path_factory):
    """Tree-budget calibrations go to a per-run folder, never the user's ~/.cache (subprocesses inherit it). The
    xdist workers of one run share it (their common base folder), so a calibration is measured once a run."""
    old = os.environ.get("EAGLE2_LOCAL_CACHE")
    if workers() is not None:
        folder = tmp_path_factory.getbasetemp().parent / "cost-cache"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("cost-cache")
    os.environ["EAGLE2_LOCAL_CACHE"] = str(folder)
    yield
    if old is None:
        os.environ.pop("EAGLE2_LOCAL_CACHE", None)
    else:
        os.environ["EAGLE2_LOCAL_CACHE"] = old


@pytest.fixture(autouse=True, scope="session")
def llama_backend():
    """llama.cpp set up as the runtime sets it up, before any test loads a model: the reference runs through
    llama-cpp-python's own ``Llama`` then load into the same weight buffers as ours (no AMX, see cpu_buffers)."""
    from eagle2_local.llamacpp.runtime import ensure_backend
    ensure_backend()


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def synth_f32(synth_dir) -> Path:
    """F32 synthetic target: NOT batch-invariant on CPU (matmul kernels differ by batch size)."""
    return write_model(synth_dir / "synth-f32.gguf", seed=0)


@pytest.fixture(scope="session")
def synth_q8(synth_dir) -> Path:
    """Q8_0 synthetic target: batch-invariant on this CPU build, so outputs must be bit-identical."""
    return write_model(synth_dir / "synth-q8.gguf", seed=0, qtype="q8_0")


@pytest.fixture(scope="session")
def synth_q8_weak(synth_dir) -> Path:
    """A different (weaker, unrelated) model with the same vocabulary, as a draft."""
    return write_model(synth_dir / "synth-q8-weak.gguf", seed=7, n_layer=1, qtype="q8_0")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from eagle2_local.errors import ModelError
    from eagle2_local.formats.models import default_model_path
    try:
        return default_model_path()
    except ModelError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"SmolLM2 must be installed in CI: {exc}")
        pytest.skip(f"SmolLM2 not installed: {exc}")


@pytest.fixture(scope="session")
def smollm2_head(smollm2_path) -> Path:
    """The EAGLE-3 head shipped for SmolLM2: the cheapest real draft (a level costs a fraction of a target token,
    where the target drafting for itself costs a full pass per level), accepted often enough for multi-token paths."""
    from eagle2_local.formats.models import default_head_path
    head = default_head_path()
    assert head is not None, "the default head must ship with the package"
    return head


@pytest.fixture(scope="session")
def smollm2_weak(smollm2_path, synth_dir) -> Path:
    """SmolLM2 cut to its first 24 of 30 layers: a real, weaker same-vocabulary draft (tau about 1.5-2.5)."""
    return write_truncated(smollm2_path, synth_dir / "smollm2-24layers.gguf", n_layers=24)

