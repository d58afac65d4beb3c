"""Full-size random Qwen3-8B / Qwen3-30B-A3B / Qwen3.6-35B-A3B GGUFs for speed work, written in minutes.

Nothing is quantized: each block's quants are random bytes and its scales are fixed (FP4: two
neighbouring scale codes in a fixed mix, their grids being coarse), chosen so the dequantized weights have mean ~0 and std `1 / sqrt(cols)` (activations stay O(1) through every
layer and the logits spread ~N(0, 1)). Tensors stream to disk one at a time through GGUFWriter, so
memory peaks at a few tensors. Names, keys and per-tensor types follow llama.cpp (see tensor_type).
"""

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFWriter, LlamaFileType, TokenType

from impnb import quant_fp4, synthetic_qwen35
from impnb.synthetic import MINIMAL_VOCAB, NORM_STD, add_hparams, add_tokenizer, minimal_tokenizer_metadata


@dataclass(frozen=True)
class Shape:
    """A model's sizes under transformers' config names (what synthetic.add_hparams reads)."""
    arch: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40960
    # Qwen3.5 hybrids (full_attention_interval > 0): Gated DeltaNet layers, a shared expert
    shared_expert_intermediate_size: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 0
    partial_rotary_factor: float = 1.0
    mrope_section: tuple[int, ...] = ()

    @property
    def rope_parameters(self) -> dict:
        if not self.full_attention_interval:
            return {"rope_type": "default", "rope_theta": self.rope_theta}
        return {"rope_type": "default", "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor, "mrope_section": list(self.mrope_section)}

    @property
    def layer_types(self) -> list[str]:
        n = self.full_attention_interval
        return ["full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(self.num_hidden_layers)]


# The HF configs of Qwen/Qwen3-8B and Qwen/Qwen3-30B-A3B (neither ties its output to token_embd).
SHAPES = {
    "qwen3-8b": Shape("qwen3", 36, 4096, 12288, 32, 8, 128, 151936),
    "qwen3-30b-a3b": Shape("qwen3moe", 48, 2048, 6144, 32, 4, 128, 151936, 128, 8, 768),
    # Qwen/Qwen3.6-35B-A3B's text_config (its one MTP layer, which llama.cpp appends, left out)
    "qwen3.6-35b-a3b": Shape("qwen35moe", 40, 2048, 0, 16, 2, 256, 248320, 256, 8, 512, rope_theta=1e7,
                             max_position_embeddings=262144, shared_expert_intermediate_size=512,
                             linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                             linear_value_head_dim=128, full_attention_interval=4,
                             partial_rotary_factor=0.25, mrope_section=(11, 11, 10)),
}
FILE_TYPES = {"Q8_0": LlamaFileType.MOSTLY_Q8_0, "Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M,
              "MXFP4": LlamaFileType.MOSTLY_MXFP4_MOE, "NVFP4": LlamaFileType.MOSTLY_NVFP4}
FP4 = {"MXFP4": T.MXFP4, "NVFP4": T.NVFP4}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # numpy order: (rows, cols) or (experts, rows, cols)
    ggml_type: T
    std: float              # of the dequantized values (norms: of 1 + noise)


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, layer: int, n_layer: int, qtype: str) -> T:
    """Q8_0: every matrix Q8_0. Q4_K_M (llama_tensor_get_type for these archs): Q4_K, except
    `output` Q6_K and `attn_v` / `ffn_down(_exps)` Q6_K in the use_more_bits layers. MXFP4 /
    NVFP4: every layer matrix in the FP4 type, token_embd and output Q8_0 (as FP4 checkpoints
    keep the embeddings wider)."""
    if qtype == "Q8_0":
        return T.Q8_0
    if qtype in FP4:
        return T.Q8_0 if name in ("token_embd.weight", "output.weight") else FP4[qtype]
    if name == "output.weight":
        return T.Q6_K
    if (".attn_v." in name or ".ffn_down" in name) and use_more_bits(layer, n_layer):
        return T.Q6_K
    return T.Q4_K


# llama.cpp's tensor_type_fallback (src/llama-quant.cpp): a K-quant whose row is no whole number
# of its 256-weight blocks takes this 32-weight type instead (F16 where even that does not fit)
FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}


