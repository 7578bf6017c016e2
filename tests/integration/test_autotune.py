"""`auto` that measures, end to end on the host backend (docs/config.md
tune_samples, state_dir; daemon/core/tune.h): ops that say auto first run
the planner's candidates in turn, each timed, every result checked by
ovl-demo as any op's; then the fastest for every later op, which `ovlctl
plan --daemon` shows; the choice is written to the state directory and a
restarted ovld runs it from its first op; a state file that does not parse
is skipped line by line with words; tune_samples = 0 is the rule alone
(test_e2e.py, test_auto_and_defaults)."""
import json
import os
import re
import shutil
import tempfile
import time

from ovltest import DEMO, OVLCTL, Daemon, log_messages, run_tests

SHAPE = ["-m", "32", "-n", "16", "-k", "24"]
OPS = re.compile(r"job '([\w-]+)': op (\d+) issued \(ag_gemm (\w+), ")


def issued(d, job):
    """The algorithm of each op of job, in order, as ovld's log says."""
    out = []
    for m in log_messages(d):
        g = OPS.match(m)
        if g and g.group(1) == job:
            out.append(g.group(3))
    return out


def tune_file(state):
    # not the .tmp a save writes before it renames it into place
    files = [f for f in os.listdir(state) if f.startswith("tune-") and f.endswith(".txt")]
    assert len(files) <= 1, files
    return os.path.join(state, files[0]) if files else None


