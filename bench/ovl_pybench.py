#!/usr/bin/env python3
"""ovl_pybench: what the ovl Python package costs on top of libovl (issue 14).

Runs against an ovld on the CUDA backend that is already running. W rank
processes (--world, spawned; rank r on GPU r mod G) join one job, one comm
each, and measure on random data:

  host   the host time of one call, p50 and p99 over --calls calls: the
         Python call `comm.all_gather_matmul(a, b, out=c, stream=s)` against
         libovl's own submit, a direct ctypes call of
         `ovl_allgather_gemm(handle, byref(desc), stream)` with the desc built
         once as the package builds it. The calls alternate (ABBA) so that
         drift hits both, on a small shape, and the stream is synchronized
         after every call outside the timed region, so that the submit window
         never blocks. Target: p50(Python) - p50(libovl) <= 15 us.

  gpu    the time per op on the GPU at --shape (8192x8192x8192, bf16): the
         Python path timed as ovl-bench times the C path (CUDA events between
         back-to-back ops on one stream, at most 32 ops ahead, median), and
         the C path's figure from ovl-bench itself, run on the same ovld with
         the same world, shape, dtype, algorithm and chunks. --rounds rounds
         alternate the order of the two; each path's figure is the median
         over rounds. Target: Python / C <= 1.02.

Every figure is the maximum over ranks. The table is printed and appended to
--results. Exit status: 0 when everything ran (PASS or MISS: a MISS is said
clearly, it is no error), 1 on an error, 2 for bad arguments, 77 where it
cannot run (no torch, no GPU). See bench/README.md.
"""
import argparse
import ctypes
import datetime
import gc
import glob
import math
import multiprocessing
import multiprocessing.connection
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid

HOST_TARGET_US = 15.0   # p50(Python call) - p50(libovl's submit)
GPU_TARGET_RATIO = 1.02  # Python path / C path, time per op on the GPU

SUBMIT_WINDOW = 32        # ovl-bench's: ops a rank may be ahead of its completed ones
CLIENT_TIMEOUT_MS = 120000  # ovl-bench's: the first op may wait for ovld's setup
MAX_WORLD = 16            # ovl-bench's
MAX_ITERS = 10000         # ovl-bench's
SEED = 0x6F766C7079       # the data are the same in every run
# The largest relative error ||C - ref|| / ||ref|| accepted (ovl-bench's).
TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-5}
ALGOS = ("auto", "naive", "collective", "ring")

EXIT_FAIL, EXIT_USAGE, EXIT_SKIP = 1, 2, 77

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BenchError(Exception):
    """A failure, said in one message."""


class SkipRun(BenchError):
    """The benchmark cannot run here (no torch, no GPU): exit 77."""


# ------------------------------------------------------------------ helpers

def parse_shape(text):
    """(M, K, N) from 'MxKxN' (positive integers)."""
    parts = text.lower().split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != 3 or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError("%r: MxKxN with positive integers" % text)
    return dims


def shape_str(s):
    return "%dx%dx%d" % s


