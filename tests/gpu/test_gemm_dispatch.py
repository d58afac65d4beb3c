"""Every prefill GEMM path of gpu/gemm_dispatch.py gives cuBLAS's result on the real models'
weights: MatMul.gemm (gpu/linear.py) at M = 19, 111, 300 (x Gaussian at std 1 and 10), outputs poisoned,
max |diff| / max |ref| < 1e-2 (the tiles and cuBLAS both multiply fp16 values of the same
weights and accumulate in float32; they differ in summation order)."""

import numpy as np
import pytest

from impnb.gpu import gemm_dispatch as gd
from impnb.kernels.gemm.gemm_tc_quant import QUANT_TYPES

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request):
    from impnb.gguf_file import open_model_file
    from impnb.gpu.model import DeviceModel

    return DeviceModel(open_model_file(request.getfixturevalue(f"{request.param}_path")), 512)


def runs(path: str, w) -> bool:
    """Whether a GEMM path takes this weight's type and width (as scripts/tune_gemm.py asks)."""
    from impnb.kernels.gemm import gemm_few, gemm_mmq, gemm_wgmma_few
    from impnb.kernels.gemm.gemm_wgmma import BK

    return ((path != "few" or gemm_few.supports(w.ggml_type, w.cols)) and (path != "wgmma" or w.cols % BK == 0)
            and (path != "mmq" or gemm_mmq.supports(w.ggml_type, w.cols))
            and (path != "wgmma_few" or gemm_wgmma_few.supports(w.ggml_type, w.cols)))


@pytest.mark.parametrize("name", ["blk.0.attn_output", "blk.0.ffn_gate_up", "blk.0.ffn_down"])
def test_paths_agree_with_cublas(model, name):
    w = model.w.get(name)
    if w is None or w.ggml_type not in QUANT_TYPES:
        pytest.skip(f"{name}: absent or no tile for its type")
    rng = np.random.default_rng(len(name))
    for M in (19, 111, 300):
        for std in (1.0, 10.0):
            x = model.ctx.upload((rng.standard_normal((M, w.cols)) * std).astype(np.float32))
            out = {}
            for path in (p for p in gd.PATHS if runs(p, w)):
                y = model.ctx.upload(np.full((M, w.rows), np.nan, np.float32))
                model.mm.gemm(x, w, y, path)
                out[path] = y.copy_to_host()
            ref = out["cublas"]
            assert np.isfinite(ref).all()
            for path, got in out.items():
                rel = np.abs(got - ref).max() / np.abs(ref).max()
                assert np.isfinite(got).all() and rel < 1e-2, f"{name} M={M} {path}: {rel:.2e}"


def test_kept_fp16_copies(model):
    """keep_w16 kept, at load, the fp16 copy of every Linear whose GEMM takes cuBLAS at some row
    bucket (all of a small model's fit), bit-equal to the weight dequantized now; with no budget
    (IMPNB_W16_RESIDENT_MB=0) or no room it keeps none and w16 dequantizes into scratch."""
    from dataclasses import replace

    from impnb.gpu.linear import MatMul
    from impnb.kernels.gemm.dequant import dequant

    takes = {id(lin.w): lin.w for lin in model.lin.values() if "cublas" in lin.gemm_paths.values()}
    assert takes and set(model.mm.resident) == set(takes)
    assert model.w16_bytes == sum(2 * w.rows * w.cols for w in takes.values())
    for w in list(takes.values())[:4]:
        fresh = model.ctx.upload(np.full((w.rows, w.cols), np.nan, np.float16))
        dequant(w, fresh, model.ctx.nb_stream)
        model.ctx.sync()
        assert np.array_equal(model.mm.w16(w).copy_to_host().view(np.uint16), fresh.copy_to_host().view(np.uint16))
    for tuning, room in ((replace(model.tuning, w16_resident_mb=0), 1 << 40), (model.tuning, model.w16_bytes - 1)):
        mm = MatMul(model.ctx, model.arena, model.cublas, tuning)
        assert mm.keep_w16(model.lin.values(), room) == 0 and not mm.resident
        w = next(iter(takes.values()))
        assert mm.w16(w) is not model.mm.resident[id(w)]


def test_table_paths_on_the_8b_shapes(tmp_path):
    """The synthetic Qwen3-8B Q4_K_M's matrices (two layers: Q4_K and Q6_K at real widths, the output
    matrix) at the rows of batched steps and short prompts, each on the path gemm_table.json gives it
    there (the int8 GEMM, the few-row GEMMs, wgmma_few; Q|K(|V) through MatMul.split into its
    outputs), against cuBLAS on the same weights: max |diff| / max |ref| < 1e-2, outputs poisoned."""
    from dataclasses import replace

    from impnb import synthetic_full
    from impnb.gguf_file import open_model_file
    from impnb.gpu.model import DeviceModel

    path = tmp_path / "qwen3-8b-2layers.gguf"
    synthetic_full.write_full_gguf(str(path), replace(synthetic_full.SHAPES["qwen3-8b"], num_hidden_layers=2),
                                   "Q4_K_M", None, 0, "test", 4)
    model = DeviceModel(open_model_file(path), 512)
    rng = np.random.default_rng(8)
    taken = set()
    for name, lin in model.lin.items():
        w = lin.w
        if not (name == "output" or name.startswith("blk.0.")) or w.ggml_type not in QUANT_TYPES:
            continue
        for M in (13, 19, 40, 64, 101, 128):
            path_ = lin.gemm_path(M)
            taken.add(path_)
            x = model.ctx.upload((rng.standard_normal((M, w.cols)) * (1.0, 10.0)[M % 2]).astype(np.float32))
            ref = model.ctx.upload(np.full((M, w.rows), np.nan, np.float32))
            model.mm.gemm(x, w, ref, "cublas")
            if name.split(".")[-1] in ("attn_qkv", "attn_qk"):
                sizes = [w.rows - 2048, 1024, 1024] if w.rows - 2048 > 0 and name.endswith("qkv") else [w.rows - 1024, 1024]
                ys = [model.ctx.upload(np.full((M, n), np.nan, np.float32)) for n in sizes]
                model.mm.split(x, lin, ys)
                got = np.concatenate([y.copy_to_host() for y in ys], axis=1)
            else:
                y = model.ctx.upload(np.full((M, w.rows), np.nan, np.float32))
                model.mm.gemm(x, w, y, path_)
                got = y.copy_to_host()
            want = ref.copy_to_host()
            rel = np.abs(got - want).max() / np.abs(want).max()
            assert np.isfinite(got).all() and rel < 1e-2, f"{name} M={M} {path_}: {rel:.2e}"
    assert "wgmma_few" in taken, taken
