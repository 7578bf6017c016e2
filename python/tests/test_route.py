"""Tests of ovl._route, the rules by which ovl.torch.install() takes a call
of PyTorch's symm_mem fused ops or hands it to PyTorch's own kernel, and
the install state: pure Python, no torch, so that CI checks them where
torch is not installed (test_torch_install.py checks the torch side where
it is).

Run by ctest (tests/CMakeLists.txt: test_python_route) in scripts/test's
venv; by hand:
    OVL_LIBRARY=build/client/libovl.so.1 PYTHONPATH=python python3 python/tests/test_route.py
"""
import logging
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OVL_SOURCE_DIR", os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))

from ovl import _route  # noqa: E402
from ovltest import run_tests  # noqa: E402

CUDA2 = ["cuda", "cuda"]
BF2 = ["bfloat16", "bfloat16"]


def test_ag_taken():
    for gd in (0, 1):
        assert _route.why_not_ag(CUDA2, BF2, [8, 64, 32], [[32, 16]], gd) is None, gd
    assert _route.why_not_ag(["cuda"] * 9, ["float16"] * 9, [64, 32], [[32, 16]] * 8, 0) is None
    assert _route.why_not_ag(CUDA2, ["float32"] * 2, [64, 32], [[32, 1]], 0) is None


def test_ag_refused():
    cases = [
        (["cuda", "cpu"], BF2, [64, 32], [[32, 16]], 0, "a tensor on a cpu device"),
        (CUDA2, ["float8_e4m3fn"] * 2, [64, 32], [[32, 16]], 0, "dtype float8_e4m3fn"),
        (CUDA2, ["bfloat16", "float32"], [64, 32], [[32, 16]], 0, "mixed dtypes"),
        (CUDA2, BF2, [64], [[64, 16]], 0, "A_shard of 1 dimension"),
        (CUDA2, BF2, [64, 32], [[32, 16]], 2, "gather_dim 2 out of range"),
        (CUDA2, BF2, [64, 32], [[32, 16]], -3, "gather_dim -3 out of range"),
        (CUDA2, BF2, [8, 64, 32], [[32, 16]], -2, "gather_dim -2 out of range (PyTorch's"),
        (CUDA2, BF2, [8, 64, 32], [[32, 16]], 2, "gather_dim is A's last"),
        (CUDA2, BF2, [8, 0, 32], [[32, 16]], 0, "an empty tensor"),
        (CUDA2, BF2, [8, 64, 32], [[32, 0]], 0, "an empty tensor"),
        (["cuda"], ["bfloat16"], [64, 32], [], 0, "0 Bs"),
        (["cuda"] * 10, ["bfloat16"] * 10, [64, 32], [[32, 16]] * 9, 0, "9 Bs"),
        (CUDA2, BF2, [64, 32], [[31, 16]], 0, "Bs[0] of shape (31, 16)"),
        (CUDA2, BF2, [64, 32], [[32, 16, 1]], 0, "Bs[0] of shape (32, 16, 1)"),
    ]
    for dev, dt, a, bs, gd, words in cases:
        why = _route.why_not_ag(dev, dt, a, bs, gd)
        assert why is not None and words in why, (dev, dt, a, bs, gd, why)


def test_rs_rules():
    ok = [([8, 64, 32], [32, 16], "sum", 0, 2), ([8, 64, 32], [32, 16], "avg", 1, 4),
          ([8, 64, 32], [32, 16], "sum", 2, 2), ([8, 64, 32], [32, 16], "sum", 2, 16),
          ([6, 32], [32, 9], "sum", 0, 3)]
    for a, b, red, sd, w in ok:
        assert _route.why_not_rs(CUDA2, BF2, a, b, red, sd, w) is None, (a, b, red, sd, w)
    bad = [
        (CUDA2, BF2, [8, 64, 32], [32, 16], "max", 0, 2, "reduce_op 'max'"),
        (CUDA2, BF2, [8, 64, 32], [31, 16], "sum", 0, 2, "does not fit A's 32 columns"),
        (CUDA2, BF2, [8, 64, 32], [32, 16], "sum", 3, 2, "scatter_dim 3 out of range"),
        (CUDA2, BF2, [8, 64, 32], [32, 16], "sum", -1, 2, "scatter_dim -1 out of range"),
        (CUDA2, BF2, [0, 64, 32], [32, 16], "sum", 1, 2, "an empty tensor"),
        (CUDA2, BF2, [9, 64, 32], [32, 16], "sum", 0, 2, "(9) is not a multiple of the world 2"),
        (CUDA2, BF2, [8, 64, 32], [32, 18], "sum", 2, 4, "(18) is not a multiple of the world 4"),
        (CUDA2, BF2, [32], [32, 16], "sum", 0, 2, "A of 1 dimension"),
        (["cpu", "cpu"], ["float32"] * 2, [8, 32], [32, 16], "sum", 0, 2, "cpu device"),
        (CUDA2, ["float64"] * 2, [8, 32], [32, 16], "sum", 0, 2, "dtype float64"),
    ]
    for dev, dt, a, b, red, sd, w, words in bad:
        why = _route.why_not_rs(dev, dt, a, b, red, sd, w)
        assert why is not None and words in why, (a, b, red, sd, w, why)