def percentile(sorted_xs, q):
    """The q-quantile (0..1) of sorted_xs, linearly interpolated: for q = 0.5
    the median as ovl-bench takes it (the mean of the middle two when the
    count is even)."""
    if not sorted_xs:
        raise ValueError("no samples")
    pos = q * (len(sorted_xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def median(xs):
    return percentile(sorted(xs), 0.5)


def share_str(world, ngpu):
    """How many ranks each GPU holds, in ovl-bench's words."""
    used = min(world, ngpu)
    lo, hi = world // used, -(-world // used)
    if lo == hi:
        return "%d rank%s per GPU%s" % (lo, "" if lo == 1 else "s", ", shared" if lo > 1 else "")
    return "%d to %d ranks per GPU, shared" % (lo, hi)


SHARED_NOTE = ("ranks share GPUs: each time includes the other ranks' work on the same GPU, so "
               "it is no overlap figure; the Python and the C path share it the same way.")


def expected_chunks_cell(algo, chunks):
    """What ovl-bench's table says in its chunks column for (algo, chunks)."""
    if algo == "naive":
        return "-"
    return "auto" if chunks == 0 else str(chunks)


def parse_bench_table(text, shape, algo, chunks):
    """The median ms of row `ovl <algo>` at `shape` and `chunks` in
    ovl-bench's markdown table (`--results`), and its `gemm` baseline (None if
    absent). BenchError if the table or the row is not there as expected."""
    header = None
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cols = [c.strip() for c in line.strip("|").split("|")]
        if cols and cols[0] == "shape (MxKxN)":
            header = cols
            continue
        rows.append(cols)
    if header is None:
        raise BenchError("ovl-bench's results have no table (no '| shape (MxKxN) |' header)")
    if len(header) < 4 or header[1:4] != ["what", "chunks", "median ms"]:
        raise BenchError("ovl-bench's table has columns %s; this script reads 'shape (MxKxN)', "
                         "'what', 'chunks', 'median ms'" % header)
    want = ("ovl " + algo, expected_chunks_cell(algo, chunks))
    hits = [c for c in rows if len(c) >= 4 and c[0] == shape and (c[1], c[2]) == want]
    if len(hits) != 1:
        raise BenchError("ovl-bench's table has %d rows for shape %s, what '%s', chunks '%s' "
                         "(expected 1)" % (len(hits), shape, want[0], want[1]))
    try:
        ms = float(hits[0][3])
    except ValueError:
        raise BenchError("ovl-bench's median for %s %s: %r is not a number" % (
            shape, want[0], hits[0][3]))
    if not (math.isfinite(ms) and ms > 0):
        raise BenchError("ovl-bench's median for %s %s is %r" % (shape, want[0], hits[0][3]))
    gemm = None
    for c in rows:
        if len(c) >= 4 and c[0] == shape and c[1] == "gemm":
            try:
                gemm = float(c[3])
            except ValueError:
                gemm = None
    return ms, gemm


def find_bench(explicit):
    """The ovl-bench to run: --bench, else build/gpu/bench/ovl-bench, else
    the newest build/*/bench/ovl-bench, else one next to this script (an
    installed copy), else ovl-bench on PATH."""
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise BenchError("--bench %s: not an executable file" % explicit)
        return explicit
    cands = [os.path.join(ROOT, "build", "gpu", "bench", "ovl-bench")]
    cands += sorted(glob.glob(os.path.join(ROOT, "build", "*", "bench", "ovl-bench")),
                    key=lambda p: os.stat(p).st_mtime, reverse=True)
    cands.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ovl-bench"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    found = shutil.which("ovl-bench")
    if found:
        return found
    raise BenchError("no ovl-bench found (looked in build/gpu/bench, build/*/bench, next to "
                     "this script and on PATH): build it (-DOVL_CUDA=ON) or give --bench PATH")


def git_label():
    try:
        p = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return p.stdout.strip() if p.returncode == 0 else ""


def _die_with_parent():
    """After fork: SIGKILL when the process that started us dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def import_ovl():
    """The ovl package: the repository's python/ first where it is there (the
    code under test), else the installed one."""
    here = os.path.join(ROOT, "python")
    if os.path.isfile(os.path.join(here, "ovl", "__init__.py")) and here not in sys.path:
        sys.path.insert(0, here)
    try:
        import ovl
    except ImportError as e:
        raise BenchError("the ovl package does not import (%s): run from the repository or "
                         "pip install ./python" % e)
    return ovl


# ------------------------------------------------------------------ a rank

class _Case:
    """A shard A (m x k), B (k x n), C (world*m x n) on the rank's GPU, the
    data random and never zero, and the float64 reference of C, made once."""

    def __init__(self, rank, m, k, n, which):
        self.r, self.m, self.k, self.n, self.which = rank, m, k, n, which
        torch, r = rank.torch, rank
        self.a = r.rand((m, k), r.rank, 2 * which).to(r.device)
        self.b = r.rand((k, n), r.rank, 2 * which + 1).to(r.device)
        self.c = torch.empty((r.world * m, n), dtype=r.dtype, device=r.device)
        self.ref = None

    def rel_error(self):
        """||C - ref|| / ||ref||, inf where C is not finite (the streams
        must be done)."""
        r = self.r
        torch = r.torch
        if self.ref is None:
            ga = torch.cat([r.rand((self.m, self.k), q, 2 * self.which)
                            for q in range(r.world)]).to(r.device)
            self.ref = ga.double() @ self.b.double()
            del ga
        if not bool(torch.isfinite(self.c).all()):
            return math.inf
        diff = (self.c.double() - self.ref).norm().item()
        ref = self.ref.norm().item()
        if ref == 0:
            return 0.0 if diff == 0 else math.inf
        return diff / ref


class _Rank:
    """One rank: torch on GPU rank mod G, a client of ovld and the comm."""

    def __init__(self, rank, cfg):
        try:
            import torch
        except ImportError as e:
            raise SkipRun("no torch (%s)" % e)
        import ovl
        self.torch, self.ovl = torch, ovl
        self.rank, self.world = rank, cfg["world"]
        self.dtype_name = cfg["dtype"]
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16,
                      "fp32": torch.float32}[cfg["dtype"]]
        self.dtype_code = {"bf16": ovl._lib.DTYPE_BF16, "fp16": ovl._lib.DTYPE_FP16,
                           "fp32": ovl._lib.DTYPE_FP32}[cfg["dtype"]]
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            raise SkipRun("no GPU visible to torch")
        self.ngpu = torch.cuda.device_count()
        self.dev = rank % self.ngpu
        torch.cuda.set_device(self.dev)  # first: nothing makes a context on another GPU
        self.device = torch.device("cuda", self.dev)
        self.client = ovl.connect(cfg["socket"], timeout_ms=CLIENT_TIMEOUT_MS)
        info = self.client.info()
        if info["backend"] != "cuda":
            raise BenchError("ovld (pid %d) runs the %s backend, not cuda" % (
                info["pid"], info["backend"]))
        if self.dev >= info["ndevices"]:
            raise BenchError("rank %d is on GPU %d, but ovld has %d device%s" % (
                rank, self.dev, info["ndevices"], "" if info["ndevices"] == 1 else "s"))
        self.comm = self.client.comm(cfg["job"], self.world, rank, self.dev)
        self.stream = torch.cuda.Stream(device=self.device)
        self.cases = {}
        self.info = {
            "device_name": torch.cuda.get_device_name(self.dev),
            "ngpu": self.ngpu,
            "dev": self.dev,
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda or "?",
            "ovl": ovl.__version__,
            "ovl_file": os.path.dirname(os.path.abspath(ovl.__file__)),
            "library": ovl.library_path(),
            "ovld": info["version"],
            "ovld_devices": info["ndevices"],
        }

    def rand(self, shape, rank, which):
        """Uniform in [-1, 1), from a generator seeded by (rank, which): any
        rank can make any rank's data."""
        torch = self.torch
        g = torch.Generator().manual_seed(SEED + 7919 * rank + which)
        return torch.rand(shape, generator=g).mul_(2).sub_(1).to(self.dtype)

    def case(self, key, m, k, n, which):
        if key not in self.cases:
            self.cases[key] = _Case(self, m, k, n, which)
            self.torch.cuda.synchronize()
        return self.cases[key]

    def check(self, case, what):
        err = case.rel_error()
        if not err < TOLERANCE[self.dtype_name]:
            raise BenchError("%s: C is wrong: relative error %.3g (tolerance %.0e)" % (
                what, err, TOLERANCE[self.dtype_name]))
        return err

    def host(self, p):
        """p50/p99 host time of the Python call and of libovl's submit."""
        ovl, torch = self.ovl, self.torch
        m, k, n = p["shape"]
        cs = self.case("host", m, k, n, 0)
        a, b, c, s = cs.a, cs.b, cs.c, self.stream
        comm, algo, chunks = self.comm, p["algo"], p["chunks"]
        lib = ovl._lib
        # The desc as Comm.all_gather_matmul builds it for one B (nb 1,
        # more_bs an array of one, unused), built once.
        more = (lib.MoreB * 1)()
        desc = lib.AgGemmDesc(
            a=a.data_ptr(), lda=k, b=b.data_ptr(), ldb=n, transb=0, c=c.data_ptr(), ldc=n,
            a_out=None, lda_out=0, m=m, n=n, k=k, dtype=self.dtype_code,
            algo=lib.ALGOS[algo], chunks=chunks, streams=0, nb=1,
            more_bs=ctypes.cast(more, ctypes.POINTER(lib.MoreB)))
        submit = lib.lib().ovl_allgather_gemm
        handle = comm._handle()
        sp = s.cuda_stream or None
        byref = ctypes.byref
        clock = time.perf_counter_ns
        call = comm.all_gather_matmul
        client = self.client

        def py():
            t0 = clock()
            call(a, b, out=c, stream=s, algo=algo, chunks=chunks)
            t1 = clock()
            s.synchronize()
            return t1 - t0

        def raw():
            t0 = clock()
            st = submit(handle, byref(desc), sp)
            t1 = clock()
            if st != lib.OK:
                raise client._error(st)
            s.synchronize()
            return t1 - t0

        with torch.cuda.stream(s):
            c.fill_(float("nan"))
        for _ in range(p["warmup"]):
            py()
            raw()
        comm.check()
        tpy, traw = [], []
        gc.collect()
        for i in range(p["calls"]):
            if i & 1:
                traw.append(raw())
                tpy.append(py())
            else:
                tpy.append(py())
                traw.append(raw())
        comm.synchronize()
        res = {}
        for name, ts in (("py", tpy), ("raw", traw)):
            us = sorted(t / 1000.0 for t in ts)
            res[name] = {"p50": percentile(us, 0.5), "p99": percentile(us, 0.99),
                         "min": us[0], "max": us[-1]}
        res["rel_err"] = self.check(cs, "host part") if p["check"] else None
        return res

    def gpu(self, p):
        """The Python path's median time per op, as ovl-bench times the C
        path (bench/ovl_bench.c, run_config)."""
        torch = self.torch
        M, K, N = p["shape"]
        m = M // self.world
        cs = self.case("gpu", m, K, N, 1)
        if p["check"] and cs.ref is None:
            cs.rel_error()  # the reference once, before anything is timed
            torch.cuda.synchronize()
        a, b, c, s = cs.a, cs.b, cs.c, self.stream
        comm, algo, chunks = self.comm, p["algo"], p["chunks"]
        iters = p["iters"]
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        with torch.cuda.stream(s):
            c.fill_(float("nan"))  # a result never written shows
        for i in range(p["warmup"]):
            if i > 0 and i % SUBMIT_WINDOW == 0:
                s.synchronize()
            comm.all_gather_matmul(a, b, out=c, stream=s, algo=algo, chunks=chunks)
        # the timed ops start on an idle stream, as ovl-bench's
        s.synchronize()
        comm.check()
        ev[0].record(s)
        for i in range(iters):
            if i >= SUBMIT_WINDOW:
                ev[i - SUBMIT_WINDOW + 1].synchronize()
            comm.all_gather_matmul(a, b, out=c, stream=s, algo=algo, chunks=chunks)
            ev[i + 1].record(s)
        s.synchronize()
        comm.synchronize()
        ts = sorted(ev[i].elapsed_time(ev[i + 1]) for i in range(iters))
        return {"median_ms": percentile(ts, 0.5), "min_ms": ts[0], "max_ms": ts[-1],
                "rel_err": self.check(cs, "GPU part") if p["check"] else None}

    def close(self):
        """Leaves the job (waits for the ops) and disconnects; the tensors
        ovld mapped stay allocated until then."""
        comm, self.comm = self.comm, None
        if comm is not None:
            comm.close()
        client, self.client = self.client, None
        if client is not None:
            client.close()


def rank_main(conn, rank, cfg):
    """A rank process: answers the parent's commands on conn with
    (kind, command, result): kind "ok", "error" (result: the message) or
    "skip"."""
    _die_with_parent()
    if os.getppid() != cfg["parent_pid"]:
        os._exit(EXIT_FAIL)
    cmd = "start"
    try:
        r = _Rank(rank, cfg)
        conn.send(("ok", "ready", r.info))
        while True:
            msg = conn.recv()
            cmd = msg[0]
            if cmd == "quit":
                r.close()
                conn.send(("ok", cmd, None))
                return
            if cmd == "host":
                conn.send(("ok", cmd, r.host(msg[1])))
            elif cmd == "gpu":
                conn.send(("ok", cmd, r.gpu(msg[1])))
            else:
                raise BenchError("unknown command %r" % (cmd,))
    except EOFError:
        os._exit(EXIT_FAIL)  # the parent is gone
    except SkipRun as e:
        _send_and_die(conn, ("skip", cmd, str(e)))
    except BaseException as e:
        ovl = sys.modules.get("ovl")
        if isinstance(e, BenchError) or (ovl is not None and isinstance(e, ovl.Error)):
            text = "rank %d, %s: %s" % (rank, cmd, e)
        else:
            text = "rank %d, %s: %s: %s\n%s" % (rank, cmd, type(e).__name__, e,
                                                traceback.format_exc().rstrip())
        _send_and_die(conn, ("error", cmd, text))


def _send_and_die(conn, msg):
    try:
        conn.send(msg)
    except Exception:
        pass
    # At once: closing the comm would wait for ops that a peer may never
    # match; ovld cleans up after a client that disconnects.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_FAIL)


# ------------------------------------------------------------------ the parent

class Ranks:
    """The W rank processes and their pipes; every wait is bounded by the
    run's deadline."""

    def __init__(self, world, cfg, deadline):
        self.world, self.cfg, self.deadline = world, cfg, deadline
        self.procs, self.conns = [], []

    def start(self):
        ctx = multiprocessing.get_context("spawn")
        for r in range(self.world):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=rank_main, args=(theirs, r, self.cfg),
                            name="ovl_pybench-rank%d" % r, daemon=True)
            p.start()
            theirs.close()
            self.procs.append(p)
            self.conns.append(mine)

    def ask(self, cmd, payload, doing):
        for r, c in enumerate(self.conns):
            try:
                c.send((cmd, payload))
            except (OSError, ValueError) as e:
                raise BenchError("rank %d is gone (%s) before %s" % (r, e, doing))
        return self.collect(doing)

    def collect(self, doing):
        """Every rank's answer, in rank order; BenchError on the first
        error, on a rank that ends without one, or past the deadline."""
        got = {}
        while len(got) < self.world:
            left = self.deadline - time.monotonic()
            todo = [r for r in range(self.world) if r not in got]
            if left <= 0:
                raise BenchError("the run took longer than --timeout while %s (ranks %s had "
                                 "not answered)" % (doing, ", ".join(map(str, todo))))
            multiprocessing.connection.wait(
                [self.conns[r] for r in todo] + [self.procs[r].sentinel for r in todo], left)
            for r in todo:
                c = self.conns[r]
                if c.poll():
                    try:
                        kind, _, res = c.recv()
                    except EOFError:
                        self.procs[r].join(1)
                        raise BenchError("rank %d ended (exit code %s) while %s, without a "
                                         "word" % (r, self.procs[r].exitcode, doing))
                    if kind == "skip":
                        raise SkipRun(res)
                    if kind != "ok":
                        raise BenchError(res)
                    got[r] = res
                elif not self.procs[r].is_alive():
                    raise BenchError("rank %d ended (exit code %s) while %s, without a word" % (
                        r, self.procs[r].exitcode, doing))
        return [got[r] for r in range(self.world)]

    def close(self):
        """Every rank leaves the job and exits."""
        self.ask("quit", None, "leaving the job")
        for p in self.procs:
            p.join(max(1.0, min(30.0, self.deadline - time.monotonic())))

    def kill(self):
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(3)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in self.conns:
            c.close()


