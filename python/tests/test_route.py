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
    run_tests([test_ag_taken, test_ag_refused, test_rs_rules, test_router_says_once,
               test_installer])
