"""Jobs across nodes through the example client/examples/two_nodes.c
(ovl-example-two-nodes), on two ovld (host backend) on this machine, each
with peer_listen on 127.0.0.1, one cluster key and UCX_TLS=tcp,self (as
test_peers.py starts them): world 2 over the two daemons (1+1), world 3
over them (1+2, and with rank 0's daemon holding 2); every rank prints its
OK line and exits 0; rank 0 removes the id file it wrote; nothing is left
in either daemon, which both stop cleanly. Then the refusals the example
reports: an id no ovld issued (forged), a rank taken twice, an ovld
without peer_listen asked for an id, no id file within --wait; and its
usage errors.

Registered in tests/CMakeLists.txt (label integration). By hand: OVLD_BIN=... OVLCTL_BIN=... OVL_TWO_NODES_BIN=build/client/ovl-example-two-nodes
python3 tests/integration/test_two_nodes.py
"""
import os
import re
import shutil
import subprocess
import tempfile
import time

from ovltest import Daemon, log_excerpt, run_tests, status_json
from test_peers import ENV, Node

EXAMPLE = os.environ.get("OVL_TWO_NODES_BIN") or os.path.join(
    os.environ.get("OVL_BUILD_DIR", "build"), "client", "ovl-example-two-nodes")
OK_LINE = re.compile(r"^rank (\d+): OK \(rel err (\d\.\d{3}e[-+]\d\d)\)$")
# demo_rnd.h's ovl_demo_tolerance
TOL = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1e-2}


def start_rank(node, rank, world, id_file, args, wait=60):
    return subprocess.Popen([EXAMPLE, "--rank", str(rank), "--world", str(world), "--id-file",
                             id_file, "--socket", node.d.socket, "--wait", str(wait)] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs, nodes, timeout=120, fail_fast=True):
    """(returncode, stdout, stderr) of each rank, in rank order. With
    fail_fast, the first rank to fail ends the others (they would wait for
    it, as NCCL ranks would): its failure is the one to read."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        if fail_fast and any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
            out = [p.communicate() for p in procs]
            raise AssertionError("the ranks did not end within %d s: %r\n%s" % (
                timeout, out, "\n".join(log_excerpt(n.d) for n in nodes)))
        time.sleep(0.05)
    return [(p.returncode,) + p.communicate() for p in procs]


def run_job(nodes, placement, args, dtype, timeout=120):
    """One job: rank r on nodes[placement[r]], the example's options args;
    checks every rank's OK line; the ranks must end within timeout s."""
    world = len(placement)
    tmp = tempfile.mkdtemp(prefix="ovl-test-id-")
    id_file = os.path.join(tmp, "job.id")
    try:
        # the other ranks first: they wait for the file as on other nodes
        procs = {r: start_rank(nodes[placement[r]], r, world, id_file, args)
                 for r in range(world - 1, -1, -1)}
        res = finish([procs[r] for r in range(world)], nodes, timeout=timeout)
        for r, (rc, so, se) in enumerate(res):
            assert rc == 0, "rank %d (node %d) exited %d\nstdout:\n%s\nstderr:\n%s\nlogs:\n%s" % (
                r, placement[r], rc, so, se, "\n".join(log_excerpt(n.d) for n in nodes))
            m = OK_LINE.match(so.strip())
            assert m and int(m.group(1)) == r, so
            assert float(m.group(2)) < TOL[dtype], so
            assert se == "", se
        print("  world %d on nodes %s: %s" % (world, placement, "; ".join(
            so.strip() for _, so, _ in res)))
        assert not os.path.exists(id_file), "rank 0 left its id file"
        assert os.listdir(tmp) == [], os.listdir(tmp)  # and no temporary one
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def no_jobs_left(nodes):
    for n in nodes:
        s = status_json(n.d)
        assert s["jobs"] == [], s["jobs"]


def stop_clean(nodes):
    for n in nodes:
        rc = n.d.stop()
        text = n.log()
        assert rc == 0 and "Sanitizer" not in text and "runtime error" not in text, (
            rc, text[-3000:])


def test_world_2():
    nodes = [Node(), Node()]
    try:
        run_job(nodes, [0, 1], ["-m", "16", "-n", "24", "-k", "32"], "bf16")
        run_job(nodes, [1, 0], ["-m", "8", "-n", "8", "-k", "8", "-d", "fp32", "-a", "ring"],
                "fp32")
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        for n in nodes:
            n.cleanup()


def test_world_3():
    nodes = [Node(), Node()]
    try:
        for algo in ("naive", "collective", "ring"):
            run_job(nodes, [0, 1, 1], ["-m", "12", "-n", "20", "-k", "28", "-d", "fp32", "-a",
                                       algo], "fp32")
        run_job(nodes, [0, 1, 0], ["-m", "8", "-n", "16", "-k", "24", "-d", "fp16"], "fp16")
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        for n in nodes:
            n.cleanup()


