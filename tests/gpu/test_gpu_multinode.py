"""Jobs across nodes on the CUDA backend, on the GPUs of one machine: several
ovld, each playing a node (its own socket, peer_listen on 127.0.0.1,
UCX_TLS=tcp,self, and its own NCCL_HOSTID, which makes NCCL treat the
daemons as separate hosts and use its network transport: a test device,
not a deployment mode, docs/multinode.md), one rank per daemon, each rank
a process of client/examples/two_nodes.c (ovl-example-two-nodes) on CUDA
memory, checking its C against the reference.

Cases: world 2 over two daemons and world 4 over four, every algorithm
(naive: NCCL all-gather; collective: NCCL send/recv; ring: the rail),
bf16 on a mid-size shape, fp16 and fp32 on a small odd one, and GEMM +
reduce-scatter (--op rs: naive and collective, NCCL's reduce-scatter over
the job's communicator, and push by the rail scheme, C checked against the
host's sum of every rank's product); then world 4
over two daemons with two ranks each, all on GPU 0 (ring on a communicator
per rail group, every case, and GEMM + reduce-scatter's auto (push, its RAILs by rail group);
naive and collective refused with words; and
1 + 2 ranks, which would put two ranks of one GPU in one rail group,
refused when the job starts); and
a daemon killed while the other ranks wait for its rank's op: they get
OVL_ERR_ABORTED naming the node within 2 s of the kill, and their daemon
serves the next job. Ranks go round-robin over the GPUs (rank r on GPU r
mod G). Without a GPU prints "SKIP: ..." and exits 77 (ctest's skip)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

from ovltest import Daemon, free_port, log_excerpt, run_tests  # noqa: E402

SKIP_CODE = 77
KEY = "c2VjcmV0LWNsdXN0ZXIta2V5LW9mLTMyLWJ5dGVzLW9yLW1vcmU=\n"
EXAMPLE = os.environ.get("OVL_TWO_NODES_BIN") or os.path.join(
    os.environ.get("OVL_BUILD_DIR", "build"), "client", "ovl-example-two-nodes")
OK_LINE = re.compile(r"^rank (\d+): OK \(rel err (\S+)\)$")
START_TIMEOUT = 60.0
CASE_TIMEOUT = 120


class CudaDaemon(Daemon):
    """ovld on the CUDA backend: it starts slower than the host one."""

    def wait_ready(self, timeout=START_TIMEOUT):
        return super().wait_ready(timeout)


class CudaNode:
    """An ovld on the CUDA backend playing node `index`."""

    def __init__(self, index, keyfile):
        self.port = free_port()
        self.addr = "127.0.0.1:%d" % self.port
        env = {"UCX_TLS": "tcp,self", "NCCL_HOSTID": "ovl-test-node-%d" % index}
        self.d = CudaDaemon(config="peer_listen = %s\npeer_key_file = %s\n"
                            "peer_timeout_ms = 1000\nsocket_mode = 0666\n" % (self.addr, keyfile),
                            backend="cuda", env=env)


class Cluster:
    def __init__(self, n):
        self.keydir = tempfile.mkdtemp(prefix="ovl-test-key-")
        self.key = os.path.join(self.keydir, "cluster.key")
        with open(self.key, "w") as f:
            f.write(KEY)
        os.chmod(self.key, 0o600)
        self.nodes = []
        try:
            for i in range(n):
                self.nodes.append(CudaNode(i, self.key))
        except Exception:
            self.close()
            raise

    def close(self):
        for n in self.nodes:
            n.d.cleanup()
        shutil.rmtree(self.keydir, ignore_errors=True)

    def logs(self):
        return "\n".join(log_excerpt(n.d) for n in self.nodes)


def start_rank(node, rank, world, id_file, args):
    return subprocess.Popen([EXAMPLE, "--rank", str(rank), "--world", str(world), "--id-file",
                             id_file, "--socket", node.d.socket, "--wait", "60"] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_job(cl, placement, args, timeout=CASE_TIMEOUT):
    """Ranks placed on nodes (placement[r] = node index); (rc, out, err) per rank."""
    tmp = tempfile.mkdtemp(prefix="ovl-test-id-")
    id_file = os.path.join(tmp, "job.id")
    world = len(placement)
    procs = [start_rank(cl.nodes[placement[r]], r, world, id_file, args) for r in range(world)]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                time.sleep(3)  # let the others say their words
                break
            if time.monotonic() > deadline:
                raise AssertionError("the ranks did not end within %d s\n%s" % (timeout,
                                                                               cl.logs()))
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return [(p.returncode,) + p.communicate() for p in procs]


def check_ok(cl, res, what):
    for r, (rc, out, err) in enumerate(res):
        lines = [l for l in out.splitlines() if OK_LINE.match(l)]
        if rc != 0 or len(lines) != 1 or int(OK_LINE.match(lines[0]).group(1)) != r:
            raise AssertionError("%s: rank %d exited %d\nstdout:\n%s\nstderr:\n%s\n%s" % (
                what, r, rc, out, err, cl.logs()))
    print("  %s: OK (%s)" % (what, ", ".join(
        OK_LINE.match(out.splitlines()[-1]).group(2) if out.strip() else "?" for _, out, _ in res)),
        flush=True)


CASES = [(["-m", "512", "-n", "1024", "-k", "1024", "--dtype", "bf16"], "bf16 512x1024x1024"),
         (["-m", "33", "-n", "31", "-k", "29", "--dtype", "fp16"], "fp16 33x31x29"),
         (["-m", "33", "-n", "31", "-k", "29", "--dtype", "fp32"], "fp32 33x31x29")]


def worlds(n):
    cl = Cluster(n)
    try:
        placement = list(range(n))
        for algo in ("naive", "collective", "ring"):
            for args, name in CASES:
                t0 = time.monotonic()
                res = run_job(cl, placement, args + ["--algo", algo])
                check_ok(cl, res, "world %d over %d daemons, %s, %s (%.1f s)" % (
                    n, n, algo, name, time.monotonic() - t0))
        # GEMM + reduce-scatter: m rows of C a rank, k its share of the inner
        # dimension; push by the rail scheme (one rank a daemon: the RAILs)
        for algo in ("naive", "collective", "push"):
            for args, name in CASES:
                t0 = time.monotonic()
                red = ["--reduce", "avg"] if "fp16" in name else []
                res = run_job(cl, placement, args + ["--algo", algo, "--op", "rs"] + red)
                check_ok(cl, res, "world %d over %d daemons, rs %s, %s (%.1f s)" % (
                    n, n, algo, name, time.monotonic() - t0))
    finally:
        cl.close()


def test_world2_over_two():
    worlds(2)


def test_world4_over_four():
    worlds(4)


def test_shared_over_two():
    """World 4 over two daemons, two ranks each, every rank on GPU 0: no
    NCCL communicator can span the job (two ranks of one GPU), so each rail
    group gets its own (ranks 0 and 2, ranks 1 and 3) and ring runs, every
    case, and auto picks it; naive and collective are refused on every rank
    with words naming the ranks and ring. Uneven (1 + 2 on GPU 0): the two
    ranks of node 1 would share one rail group's communicator, so the job is
    refused with words when it starts; nothing hangs."""
    cl = Cluster(2)
    try:
        dev0 = ["--device", "0"]
        for args, name in CASES:
            t0 = time.monotonic()
            res = run_job(cl, [0, 0, 1, 1], args + ["--algo", "ring"] + dev0)
            check_ok(cl, res, "world 4 over 2 daemons sharing GPU 0, ring, %s (%.1f s)" % (
                name, time.monotonic() - t0))
        res = run_job(cl, [0, 1, 0, 1], CASES[0][0] + ["--algo", "auto"] + dev0)
        check_ok(cl, res, "the same, ranks interleaved, auto")
        # GEMM + reduce-scatter: auto is push there (its RAILs by rail groups)
        res = run_job(cl, [0, 0, 1, 1], CASES[1][0] + ["--algo", "auto", "--op", "rs"] + dev0)
        check_ok(cl, res, "world 4 over 2 daemons sharing GPU 0, rs auto (push)")
        for algo in ("naive", "collective"):
            res = run_job(cl, [0, 0, 1, 1], CASES[1][0] + ["--algo", algo] + dev0)
            for r, (rc, out, err) in enumerate(res):
                assert rc != 0, "rank %d: %s ran with ranks sharing a GPU:\n%s" % (r, algo, out)
                assert ("share device 0 on %s: across nodes only ring runs" % cl.nodes[0].addr
                        in out + err), (algo, r, out, err)
            print("  %s refused: %s" % (algo, (res[0][1] + res[0][2]).strip().splitlines()[-1]),
                  flush=True)
        res = run_job(cl, [0, 1, 1], CASES[1][0] + ["--algo", "ring"] + dev0)
        for r, (rc, out, err) in enumerate(res):
            assert rc != 0, "rank %d: ran with two ranks of one GPU in one rail group:\n%s" % (
                r, out)
            assert "share device 0 on %s and exchange rows" % cl.nodes[1].addr in out + err, (
                r, out, err, cl.logs())
        print("  uneven, refused: %s" % (res[0][1] + res[0][2]).strip().splitlines()[-1],
              flush=True)
    finally:
        cl.close()


def test_daemon_killed():
    """Rank 1's daemon dies while rank 0 waits for op 1: rank 0 gets
    OVL_ERR_ABORTED naming the node, soon; its daemon runs the next job."""
    usage = subprocess.run([EXAMPLE, "--help"], capture_output=True, text=True).stdout
    if "--delay-op" not in usage:
        raise AssertionError("ovl-example-two-nodes has no --delay-op: the test cannot hold "
                             "rank 1 back")
    cl = Cluster(2)
    try:
        tmp = tempfile.mkdtemp(prefix="ovl-test-id-")
        id_file = os.path.join(tmp, "job.id")
        args = ["-m", "64", "-n", "64", "-k", "64", "--algo", "naive"]
        p0 = start_rank(cl.nodes[0], 0, 2, id_file, args)
        p1 = start_rank(cl.nodes[1], 1, 2, id_file, args + ["--delay-op", "30000"])
        time.sleep(5)  # both joined; rank 0's op waits for rank 1's
        assert p0.poll() is None, p0.communicate()
        t0 = time.monotonic()
        cl.nodes[1].d.proc.send_signal(signal.SIGKILL)
        try:
            out, err = p0.communicate(timeout=30)
        finally:
            p1.kill()
            p1.communicate()
            shutil.rmtree(tmp, ignore_errors=True)
        took = time.monotonic() - t0
        assert p0.returncode != 0, out
        assert "aborted" in (out + err).lower() and cl.nodes[1].addr in out + err, (out, err)
        assert took < 10, "rank 0 heard of the dead node after %.1f s" % took
        print("  daemon killed: rank 0 failed after %.2f s: %s" % (
            took, (out + err).strip().splitlines()[-1]), flush=True)
    finally:
        cl.nodes[1].d.proc.wait()
        cl.close()


def main():
    if not os.path.exists(EXAMPLE):
        print("SKIP: %s not built" % EXAMPLE, flush=True)
        sys.exit(SKIP_CODE)
    try:
        Cluster(1).close()
    except AssertionError as e:
        if "cannot start the cuda backend" in str(e) or "no device" in str(e).lower():
            print("SKIP: ovld cannot start the CUDA backend", flush=True)
            sys.exit(SKIP_CODE)
        raise
    run_tests([test_world2_over_two, test_world4_over_four, test_shared_over_two,
               test_daemon_killed])


if __name__ == "__main__":
    main()
