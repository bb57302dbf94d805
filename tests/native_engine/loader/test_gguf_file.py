"""The fast GGUF reader gives what gguf-py's GGUFReader gives: every metadata value and every
tensor's name, type, shape and bytes (f32, f16 and quantized files), and the same loaded weights."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from native_engine.loader import Q4Blocks, load_gguf
from gguf_io.gguf_file import GGUFFile


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
def test_same_fields_and_tensors_as_gguf_py(build, dtype):
    path = build("tiny-llama", dtype=dtype)
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    expected = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert {k: f.contents() for k, f in ours.fields.items()} == expected
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.name, a.tensor_type, list(a.shape)) == (b.name, b.tensor_type, list(b.shape))
        assert a.data.shape == b.data.shape and np.array_equal(a.data, b.data)


def test_bad_magic_is_a_clear_error(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(path)


def test_kept_blocks_dequantize_to_the_loaded_weights(build):
    from gguf import GGMLQuantizationType as QType
    from gguf.quants import quantize

    path = build("tiny-llama")
    _, dense = load_gguf(path)
    # Rewrite every 2-D weight as Q4_1 through gguf-py, then compare both loading modes.
    reader = gguf.GGUFReader(path)
    q4_path = path.with_name("tiny-llama-q4_1.gguf")
    writer = gguf.GGUFWriter(q4_path, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, kind, field.types[-1])
        else:
            writer.add_key_value(key, value, kind)
    for t in reader.tensors:
        data = np.array(t.data)
        if data.ndim == 2 and data.shape[1] % 32 == 0:
            writer.add_tensor(t.name, quantize(data, QType.Q4_1), raw_shape=quantize(data, QType.Q4_1).shape,
                              raw_dtype=QType.Q4_1)
        else:
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _, plain = load_gguf(q4_path)
    _, kept = load_gguf(q4_path, torch.float32, keep_q4_1=True)
    plain, kept = dict(plain), dict(kept)
    assert any(isinstance(v, Q4Blocks) for v in kept.values())
    for name, tensor in plain.items():
        got = kept[name].dequantize() if isinstance(kept[name], Q4Blocks) else kept[name]
        torch.testing.assert_close(got, tensor, rtol=0, atol=0)
    assert set(plain) == set(dict(dense))
