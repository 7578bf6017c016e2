"""Isolation between jobs sharing a GPU on the CUDA backend: a job whose
clients do not ring their doorbells must not hold up another job's ops.

ovld enqueues an op's doorbell wait (`ready >= n`, docs/protocol.md) on its
own stream as soon as every rank's request is in, long before the clients'
streams reach the write: the wait sits at the head of that stream for as
long as the application's earlier work takes. The streams of one process
share the device's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS of them),
and a wait at the head of a queue holds up whatever else was put in it, so
one job's slow client could stall another job's work: a false dependency
between users of one GPU. This test requires there be none.

Three jobs on the GPUs (rank r of each job on GPU r mod G, so on one GPU
they all share it), each of WORLD ranks (--world, default 2), started in
this order:

- live job A: sets up, runs WARMUP ops (checked; the repeated ones replayed),
  and waits;
- the stalled job: sets up and warms up the same way, then enqueues on its
  stream a wait on a host word of its own (cuStreamWaitValue32), then OPS
  ops behind it, so that ovld has their requests and its waits but no
  `ready` comes; it says so, and keeps the word unset until the parent
  releases it (or STALL_LIMIT_S passes: no GPU stays stuck if the parent
  dies);
- live job B: sets up and warms up while the stalled job's waits stand.

Then A and B each run LIVE_OPS ops, each followed by a stream
synchronization, and must finish within LIVE_LIMIT_S, with the stalled
job's word still unset; the last op's result is checked. Only then is the
stalled job released, and its ops must complete, checked, within
LIVE_LIMIT_S. A live job that finishes only after the release fails the
test with "head-of-line blocking", and how long it took.

With --stalled-first the stalled job comes first, alone on the GPU, so
that ovld issues its ops ahead of their doorbells (a job alone on its GPUs
waits on nothing but itself), and their waits stand in the GPU's queues
when the live jobs come. ovld runs with hold_limit_ms = HOLD_LIMIT_MS: past
it, a job whose op issued ahead still waits for its doorbells on a GPU
another job shares is aborted (its doorbells released), so the live jobs'
ops must still finish within LIVE_LIMIT_S, the stalled job's word still
unset; after the release the stalled ranks must see the failure, naming
hold_limit_ms.

Each rank checks its results against a float32 torch product of every
rank's shard (relative error below 2e-2, bf16). Skips (exit 77, ctest's skip
code) without torch, without a GPU, or when ovld cannot start the CUDA
backend. --ovld-env KEY=VALUE (repeatable) adds to ovld's environment and
--conf LINE (repeatable) to its configuration file, for experiments.
OVL_LIBRARY names the libovl the package loads (ctest sets it)."""
import argparse
import ctypes
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from ovltest import share  # noqa: E402
from test_gpu_python import start_daemon, torch_or_skip  # noqa: E402

TOL = 2e-2
M, K, N = 256, 512, 384  # per rank: A is M x K, B K x N
WARMUP = 3
OPS = 3  # the stalled job's ops behind its wait (within max_in_flight)
LIVE_OPS = 50
LIVE_LIMIT_S = 30.0
STALL_LIMIT_S = 150.0  # the stalled ranks release themselves after this
SETUP_LIMIT_S = 120.0
HOLD_LIMIT_MS = 2000  # ovld's hold_limit_ms with --stalled-first
B_SETUP_LIMIT_S = 60.0  # live job B, set up while the stalled job's waits stand


def shard(torch, rank, i):
    """Rank `rank`'s A for op i, the same in every process."""
    g = torch.Generator().manual_seed(7919 * i + rank)
    return torch.rand((M, K), generator=g).sub_(0.5).to(torch.bfloat16)


def weights(torch, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand((K, N), generator=g).sub_(0.5).to(torch.bfloat16)


def rel_error(torch, c, world, i, b32, cuda):
    ga = torch.cat([shard(torch, r, i) for r in range(world)]).float().to(cuda)
    ref = ga @ b32
    return ((c.float() - ref).abs().max() / ref.abs().max()).item()


class HostWord:
    """A 32-bit word of mapped, pinned host memory that a stream can wait on
    (cuStreamWaitValue32, GEQ) and the CPU sets: the driver API through
    ctypes, in the context torch made current."""

    def __init__(self):
        cu = ctypes.CDLL("libcuda.so.1")
        self.cu = cu
        p = ctypes.c_void_p()
        # CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP
        rc = cu.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(64), ctypes.c_uint(0x3))
        assert rc == 0, "cuMemHostAlloc: CUresult %d" % rc
        self.host = p.value
        ctypes.c_uint32.from_address(self.host).value = 0
        d = ctypes.c_uint64()
        rc = cu.cuMemHostGetDevicePointer_v2(ctypes.byref(d), ctypes.c_void_p(self.host),
                                            ctypes.c_uint(0))
        assert rc == 0, "cuMemHostGetDevicePointer: CUresult %d" % rc
        self.dev = d.value

    def wait_on(self, stream_handle):
        """Enqueues on the stream a wait for the word >= 1."""
        rc = self.cu.cuStreamWaitValue32_v2(ctypes.c_void_p(stream_handle),
                                            ctypes.c_uint64(self.dev), ctypes.c_uint32(1),
                                            ctypes.c_uint(0))  # CU_STREAM_WAIT_VALUE_GEQ
        assert rc == 0, "cuStreamWaitValue32: CUresult %d" % rc

    def set(self):
        ctypes.c_uint32.from_address(self.host).value = 1