def fallback_type(ggml_type: T, cols: int) -> T:
    """ggml_type, or llama.cpp's fallback for it where cols are not whole blocks of it."""
    if cols % GGML_QUANT_SIZES[ggml_type][0] == 0:
        return ggml_type
    out = FALLBACK.get(ggml_type)
    if out is None or cols % GGML_QUANT_SIZES[out][0]:
        raise ValueError(f"{cols} columns fit neither {ggml_type.name} nor a fallback synthetic_full draws")
    return out


def tensor_specs(shape: Shape, qtype: str) -> list[TensorSpec]:
    """Every tensor llama.cpp's converter writes for `shape`, in its order, with type and std."""
    h, hd, n = shape.hidden_size, shape.head_dim, shape.num_hidden_layers
    q, kv = shape.num_attention_heads * hd, shape.num_key_value_heads * hd

    def mat(name, dims, layer=0):
        return TensorSpec(name, dims, tensor_type(name, layer, n, qtype), dims[-1] ** -0.5)

    def norm(name, size):
        return TensorSpec(name, (size,), T.F32, NORM_STD)

    out = [mat("token_embd.weight", (shape.vocab_size, h))]
    for i in range(n):
        b = f"blk.{i}."
        if shape.full_attention_interval:
            out += hybrid_layer_specs(shape, i, mat, norm)
            continue
        out += [norm(b + "attn_norm.weight", h), mat(b + "attn_q.weight", (q, h), i),
                mat(b + "attn_k.weight", (kv, h), i), mat(b + "attn_v.weight", (kv, h), i),
                mat(b + "attn_output.weight", (h, q), i), norm(b + "attn_q_norm.weight", hd),
                norm(b + "attn_k_norm.weight", hd), norm(b + "ffn_norm.weight", h)]
        if shape.num_experts:
            e, ff = shape.num_experts, shape.moe_intermediate_size
            out += [TensorSpec(b + "ffn_gate_inp.weight", (e, h), T.F32, h ** -0.5),
                    mat(b + "ffn_gate_exps.weight", (e, ff, h), i),
                    mat(b + "ffn_up_exps.weight", (e, ff, h), i),
                    mat(b + "ffn_down_exps.weight", (e, h, ff), i)]
        else:
            ff = shape.intermediate_size
            out += [mat(b + "ffn_gate.weight", (ff, h), i), mat(b + "ffn_up.weight", (ff, h), i),
                    mat(b + "ffn_down.weight", (h, ff), i)]
    return out + [norm("output_norm.weight", h), mat("output.weight", (shape.vocab_size, h))]


def hybrid_layer_specs(shape: Shape, i: int, mat, norm) -> list[TensorSpec]:
    """A qwen35moe layer's tensors: Gated DeltaNet or gated attention, routed and shared experts."""
    b, h, hd = f"blk.{i}.", shape.hidden_size, shape.head_dim
    hk, hv = shape.linear_num_key_heads, shape.linear_num_value_heads
    conv, v = 2 * hk * shape.linear_key_head_dim + hv * shape.linear_value_head_dim, hv * shape.linear_value_head_dim
    out = [norm(b + "attn_norm.weight", h), norm(b + "post_attention_norm.weight", h)]
    if (i + 1) % shape.full_attention_interval:
        k = shape.linear_conv_kernel_dim
        out += [mat(b + "attn_qkv.weight", (conv, h), i), mat(b + "attn_gate.weight", (v, h), i),
                mat(b + "ssm_beta.weight", (hv, h), i), mat(b + "ssm_alpha.weight", (hv, h), i),
                TensorSpec(b + "ssm_conv1d.weight", (conv, k), T.F32, k ** -0.5),
                TensorSpec(b + "ssm_a", (hv,), T.F32, 1.0), TensorSpec(b + "ssm_dt.bias", (hv,), T.F32, 1.0),
                norm(b + "ssm_norm.weight", shape.linear_value_head_dim), mat(b + "ssm_out.weight", (h, v), i)]
    else:
        q, kv = shape.num_attention_heads * hd, shape.num_key_value_heads * hd
        out += [mat(b + "attn_q.weight", (2 * q, h), i), mat(b + "attn_k.weight", (kv, h), i),
                mat(b + "attn_v.weight", (kv, h), i), mat(b + "attn_output.weight", (h, q), i),
                norm(b + "attn_q_norm.weight", hd), norm(b + "attn_k_norm.weight", hd)]
    e, ff, sh = shape.num_experts, shape.moe_intermediate_size, shape.shared_expert_intermediate_size
    return out + [TensorSpec(b + "ffn_gate_inp.weight", (e, h), T.F32, h ** -0.5),
                  mat(b + "ffn_gate_exps.weight", (e, ff, h), i), mat(b + "ffn_up_exps.weight", (e, ff, h), i),
                  mat(b + "ffn_down_exps.weight", (e, h, ff), i),
                  TensorSpec(b + "ffn_gate_inp_shexp.weight", (1, h), T.F32, h ** -0.5),
                  mat(b + "ffn_gate_shexp.weight", (sh, h), i), mat(b + "ffn_up_shexp.weight", (sh, h), i),
                  mat(b + "ffn_down_shexp.weight", (h, sh), i)]