def run_c_bench(args, bench, socket, deadline):
    """ovl-bench at the same world, shape, dtype, algorithm and chunks:
    (its median ms per op, the max over its ranks; its cuBLASLt GEMM
    baseline or None; the seconds it took; its first line of output)."""
    left = deadline - time.monotonic()
    if left < 5:
        raise BenchError("the run took longer than --timeout before ovl-bench")
    tmp = tempfile.mkdtemp(prefix="ovl_pybench.")
    try:
        res = os.path.join(tmp, "results.md")
        cmd = [bench, "--socket", socket, "--world", str(args.world), "--dtype", args.dtype,
               "--shapes", shape_str(args.shape), "--algos", args.algo,
               "--chunks", str(args.chunks), "--warmup", str(args.warmup),
               # the Python path warms up by --warmup ops alone: so does the
               # C path here, and the rounds alternate which runs first
               "--settle-ms", "0",
               "--iters", str(args.iters), "--results", res, "--no-check",
               "--label", "ovl_pybench", "--timeout", str(max(1, int(left)))]
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               encoding="utf-8", errors="replace", timeout=left,
                               preexec_fn=_die_with_parent)
        except subprocess.TimeoutExpired:
            raise BenchError("ovl-bench did not end within the run's --timeout")
        except OSError as e:
            raise BenchError("cannot run %s: %s" % (bench, e))
        took = time.monotonic() - t0
        lines = p.stdout.rstrip().splitlines()
        last = lines[-1] if lines else "(no output)"
        tail = "\n".join(lines[-25:])
        if p.returncode == EXIT_SKIP:
            raise SkipRun(last)
        if p.returncode != 0:
            raise BenchError("ovl-bench exited with %d: %s\nits last lines:\n%s\n(command: %s)"
                             % (p.returncode, last, tail, " ".join(cmd)))
        try:
            with open(res, encoding="utf-8", errors="replace") as f:
                table = f.read()
        except OSError as e:
            raise BenchError("ovl-bench exited 0 but wrote no results (%s)\nits last lines:\n%s"
                             % (e, tail))
        try:
            ms, gemm = parse_bench_table(table, shape_str(args.shape), args.algo, args.chunks)
        except BenchError as e:
            raise BenchError("%s\nits results file:\n%s" % (e, table.strip()))
        first = p.stdout.splitlines()[0] if p.stdout else ""
        return ms, gemm, took, first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fmt_us(x):
    return "%.1f us" % x