E4, E5, F32 = "float8_e4m3fn", "float8_e5m2", "float32"


def sag(**kw):
    """why_not_scaled_ag of a call ovl takes (world 2, A_shard 8 x 64 x 32
    gathered along 0, two column-major Bs 32 x 16 and 32 x 48, row-wise
    scales), with kw changed."""
    args = dict(devices=["cuda"] * 6, a_dtype=E4, b_dtypes=[E4, E5], a_shape=[8, 64, 32],
                b_shapes=[[32, 16], [32, 48]], b_strides=[[1, 32], [1, 32]],
                a_scale=([8, 64, 1], F32), b_scales=[([1, 16], F32), ([1, 48], F32)],
                gather_dim=0, biases=[None, ([48], "float32")], result_scales=[False, False],
                out_dtypes=["bfloat16", "float32"], use_fast_accum=[False, True], world=2)
    args.update(kw)
    return _route.why_not_scaled_ag(**args)


def srs(**kw):
    """why_not_scaled_rs of a call ovl takes (world 2, A 8 x 64 x 32,
    output 8 x 64 x 16 scattered along 1, B 32 x 16 column-major)."""
    args = dict(devices=["cuda"] * 4, a_dtype=E4, b_dtype=E4, a_shape=[8, 64, 32],
                b_shape=[32, 16], b_stride=[1, 32], a_scale=([8, 64, 1], F32),
                b_scale=([1, 16], F32), reduce_op="sum", orig_scatter_dim=1,
                scatter_dim_after_maybe_reshape=1, output_shape=[8, 64, 16], bias=None,
                result_scale=False, out_dtype="bfloat16", world=2)
    args.update(kw)
    return _route.why_not_scaled_rs(**args)


