"""AG-GEMM end to end on the CUDA backend: ovl-demo's client processes (world
WORLD, --world, default 2) through a real ovld, every algorithm per run (naive,
collective, ring), checked by the clients against a cuBLASLt fp32 reference on
the GPU. The ranks go round-robin over the GPUs (ovl-demo: rank r on GPU r mod
G): on one GPU they all share it (ovld gathers by copies between them), on G >=
WORLD GPUs each has its own. ctest runs it at world 2 and 4 (test_gpu_e2e_w2,
test_gpu_e2e_w4); it prints the world and how many ranks each GPU holds first.

Cases: the five benchmark shapes (M x K x N, M the gathered rows: each rank
holds M/2) in bf16 and fp16, fp32 on the two smallest; small odd shapes in
every dtype, with and without a_out; a_out on 8192^3 bf16; pointers inside a
larger allocation (--interior); B stored N x K (--transb) on 4096^3; ops of 3
Bs of different n (--more-n), each C checked, small with transb and a_out and
on 4096^3. GEMM + reduce-scatter (ovl-demo --op rs, naive, collective, ring
and push, checked against the sum of every rank's product in double precision on
the host): small odd shapes in every dtype, with transb, avg, chunks and
wider A and C (--strided), 256 x 384 x 512 and 512 x 1024 x 768 (3 chunks)
a rank; where ranks share a GPU (no NCCL communicator between them) ring and
push, each as cases of its own, and naive must fail with words, not hang.
Scaled (fp8) ops of both kinds: every fp8 pair, output dtype and scale
mode in turn, a bias, avg, and 4096^3 (checked on a sample of rows), each
checked against a double-precision reference of the dequantized inputs.
With OVL_GPU_E2E_CASES=rs in the environment only the GEMM + reduce-scatter
cases run, with =fp8 only the scaled ones. Each case prints its time. Without a GPU (ovld cannot start the CUDA backend, or has no
device) prints "SKIP: ..." and exits 77, ctest's skip code.

Budget: under 6 minutes on 2 x H200 at world 2 (most of a case is process and
CUDA start-up and the fp32 reference, not the AG-GEMMs); each world is a ctest
test of its own, with its own budget."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

from ovltest import DEMO, OVLCTL, Daemon, run_tests, share  # noqa: E402

SKIP_CODE = 77
WORLD = 2              # set by main() (--world)
ALGOS = ("naive", "collective", "ring")
START_TIMEOUT = 60.0   # ovld creates a context per GPU before it listens
CASE_TIMEOUT = 120     # one ovl-demo run
BUDGET = 480.0         # all of it: cases past this fail unrun (ctest's limit is 600 s)
DEADLINE = 0.0         # set by main()

# The benchmark shapes, M x K x N (README of the GPU machine).
BIG = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 8192, 14336), (16384, 8192, 2048),
       (65536, 1024, 1024)]
FP32_BIG = [(4096, 4096, 4096), (65536, 1024, 1024)]  # fp32 only where it is cheap
# Small shapes, (m per rank, n, k, extra): odd sizes, chunks that do not divide m.
SMALL = [(5, 7, 9, []), (33, 31, 29, ["--chunks", "3"]),
         (10, 13, 17, ["--chunks", "4", "--transb"])]


class CudaDaemon(Daemon):
    """ovld on the CUDA backend: it starts slower than the host one."""

    def __init__(self):
        try:
            super().__init__(backend="cuda")
        except Exception:
            if hasattr(self, "log") and not self.log.closed:
                self.log.close()
            if hasattr(self, "proc"):
                self.cleanup()
            elif hasattr(self, "dir"):
                shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def wait_ready(self, timeout=START_TIMEOUT):
        return super().wait_ready(timeout)


def skip(why):
    print("SKIP: %s" % why, flush=True)
    sys.exit(SKIP_CODE)


def start_daemon():
    try:
        d = CudaDaemon()
    except AssertionError as e:
        if "cannot start the cuda backend" in str(e):
            line = [l for l in str(e).splitlines() if "cannot start the cuda backend" in l]
            skip("ovld cannot start the CUDA backend: %s" % (line[0].strip() if line else ""))
        raise
    try:
        p = d.run([OVLCTL, "status", "--json"], timeout=30)
        st = json.loads(p.stdout)
    except Exception:
        d.cleanup()
        raise
    ndev = len(st.get("devices", []))
    if st.get("backend") != "cuda" or ndev < 1:
        rc = d.stop()
        d.cleanup()
        if rc != 0:
            print("FAIL: ovld exited %d" % rc)
            sys.exit(1)
        skip("ovld's %s backend has %d device(s); the test needs a GPU"
             % (st.get("backend"), ndev))
    names = ", ".join(dev.get("name", "?") for dev in st["devices"])
    print("ovld %s, %s backend, %d devices: %s" % (st.get("version"), st.get("backend"), ndev,
                                                   names), flush=True)
    print("world %d on %d GPU%s: %s" % (WORLD, ndev, "" if ndev == 1 else "s",
                                        share(WORLD, ndev)), flush=True)
    return d, ndev


def demo(d, name, m, n, k, dtype, extra, iters, seed, algos=ALGOS, refused=None):
    cmd = [DEMO, "-w", str(WORLD), "-m", str(m), "-n", str(n), "-k", str(k), "-d", dtype,
           "-i", str(iters), "--seed", str(seed), "--job", "gpu-e2e-w%d-%d" % (WORLD, seed),
           *extra]
    left = DEADLINE - time.monotonic()
    if left < 5:
        raise AssertionError("%s: not run, the test is past its %.0f s budget" % (name, BUDGET))
    limit = min(CASE_TIMEOUT, left)
    # its own process group: on a timeout the demo's rank processes go too
    p = subprocess.Popen(cmd, env=d.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        msg = "%s: no answer within %.0f s\ncommand: %s\nstdout:\n%s\nstderr:\n%s\n" % (
            name, limit, " ".join(cmd), out, err)
        raise AssertionError(msg + "ovld log (tail):\n%s" % d.log_text()[-6000:]) from None
    rows = {a: [l for l in out.splitlines() if l.startswith(a + " ")] for a in algos}
    if refused is not None:
        # the op must fail with these words on every algorithm's row, and end
        ok = p.returncode == 1 and refused in out and "CHECKS FAILED" in out
        if not ok:
            raise AssertionError("%s: not refused with '%s' (exit %d)\nstdout:\n%s\nstderr:\n%s"
                                 % (name, refused, p.returncode, out, err))
        print("  refused: %s" % refused, flush=True)
        return
    ok = (p.returncode == 0 and "all checks passed" in out and
          all(len(r) == 1 and r[0].rstrip().endswith("OK") for r in rows.values()))
    if not ok:
        raise AssertionError("%s failed (exit %d)\ncommand: %s\nstdout:\n%s\nstderr:\n%s\n"
                             "ovld log (tail):\n%s" % (name, p.returncode, " ".join(cmd), out,
                                                       err, d.log_text()[-6000:]))
    # the demo's ms/op per algorithm (run_tests prints the case's time next)
    print("  ms/op: " + ", ".join("%s %s" % (a, rows[a][0].split()[1]) for a in algos),
          flush=True)


RS_ALGOS = ("naive", "collective", "ring", "push")
# GEMM + reduce-scatter: (m per rank of C, n, k per rank of A, extra)
RS_SMALL = [(5, 7, 9, []), (33, 31, 29, ["--chunks", "3", "--strided"]),
            (10, 13, 17, ["--chunks", "4", "--transb", "--reduce", "avg"])]


def rs_cases(shared):
    """GEMM + reduce-scatter's cases: (name, m, n, k, dtype, extra, iters,
    refused, algos); refused: the words the op fails with. Where ranks share
    a GPU there is no NCCL between them: ring and push, each a case of its
    own (their partials pass by the copy engine; push's reduction is a
    kernel, ring's a GEMM that adds), and one case of naive, refused with
    words."""
    picks = [("-" + a, ["-a", a], (a,)) for a in ("ring", "push")] if shared else [("", [], RS_ALGOS)]
    out = []
    for suffix, pick, algos in picks:
        for (m, n, k, extra) in RS_SMALL:
            for dt in ("bf16", "fp16", "fp32"):
                out.append(("rs-m%d-n%d-k%d-%s%s" % (m, n, k, dt, suffix), m, n, k, dt,
                            ["--op", "rs"] + extra + pick, 2, None, algos))
        out.append(("rs-m256-n384-k512-bf16" + suffix, 256, 384, 512, "bf16",
                    ["--op", "rs"] + pick, 3, None, algos))
        out.append(("rs-m512-n1024-k768-fp16-chunks3" + suffix, 512, 1024, 768, "fp16",
                    ["--op", "rs", "--chunks", "3"] + pick, 3, None, algos))
    if shared:
        out.append(("rs-naive-refused", 5, 7, 9, "bf16", ["--op", "rs", "-a", "naive"], 1,
                    "has no NCCL communicator", ("naive",)))
    return out


def fp8_cases(shared):
    """Scaled (fp8) cases of both kinds, in rs_cases' form: cuBLASLt's fp8
    GEMM wants k a multiple of 16 and 16-byte rows, so the shapes are; every
    fp8 pair, output dtype and scale mode in turn, a bias, avg; one of
    4096^3 (its check on a sample of rows). Where ranks share a GPU, GEMM +
    reduce-scatter's ring and push only."""
    rs_picks = [("-" + a, ["-a", a], (a,)) for a in ("ring", "push")] if shared else \
        [("", [], RS_ALGOS)]
    fp8 = [("e4m3-bf16-row-bias", ["-d", "fp8e4m3", "--bias"]),
           ("e5m2xe4m3-fp16-tensor-row", ["-d", "fp8e5m2", "--b-dtype", "fp8e4m3",
                                          "--out-dtype", "fp16", "--a-scale", "tensor"]),
           ("e4m3xe5m2-fp32-tensor", ["-d", "fp8e4m3", "--b-dtype", "fp8e5m2", "--out-dtype",
                                      "fp32", "--scale", "tensor", "--chunks", "3"])]
    out = []
    for name, ex in fp8:
        out.append(("fp8-ag-m64-n128-k256-" + name, 64, 128, 256, ex[1], ex[2:], 3, None, ALGOS))
        for suffix, pick, algos in rs_picks:
            out.append(("fp8-rs-m64-n128-k256-" + name + suffix, 64, 128, 256, ex[1],
                        ["--op", "rs"] + ex[2:] + pick, 3, None, algos))
    for suffix, pick, algos in rs_picks:
        out.append(("fp8-rs-m32-n64-k128-e4m3-avg" + suffix, 32, 64, 128, "fp8e4m3",
                    ["--op", "rs", "--reduce", "avg"] + pick, 3, None, algos))
    out.append(("fp8-ag-4096x4096x4096-e4m3-bf16", 4096 // WORLD, 4096, 4096, "fp8e4m3", [], 3,
                None, ALGOS))
    return out


def cases():
    """(name, m, n, k, dtype, extra args, iters): fixed, in a fixed order."""
    out = []
    for (m, n, k, extra) in SMALL:
        for dt in ("bf16", "fp16", "fp32"):
            for aout in (False, True):
                ex = extra + (["--a-out"] if aout else [])
                name = "m%d-n%d-k%d-%s%s%s" % (m, n, k, dt, "-transb" if "--transb" in extra
                                               else "", "-a_out" if aout else "")
                out.append((name, m, n, k, dt, ex, 3))
    out.append(("m33-n31-k29-fp16-interior-a_out", 33, 31, 29, "fp16",
                ["--interior", "--a-out", "--chunks", "3"], 3))
    for (M, K, N) in BIG:
        for dt in ("bf16", "fp16", "fp32"):
            if dt == "fp32" and (M, K, N) not in FP32_BIG:
                continue
            out.append(("%dx%dx%d-%s" % (M, K, N, dt), M // WORLD, N, K, dt, [], 3))
    out.append(("8192x8192x8192-bf16-a_out", 8192 // WORLD, 8192, 8192, "bf16", ["--a-out"], 3))
    out.append(("4096x4096x4096-bf16-interior", 4096 // WORLD, 4096, 4096, "bf16",
                ["--interior"], 3))
    out.append(("4096x4096x4096-bf16-transb", 4096 // WORLD, 4096, 4096, "bf16", ["--transb"],
                3))
    # several Bs: one gather, a C per B (the row of each algorithm is the worst C's)
    out.append(("m10-n13-k17-bf16-3bs-transb-a_out", 10, 13, 17, "bf16",
                ["--more-n", "5,40", "--transb", "--a-out", "--chunks", "4"], 3))
    out.append(("4096x4096x4096-bf16-3bs", 4096 // WORLD, 4096, 4096, "bf16",
                ["--more-n", "1024,2048"], 3))
    return out


def main():
    global WORLD
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2, help="ranks of each job (2..64)")
    WORLD = ap.parse_args().world
    if not 2 <= WORLD <= 64 or any(M % WORLD for (M, _, _) in BIG):
        ap.error("--world must be 2..64 and divide the gathered rows of every shape")
    if not os.path.exists(DEMO) and os.sep in DEMO:
        print("FAIL: ovl-demo not found at %s (set OVL_DEMO_BIN)" % DEMO)
        sys.exit(1)
    global DEADLINE
    t0 = time.monotonic()
    DEADLINE = t0 + BUDGET
    d, ndev = start_daemon()
    tests = []
    # OVL_GPU_E2E_CASES=rs: GEMM + reduce-scatter's cases alone (scripts/gpu-check --rs-only);
    # =fp8: the scaled cases alone (scripts/gpu-check --fp8-only)
    only = os.environ.get("OVL_GPU_E2E_CASES", "")
    only_rs = only == "rs"
    for i, (name, m, n, k, dt, extra, iters) in enumerate([] if only else cases()):
        def t(name=name, m=m, n=n, k=k, dt=dt, extra=extra, iters=iters, seed=1000 + i):
            demo(d, name, m, n, k, dt, extra, iters, seed)
        t.__name__ = name
        tests.append(t)
    more = ([] if only == "fp8" else rs_cases(ndev < WORLD)) + \
        ([] if only_rs else fp8_cases(ndev < WORLD))
    for i, (name, m, n, k, dt, extra, iters, refused, algos) in enumerate(more):
        def t(name=name, m=m, n=n, k=k, dt=dt, extra=extra, iters=iters, seed=2000 + i,
              refused=refused, algos=algos):
            demo(d, name, m, n, k, dt, extra, iters, seed, algos, refused)
        t.__name__ = name
        tests.append(t)

    def daemon_stops_cleanly():
        rc = d.stop()
        assert rc == 0, "ovld exited %d after SIGTERM\novld log (tail):\n%s" % (
            rc, d.log_text()[-6000:])
    tests.append(daemon_stops_cleanly)
    try:
        run_tests(tests)  # prints "N passed, N failed, N skipped" and exits
    finally:
        d.cleanup()
        print("total %.1f s" % (time.monotonic() - t0), flush=True)


if __name__ == "__main__":
    main()
