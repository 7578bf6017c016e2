"""ovl.torch.install() against the real PyTorch, without a GPU: the
overriding registration of symm_mem's CUDA kernels and its undoing,
install twice, the refusal on a PyTorch without allow_override, the
routing of a call ovl does not take to PyTorch's own kernel (each reason
logged once, every call counted), a group's comm made on first use that
fails on a rank (no ovld) and falls back for good, and OVL_TORCH_INSTALL,
by import and through ovl's sitecustomize. What ovld computes through the
installed ops is tests/gpu/test_gpu_torch.py's (check_install).

Skips (exit 77) where torch is not importable or older than 2.8. Run by
ctest (test_python_torch_install, with $OVL_TORCH_PYTHON or python3); by
hand:
    OVL_LIBRARY=build/client/libovl.so PYTHONPATH=python python3 python/tests/test_torch_install.py
"""
import logging
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OVL_SOURCE_DIR", os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
sys.path.insert(0, os.path.join(SRC, "python"))

try:
    import torch
    import torch.distributed as dist
except ImportError as _e:
    print("SKIP: no torch (%s)" % _e)
    sys.exit(77)

import ovl.torch as ot  # noqa: E402
from ovltest import run_tests  # noqa: E402

if not ot._override_supported():
    print("SKIP: PyTorch %s has no Library.impl(allow_override=...) (2.8 or later)"
          % torch.__version__)
    sys.exit(77)

sm = ot._symm_mem()
AG, RS = "symm_mem::fused_all_gather_matmul", "symm_mem::fused_matmul_reduce_scatter"


def active_cuda_kernel(op):
    """The line of the dispatcher's dump for op's active CUDA kernel."""
    for line in torch._C._dispatch_dump(op).splitlines():
        if line.startswith("CUDA:"):
            return line
    raise AssertionError("no CUDA kernel for %s:\n%s" % (op, torch._C._dispatch_dump(op)))


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.msgs = []

    def emit(self, record):
        self.msgs.append(record.getMessage())


def test_install_uninstall():
    before = {op: active_cuda_kernel(op) for op in (AG, RS)}
    assert all("_symmetric_memory" in k for k in before.values()), before
    assert not ot.installed()
    assert ot.install() is True and ot.installed()
    for op in (AG, RS):
        k = active_cuda_kernel(op)
        assert "ovl" in k and "torch.py" in k, k
    assert ot.install() is False  # twice: harmless, one registration
    assert ot.uninstall() is True and not ot.installed()
    after = {op: active_cuda_kernel(op) for op in (AG, RS)}
    assert after == before, (before, after)
    assert ot.uninstall() is False
    # and again: install after uninstall works (PyTorch forgets the
    # original's record on _destroy; allow_override does not need it)
    assert ot.install() is True and ot.uninstall() is True
    assert {op: active_cuda_kernel(op) for op in (AG, RS)} == before


def test_old_pytorch_refused():
    real = ot._override_supported
    ot._override_supported = lambda: False
    try:
        ot.install()
        raise AssertionError("installed without allow_override")
    except RuntimeError as e:
        assert "came in 2.8" in str(e) and "torch.ops.ovl" in str(e), e
    finally:
        ot._override_supported = real
    assert not ot.installed()


def test_falls_back_once_per_reason():
    """A call ovl does not take (CPU tensors here) runs PyTorch's kernel
    (a recorder standing in for it), the reason logged once, every call
    counted."""
    h = Records()
    logging.getLogger("ovl.torch").addHandler(h)
    calls = []
    real_ag, real_rs = sm._fused_all_gather_matmul, sm._fused_matmul_reduce_scatter

    def fake_ag(A, Bs, gd, gn, *, return_A=True):
        calls.append(("ag", tuple(A.shape), gd, gn, return_A))
        return None, []

    def fake_rs(A, B, red, sd, gn):
        calls.append(("rs", tuple(A.shape), red, sd, gn))
        return A

    sm._fused_all_gather_matmul, sm._fused_matmul_reduce_scatter = fake_ag, fake_rs
    ot._ROUTER.reset()
    try:
        A, B = torch.randn(4, 8), torch.randn(8, 3)
        for _ in range(3):
            ot._symm_ag(A, [B], 0, "0", return_A=False)
        ot._symm_rs(A, B, "avg", 0, "0")
        ot._symm_ag(A.double(), [B.double()], 0, "0")
    finally:
        sm._fused_all_gather_matmul, sm._fused_matmul_reduce_scatter = real_ag, real_rs
        logging.getLogger("ovl.torch").removeHandler(h)
    assert calls == [("ag", (4, 8), 0, "0", False)] * 3 + [("rs", (4, 8), "avg", 0, "0"),
                                                            ("ag", (4, 8), 0, "0", True)], calls
    said = [m for m in h.msgs if "runs PyTorch's own kernel" in m]
    assert len(said) == 2, h.msgs  # one reason per op: CPU tensors
    assert all("a tensor on a cpu device" in m for m in said), said
    st = ot.stats()
    assert st["taken"] == {} and st["fell_back"] == {
        "fused_all_gather_matmul: a tensor on a cpu device (ovl takes CUDA tensors)": 4,
        "fused_matmul_reduce_scatter: a tensor on a cpu device (ovl takes CUDA tensors)": 1}, st