def test_scaled_ag_rules():
    assert sag() is None
    # every scale mode PyTorch reads: one scale (0-d, (1,), (1, 1)), this
    # rank's rows, every rank's rows (replicated); gather_dim 1
    for shape in ([], [1], [1, 1], [8, 64, 1], [16, 64, 1]):
        assert sag(a_scale=(shape, F32)) is None, shape
    assert sag(gather_dim=1, a_scale=([8, 128, 1], F32)) is None
    assert sag(b_scales=[([], F32), ([1, 1], F32)]) is None
    assert sag(out_dtypes=["float16", "bfloat16"], biases=[None, None]) is None
    assert sag(b_dtypes=[E4], b_shapes=[[32, 16]], b_strides=[[1, 40]], b_scales=[([1], F32)],
               biases=[([16], "bfloat16")], result_scales=[False], out_dtypes=["bfloat16"],
               use_fast_accum=[True]) is None
    assert sag(a_dtype=E5, b_dtypes=[E4, E4]) is None
    cases = [
        (dict(devices=["cuda"] * 5 + ["cpu"]), "a tensor on a cpu device"),
        (dict(a_dtype="bfloat16"), "A of dtype bfloat16 (ovl's scaled ops take float8_e4m3fn"),
        (dict(b_dtypes=[E4, "float8_e4m3fnuz"]), "Bs[1] of dtype float8_e4m3fnuz"),
        (dict(a_dtype=E5, b_dtypes=[E4, E5]), "float8_e5m2 times float8_e5m2"),
        (dict(b_shapes=[], b_strides=[], b_scales=[], biases=[], result_scales=[],
              out_dtypes=[], use_fast_accum=[]), "0 Bs"),
        (dict(b_scales=[([1, 16], F32)]), "1 B_scales for 2 Bs"),
        (dict(biases=[None]), "1 biases for 2 Bs"),
        (dict(result_scales=[False]), "1 result_scales for 2 Bs"),
        (dict(out_dtypes=["bfloat16"]), "1 out_dtypes for 2 Bs"),
        (dict(use_fast_accum=[True]), "1 use_fast_accum for 2 Bs"),
        (dict(a_shape=[32]), "A_shard of 1 dimension"),
        (dict(gather_dim=3), "gather_dim 3 out of range"),
        (dict(gather_dim=-1), "gather_dim -1 out of range"),
        (dict(gather_dim=2), "gather_dim is A's last"),
        (dict(a_shape=[8, 0, 32]), "an empty tensor"),
        (dict(b_shapes=[[32, 16], [31, 48]]), "Bs[1] of shape (31, 48) does not fit"),
        (dict(b_strides=[[16, 1], [1, 32]]), "Bs[0] is not column-major"),
        (dict(b_strides=[[16, 1], [1, 32]]), "cuBLASLt's fp8 GEMM and PyTorch's _scaled_mm"),
        (dict(a_shape=[8, 64, 24], b_shapes=[[24, 16], [24, 48]], b_strides=[[1, 24], [1, 24]]),
         "K 24 or N 16 of Bs[0] not a multiple of 16"),
        (dict(b_shapes=[[32, 16], [32, 40]], b_scales=[([1, 16], F32), ([1, 40], F32)],
              biases=[None, ([40], F32)]), "K 32 or N 40 of Bs[1]"),
        (dict(out_dtypes=[None, "float32"]), "out_dtypes[0] is None: the output in A's fp8"),
        (dict(out_dtypes=["bfloat16", E4]), "out_dtypes[1] float8_e4m3fn (ovl's scaled ops "
                                            "write"),
        (dict(result_scales=[True, False]), "a result_scale"),
        (dict(b_scales=[([1, 16], "float8_e8m0fnu"), ([1, 48], F32)]),
         "B_scales[0] of dtype float8_e8m0fnu"),
        (dict(b_scales=[([2, 1], F32), ([1, 48], F32)]), "B_scales[0] of shape (2, 1)"),
        (dict(b_scales=[([16], F32), ([1, 48], F32)]), "neither tensor-wise"),
        (dict(biases=[None, ([48], "bfloat16")]), "biases[1] of dtype bfloat16, the output's is "
                                                 "float32"),
        (dict(biases=[([1, 16], "bfloat16"), None]), "biases[0] of shape (1, 16)"),
        (dict(a_scale=([8, 64, 1], "bfloat16")), "A_scale of dtype bfloat16 (ovl takes float32"),
        (dict(a_scale=([8, 64, 2], F32)), "A_scale of shape (8, 64, 2): block-wise scales of "
                                            "this rank's rows only"),
        (dict(a_scale=([8, 1], F32)), "A_scale of shape (8, 1) fits neither"),
        (dict(a_scale=([64, 1], F32)), "fits neither"),
    ]
    for kw, words in cases:
        why = sag(**kw)
        assert why is not None and words in why, (kw, why)


def test_scaled_ag_scale_mode():
    m = _route.ag_scale_mode
    assert m([8, 64, 32], [8, 64, 1], 0, 2) == "row-sharded"
    assert m([8, 64, 32], [16, 64, 1], 0, 2) == "row-replicated"
    assert m([8, 64, 32], [8, 128, 1], 1, 2) == "row-replicated"
    assert m([8, 64, 32], [], 0, 2) == "tensor" and m([8, 64, 32], [1, 1], 0, 2) == "tensor"
    # block-wise: every rank's rows (PyTorch's replicated reading) or this
    # rank's alone (which PyTorch's kernels raise for)
    assert m([8, 64, 256], [16, 64, 2], 0, 2) == "block-replicated"
    assert m([8, 64, 256], [8, 128, 2], 1, 2) == "block-replicated"
    assert m([8, 64, 32], [8, 64, 4], 0, 2) == "block-sharded"
    assert m([8, 64, 32], [8, 1], 0, 2) is None
    # world 1: the shard's shape and the gathered one's are one: sharded
    # (row-wise), replicated (block-wise), as PyTorch reads them
    assert m([8, 32], [8, 1], 0, 1) == "row-sharded"
    assert m([8, 256], [8, 2], 0, 1) == "block-replicated"
    r = _route.ag_scale_refusal
    assert r([8, 64, 256], [16, 64, 2], 0, 2) is None and r([8, 256], [8, 1], 0, 2) is None
    assert r([8, 64, 32], [8, 64, 4], 0, 2) == (
        "Invalid scale shape for fp8 all-gather (shard shape: (8, 64, 32), scale shape: (8, 64, "
        "4)); block-wise scales of A_shard's rows alone are not taken: give those of every "
        "rank's rows (the gathered A's leading dimensions, then ceil(K/128)), as PyTorch reads "
        "them")
    assert "128x128 blocks of A (PyTorch's BlockWise128x128), which ovl does not take: it cuts " \
        "A by rows" in r([200, 256], [4, 2], 0, 2)
    assert r([200, 256], [5, 2], 0, 2) == ("Invalid scale shape for fp8 all-gather (shard "
                                           "shape: (200, 256), scale shape: (5, 2))")


