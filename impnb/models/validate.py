"""One check of a whole model before any weight is read: metadata, tokenizer keys, tensors, memory.

`validate_model` reads the config (every key type- and range-checked in config.py), then checks
that every tensor the architecture uses is present with the shape the config implies and a type
the device reads, that no tensor belongs to a layer past `block_count`, that the tokenizer's
keys have the right types and its special ids lie inside the vocabulary, and that what the load
will allocate fits in the host's memory; before a load, that no float weight and no block scale
holds a NaN or inf. Errors name the key or tensor and what was expected.
Shapes are printed in GGUF order (the row length first), as gguf-dump shows them.
"""

import math
import os
import re
from dataclasses import dataclass

import numpy as np

from impnb.errors import DeviceError, GGUFError, UnsupportedError
from impnb.gguf_file import ModelFile
from impnb.models.config import ModelConfig
from impnb.models.registry import ARCHITECTURES, model_config
from impnb.quants import FORMATS, TypeId as T

NORM_TYPES = (T.F32, T.F16, T.BF16)  # one-dimensional weights: llama.cpp writes them F32
SPECIAL_IDS = ("bos", "eos", "eot", "eom", "unknown", "padding", "sep")
TOKENIZER_FLAGS = ("add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix")
IGNORED_TENSORS = frozenset({"rope_freqs.weight"})  # present in some llama files, not read
_LAYER = re.compile(r"blk\.(\d+)\.")
# Byte offsets of the fp16 scales in a block of each quantized type (gguf's block layouts): a NaN
# or inf there decodes the whole block to NaN on the CPU, and the GPU's int8 activations would
# turn such values into finite nonsense, so they are refused before a load.
F16_SCALES = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
              T.IQ4_NL: (0,), T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2),
              T.Q6_K: (208,)}
# Bits that are all ones in a non-finite value, by how a float is stored: (word dtype, mask).
FLOAT_WORDS = {T.F32: ("<u4", 0x7F800000), T.F16: ("<u2", 0x7C00), T.BF16: ("<u2", 0x7F80)}


@dataclass(frozen=True)
class Expected:
    """A tensor the layer graph reads: its numpy shape and the sizes it derives from."""

    shape: tuple[int, ...]
    why: str
    optional: bool = False


