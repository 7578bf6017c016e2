"""ovld's life cycle: start on a temporary socket, `ovlctl status --json`
of an idle ovld, garbage and oversized frames on raw sockets (the Error
ovld answers, the log line that says why it closed each connection, the
next client served), SIGINT with work in flight (exit 0, the work
drained, the socket removed), a second ovld on a live socket and a new one
on a stale one, SIGHUP reload (taken, refused, and settings that wait for
a restart), bad command lines and configuration files, and detaching.

test_handshake.c covers the rest of the handshake through libovl and raw
sockets: the same refusals after a Hello, the frame limit's boundary
(test_frame_limit_boundary), SIGTERM with a job joined (exit 0, socket
removed: test_sigterm_stops_cleanly), the Hello and Status fields
(test_good_handshake)."""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

from ovltest import (DEMO, OVLCTL, OVLD, Daemon, demo_failed_row, frame, log_messages, log_records,
                     long_demo, run_tests, wait_job_going)


def status(d):
    p = d.run([OVLCTL, "status", "--json"])
    return json.loads(p.stdout)


def versions():
    """(version, protocol) that ovld --version and ovlctl version print for
    themselves: the same build, so the same both."""
    p = subprocess.run([OVLD, "--version"], capture_output=True, text=True, timeout=10)
    m = re.fullmatch(r"ovld (\d+\.\d+\.\d+) \(protocol (\d+)\)\n", p.stdout)
    assert p.returncode == 0 and p.stderr == "" and m, p
    c = subprocess.run([OVLCTL, "--socket", "/nonexistent/ovld.sock", "version"],
                       capture_output=True, text=True, timeout=10)
    assert c.stdout.split("\n")[0] == "ovlctl %s (protocol %s)" % m.groups(), (c.stdout, p.stdout)
    return m.group(1), int(m.group(2))