def test_scaled_block_modes():
    """B's scales as PyTorch's _scaled_mm takes them (scale_b for B K x N)
    read as ovl's modes; block-wise scales taken in the pairs ovl takes, A's
    rows and B's N in fours with 1x128, never A by 128x128 nor block-wise
    with tensor- or row-wise scales."""
    b = _route.b_scale_mode
    assert b([], 16, 256) == "tensor" and b([1, 1], 16, 256) == "tensor"
    assert b([1, 16], 16, 256) == "row" and b([1, 16], 16, 128) == "row"
    assert b([2, 16], 16, 256) == "1x128" and b([3, 16], 16, 257) == "1x128"
    assert b([2, 1], 16, 256) == "128x128" and b([2, 3], 272, 256) == "128x128"
    assert b([1, 3], 272, 100) == "128x128"  # K of one block: only the tiles tell
    assert b([2, 16], 16, 384) is None and b([16, 2], 16, 256) is None
    blk = dict(a_shape=[8, 64, 256], b_shapes=[[256, 16], [256, 144]],
               b_strides=[[1, 256], [1, 256]], a_scale=([16, 64, 2], F32),
               b_scales=[([2, 16], F32), ([2, 2], F32)], biases=[None, ([144], "float32")])
    assert sag(**blk) is None  # A 1x128 with B 1x128 and with B 128x128
    assert sag(**dict(blk, gather_dim=1, a_scale=([8, 128, 2], F32))) is None
    # K of one block: A's row-wise scales are its 1x128 ones with 128x128 Bs
    one = dict(a_shape=[8, 64, 128], b_shapes=[[128, 16], [128, 144]],
               b_strides=[[1, 128], [1, 128]], b_scales=[([1, 1], F32), ([1, 2], F32)],
               biases=[None, ([144], "float32")])
    assert sag(**one) is None
    ab = dict(a_shape=[8, 64, 256], b_shape=[256, 16], b_stride=[1, 256],
              a_scale=([8, 64, 2], F32), b_scale=([2, 16], F32))
    assert srs(**ab) is None
    assert srs(**dict(ab, b_shape=[256, 144], b_scale=([2, 2], F32), bias=([144], "bfloat16"),
                      output_shape=[8, 64, 144])) is None
    assert srs(**dict(ab, a_shape=[512, 256], a_scale=([512, 2], F32),
                      scatter_dim_after_maybe_reshape=0)) is None
    mixing = "block-wise scales on one operand only (ovl's scaled GEMM, as cuBLASLt's"
    cases = [
        (sag(**dict(blk, b_scales=[([1, 16], F32), ([2, 2], F32)])),
         "A_scale block-wise 1x128 and B_scales[0] row-wise: " + mixing),
        (sag(**dict(blk, a_scale=([], F32))),
         "A_scale tensor-wise and B_scales[0] block-wise 1x128: " + mixing),
        (sag(**dict(blk, a_scale=([16, 64, 3], F32))),
         "its last dimension (3) is neither 1 (row-wise) nor ceil(K/128) = 2"),
        (sag(**dict(blk, a_scale=([8, 64, 2], F32))), "block-wise scales of this rank's rows "
                                                      "only (A_shard's leading dimensions)"),
        (sag(**dict(blk, a_shape=[3, 3, 256], a_scale=([6, 3, 2], F32))),
         "A_scale 1x128 with this rank's A_shard of 9 rows, not a multiple of 4"),
        (sag(**dict(blk, b_scales=[([2, 15], F32), ([2, 2], F32)])),
         "B_scales[0] of shape (2, 15): neither tensor-wise (1 element), row-wise ((1, 16)) "
         "nor block-wise (1x128: (2, 16); 128x128: (2, 1))"),
        (sag(**dict(blk, a_shape=[200, 256], a_scale=([4, 2], F32))),
         "A_scale of shape (4, 2): 128x128 blocks of A (PyTorch's BlockWise128x128), which ovl "
         "does not take: it cuts A by rows"),
        (srs(**dict(ab, a_scale=([], F32))), "A_scale tensor-wise and B_scale block-wise "
                                              "1x128: " + mixing),
        (srs(**dict(ab, b_scale=([1, 16], F32))), "A_scale block-wise 1x128 and B_scale "
                                                  "row-wise"),
        (srs(**dict(ab, a_scale=([8, 64, 3], F32))), "its last dimension (3) is neither 1"),
        (srs(**dict(ab, a_shape=[200, 256], a_scale=([2, 2], F32), output_shape=[200, 16],
                    orig_scatter_dim=0, scatter_dim_after_maybe_reshape=0)),
         "A_scale of shape (2, 2): 128x128 blocks of A"),
    ]
    for why, words in cases:
        assert why is not None and words in why, (words, why)
    # the reduce-scatter's rows in fours are each rank's block of the output:
    # 4 x 6 over 2 ranks (12 rows), over 3 (8 rows) taken; 2 x 6 over 2 (6) not
    three = dict(ab, a_shape=[4, 6, 256], a_scale=([4, 6, 2], F32), output_shape=[4, 6, 16])
    assert srs(**dict(three, orig_scatter_dim=0, scatter_dim_after_maybe_reshape=0)) is None
    assert srs(**dict(three, world=3)) is None
    why = srs(**dict(ab, a_shape=[2, 6, 256], a_scale=([2, 6, 2], F32), output_shape=[2, 6, 16],
                     orig_scatter_dim=0, scatter_dim_after_maybe_reshape=0))
    assert why is not None and "A_scale 1x128 with each rank's block of the output of 6 rows, " \
        "not a multiple of 4" in why, why


