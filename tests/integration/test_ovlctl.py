"""ovlctl: plans (offline, compared with the planner's golden files, and
--daemon against a real ovld), usage errors, versions, exit codes (0 ok,
1 daemon unreachable or refusing, 2 usage).

ovlctl status with a job, its table and JSON, are test_stats.py's
(test_status_table_golden, test_json_fields_and_types)."""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile

from ovltest import OVLCTL, Daemon, long_demo, run_tests, wait_job_going, wait_no_job

GOLDEN = os.environ.get("OVL_GOLDEN_DIR", os.path.join(os.path.dirname(__file__), "..", "golden"))
PLAN_ARGS = ["--world", "4", "--rank", "1", "-m", "1024", "-k", "512", "-n", "256", "--chunks",
             "4", "--streams", "2"]


def ctl(*args, env=None, check=True):
    p = subprocess.run([OVLCTL, *args], capture_output=True, text=True, timeout=60, env=env)
    if check and p.returncode != 0:
        raise AssertionError("ovlctl %s: %d\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    return p


def test_plan_offline_matches_golden():
    for algo in ("naive", "collective", "ring"):
        p = ctl("plan", "--algo", algo, *PLAN_ARGS)
        with open(os.path.join(GOLDEN, "plan_%s.txt" % algo)) as f:
            assert p.stdout == f.read(), "ovlctl plan --algo %s differs from its golden file" % algo
        assert "DONE" in p.stdout.splitlines()[-1]
    # the copy-engine gather, as ovld's allgather = copy asks
    for algo in ("naive", "collective"):
        p = ctl("plan", "--algo", algo, "--allgather", "copy", *PLAN_ARGS)
        with open(os.path.join(GOLDEN, "plan_%s_copy.txt" % algo)) as f:
            assert p.stdout == f.read(), "ovlctl plan --algo %s --allgather copy differs" % algo
    # ranks that share a GPU: pulls, though NCCL is asked for
    p = ctl("plan", "--algo", "naive", "--shared-gpu", "--allgather", "nccl", *PLAN_ARGS)
    with open(os.path.join(GOLDEN, "plan_naive_shared.txt")) as f:
        assert p.stdout == f.read(), "ovlctl plan --shared-gpu differs from its golden file"
    assert "ALLGATHER" not in p.stdout and "shared_gpu=yes" in p.stdout, p.stdout
    # several Bs: the bs line, B1.. and C1.. among the buffers, a GEMM per B
    p = ctl("plan", "--algo", "ring", "--more-n", "64,96", *PLAN_ARGS)
    assert "\nbs nb=3 n=256,64,96\n" in p.stdout, p.stdout
    assert " B1=512x64 B2=512x96 C1=4096x64 C2=4096x96 " in p.stdout, p.stdout
    gemms = [l for l in p.stdout.splitlines() if " GEMM " in l]
    assert [l.split(" @ ")[1].split()[0] for l in gemms[:3]] == ["B", "B1", "B2"], gemms
    assert len(gemms) == 3 * len([l for l in gemms if " @ B n " in l]), gemms
    # across nodes: --nodes (even, node-major) and --local-ranks (uneven)
    for algo, name in (("ring", "plan_ring_2x2.txt"), ("collective", "plan_collective_2x2.txt")):
        p = ctl("plan", "--algo", algo, "--nodes", "2", *PLAN_ARGS)
        with open(os.path.join(GOLDEN, name)) as f:
            assert p.stdout == f.read(), "ovlctl plan --nodes 2 --algo %s differs" % algo
    # ranks sharing GPUs across nodes: ring's plan, only its header says so
    p = ctl("plan", "--algo", "ring", "--nodes", "2", "--shared-gpu", *PLAN_ARGS)
    with open(os.path.join(GOLDEN, "plan_ring_2x2.txt")) as f:
        assert p.stdout == f.read().replace(" shared_gpu=no ", " shared_gpu=yes ", 1), p.stdout
    uneven = list(PLAN_ARGS)
    uneven[uneven.index("--world") + 1] = "6"
    uneven[uneven.index("--chunks") + 1] = "2"
    p = ctl("plan", "--algo", "ring", "--local-ranks", "1,2,3", *uneven)
    with open(os.path.join(GOLDEN, "plan_ring_1+2+3.txt")) as f:
        assert p.stdout == f.read(), "ovlctl plan --local-ranks 1,2,3 differs"
    # one node is one node, however it is said
    p = ctl("plan", "--algo", "ring", "--nodes", "1", *PLAN_ARGS)
    with open(os.path.join(GOLDEN, "plan_ring.txt")) as f:
        assert p.stdout == f.read(), "ovlctl plan --nodes 1 differs from one node's plan"


def test_plan_usage_errors():
    """Usage errors exit 2 with nothing on stdout and exactly one message
    on stderr (the usage after it for a command or global option it does
    not know); --help, -h and help print the usage on stdout, which names
    every command and every option of plan."""
    usage = ctl("--help").stdout
    assert ctl("-h").stdout == ctl("help").stdout == usage
    assert usage.startswith("Usage: ovlctl [--socket PATH] COMMAND [OPTIONS]\n"), usage
    commands = usage[usage.index("Commands:\n"):usage.index("\nOptions of plan:")]
    assert re.findall(r"^  (\w+) ", commands, re.M) == ["status", "stats", "plan", "tune", "peer",
                                                         "version"], usage
    for opt in ("--algo", "--world", "--rank", "-m", "-n", "-k", "--chunks", "--streams",
                "--dtype", "--a-out", "--transb", "--strided", "--shared-gpu", "--allgather",
                "--more-n", "--nodes", "--local-ranks", "--daemon",
                "--socket", "--help", "--json", "--prometheus",
                "--watch", "--reset", "--clear"):
        assert re.search(r"(^|[ \[|])%s\b" % re.escape(opt), usage, re.M), (opt, usage)
    shape = ["--world", "2", "--rank", "0", "-m", "8", "-n", "8", "-k", "8"]
    for args, err in [
            (["plan", "--algo", "ring"],  # no shape
             "ovlctl plan: --world, --rank, -m, -n and -k are required (m, n, k > 0)\n"),
            (["plan", "--algo", "ring", "--world", "2", "--rank", "0", "-m", "0", "-n", "8", "-k",
              "8"], "ovlctl plan: --world, --rank, -m, -n and -k are required (m, n, k > 0)\n"),
            (["plan", "--algo", "bogus", *PLAN_ARGS], "ovlctl: --algo: unknown algorithm 'bogus'\n"),
            (["plan", "--dtype", "fp8", *PLAN_ARGS], "ovlctl: --dtype: unknown dtype 'fp8'\n"),
            (["plan", "--allgather", "mpi", *PLAN_ARGS],
             "ovlctl: --allgather: 'mpi' is not one of auto, nccl, copy\n"),
            # the daemon is asked only what the wire says: the op, not its job's layouts
            *[(["plan", "--daemon", *opt, *PLAN_ARGS],
               "ovlctl plan: --strided, --shared-gpu and --allgather plan here only, not with "
               "--daemon (ovld takes them from its jobs and its allgather setting)\n")
              for opt in (["--strided"], ["--shared-gpu"], ["--allgather", "copy"],
                          ["--transb", "--more-n", "8", "--allgather", "auto"])],
            # Bs are checked here, with --daemon or not, before anything is sent
            *[(["plan", *daemon, "--more-n", more, *PLAN_ARGS], err)
              for daemon in ([], ["--daemon"])
              for more, err in (("1,2,3,4,5,6,7,8", "ovlctl: --more-n: at most 7 Bs after the "
                                                    "first\n"),
                                ("8,0", "ovlctl: --more-n: every n must be positive\n"))],
            (["plan", "--more-n", "8,x", *PLAN_ARGS], "ovlctl: --more-n: 'x' is not a number\n"),
            (["plan", "--world", "x", *shape[2:]], "ovlctl: --world: 'x' is not a number\n"),
            (["plan", "--world", "4294967296", *shape[2:]], "ovlctl plan: a value is out of range\n"),
            (["plan", "--algo", "ring", "--world", "2", "--rank", "2", "-m", "8", "-n", "8", "-k",
              "8"], "ovlctl plan: invalid argument (world 2, rank 2, chunks <= 64, streams <= 8)\n"),
            (["plan", "--chunks", "65", *shape],
             "ovlctl plan: invalid argument (world 2, rank 0, chunks <= 64, streams <= 8)\n"),
            (["plan", *shape, "extra"], "ovlctl plan: unexpected argument 'extra'\n"),
            (["plan", "--nodes", "3", *PLAN_ARGS],
             "ovlctl plan: --nodes 3 does not divide the world (4)\n"),
            (["plan", "--nodes", "0", *PLAN_ARGS], "ovlctl: --nodes: at least 1\n"),
            (["plan", "--local-ranks", "1,2", *PLAN_ARGS],
             "ovlctl plan: --local-ranks add up to 3, not the world (4)\n"),
            (["plan", "--local-ranks", "2,0,2", *PLAN_ARGS],
             "ovlctl: --local-ranks: every node has 1 to 1024 ranks\n"),
            (["plan", "--nodes", "2", "--local-ranks", "2,2", *PLAN_ARGS],
             "ovlctl plan: --nodes or --local-ranks, not both\n"),
            (["plan", "--daemon", "--nodes", "2", *PLAN_ARGS],
             "ovlctl plan: --nodes and --local-ranks plan here only, not with --daemon\n"),
            # across nodes only NCCL moves rows: a strided layout cannot be planned
            (["plan", "--nodes", "2", "--strided", *PLAN_ARGS],
             "ovlctl plan: invalid argument (world 4, rank 1, chunks <= 64, streams <= 8; across "
             "nodes: not strided or allgather copy, shared-gpu ring only)\n"),
            # ranks sharing a GPU across nodes: ring only (its RAILs)
            (["plan", "--nodes", "2", "--shared-gpu", "--algo", "naive", *PLAN_ARGS],
             "ovlctl plan: invalid argument (world 4, rank 1, chunks <= 64, streams <= 8; across "
             "nodes: not strided or allgather copy, shared-gpu ring only)\n"),
            (["plan", "--bogus"], "plan: unrecognized option '--bogus'\n"),
            (["frobnicate"], "ovlctl: unknown command 'frobnicate'\n" + usage),
            (["--bogus", "status"], "ovlctl: unknown option '--bogus'\n" + usage),
            # a global option without its value says so (it is not unknown)
            (["--socket"], "ovlctl: option '--socket' needs an argument: the path of ovld's "
                           "socket\n"),
            (["-s"], "ovlctl: option '-s' needs an argument: the path of ovld's socket\n"),
            ([], usage)]:
        p = ctl(*args, check=False)
        assert (p.returncode, p.stdout, p.stderr) == (2, "", err), (args, p.returncode, p.stdout,
                                                                  p.stderr)


UNREACHABLE = ("cannot connect to %s: No such file or directory (is ovld running?)")


def test_unreachable_daemon_exit_1():
    """A socket nobody listens on (--socket, or $OVL_SOCKET): exit 1 and
    one line on stderr naming it; version prints its own line, then says
    so on stdout."""
    p = ctl("--socket", "/nonexistent/ovld.sock", "status", check=False)
    assert (p.returncode, p.stdout, p.stderr) == (
        1, "", "ovlctl: " + UNREACHABLE % "/nonexistent/ovld.sock" + "\n"), p
    env = dict(os.environ, OVL_SOCKET="/nonexistent/env.sock")
    p = ctl("status", "--json", env=env, check=False)
    assert (p.returncode, p.stdout, p.stderr) == (
        1, "", "ovlctl: " + UNREACHABLE % "/nonexistent/env.sock (from $OVL_SOCKET)" + "\n"), p
    p = ctl("--socket=/nonexistent/ovld.sock", "plan", "--daemon", *PLAN_ARGS, check=False)
    assert (p.returncode, p.stdout, p.stderr) == (
        1, "", "ovlctl: " + UNREACHABLE % "/nonexistent/ovld.sock" + "\n"), p
    p = ctl("version", env=env, check=False)
    lines = p.stdout.split("\n")
    assert p.returncode == 1 and p.stderr == "" and len(lines) == 3 and lines[2] == "", p
    assert re.fullmatch(r"ovlctl \d+\.\d+\.\d+ \(protocol \d+\)", lines[0]), p.stdout
    assert lines[1] == "ovld: unreachable (%s)" % (
        UNREACHABLE % "/nonexistent/env.sock (from $OVL_SOCKET)"), p.stdout


def test_stale_socket_hint():
    """A socket file that nobody listens on any more (an ovld killed
    without removing it): the refused connection says what to check, as a
    missing socket does."""
    with tempfile.TemporaryDirectory(prefix="ovl-test-") as tmp:
        path = os.path.join(tmp, "ovld.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        s.close()  # the file stays: a stale socket
        p = ctl("--socket", path, "status", check=False)
        assert (p.returncode, p.stdout, p.stderr) == (
            1, "", "ovlctl: cannot connect to %s: Connection refused (is ovld running?)\n" %
            path), p


def test_plan_streams_not_used():
    """ring's streams are fixed by its roles: --streams 2 gives a plan with
    streams=4, and ovlctl says on stderr that the value asked for was not
    used (the plan on stdout stays the planner's text); the help says so
    too. A value that is used says nothing."""
    p = ctl("plan", "--algo", "ring", *PLAN_ARGS)
    assert " streams=4 " in p.stdout.splitlines()[0], p.stdout
    assert p.stderr == ("ovlctl plan: --streams 2 not used: the plan has streams=4 (ring's "
                        "streams are fixed by its roles: the client's, a copy stream and compute "
                        "streams)\n"), p.stderr
    p = ctl("plan", "--algo", "collective", *PLAN_ARGS)
    assert " streams=2 " in p.stdout.splitlines()[0] and p.stderr == "", (p.stdout, p.stderr)
    p = ctl("plan", "--algo", "ring", *[a for a in PLAN_ARGS if a not in ("--streams", "2")])
    assert p.stderr == "", p.stderr
    assert ("ring's and\n                           push's streams are fixed by their roles"
            in ctl("--help").stdout)
    # push (gemm_rs, here by ovl-demo's spelling of the kind) the same way
    p = ctl("plan", "--op", "rs", "--algo", "push", "--world", "2", "--rank", "0",
            "-m", "64", "-n", "16", "-k", "32", "--streams", "2")
    assert " streams=4 " in p.stdout.splitlines()[0], p.stdout
    assert p.stderr == ("ovlctl plan: --streams 2 not used: the plan has streams=4 (push's "
                        "streams are fixed by its roles: the client's, a copy stream and compute "
                        "streams)\n"), p.stderr


def json_keys(v, out):
    """Every key of every object in v, into the set out."""
    if isinstance(v, dict):
        for k, x in v.items():
            out.add(k)
            json_keys(x, out)
    elif isinstance(v, list):
        for x in v:
            json_keys(x, out)
    return out


def test_json_keys_documented():
    """Every key that status --json and stats --json write (with a job, a
    client, a device, an op and its algorithm) is in docs/ovlctl.md's
    block for that command."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                           "ovlctl.md")) as f:
        doc = f.read()
    blocks = {name: doc[doc.index("## `%s --json`" % name):] for name in ("status", "stats")}
    for name in blocks:
        b = blocks[name]
        start = b.index("```")
        blocks[name] = b[start:b.index("\n## ", start)]
    d = Daemon()
    demo = None
    try:
        demo = long_demo(d, ["-m", "16", "-n", "16", "-k", "16"], "docs-job")
        status = wait_job_going(d, "docs-job", 1)
        stats = json.loads(d.run([OVLCTL, "stats", "--json"]).stdout)
        for name, got in (("status", status), ("stats", stats)):
            missing = sorted(k for k in json_keys(got, set())
                             if '"%s"' % k not in blocks[name])
            assert not missing, "docs/ovlctl.md does not describe %s --json's %s" % (name,
                                                                                    missing)
        os.killpg(demo.pid, signal.SIGTERM)
        demo.communicate(timeout=60)
        wait_no_job(d)
        assert d.stop() == 0
    finally:
        if demo and demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.communicate()
        d.cleanup()


def test_plan_from_daemon():
    """plan --daemon: the plan ovld would run, its defaults applied (the
    offline plan with the same algorithm and chunks); a shape it cannot
    plan is refused with its reason (exit 1); version names ovld as it
    answers."""
    d = Daemon(config="default_algo = collective\ndefault_chunks = 2\nallgather = copy\n")
    try:
        shape = ["--world", "2", "--rank", "0", "-m", "64", "-n", "64", "-k", "64"]
        p = d.run([OVLCTL, "plan", "--daemon", *shape])
        # the same plan, which ovld's default_algo chose (its text says so)
        lines = p.stdout.splitlines(True)
        assert lines[1] == "chosen by the daemon's default_algo\n", lines[:2]
        assert p.stderr == "" and lines[0] + "".join(lines[2:]) == ctl(
            "plan", "--algo", "collective", "--chunks", "2", "--allgather", "copy",
            *shape).stdout, p.stdout
        assert p.stdout.startswith("plan format=5 kind=ag_gemm algo=collective world=2 rank=0 m=64 "
                                   "n=64 k=64 dtype=bf16 transb=no chunks=2 "), p.stdout
        # the daemon's allgather setting: the copy engine, its ordering shown
        assert "allgather=copy" in p.stdout and "PULL" in p.stdout, p.stdout
        assert "ALLGATHER" not in p.stdout and "s1=copy" in p.stdout, p.stdout
        # what the client asks for wins over the defaults
        p = d.run([OVLCTL, "plan", "--daemon", "--algo", "ring", "--chunks", "4", *shape])
        assert p.stdout == ctl("plan", "--algo", "ring", "--chunks", "4", "--allgather", "copy",
                               *shape).stdout
        p = d.run([OVLCTL, "plan", "--daemon", "--world", "0", "--rank", "0", "-m", "64", "-n",
                   "64", "-k", "64"], check=False)
        assert (p.returncode, p.stdout, p.stderr) == (
            1, "", "ovlctl: plan: cannot plan: world 0 out of range 1..1024\n"), p
        p = d.run([OVLCTL, "version"])
        lines = p.stdout.split("\n")
        m = re.fullmatch(r"ovlctl (\d+\.\d+\.\d+) \(protocol (\d+)\)", lines[0])
        assert m and lines[1:] == ["ovld %s (protocol %s), host backend, pid %d" % (
            m.group(1), m.group(2), d.proc.pid), ""], p.stdout
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_plan_from_daemon_bs():
    """plan --daemon with several Bs and transb, against an ovld of the
    default settings: the offline plan of the same op, for every algorithm
    and auto, with and without transb and a_out, up to 8 Bs (7 more); the
    bs line and every B's GEMM are there. What ovld refuses of the Bs (a
    count over 8, an n of 0) is test_limits.c's test_plan_bs_refused, on
    the wire: ovlctl refuses them itself."""
    d = Daemon()
    try:
        shape = ["--world", "4", "--rank", "1", "-m", "512", "-n", "256", "-k", "96"]
        cases = [(algo, more, extra)
                 for algo in ("naive", "collective", "ring", "auto")
                 for more in ("64,96", "1,2,3,4,5,6,7")
                 for extra in ([], ["--transb"], ["--transb", "--a-out", "--dtype", "fp32"])]
        # the chunks and streams the client asks for travel with the Bs
        cases += [("collective", "40", ["--chunks", "3", "--streams", "3"]),
                  ("ring", "2000,3", ["--transb", "--chunks", "2"])]
        for algo, more, extra in cases:
            args = ["plan", "--algo", algo, "--more-n", more, *extra, *shape]
            p = d.run([OVLCTL, "plan", "--daemon", *args[1:]])
            local = ctl(*args).stdout
            assert p.stderr == "" and p.stdout == local, (args, p.stdout, local)
            ns = [256] + [int(n) for n in more.split(",")]
            lines = p.stdout.splitlines()
            # auto: the "chosen by" line first (both texts have it)
            bs = lines[2] if algo == "auto" else lines[1]
            assert bs == "bs nb=%d n=%s" % (len(ns), ",".join(map(str, ns))), lines[:3]
            assert (algo == "auto") == lines[1].startswith("chosen by auto: "), lines[:2]
            assert (" transb=yes " in lines[0]) == ("--transb" in extra), lines[0]
            gemms = [l for l in lines if " GEMM " in l]
            assert len(gemms) % len(ns) == 0 and gemms, p.stdout
            # one GEMM per B, in B order: "... @ B1 n 64 ..." ("B1^T" with transb)
            assert [l.split(" @ ")[1].split()[0].split("^")[0] for l in gemms[:len(ns)]] == [
                "B"] + ["B%d" % i for i in range(1, len(ns))], gemms
        # transb alone, one B: the offline plan too, and no bs line
        args = ["plan", "--algo", "ring", "--transb", *shape]
        p = d.run([OVLCTL, "plan", "--daemon", *args[1:]])
        assert p.stdout == ctl(*args).stdout and "\nbs " not in p.stdout, p.stdout
        assert d.stop() == 0
    finally:
        d.cleanup()


if __name__ == "__main__":
    run_tests([test_plan_offline_matches_golden, test_plan_usage_errors,
               test_unreachable_daemon_exit_1, test_stale_socket_hint, test_plan_streams_not_used,
               test_json_keys_documented,
               test_plan_from_daemon, test_plan_from_daemon_bs])