def rank_main(sock, arg, world, rank, q):
    """One rank of a job. arg: (job, role, go, release), role "live",
    "stalled" (its ops must complete, checked, after the release) or
    "aborted" (stalled, and its job must fail for its hold); go and release:
    the parent's events."""
    job, role, go, release = arg
    word = None
    try:
        import torch
        import ovl
        dev = rank % torch.cuda.device_count()
        torch.cuda.set_device(dev)
        cuda = torch.device("cuda", dev)
        b = weights(torch, 31 if role == "live" else 37).to(cuda)
        b32 = b.float()
        s = torch.cuda.Stream()
        with ovl.connect(sock) as client:
            comm = client.comm(job, world, rank, dev)
            a = torch.empty((M, K), dtype=torch.bfloat16, device=cuda)
            for i in range(WARMUP):
                with torch.cuda.stream(s):
                    a.copy_(shard(torch, rank, i).to(cuda))
                    c = comm.all_gather_matmul(a, b, stream=s)
                s.synchronize()
                comm.check()
                err = rel_error(torch, c, world, i, b32, cuda)
                assert err < TOL, "%s warm-up op %d: relative error %.3g" % (job, i, err)
            if role != "live":
                word = HostWord()
                srcs = [shard(torch, rank, WARMUP + j).to(cuda) for j in range(OPS)]
                hist = torch.empty((OPS, world * M, N), dtype=torch.bfloat16, device=cuda)
                torch.cuda.synchronize()
                with torch.cuda.stream(s):
                    word.wait_on(s.cuda_stream)
                    for j in range(OPS):
                        a.copy_(srcs[j])
                        c = comm.all_gather_matmul(a, b, stream=s)
                        hist[j].copy_(c)
                q.put((rank, "stalling", None))
                released = release.wait(STALL_LIMIT_S)
                word.set()
                s.synchronize()
                if role == "aborted":
                    try:
                        comm.check()
                    except Exception as e:  # ovl.Error
                        if "hold_limit_ms" not in str(e):
                            raise AssertionError("%s failed, but not for its hold: %r" % (job, e))
                    else:
                        raise AssertionError("%s did not fail for its hold" % job)
                    try:
                        comm.close()
                    except Exception:
                        pass  # the same failure
                    q.put((rank, ("released", released), None))
                    return
                comm.check()
                for j in range(OPS):
                    err = rel_error(torch, hist[j], world, WARMUP + j, b32, cuda)
                    assert err < TOL, "%s op %d after the release: relative error %.3g" % (
                        job, WARMUP + j, err)
                q.put((rank, ("released", released), None))
            else:
                srcs = [shard(torch, rank, i).to(cuda) for i in range(WARMUP, WARMUP + 4)]
                torch.cuda.synchronize()
                q.put((rank, "ready", None))
                assert go.wait(SETUP_LIMIT_S), "no go from the parent"
                t0 = time.monotonic()
                for j in range(LIVE_OPS):
                    with torch.cuda.stream(s):
                        a.copy_(srcs[j % len(srcs)])
                        c = comm.all_gather_matmul(a, b, stream=s)
                    s.synchronize()
                elapsed = time.monotonic() - t0
                comm.check()
                last = WARMUP + (LIVE_OPS - 1) % len(srcs)
                err = rel_error(torch, c, world, last, b32, cuda)
                assert err < TOL, "%s op %d: relative error %.3g" % (job, LIVE_OPS - 1, err)
                q.put((rank, ("done", elapsed), None))
            comm.close()
    except BaseException as e:  # the parent reports it
        import traceback
        if word is not None:
            word.set()  # never leave the GPU waiting
        q.put((rank, None, "%r\n%s" % (e, traceback.format_exc())))


