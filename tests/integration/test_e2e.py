"""AG-GEMM end to end on the host backend: real client processes (ovl-demo)
through a real ovld, every algorithm, worlds 1, 2, 3, 4 and 8, shapes with
m not divisible by the chunks, k and n not multiples of 8, transb, a_out
wanted or not, each dtype; results checked against a double-precision
reference by the clients; default_chunks, default_streams and auto as
ovld resolves them.

Two jobs at once on one daemon, sharing devices, are test_load.c's
test_two_jobs_interleaved (results checked exactly) and, as ovl-demo
processes of every dtype, test_soak.py's; a world wider than
the devices (a device for two ranks) is test_join.c's
test_join_same_device_twice, and ovl-demo's refusal of it with its exact
counters test_stats.py's test_stats_under_load."""
from ovltest import DEMO, Daemon, run_tests

WORLDS = [1, 2, 3, 4, 8]
# (m, n, k, extra args): every world runs every variant, in every dtype
VARIANTS = [
    (10, 13, 17, ["--chunks", "4"]),                          # m not divisible by the chunks
    (9, 11, 6, ["--transb", "--a-out", "--chunks", "4"]),     # B as N x K, gathered A wanted
    (33, 31, 29, ["--chunks", "3", "--streams", "3"]),        # k, n not multiples of 8
    (16, 8, 24, ["--a-out"]),
]
DTYPES = ["bf16", "fp16", "fp32"]


def demo(d, world, m, n, k, dtype, extra, job, iters=2):
    cmd = [DEMO, "-w", str(world), "-m", str(m), "-n", str(n), "-k", str(k), "-d", dtype,
           "-i", str(iters), "--seed", str(world * 1000 + m), "--job", job, *extra]
    return d.run(cmd)


def test_matrix():
    d = Daemon()
    try:
        for world in WORLDS:
            for vi, (m, n, k, extra) in enumerate(VARIANTS):
                for dt in DTYPES:
                    p = demo(d, world, m, n, k, dt, extra, "m-%d-%d-%s" % (world, vi, dt))
                    out = p.stdout
                    for algo in ("naive", "collective", "ring"):
                        row = [l for l in out.splitlines() if l.startswith(algo + " ")]
                        assert len(row) == 1 and row[0].rstrip().endswith("OK"), out
                    assert "all checks passed" in out, out
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_auto_and_defaults():
    d = Daemon(config="default_chunks = 3\ndefault_streams = 2\n")
    try:
        for algo in ("auto", "ring", "collective"):
            p = d.run([DEMO, "-w", "2", "-m", "96", "-n", "32", "-k", "48", "-a", algo, "-i", "3"])
            assert "all checks passed" in p.stdout, p.stdout
        assert d.stop() == 0
    finally:
        d.cleanup()


if __name__ == "__main__":
    run_tests([test_matrix, test_auto_and_defaults])