def test_group_comm_on_first_use():
    """A group without a comm: without lazy, PyTorch's kernel (why: no
    comm); with lazy, the comm is made on first use, and where ovld is not
    reachable the group keeps PyTorch's kernel, decided once (the group's
    ranks agree: here the fake process group of one process)."""
    tmp = tempfile.mkdtemp()
    old = os.environ.get("OVL_SOCKET")
    os.environ["OVL_SOCKET"] = os.path.join(tmp, "nobody-here.sock")
    cpu = torch.device("cpu")
    try:
        ot._LAZY[0] = False
        c, why = ot._comm_for("0", cpu)
        assert c is None and "has no ovl comm" in why, why
        ot._LAZY[0] = True
        c, why = ot._comm_for("0", cpu)
        assert c is None and "ovld is not usable from every rank of group '0'" in why, why
        assert "here:" in why, why
        assert ot._NOT_SERVED["0"] == why
        c2, why2 = ot._comm_for("0", cpu)  # decided: not tried again
        assert c2 is None and why2 == why
        assert ot._comm_for("no-such-group", cpu)[1].startswith(
            "group 'no-such-group' is not a process")
    finally:
        ot._NOT_SERVED.clear()
        ot._LAZY[0] = False
        if old is None:
            os.environ.pop("OVL_SOCKET", None)
        else:
            os.environ["OVL_SOCKET"] = old
        shutil.rmtree(tmp, ignore_errors=True)


def test_env_install_failure_keeps_import():
    """OVL_TORCH_INSTALL where install() fails (here: a PyTorch without
    symm_mem): import ovl.torch still works, torch.ops.ovl is there, the
    failure is a warning."""
    pp = os.path.join(SRC, "python")
    code = ("import sys, torch\n"
            "sys.modules['torch.distributed._symmetric_memory'] = None  # no symm_mem here\n"
            "import ovl.torch as t\n"
            "print(t.installed(), hasattr(torch.ops.ovl, 'fused_all_gather_matmul'))\n")
    r = run_py(code, {"OVL_TORCH_INSTALL": "1", "PYTHONPATH": pp})
    assert r.returncode == 0 and r.stdout.strip() == "False True", (r.stdout, r.stderr)
    assert "OVL_TORCH_INSTALL is set, but install() failed" in r.stderr, r.stderr


def run_py(code, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_env_install():
    pp = os.path.join(SRC, "python")
    r = run_py("import ovl.torch as t; print(t.installed())",
               {"OVL_TORCH_INSTALL": "1", "PYTHONPATH": pp})
    assert r.returncode == 0 and r.stdout.strip() == "True", (r.stdout, r.stderr)
    r = run_py("import ovl.torch as t; print(t.installed())",
               {"OVL_TORCH_INSTALL": "0", "PYTHONPATH": pp})
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.stdout, r.stderr)
    # a program that never imports ovl: ovl's sitecustomize on PYTHONPATH
    auto = os.path.join(pp, "ovl", "_autoinstall")
    code = ("import sys, torch; m = sys.modules.get('ovl.torch'); "
            "print(m is not None and m.installed())")
    r = run_py(code, {"OVL_TORCH_INSTALL": "1", "PYTHONPATH": auto + os.pathsep + pp})
    assert r.returncode == 0 and r.stdout.strip() == "True", (r.stdout, r.stderr)
    r = run_py(code, {"OVL_TORCH_INSTALL": "", "PYTHONPATH": auto + os.pathsep + pp})
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.stdout, r.stderr)


if __name__ == "__main__":
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    ot.uninstall()  # OVL_TORCH_INSTALL in the environment installed it at import
    try:
        run_tests([test_install_uninstall, test_old_pytorch_refused,
                   test_falls_back_once_per_reason, test_group_comm_on_first_use,
                   test_env_install, test_env_install_failure_keeps_import])
    finally:
        ot.uninstall()
