"""ovlctl against a real ovld: the status table and JSON with a known job,
plans (offline, compared with the planner's golden files, and --daemon),
exit codes (0 ok, 1 daemon unreachable or refusing, 2 usage)."""
import json
import os
import subprocess
import time

from ovltest import DEMO, OVLCTL, Daemon, run_tests

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


def test_plan_usage_errors():
    assert ctl("plan", "--algo", "ring", check=False).returncode == 2  # missing shape
    assert ctl("plan", "--algo", "bogus", *PLAN_ARGS, check=False).returncode == 2
    p = ctl("plan", "--algo", "ring", "--world", "2", "--rank", "2", "-m", "8", "-n", "8", "-k",
            "8", check=False)
    assert p.returncode == 2 and "invalid" in p.stderr, p.stderr
    assert ctl("plan", "--allgather", "mpi", *PLAN_ARGS, check=False).returncode == 2
    # the daemon is asked only what the wire says: a dense op without transb
    for opt in (["--strided"], ["--transb"], ["--allgather", "copy"]):
        p = ctl("plan", "--daemon", *opt, *PLAN_ARGS, check=False)
        assert p.returncode == 2 and "--daemon" in p.stderr, p.stderr
    assert ctl("frobnicate", check=False).returncode == 2
    assert ctl(check=False).returncode == 2
    p = ctl("--help")
    for word in ("status", "plan", "version", "--json", "--daemon"):
        assert word in p.stdout


def test_unreachable_daemon_exit_1():
    p = ctl("--socket", "/nonexistent/ovld.sock", "status", check=False)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "/nonexistent/ovld.sock" in lines[0], p.stderr
    env = dict(os.environ, OVL_SOCKET="/nonexistent/env.sock")
    p = ctl("status", env=env, check=False)
    assert p.returncode == 1 and "env.sock" in p.stderr


def test_status_with_a_known_job():
    d = Daemon(config="host_devices = 2\n")
    try:
        # two ranks that stay in their job for a while: many back-to-back ops
        demo = subprocess.Popen([DEMO, "--job", "known-job", "-w", "2", "-m", "64", "-n", "64",
                                 "-k", "64", "-d", "fp32", "-a", "naive", "-i", "400"],
                                env=d.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        seen = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and demo.poll() is None:
            s = json.loads(d.run([OVLCTL, "status", "--json"]).stdout)
            if s["jobs"]:
                seen = s
                break
            time.sleep(0.01)
        out, err = demo.communicate(timeout=120)
        assert demo.returncode == 0, out + err
        assert seen is not None, "never saw the job in ovlctl status"
        job = seen["jobs"][0]
        assert job["id"] == "known-job" and job["world"] == 2
        assert job["owner_uid"] == os.getuid()
        assert job["state"] in ("forming", "ready")
        ranks = sorted(c["rank"] for c in seen["clients"] if c["job"] == "known-job")
        assert ranks in ([0], [1], [0, 1]), seen["clients"]
        for c in seen["clients"]:
            if c["job"] == "known-job":
                assert c["name"] == "ovl-demo" and c["pid"] > 0
        # the table for people names the same things
        t = d.run([OVLCTL, "status"]).stdout
        for word in ("DEVICES (2)", "JOBS (0)", "CLIENTS (1)", "host-0", "host-1", "backend:"):
            assert word in t, t
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_plan_from_daemon():
    d = Daemon(config="default_algo = collective\ndefault_chunks = 2\nallgather = copy\n")
    try:
        p = d.run([OVLCTL, "plan", "--daemon", "--world", "2", "--rank", "0", "-m", "64", "-n",
                   "64", "-k", "64"])
        assert p.stdout.startswith("plan format=2 algo=collective") and "chunks=2" in p.stdout, \
            p.stdout
        # the daemon's allgather setting: the copy engine, with its ordering shown
        assert "allgather=copy" in p.stdout and "PULL" in p.stdout, p.stdout
        assert "ALLGATHER" not in p.stdout and "s1=copy" in p.stdout, p.stdout
        p = d.run([OVLCTL, "plan", "--daemon", "--world", "0", "--rank", "0", "-m", "64", "-n",
                   "64", "-k", "64"], check=False)
        assert p.returncode == 1 and "cannot plan" in p.stderr, p.stderr
        p = d.run([OVLCTL, "version"])
        assert "ovlctl" in p.stdout and "host backend" in p.stdout
        assert d.stop() == 0
    finally:
        d.cleanup()


if __name__ == "__main__":
    run_tests([test_plan_offline_matches_golden, test_plan_usage_errors,
               test_unreachable_daemon_exit_1, test_status_with_a_known_job,
               test_plan_from_daemon])