def test_scaled_rs_rules():
    assert srs() is None
    assert srs(a_scale=([], F32), b_scale=([1], F32)) is None
    assert srs(reduce_op="avg", bias=([16], "bfloat16")) is None
    # A flattened to 2-D by Inductor, the output 3-D: scattered along 0 or 1
    assert srs(a_shape=[512, 32], a_scale=([512, 1], F32), scatter_dim_after_maybe_reshape=0,
               orig_scatter_dim=0) is None
    assert srs(a_shape=[512, 32], a_scale=([512, 1], F32), scatter_dim_after_maybe_reshape=0) \
        is None
    assert srs(out_dtype="float32", bias=([16], "float32"), a_dtype=E5) is None
    cases = [
        (dict(devices=["cuda", "cpu", "cuda", "cuda"]), "a tensor on a cpu device"),
        (dict(b_dtype="bfloat16"), "B of dtype bfloat16"),
        (dict(a_dtype=E5, b_dtype=E5), "float8_e5m2 times float8_e5m2"),
        (dict(a_shape=[32]), "A of 1 dimension"),
        (dict(b_shape=[31, 16]), "B of shape (31, 16) does not fit A's 32 columns"),
        (dict(b_stride=[16, 1]), "B is not column-major"),
        (dict(b_shape=[32, 8], b_scale=([1, 8], F32), output_shape=[8, 64, 8]),
         "K 32 or N 8 of B not a multiple of 16"),
        (dict(reduce_op="max"), "reduce_op 'max'"),
        (dict(output_shape=None), "output_shape None"),
        (dict(output_shape=[8, 32, 16]), "output_shape (8, 32, 16) does not hold A's 512 rows"),
        (dict(output_shape=[512]), "does not hold"),
        (dict(orig_scatter_dim=3), "orig_scatter_dim 3 out of range"),
        (dict(scatter_dim_after_maybe_reshape=-1), "scatter_dim_after_maybe_reshape -1 out of"),
        (dict(a_shape=[8, 0, 32], a_scale=([8, 0, 1], F32), output_shape=[8, 0, 16]),
         "an empty tensor"),
        (dict(orig_scatter_dim=2), "orig_scatter_dim is the output's last"),
        (dict(orig_scatter_dim=0, output_shape=[9, 64, 16], a_shape=[9, 64, 32],
              a_scale=([9, 64, 1], F32)), "(9) is not a multiple of the world 2"),
        (dict(out_dtype=None), "out_dtype is None: the output in A's fp8 dtype"),
        (dict(out_dtype=E5), "out_dtype float8_e5m2"),
        (dict(result_scale=True), "a result_scale"),
        (dict(b_scale=([16], F32)), "B_scale of shape (16,)"),
        (dict(b_scale=([1, 16], "float8_e8m0fnu")), "B_scale of dtype float8_e8m0fnu"),
        (dict(bias=([16], "float32")), "bias of dtype float32, the output's is bfloat16"),
        (dict(bias=([8], "bfloat16")), "bias of shape (8,)"),
        (dict(a_scale=([8, 64, 1], "float16")), "A_scale of dtype float16"),
        (dict(a_scale=([8, 64, 2], F32)), "A_scale of shape (8, 64, 2): its last dimension "
                                          "(2) is neither 1 (row-wise) nor ceil(K/128) = 1 "
                                          "(block-wise 1x128"),
        (dict(a_scale=([512, 1], F32)), "A_scale of shape (512, 1) fits neither"),
    ]
    for kw, words in cases:
        why = srs(**kw)
        assert why is not None and words in why, (kw, why)


