"""ovld's life cycle: start on a temporary socket, `ovlctl status --json`,
garbage and oversized frames on raw sockets (the daemon survives them and
answers the next client), SIGTERM (exit 0, socket removed), SIGHUP reload."""
import json
import os
import signal
import socket
import subprocess
import time

from ovltest import DEMO, OVLCTL, OVLD, Daemon, frame, run_tests


def status(d):
    p = d.run([OVLCTL, "status", "--json"])
    return json.loads(p.stdout)


def test_status_json_fields():
    d = Daemon(config="host_devices = 3\n")
    try:
        s = status(d)
        assert s["pid"] == d.proc.pid, s
        assert s["backend"] == "host"
        assert s["socket"] == d.socket
        assert s["config_file"].endswith("ovld.conf")
        # the constant both were built with, as ovlctl reports its own
        ours = d.run([OVLCTL, "version"]).stdout.split("\n")[0]
        assert f"(protocol {s['protocol_version']})" in ours, (ours, s)
        assert s["version"].count(".") == 2
        assert s["uptime_s"] >= 0
        assert s["connections"] == 1  # ovlctl itself
        assert [x["index"] for x in s["devices"]] == [0, 1, 2]
        for dev in s["devices"]:
            assert dev["uuid"].startswith("HOST-") and len(dev["uuid"]) == 41, dev
            assert dev["name"].startswith("host-") and dev["total_memory"] > 0
        assert s["jobs"] == []
        assert len(s["clients"]) == 1 and s["clients"][0]["name"] == "ovlctl"
        assert s["clients"][0]["rank"] == -1
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


def test_garbage_and_oversized_frames():
    d = Daemon()
    try:
        # garbage: bad magic
        s = raw(d)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        reply = read_all(s)
        s.close()
        assert reply[:4] in (b"", b"OVL1"), reply
        # a length prefix of 0xFFFFFFFF
        s = raw(d)
        s.sendall(b"OVL1" + b"\xff\xff\xff\xff")
        reply = read_all(s)
        s.close()
        assert reply.startswith(b"OVL1"), reply          # an Error frame, then closed
        assert b"max_frame_bytes" in reply, reply
        # one byte over the 1 MiB default
        s = raw(d)
        s.sendall(b"OVL1" + (1024 * 1024 + 1).to_bytes(4, "little"))
        reply = read_all(s)
        s.close()
        assert b"max_frame_bytes" in reply, reply
        # a frame that is not a protobuf message
        s = raw(d)
        s.sendall(frame(b"\xff\xff\xff\xff\xff"))
        reply = read_all(s)
        s.close()
        assert b"malformed" in reply, reply
        # a frame cut off half-way, then the client goes away
        s = raw(d)
        s.sendall(b"OVL1" + (100).to_bytes(4, "little") + b"x" * 10)
        s.close()
        # the daemon is alive and answers the next client
        s = status(d)
        assert s["pid"] == d.proc.pid
        log = d.log_text()
        assert "closing the connection" in log, log
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_sigterm_removes_socket():
    d = Daemon()
    try:
        assert os.path.exists(d.socket)
        assert d.stop(signal.SIGTERM) == 0
        assert not os.path.exists(d.socket), "socket left behind"
    finally:
        d.cleanup()


def test_sigint_during_work():
    """SIGINT while clients run ops: in-flight work finishes, exit 0."""
    d = Daemon()
    try:
        demo = subprocess.Popen([DEMO, "-w", "2", "-m", "128", "-n", "128", "-k", "128",
                                 "-i", "20", "-a", "ring"], env=d.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)
        assert d.stop(signal.SIGINT) == 0
        demo.communicate(timeout=60)
        assert not os.path.exists(d.socket)
        assert "stopped" in d.log_text()
    finally:
        d.cleanup()


def test_stale_socket_and_second_daemon():
    d = Daemon()
    try:
        # a second ovld on the same socket refuses to start
        p = subprocess.run([OVLD, "--foreground", "--backend", "host", "--socket", d.socket],
                           capture_output=True, text=True, timeout=10)
        assert p.returncode != 0 and "another daemon" in p.stderr, p
        d.proc.kill()  # leaves a stale socket file behind
        d.proc.wait()
        assert os.path.exists(d.socket)
        d2 = Daemon()
        d2.stop()
        d2.cleanup()
        # a new daemon replaces the stale file
        p = subprocess.Popen([OVLD, "--foreground", "--backend", "host", "--socket", d.socket],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        ok = False
        while time.monotonic() < deadline and not ok:
            r = subprocess.run([OVLCTL, "--socket", d.socket, "version"], capture_output=True)
            ok = r.returncode == 0
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
        assert ok
    finally:
        d.cleanup()


def test_sighup_reload():
    d = Daemon(config="log_level = info\n")
    try:
        cfg = os.path.join(d.dir, "ovld.conf")
        with open(cfg, "w") as f:
            f.write("log_level = debug\nmax_jobs = 7\n")
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while "configuration re-read" not in d.log_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "configuration re-read" in d.log_text()
        with open(cfg, "w") as f:
            f.write("max_jobs = 0\n")
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while "keeping the running configuration" not in d.log_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "ovld.conf:1: max_jobs" in d.log_text(), d.log_text()
        assert status(d)["pid"] == d.proc.pid
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_bad_command_line_and_config():
    p = subprocess.run([OVLD, "--no-such-flag"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 2
    p = subprocess.run([OVLD, "--help"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 0 and "--socket" in p.stdout and "--config" in p.stdout
    p = subprocess.run([OVLD, "--version"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 0 and p.stdout.startswith("ovld ")
    d = Daemon()
    d.stop()
    cfg = os.path.join(d.dir, "bad.conf")
    with open(cfg, "w") as f:
        f.write("# comment\nsokcet = /tmp/x\n")
    p = subprocess.run([OVLD, "--foreground", "--config", cfg], capture_output=True, text=True,
                       timeout=10)
    d.cleanup()
    assert p.returncode == 2 and "bad.conf:2: unknown key 'sokcet'" in p.stderr, p.stderr


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


if __name__ == "__main__":
    run_tests([test_status_json_fields, test_garbage_and_oversized_frames,
               test_sigterm_removes_socket, test_sigint_during_work,
               test_stale_socket_and_second_daemon, test_sighup_reload,
               test_bad_command_line_and_config, test_detaches_when_not_in_foreground])