def expected_tensors(cfg: ModelConfig) -> dict[str, Expected]:
    """GGUF name (less ".weight") -> Expected, for cfg's architecture."""
    if cfg.arch == "gemma4":
        return gemma4_tensors(cfg)
    D, V = cfg.n_embd, cfg.n_vocab
    d_model = f"d_model {D}"
    q_heads = f"d_model {D} and {cfg.n_head} heads of {cfg.head_dim}"
    kv_heads = f"d_model {D} and {cfg.n_head_kv} KV heads of {cfg.head_dim}"
    v_heads = f"d_model {D} and {cfg.n_head_kv} KV heads of {cfg.head_dim_v}"
    o_heads = f"d_model {D} and {cfg.n_head} heads of {cfg.head_dim_v}"
    out = {
        "token_embd": Expected((V, D), f"a vocabulary of {V} and {d_model}"),
        "output_norm": Expected((D,), d_model),
        "output": Expected((V, D), f"a vocabulary of {V} and {d_model}", optional=True),
    }
    q_rows = cfg.n_head * cfg.head_dim * (2 if cfg.attn_output_gate else 1)  # gated: [q, gate] a head
    for il, spec in enumerate(ARCHITECTURES[cfg.arch].layers(cfg)):
        p = f"blk.{il}."
        out[p + "attn_norm"] = Expected((D,), d_model)
        if spec.mixer == "gated_deltanet":
            out.update(deltanet_tensors(cfg, p))
        else:
            out[p + "attn_q"] = Expected((q_rows, D), q_heads)
            out[p + "attn_k"] = Expected((cfg.n_head_kv * cfg.head_dim, D), kv_heads)
            out[p + "attn_v"] = Expected((cfg.n_head_kv * cfg.head_dim_v, D), v_heads)
            out[p + "attn_output"] = Expected((D, cfg.n_head * cfg.head_dim_v), o_heads)
        out[p + spec.ffn_norm] = Expected((D,), d_model)
        if cfg.qk_norm and spec.mixer == "attention":
            out[p + "attn_q_norm"] = Expected((cfg.head_dim,), f"heads of {cfg.head_dim}")
            out[p + "attn_k_norm"] = Expected((cfg.head_dim,), f"heads of {cfg.head_dim}")
        if cfg.post_norms:
            out[p + "post_attention_norm"] = Expected((D,), d_model)
            out[p + "post_ffw_norm"] = Expected((D,), d_model)
        if cfg.n_expert:
            E, F = cfg.n_expert, cfg.n_ff_exp
            experts = f"{E} experts, {d_model} and expert FFN {F}"
            out[p + "ffn_gate_inp"] = Expected((E, D), f"{E} experts and {d_model}")
            out[p + "ffn_gate_exps"] = Expected((E, F, D), experts)
            out[p + "ffn_up_exps"] = Expected((E, F, D), experts)
            out[p + "ffn_down_exps"] = Expected((E, D, F), experts)
            if spec.ffn == "moe_shared":
                S = cfg.n_ff_shexp
                shared = f"{d_model} and shared expert FFN {S}"
                out[p + "ffn_gate_inp_shexp"] = Expected((1, D), d_model)
                out[p + "ffn_gate_shexp"] = Expected((S, D), shared)
                out[p + "ffn_up_shexp"] = Expected((S, D), shared)
                out[p + "ffn_down_shexp"] = Expected((D, S), shared)
        else:
            ffn = f"{d_model} and FFN {cfg.n_ff}"
            out[p + "ffn_gate"] = Expected((cfg.n_ff, D), ffn)
            out[p + "ffn_up"] = Expected((cfg.n_ff, D), ffn)
            out[p + "ffn_down"] = Expected((D, cfg.n_ff), ffn)
    return out


