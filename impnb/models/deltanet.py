"""Gated DeltaNet, the linear-attention mixer of Qwen3-Next / Qwen3.5 hybrids: its numpy reference
(causal conv1d with a rolling state, the delta rule token by token and its chunked equal), the ops
the layer calls, and the layer graph (`gated_deltanet_block`, registered in layers.MIXERS).

Per token t and V head h, with its QK head's q, k L2-normalised and q scaled by dk^-1/2:
    S *= exp(g);  delta = (v - Sᵀ k) beta;  S += k deltaᵀ;  o = Sᵀ q
with g = ssm_a * softplus(a + ssm_dt.bias) (the file stores ssm_a = -exp(A_log)), beta = sigmoid(b),
S (Hv, dk, dv) float32, one a layer in the cache beside the attention layers' K/V. The output is
rms_norm(o) * ssm_norm * silu(z) per head, then ssm_out.
Legend: T tokens, C conv channels (Q, K, V), K conv kernel, Hk QK heads, Hv V heads, dk / dv head dims.
"""

import numpy as np

from impnb.models.config import DeltaNetShape, ModelConfig

L2_EPS = 1e-6  # inside the rsqrt of q's and k's L2 norms, as transformers' and fla's l2norm
CHUNK = 64     # tokens a chunk of the chunked delta rule holds


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) without exp's overflow for large |x|."""
    return np.float32(0.5) * (np.float32(1) + np.tanh(np.float32(0.5) * x))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0), x)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """x (..., d) / sqrt(sum(x²) + L2_EPS) over the last axis."""
    return x / np.sqrt(np.sum(np.square(x), axis=-1, keepdims=True) + np.float32(L2_EPS))


