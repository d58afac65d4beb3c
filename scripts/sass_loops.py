"""The SASS of a kernel module's builds, no GPU needed: for each (kernel, signature) of the module's
build_signatures() (the build checks' list), its registers and, for every loop (a backward branch),
its instructions by opcode, so a change to a kernel's inner loop can be counted before a GPU run.

    python scripts/sass_loops.py impnb.kernels.gemv.gemv_dp4a_multi [--only 3,5] [--dump DIR]

The PTX is linked for sm_90 by nvJitLink and disassembled by cuobjdump: CUOBJDUMP names it, else the
CUDA toolkit's ($CUDA_HOME/bin) or the one in the nvidia-cuda-cuobjdump wheel
(`pip install nvidia-cuda-cuobjdump`).
"""

import argparse
import collections
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))


def cuobjdump() -> str:
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found:
        home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "cuobjdump"
        found = str(home) if home.exists() else None
    if not found:
        try:
            import nvidia.cu13
            found = str(Path(nvidia.cu13.__path__[0]) / "bin" / "cuobjdump")
        except ImportError:
            pass
    if not found or not Path(found).exists():
        raise SystemExit("sass_loops: no cuobjdump (set CUOBJDUMP, or pip install nvidia-cuda-cuobjdump)")
    return found


def cubin(ptx: str) -> bytes:
    from cuda.bindings import nvjitlink as nj

    data = ptx.encode()
    h = nj.create(2, ["-arch=sm_90", "-O3"])
    try:
        nj.add_data(h, nj.InputType.PTX, data, len(data), "kernel")
        nj.complete(h)
        out = bytearray(nj.get_linked_cubin_size(h))
        nj.get_linked_cubin(h, out)
    finally:
        nj.destroy(h)
    return bytes(out)


def instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction) of each line of cuobjdump -sass."""
    return [(int(m.group(1), 16), m.group(2).strip())
            for line in sass.splitlines() if (m := re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line))]


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def loops(ins: list[tuple[int, str]]) -> list[dict]:
    """Each backward branch's body (its target to the branch): length and opcode counts."""
    at = {a: i for i, (a, _) in enumerate(ins)}
    out = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if m and (target := int(m.group(1), 16)) < a and target in at:
            body = ins[at[target]:i + 1]
            out.append({"from": target, "to": a, "n": len(body),
                        "ops": collections.Counter(opcode(t) for _, t in body)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("module", help="a kernel module with build_signatures()")
    ap.add_argument("--only", help="indices into build_signatures(), comma-separated")
    ap.add_argument("--dump", help="a folder for each build's SASS")
    args = ap.parse_args()
    from numba import cuda

    from impnb.kernels.common.build_info import runtime_info

    builds = importlib.import_module(args.module).build_signatures()
    tool = cuobjdump()
    picks = [int(i) for i in args.only.split(",")] if args.only else range(len(builds))
    for i in picks:
        kernel, sig, _ = builds[i]
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        info = runtime_info(kernel, sig)
        path = Path(args.dump or "/tmp") / f"sass_loops_{i}.cubin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(cubin(ptx))
        sass = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
        if args.dump:
            path.with_suffix(".sass").write_text(sass)
        ins = instructions(sass)
        print(f"[{i}] {kernel.py_func.__name__}: {info.registers} registers, {info.spill_bytes} spill bytes, "
              f"{len(ins)} instructions")
        for lp in loops(ins):
            top = ", ".join(f"{k} {v}" for k, v in lp["ops"].most_common(10))
            print(f"    loop {lp['from']:#x}-{lp['to']:#x}: {lp['n']} ({top})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
