"""Tests of the ovl Python package's jobs across nodes without a daemon:
Client.job_id_create and Client.comm with a job id of 128 bytes
(ovl_job_id_create, ovl_comm_init_id). What is checked is what needs no
ovld: the arguments refused before anything reaches libovl, a good id
passed on to libovl (which then finds the client closed), libovl's own
checks of its arguments, and ovl_job_id_t's size. What ovld answers is
test_ovl_host.py's (test_job_id_daemon) and tests/integration/
test_two_nodes.py's.

Run by ctest (tests/CMakeLists.txt: test_python_job_id) in scripts/test's
venv with OVL_LIBRARY set to the built libovl.so; by hand:
    OVL_LIBRARY=build/client/libovl.so.1 PYTHONPATH=python python3 python/tests/test_job_id.py
"""
import ctypes
import os
import sys
import threading
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OVL_SOURCE_DIR", os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))

import ovl  # noqa: E402
from ovltest import run_tests  # noqa: E402

ID = bytes(range(128))


def closed_client():
    """A Client as close() leaves it, made without a daemon: every call
    that reaches libovl raises Closed, so a Closed says the arguments were
    taken."""
    c = ovl.Client.__new__(ovl.Client)
    c._lib = ovl._lib.lib()
    c._mu = threading.RLock()
    c._allocs = {}
    c._comms = weakref.WeakSet()
    c._ranks = {}
    c._h = c._conn = None
    return c


def expect(exc, fn, *args, words=None):
    try:
        fn(*args)
    except exc as e:
        assert words is None or words in str(e), (words, str(e))
        return e
    raise AssertionError("no %s from %s%r" % (exc.__name__, fn.__name__, args))


def test_job_id_size():
    assert ovl._lib.JOB_ID_BYTES == 128
    assert ctypes.sizeof(ovl._lib.JobId) == 128


def test_bad_ids_refused():
    c = closed_client()
    IA = ovl.InvalidArgument
    for bad in (b"", b"x", ID[:127], ID + b"\0", bytearray(129)):
        e = expect(IA, c.comm, bad, 2, 0, 0, words="the 128 bytes of Client.job_id_create")
        assert e.status == -1 and "got %d bytes" % len(bad) in e.message, e
    expect(IA, c.comm, "", 2, 0, 0, words="a non-empty string, or the 128 bytes")
    expect(IA, c.comm, None, 2, 0, 0, words="job")
    expect(IA, c.comm, memoryview(ID), 2, 0, 0, words="job")
    expect(IA, c.comm, list(ID), 2, 0, 0, words="job")
    # world and rank as for a named job
    expect(IA, c.comm, ID, 0, 0, 0, words="rank 0 of world 0")
    expect(IA, c.comm, ID, 2, 2, 0, words="rank 2 of world 2")
    expect(IA, c.comm, ID, 2, -1, 0, words="rank -1 of world 2")
    expect(IA, c.comm, ID, 2, True, 0, words="rank: an int")
    expect(IA, c.comm, ID, 2.0, 0, 0, words="world: an int")
    expect(IA, c.comm, ID, 2, 0, "0", words="device: an int")


def test_good_ids_reach_libovl():
    """128 bytes (bytes or bytearray) pass the checks and go to
    ovl_comm_init_id, which the closed client refuses; so does
    job_id_create."""
    c = closed_client()
    for good in (ID, bytearray(ID), b"\0" * 128):
        expect(ovl.Closed, c.comm, good, 2, 1, 0, words="closed")
    expect(ovl.Closed, c.comm, "a-name", 2, 1, 0, words="closed")  # a name, as before
    expect(ovl.Closed, c.job_id_create, words="closed")


def test_libovl_checks():
    """libovl's own refusals, whoever calls it (OVL_ERR_INVALID = -1)."""
    lib = ovl._lib.lib()
    jid = ovl._lib.JobId.from_buffer_copy(ID)
    h = ctypes.c_void_p()
    assert lib.ovl_job_id_create(None, ctypes.byref(jid)) == -1
    assert lib.ovl_comm_init_id(None, ctypes.byref(jid), 2, 0, 0, ctypes.byref(h)) == -1
    assert h.value is None


if __name__ == "__main__":
    run_tests([test_job_id_size, test_bad_ids_refused, test_good_ids_reach_libovl,
               test_libovl_checks])
