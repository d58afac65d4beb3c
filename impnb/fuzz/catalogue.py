"""The mutation kinds of issue 38, each a function (parsed GGUF, rng) -> Case, drawn by `draw`."""

import math
import struct
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFValueType as V

from impnb.fuzz.mutate import (ANY, FAIL, HUGE, PASS, SCALE_OFFSET, Mutant, arch_of, copy,
                               other_size_types, same_size_types, set_info, set_kv)

NAN32, INF16, NAN16 = struct.pack("<I", 0x7FC00000), struct.pack("<H", 0x7C00), struct.pack("<H", 0x7E00)
BAD_TEMPLATES = ("{{ 1/0 }}", "{% for i in range(10**9) %}x{% endfor %}", "{{ 'a' * 10**10 }}",
                 "{% for i in range(90000) %}{% for j in range(90000) %}{% endfor %}{% endfor %}",
                 "{{ raise_exception('no') }}", "{% if %}")
REQUIRED_KEYS = ("block_count", "embedding_length", "attention.head_count")


@dataclass
class Case:
    """One mutant and what impnb owes it: `expect` per command (FAIL, PASS or ANY)."""

    kind: str
    detail: str
    mutant: Mutant
    info: str = FAIL
    generate: str = FAIL
    chat: bool = False  # run generate with --chat


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _data_end(m: Mutant) -> int:
    return max(i.offset + i.nbytes() for i in m.infos)


def truncate(m, rng):
    end = m.data_start + _data_end(m)
    at = int(rng.integers(0, end))
    return Case("truncate", f"at byte {at} of {end}", copy(m, truncate=at))


def flip_header(m, rng):
    size = len(m.header())
    at = int(rng.integers(4, size))
    return Case("flip_header", f"byte {at}", copy(m, header_patch=(at, bytes([int(rng.integers(256))]))),
                info=ANY, generate=ANY)


def flip_data(m, rng):
    at = int(rng.integers(_data_end(m)))
    return Case("flip_data", f"data byte {at}", copy(m, patches=[(at, bytes([int(rng.integers(256))]))]),
                info=ANY, generate=ANY)


def unused_bytes(m, rng):
    choice = int(rng.integers(3))
    if choice == 0:
        return Case("unused_bytes", "general.name rewritten", set_kv(m, "general.name", "fuzzed name", V.STRING),
                    info=PASS, generate=PASS)
    if choice == 1:
        return Case("unused_bytes", "unknown key added", set_kv(m, "fuzz.extra", 7, V.UINT32),
                    info=PASS, generate=PASS)
    gaps = []
    for a in sorted(m.infos, key=lambda i: i.offset):
        end = a.offset + a.nbytes()
        pad = -end % m.align
        if pad:
            gaps.append((end, pad))
    if not gaps:
        return Case("unused_bytes", "unknown key added", set_kv(m, "fuzz.other", "x", V.STRING),
                    info=PASS, generate=PASS)
    at, n = _pick(rng, gaps)
    return Case("unused_bytes", f"alignment padding at data byte {at}", copy(m, patches=[(at, b"\xa5" * n)]),
                info=PASS, generate=PASS)


def huge_count(m, rng):
    field = _pick(rng, ("n_kv", "n_tensors"))
    value = _pick(rng, HUGE + (len(m.kvs if field == "n_kv" else m.infos) + 1,))
    return Case("huge_count", f"{field} = {value}", copy(m, **{field: value}))


def huge_array(m, rng):
    arrays = [i for i, kv in enumerate(m.kvs) if kv.vtype == V.ARRAY]
    i = _pick(rng, arrays)
    kv = m.kvs[i]
    value = _pick(rng, HUGE)
    out = copy(m)
    out.kvs[i] = type(kv)(kv.key, kv.vtype, kv.raw[:4] + struct.pack("<Q", value) + kv.raw[12:], None)
    return Case("huge_count", f"{kv.key} array count = {value}", out)


def huge_dim(m, rng):
    info = _pick(rng, m.infos)
    d = int(rng.integers(len(info.dims)))
    value = _pick(rng, HUGE + (info.dims[d] * 8,))
    dims = tuple(value if j == d else x for j, x in enumerate(info.dims))
    return Case("huge_dim", f"{info.name} dim {d} = {value}", set_info(m, info.name, dims=dims))


