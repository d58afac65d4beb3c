"""The CUDA engine loading tiny MXFP4 / NVFP4 models onto the simulated device keeps their FP4
matrices in the file's blocks (tests/gpu/test_engine_fp4.py's check): no widening at load."""

import pytest
from gguf import GGMLQuantizationType as T

from impnb.gguf_file import open_model_file
from impnb.synthetic import tiny_gguf
from tests.gpu.test_engine_fp4 import check_weights_stay_fp4

pytest.importorskip("transformers")


@pytest.mark.parametrize("arch,qtype", [("qwen3", "MXFP4"), ("qwen3moe", "NVFP4")])
def test_fp4_weights_stay_fp4_on_the_device(tmp_path, arch, qtype):
    from impnb.engine_cuda import CudaEngine

    _, path = tiny_gguf(arch, qtype, tmp_path, seed=4)
    engine = CudaEngine(open_model_file(path), 256, graphs=False)
    check_weights_stay_fp4(engine, T[qtype])