def test_scaled():
    """Scaled (fp8) ops across two daemons, both kinds, checked against the
    dequantized reference; then ranks on the two nodes that disagree on the
    scaling (A's scale mode, a bias on one node only): the coordinator
    fails the op on every rank, naming the field (the nodes' OpReady carry
    the scaling)."""
    nodes = [Node(), Node()]
    try:
        shape = ["-m", "8", "-n", "16", "-k", "32"]
        for extra in (["-a", "ring"], ["-a", "naive", "--scale", "tensor", "--bias"],
                      ["--op", "rs", "-a", "push", "--bias"],
                      ["--op", "rs", "-a", "naive", "--scale", "tensor", "--reduce", "avg"]):
            run_job(nodes, [0, 1], shape + ["-d", "fp8e4m3"] + extra, "bf16")
        for rank_args, words in ((([], ["--scale", "tensor"]), "disagree on a_scale mode"),
                                 ((["--op", "rs", "--bias"], ["--op", "rs"]),
                                  "disagree on bias (given or not)")):
            tmp = tempfile.mkdtemp(prefix="ovl-test-id-")
            try:
                id_file = os.path.join(tmp, "job.id")
                procs = [start_rank(nodes[r], r, 2, id_file,
                                    shape + ["-d", "fp8e4m3", "-a", "naive", "--timeout", "30"]
                                    + rank_args[r]) for r in (1, 0)][::-1]
                res = finish(procs, nodes, timeout=60, fail_fast=False)
                for r, (rc, so, se) in enumerate(res):
                    assert rc == 1 and words in se, (r, rank_args, rc, so, se)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        for n in nodes:
            n.cleanup()


def forged_id(addr):
    """An id of the form ovld makes (daemon/util/jobid.h: "OVLJ", version 1,
    IPv4, port, address, nonce, instance) naming the ovld at addr, with a
    nonce and an instance it never had."""
    host, port = addr.rsplit(":", 1)
    return (b"OVLJ" + bytes([1, 4]) + int(port).to_bytes(2, "big") +
            bytes(int(x) for x in host.split(".")) + bytes(12) + os.urandom(32) + bytes(72))


def test_refusals():
    nodes = [Node(), Node()]
    tmp = tempfile.mkdtemp(prefix="ovl-test-id-")
    try:
        # an id that node 0 never issued, joined through node 1
        forged = os.path.join(tmp, "forged.id")
        with open(forged, "wb") as f:
            f.write(forged_id(nodes[0].addr))
        rc, so, se = finish([start_rank(nodes[1], 1, 2, forged, [])], nodes)[0]
        assert rc == 1 and so == "", (rc, so, se)
        assert re.match(r"rank 1: ovl_comm_init_id \(world 2, device \d+\): "
                        r"(not found|permission denied): .+", se), se
        # a rank taken twice: rank 1 of a job whose rank 1 is in already
        id_file = os.path.join(tmp, "job.id")
        first = start_rank(nodes[1], 1, 2, id_file, ["-m", "4", "-n", "4", "-k", "4"])
        second = start_rank(nodes[0], 1, 2, id_file, ["-m", "4", "-n", "4", "-k", "4"])
        # rank 0 holds the job (and its id file) until both rank 1s read the id
        zero = start_rank(nodes[0], 0, 2, id_file, ["-m", "4", "-n", "4", "-k", "4",
                                                    "--delay-op", "3000"])
        res = finish([zero, first, second], nodes, fail_fast=False)
        taken = [r for r in res if r[0] != 0]
        assert len(taken) == 1, res  # one of the two rank 1s, whichever came second
        assert re.match(r"rank 1: ovl_comm_init_id \(world 2, device \d+\): already exists: ",
                        taken[0][2]), taken
        assert [OK_LINE.match(r[1].strip()).group(1) for r in res if r[0] == 0] == ["0", "1"], res
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for n in nodes:
            n.cleanup()
    # an ovld without peer_listen makes no id
    d = Daemon(env=ENV)
    tmp = tempfile.mkdtemp(prefix="ovl-test-id-")
    try:
        id_file = os.path.join(tmp, "job.id")
        p = subprocess.run([EXAMPLE, "--rank", "0", "--world", "2", "--id-file", id_file,
                            "--socket", d.socket], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and p.stdout == "", p
        assert p.stderr.startswith("rank 0: ovl_job_id_create: not supported: ") and \
            "peer_listen" in p.stderr, p.stderr
        assert os.listdir(tmp) == [], os.listdir(tmp)
        # the other ranks wait for the id a bounded time
        p = subprocess.run([EXAMPLE, "--rank", "1", "--world", "2", "--id-file", id_file,
                            "--socket", d.socket, "--wait", "1"], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 1 and p.stderr.startswith(
            "rank 1: no job id in %s after 1 s: is rank 0 running" % id_file), p
        assert d.stop() == 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        d.cleanup()


def test_usage():
    """The example's own checks, before it connects anywhere."""
    for args, words in ((["--rank", "0"], "--rank, --world and --id-file are required"),
                        (["--rank", "2", "--world", "2", "--id-file", "x"], "--rank 0..world-1"),
                        (["--rank", "0", "--world", "2", "--id-file", "x", "-m", "0"], "-m, -n"),
                        (["--rank", "0", "--world", "2", "--id-file", "x", "-d", "int8"],
                         "unknown dtype")):
        p = subprocess.run([EXAMPLE] + args, capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and words in p.stderr, (args, p)
    p = subprocess.run([EXAMPLE, "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.startswith("Usage: ovl-example-two-nodes"), p
    # rank 0 will not hand out an id where an earlier run's may still be read
    with tempfile.NamedTemporaryFile() as f:
        p = subprocess.run([EXAMPLE, "--rank", "0", "--world", "2", "--id-file", f.name,
                            "--socket", "/nonexistent/ovld.sock"], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 1 and "exists (from an earlier run?)" in p.stderr, p


if __name__ == "__main__":
    run_tests([test_usage, test_world_2, test_world_3, test_scaled, test_refusals])