def test_router_words():
    """A Router for torch.ops.ovl's scaled ops says its own namespace, what
    runs the call and where it is counted."""
    log = logging.getLogger("ovl.test_route.words")
    h = _Records()
    log.addHandler(h)
    log.propagate = False
    r = _route.Router(log=log, namespace="ovl", kernel="PyTorch's unfused fallback",
                      counter="op_stats")
    r.fell_back("fused_all_gather_scaled_matmul", "out_dtypes[0] is None")
    r.fell_back("fused_all_gather_scaled_matmul", "out_dtypes[0] is None")
    assert h.msgs == ["ovl.torch: ovl.fused_all_gather_scaled_matmul runs PyTorch's unfused "
                      "fallback: out_dtypes[0] is None (said once; ovl.torch.op_stats() counts "
                      "the calls)"], h.msgs
    assert r.stats()["fell_back"] == {"fused_all_gather_scaled_matmul: out_dtypes[0] is None": 2}


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.msgs = []

    def emit(self, record):
        self.msgs.append(record.getMessage())


def test_router_says_once():
    log = logging.getLogger("ovl.test_route")
    h = _Records()
    log.addHandler(h)
    log.propagate = False
    r = _route.Router(log=log)
    for _ in range(3):
        r.fell_back("fused_all_gather_matmul", "dtype float64")
    r.fell_back("fused_matmul_reduce_scatter", "dtype float64")
    r.took("fused_all_gather_matmul")
    assert len(h.msgs) == 2, h.msgs
    assert "symm_mem.fused_all_gather_matmul runs PyTorch's own kernel: dtype float64" in h.msgs[0]
    st = r.stats()
    assert st == {"taken": {"fused_all_gather_matmul": 1},
                  "fell_back": {"fused_all_gather_matmul: dtype float64": 3,
                                "fused_matmul_reduce_scatter: dtype float64": 1}}, st
    # threads: each reason still said once, every call counted
    ts = [threading.Thread(target=lambda: [r.fell_back("x", "y") for _ in range(200)])
          for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert r.stats()["fell_back"]["x: y"] == 800
    assert sum("x runs" in m for m in h.msgs) == 1, h.msgs
    r.reset()
    assert r.stats() == {"taken": {}, "fell_back": {}}


class _Reg:
    made = 0
    destroyed = 0

    def __init__(self):
        _Reg.made += 1

    def destroy(self):
        _Reg.destroyed += 1


def test_installer():
    i = _route.Installer()
    assert not i.installed and i.uninstall() is False
    assert i.install(_Reg) is True and i.installed
    assert i.install(_Reg) is False and _Reg.made == 1  # twice: harmless
    assert i.uninstall() is True and not i.installed and _Reg.destroyed == 1
    assert i.uninstall() is False and _Reg.destroyed == 1

    def failing():
        raise RuntimeError("no override here")
    try:
        i.install(failing)
        raise AssertionError("install past a failing registration")
    except RuntimeError as e:
        assert "no override here" in str(e)
    assert not i.installed  # a failed install leaves nothing
    assert i.install(_Reg) is True and i.uninstall() is True


if __name__ == "__main__":
    run_tests([test_ag_taken, test_ag_refused, test_rs_rules, test_scaled_ag_rules,
               test_scaled_ag_scale_mode, test_scaled_block_modes, test_scaled_rs_rules,
               test_router_says_once,
               test_router_words, test_installer])
