"""A client that dies with ops in flight on the CUDA backend: ovl-demo runs a
long job on 2 GPUs; one rank process is killed (SIGKILL) mid-way, so its
stream never says `ready` for the ops it had submitted. ovld must let those
ops run out (it releases the departed rank's waits), end the job, free what
it held, keep serving: a fresh job right after passes its checks, and SIGTERM
still stops ovld at once. Without 2 GPUs (ovld cannot start the CUDA
backend) prints "SKIP: ..." and exits 77."""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

from ovltest import DEMO, OVLCTL, Daemon, run_tests  # noqa: E402

SKIP_CODE = 77


def start_daemon():
    try:
        d = Daemon(backend="cuda")
    except AssertionError as e:
        if "cannot start the cuda backend" in str(e):
            print("SKIP: ovld cannot start the CUDA backend here")
            sys.exit(SKIP_CODE)
        raise
    return d


def log_excerpt(d, lines=80):
    """ovld's log without the per-connection debug lines that bury the rest."""
    keep = [ln for ln in d.log_text().splitlines() if " debug: " not in ln]
    return "\n".join(keep[-lines:])


def status(d):
    try:
        return json.loads(d.run([OVLCTL, "status", "--json"], timeout=30).stdout)
    except subprocess.TimeoutExpired:
        raise AssertionError("ovld does not answer (its loop is blocked); its log ends:\n" +
                             log_excerpt(d))


def test_client_killed_mid_job():
    d = start_daemon()
    try:
        s = status(d)
        if s["backend"] != "cuda" or len(s["devices"]) < 2:
            d.stop()
            print("SKIP: needs 2 GPUs on the CUDA backend")
            sys.exit(SKIP_CODE)
        demo = subprocess.Popen([DEMO, "-w", "2", "-m", "2048", "-n", "4096", "-k", "4096",
                                 "-a", "ring", "-i", "100000", "--job", "doomed"], env=d.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        # wait until the job runs ops, then kill one rank process outright
        deadline = time.monotonic() + 60
        victim = None
        while time.monotonic() < deadline and victim is None:
            s = status(d)
            jobs = [j for j in s["jobs"] if j["id"] == "doomed"]
            if jobs and jobs[0]["ops_done"] > 50:
                ranks = [c for c in s["clients"] if c["job"] == "doomed" and c["rank"] == 1]
                if ranks:
                    victim = ranks[0]["pid"]
            time.sleep(0.05)
        assert victim, "the job never got going:\n" + log_excerpt(d)
        os.kill(victim, signal.SIGKILL)
        try:
            demo.communicate(timeout=60)  # the demo stops its other rank itself
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.communicate()
            raise AssertionError("ovl-demo did not end after a rank died:\n" + log_excerpt(d))
        assert demo.returncode != 0
        # ovld lets the in-flight ops run out and forgets the job
        deadline = time.monotonic() + 30
        while True:
            s = status(d)
            held = sum(dev["held_bytes"] for dev in s["devices"])
            if not s["jobs"] and held == 0:
                break
            assert time.monotonic() < deadline, "job or memory left behind: %r\n%s" % (
                s, log_excerpt(d))
            time.sleep(0.1)
        # and serves a fresh job correctly
        p = d.run([DEMO, "-w", "2", "-m", "256", "-n", "384", "-k", "512", "-i", "3",
                   "--job", "after"], timeout=120)
        assert "all checks passed" in p.stdout, p.stdout
        # ovld's loop never stopped turning (daemon/stall.c reports it)
        assert "event loop has not turned" not in d.log_text(), log_excerpt(d)
        t0 = time.monotonic()
        assert d.stop() == 0
        assert time.monotonic() - t0 < 10, "SIGTERM took %.1f s" % (time.monotonic() - t0)
    finally:
        d.cleanup()


if __name__ == "__main__":
    run_tests([test_client_killed_mid_job])
