"""The fast single-tensor GGUF reader agrees with gguf-py's full reader and refuses truncated files."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from eagle2_local.errors import ModelError
from eagle2_local.formats.gguf_tensors import load_tensor, tensor_index


@pytest.mark.parametrize("fixture", ["synth_q8", "synth_f32"])
def test_same_tensors_as_gguf_reader(request, fixture):
    path = request.getfixturevalue(fixture)
    index = tensor_index(path)
    reader = GGUFReader(path, "r")
    assert sorted(index) == sorted(t.name for t in reader.tensors)
    for t in reader.tensors:
        want = dequantize(np.array(t.data), t.tensor_type).reshape(tuple(int(d) for d in reversed(t.shape)))
        got = load_tensor(path, index[t.name])
        assert got.dtype == np.float32 and np.array_equal(got, want), t.name


def test_truncated_file(tmp_path, synth_q8):
    cut = tmp_path / "cut.gguf"
    data = synth_q8.read_bytes()
    cut.write_bytes(data[:-100])
    with pytest.raises(ModelError, match="is truncated: tensor"):
        tensor_index(cut)
    cut.write_bytes(data[:2000])
    with pytest.raises(ModelError, match="truncated or corrupt"):
        tensor_index(cut)