def retype(m, rng):
    info = _pick(rng, m.infos)
    same = same_size_types(info.type_id, info.dims[0])
    if same and rng.random() < 0.3:
        t = _pick(rng, same)
        # Same byte size: no reader can tell from the file; only the weights' values change.
        return Case("retype_same_size", f"{info.name} {T(info.type_id).name} -> {T(t).name}",
                    set_info(m, info.name, type_id=t), info=ANY, generate=ANY)
    other = other_size_types(info.type_id, info.dims[0]) + [9999, 4]
    t = _pick(rng, other)
    name = T(t).name if t in T._value2member_map_ else str(t)
    return Case("retype", f"{info.name} {T(info.type_id).name} -> {name}", set_info(m, info.name, type_id=t))


def drop_tensor(m, rng):
    info = _pick(rng, m.infos)
    out = copy(m)
    out.infos = [i for i in m.infos if i.name != info.name]
    return Case("missing_tensor", f"{info.name} dropped", out)


def rename_tensor(m, rng):
    info = _pick(rng, m.infos)
    new = _pick(rng, (info.name.replace(".weight", ".wieght"), info.name.replace("blk.1.", "blk.01."),
                      info.name + "_x"))
    if new == info.name:
        new = "x" + new
    return Case("renamed_tensor", f"{info.name} -> {new}", set_info(m, info.name, name=new))