def gemma4_tensors(cfg) -> dict[str, Expected]:
    """gemma4's tensors (llama.cpp's load_arch_tensors): per-layer attention shapes, attn_v
    optional (V = K), no K/V weights needed on KV-shared layers, routed experts beside the dense
    MLP, per-layer embeddings, rope_freqs where a layer is global."""
    D, V, H, P, L = cfg.n_embd, cfg.n_vocab, cfg.n_head, cfg.n_embd_per_layer, cfg.n_layer
    d_model = f"d_model {D}"
    out = {
        "token_embd": Expected((V, D), f"a vocabulary of {V} and {d_model}"),
        "output_norm": Expected((D,), d_model),
        "output": Expected((V, D), f"a vocabulary of {V} and {d_model}", optional=True),
    }
    if not all(cfg.swa_layers):
        out["rope_freqs"] = Expected((cfg.head_dim // 2,), f"global heads of {cfg.head_dim}")
    if P:
        ple = f"{L} layers of per-layer inputs of {P}"
        out["per_layer_token_embd"] = Expected((V, L * P), f"a vocabulary of {V} and {ple}")
        out["per_layer_model_proj"] = Expected((L * P, D), f"{d_model} and {ple}")
        out["per_layer_proj_norm"] = Expected((P,), f"per-layer inputs of {P}")
    for il in range(L):
        p, (hd, _), hkv, F = f"blk.{il}.", cfg.head_dims(il), cfg.kv_heads(il), cfg.n_ff_layers[il]
        shared = cfg.kv_layer(il) != il
        heads, kv = f"{d_model} and {H} heads of {hd}", f"{d_model} and {hkv} KV heads of {hd}"
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            out[p + name] = Expected((D,), d_model)
        out[p + "attn_q"] = Expected((H * hd, D), heads)
        out[p + "attn_q_norm"] = Expected((hd,), f"heads of {hd}")
        out[p + "attn_k"] = Expected((hkv * hd, D), kv, optional=shared)
        out[p + "attn_k_norm"] = Expected((hd,), f"heads of {hd}", optional=shared)
        out[p + "attn_v"] = Expected((hkv * hd, D), kv, optional=True)
        out[p + "attn_output"] = Expected((D, H * hd), heads)
        out[p + "ffn_gate"] = Expected((F, D), f"{d_model} and FFN {F}")
        out[p + "ffn_up"] = Expected((F, D), f"{d_model} and FFN {F}")
        out[p + "ffn_down"] = Expected((D, F), f"{d_model} and FFN {F}")
        out[p + "layer_output_scale"] = Expected((1,), "one scale a layer", optional=True)
        if cfg.n_expert:
            E, Fe = cfg.n_expert, cfg.n_ff_exp
            experts = f"{E} experts, {d_model} and expert FFN {Fe}"
            out[p + "ffn_gate_inp"] = Expected((E, D), f"{E} experts and {d_model}")
            out[p + "ffn_gate_inp.scale"] = Expected((D,), d_model)
            out[p + "ffn_gate_up_exps"] = Expected((E, 2 * Fe, D), experts)
            out[p + "ffn_down_exps"] = Expected((E, D, Fe), experts)
            out[p + "ffn_down_exps.scale"] = Expected((E,), f"{E} experts")
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                out[p + name] = Expected((D,), d_model)
        if P:
            out[p + "inp_gate"] = Expected((P, D), f"{d_model} and per-layer inputs of {P}")
            out[p + "proj"] = Expected((D, P), f"{d_model} and per-layer inputs of {P}")
            out[p + "post_norm"] = Expected((D,), d_model)
    return out


def deltanet_tensors(cfg: ModelConfig, p: str) -> dict[str, Expected]:
    """A Gated DeltaNet layer's tensors under prefix p (models/deltanet.py)."""
    d, D = cfg.deltanet, cfg.n_embd
    Hv, V, C = d.n_v_heads, d.n_v_heads * d.head_v_dim, d.conv_channels
    heads = (f"d_model {D}, {d.n_k_heads} QK heads of {d.head_k_dim} and {Hv} V heads of "
             f"{d.head_v_dim}")
    if d.fused_qkvz:
        out = {p + "ssm_in": Expected((C + V, D), heads)}
    else:
        out = {p + "attn_qkv": Expected((C, D), heads), p + "attn_gate": Expected((V, D), heads)}
    out |= {
        p + "ssm_conv1d": Expected((C, d.conv_kernel), f"{heads} and a conv kernel of {d.conv_kernel}"),
        p + "ssm_dt.bias": Expected((Hv,), f"{Hv} V heads"),
        p + "ssm_a": Expected((Hv,), f"{Hv} V heads"),
        p + "ssm_norm": Expected((d.head_v_dim,), f"V heads of {d.head_v_dim}"),
        p + "ssm_out": Expected((D, V), heads),
    }
    if d.fused_ba:
        out[p + "ssm_ba"] = Expected((2 * Hv, D), heads)
    else:
        out[p + "ssm_beta"] = Expected((Hv, D), heads)
        out[p + "ssm_alpha"] = Expected((Hv, D), heads)
    return out


def _dims(shape) -> str:
    return "[" + ", ".join(str(d) for d in reversed(shape)) + "]"


def check_tensors(mf: ModelFile, cfg: ModelConfig) -> None:
    """Every tensor cfg's layer graph reads is present, of its shape; 1-D ones of a float type."""
    expected = expected_tensors(cfg)
    for name, exp in expected.items():
        if not mf.has(name):
            if exp.optional:
                continue
            shown = name if name.endswith((".bias", "ssm_a")) else name + ".weight"
            raise GGUFError(f"{mf.path}: tensor {shown} is missing ({cfg.arch} with "
                            f"{cfg.n_layer} layers needs it)")
        t = mf.tensor(name)
        if t.shape != exp.shape:
            raise GGUFError(f"{mf.path}: {t.name} has shape {_dims(t.shape)}; {cfg.arch} with "
                            f"{exp.why} needs {_dims(exp.shape)}")
        if len(exp.shape) == 1 and t.fmt.type_id not in NORM_TYPES:
            raise GGUFError(f"{mf.path}: {t.name} is {t.fmt.name}; a norm weight must be one of "
                            f"{', '.join(FORMATS[x].name for x in NORM_TYPES)}")
    n_blocks = cfg.n_layer + cfg.n_layer_nextn
    for name in mf.tensors:
        m = _LAYER.match(name)
        if m and int(m.group(1)) >= n_blocks:
            raise GGUFError(f"{mf.path}: tensor {name} belongs to layer {m.group(1)}, but "
                            f"{cfg.arch}.block_count is {n_blocks}")
        if m and int(m.group(1)) >= cfg.n_layer:
            continue  # an MTP layer's: impnb does not run them
        if name.removesuffix(".weight") not in expected and name not in IGNORED_TENSORS:
            raise GGUFError(f"{mf.path}: tensor {name} is not one {cfg.arch} reads (a renamed "
                            f"tensor, or a model impnb does not know)")


def _int_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_tokenizer_keys(mf: ModelFile, n_vocab: int) -> None:
    """tokenizer.* keys of the right types; arrays one entry a token; special ids in the vocabulary."""
    md = mf.metadata
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        if key in md and not isinstance(md[key], str):
            raise GGUFError(f"{mf.path}: metadata {key} is {type(md[key]).__name__}, not a string")
    arrays = (("tokens", str), ("token_type", int), ("scores", (int, float)), ("merges", str))
    for name, kind in arrays:
        key = f"tokenizer.ggml.{name}"
        if key not in md:
            continue
        value = md[key]
        if not isinstance(value, list) or not all(issubclass(t, kind) for t in set(map(type, value))):
            raise GGUFError(f"{mf.path}: metadata {key} is not an array of "
                            f"{'strings' if kind is str else 'numbers'}")
        if name != "merges" and len(value) != n_vocab:
            raise GGUFError(f"{mf.path}: metadata {key} has {len(value)} entries; token_embd has "
                            f"{n_vocab} rows")
    for name in SPECIAL_IDS:
        key = f"tokenizer.ggml.{name}_token_id"
        if key in md and not (_int_id(md[key]) and 0 <= md[key] < n_vocab):
            raise GGUFError(f"{mf.path}: metadata {key} = {md[key]!r:.40} is not a token id "
                            f"in [0, {n_vocab})")
    for name in TOKENIZER_FLAGS:
        key = f"tokenizer.ggml.{name}"
        if key in md and not isinstance(md[key], bool):
            raise GGUFError(f"{mf.path}: metadata {key} = {md[key]!r:.40} is not a boolean")
    declared = mf.arch_get("vocab_size")
    if declared is not None and declared != n_vocab:
        raise GGUFError(f"{mf.path}: metadata {mf.arch}.vocab_size = {declared!r:.40}; token_embd "
                        f"has {n_vocab} rows")


def host_bytes_needed(mf: ModelFile, cfg: ModelConfig, n_ctx: int) -> int:
    """What the CPU reference allocates: every weight in float32, the float32 KV cache and the
    Gated DeltaNet layers' states."""
    weights = sum(math.prod(t.shape) for t in mf.tensors.values()) * 4
    n_recurrent = sum(cfg.recurrent_layers)
    kv = sum(cfg.kv_heads(il) * sum(cfg.head_dims(il)) for il in range(cfg.n_layer)
             if not cfg.is_recurrent(il) and cfg.kv_layer(il) == il) * n_ctx * 4
    if cfg.deltanet:
        d = cfg.deltanet
        kv += n_recurrent * (d.conv_channels * d.conv_kernel + d.n_v_heads * d.head_k_dim * d.head_v_dim) * 4
    return weights + kv


def host_memory_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_host_memory(needed: int, what: str) -> None:
    """DeviceError when `needed` bytes exceed the host's available memory."""
    if os.environ.get("IMPNB_SKIP_MEMORY_CHECK") == "1":
        return
    available = host_memory_available()
    if available is not None and needed > available:
        raise DeviceError(f"{what} needs {needed / 2**30:.1f} GiB of host memory; "
                          f"{available / 2**30:.1f} GiB is available")


def check_gpu_shapes(cfg: ModelConfig) -> None:
    """UnsupportedError where the architecture has no GPU path or the GPU kernels take no such head
    dim (the CPU reference takes any)."""
    from impnb.cuda_support import GPU_ARCHS, WIDE_HEAD_ARCHS
    from impnb.kernels.attention.attention_decode import HEAD_DIMS as TILED
    from impnb.kernels.attention.attention_wide import HEAD_DIMS as WIDE

    HEAD_DIMS = TILED + WIDE if cfg.arch in WIDE_HEAD_ARCHS else TILED

    if cfg.arch not in GPU_ARCHS:
        raise UnsupportedError(f"architecture {cfg.arch} has no GPU path yet "
                               f"(GPU: {', '.join(GPU_ARCHS)}); use --device cpu")
    for dk, dv in sorted({cfg.head_dims(il) for il in range(cfg.n_layer)}):
        if dk not in HEAD_DIMS or dv != dk:
            raise UnsupportedError(f"{cfg.arch} with head dim {dk} (V {dv}) has no GPU attention kernel "
                                   f"(head dims {', '.join(map(str, HEAD_DIMS))}); use --device cpu")


def _first_nonfinite(raw: np.ndarray, ggml_type, type_size: int) -> int | None:
    """The byte offset of the first NaN or inf float (or fp16 block scale) in raw tensor bytes,
    None where there is none or the type has no float of fixed place."""
    if ggml_type in FLOAT_WORDS:
        dtype, mask = FLOAT_WORDS[ggml_type]
        words = raw.view(dtype)
        bad = np.flatnonzero((words & mask) == mask)
        return int(bad[0]) * words.itemsize if len(bad) else None
    n_blocks = raw.size // type_size
    for off in F16_SCALES.get(ggml_type, ()):
        scales = np.ndarray((n_blocks,), "<u2", raw, off, (type_size,))
        bad = np.flatnonzero((scales & 0x7C00) == 0x7C00)
        if len(bad):
            return int(bad[0]) * type_size + off
    return None


def check_finite(mf: ModelFile) -> None:
    """Every float weight and every fp16 block scale is finite (GGUFError naming the tensor)."""
    for name, t in mf.tensors.items():
        raw = np.asarray(t.data).reshape(-1).view(np.uint8)
        at = _first_nonfinite(raw, t.fmt.type_id, t.fmt.type_size)
        if at is not None:
            raise GGUFError(f"{mf.path}: {name} holds a NaN or inf (byte {at} of its data); "
                            f"the file's weights are broken")


def validate_model(mf: ModelFile, n_ctx: int | None = None, device: str | None = None) -> ModelConfig:
    """mf's config once every key, tensor and the host memory of a `device` load are checked."""
    cfg = model_config(mf)
    if "tensors and keys" not in mf.checks_passed:  # a start validates its file 2-3 times
        check_tensors(mf, cfg)
        check_tokenizer_keys(mf, cfg.n_vocab)
        mf.checks_passed.add("tensors and keys")
    if device == "cuda":
        check_gpu_shapes(cfg)
    if device == "cpu":
        ctx = min(n_ctx or cfg.n_ctx, cfg.n_ctx)
        check_host_memory(host_bytes_needed(mf, cfg, ctx), f"{cfg.arch} on the CPU")
    if device is not None and "finite" not in mf.checks_passed:
        check_finite(mf)
        mf.checks_passed.add("finite")
    return cfg
