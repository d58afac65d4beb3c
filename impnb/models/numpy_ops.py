"""The ops a layer graph calls, on the CPU in numpy float32: the reference backend."""

import numpy as np

from impnb.gguf_file import ModelFile
from impnb.kernels.attention.attention import attention_ref
from impnb.kernels.attention.reference import rope_ref
from impnb.kernels.elementwise.reference import geglu_ref, rms_norm_ref, swiglu_ref
from impnb.kernels.moe.reference import route_ref
from impnb.models.config import ModelConfig
from impnb.models.deltanet import DeltaNetOps, sigmoid
from impnb.models.kv_cache import KVCache

SCORES_BYTES = 64 << 20  # attention scores one query chunk holds


class NumpyOps(DeltaNetOps):
    """Weights dequantized to float32 once, by GGUF name; activations (T, ...) float32."""

    def __init__(self, mf: ModelFile, cfg: ModelConfig):
        self.cfg = cfg
        self.w = {name.removesuffix(".weight"): t.dequantize() for name, t in mf.tensors.items()}
        self.first_nonfinite = None  # the first norm whose input held NaN or inf, by name

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return self.w["token_embd"][tokens] * np.float32(self.cfg.embed_scale)

    def add(self, x: np.ndarray, h: np.ndarray) -> np.ndarray:
        """The residual update x + h."""
        return x + h

    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        """x (T, K) @ W(name) (N, K)ᵀ -> (T, N)."""
        return x @ self.w[name].T

    def norm(self, x: np.ndarray, name: str) -> np.ndarray:
        if self.first_nonfinite is None and not np.isfinite(x).all():
            self.first_nonfinite = name
        return rms_norm_ref(x, self.w[name], self.cfg.eps)

    def rope(self, x: np.ndarray, pos: np.ndarray, il: int) -> np.ndarray:
        cfg = self.cfg
        return rope_ref(x, pos, cfg.rope_base_for(il), cfg.rope_neox, cfg.n_rot)

    def attention(self, q, k, v, pos: np.ndarray, il: int, cache: KVCache) -> np.ndarray:
        """q (T, H, D), k/v (T, Hkv, D) at positions `pos` -> (T, H * Dv), K/V cached."""
        k_all, v_all = cache.store(il, int(pos[0]), k, v)
        return self.attend(q, k_all, v_all, pos, il)

    def attend(self, q, k_all, v_all, pos: np.ndarray, il: int) -> np.ndarray:
        """q (T, H, D) at positions `pos` over cached k/v (S, Hkv, D) -> (T, H * Dv)."""
        # queries in chunks, so that a chunk's float64 scores (H, rows, S) stay near SCORES_BYTES
        rows = max(1, SCORES_BYTES // (8 * q.shape[1] * k_all.shape[0]))
        out = np.concatenate([attention_ref(q[t:t + rows], k_all, v_all, pos[t:t + rows],
                                            self.cfg.attn_scale, self.cfg.window(il))
                              for t in range(0, q.shape[0], rows)])
        return out.reshape(q.shape[0], -1)

    def sigmoid_gate(self, x: np.ndarray, gate: np.ndarray) -> np.ndarray:
        """x * sigmoid(gate): gated attention's output, the shared expert's gate."""
        return x * sigmoid(gate)

    def gated_act(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return swiglu_ref(gate, up) if self.cfg.act == "silu" else geglu_ref(gate, up)

    def moe(self, x: np.ndarray, prefix: str) -> np.ndarray:
        """Routed expert FFN over stacked `ffn_*_exps` weights: x (T, D) -> (T, D)."""
        cfg = self.cfg
        experts, weights = route_ref(self.linear(x, prefix + "ffn_gate_inp"),
                                     cfg.n_expert_used, cfg.expert_weights_norm)
        gate, up, down = (self.w[prefix + n] for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"))
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            for e, wt in zip(experts[t], weights[t]):
                h = self.gated_act(self.expert(gate[e], x[t]), self.expert(up[e], x[t]))
                out[t] += wt * self.expert(down[e], h)
        return out

    def expert(self, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """One expert matrix w (N, K) times one token's x (K,) -> (N,)."""
        return w @ x

    def output(self, x: np.ndarray) -> np.ndarray:
        """Final norm and logits (T, n_vocab); tied to token_embd when `output` is absent."""
        x = self.norm(x, "output_norm")
        return self.linear(x, "output" if "output" in self.w else "token_embd")