# ---------------------------------------------------------------- random blocks

# std of a uniformly random quant about the level the fixed scales centre on
Q8_0_STD = np.sqrt((256**2 - 1) / 12)  # int8 byte
NIBBLE_STD = np.sqrt((16**2 - 1) / 12)  # Q4_K's q in 0..15, centred on 7.5
Q5_STD = np.sqrt((32**2 - 1) / 12)      # Q5_0's q in 0..31, centred on 16 (mean -0.5)
Q6_STD = np.sqrt((64**2 - 1) / 12)      # Q6_K's q in 0..63, centred on 32 (mean -0.5)
Q4_K_SCALE = 17  # every sub-block's 6-bit scale and min (>= 16: the packed high bits are used)
Q6_K_SCALE = 5   # every sub-block's int8 scale (small, so d stays a normal fp16)


def _f16_bytes(x: float) -> np.ndarray:
    return np.frombuffer(np.float16(x).tobytes(), np.uint8)


def _q4_k_scale_bytes(sc: int, m: int) -> np.ndarray:
    """The 12 scale bytes of 8 sub-blocks that all have 6-bit scale sc and min m (get_scale_min_k4:
    sub-blocks 4-7 keep their low 4 bits in bytes 8-11, their high 2 bits atop bytes 0-7)."""
    b = np.empty(12, np.uint8)
    b[0:4] = (sc & 63) | ((sc >> 4) << 6)
    b[4:8] = (m & 63) | ((m >> 4) << 6)
    b[8:12] = (sc & 15) | ((m & 15) << 4)
    return b


def _q8_0_fields(blocks: np.ndarray, std: float) -> None:
    """Q8_0 (d f16, qs int8[32]): d * q, q uniform int8."""
    blocks[:, 0:2] = _f16_bytes(std / Q8_0_STD)


def _q5_0_fields(blocks: np.ndarray, std: float) -> None:
    """Q5_0 (d f16, qh u32, qs[16]): d*(q - 16), q uniform 0..31 (low nibble in qs, bit 4 in qh);
    d's sign alternates by block, as ggml's own d takes the sign of the largest weight, so the
    -0.5 mean of q - 16 cancels over each pair of blocks."""
    d = std / Q5_STD
    blocks[0::2, 0:2] = _f16_bytes(d)
    blocks[1::2, 0:2] = _f16_bytes(-d)


def _q5_1_fields(blocks: np.ndarray, std: float) -> None:
    """Q5_1 (d, m f16, qh u32, qs[16]): d*q + m with m = -15.5 d, q uniform 0..31."""
    d = np.float16(std / Q5_STD)
    blocks[:, 0:2] = _f16_bytes(d)
    blocks[:, 2:4] = _f16_bytes(-15.5 * float(d))


def _k_header(blocks: np.ndarray, d: float, centre: float) -> None:
    """Q4_K's and Q5_K's 16 header bytes: d, dmin = centre * d, every sub-block's scale and min S."""
    d = np.float16(d)
    blocks[:, 0:2] = _f16_bytes(d)
    blocks[:, 2:4] = _f16_bytes(centre * float(d))
    blocks[:, 4:16] = _q4_k_scale_bytes(Q4_K_SCALE, Q4_K_SCALE)


