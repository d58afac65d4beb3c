"""GGUF parser: agreement with gguf.GGUFReader, and quick, typed refusal of hostile files."""

import time
import tracemalloc

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFValueType as V

from impnb.errors import GGUFError, UnsupportedError
from impnb.gguf_file import open_model_file
from tests.gguf_craft import (
    build_gguf, gguf_string, kv_array, kv_raw, kv_string, kv_u32, one_tensor_gguf, patched,
    tensor_bytes, tensor_info, truncated, u32, u64, write_tiny_gguf,
)

ARCH = kv_string("general.architecture", "llama")


def rejects(path, match: str, exc=GGUFError):
    """open_model_file(path) raises `exc` matching `match`, in < 1 s and < 16 MiB of heap."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(exc, match=match) as info:
            open_model_file(path)
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < 1.0, f"took {elapsed:.2f} s to refuse"
    assert peak < 16 << 20, f"allocated {peak} bytes to refuse"
    return info.value


def rich_file():
    """A valid crafted file with every value kind and three tensors (F32, Q4_0, F16)."""
    rng = np.random.default_rng(7)
    kvs = [ARCH, kv_u32("llama.block_count", 2), kv_string("general.name", "tiny ✓"),
           kv_raw("llama.rope.freq_base", V.FLOAT32, np.float32(1e4).tobytes()),
           kv_raw("tokenizer.ggml.add_bos_token", V.BOOL, b"\x01"),
           kv_raw("x.i64", V.INT64, np.int64(-5).tobytes()),
           kv_array("tokenizer.ggml.tokens", V.STRING,
                    b"".join(gguf_string(s) for s in ["a", "bc", "", "<s>"]), 4),
           kv_array("tokenizer.ggml.scores", V.FLOAT32, rng.standard_normal(4, np.float32).tobytes(), 4)]
    specs = [("a.weight", (32, 3), T.F32), ("b.weight", (64, 2), T.Q4_0), ("c", (8,), T.F16)]
    infos, chunks, offset = [], [], 0
    for name, dims, qtype in specs:
        n = tensor_bytes(qtype, dims)
        infos.append(tensor_info(name, dims, qtype, offset))
        chunks.append(rng.integers(0, 256, n, dtype=np.uint8).tobytes() + bytes(-n % 32))
        offset += n + -n % 32
    return build_gguf(kvs, infos, b"".join(chunks))


# -- agreement with gguf.GGUFReader --


def assert_agrees_with_reader(path):
    ours, ref = open_model_file(path), GGUFReader(path)
    ref_meta = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(ref_meta)
    for key, value in ref_meta.items():
        assert type(ours.metadata[key]) is type(value), key
        assert ours.metadata[key] == value, key
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for rt in ref.tensors:
        t = ours.tensors[rt.name]
        assert t.ggml_type == rt.tensor_type, rt.name
        assert t.shape == tuple(int(d) for d in reversed(rt.shape)), rt.name
        assert t.data.dtype == rt.data.dtype, rt.name
        assert t.data.nbytes == rt.n_bytes, rt.name
        assert np.array_equal(t.data.view(np.uint8).ravel(), rt.data.view(np.uint8).ravel()), rt.name


@pytest.mark.slow
@pytest.mark.parametrize("model_path", ["smollm2_path", "gemma3_path"])
def test_agrees_with_gguf_reader_on_real_models(model_path, request):
    assert_agrees_with_reader(request.getfixturevalue(model_path))


def test_agrees_with_gguf_reader_on_crafted_file(tmp_path):
    assert_agrees_with_reader(rich_file().write(tmp_path / "rich.gguf"))


def test_agrees_with_gguf_reader_on_writer_file(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    path = write_tiny_gguf(tmp_path / "w.gguf", {
        "token_embd.weight": (x, T.F32),
        "output.weight": (x.astype(np.float16), T.F16),
        "blk.0.attn_q.weight": (rng.integers(0, 256, (5, 2 * 18), dtype=np.uint8), T.Q4_0),
    }, metadata={"llama.block_count": (1, V.UINT32), "general.tags": ["a", "b"], "f": 0.25},
        alignment=64)
    assert_agrees_with_reader(path)
    assert open_model_file(path).get("general.alignment") == 64


def test_builder_matches_gguf_writer(tmp_path):
    """The byte-level builder lays files out exactly as gguf.GGUFWriter does."""
    x = np.random.default_rng(1).standard_normal((3, 32)).astype(np.float32)
    written = write_tiny_gguf(tmp_path / "w.gguf", {"w": (x, T.F32)}).read_bytes()
    built = build_gguf([ARCH], [tensor_info("w", (32, 3), T.F32, 0)], x.tobytes())
    assert built.data == written


# -- files that are not GGUF at all --


def test_missing_file(tmp_path):
    rejects(tmp_path / "absent.gguf", "no such file")


def test_directory(tmp_path):
    rejects(tmp_path, "no such file")


def test_empty_file(tmp_path):
    path = tmp_path / "e.gguf"
    path.write_bytes(b"")
    rejects(path, "empty file")


def test_three_byte_file(tmp_path):
    path = tmp_path / "3.gguf"
    path.write_bytes(b"GGU")
    rejects(path, "not a GGUF")


@pytest.mark.parametrize("seed", range(8))
def test_random_bytes(tmp_path, seed):
    path = tmp_path / "r.gguf"
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    rejects(path, "not a GGUF")


@pytest.mark.parametrize("seed", range(40))
def test_random_bytes_after_a_valid_preamble(tmp_path, seed):
    """GGUF v3 magic and version, then noise: any typed error, never a crash or a hang."""
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, int(rng.integers(0, 600)), dtype=np.uint8).tobytes()
    path = tmp_path / "r.gguf"
    path.write_bytes(b"GGUF" + u32(3) + noise)
    rejects(path, ".", (GGUFError, UnsupportedError))


def test_bad_magic(tmp_path):
    rejects(patched(rich_file().write(tmp_path / "a"), 0, b"GGML", tmp_path / "b"), "magic")


@pytest.mark.parametrize("version", [0, 1, 99, 2**32 - 1])
def test_bad_version(tmp_path, version):
    rejects(patched(rich_file().write(tmp_path / "a"), 4, u32(version), tmp_path / "b"),
            f"version {version} is not supported")


def test_header_truncated_anywhere(tmp_path):
    crafted = rich_file()
    full = crafted.write(tmp_path / "full.gguf")
    assert open_model_file(full).tensors  # the uncut file is valid
    for cut in range(0, crafted.data_start + 40, 7):
        path = truncated(full, cut, tmp_path / f"cut{cut}.gguf")
        if cut == 0:
            rejects(path, "empty file")
        elif cut < 4:
            rejects(path, "not a GGUF")
        elif cut < crafted.header_end:
            rejects(path, r"truncated header|more than \d+ bytes can hold|cannot fit in the file")
        else:
            rejects(path, "past the end of the file")


# -- absurd counts and lengths --


def test_absurd_tensor_count(tmp_path):
    rejects(build_gguf([ARCH], n_tensors=2**60).write(tmp_path / "a"), f"{2**60} tensors")


def test_absurd_kv_count(tmp_path):
    rejects(build_gguf([ARCH], n_kv=2**60).write(tmp_path / "a"), f"{2**60} keys")


def test_kv_count_one_too_many(tmp_path):
    # alignment=1: no zero padding after the header (zeros read as a valid key "" of type u8)
    rejects(build_gguf([ARCH], n_kv=2, alignment=1).write(tmp_path / "a"), "truncated header")


def test_absurd_string_length_in_value(tmp_path):
    kv = kv_raw("general.name", V.STRING, gguf_string("abc", length=2**62))
    rejects(build_gguf([ARCH, kv]).write(tmp_path / "a"), f"string of {2**62} bytes")


def test_absurd_string_length_in_key(tmp_path):
    kv = gguf_string("general.name", length=2**62) + u32(V.UINT32) + u32(1)
    rejects(build_gguf([ARCH, kv]).write(tmp_path / "a"), f"string of {2**62} bytes")


def test_absurd_string_length_in_tensor_name(tmp_path):
    info = gguf_string("w", length=2**62) + u32(1) + u64(32) + u32(T.F32) + u64(0)
    rejects(build_gguf([ARCH], [info], bytes(128)).write(tmp_path / "a"), f"string of {2**62} bytes")


def test_string_one_byte_past_the_end(tmp_path):
    kv = kv_raw("general.name", V.STRING, gguf_string("abc", length=4))
    rejects(build_gguf([ARCH, kv], alignment=1).write(tmp_path / "a"), "truncated header")


@pytest.mark.parametrize("etype", [V.UINT8, V.INT32, V.UINT64, V.FLOAT64, V.BOOL])
def test_absurd_array_count(tmp_path, etype):
    kv = kv_array("tokenizer.ggml.scores", etype, bytes(64), 2**62)
    rejects(build_gguf([ARCH, kv]).write(tmp_path / "a"), "truncated header")


def test_absurd_string_array_count(tmp_path):
    kv = kv_array("tokenizer.ggml.tokens", V.STRING, gguf_string("a") * 4, 2**62)
    rejects(build_gguf([ARCH, kv]).write(tmp_path / "a"), f"array of {2**62} strings")


def test_large_vocabulary_agrees_with_reader_and_loads_fast(tmp_path):
    """A 262k-string vocabulary (Gemma3's size) of mixed lengths, multi-byte UTF-8 and empty
    strings, with its scores: the same lists as GGUFReader, read well under a second."""
    rng = np.random.default_rng(11)
    alphabet = ["a", "b", "é", "☃", "\u2581", "🙂", "<", ">", "0"]
    tokens = ["".join(rng.choice(alphabet, rng.integers(0, 12))) for _ in range(262_144)]
    tokens[7] = "x" * 70_000  # a length past two bytes
    scores = rng.standard_normal(len(tokens)).astype(np.float32)
    kvs = [ARCH, kv_array("tokenizer.ggml.tokens", V.STRING, b"".join(gguf_string(t) for t in tokens),
                          len(tokens)),
           kv_array("tokenizer.ggml.scores", V.FLOAT32, scores.tobytes(), len(scores))]
    path = build_gguf(kvs).write(tmp_path / "vocab.gguf")
    start = time.perf_counter()
    mf = open_model_file(path)
    elapsed = time.perf_counter() - start
    assert mf.metadata["tokenizer.ggml.tokens"] == tokens
    assert mf.metadata["tokenizer.ggml.scores"] == scores.tolist()
    assert elapsed < 1.0, f"took {elapsed:.2f} s"
    assert_agrees_with_reader(path)


@pytest.mark.parametrize("length, match", [(2**62, f"string of {2**62} bytes"), (2**26 + 1, "string of"),
                                           (10**6, "truncated header")])
def test_bad_length_inside_a_string_array(tmp_path, length, match):
    items = gguf_string("ok") + gguf_string("bad", length=length) + gguf_string("later")
    kv = kv_array("tokenizer.ggml.tokens", V.STRING, items, 3)
    rejects(build_gguf([ARCH, kv]).write(tmp_path / "a"), match)


def test_string_array_cut_inside_a_length(tmp_path):
    kv = kv_array("tokenizer.ggml.tokens", V.STRING, gguf_string("okokokok") + gguf_string("b")[:5], 2)
    rejects(build_gguf([ARCH, kv], alignment=1).write(tmp_path / "a"), "truncated header")


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"\xe2\x98", b"\x80"])
def test_invalid_utf8_inside_a_string_array(tmp_path, bad):
    """Each string must be UTF-8 on its own: a character split across two strings is refused."""
    items = gguf_string("ok") + u64(len(bad)) + bad + u64(1) + b"\x83"
    kv = kv_array("tokenizer.ggml.tokens", V.STRING, items, 3)
    rejects(build_gguf([ARCH, kv]).write(tmp_path / "a"), "not UTF-8")


def test_invalid_utf8_string(tmp_path):
    kv = kv_raw("general.name", V.STRING, u64(2) + b"\xff\xfe")
    rejects(build_gguf([ARCH, kv]).write(tmp_path / "a"), "not UTF-8")


@pytest.mark.parametrize("vtype", [13, 255, 2**32 - 1])
def test_bad_value_type(tmp_path, vtype):
    rejects(build_gguf([ARCH, kv_raw("x", vtype, bytes(8))]).write(tmp_path / "a"),
            f"value type {vtype} is not valid")


@pytest.mark.parametrize("etype", [V.ARRAY, 13])
def test_bad_array_element_type(tmp_path, etype):
    kv = kv_array("x", etype, bytes(16), 1)
    rejects(build_gguf([ARCH, kv]).write(tmp_path / "a"), f"element type {int(etype)} is not valid")


def test_duplicate_metadata_key(tmp_path):
    rejects(build_gguf([ARCH, kv_u32("x", 1), kv_u32("x", 2)]).write(tmp_path / "a"),
            "metadata key x appears twice")


# -- tensor infos --


@pytest.mark.parametrize("n_dims", [0, 5, 2**32 - 1])
def test_bad_dimension_count(tmp_path, n_dims):
    info = gguf_string("w") + u32(n_dims) + u64(32) * min(n_dims, 5) + u32(T.F32) + u64(0)
    rejects(build_gguf([ARCH], [info], bytes(4096)).write(tmp_path / "a"),
            f"tensor w has {n_dims} dimensions")


@pytest.mark.parametrize("dims", [(0,), (32, 0), (2**50,), (32, 2**50), (32, 2**64 - 1)])
def test_bad_dimension(tmp_path, dims):
    rejects(one_tensor_gguf(dims=dims, data=bytes(4096)).write(tmp_path / "a"),
            r"tensor w has dimensions \[")


def test_dimensions_whose_product_overflows_int64(tmp_path):
    dims = (32, 2**40, 2**40, 2**40)  # each allowed, product 2**125 elements
    rejects(one_tensor_gguf(dims=dims, data=bytes(4096)).write(tmp_path / "a"), "past the end of the file")


def test_tensor_offset_past_the_end(tmp_path):
    rejects(one_tensor_gguf(offset=2**40).write(tmp_path / "a"), "tensor w .* past the end of the file")


def test_tensor_offset_near_u64_max(tmp_path):
    rejects(one_tensor_gguf(offset=2**64 - 32).write(tmp_path / "a"), "tensor w .* past the end of the file")


def test_tensor_bytes_run_past_the_end(tmp_path):
    crafted = one_tensor_gguf(dims=(32, 4))
    whole = crafted.write(tmp_path / "whole.gguf")
    assert open_model_file(whole).tensors["w"].shape == (4, 32)
    short = truncated(whole, len(crafted.data) - 1, tmp_path / "short.gguf")
    rejects(short, r"tensor w \(512 bytes at offset \d+\) lies past the end of the file")


def test_second_tensor_runs_past_the_end(tmp_path):
    infos = [tensor_info("a", (32,), T.F32, 0), tensor_info("b", (32, 2), T.F32, 128)]
    rejects(build_gguf([ARCH], infos, bytes(128 + 255)).write(tmp_path / "a"), "tensor b .* past the end")


@pytest.mark.parametrize("qtype, row", [(T.Q4_0, 33), (T.Q4_K, 255), (T.Q8_0, 48), (T.MXFP4, 1)])
def test_row_not_a_multiple_of_the_block(tmp_path, qtype, row):
    crafted = one_tensor_gguf(dims=(row, 3), type_id=qtype, data=bytes(4096))
    rejects(crafted.write(tmp_path / "a"), f"row of {row} is not a multiple of the {qtype.name} block")


def test_duplicate_tensor_names(tmp_path):
    infos = [tensor_info("w", (32,), T.F32, 0), tensor_info("w", (32,), T.F32, 128)]
    rejects(build_gguf([ARCH], infos, bytes(256)).write(tmp_path / "a"), "tensor w appears twice")


@pytest.mark.parametrize("qtype", [T.IQ2_XXS, T.TQ1_0, T.IQ4_XS, T.Q8_1, T.I32])
def test_unsupported_type(tmp_path, qtype):
    crafted = one_tensor_gguf(name="blk.3.ffn_up.weight", dims=(256, 2), type_id=qtype)
    err = rejects(crafted.write(tmp_path / "a"), f"GGML type {qtype.name} is not supported",
                  UnsupportedError)
    assert "blk.3.ffn_up.weight" in str(err)


@pytest.mark.parametrize("type_id", [200, 2**32 - 1])
def test_unknown_type_id(tmp_path, type_id):
    crafted = one_tensor_gguf(name="blk.0.x", dims=(32,), type_id=type_id, data=bytes(128))
    err = rejects(crafted.write(tmp_path / "a"), f"unknown GGML type id {type_id}", UnsupportedError)
    assert "blk.0.x" in str(err)


# -- metadata the parser relies on --


@pytest.mark.parametrize("align", [0, 3, 24, 48])
def test_non_power_of_two_alignment(tmp_path, align):
    crafted = one_tensor_gguf(extra_kvs=[kv_u32("general.alignment", align)])
    rejects(crafted.write(tmp_path / "a"), f"general.alignment {align} is not a power of two")


def test_alignment_of_wrong_type(tmp_path):
    crafted = one_tensor_gguf(extra_kvs=[kv_string("general.alignment", "32")])
    rejects(crafted.write(tmp_path / "a"), "general.alignment '32' is not a power of two")


def test_custom_alignment_moves_the_data(tmp_path):
    """With general.alignment 256 the data section starts on the next multiple of 256."""
    data = np.arange(64, dtype=np.float32)
    crafted = build_gguf([ARCH, kv_u32("general.alignment", 256)],
                         [tensor_info("w", (64,), T.F32, 0)], data.tobytes(), alignment=256)
    assert crafted.data_start % 256 == 0 and crafted.data_start - crafted.header_end > 32
    assert np.array_equal(open_model_file(crafted.write(tmp_path / "a")).tensors["w"].data, data)


def test_missing_architecture(tmp_path):
    rejects(one_tensor_gguf(arch=None).write(tmp_path / "a"), "general.architecture is missing")


def test_architecture_of_wrong_type(tmp_path):
    crafted = one_tensor_gguf(arch=None, extra_kvs=[kv_u32("general.architecture", 1)])
    rejects(crafted.write(tmp_path / "a"), "general.architecture is missing")


def test_errors_name_the_file(tmp_path):
    path = one_tensor_gguf(arch=None).write(tmp_path / "named.gguf")
    assert str(path) in str(rejects(path, "general.architecture"))


def test_tensor_offset_off_alignment(tmp_path):
    rejects(one_tensor_gguf(offset=4).write(tmp_path / "a"), "tensor w data offset 4 is not aligned to 32")
