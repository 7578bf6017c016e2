"""Jobs across nodes on the host backend, with several ovld on this machine
(test_peers.py's nodes: peer_listen on 127.0.0.1, one cluster key,
UCX_TLS=tcp,self so that the rows between nodes go the network's way, not
by shared memory), each rank a process of client/examples/two_nodes.c
checking its C against the reference: world 4 over two daemons (node-major
and interleaved) and world 6 over three (1+2+3 ranks), every algorithm and
dtype, and 256 MiB of rows each way in one op (the reads in pieces, the
heartbeats between them), with the rows each daemon moved to and from the others counted in
`ovlctl stats` (xfer_*: exactly, for one naive op; both ends of every
transfer, for the rest); a daemon killed while the others' ranks wait for its rank (they
fail with OVL_ERR_ABORTED naming it within 2 s, their daemon runs the next
job, and status showed the job's nodes while it ran); ranks sharing a
device (ring runs; naive and collective refused with words); GEMM +
reduce-scatter across nodes (--op rs: naive and collective, sum and avg,
every dtype, world 4 over two daemons node-major and interleaved and world 6
over three; each rank's C against the sum of every rank's product; the
partials each node sends the others counted exactly for one op; push
refused across nodes with words, and ranks sharing a device too); a node with another
cluster key cannot join (its link is refused); another uid joining with
root's id learns nothing of root's ranks; a job id makes ovld connect only
where peer_allow (or, unset, the PeerPing rule) lets it."""
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

from ovltest import log_excerpt, run_tests, status_json
from test_peers import OTHER_KEY, Node
from test_two_nodes import (EXAMPLE, finish, forged_id, no_jobs_left, run_job, start_rank,
                            stop_clean)

ALGOS = ("naive", "collective", "ring")
SHAPES = {"bf16": ["-m", "16", "-n", "24", "-k", "32"],
          "fp16": ["-m", "9", "-n", "13", "-k", "17"],
          "fp32": ["-m", "5", "-n", "7", "-k", "11"]}


XFER = ("xfer_sends", "xfer_recvs", "xfer_bytes_out", "xfer_bytes_in", "xfer_errors",
        "xfer_dropped")


def xfer_stats(node):
    """The node's xfer_* counters since start (`ovlctl stats --json`)."""
    total = json.loads(node.ctl("stats", "--json").stdout)["total"]
    return {k: total[k] for k in XFER}


def check_xfer(nodes, before):
    """Since before (each node's xfer_stats): every node sent and received
    rows, nothing failed or was dropped, and each transfer was counted at
    both its ends (sums over the nodes agree); the table shows them too."""
    after = [xfer_stats(n) for n in nodes]
    moved = [{k: a[k] - b[k] for k in XFER} for a, b in zip(after, before)]
    for n, a, m in zip(nodes, after, moved):
        assert m["xfer_sends"] > 0 and m["xfer_recvs"] > 0, (n.addr, m)
        assert m["xfer_bytes_out"] > 0 and m["xfer_bytes_in"] > 0, (n.addr, m)
        assert m["xfer_errors"] == 0 and m["xfer_dropped"] == 0, (n.addr, m)
        text = n.ctl("stats").stdout  # since start, since reset (none)
        row = re.search(r"^  xfer_bytes_out +(\d+) +(\d+)$", text, re.M)
        assert row and int(row.group(1)) == int(row.group(2)) == a["xfer_bytes_out"], text
    for out, into in (("xfer_sends", "xfer_recvs"), ("xfer_bytes_out", "xfer_bytes_in")):
        assert sum(m[out] for m in moved) == sum(m[into] for m in moved), moved
    return after


def every_algo_and_dtype(nodes, placement):
    for algo in ALGOS:
        for dtype, shape in SHAPES.items():
            run_job(nodes, placement, shape + ["-d", dtype, "-a", algo], dtype)