def fmt_ms(x):
    return "%.4f ms" % x


TABLE_HEADER = ["| measure | shape | Python | C | Python - C | Python / C | target | result |",
                "|---|---|---|---|---|---|---|---|"]


def build_report(args, infos, host, gpu, when, label):
    """(the heading for stdout; the heading and the lines above the table
    for results.md; the table and the verdicts, markdown, for both; the
    misses, empty when every target was met)."""
    i0 = infos[0]
    ngpu = i0["ngpu"]
    used = min(args.world, ngpu)
    share = share_str(args.world, ngpu)
    shared = args.world > ngpu
    lib = i0["library"] or "?"
    if lib.startswith(ROOT + os.sep):
        lib = os.path.relpath(lib, ROOT)
    ovl_dir = i0["ovl_file"]
    if ovl_dir.startswith(ROOT + os.sep):
        ovl_dir = os.path.relpath(ovl_dir, ROOT)
    md = ["## %s — %s x %d, world %d (%s), %s: ovl_pybench, the Python path against the C "
          "path" % (when, i0["device_name"], used, args.world, share, args.dtype), ""]
    if shared:
        md += [SHARED_NOTE, ""]
    parts = []
    if host is not None:
        parts.append("host: %s per rank (m x K x N), %d calls of each path after %d warm-up, "
                     "alternating, the stream synchronized after each call outside the timing"
                     % (shape_str(args.host_shape), args.calls, args.host_warmup))
    if gpu is not None:
        parts.append("GPU: warmup %d, iters %d, median per op, %d round%s alternating with "
                     "ovl-bench (median over rounds)" % (
                         args.warmup, args.iters, args.rounds, "" if args.rounds == 1 else "s"))
    md += ["torch %s (CUDA %s), Python %s, ovl %s (%s), libovl %s, ovld %s; algo %s, chunks %s; "
           "%s; check %s; label: %s." % (
               i0["torch"], i0["torch_cuda"], platform.python_version(), i0["ovl"], ovl_dir,
               lib, i0["ovld"], args.algo, expected_chunks_cell(args.algo, args.chunks),
               "; ".join(parts), "off" if args.no_check else "on", label or "-"), ""]
    table = list(TABLE_HEADER)
    verdicts, misses = [], []
    if host is not None:
        ov = host["overhead_p50"]
        ok = ov <= HOST_TARGET_US
        res = "PASS" if ok else "MISS"
        hs = "%s per rank" % shape_str(args.host_shape)
        table.append(
            "| host time per call, p50 | %s | %s | %s | %+.1f us | %.2f | Python - C <= %g us "
            "| %s |" % (hs, fmt_us(host["py_p50"]), fmt_us(host["raw_p50"]), ov,
                        host["py_p50"] / host["raw_p50"], HOST_TARGET_US, res))
        table.append("| host time per call, p99 | %s | %s | %s | %+.1f us | %.2f | - | - |" % (
            hs, fmt_us(host["py_p99"]), fmt_us(host["raw_p99"]),
            host["py_p99"] - host["raw_p99"], host["py_p99"] / host["raw_p99"]))
        verdicts.append("host overhead per call, p50 (Python call - libovl's submit): %+.1f us: "
                        "%s (target <= %g us)" % (ov, res, HOST_TARGET_US))
        if not ok:
            misses.append("host overhead %+.1f us > %g us" % (ov, HOST_TARGET_US))
    if gpu is not None:
        ratio = gpu["py_ms"] / gpu["c_ms"]
        ok = ratio <= GPU_TARGET_RATIO
        res = "PASS" if ok else "MISS"
        table.append(
            "| GPU time per op, median | %s | %s | %s | %+.4f ms | %.3f | Python / C <= %.2f "
            "| %s |" % (shape_str(args.shape), fmt_ms(gpu["py_ms"]), fmt_ms(gpu["c_ms"]),
                        gpu["py_ms"] - gpu["c_ms"], ratio, GPU_TARGET_RATIO, res))
        verdicts.append("GPU time per op at %s, Python / C (ovl-bench): %.3f: %s (target <= %.2f)"
                        % (shape_str(args.shape), ratio, res, GPU_TARGET_RATIO))
        verdicts.append("rounds, Python / C ms: %s" % ", ".join(
            "%.4f / %.4f" % rc for rc in zip(gpu["py_rounds"], gpu["c_rounds"])))
        if not ok:
            misses.append("GPU ratio %.3f > %.2f" % (ratio, GPU_TARGET_RATIO))
    table.append("")
    table += ["- " + v for v in verdicts]
    heading = "world %d on %d GPU%s (%s): ovl_pybench, %s, %s%s" % (
        args.world, used, "" if used == 1 else "s", share, i0["device_name"], args.dtype,
        "; ranks share GPUs: no overlap figure" if shared else "")
    return heading, md, table, misses


