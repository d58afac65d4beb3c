"""The penalties on the GPU (repetition, presence, frequency: llama.cpp's), in place on the logits
before sampling, and the ring of recent ids they read (numpy twin: impnb.sampling.apply_penalties).

  repeat_penalty(logits, history, params, stream)   # history (B, H) int32 ring, -1 = empty
  push_history(out_ids, step, history, stream)      # history[b, step % H] = out_ids[b]

params: sample.sample_params rows (column 4 the repetition penalty, 7 presence, 8 frequency).
"""

import numpy as np
from numba import cuda, float32, float64, int32, void

from impnb.kernels.sample.sample import NPARAM
from impnb.kernels.sample.sample_select import NT, check_logits, check_rows, row_step
from impnb.launch import launch


@cuda.jit
def _penalty_kernel(logits, history, params):
    """grid (B,), block NT. Row b: each distinct id in [0, V) of the ring history[b] (-1 = empty)
    gets logit / penalty if positive, else logit * penalty, in float32, then loses count x
    frequency + presence, in float64 rounded once (apply_penalties). The thread of an id's first
    place in the ring counts it and writes it."""
    b = cuda.blockIdx.x
    pen = np.float32(params[b, 4])
    presence = params[b, 7]
    frequency = params[b, 8]
    if pen == 1 and presence == 0 and frequency == 0:
        return
    H = history.shape[1]
    for j in range(cuda.threadIdx.x, H, NT):
        tok = history[b, j]
        if 0 <= tok < logits.shape[1]:
            first = True
            count = 0
            for q in range(H):
                if history[b, q] == tok:
                    count += 1
                    if q < j:
                        first = False
            if first:
                x = logits[b, tok]
                x = x / pen if x > 0 else x * pen
                if presence != 0 or frequency != 0:
                    x = float32(float64(x) - (float64(count) * frequency + presence))
                logits[b, tok] = x


@cuda.jit
def _push_kernel(ids, step, history):
    """grid ceil(B / 32), block 32: history[b, step % H] = ids[b]."""
    b = cuda.grid(1)
    if b < ids.shape[0]:
        history[b, row_step(step, b) % history.shape[1]] = ids[b]

def repeat_penalty(logits, history, params, stream):
    """In place: logits (B, V) float32 penalized by the ids in history (B, H) int32 (-1 = empty)
    with params[:, 4], [:, 7] and [:, 8]; rows without a penalty are untouched."""
    check_logits(logits)
    B = logits.shape[0]
    assert history.dtype == np.int32 and history.ndim == 2 and history.shape[0] == B
    assert history.is_c_contiguous()
    check_rows("params", params, np.float64, (B, NPARAM))
    launch(_penalty_kernel, B, NT, stream, logits, history, params)


def push_history(ids, step, history, stream):
    """history[b, step % H] = ids[b]: ids (B,) int32, step int32 (1,) or (B,), history (B, H)."""
    B = ids.shape[0]
    check_rows("ids", ids, np.int32, (B,))
    assert step.dtype == np.int32 and step.shape in ((1,), (B,))
    check_rows("history", history, np.int32, (B, history.shape[1]))
    launch(_push_kernel, (B + 31) // 32, 32, stream, ids, step, history)

_f32_2d, _i32_2d, _f64_2d = float32[:, ::1], int32[:, ::1], float64[:, ::1]


def build_signatures() -> list:
    """(kernel, signature, checks) the build checks compile (tests/test_kernel_build.py); the
    kernels are made here, not at import."""
    return [
        (_penalty_kernel, void(_f32_2d, _i32_2d, _f64_2d), {}),
        (_push_kernel, void(int32[::1], int32[::1], _i32_2d), {}),
    ]