def test_status_json_fields():
    """`ovlctl status --json` of an idle ovld with 3 host devices: every
    field exactly (the host memory size is the machine's, sysinfo's)."""
    d = Daemon(config="host_devices = 3\n")
    try:
        s = status(d)
        version, protocol = versions()
        mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        assert 0 <= s.pop("uptime_s") < 60, s
        clients = s.pop("clients")
        assert s == {
            "version": version, "protocol_version": protocol, "pid": d.proc.pid,
            "backend": "host", "socket": d.socket,
            "config_file": os.path.realpath(os.path.join(d.dir, "ovld.conf")),
            "op_kinds": ["ag_gemm", "gemm_rs"],
            "connections": 1,  # ovlctl itself
            "restricted": False, "other_jobs": 0, "other_clients": 0,
            "devices": [{"index": i, "uuid": "HOST-6f766c2d-686f-7374-0000-%012x" % i,
                         "name": "host-%d" % i, "total_memory": mem, "streams": 0,
                         "held_bytes": 0, "mps": False} for i in range(3)],
            "jobs": [],
            "peer_self": "", "peers": []}, s  # no peer_listen: no links to other nodes
        assert len(clients) == 1, clients
        c = clients[0]
        assert c.pop("id") > 0 and c.pop("pid") > 0, c
        assert c == {"uid": os.getuid(), "gid": os.getgid(), "name": "ovlctl", "job": "",
                     "rank": -1, "buffers": 0, "mapped_bytes": 0}, c
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_status_while_issue_stalls():
    """The loop only passes messages: with every op's issue stalled for
    3 s on its thread (the fault OVLD_TEST_ISSUE_STALL_MS), `ovlctl status`
    still answers at once, the job is seen waiting, the op then completes
    with correct results, and the slow issue is reported."""
    d = Daemon(config="host_devices = 2\n", env={"OVLD_TEST_ISSUE_STALL_MS": "3000"})
    try:
        demo = subprocess.Popen([DEMO, "-w", "2", "-m", "64", "-n", "64", "-k", "64", "-a", "ring",
                                 "-i", "1", "--job", "stall"], env=d.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        # the first op reaches the issuer once both ranks are in
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "job 'stall': ready" not in d.log_text():
            time.sleep(0.02)
        assert "job 'stall': ready" in d.log_text(), d.log_text()
        time.sleep(0.3)  # its first op is on an issuing thread, stalled
        took = []
        seen_waiting = False
        for _ in range(5):
            t0 = time.monotonic()
            s = status(d)
            took.append(time.monotonic() - t0)
            jobs = [j for j in s["jobs"] if j["id"] == "stall"]
            seen_waiting |= bool(jobs) and jobs[0]["ops_done"] == 0
            time.sleep(0.2)
        # ovlctl's own start is in these (an ASan build): far below the stall
        assert max(took) < 1.5, took
        assert seen_waiting, "the job was never seen with its op still issuing"
        out, err = demo.communicate(timeout=120)
        assert demo.returncode == 0, (out, err, d.log_text()[-3000:])
        assert re.search(r"^ring +\d", out, re.M) and "all checks passed" in out, out
        msgs = log_messages(d, "warn")
        assert any(re.fullmatch(r"op \d+ took (\d+) ms to issue \(its plans\): a device whose "
                                r"queue was full, or an NCCL launch waiting for a stalled GPU or "
                                r"another node", m) for m in msgs), msgs
        assert any(m.startswith("OVLD_TEST_ISSUE_STALL_MS: every op waits 3000 ms") for m in msgs), msgs
        assert d.stop() == 0
    finally:
        d.cleanup()


def raw(d):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(d.socket)
    return s


def read_all(s):
    """Reads until the daemon closes; returns what came."""
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def varint(n):
    """A protobuf varint; a negative int32 as protobuf writes it (10 bytes)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def error_frame(status, message):
    """The frame of a Response that carries only an Error (id 0): what ovld
    sends before it closes a connection whose bytes it cannot take."""
    msg = message.encode()
    err = b"\x08" + varint(status) + b"\x12" + varint(len(msg)) + msg
    return frame(b"\x12" + varint(len(err)) + err)


OVL_ERR_PROTOCOL, OVL_ERR_LIMIT = -4, -12


def test_garbage_and_oversized_frames():
    """Bytes ovld cannot take (not a frame, a length over max_frame_bytes,
    a body that is not a Request): one Error frame, then the end of that
    connection only, and one warning in the log that names the client and
    why; a client that hangs up in the middle of a frame is closed without
    a warning. ovld then counts only the connection that asks."""
    d = Daemon()
    try:
        cases = [
            (b"GET / HTTP/1.0\r\n\r\n", OVL_ERR_PROTOCOL, "bad frame header (magic)"),
            (b"OVL1" + b"\xff\xff\xff\xff", OVL_ERR_LIMIT,
             "frame larger than max_frame_bytes (1048576)"),
            (b"OVL1" + (1024 * 1024 + 1).to_bytes(4, "little"), OVL_ERR_LIMIT,
             "frame larger than max_frame_bytes (1048576)"),
            (frame(b"\xff\xff\xff\xff\xff"), OVL_ERR_PROTOCOL, "malformed request"),
        ]
        for payload, st, why in cases:
            s = raw(d)
            s.sendall(payload)
            reply = read_all(s)
            s.close()
            assert reply == error_frame(st, why), (payload, reply)
        # a frame cut off half-way, then the client goes away
        s = raw(d)
        s.sendall(b"OVL1" + (100).to_bytes(4, "little") + b"x" * 10)
        s.close()
        # the daemon is alive and answers the next client, which is all it
        # has: the half frame's connection is closed by then
        deadline = time.monotonic() + 10
        while True:
            st = status(d)
            if st["connections"] == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert st["pid"] == d.proc.pid and st["connections"] == 1, st
        # ovld's log: this process's connections, each closed once, why
        me = os.getpid()
        msgs = log_messages(d)
        ids = [int(m.group(1)) for m in (re.fullmatch(r"client (\d+): connected \(pid %d, uid "
                                                      r"%d, gid %d\)" % (me, os.getuid(),
                                                                           os.getgid()), x)
                                         for x in msgs) if m]
        # Daemon.wait_ready's probe, then the five raw connections
        assert len(ids) == 6 and ids == sorted(ids), msgs
        closed = {}
        for x in msgs:
            m = re.fullmatch(r"client (\d+) \(pid %d\): closed: (.*)" % me, x)
            if m:
                assert int(m.group(1)) not in closed, "closed twice: %r" % x
                closed[int(m.group(1))] = m.group(2)
        hung_up = "client closed the connection"
        assert closed == dict(zip(ids, [hung_up] + [why for _, _, why in cases] + [hung_up])), (
            closed, msgs)
        warned = [m for m in log_messages(d, "warn") if m.startswith("client ")]
        assert warned == ["client %d (pid %d, uid %d): %s; closing the connection" % (
            i, me, os.getuid(), why) for i, (_, _, why) in zip(ids[1:], cases)], warned
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_sigint_during_work():
    """SIGINT while a 2-rank job has ops in flight: ovld logs it, stops
    listening, fails the ops not yet issued (OVL_ERR_SHUTDOWN), lets the
    issued ones finish (no 'still running' error), closes the connections,
    removes its socket and exits 0, 'stopped' its last word. The ranks end
    with one of libovl's exact messages for that."""
    d = Daemon()
    try:
        demo = long_demo(d, ["-m", "128", "-n", "128", "-k", "128"], "interrupted")
        try:
            wait_job_going(d, "interrupted", 5)
            t0 = time.monotonic()
            assert d.stop(signal.SIGINT) == 0, d.log_text()[-4000:]
            # the ops issued drain; the ranks take no more once theirs failed
            # (about 0.3 s here, 15-22 s when they went on submitting)
            assert time.monotonic() - t0 < 10, "SIGINT took %.1f s" % (time.monotonic() - t0)
            out, err = demo.communicate(timeout=60)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.communicate()
        assert not os.path.exists(d.socket)
        assert demo.returncode == 1, (demo.returncode, out, err)
        why = demo_failed_row(out, "ring")
        # client/libovl.c: an op failed by ovld (through CommCheck, or the
        # CommCheck refused itself), ovld's last Error, or the connection
        # closed under a call, or once the watcher gave ovld up
        pid = d.proc.pid
        words = (r"op \d+: ovld is shutting down|op \d+ failed: daemon shutting down|"
                 r"ovld is shutting down|ovld closed the connection \((sending to ovld|"
                 r"receiving from ovld|waiting for ops)\)|op \d+: ovld \(pid %d\) went away: "
                 r"its connection closed( and it exited| \(whether it exited cannot be seen "
                 r"from here\)); ops not done by then were not computed, and the waits on them "
                 r"were released( \(ovld said: ovld is shutting down\))?" % pid)
        assert re.fullmatch(words, why), (why, out, err)
        msgs = log_messages(d)
        i = msgs.index("received SIGINT")
        m = re.fullmatch(r"stopping: no new connections; (\d+) ops in flight", msgs[i + 1])
        # ops back to back, ovld's window full: there was work to drain
        assert m and int(m.group(1)) > 0, msgs[i:i + 2]
        assert msgs[-1] == "stopped", msgs[-20:]
        ended = [x for x in msgs[i:] if x.startswith("job 'interrupted': ended after ")]
        assert len(ended) == 1, msgs[i:]
        # every op that failed, failed for the shutdown; nothing was left running
        assert not log_messages(d, "error"), log_messages(d, "error")
        failed = [x for x in msgs if re.match(r"job 'interrupted': op \d+ failed: ", x)]
        assert all(re.fullmatch(r"job 'interrupted': op \d+ failed: ovld is shutting down", x)
                   for x in failed), failed
    finally:
        d.cleanup()


def test_stale_socket_and_second_daemon():
    """A second ovld on a socket that a live one listens on refuses to start
    (exit 1, one error line naming the socket) and leaves the first one
    serving; once the first is killed, its socket file is stale and a new
    ovld replaces it and serves there."""
    d = Daemon()
    try:
        p = subprocess.Popen([OVLD, "--foreground", "--backend", "host", "--socket", d.socket],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = p.communicate(timeout=10)
        assert p.returncode == 1 and out == "", (p.returncode, out, err)
        assert log_records(err, p.pid) == [
            ("error", "another daemon is listening on %s" % d.socket)], err
        assert status(d)["pid"] == d.proc.pid
        d.proc.kill()  # leaves a stale socket file behind
        d.proc.wait()
        assert os.path.exists(d.socket)
        # a new daemon replaces the stale file
        log = os.path.join(d.dir, "second.log")
        with open(log, "w") as f:
            p = subprocess.Popen([OVLD, "--foreground", "--backend", "host", "--socket", d.socket],
                                 stdout=f, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 10
            while True:
                r = subprocess.run([OVLCTL, "--socket", d.socket, "status", "--json"],
                                   capture_output=True, text=True, timeout=10)
                if r.returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert r.returncode == 0 and json.loads(r.stdout)["pid"] == p.pid, r
            p.send_signal(signal.SIGTERM)
            assert p.wait(10) == 0
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        with open(log) as f:
            msgs = [m for lv, m in log_records(f.read(), p.pid) if lv != "debug"]
        assert msgs[0] == "listening on %s" % d.socket, msgs
        assert msgs[-1] == "stopped", msgs
        assert not os.path.exists(d.socket)
    finally:
        d.cleanup()


PLAN_SHAPE = ["--world", "2", "--rank", "0", "-m", "64", "-n", "64", "-k", "64"]


def daemon_plan(d):
    """The plan ovld would run for PLAN_SHAPE (its defaults applied), less
    the line that says its default_algo chose the algorithm (an offline plan
    of a named algorithm has none)."""
    lines = d.run([OVLCTL, "plan", "--daemon", *PLAN_SHAPE], timeout=30).stdout.splitlines(True)
    assert lines[1] == "chosen by the daemon's default_algo\n", lines[:2]
    return lines[0] + "".join(lines[2:])


def offline_plan(algo, chunks):
    p = subprocess.run([OVLCTL, "plan", "--algo", algo, "--chunks", str(chunks), *PLAN_SHAPE],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stderr == "", p
    return p.stdout


def sighup(d, cfg, text, level, message, timeout=5.0):
    """Writes text to cfg, sends SIGHUP, and waits for one more `level` line
    `message` in ovld's log."""
    with open(cfg, "w") as f:
        f.write(text)
    before = log_messages(d, level).count(message)
    d.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while log_messages(d, level).count(message) == before:
        assert time.monotonic() < deadline, "no %s line %r after SIGHUP:\n%s" % (
            level, message, d.log_text()[-4000:])
        time.sleep(0.02)


def test_sighup_reload():
    """SIGHUP re-reads the file from ovld's defaults up: a good file is
    taken whole (the plan ovld would run follows default_algo and
    default_chunks, and a key no longer set is back to its default), a bad
    one is refused whole with its error and the running configuration
    kept, and settings fixed at start draw a warning and wait for a
    restart while the rest is taken."""
    d = Daemon(config="default_algo = ring\ndefault_chunks = 2\n")
    try:
        cfg = os.path.realpath(os.path.join(d.dir, "ovld.conf"))
        reread = "configuration re-read from %s" % cfg
        assert daemon_plan(d) == offline_plan("ring", 2)
        restart = ("SIGHUP: socket, socket_group, socket_mode, backend, host_devices and "
                   "capture_streams take effect only at restart")
        debug_before = len(log_messages(d, "debug"))
        sighup(d, cfg, "default_algo = collective\ndefault_chunks = 3\n", "info", reread)
        assert daemon_plan(d) == offline_plan("collective", 3)
        # The command line (--socket, --backend host, --log-level debug) still
        # wins over the file: nothing to warn about, and debug lines go on.
        assert log_messages(d, "warn").count(restart) == 0, log_messages(d, "warn")
        assert len(log_messages(d, "debug")) > debug_before
        # a bad line 2: line 1 is not taken either
        sighup(d, cfg, "default_algo = naive\nmax_jobs = 0\n", "error",
               "SIGHUP: %s:2: max_jobs: '0' is out of range 1..65536; keeping the running "
               "configuration" % cfg)
        assert daemon_plan(d) == offline_plan("collective", 3)
        # host_devices waits for a restart; default_chunks is unset: 0 again
        sighup(d, cfg, "default_algo = naive\nhost_devices = 2\n", "info", reread)
        msgs = log_messages(d)
        assert msgs[-2:] == [restart, reread], msgs[-4:]
        assert log_messages(d, "warn").count(restart) == 1
        assert daemon_plan(d) == offline_plan("naive", 0)
        st = status(d)
        assert st["pid"] == d.proc.pid and len(st["devices"]) == 8, st
        assert log_messages(d).count(reread) == 2
        # so does capture_streams (the backend took it at start)
        sighup(d, cfg, "default_algo = naive\nhost_devices = 8\ncapture_streams = 4\n", "info",
               reread)
        msgs = log_messages(d)
        assert msgs[-2:] == [restart, reread], msgs[-4:]
        assert log_messages(d, "warn").count(restart) == 2
        assert log_messages(d).count(reread) == 3
        # and auto's measuring settings (its table was made at start)
        tune = ("SIGHUP: tune_samples, tune_entries, tune_entries_per_uid and state_dir take "
                "effect only at restart")
        sighup(d, cfg, "default_algo = naive\nhost_devices = 8\ncapture_streams = 4\n"
               "tune_samples = 0\n", "info", reread)
        msgs = log_messages(d)
        assert msgs[-3:] == [restart, tune, reread], msgs[-4:]
        assert d.run([OVLCTL, "tune"]).stdout.startswith("auto measures;")
        assert d.stop() == 0
    finally:
        d.cleanup()


def ovld_run(*args):
    p = subprocess.run([OVLD, *args], capture_output=True, text=True, timeout=10)
    return p.returncode, p.stdout, p.stderr


def test_bad_command_line_and_config():
    """ovld's command line: --help and --version on stdout, exit 0; an
    unknown option, a stray argument or a bad value exits 2 with its exact
    message (and the usage for the first two) on stderr; a bad
    configuration file the same, naming file and line, before anything
    starts."""
    rc, helptext, err = ovld_run("--help")
    assert rc == 0 and err == "" and helptext.startswith("Usage: ovld [OPTIONS]\n"), helptext
    opts = re.findall(r"^  -(\w), --([\w-]+)", helptext, re.M)
    assert opts == [("c", "config"), ("s", "socket"), ("b", "backend"), ("l", "log-level"),
                    ("f", "foreground"), ("h", "help"), ("V", "version")], helptext
    # where a detached ovld's log goes is said
    assert "      --log-file FILE " in helptext and "journalctl -t ovld" in helptext, helptext
    version, protocol = versions()
    assert ovld_run("--version") == (0, "ovld %s (protocol %d)\n" % (version, protocol), "")
    assert ovld_run("-V") == ovld_run("--version")
    assert ovld_run("-h") == ovld_run("--help")
    assert ovld_run("--no-such-flag") == (
        2, "", "%s: unrecognized option '--no-such-flag'\n%s" % (OVLD, helptext))
    assert ovld_run("extra") == (2, "", "ovld: unexpected argument 'extra'\n" + helptext)
    assert ovld_run("--foreground", "--backend", "fpga") == (
        2, "", "ovld: command line:1: backend: 'fpga' is not one of auto, host, cuda\n")
    with tempfile.TemporaryDirectory(prefix="ovl-test-") as tmp:
        cfg = os.path.join(tmp, "bad.conf")
        with open(cfg, "w") as f:
            f.write("# comment\nsokcet = %s\n" % os.path.join(tmp, "ovld.sock"))
        r = ovld_run("--foreground", "--config", cfg)
        assert r == (2, "", "ovld: %s:2: unknown key 'sokcet'\n" % cfg), r
        assert os.listdir(tmp) == ["bad.conf"]  # nothing started


def test_detaches_when_not_in_foreground():
    d = Daemon()
    d.stop()
    sock = d.socket
    # stderr to a file: a detached ovld keeps it (its log) open
    with open(os.path.join(d.dir, "detached.log"), "w") as log:
        p = subprocess.run([OVLD, "--backend", "host", "--socket", sock], stdout=log, stderr=log,
                           timeout=10)
    try:
        assert p.returncode == 0
        # the parent returned once the socket listens
        r = subprocess.run([OVLCTL, "--socket", sock, "status", "--json"], capture_output=True,
                           text=True, timeout=10)
        assert r.returncode == 0, r.stderr
        pid = json.loads(r.stdout)["pid"]
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not os.path.exists(sock)
    finally:
        d.cleanup()


def test_detached_leaves_the_terminal():
    """A detached ovld writes nothing more to the stderr it was started
    with (a terminal): with --log-file its log goes to that file, without
    one to syslog. The parent returns once the socket listens, and the
    stderr it was given is closed by then in every process (a pipe reads
    EOF), so nothing can write to it; a bad --log-file is said on the
    terminal (exit 2), and a start that fails says where its log went."""
    with tempfile.TemporaryDirectory(prefix="ovl-test-") as tmp:
        for log_file in (os.path.join(tmp, "ovld.log"), None):
            sock = os.path.join(tmp, "ovld.sock")
            cmd = [OVLD, "--backend", "host", "--socket", sock, "--log-level", "debug"]
            if log_file:
                cmd += ["--log-file", log_file]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                # EOF on both pipes: no process holds them, the daemon included
                out, err = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                raise AssertionError("a detached ovld kept the stderr it was started with open "
                                     "(it would write its log to the terminal)")
            try:
                assert p.returncode == 0 and out == "" and err == "", (p.returncode, out, err)
                r = subprocess.run([OVLCTL, "--socket", sock, "status", "--json"],
                                   capture_output=True, text=True, timeout=10)
                assert r.returncode == 0, r.stderr
                pid = json.loads(r.stdout)["pid"]
            finally:
                if os.path.exists(sock):
                    r = subprocess.run([OVLCTL, "--socket", sock, "status", "--json"],
                                       capture_output=True, text=True, timeout=10)
                    if r.returncode == 0:
                        os.kill(json.loads(r.stdout)["pid"], signal.SIGTERM)
            deadline = time.monotonic() + 10
            while os.path.exists(sock) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not os.path.exists(sock)
            if log_file:
                deadline = time.monotonic() + 10
                text = ""
                while "stopped" not in text and time.monotonic() < deadline:
                    time.sleep(0.05)
                    with open(log_file) as f:
                        text = f.read()
                msgs = [m for _, m in log_records(text, pid)]
                assert any(m.startswith("ovld ") and " ready: host backend" in m
                           for m in msgs), text
                assert msgs[-1] == "stopped", text
        # a --log-file that cannot be opened: said here, nothing started
        bad = os.path.join(tmp, "no-such-dir", "ovld.log")
        r = ovld_run("--backend", "host", "--socket", os.path.join(tmp, "x.sock"),
                     "--log-file", bad)
        assert r[0] == 2 and r[2] == "ovld: --log-file %s: No such file or directory\n" % bad, r
        # a detached start that fails (the socket's directory is missing)
        # says where its log went
        log_file = os.path.join(tmp, "fail.log")
        r = ovld_run("--backend", "host", "--socket", os.path.join(tmp, "nodir", "x.sock"),
                     "--log-file", log_file)
        assert r[0] == 1 and r[2] == "ovld: did not start; its log: %s\n" % log_file, r
        assert " error: " in open(log_file).read()


def test_log_file_with_stderr_closed():
    """Started with its stderr closed (a service manager's or a script's
    `2>&-`), ovld in the foreground still writes its log to --log-file: the
    file does not take descriptor 2, which ovld would then close as its
    stderr, leaving the log nowhere (and descriptor 2 to the event loop)."""
    with tempfile.TemporaryDirectory(prefix="ovl-test-") as tmp:
        sock, log_file = os.path.join(tmp, "ovld.sock"), os.path.join(tmp, "ovld.log")
        p = subprocess.Popen([OVLD, "--foreground", "--backend", "host", "--socket", sock,
                              "--log-file", log_file],
                             stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(2))
        try:
            deadline = time.monotonic() + 20
            while not os.path.exists(sock) and time.monotonic() < deadline:
                assert p.poll() is None, p.returncode
                time.sleep(0.02)
            r = subprocess.run([OVLCTL, "--socket", sock, "status"], capture_output=True,
                               text=True, timeout=10)
            assert r.returncode == 0, r.stderr
        finally:
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=20) == 0
        with open(log_file) as f:
            text = f.read()
        assert " ready: host backend" in text and "stopped" in text, text


def test_malloc_environment_kept():
    """ovld fixes glibc's malloc thresholds at start (daemon/main.c), unless
    its environment sets them: then the operator's settings stay, and the
    log says so; with none set it never says so."""
    def start_and_log(tmp, extra_env):
        sock, log_file = os.path.join(tmp, "ovld.sock"), os.path.join(tmp, "ovld.log")
        if os.path.exists(log_file):
            os.unlink(log_file)
        env = dict(os.environ, **extra_env)
        for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
            if k not in extra_env:
                env.pop(k, None)
        if "GLIBC_TUNABLES" not in extra_env:
            env.pop("GLIBC_TUNABLES", None)
        p = subprocess.Popen([OVLD, "--foreground", "--backend", "host", "--socket", sock,
                              "--log-level", "info", "--log-file", log_file], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while not os.path.exists(sock) and time.monotonic() < deadline:
                assert p.poll() is None, p.returncode
                time.sleep(0.02)
            assert os.path.exists(sock)
        finally:
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=20) == 0
        with open(log_file) as f:
            return f.read()

    kept = "malloc: the environment's settings kept"
    with tempfile.TemporaryDirectory(prefix="ovl-test-") as tmp:
        assert kept not in start_and_log(tmp, {})
        for extra in ({"MALLOC_TRIM_THRESHOLD_": "8388608"},
                      {"MALLOC_MMAP_THRESHOLD_": "262144"},
                      {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=8388608"}):
            text = start_and_log(tmp, extra)
            assert kept in text, (extra, text)
            assert " ready: host backend" in text, text
        # a tunable of another namespace is not a malloc setting
        assert kept not in start_and_log(tmp, {"GLIBC_TUNABLES": "glibc.rtld.nns=2"})


def test_cuda_without_driver_says_so():
    """Where ovld is built with CUDA but the machine has no NVIDIA driver
    (or no GPU), --backend cuda fails saying so, not with CUDA's "CUDA
    driver version is insufficient for CUDA runtime version". Where the
    CUDA backend starts (a GPU) or is not built, there is nothing to
    check."""
    bench = os.path.join(os.environ.get("OVL_BUILD_DIR", ""), "bench", "ovl-bench")
    if os.environ.get("OVL_BUILD_DIR") and os.path.exists(bench):
        # ovl-bench's probe says the same where it finds no GPU
        p = subprocess.run([bench, "--socket", "/nonexistent/ovld.sock"], capture_output=True,
                           text=True, timeout=120)
        out = p.stdout + p.stderr
        if "cudaGetDeviceCount" in out:
            assert "insufficient" not in out, out
            assert "no NVIDIA driver is installed" in out or "no NVIDIA GPU found" in out, out
    with tempfile.TemporaryDirectory(prefix="ovl-test-") as tmp:
        sock = os.path.join(tmp, "ovld.sock")
        p = subprocess.Popen([OVLD, "--foreground", "--backend", "cuda", "--socket", sock],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)  # it started: a GPU is here
            p.communicate(timeout=30)
            print("  (the CUDA backend started: a GPU is here, nothing to check)")
            return
        if "cudaGetDeviceCount" not in out:
            print("  (no CUDA backend here: %s)" % out.strip().splitlines()[-1:])
            return
        assert "insufficient" not in out, out
        assert ("no NVIDIA driver is installed" in out or "no NVIDIA GPU found" in out or
                "older than this CUDA runtime" in out), out


if __name__ == "__main__":
    run_tests([test_detached_leaves_the_terminal, test_log_file_with_stderr_closed,
               test_cuda_without_driver_says_so, test_status_json_fields,
               test_garbage_and_oversized_frames,
               test_sigint_during_work, test_stale_socket_and_second_daemon, test_sighup_reload,
               test_bad_command_line_and_config, test_detaches_when_not_in_foreground,
               test_status_while_issue_stalls])