def aggregate_host(per_rank):
    """The max over ranks of each figure; the overhead is the largest
    per-rank p50(Python) - p50(libovl)."""
    return {
        "py_p50": max(r["py"]["p50"] for r in per_rank),
        "py_p99": max(r["py"]["p99"] for r in per_rank),
        "raw_p50": max(r["raw"]["p50"] for r in per_rank),
        "raw_p99": max(r["raw"]["p99"] for r in per_rank),
        "overhead_p50": max(r["py"]["p50"] - r["raw"]["p50"] for r in per_rank),
    }


def parse_args(argv):
    def positive(text):
        try:
            v = int(text)
        except ValueError:
            v = 0
        if v < 1:
            raise argparse.ArgumentTypeError("%r: a positive integer" % text)
        return v

    def count(text):
        try:
            v = int(text)
        except ValueError:
            v = -1
        if not 0 <= v <= MAX_ITERS:
            raise argparse.ArgumentTypeError("%r: 0 to %d" % (text, MAX_ITERS))
        return v

    ap = argparse.ArgumentParser(
        prog="ovl_pybench",
        description="What the ovl Python package costs on top of libovl: the host time of one "
                    "Comm.all_gather_matmul call against libovl's own submit (target: at most "
                    "%g us more at p50), and the GPU time per op of the Python path against "
                    "ovl-bench's C path (target: at most %.2fx). ovld must be running with the "
                    "CUDA backend." % (HOST_TARGET_US, GPU_TARGET_RATIO),
        epilog="Exit status: 0 when everything ran (each target says PASS or MISS), 1 on an "
               "error, 2 for bad arguments, 77 without torch or a GPU. OVL_LIBRARY names the "
               "libovl that the ovl package loads (python/README.md).")
    ap.add_argument("--socket", metavar="PATH",
                    help="ovld's socket (default: $OVL_SOCKET, else libovl's rule, "
                         "ovl.default_socket())")
    ap.add_argument("--world", type=positive, default=1, metavar="W",
                    help="ranks, one process each; rank r on GPU r mod G, so with more ranks "
                         "than GPUs they share GPUs (default 1, at most %d)" % MAX_WORLD)
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16",
                    help="the dtype of A, B and C (default bf16)")
    ap.add_argument("--algo", choices=ALGOS, default="auto",
                    help="the algorithm, the same on both paths (default auto)")
    ap.add_argument("--chunks", type=int, default=0, metavar="N",
                    help="chunk count, 0 = the daemon's default (default 0; naive takes none)")
    ap.add_argument("--host-shape", type=parse_shape, default=(256, 256, 256), metavar="mxKxN",
                    help="host part: the shape of one op, m the rows of EACH rank's shard, small "
                         "so that the GPU is never the bottleneck (default 256x256x256)")
    ap.add_argument("--calls", type=positive, default=2000, metavar="N",
                    help="host part: timed calls of each path (default 2000)")
    ap.add_argument("--host-warmup", type=count, default=200, metavar="N",
                    help="host part: untimed calls of each path first (default 200)")
    ap.add_argument("--shape", type=parse_shape, default=(8192, 8192, 8192), metavar="MxKxN",
                    help="GPU part: M the GATHERED rows, divisible by --world, as ovl-bench's "
                         "--shapes (default 8192x8192x8192)")
    ap.add_argument("--warmup", type=count, default=10, metavar="N",
                    help="GPU part: untimed ops before the timed ones (default 10, ovl-bench's)")
    ap.add_argument("--iters", type=count, default=100, metavar="N",
                    help="GPU part: timed ops (default 100, ovl-bench's)")
    ap.add_argument("--rounds", type=positive, default=3, metavar="R",
                    help="GPU part: rounds of (ovl-bench, Python) in alternating order; each "
                         "path's figure is its median over rounds (default 3)")
    ap.add_argument("--bench", metavar="PATH",
                    help="the ovl-bench to run (default: build/gpu/bench/ovl-bench, else the "
                         "newest build/*/bench/ovl-bench, else one next to this script, else "
                         "PATH's)")
    ap.add_argument("--only", choices=("host", "gpu"),
                    help="run only that part (default: both)")
    ap.add_argument("--no-check", action="store_true",
                    help="do not check the Python path's C against a float64 reference "
                         "(default: checked after each measurement)")
    ap.add_argument("--results", default="-", metavar="FILE",
                    help="append the table as markdown to FILE (default -: none; a run kept "
                         "goes to bench/results/, one file a run)")
    ap.add_argument("--label", metavar="TEXT",
                    help="free text for the results heading (default: git rev-parse --short "
                         "HEAD where that works)")
    ap.add_argument("--timeout", type=positive, default=600, metavar="S",
                    help="seconds the whole run may take; then every rank is killed (default 600)")
    args = ap.parse_args(argv)
    if args.world > MAX_WORLD:
        ap.error("--world %d: at most %d ranks" % (args.world, MAX_WORLD))
    if args.iters < 1:
        ap.error("--iters: at least 1")
    if not 0 <= args.chunks <= 64:
        ap.error("--chunks %d: 0 to 64 (ovl-bench's range)" % args.chunks)
    if args.algo == "naive":
        args.chunks = 0  # naive takes no chunks, and ovl-bench runs it with 0
    if args.only != "host" and args.shape[0] % args.world:
        ap.error("--shape %s: M (the gathered rows) is not divisible by --world %d" % (
            shape_str(args.shape), args.world))
    return args


