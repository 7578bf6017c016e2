"""AG-GEMM end to end on the host backend: real client processes (ovl-demo)
through a real ovld, every algorithm, worlds 1, 2, 3, 4 and 8, shapes with
m not divisible by the chunks, k and n not multiples of 8, transb, a_out
wanted or not, each dtype; results checked against a double-precision
reference by the clients; the daemon's allgather settings; two jobs at once
on one daemon."""
import subprocess

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


def test_allgather_settings():
    """The daemon's allgather setting: copy gathers by pulls ordered by events
    (naive and collective plans without ALLGATHER), nccl gathers by the host
    collective even for one rank; results as with auto."""
    for setting in ("copy", "nccl"):
        d = Daemon(config="allgather = %s\n" % setting)
        try:
            for world in (1, 3):
                for m, n, k, extra in (VARIANTS[0], VARIANTS[1]):
                    p = demo(d, world, m, n, k, "fp32", extra, "ag-%s-%d-%d" % (setting, world, m))
                    assert "all checks passed" in p.stdout, p.stdout
            assert d.stop() == 0
        finally:
            d.cleanup()


def test_two_jobs_at_once():
    d = Daemon()
    try:
        procs = [subprocess.Popen([DEMO, "-w", "3", "-m", "40", "-n", "24", "-k", "32", "-i", "8",
                                   "--job", "job-%d" % i, "-d", dt], env=d.env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i, dt in enumerate(("bf16", "fp32"))]
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0 and "all checks passed" in out, out + err
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_too_few_devices():
    d = Daemon(config="host_devices = 2\n")
    try:
        # world 4 on 2 devices: ranks 2 and 3 would share devices with 0 and 1
        p = d.run([DEMO, "-w", "4", "-m", "8", "-n", "8", "-k", "8"], check=False)
        assert p.returncode != 0
        assert "already used by rank" in p.stderr, p.stderr
        assert d.stop() == 0
    finally:
        d.cleanup()


if __name__ == "__main__":
    run_tests([test_matrix, test_auto_and_defaults, test_allgather_settings, test_two_jobs_at_once,
               test_too_few_devices])
