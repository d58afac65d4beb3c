"""cuBLAS through nvmath-python's bindings: the prefill GEMM fallbacks (dense and batched over MoE
tiles), bound to our stream."""

import numpy as np

# cudaDataType / cublasComputeType / cublasOperation values from the CUDA headers.
CUDA_R_32F, CUDA_R_16F = 0, 2
CUBLAS_COMPUTE_32F = 68
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20


class Cublas:
    """One handle and workspace, made at the first GEMM: importing nvmath and creating the handle
    take about half a second, which a model whose prefill takes no cuBLAS path never pays. Every
    engine runs a step eagerly before it captures it, so that first GEMM is never inside a capture
    (where neither the handle nor its workspace could be made)."""

    def __init__(self, ctx):
        self.ctx, self.lib, self.handle = ctx, None, 0
        self._alpha_beta = {b: (np.array([1.0], np.float32), np.array([b], np.float32)) for b in (0.0, 1.0)}

    def ready(self):
        """(the bindings module, the handle), made on the first call (a GEMM's, or a server's at
        load, whose GPU memory then settles before its first request)."""
        if not self.handle:
            from nvmath.bindings import cublas

            self.lib = cublas
            self.handle = cublas.create()
            cublas.set_stream(self.handle, self.ctx.handle)
            self.workspace = self.ctx.empty(WORKSPACE_BYTES, np.uint8)
            cublas.set_workspace(self.handle, self.workspace.device_ctypes_pointer.value, WORKSPACE_BYTES)
        return self.lib, self.handle

    def gemm_f16(self, a, w, c, accumulate: bool = False) -> None:
        """Row-major c (M, N) fp32 [+]= a (M, K) fp16 · w (N, K)ᵀ fp16, fp32 accumulation.

        In cuBLAS's column-major terms: cᵀ (N, M) = op_T(w) · a.
        """
        M, K = a.shape
        N = w.shape[0]
        assert w.shape == (N, K) and c.shape == (M, N), (a.shape, w.shape, c.shape)
        assert a.dtype == np.float16 and w.dtype == np.float16 and c.dtype == np.float32
        alpha, beta = self._alpha_beta[1.0 if accumulate else 0.0]
        lib, handle = self.ready()
        lib.gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K,
                         alpha.ctypes.data, _ptr(w), CUDA_R_16F, K, _ptr(a), CUDA_R_16F, K,
                         beta.ctypes.data, _ptr(c), CUDA_R_32F, N,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)

    def gemm_f16_batched(self, ptrs, N: int, M: int, K: int) -> None:
        """Row-major c_i (M, N) fp32 = a_i (M, K) fp16 · w_i (N, K)ᵀ fp16 for every batch entry i,
        fp32 accumulation; ptrs (3, batch) int64 on the device holds the addresses of (w_i, a_i,
        c_i) (kernels/moe/moe_batched.py writes them), so the batch's operands are chosen on the device.
        """
        batch = ptrs.shape[1]
        assert ptrs.shape == (3, batch) and ptrs.dtype == np.int64 and ptrs.is_c_contiguous()
        alpha, beta = self._alpha_beta[0.0]
        w, a, c = (_ptr(ptrs) + i * batch * 8 for i in range(3))
        lib, handle = self.ready()
        lib.gemm_batched_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K,
                                 alpha.ctypes.data, w, CUDA_R_16F, K, a, CUDA_R_16F, K,
                                 beta.ctypes.data, c, CUDA_R_32F, N, batch,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)

    def gemm_f32(self, a, w, c) -> None:
        """Row-major c (M, N) fp32 = a (M, K) fp32 · w (N, K)ᵀ fp32, fp32 arithmetic (no TF32)."""
        M, K = a.shape
        N = w.shape[0]
        assert w.shape == (N, K) and c.shape == (M, N), (a.shape, w.shape, c.shape)
        assert a.dtype == w.dtype == c.dtype == np.float32
        alpha, beta = self._alpha_beta[0.0]
        lib, handle = self.ready()
        lib.gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K,
                         alpha.ctypes.data, _ptr(w), CUDA_R_32F, K, _ptr(a), CUDA_R_32F, K,
                         beta.ctypes.data, _ptr(c), CUDA_R_32F, N,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)

    def close(self) -> None:
        if self.handle:
            self.lib.destroy(self.handle)
            self.handle = 0


def _ptr(array) -> int:
    return array.device_ctypes_pointer.value