def _q4_k_fields(blocks: np.ndarray, std: float) -> None:
    """Q4_K (d, dmin f16, scales[12], qs[128]): d*S*q - dmin*S with dmin = 7.5 d, q uniform 0..15."""
    _k_header(blocks, std / (Q4_K_SCALE * NIBBLE_STD), 7.5)


def _q5_k_fields(blocks: np.ndarray, std: float) -> None:
    """Q5_K (Q4_K's header, qh[32], qs[128]): d*S*q - dmin*S with dmin = 15.5 d, q uniform 0..31."""
    _k_header(blocks, std / (Q4_K_SCALE * Q5_STD), 15.5)


def _q6_k_fields(blocks: np.ndarray, std: float) -> None:
    """Q6_K (ql[128], qh[64], scales int8[16], d f16): d*S*(q - 32), q uniform 0..63."""
    blocks[:, 192:208] = Q6_K_SCALE
    blocks[:, 208:210] = _f16_bytes(std / (Q6_K_SCALE * Q6_STD))


def _fp4_scales(shape: tuple, values: np.ndarray, target: float) -> np.ndarray:
    """Scale indices into `values` (the halved scales, increasing) meeting target in mean square:
    the two values around it, spread over the groups by a golden-ratio sequence so every part of
    the tensor has the mix (a random choice would add its own sampling noise to the std)."""
    hi = int(np.clip(np.searchsorted(values, target), 1, len(values) - 1))
    lo2, hi2 = float(values[hi - 1]) ** 2, float(values[hi]) ** 2
    p_lo = np.clip((hi2 - target ** 2) / (hi2 - lo2), 0.0, 1.0)
    seq = (np.arange(int(np.prod(shape))) * 0.6180339887498949) % 1.0
    return np.where(seq < p_lo, hi - 1, hi).reshape(shape)


# rms of a uniformly random E2M1 code's doubled value (KVALUES), the unit of both FP4 types
FP4_CODE_STD = float(np.sqrt(np.mean(quant_fp4.KVALUES.astype(np.float64) ** 2)))
_E8M0 = np.arange(253)  # the exponents whose ±12 is finite
_UE4M3 = np.r_[np.arange(1, 0x78), 0x7E]  # the scale bytes ggml's encoder writes, increasing


def _mxfp4_fields(blocks: np.ndarray, std: float) -> None:
    """MXFP4 (e E8M0, qs[16]): 2^(e - 128) KVALUES[code], codes uniform; e one of the two
    exponents around std / FP4_CODE_STD, mixed to its mean square."""
    blocks[:, 0] = _E8M0[_fp4_scales(blocks[:, 0].shape, quant_fp4.e8m0_half(_E8M0), std / FP4_CODE_STD)]


def _nvfp4_fields(blocks: np.ndarray, std: float) -> None:
    """NVFP4 (d[4] UE4M3, qs[32]): as MXFP4 per 16 weights, over UE4M3's scales."""
    blocks[:, 0:4] = _UE4M3[_fp4_scales(blocks[:, 0:4].shape, quant_fp4.ue4m3_half(_UE4M3), std / FP4_CODE_STD)]


BLOCK_FIELDS = {T.Q8_0: _q8_0_fields, T.Q5_0: _q5_0_fields, T.Q5_1: _q5_1_fields, T.Q4_K: _q4_k_fields,
                T.Q5_K: _q5_k_fields, T.Q6_K: _q6_k_fields, T.MXFP4: _mxfp4_fields, T.NVFP4: _nvfp4_fields}