class Interrupted(BenchError):
    pass


def _on_signal(signum, frame):
    raise Interrupted("stopped by signal %d" % signum)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    deadline = time.monotonic() + args.timeout
    signal.signal(signal.SIGTERM, _on_signal)
    res_file = None
    if args.results != "-":
        try:
            res_file = open(args.results, "a", encoding="utf-8")
        except OSError as e:
            print("ovl_pybench: cannot append to %s: %s (--results - for none)" % (
                args.results, e), file=sys.stderr)
            return EXIT_USAGE
    ranks = None
    try:
        ovl = import_ovl()
        bench = find_bench(args.bench) if args.only != "host" else None
        try:
            socket = args.socket or os.environ.get("OVL_SOCKET") or ovl.default_socket()[0]
        except ovl.Error as e:
            raise BenchError("libovl: %s" % e)
        try:
            with ovl.connect(socket) as cl:
                info = cl.info()
        except ovl.Error as e:
            raise BenchError("ovld (socket %s): %s" % (socket, e))
        if info["backend"] != "cuda":
            raise BenchError("ovld (pid %d, socket %s) runs the %s backend: the benchmark needs "
                             "the CUDA one" % (info["pid"], socket, info["backend"]))
        label = args.label if args.label is not None else git_label()
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        cfg = {"world": args.world, "socket": socket, "dtype": args.dtype,
               "job": "pybench-%d-%s" % (os.getpid(), uuid.uuid4().hex[:8]),
               "parent_pid": os.getpid()}
        print("ovl_pybench: world %d, job %s, ovld %s (pid %d) at %s%s" % (
            args.world, cfg["job"], info["version"], info["pid"], socket,
            ", ovl-bench %s" % bench if bench else ""), flush=True)

        t0 = time.monotonic()
        ranks = Ranks(args.world, cfg, deadline)
        ranks.start()
        infos = ranks.collect("starting (torch, ovl.connect, comm)")
        i0 = infos[0]
        used = min(args.world, i0["ngpu"])
        if i0["ovld_devices"] < used:
            raise BenchError("ovld has %d device%s, the ranks use %d GPU%s" % (
                i0["ovld_devices"], "" if i0["ovld_devices"] == 1 else "s", used,
                "" if used == 1 else "s"))
        print("ovl_pybench: %s x %d (%d here), world %d (%s), %s; torch %s (CUDA %s); ovl %s "
              "from %s; libovl %s (%.1f s to start)" % (
                  i0["device_name"], used, i0["ngpu"], args.world,
                  share_str(args.world, i0["ngpu"]), args.dtype, i0["torch"], i0["torch_cuda"],
                  i0["ovl"], i0["ovl_file"], i0["library"], time.monotonic() - t0), flush=True)
        if args.world > i0["ngpu"]:
            print("ovl_pybench: %s" % SHARED_NOTE, flush=True)

        host = gpu = None
        check = not args.no_check
        if args.only != "gpu":
            t0 = time.monotonic()
            per_rank = ranks.ask("host", {
                "shape": args.host_shape, "algo": args.algo, "chunks": args.chunks,
                "calls": args.calls, "warmup": args.host_warmup, "check": check},
                "timing the host part")
            for r, x in enumerate(per_rank):
                print("  host, rank %d: Python call p50 %.1f us p99 %.1f us (min %.1f, max %.1f);"
                      " libovl's submit p50 %.1f us p99 %.1f us (min %.1f, max %.1f)%s" % (
                          r, x["py"]["p50"], x["py"]["p99"], x["py"]["min"], x["py"]["max"],
                          x["raw"]["p50"], x["raw"]["p99"], x["raw"]["min"], x["raw"]["max"],
                          "" if x["rel_err"] is None else "; C rel. error %.2g" % x["rel_err"]),
                      flush=True)
            host = aggregate_host(per_rank)
            print("  (host part: %.1f s)" % (time.monotonic() - t0), flush=True)
        if args.only != "host":
            gp = {"shape": args.shape, "algo": args.algo, "chunks": args.chunks,
                  "warmup": args.warmup, "iters": args.iters, "check": check}
            py_rounds, c_rounds = [], []
            for rnd in range(args.rounds):
                order = ("c", "py") if rnd % 2 == 0 else ("py", "c")
                for which in order:
                    t0 = time.monotonic()
                    if which == "c":
                        ms, gemm, took, first = run_c_bench(args, bench, socket, deadline)
                        c_rounds.append(ms)
                        if rnd == 0 and first:
                            print("  " + first, flush=True)
                        print("  GPU, round %d: C (ovl-bench) %.4f ms per op%s (%.1f s)" % (
                            rnd + 1, ms, "" if gemm is None else
                            ", cuBLASLt GEMM alone %.4f ms" % gemm, took), flush=True)
                    else:
                        per_rank = ranks.ask("gpu", gp, "timing the GPU part, round %d" % (
                            rnd + 1))
                        ms = max(x["median_ms"] for x in per_rank)
                        py_rounds.append(ms)
                        errs = [x["rel_err"] for x in per_rank if x["rel_err"] is not None]
                        print("  GPU, round %d: Python %.4f ms per op (ranks' medians %s%s) "
                              "(%.1f s)" % (
                                  rnd + 1, ms, ", ".join("%.4f" % x["median_ms"]
                                                         for x in per_rank),
                                  "; C rel. error at most %.2g" % max(errs) if errs else "",
                                  time.monotonic() - t0), flush=True)
            gpu = {"py_ms": median(py_rounds), "c_ms": median(c_rounds),
                   "py_rounds": py_rounds, "c_rounds": c_rounds}
        ranks.close()
        ranks = None

        heading, md, table, misses = build_report(args, infos, host, gpu, when, label)
        print("\n" + heading)
        print("\n".join(table))
        if res_file is not None:
            try:
                res_file.write("\n" + "\n".join(md + table) + "\n")
                res_file.close()
            except OSError as e:
                raise BenchError("writing %s: %s" % (args.results, e))
            res_file = None
            print("\n(table appended to %s)" % args.results)
        if misses:
            print("ovl_pybench: MISS: %s" % "; ".join(misses), flush=True)
        else:
            print("ovl_pybench: PASS: every target met", flush=True)
        return 0
    except SkipRun as e:
        print("ovl_pybench: SKIP: %s" % e, flush=True)
        return EXIT_SKIP
    except (BenchError, KeyboardInterrupt) as e:
        msg = str(e) if isinstance(e, BenchError) else "interrupted"
        print("ovl_pybench: FAILED: %s" % msg, file=sys.stderr, flush=True)
        if res_file is not None:
            print("(incomplete run: nothing appended to %s)" % args.results, flush=True)
        print("ovl_pybench: FAILED: %s" % msg.splitlines()[0] if msg else "ovl_pybench: FAILED",
              flush=True)
        return EXIT_FAIL
    except Exception as e:  # a bug here: said as one, with its traceback
        traceback.print_exc()
        print("ovl_pybench: FAILED: internal error: %s: %s" % (type(e).__name__, e), flush=True)
        return EXIT_FAIL
    finally:
        if ranks is not None:
            ranks.kill()
        if res_file is not None:
            res_file.close()


if __name__ == "__main__":
    sys.exit(main())