def causal_conv1d(x: np.ndarray, weight: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv then SiLU: x (T, C), weight (C, K), state (C, K-1) holding the K-1
    inputs before x (zeros at the start) -> (out (T, C), the new state (C, K-1))."""
    T, K = x.shape[0], weight.shape[1]
    window = np.concatenate([state.T, x])  # (K-1+T, C): input i is window[i + K-1]
    out = sum(window[j:j + T] * weight[:, j] for j in range(K))
    return silu(out.astype(np.float32)), np.ascontiguousarray(window[T:].T)


def delta_rule_recurrent(q, k, v, g, beta, state: np.ndarray) -> np.ndarray:
    """The gated delta rule token by token. q, k (T, Hv, dk) normalised (q scaled), v (T, Hv, dv),
    g, beta (T, Hv); state S (Hv, dk, dv) updated in place -> o (T, Hv, dv)."""
    out = np.empty(v.shape, np.float32)
    for t in range(q.shape[0]):
        state *= np.exp(g[t])[:, None, None]
        kv = np.einsum("hkv,hk->hv", state, k[t])  # Sᵀ k
        delta = (v[t] - kv) * beta[t][:, None]
        state += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", state, q[t])
    return out


def delta_rule_chunked(q, k, v, g, beta, state: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """delta_rule_recurrent in chunks of `chunk` tokens (the WY form that prefill kernels use): within a
    chunk the recurrence is one unit-lower-triangular solve, across chunks the state carries.
    Same arguments and result; state updated in place."""
    out = np.empty(v.shape, np.float32)
    for c0 in range(0, q.shape[0], chunk):
        sl = slice(c0, c0 + chunk)
        qc, kc, vc = (x[sl].transpose(1, 0, 2) for x in (q, k, v))  # (Hv, L, d)
        gc = np.cumsum(g[sl].T, axis=-1)                             # (Hv, L) decay from the chunk's start
        bc = beta[sl].T[:, :, None]                                  # (Hv, L, 1)
        L = qc.shape[1]
        lower = np.tril(np.ones((L, L), bool))
        decay = np.where(lower, np.exp(np.where(lower, gc[:, :, None] - gc[:, None, :], 0)), 0)
        # (I + strictly_lower(beta_i k_i·k_j decay_ij)) solves for the chunk's corrected values and keys
        system = np.eye(L) + np.tril((bc * kc) @ kc.transpose(0, 2, 1) * decay, -1)
        u = np.linalg.solve(system, bc * vc)                         # (Hv, L, dv)
        w = np.linalg.solve(system, bc * kc * np.exp(gc)[:, :, None])  # (Hv, L, dk)
        v_new = u - w @ state
        attn = (qc @ kc.transpose(0, 2, 1)) * decay                  # (Hv, L, L), causal with the diagonal
        o = (qc * np.exp(gc)[:, :, None]) @ state + attn @ v_new
        out[sl] = o.transpose(1, 0, 2)
        last = gc[:, -1:]
        state *= np.exp(last)[:, :, None]
        state += ((kc * np.exp(last - gc)[:, :, None]).transpose(0, 2, 1) @ v_new).astype(np.float32)
    return out


def expand_heads(x: np.ndarray, d: DeltaNetShape) -> np.ndarray:
    """QK heads (T, Hk, dk) -> one a V head (T, Hv, dk): tiled (h % Hk) or grouped (h // (Hv/Hk))."""
    r = d.n_v_heads // d.n_k_heads
    return np.tile(x, (1, r, 1)) if d.v_tiled else np.repeat(x, r, axis=1)


class DeltaNetOps:
    """The numpy ops a Gated DeltaNet layer calls, mixed into NumpyOps (self.w, self.cfg)."""

    def ssm_conv(self, x: np.ndarray, name: str, il: int, cache) -> np.ndarray:
        """silu(causal conv1d) of x (T, C) with the cache's rolling state of layer il."""
        out, cache.conv[il] = causal_conv1d(x, self.w[name], cache.conv[il])
        return out

    def delta_rule(self, q, k, v, a, b, prefix: str, il: int, cache) -> np.ndarray:
        """q, k (T, Hk, dk), v (T, Hv, dv), a, b (T, Hv) -> o (T, Hv, dv), the cache's state of
        layer il carried on. Chunked for a prompt, token by token for one token."""
        d = self.cfg.deltanet
        q = expand_heads(l2_normalize(q), d) * np.float32(d.head_k_dim ** -0.5)
        k = expand_heads(l2_normalize(k), d)
        g = self.w[prefix + "ssm_a"] * softplus(a + self.w[prefix + "ssm_dt.bias"])
        beta = sigmoid(b)
        rule = delta_rule_chunked if q.shape[0] > 1 else delta_rule_recurrent
        return rule(q, k, v, g.astype(np.float32), beta, cache.ssm[il])

    def gated_norm(self, o: np.ndarray, z: np.ndarray, name: str) -> np.ndarray:
        """rms_norm(o) * w * silu(z) per head: o, z (T, Hv, dv)."""
        return self.norm(o, name) * silu(z)


def split_qkvz(qkvz: np.ndarray, d: DeltaNetShape) -> tuple[np.ndarray, np.ndarray]:
    """ssm_in's output (T, Hk * (2 dk + 2 r dv)), [q, k, v, z] a QK head -> (Q, K, V (T, C), Z (T, Hv dv))
    as attn_qkv and attn_gate would give them (V and Z in grouped order)."""
    T, dk, r_dv = qkvz.shape[0], d.head_k_dim, d.n_v_heads // d.n_k_heads * d.head_v_dim
    heads = qkvz.reshape(T, d.n_k_heads, -1)
    q, k, v, z = np.split(heads, [dk, 2 * dk, 2 * dk + r_dv], axis=-1)
    return np.concatenate([x.reshape(T, -1) for x in (q, k, v)], axis=1), z.reshape(T, -1)


def gated_deltanet_block(ops, cfg: ModelConfig, il: int, h, pos: np.ndarray, cache):
    """Gated DeltaNet of normed h (T, D) -> (T, D), its conv and recurrent state in `cache`."""
    d, p, T = cfg.deltanet, f"blk.{il}.", h.shape[0]
    if d.fused_qkvz:
        qkv, z = split_qkvz(ops.linear(h, p + "ssm_in"), d)
    else:
        qkv, z = ops.linear(h, p + "attn_qkv"), ops.linear(h, p + "attn_gate")
    qkv = ops.ssm_conv(qkv, p + "ssm_conv1d", il, cache)  # (T, C)
    n_qk = d.n_k_heads * d.head_k_dim
    q = qkv[:, :n_qk].reshape(T, d.n_k_heads, d.head_k_dim)
    k = qkv[:, n_qk:2 * n_qk].reshape(T, d.n_k_heads, d.head_k_dim)
    v = qkv[:, 2 * n_qk:].reshape(T, d.n_v_heads, d.head_v_dim)
    if d.fused_ba:  # [b, a] a QK head, each Hv/Hk wide, in grouped V-head order
        ba = ops.linear(h, p + "ssm_ba").reshape(T, d.n_k_heads, 2, -1)
        b, a = ba[:, :, 0].reshape(T, -1), ba[:, :, 1].reshape(T, -1)
    else:
        b, a = ops.linear(h, p + "ssm_beta"), ops.linear(h, p + "ssm_alpha")
    o = ops.delta_rule(q, k, v, a, b, p, il, cache)
    z = z.reshape(T, d.n_v_heads, d.head_v_dim)
    return ops.linear(ops.gated_norm(o, z, p + "ssm_norm").reshape(T, -1), p + "ssm_out")