def reshape(m, rng):
    matrices = [i for i in m.infos if len(i.dims) >= 2 and i.dims[0] != i.dims[1]]
    vectors = [i for i in m.infos if len(i.dims) == 1]
    choice = int(rng.integers(3))
    if choice == 0 and matrices:
        info = _pick(rng, matrices)
        dims = (info.dims[1], info.dims[0]) + info.dims[2:]
        return Case("bad_shape", f"{info.name} {list(info.dims)} -> {list(dims)}",
                    set_info(m, info.name, dims=dims))
    if choice == 1 and len(m.infos):
        info = _pick(rng, [i for i in m.infos if len(i.dims) < 4])
        return Case("bad_shape", f"{info.name} gains a dimension of 1",
                    set_info(m, info.name, dims=info.dims + (1,)))
    info = _pick(rng, vectors)
    d = _pick(rng, (1, max(info.dims[0] // 2, 1)))
    return Case("bad_shape", f"{info.name} [{info.dims[0]}] -> [{d}]", set_info(m, info.name, dims=(d,)))


def bad_offset(m, rng):
    ordered = sorted(m.infos, key=lambda i: i.offset)
    info = _pick(rng, ordered[1:])
    other = _pick(rng, [i for i in ordered if i.name != info.name])
    value = _pick(rng, (0, other.offset, info.offset + 1, info.offset + m.align,
                        -(-(m.data_size * 2) // m.align) * m.align, 2**63))
    return Case("bad_offset", f"{info.name} offset {info.offset} -> {value}", set_info(m, info.name, offset=value))


def _arch_keys(m):
    arch = arch_of(m)
    return arch, [kv for kv in m.kvs if kv.key.startswith(arch + ".") and kv.vtype != V.ARRAY]


def bad_key_type(m, rng):
    arch, keys = _arch_keys(m)
    kv = _pick(rng, keys)
    if kv.vtype in (V.FLOAT32, V.FLOAT64):
        value, vtype = _pick(rng, (("1e-6", V.STRING), (math.nan, V.FLOAT32), (math.inf, V.FLOAT32),
                                   (-1.0, V.FLOAT32), (0.0, V.FLOAT32), ([1, 2], V.ARRAY)))
    else:
        value, vtype = _pick(rng, (("12", V.STRING), (1.5, V.FLOAT32), (0, V.UINT32), (-1, V.INT32),
                                   (HUGE[0], V.UINT32), (HUGE[1], V.UINT64), ([1, 2], V.ARRAY)))
    return Case("bad_metadata", f"{kv.key} = {value!r}", set_kv(m, kv.key, value, vtype))


def bad_key_value(m, rng):
    arch, keys = _arch_keys(m)
    sizes = {kv.key: kv for kv in keys if kv.key.split(".", 1)[1] in (
        "block_count", "embedding_length", "feed_forward_length", "attention.head_count",
        "attention.key_length", "expert_count", "expert_feed_forward_length")}
    kv = sizes[_pick(rng, sorted(sizes))]
    value = _pick(rng, [v for v in (kv.value - 1, kv.value + 1, kv.value * 2, kv.value // 2) if v >= 1
                        and v != kv.value])
    unused = arch == "qwen3moe" and kv.key.endswith(".feed_forward_length")  # experts have their own
    expect = PASS if unused else FAIL
    return Case("bad_metadata", f"{kv.key} {kv.value} -> {value}", set_kv(m, kv.key, value, V.UINT32),
                info=expect, generate=expect)


def missing_key(m, rng):
    arch = arch_of(m)
    key = f"{arch}.{_pick(rng, REQUIRED_KEYS)}"
    out = copy(m)
    out.kvs = [kv for kv in m.kvs if kv.key != key]
    return Case("bad_metadata", f"{key} dropped", out)


def bad_general(m, rng):
    key, value, vtype = _pick(rng, (("general.architecture", "mamba9", V.STRING),
                                    ("general.architecture", 3, V.UINT32),
                                    ("general.alignment", 3, V.UINT32), ("general.alignment", 0, V.UINT32)))
    return Case("bad_metadata", f"{key} = {value!r}", set_kv(m, key, value, vtype))


def bad_tokenizer(m, rng):
    n_vocab = next(len(kv.value) for kv in m.kvs if kv.key == "tokenizer.ggml.tokens")
    choice = int(rng.integers(3))
    name = _pick(rng, ("bos", "eos", "padding"))
    if choice == 0:
        value, vtype = _pick(rng, ((n_vocab, V.UINT32), (HUGE[0], V.UINT32), ("2", V.STRING), (-1, V.INT32)))
        return Case("bad_tokenizer", f"{name}_token_id = {value!r}",
                    set_kv(m, f"tokenizer.ggml.{name}_token_id", value, vtype))
    if choice == 1 and any(kv.key == "tokenizer.ggml.merges" for kv in m.kvs):
        i = next(i for i, kv in enumerate(m.kvs) if kv.key == "tokenizer.ggml.merges")
        merges = list(m.kvs[i].value)
        merges[int(rng.integers(len(merges)))] = "zzq qqz"
        raw = struct.pack("<IQ", V.STRING, len(merges)) + b"".join(
            struct.pack("<Q", len(s.encode())) + s.encode() for s in merges)
        out = copy(m)
        out.kvs[i] = type(m.kvs[i])(m.kvs[i].key, V.ARRAY, raw, merges)
        return Case("bad_tokenizer", "a merge names tokens not in the vocabulary", out, info=ANY)
    value, vtype = _pick(rng, (("model", V.UINT32), ("bert", V.STRING)))
    return Case("bad_tokenizer", f"tokenizer.ggml.model = {value!r}",
                set_kv(m, "tokenizer.ggml.model", value if vtype == V.STRING else 7, vtype),
                info=FAIL if vtype != V.STRING else ANY)


def bad_template(m, rng):
    if rng.random() < 0.2:
        return Case("bad_template", "chat_template = 5", set_kv(m, "tokenizer.chat_template", 5, V.UINT32),
                    chat=True)
    t = _pick(rng, BAD_TEMPLATES)
    return Case("bad_template", f"chat_template = {t!r}", set_kv(m, "tokenizer.chat_template", t, V.STRING),
                info=PASS, chat=True)


def nan_weight(m, rng):
    used = [i for i in m.infos if "exps" not in i.name and "gate_inp" not in i.name and i.name.startswith("blk.")
            and (i.type_id in (T.F32, T.F16) or T(i.type_id) in SCALE_OFFSET)]
    info = _pick(rng, used)
    t = T(info.type_id)
    if t == T.F32:
        at, value = 4 * int(rng.integers(info.dims[0])), NAN32
    elif t == T.F16:
        at, value = 2 * int(rng.integers(info.dims[0])), _pick(rng, (NAN16, INF16))
    else:
        block = rng.integers(info.nbytes() // _block_bytes(t))
        at, value = int(block) * _block_bytes(t) + SCALE_OFFSET[t], _pick(rng, (NAN16, INF16))
    return Case("nan_weight", f"{info.name} {'NaN' if value != INF16 else 'inf'} at byte {at}",
                copy(m, patches=[(info.offset + at, value)]), info=PASS)


def _block_bytes(t) -> int:
    return GGML_QUANT_SIZES[t][1]


KINDS = (truncate, flip_header, flip_data, unused_bytes, huge_count, huge_array, huge_dim, retype,
         drop_tensor, rename_tensor, reshape, bad_offset, bad_key_type, bad_key_value, missing_key,
         bad_general, bad_tokenizer, bad_template, nan_weight)


def draw(m: Mutant, rng, n: int) -> list[Case]:
    """n cases, the kinds taken in turn from a shuffled order, their parameters from rng."""
    order = [KINDS[int(i)] for i in rng.permutation(len(KINDS))]
    return [order[i % len(order)](m, rng) for i in range(n)]