def byte_shape(spec: TensorSpec) -> tuple[int, ...]:
    """The tensor's raw shape: (..., cols / block * type_size) uint8, or its float32 shape."""
    if spec.ggml_type == T.F32:
        return spec.shape
    block, size = GGML_QUANT_SIZES[spec.ggml_type]
    if spec.shape[-1] % block:
        raise ValueError(f"{spec.name}: {spec.shape[-1]} columns are not whole {spec.ggml_type.name} blocks")
    return (*spec.shape[:-1], spec.shape[-1] // block * size)


def tensor_data(spec: TensorSpec, seed: int, index: int) -> np.ndarray:
    """The tensor's bytes (quantized) or values (F32; norms 1 + N(0, std)), drawn from SFC64 at
    (seed, index) so each tensor is reproducible on its own."""
    bits = np.random.SFC64(np.random.SeedSequence([seed, index]))
    if spec.ggml_type == T.F32:
        x = np.random.Generator(bits).standard_normal(spec.shape, np.float32) * np.float32(spec.std)
        if spec.name.endswith("ssm_a"):  # -exp(A_log): every state decays
            return -np.exp(x)
        return x + np.float32(1.0) if spec.name.endswith("_norm.weight") else x
    shape = byte_shape(spec)
    n = int(np.prod(shape))
    raw = bits.random_raw(-(-n // 8)).view(np.uint8)[:n]
    BLOCK_FIELDS[spec.ggml_type](raw.reshape(-1, GGML_QUANT_SIZES[spec.ggml_type][1]), spec.std)
    return raw.reshape(shape)


# ---------------------------------------------------------------- the file

def padded_tokenizer(metadata: dict, vocab_size: int) -> dict:
    """`metadata`'s tokenizer grown to vocab_size with UNUSED `[PAD{i}]` tokens, as llama.cpp pads
    Qwen's 151643 tokens to the embedding's 151936."""
    tokens = metadata["tokenizer.ggml.tokens"]
    extra = vocab_size - len(tokens)
    if extra < 0:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, more than the vocab {vocab_size}")
    out = dict(metadata)
    out["tokenizer.ggml.tokens"] = [*tokens, *(f"[PAD{i}]" for i in range(len(tokens), vocab_size))]
    types = metadata.get("tokenizer.ggml.token_type") or [TokenType.NORMAL] * len(tokens)
    out["tokenizer.ggml.token_type"] = [*types, *[TokenType.UNUSED] * extra]
    if "tokenizer.ggml.scores" in metadata:
        out["tokenizer.ggml.scores"] = [*metadata["tokenizer.ggml.scores"], *[0.0] * extra]
    return out


def prefetched(fn, items, depth: int):
    """fn(item) for each item, in order, computed up to `depth` ahead on worker threads."""
    with ThreadPoolExecutor(depth) as pool:
        pending = deque()
        for item in items:
            pending.append(pool.submit(fn, *item))
            if len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def write_full_gguf(path, shape: Shape, qtype: str, tokenizer_metadata: dict | None = None,
                    seed: int = 0, name: str = "impnb synthetic", workers: int = 2) -> list[TensorSpec]:
    """Write `shape` as a random `qtype` GGUF (tokenizer padded to the vocab; default: the minimal
    gpt2 one) and return its tensors."""
    if qtype not in FILE_TYPES:
        raise ValueError(f"qtype {qtype!r} is not one of {list(FILE_TYPES)}")
    if tokenizer_metadata is None:
        tokenizer_metadata = minimal_tokenizer_metadata(min(shape.vocab_size, MINIMAL_VOCAB))
    specs = tensor_specs(shape, qtype)
    writer = GGUFWriter(os.fspath(path), shape.arch)
    hparams = synthetic_qwen35.add_hparams if shape.full_attention_interval else add_hparams
    hparams(writer, shape, shape.arch, FILE_TYPES[qtype], name)
    add_tokenizer(writer, padded_tokenizer(tokenizer_metadata, shape.vocab_size))
    stream_tensors(writer, specs, prefetched(tensor_data, ((s, seed, i) for i, s in enumerate(specs)), workers))
    return specs


def stream_tensors(writer: GGUFWriter, specs: list[TensorSpec], data) -> None:
    """Declare specs' tensors (quantized ones as raw bytes), write the header, then each tensor's
    bytes as `data` yields them in specs' order, one at a time, and close the file."""
    for spec in specs:
        raw_shape = byte_shape(spec)
        quantized = spec.ggml_type != T.F32
        nbytes = int(np.prod(raw_shape)) * (1 if quantized else 4)
        writer.add_tensor_info(spec.name, raw_shape, np.dtype(np.uint8 if quantized else np.float32),
                               nbytes, raw_dtype=spec.ggml_type if quantized else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for block in data:
        writer.write_tensor_data(block)
    writer.close()