class Job:
    """WORLD spawned rank processes of one job, reporting on one queue."""

    def __init__(self, ctx, d, job, role, world, go, release):
        self.name, self.world = job, world
        self.q = ctx.Queue()
        self.ps = [ctx.Process(target=rank_main, args=(d.socket, (job, role, go, release),
                                                       world, r, self.q))
                   for r in range(world)]
        for p in self.ps:
            p.start()

    def collect(self, d, timeout):
        """{rank: what it put}, one message a rank; None if not every rank
        answered within timeout seconds; an AssertionError on a rank's
        error (with ovld's log)."""
        import queue
        got = {}
        deadline = time.monotonic() + timeout
        while len(got) < self.world:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                r, res, err = self.q.get(timeout=left)
            except queue.Empty:
                return None
            assert err is None, "%s rank %d failed: %s\novld:\n%s" % (
                self.name, r, err, d.log_text()[-3000:])
            got[r] = res
        return got

    def end(self):
        for p in self.ps:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2, help="ranks of each job (default 2)")
    ap.add_argument("--stalled-first", action="store_true",
                    help="the stalled job first, alone on the GPU (above)")
    ap.add_argument("--ovld-env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--conf", action="append", default=[], metavar="LINE")
    args = ap.parse_args()
    world = args.world
    torch, mp = torch_or_skip()
    ngpu = torch.cuda.device_count()
    env = dict(kv.split("=", 1) for kv in args.ovld_env)
    conf = list(args.conf)
    if args.stalled_first:
        conf.insert(0, "hold_limit_ms = %d" % HOLD_LIMIT_MS)
    config = "".join(line + "\n" for line in conf) if conf else None
    d = start_daemon(config, env or None)
    ctx = mp.get_context("spawn")
    go, release = ctx.Event(), ctx.Event()
    jobs = []
    t0 = time.monotonic()
    try:
        print("3 jobs of world %d on %d GPU%s: %s; %s%s%s" % (
            world, ngpu, "" if ngpu == 1 else "s", share(world, ngpu),
            "the stalled job first" if args.stalled_first else "live job A first",
            "; ovld env " + " ".join(args.ovld_env) if args.ovld_env else "",
            "; conf " + "; ".join(conf) if conf else ""), flush=True)
        tag = "%d" % os.getpid()
        # (name, role) in the order they start; each sets up before the next
        order = [("live-a", "live"), ("stalled", "stalled"), ("live-b", "live")]
        if args.stalled_first:
            order = [("stalled", "aborted"), ("live-a", "live"), ("live-b", "live")]
        byname = {}
        for name, role in order:
            j = Job(ctx, d, "%s-%s" % (name, tag), role, world, go, release)
            jobs.append(j)
            byname[name] = j
            stalled_before = "stalled" in byname and name != "stalled"
            limit = B_SETUP_LIMIT_S if stalled_before else SETUP_LIMIT_S
            if j.collect(d, limit) is None:
                if not stalled_before:
                    raise AssertionError("job %s did not set up in %.0f s" % (name, limit))
                release.set()
                late = j.collect(d, LIVE_LIMIT_S)
                raise AssertionError(
                    "head-of-line blocking: job %s's warm-up did not complete in %.0f s while "
                    "the stalled job's doorbells stood%s" % (
                        name, limit, ", and did once it was released" if late else ""))
            if name == "stalled":
                time.sleep(0.5)  # its requests reach ovld, which enqueues their waits
        print("%s set up (%.1f s); the stalled job's %d ops wait" % (
            ", ".join(n for n, _ in order), time.monotonic() - t0, OPS), flush=True)
        go.set()
        tg = time.monotonic()
        live = {}
        for name in ("live-a", "live-b"):
            j = byname[name]
            got = j.collect(d, max(0.0, tg + LIVE_LIMIT_S - time.monotonic()))
            if got is None:
                release.set()
                tr = time.monotonic()
                late = j.collect(d, LIVE_LIMIT_S)
                raise AssertionError(
                    "head-of-line blocking: job %s's %d ops did not complete in %.0f s "
                    "while the stalled job's doorbells stood%s" % (
                        name, LIVE_OPS, LIVE_LIMIT_S,
                        "; they did %.1f s after its release" % (time.monotonic() - tr)
                        if late else ""))
            live[name] = max(res[1] for res in got.values())
        print("live jobs' %d ops each, the stalled job's word unset: A %.3f s, B %.3f s "
              "(%.0f and %.0f us an op)" % (LIVE_OPS, live["live-a"], live["live-b"],
                                            1e6 * live["live-a"] / LIVE_OPS,
                                            1e6 * live["live-b"] / LIVE_OPS), flush=True)
        release.set()
        got = byname["stalled"].collect(d, LIVE_LIMIT_S)
        assert got is not None, "the stalled job's ranks did not finish within %.0f s of " \
            "its release" % LIVE_LIMIT_S
        assert all(res[1] for res in got.values()), \
            "a stalled rank released itself (the stall outlived STALL_LIMIT_S)"
        if args.stalled_first:
            assert "hold_limit_ms" in d.log_text(), "ovld did not log the stalled job's abort"
            print("the stalled job failed for its hold (hold_limit_ms %d), as its ranks saw "
                  "after the release" % HOLD_LIMIT_MS, flush=True)
        else:
            print("the stalled job's %d ops completed, checked, after its release" % OPS,
                  flush=True)
        for j in jobs:
            j.end()
        assert d.stop() == 0, d.log_text()[-3000:]
        print("PASS test_gpu_isolation world %d%s %.1f s" % (
            world, " stalled first" if args.stalled_first else "", time.monotonic() - t0))
    finally:
        release.set()
        go.set()
        for j in jobs:
            j.end()
        d.cleanup()


if __name__ == "__main__":
    main()
