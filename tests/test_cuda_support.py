"""cuda_support: a GPU below compute capability 9.0 is refused with one line naming it (the CLI's
`--device cuda` exits 2 with it; `auto` falls back to the CPU), never a JIT-linker traceback."""

from types import SimpleNamespace

import pytest

from impnb import cuda_support, devices
from impnb.errors import DeviceError


class FakeDriver:
    """The few cuda.bindings.driver calls cuda_support makes, for a GPU of compute capability cc."""

    def __init__(self, cc):
        self.cc = cc
        ok = SimpleNamespace(name="CUDA_SUCCESS")
        self.CUresult = SimpleNamespace(CUDA_SUCCESS=ok)
        self.CUdevice_attribute = SimpleNamespace(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
                                                  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor")
        self.ok = ok

    def cuDeviceGet(self, i):
        return self.ok, i

    def cuDeviceGetAttribute(self, a, dev):
        return self.ok, self.cc[0] if a == "major" else self.cc[1]

    def cuDeviceGetName(self, n, dev):
        return self.ok, b"NVIDIA A100-SXM4-80GB\0\0\0"


@pytest.mark.parametrize("cc,ok", [((8, 0), False), ((8, 9), False), ((9, 0), True), ((12, 0), True)])
def test_capability_reason(cc, ok):
    reason = cuda_support._capability_reason(FakeDriver(cc))
    if ok:
        assert reason is None
    else:
        assert reason == (f"NVIDIA A100-SXM4-80GB has compute capability {cc[0]}.{cc[1]}; impnb's "
                          "kernels need 9.0 (Hopper) or newer")


def test_old_gpu_falls_back_or_refuses(monkeypatch, capsys):
    monkeypatch.setattr(devices, "cuda_unavailable_reason", lambda: "NVIDIA A100 has compute capability 8.0")
    assert devices.engine_class("auto", "qwen3").device == "cpu"
    assert "compute capability 8.0" in capsys.readouterr().err
    with pytest.raises(DeviceError, match="compute capability 8.0"):
        devices.engine_class("cuda", "qwen3")


class InitDriver(FakeDriver):
    """FakeDriver whose cuInit succeeds or fails, noting the primary contexts retained."""

    def __init__(self, init_ok: bool):
        super().__init__((9, 0))
        self.init_ok, self.retained = init_ok, []

    def cuInit(self, flags):
        return (self.ok if self.init_ok else SimpleNamespace(name="CUDA_ERROR_NO_DEVICE"),)

    def cuDevicePrimaryCtxRetain(self, dev):
        self.retained.append(dev)
        return self.ok, "context"


@pytest.mark.parametrize("init_ok", [True, False])
def test_early_driver_start_retains_the_context_only_after_a_good_init(init_ok):
    driver = InitDriver(init_ok)
    cuda_support._retain_primary_context(driver, 1)
    assert driver.retained == ([1] if init_ok else [])


def test_auto_takes_the_cpu_for_head_dims_without_a_gpu_kernel(monkeypatch, capsys):
    """A model of a GPU architecture whose head dims no GPU attention kernel takes (gemma4's
    parity models: 16 and 32) runs on the CPU under auto, saying why; at 64 and up on the GPU."""
    from dataclasses import replace

    from impnb.models.config import ModelConfig

    monkeypatch.setattr(devices, "cuda_unavailable_reason", lambda: None)
    cfg = ModelConfig(arch="qwen3", n_layer=1, n_embd=64, n_head=2, n_head_kv=1, head_dim=32, head_dim_v=32,
                      n_ff=64, n_vocab=8, n_ctx=64, eps=1e-6, rope_base=1e4, rope_neox=True, n_rot=32,
                      attn_scale=1.0)
    assert devices.engine_class("auto", "qwen3", cfg).device == "cpu"
    assert "head dim 32" in capsys.readouterr().err
    assert devices.engine_class("auto", "qwen3", replace(cfg, head_dim=64, head_dim_v=64, n_rot=64)).device == "cuda"
