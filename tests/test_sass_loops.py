"""scripts/sass_loops.py's reading of cuobjdump's SASS: instructions, predicated opcodes, loops."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

import sass_loops  # noqa: E402

SASS = """\
        Function : kernel
        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                          /* 0x0000000000007919 */
        /*0020*/                   IDP.4A.U8.S8 R5, R6, R7, R5 ;               /* 0x0000000706057226 */
        /*0030*/                   LOP3.LUT R6, R6, 0xf0f0f0f, RZ, 0xc0, !PT ; /* 0x0f0f0f0f06067812 */
        /*0040*/                   IDP.4A.U8.S8 R5, R6, R8, R5 ;               /* 0x0000000806057226 */
        /*0050*/               @P0 BRA 0x20 ;                                  /* 0xfffffffc00c40947 */
        /*0060*/              @!P1 BRA 0x90 ;                                  /* 0x0000000000089947 */
        /*0070*/                   EXIT ;                                      /* 0x000000000000794d */
"""


def test_instructions_and_loops():
    ins = sass_loops.instructions(SASS)
    assert [a for a, _ in ins] == list(range(0, 0x80, 0x10))
    assert sass_loops.opcode(ins[5][1]) == "BRA" and sass_loops.opcode(ins[2][1]) == "IDP"
    (loop,) = sass_loops.loops(ins)  # the forward branch is no loop
    assert (loop["from"], loop["to"], loop["n"]) == (0x20, 0x50, 4)
    assert loop["ops"] == {"IDP": 2, "LOP3": 1, "BRA": 1}
