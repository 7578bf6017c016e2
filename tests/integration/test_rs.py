"""GEMM + reduce-scatter end to end on the host backend: real client
processes (ovl-demo --op rs) through a real ovld, naive, collective, ring and push,
worlds 1, 2, 3, 4 and 8 (ranks sharing the daemon's devices), every dtype,
sum and avg, transb, chunks that do not divide a block, and A and C as
views into wider matrices (--strided, whose extra columns must stay
untouched); each rank's C checked by the clients against the sum of every
rank's product in double precision. Then: ovld counts the ops by kind, plans
them as ovlctl does (ring and push planned and run), refuses an algorithm of
the other kind, and a rank killed with ops in flight
fails the others' ops without a hang (ovltest.client_killed_mid_job), with
collective and with push (whose ranks write into each other's partials).

The worst relative error seen per dtype and world is printed (docs/plans.md,
"GEMM + reduce-scatter", states it)."""
import json

from ovltest import DEMO, OVLCTL, Daemon, client_killed_mid_job, run_tests

WORLDS = [1, 2, 3, 4, 8]
# (m per rank, n, k per rank, extra args)
VARIANTS = [
    (10, 13, 17, ["--chunks", "4"]),                             # chunks not dividing a block
    (9, 11, 6, ["--transb", "--reduce", "avg", "--chunks", "2"]),  # B as N x K, the average
    (33, 31, 29, ["--chunks", "3", "--streams", "3", "--strided"]),  # wider A and C
    (16, 8, 24, []),
]
DTYPES = ["bf16", "fp16", "fp32"]


def rs_demo(d, world, m, n, k, dtype, extra, job, iters=2, check=True):
    cmd = [DEMO, "--op", "rs", "-w", str(world), "-m", str(m), "-n", str(n), "-k", str(k),
           "-d", dtype, "-i", str(iters), "--seed", str(world * 1000 + m), "--job", job, *extra]
    return d.run(cmd, check=check)


def test_rs_matrix():
    d = Daemon(config="host_devices = 4\n")
    worst = {}
    try:
        for world in WORLDS:
            for vi, (m, n, k, extra) in enumerate(VARIANTS):
                for dt in DTYPES:
                    out = rs_demo(d, world, m, n, k, dt, extra, "rs-%d-%d-%s" % (world, vi, dt)).stdout
                    for algo in ("naive", "collective", "ring", "push"):
                        row = [l for l in out.splitlines() if l.startswith(algo + " ")]
                        assert len(row) == 1 and row[0].rstrip().endswith("OK"), out
                        err = float(row[0].split()[3])
                        worst[(dt, world)] = max(worst.get((dt, world), 0.0), err)
                    assert "all checks passed" in out, out
        assert d.stop() == 0
    finally:
        d.cleanup()
    print("  worst ||C - ref|| / ||ref|| by dtype and world:")
    for dt in DTYPES:
        print("    %-5s %s" % (dt, "  ".join("w%d %.1e" % (w, worst[(dt, w)]) for w in WORLDS)))