def refused_job(nodes, placement, args):
    """A job that must fail: rank r on nodes[placement[r]]; every rank's
    (exit status, stdout, stderr), none of them cut short."""
    tmp = tempfile.mkdtemp(prefix="ovl-test-id-")
    try:
        id_file = os.path.join(tmp, "job.id")
        procs = [start_rank(nodes[n], r, len(placement), id_file, args)
                 for r, n in reversed(list(enumerate(placement)))]
        return finish(procs[::-1], nodes, fail_fast=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
        zero = [xfer_stats(n) for n in nodes]
        assert all(not any(z.values()) for z in zero), zero  # nothing moved yet
        # naive, 2 + 2: each rank's A (5 x 11 fp32) all-gathered, so sent
        # to both ranks of the other node and received from both
        run_job(nodes, [0, 0, 1, 1], SHAPES["fp32"] + ["-d", "fp32", "-a", "naive"], "fp32")
        shard = 5 * 11 * 4
        for n in nodes:
            assert xfer_stats(n) == {"xfer_sends": 4, "xfer_recvs": 4, "xfer_bytes_out": 4 * shard,
                                     "xfer_bytes_in": 4 * shard, "xfer_errors": 0,
                                     "xfer_dropped": 0}, (n.addr, xfer_stats(n))
        before = check_xfer(nodes, zero)
        every_algo_and_dtype(nodes, [0, 0, 1, 1])
        before = check_xfer(nodes, before)
        every_algo_and_dtype(nodes, [0, 1, 0, 1])  # not node-major
        check_xfer(nodes, before)
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        for n in nodes:
            n.cleanup()


def issued_algos(node):
    """The algorithm of every op the node's ovld issued, in order."""
    return re.findall(r"op \d+ issued \(ag_gemm (\w+), ", node.log())


def test_auto_measured_across_nodes():
    """auto across nodes is measured by the coordinator (rank 0's ovld):
    each node times the ops it is told to and sends its time; once every
    candidate has its samples the coordinator's table has the job's shape
    with its topology (nodes=0,0,1,1) and a choice, which both nodes then
    run; the other node's table has nothing. Every result is checked.
    Which op of the first job is the first to run the choice depends on
    how far the clients ran ahead (the coordinator times at most 16 ops
    at once and gives the others the rule's plan meanwhile), so the choice
    is checked on the next job's ops, every one of them."""
    nodes = []
    try:
        for _ in range(2):
            nodes.append(Node(extra="tune_samples = 1\n"))
        args = SHAPES["bf16"] + ["-a", "auto", "--iters", "40"]
        run_job(nodes, [0, 0, 1, 1], args, "bf16")
        deadline = time.monotonic() + 10  # the last OpTime may trail the job's end
        while True:
            coord = json.loads(nodes[0].ctl("tune", "--json").stdout)
            if coord["chosen"] == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        other = json.loads(nodes[1].ctl("tune", "--json").stdout)
        assert coord["keys"] == 1 and coord["chosen"] == 1, coord
        line = coord["text"].splitlines()[1]
        assert " nodes=0,0,1,1 " in line and " world=4 " in line, line
        chosen = re.search(r" chose=(\w+)/", line).group(1)
        tried = set(re.findall(r"(\w+)/\d+(?:/\w+)?:[1-9]\d*", line.split(" ns=")[1]))
        assert other["keys"] == 0, other
        for n in nodes:
            algos = issued_algos(n)
            assert len(algos) == 40, algos  # an op a line, on a node
            # every candidate timed ran on both nodes, and nothing else
            assert set(algos) == tried and len(tried) >= 2, (algos, line)
        # the next job of the shape runs the choice from its first op, on
        # both nodes
        run_job(nodes, [0, 0, 1, 1], SHAPES["bf16"] + ["-a", "auto", "--iters", "8"], "bf16")
        for n in nodes:
            algos = issued_algos(n)
            assert len(algos) == 48 and algos[-8:] == [chosen] * 8, (algos, line)
        stop_clean(nodes)
    finally:
        for n in nodes:
            n.cleanup()


def test_world6_over_three():
    nodes = cluster(3)
    try:
        before = [xfer_stats(n) for n in nodes]
        every_algo_and_dtype(nodes, [0, 1, 1, 2, 2, 2])  # 1 + 2 + 3
        before = check_xfer(nodes, before)
        run_job(nodes, [2, 0, 1, 2, 1, 2], SHAPES["bf16"] + ["-a", "ring"], "bf16")
        check_xfer(nodes, before)
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        for n in nodes:
            n.cleanup()


def test_shared_gpu():
    """Two ranks of each node on one device (world 4 over two daemons, every
    rank on device 0): ring runs, every dtype, and auto picks it; naive and
    collective fail on every rank, the words naming the two ranks, their
    device and ring (across nodes their all-gather would need a
    communicator over the job, which NCCL cannot make of two ranks of one
    GPU); the daemons run the next job. Uneven (1 + 2 on one device): ring
    too (the host backend makes no communicators)."""
    nodes = cluster(2)
    try:
        dev0 = ["--device", "0"]
        for dtype, shape in SHAPES.items():
            run_job(nodes, [0, 0, 1, 1], shape + ["-d", dtype, "-a", "ring"] + dev0, dtype)
        run_job(nodes, [0, 1, 0, 1], SHAPES["bf16"] + ["-a", "auto"] + dev0, "bf16")
        for algo in ("naive", "collective"):
            res = refused_job(nodes, [0, 0, 1, 1], SHAPES["fp32"] + ["-d", "fp32", "-a", algo] + dev0)
            for r, (rc, so, se) in enumerate(res):
                assert rc != 0, (algo, r, so)
                assert ("ranks 0 and 1 share device 0 on %s: across nodes only ring runs then "
                        "(%s gathers by NCCL" % (nodes[0].addr, algo)) in se, (algo, r, se)
            print("  %s, ranks sharing a device: %s" % (algo, res[0][2].strip().splitlines()[-1]))
        run_job(nodes, [1, 0, 0], SHAPES["fp16"] + ["-d", "fp16", "-a", "ring"] + dev0, "fp16")
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        for n in nodes:
            n.cleanup()


def test_rs_across_nodes():
    """GEMM + reduce-scatter across nodes: every rank's partials summed over
    every node (the host backend's reduce-scatter sends each rank of another
    node its block of the partials, as NCCL's would move them), naive and
    collective, sum and avg, every dtype, 2 + 2 node-major and interleaved,
    1 + 2 + 3; one naive op's transfers counted exactly. push by the rail
    scheme (node partials over one transfer per remote rank, counted
    exactly for one op), every dtype, 2 + 2 both ways and 2 + 2 + 2; and
    where ranks share a device, auto picking it. Refused with words: push
    on uneven nodes (the planner's), naive on shared devices (the
    coordinator's)."""
    nodes = cluster(3)
    try:
        two = nodes[:2]
        before = [xfer_stats(n) for n in two]
        # naive, 2 + 2, fp32, m = 5 rows a rank, n = 7: each rank sends its
        # block of the partials (5 x 7 fp32) to both ranks of the other node
        run_job(two, [0, 0, 1, 1], SHAPES["fp32"] + ["-d", "fp32", "-a", "naive", "--op", "rs"],
                "fp32")
        block = 5 * 7 * 4
        for n, b in zip(two, before):
            a = xfer_stats(n)
            moved = {k: a[k] - b[k] for k in XFER}
            assert moved == {"xfer_sends": 4, "xfer_recvs": 4, "xfer_bytes_out": 4 * block,
                             "xfer_bytes_in": 4 * block, "xfer_errors": 0,
                             "xfer_dropped": 0}, (n.addr, moved)
        for placement in ([0, 0, 1, 1], [0, 1, 0, 1]):
            for algo in ("naive", "collective"):
                for dtype, shape in SHAPES.items():
                    red = ["--reduce", "avg"] if dtype == "fp16" else []
                    run_job(two, placement,
                            shape + ["-d", dtype, "-a", algo, "--op", "rs"] + red, dtype)
        run_job(nodes, [0, 1, 1, 2, 2, 2],
                SHAPES["bf16"] + ["-a", "collective", "--op", "rs", "--reduce", "avg"], "bf16")
        run_job(nodes, [2, 0, 1, 2, 1, 2], SHAPES["fp32"] + ["-d", "fp32", "--op", "rs"], "fp32")
        # push, the rail scheme: 2 + 2, fp32 5 x 7 blocks: each rank sends its
        # node's partial of one block to the rank of its local index on the
        # other node (one transfer each way), nothing else crosses
        before = [xfer_stats(n) for n in two]
        run_job(two, [0, 0, 1, 1], SHAPES["fp32"] + ["-d", "fp32", "-a", "push", "--op", "rs"],
                "fp32")
        for n, b in zip(two, before):
            a = xfer_stats(n)
            moved = {k: a[k] - b[k] for k in XFER}
            assert moved == {"xfer_sends": 2, "xfer_recvs": 2, "xfer_bytes_out": 2 * block,
                             "xfer_bytes_in": 2 * block, "xfer_errors": 0,
                             "xfer_dropped": 0}, (n.addr, moved)
        for placement in ([0, 0, 1, 1], [0, 1, 0, 1]):
            for dtype, shape in SHAPES.items():
                red = ["--reduce", "avg"] if dtype == "bf16" else []
                run_job(two, placement, shape + ["-d", dtype, "-a", "push", "--op", "rs"] + red,
                        dtype)
        run_job(nodes, [0, 1, 2, 0, 1, 2], SHAPES["bf16"] + ["-a", "push", "--op", "rs"], "bf16")
        # ranks sharing a device: auto picks push (no NCCL over the job)
        run_job(two, [0, 0, 1, 1], SHAPES["fp16"] + ["-d", "fp16", "--op", "rs", "--device", "0"],
                "fp16")
        # refusals: push on uneven nodes (the planner's words, on every
        # rank), naive where ranks share a device (the coordinator's)
        for placement, algo, extra, words in (
                ([0, 1, 1], "push", [], "push across nodes takes nodes of equal size"),
                ([0, 0, 1, 1], "naive", ["--device", "0"],
                 "ranks 0 and 1 share device 0 on %s: ranks share a GPU in a job across nodes"
                 % two[0].addr)):
            res = refused_job(two, placement,
                              SHAPES["fp32"] + ["-d", "fp32", "-a", algo, "--op", "rs"] + extra)
            for r, (rc, so, se) in enumerate(res):
                assert rc != 0 and words in se, (algo, r, rc, so, se)
            print("  rs %s refused: %s" % (algo, res[0][2].strip().splitlines()[-1]))
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        for n in nodes:
            n.cleanup()


def test_large_rows():
    """256 MiB of rows each way between two daemons in one op (world 2,
    naive, fp32 16384 x 4096 shards): the reads go in pieces, so the links'
    heartbeats pass between them and count them as heard; in one read the
    link was declared dead behind it on UCX's TCP transport ("not heard
    from for 1089 ms", peer_timeout_ms 1000) and the job aborted."""
    nodes = cluster(2)
    stop = threading.Event()

    def watch():  # an operator watching the counters meanwhile, as in the failure seen
        while not stop.is_set():
            for n in nodes:
                n.ctl("stats", "--json")
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    try:
        before = [xfer_stats(n) for n in nodes]
        watcher.start()
        try:
            # the op's 256 MiB each way, under ASan on a busy 2-core host, has
            # taken over libovl's default 30 s, and the ranks about 40 s idle
            # (ctest bounds the whole file at 900 s): what is tested is that
            # it completes, not how fast
            run_job(nodes, [0, 1], ["-m", "16384", "-n", "4", "-k", "4096", "-d", "fp32", "-a",
                                    "naive", "--timeout", "180"], "fp32", timeout=300)
        finally:
            stop.set()
            watcher.join()
        shard = 16384 * 4096 * 4
        for n, b in zip(nodes, before):
            a = xfer_stats(n)
            assert a["xfer_bytes_in"] - b["xfer_bytes_in"] == shard, (n.addr, a, b)
            assert a["xfer_bytes_out"] - b["xfer_bytes_out"] == shard, (n.addr, a, b)
            assert a["xfer_errors"] == b["xfer_errors"], (n.addr, a, b)
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


def as_nobody():
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def run_as_nobody(node, rank, world, id_file, wait=5):
    return subprocess.run([EXAMPLE, "--rank", str(rank), "--world", str(world), "--id-file",
                           id_file, "--socket", node.d.socket, "--wait", str(wait)],
                          capture_output=True, text=True, timeout=60, preexec_fn=as_nobody,
                          cwd="/")


def readable_copy(tmp, src, name):
    """src's bytes in a file anyone may read."""
    dst = os.path.join(tmp, name)
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(f.read())
    os.chmod(dst, 0o644)
    return dst


def test_other_uid_learns_nothing():
    """Another uid joining with root's job id, on the node that holds
    root's ranks 0 and 1, is refused for being another user before anything
    about the job (its ranks' pids, its world) is said; root's job runs on."""
    if os.getuid() != 0:
        print("  SKIP: it needs root to run a rank as another user")
        return
    nodes = cluster(2)
    tmp = tempfile.mkdtemp(prefix="ovl-test-id-")
    try:
        os.chmod(tmp, 0o755)
        os.chmod(nodes[0].d.dir, 0o755)
        id_file = os.path.join(tmp, "job.id")
        args = SHAPES["fp32"] + ["-d", "fp32"]
        one = start_rank(nodes[0], 1, 3, id_file, args)
        zero = start_rank(nodes[0], 0, 3, id_file, args)
        deadline = time.monotonic() + 30

        def joined():
            jobs = status_json(nodes[0].d)["jobs"]
            return jobs and jobs[0]["local_ranks"] == 2

        while not (os.path.exists(id_file) and joined()):
            assert time.monotonic() < deadline and zero.poll() is None, "ranks 0, 1 not joined"
            time.sleep(0.05)
        theirs = readable_copy(tmp, id_file, "theirs.id")
        for rank, world in ((1, 3), (1, 2), (2, 3)):
            p = run_as_nobody(nodes[0], rank, world, theirs)
            assert p.returncode == 1, p
            assert "permission denied: job 'x-" in p.stderr and \
                "belongs to another user: only the uid that made a job may join it" in p.stderr, \
                p.stderr
            assert "pid" not in p.stderr and "already" not in p.stderr, p.stderr
        two = start_rank(nodes[1], 2, 3, id_file, args)
        res = finish([zero, one, two], nodes)
        assert [r[0] for r in res] == [0, 0, 0], res
        no_jobs_left(nodes)
        stop_clean(nodes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for n in nodes:
            n.cleanup()


def connected(listener, timeout):
    """Whether something connected to listener within timeout s."""
    r, _, _ = select.select([listener], [], [], timeout)
    if not r:
        return False
    listener.accept()[0].close()
    return True


def test_peer_allow():
    """A job id names its coordinator's address and port, and is the
    application's input: ovld connects only where its configuration lets
    it. peer_allow unset: another uid's id naming a node not linked is
    refused naming the rule, root's connects; peer_allow set: an address in
    none of its networks is refused for root too, one in them links and
    runs a job."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    target = "127.0.0.1:%d" % listener.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="ovl-test-id-")
    os.chmod(tmp, 0o755)
    forged = os.path.join(tmp, "forged.id")
    with open(forged, "wb") as f:
        f.write(forged_id(target))
    os.chmod(forged, 0o644)
    a = Node()
    nodes = []
    try:
        if os.getuid() == 0:
            os.chmod(a.d.dir, 0o755)
            p = run_as_nobody(a, 1, 2, forged)
            assert p.returncode == 1, p
            assert re.search(r"permission denied: job x-[0-9a-f]{16}: its coordinator %s is not "
                             r"linked to this node, and with peer_allow unset only root or "
                             r"ovld's own user \(uid 0\) may make ovld connect to a new node"
                             % re.escape(target), p.stderr), p.stderr
            assert not connected(listener, 0.5), "ovld connected for another uid"
        # root (or ovld's own user) may: ovld connects, and the handshake fails
        rank = start_rank(a, 1, 2, forged, [])
        try:
            assert connected(listener, 10), "root's job id made no connection"
        finally:
            rank.kill()
            rank.communicate()
        assert a.d.stop() == 0
        # peer_allow set: only its networks, whoever asks
        b = Node(extra="peer_allow = 127.0.0.2/32, 10.0.0.0/8\n")
        nodes.append(b)
        p = subprocess.run([EXAMPLE, "--rank", "1", "--world", "2", "--id-file", forged,
                            "--socket", b.d.socket, "--wait", "5"], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 1, p
        assert re.search(r"permission denied: job x-[0-9a-f]{16}: its coordinator %s is in no "
                         r"network of peer_allow: ovld connects only to the nodes its "
                         r"configuration allows" % re.escape(target), p.stderr), p.stderr
        assert not connected(listener, 0.5), "ovld connected outside peer_allow"
        assert "peer_allow" in b.log()
        assert b.d.stop() == 0
        # nodes that allow each other run a job
        nodes += [Node(extra="peer_allow = 127.0.0.0/8\n"), Node(extra="peer_allow = 127.0.0.1\n")]
        run_job(nodes[1:], [0, 1], SHAPES["fp32"] + ["-d", "fp32"], "fp32")
        stop_clean(nodes[1:])
    finally:
        listener.close()
        shutil.rmtree(tmp, ignore_errors=True)
        a.cleanup()
        for n in nodes:
            n.cleanup()


if __name__ == "__main__":
    if not os.path.exists(EXAMPLE):
        raise SystemExit("%s not built" % EXAMPLE)
    run_tests([test_world4_over_two, test_auto_measured_across_nodes, test_world6_over_three,
               test_shared_gpu, test_rs_across_nodes,
               test_large_rows,
               test_daemon_killed, test_wrong_key, test_other_uid_learns_nothing, test_peer_allow])
