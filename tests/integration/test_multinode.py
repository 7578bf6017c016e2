"""Jobs across nodes on the host backend, with several ovld on this machine
(test_peers.py's nodes: peer_listen on 127.0.0.1, one cluster key,
UCX_TLS=tcp,self so that the rows between nodes go the network's way, not
by shared memory), each rank a process of client/examples/two_nodes.c
checking its C against the reference: world 4 over two daemons (node-major
and interleaved) and world 6 over three (1+2+3 ranks), every algorithm and
dtype; a daemon killed while the others' ranks wait for its rank (they
fail with OVL_ERR_ABORTED naming it within 2 s, their daemon runs the next
job, and status showed the job's nodes while it ran); a node with another
cluster key cannot join (its link is refused)."""
import os
import shutil
import signal
import subprocess
import tempfile
import time

from ovltest import log_excerpt, run_tests, status_json
from test_peers import OTHER_KEY, Node
from test_two_nodes import EXAMPLE, finish, no_jobs_left, run_job, start_rank, stop_clean

ALGOS = ("naive", "collective", "ring")
SHAPES = {"bf16": ["-m", "16", "-n", "24", "-k", "32"],
          "fp16": ["-m", "9", "-n", "13", "-k", "17"],
          "fp32": ["-m", "5", "-n", "7", "-k", "11"]}


def every_algo_and_dtype(nodes, placement):
    for algo in ALGOS:
        for dtype, shape in SHAPES.items():
            run_job(nodes, placement, shape + ["-d", dtype, "-a", algo], dtype)


def cluster(n):
    nodes = []
    try:
        for _ in range(n):
            nodes.append(Node())
    except Exception:
        for x in nodes:
            x.cleanup()
        raise
    return nodes


def test_world4_over_two():
    nodes = cluster(2)
    try:
        every_algo_and_dtype(nodes, [0, 0, 1, 1])
        every_algo_and_dtype(nodes, [0, 1, 0, 1])  # not node-major
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        for n in nodes:
            n.cleanup()


def test_world6_over_three():
    nodes = cluster(3)
    try:
        every_algo_and_dtype(nodes, [0, 1, 1, 2, 2, 2])  # 1 + 2 + 3
        run_job(nodes, [2, 0, 1, 2, 1, 2], SHAPES["bf16"] + ["-a", "ring"], "bf16")
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        for n in nodes:
            n.cleanup()


def test_daemon_killed():
    """Rank 1's ovld dies while rank 0 waits for op 1 (rank 1 holds its op
    back): rank 0 fails with the node named, soon; its ovld goes on."""
    nodes = cluster(2)
    tmp = tempfile.mkdtemp(prefix="ovl-test-id-")
    try:
        id_file = os.path.join(tmp, "job.id")
        args = SHAPES["bf16"] + ["-a", "naive"]
        p1 = start_rank(nodes[1], 1, 2, id_file, args + ["--delay-op", "30000"])
        p0 = start_rank(nodes[0], 0, 2, id_file, args)
        deadline = time.monotonic() + 30
        while True:  # the job started on node 0: it lists both nodes
            jobs = status_json(nodes[0].d)["jobs"]
            if jobs and len(jobs[0].get("nodes", [])) == 2:
                break
            assert time.monotonic() < deadline, (jobs, log_excerpt(nodes[0].d))
            time.sleep(0.05)
        j = jobs[0]
        assert j["nodes"][j["self_node"]] == nodes[0].addr and nodes[1].addr in j["nodes"], j
        time.sleep(0.3)  # rank 0's op is in, and waits for rank 1's
        assert p0.poll() is None, p0.communicate()
        t0 = time.monotonic()
        nodes[1].d.proc.send_signal(signal.SIGKILL)
        nodes[1].d.proc.wait()
        rc, so, se = finish([p0], nodes[:1], timeout=30)[0]
        took = time.monotonic() - t0
        p1.kill()
        p1.communicate()
        assert rc != 0 and "aborted" in se and nodes[1].addr in se, (rc, so, se)
        assert took < 2.0, "rank 0 heard of the dead node after %.2f s: %s" % (took, se)
        print("  rank 0 failed %.2f s after the kill: %s" % (took, se.strip()))
        # node 0 serves the next job, with a node that came back
        nodes[1].cleanup()
        nodes[1] = Node()
        run_job(nodes, [0, 1], SHAPES["fp32"] + ["-d", "fp32", "-a", "ring"], "fp32")
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for n in nodes:
            n.cleanup()


def test_wrong_key():
    """A node whose cluster key differs cannot reach the coordinator: its
    rank's join fails, saying so; the job's own nodes are unharmed."""
    nodes = cluster(2)
    other = Node(key=OTHER_KEY)
    tmp = tempfile.mkdtemp(prefix="ovl-test-id-")
    try:
        id_file = os.path.join(tmp, "job.id")
        args = SHAPES["fp32"] + ["-d", "fp32"]
        p0 = start_rank(nodes[0], 0, 2, id_file, args)
        bad = start_rank(other, 1, 2, id_file, args)
        rc, so, se = finish([bad], [other], timeout=30)[0]
        assert rc != 0 and "ovl_comm_init_id" in se and "key" in se, (rc, so, se)
        print("  a node with another key: %s" % se.strip())
        good = start_rank(nodes[1], 1, 2, id_file, args)
        res = finish([p0, good], nodes)
        assert [r[0] for r in res] == [0, 0], res
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for n in nodes + [other]:
            n.cleanup()


if __name__ == "__main__":
    if not os.path.exists(EXAMPLE):
        raise SystemExit("%s not built" % EXAMPLE)
    run_tests([test_world4_over_two, test_world6_over_three, test_daemon_killed,
               test_wrong_key])