def test_rs_counted_planned_refused():
    """ovld's stats count the ops as gemm_rs (by algorithm and dtype), its
    status lists the kind, ovlctl plan --daemon is the offline plan with
    ovld's defaults, ring and push run as planned, and an algorithm of the
    other kind is refused with words."""
    d = Daemon(config="host_devices = 2\ndefault_chunks = 2\n")
    try:
        out = rs_demo(d, 2, 8, 8, 8, "fp32", ["-a", "collective"], "counted", iters=3).stdout
        assert "all checks passed" in out, out
        st = json.loads(d.run([OVLCTL, "stats", "--json"]).stdout)["total"]
        ops = {(o["kind"], o["algo"], o["dtype"]): o["count"] for o in st["ops"]}
        assert ops == {("gemm_rs", "collective", "fp32"): 4}, st["ops"]
        # 2 m n k flop on each of 2 ranks, m = 16 rows in all; m n fp32 partials each
        assert st["flops"] == 4 * 2 * (2 * 16 * 8 * 8), st["flops"]
        assert st["comm_bytes"] == 4 * 2 * (16 * 8 * 4), st["comm_bytes"]
        s = json.loads(d.run([OVLCTL, "status", "--json"]).stdout)
        assert s["op_kinds"] == ["ag_gemm", "gemm_rs"], s["op_kinds"]
        shape = ["--kind", "gemm_rs", "--world", "2", "--rank", "1", "-m", "64", "-n", "16",
                 "-k", "32", "--algo", "collective"]
        daemon = d.run([OVLCTL, "plan", "--daemon", *shape]).stdout
        here = d.run([OVLCTL, "plan", *shape, "--chunks", "2"]).stdout
        assert daemon == here and daemon.startswith(
            "plan format=5 kind=gemm_rs algo=collective world=2 rank=1 m=64 "), (daemon, here)
        assert "REDUCE_SCATTER sum C[0] <- P[0+16] stride 32 cols 16" in daemon, daemon
        p = d.run([OVLCTL, "plan", "--daemon", "--kind", "ag_gemm", "--world", "2", "--rank",
                   "0", "-m", "64", "-n", "16", "-k", "32", "--algo", "push"], check=False)
        assert p.returncode == 2 and "--algo push" in p.stderr, (p.returncode, p.stderr)
        p = d.run([DEMO, "-w", "2", "-m", "8", "-n", "8", "-k", "8", "-d", "fp32", "-i", "1",
                   "-a", "push", "--job", "push-refused"], check=False)
        assert p.returncode == 1 and ("FAIL: algorithm push: ag_gemm has auto, naive, collective "
                                      "and ring") in p.stdout, p.stdout
        # ring, planned by ovld as here: each step's sum passed on, the last into C
        shape[-1] = "ring"
        daemon = d.run([OVLCTL, "plan", "--daemon", *shape]).stdout
        assert daemon == d.run([OVLCTL, "plan", *shape, "--chunks", "2"]).stdout, daemon
        assert "PUSH r0:P[0] <- P[32+16] cols 16" in daemon, daemon
        assert "GEMM C[0] <- A[32+16] @ B n 16 k 32 + P[0+16]" in daemon, daemon
        out = rs_demo(d, 2, 8, 8, 8, "fp32", ["-a", "ring"], "ringed", iters=2).stdout
        assert "all checks passed" in out, out
        # push, planned by ovld as here: the peers' partials pushed, then reduced
        shape[-1] = "push"
        daemon = d.run([OVLCTL, "plan", "--daemon", *shape]).stdout
        assert daemon == d.run([OVLCTL, "plan", *shape, "--chunks", "2"]).stdout, daemon
        assert "PUSH r0:P[32] <- P[64+16] cols 16" in daemon, daemon
        assert "REDUCE sum C[0] <- P[0+16] blocks 2 stride 32 cols 16" in daemon, daemon
        # and run, counted under its name
        out = rs_demo(d, 2, 8, 8, 8, "fp32", ["-a", "push"], "pushed", iters=2).stdout
        assert "all checks passed" in out, out
        st = json.loads(d.run([OVLCTL, "stats", "--json"]).stdout)["total"]
        ops = {(o["kind"], o["algo"], o["dtype"]): o["count"] for o in st["ops"]}
        assert ops.get(("gemm_rs", "push", "fp32")) == 3, st["ops"]
        assert ops.get(("gemm_rs", "ring", "fp32")) == 3, st["ops"]
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_rs_default_algo():
    """ovld's default_algo stands for auto only where it can run the op:
    collective where ranks share a device (one host device) leaves GEMM +
    reduce-scatter to the rule, ring and push are taken, and the plan's text
    says who chose."""
    for default, devs, ran, chosen in (
            ("collective", 1, None, "chosen by auto: "),
            ("ring", 2, "ring", "chosen by the daemon's default_algo"),
            ("push", 2, "push", "chosen by the daemon's default_algo")):
        d = Daemon(config="host_devices = %d\ndefault_algo = %s\n" % (devs, default))
        try:
            out = rs_demo(d, 2, 6, 5, 7, "fp32", ["-a", "auto"], "dflt-" + default).stdout
            assert "all checks passed" in out, out
            st = json.loads(d.run([OVLCTL, "stats", "--json"]).stdout)["total"]
            ops = {(o["kind"], o["algo"]) for o in st["ops"]}
            if ran is None:  # the rule's, which copies where ranks share a device
                assert len(ops) == 1 and ops <= {("gemm_rs", "ring"), ("gemm_rs", "push")}, ops
                ran = next(iter(ops))[1]
            assert ops == {("gemm_rs", ran)}, st["ops"]
            # (ovlctl plan --daemon plans a dense job: one whose ranks have
            # devices of their own, where the default is taken)
            plan = d.run([OVLCTL, "plan", "--daemon", "--kind", "gemm_rs", "--world", "2",
                          "--rank", "0", "-m", "12", "-n", "5", "-k", "7"]).stdout
            if devs == 1:
                plan_here = d.run([OVLCTL, "plan", "--kind", "gemm_rs", "--world", "2", "--rank",
                                   "0", "-m", "12", "-n", "5", "-k", "7", "--shared-gpu"]).stdout
                assert plan_here.splitlines()[1].startswith(chosen), plan_here
                assert " algo=%s " % ran in plan_here.splitlines()[0], plan_here
                assert " algo=%s " % default in plan.splitlines()[0], plan
            else:
                assert plan.splitlines()[1].startswith(chosen), plan
                assert " algo=%s " % ran in plan.splitlines()[0], plan
            assert d.stop() == 0
        finally:
            d.cleanup()


def test_rs_timing():
    """ovl-demo --op rs --timing times each submit call as the all-gather
    kind's does: back to back and paced, p50 and p99, every algorithm."""
    d = Daemon(config="host_devices = 2\n")
    try:
        out = rs_demo(d, 2, 16, 8, 24, "fp32", ["--timing"], "rs-timing", iters=12).stdout
        assert "submit p50 us  submit p99 us  paced p50 us  paced p99 us" in out, out
        for algo in ("naive", "collective", "ring", "push"):
            row = [l for l in out.splitlines() if l.startswith(algo + " ")]
            assert len(row) == 1 and row[0].rstrip().endswith("OK"), out
            cols = [float(x) for x in row[0].split()[4:8]]
            assert all(c > 0 for c in cols), (algo, row[0])
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_rs_rank_killed():
    """A rank of a running GEMM + reduce-scatter job SIGKILLed, with
    collective and with push: the others' ops fail (no hang), ovld frees the
    job and serves a fresh one (client_killed_mid_job stops the daemon: one
    daemon each)."""
    for algo in ("collective", "push"):
        d = Daemon(config="host_devices = 2\n")
        try:
            client_killed_mid_job(d, ["-m", "16", "-n", "8", "-k", "24"],
                                  ["-m", "8", "-n", "8", "-k", "8"], world=3, algo=algo,
                                  extra=["--op", "rs"])
            assert d.stop() == 0
        finally:
            d.cleanup()


if __name__ == "__main__":
    run_tests([test_rs_timing, test_rs_counted_planned_refused, test_rs_default_algo, test_rs_matrix,
               test_rs_rank_killed])