def wait_file(state, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = tune_file(state)
        if path:
            with open(path) as f:
                text = f.read()
            if what in text:
                return path, text
        time.sleep(0.05)
    raise AssertionError("no %r in a tuning file of %s within %.0f s: %s" % (
        what, state, timeout, os.listdir(state)))


def daemon_plan(d):
    return d.run([OVLCTL, "plan", "--daemon", "--algo", "auto", "--world", "2", "--rank", "0",
                  "-m", "32", "-n", "16", "-k", "24"]).stdout


def test_measures_then_keeps():
    """The first ops try several algorithms (every result checked), then one
    is chosen and kept: in the log, in ovlctl plan --daemon, in the state
    file (0600, written whole), and after a restart from the first op."""
    state = tempfile.mkdtemp(prefix="ovl-test-state-")
    try:
        cfg = "tune_samples = 1\nstate_dir = %s\n" % state
        d = Daemon(config=cfg)
        try:
            before = daemon_plan(d)
            assert "chosen by auto: " in before and "measured" not in before, before
            p = d.run([DEMO, "-w", "2", *SHAPE, "-a", "auto", "-i", "40", "--job", "tune-a"])
            assert "all checks passed" in p.stdout, p.stdout
            algos = issued(d, "tune-a")
            assert len(algos) == 41, algos
            # which op is the first to run the choice depends on how far
            # the client ran ahead of the ops' times: the choice is read
            # from the table, and the next job runs it from its first op
            path, text = wait_file(state, " chose=")
            chosen = re.search(r" chose=(\w+)/", text).group(1)
            tried = set(re.findall(r"(\w+)/\d+(?:/\w+)?:[1-9]\d*", text.split(" ns=")[1]))
            assert set(algos) == tried and len(tried) >= 2, (algos, text)  # several tried
            p = d.run([DEMO, "-w", "2", *SHAPE, "-a", "auto", "-i", "4", "--job", "tune-a2"])
            assert "all checks passed" in p.stdout, p.stdout
            assert issued(d, "tune-a2") == [chosen] * 5, (issued(d, "tune-a2"), text)  # then one
            plan = daemon_plan(d)
            assert "chosen by auto: the fastest plan measured" in plan, plan
            assert re.match(r"plan format=5 kind=ag_gemm algo=%s " % chosen, plan), plan
            assert (os.stat(path).st_mode & 0o777) == 0o600, oct(os.stat(path).st_mode)
            assert text.startswith("ovld-tune 1 host host-0\n"), text
            assert " measuring" not in text, text
            deadline = time.monotonic() + 10  # a save in flight ends with its rename
            while [f for f in os.listdir(state) if f.endswith(".tmp")]:
                assert time.monotonic() < deadline, os.listdir(state)
                time.sleep(0.05)
            # ovlctl tune: the table, as text and JSON
            out = d.run([OVLCTL, "tune"]).stdout.splitlines()
            assert out[0] == "auto measures; 1 shape, 1 chosen; kept in %s" % path, out
            assert len(out) == 2 and " chose=%s/" % chosen in out[1], out
            js = json.loads(d.run([OVLCTL, "tune", "--json"]).stdout)
            assert js["measuring"] is True and js["file"] == path, js
            assert js["keys"] == 1 and js["chosen"] == 1 and not js["cleared"], js
            assert js["text"] == text, (js["text"], text)
            assert d.stop() == 0
        finally:
            d.cleanup()
        # a new ovld: the choice from the file, for the first op
        d = Daemon(config=cfg)
        try:
            assert "chosen by auto: the fastest plan measured" in daemon_plan(d)
            p = d.run([DEMO, "-w", "2", *SHAPE, "-a", "auto", "-i", "2", "--job", "tune-b"])
            assert "all checks passed" in p.stdout, p.stdout
            assert issued(d, "tune-b") == [chosen] * 3, issued(d, "tune-b")
            assert any("1 measured choice(s) from %s" % path in m for m in log_messages(d))
            # cleared: forgotten in memory and, within a second or two, on disk
            out = d.run([OVLCTL, "tune", "--clear"]).stdout.splitlines()
            assert out[0] == "cleared", out
            assert out[1].startswith("auto measures; 0 shapes, 0 chosen"), out
            assert "the fastest plan measured" not in daemon_plan(d)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with open(path) as f:
                    if f.read() == "ovld-tune 1 host host-0\n":
                        break
                time.sleep(0.05)
            with open(path) as f:
                assert f.read() == "ovld-tune 1 host host-0\n"
            assert any("measured choices cleared by uid" in m for m in log_messages(d))
            assert d.stop() == 0
        finally:
            d.cleanup()
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_bad_state_file():
    """A state file with lines that do not parse: each skipped, the first
    named in the log, the good ones taken; another device's file: nothing
    taken; ovld serves either way."""
    state = tempfile.mkdtemp(prefix="ovl-test-state-")
    try:
        path = os.path.join(state, "tune-host_host-0.txt")
        good = ("kind=ag_gemm world=2 m=32 n=16 k=24 dtype=bf16 transb=0 a_out=0 strided=0 "
                "shared_gpu=0 allgather=auto chose=ring/2 ns=naive/0:90,ring/2:10\n")
        with open(path, "w") as f:
            f.write("ovld-tune 1 host host-0\nkind=ag_gemm world=2 m=oops\n" + good)
        d = Daemon(config="tune_samples = 1\nstate_dir = %s\n" % state)
        try:
            warns = [m for m in log_messages(d, "warn") if "tuning:" in m]
            assert any("1 line(s) skipped" in m and "line 2: m" in m for m in warns), warns
            plan = daemon_plan(d)
            assert re.match(r"plan format=5 kind=ag_gemm algo=ring .* chunks=2 ", plan), plan
            assert "the fastest plan measured" in plan, plan
            assert d.stop() == 0
        finally:
            d.cleanup()
        with open(path, "w") as f:
            f.write("ovld-tune 1 cuda NVIDIA H200 cuda 13000\n" + good)
        d = Daemon(config="tune_samples = 1\nstate_dir = %s\n" % state)
        try:
            assert "the fastest plan measured" not in daemon_plan(d)
            assert d.stop() == 0
        finally:
            d.cleanup()
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_measuring_off():
    """tune_samples = 0: ovlctl tune says auto chooses by the rule, and no
    file is kept."""
    state = tempfile.mkdtemp(prefix="ovl-test-state-")
    try:
        d = Daemon(config="tune_samples = 0\nstate_dir = %s\n" % state)
        try:
            d.run([DEMO, "-w", "2", *SHAPE, "-a", "auto", "-i", "3", "--job", "tune-off"])
            algos = issued(d, "tune-off")
            assert len(algos) == 4 and len(set(algos)) == 1, algos
            out = d.run([OVLCTL, "tune"]).stdout
            assert out == ("auto chooses by the planner's rule (tune_samples = 0); 0 shapes, "
                           "0 chosen; kept in memory only\n"), out
            assert d.stop() == 0
            assert os.listdir(state) == []
        finally:
            d.cleanup()
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_unwritable_state_dir():
    """A state directory ovld cannot write: a warning, and the choices stay
    in memory (ops run as ever)."""
    if os.geteuid() == 0:
        # root writes anywhere: a path under a file cannot be written even so
        base = tempfile.mkdtemp(prefix="ovl-test-state-")
        state = os.path.join(base, "file")
        open(state, "w").close()
    else:
        base = tempfile.mkdtemp(prefix="ovl-test-state-")
        state = os.path.join(base, "ro")
        os.mkdir(state, 0o500)
    try:
        d = Daemon(config="tune_samples = 1\nstate_dir = %s\n" % state)
        try:
            p = d.run([DEMO, "-w", "2", *SHAPE, "-a", "auto", "-i", "40", "--job", "tune-c"])
            assert "all checks passed" in p.stdout, p.stdout
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if any("cannot write" in m for m in log_messages(d, "warn")):
                    break
                time.sleep(0.05)
            assert any("tuning: cannot write" in m and "the choices stay in memory" in m
                       for m in log_messages(d, "warn")), log_messages(d, "warn")
            assert "the fastest plan measured" in daemon_plan(d)
            assert d.stop() == 0
        finally:
            d.cleanup()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_measures_then_keeps, test_bad_state_file, test_measuring_off,
               test_unwritable_state_dir])
