"""The links between the ovld of different nodes (daemon/net/peer.c,
docs/multinode.md), with several ovld (host backend) on this machine, each
with peer_listen on 127.0.0.1 at a free port, UCX_TLS=tcp,self and
peer_timeout_ms 1000: `ovlctl peer ping` both ways, the peers in `ovlctl
status` (table and JSON) and the counters in `ovlctl stats`; a node with
another cluster key refused on both sides with nothing left open; a peer
killed seen down within peer_timeout_ms + 1 s, and one stopped (SIGSTOP) on
heartbeats alone, both linked again afterwards; garbage and silence on the
listening port refused without disturbing the daemon; key files ovld
refuses to start with; no port at all without peer_listen; ping refused
to other users."""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

from ovltest import (OVLCTL, OVLD, Daemon, free_port, log_excerpt, log_messages, run_tests,
                     status_json)

TIMEOUT_MS = 1000
ENV = {"UCX_TLS": "tcp,self"}
KEY = "c2VjcmV0LWNsdXN0ZXIta2V5LW9mLTMyLWJ5dGVzLW9yLW1vcmU=\n"
OTHER_KEY = "YW5vdGhlci1jbHVzdGVyLWtleS1vZi0zMi1ieXRlcy1vci1tb3Jl\n"


class Node:
    """An ovld with links to other nodes: its key file, port and Daemon."""

    def __init__(self, key=KEY, extra="", port=None, timeout_ms=TIMEOUT_MS):
        self.keydir = tempfile.mkdtemp(prefix="ovl-test-key-")
        self.key = os.path.join(self.keydir, "cluster.key")
        with open(self.key, "w") as f:
            f.write(key)
        os.chmod(self.key, 0o600)
        self.port = port or free_port()
        self.addr = "127.0.0.1:%d" % self.port
        self.d = Daemon(config="peer_listen = %s\npeer_key_file = %s\npeer_timeout_ms = %d\n"
                        "socket_mode = 0666\n%s" % (self.addr, self.key, timeout_ms, extra),
                        env=ENV)

    def ctl(self, *args, check=True, timeout=30, **kw):
        p = subprocess.run([OVLCTL, *args], env=self.d.env(), capture_output=True, text=True,
                           timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise AssertionError("ovlctl %s exited %d\nstdout:\n%s\nstderr:\n%s\novld log:\n%s" % (
                " ".join(args), p.returncode, p.stdout, p.stderr, log_excerpt(self.d)))
        return p

    def status(self):
        return status_json(self.d)

    def peer(self, addr):
        """addr's row in status --json, or None."""
        rows = [p for p in self.status()["peers"] if p["address"] == addr]
        assert len(rows) <= 1, rows
        return rows[0] if rows else None

    def log(self):
        return self.d.log_text()

    def cleanup(self):
        self.d.cleanup()
        for name in os.listdir(self.keydir):
            os.unlink(os.path.join(self.keydir, name))
        os.rmdir(self.keydir)


def tcp_sockets(pid):
    """(state, local port, remote port) of every TCP socket of process pid,
    from /proc/net/tcp{,6} and the process's descriptors."""
    inodes = set()
    fddir = "/proc/%d/fd" % pid
    for fd in os.listdir(fddir):
        try:
            t = os.readlink(os.path.join(fddir, fd))
        except OSError:
            continue
        m = re.fullmatch(r"socket:\[(\d+)\]", t)
        if m:
            inodes.add(m.group(1))
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if f[9] in inodes:
                out.append((int(f[3], 16), int(f[1].split(":")[1], 16),
                            int(f[2].split(":")[1], 16)))
    return out


LISTEN, ESTABLISHED = 0x0A, 0x01
PING_OUT = re.compile(r"^(\S+): round trip (\d+\.\d{3}) ms \(instance ([0-9a-f]{32})\)$")


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, "%s: not within %.1f s" % (what, timeout)
        time.sleep(0.05)


def test_no_port_without_peer_listen():
    """An ovld without peer_listen opens no TCP socket at all (UCX is not
    even initialized); with it, it listens on exactly peer_listen (and
    UCX's own ports, once UCX runs)."""
    d = Daemon(config="host_devices = 2\n", env=ENV)
    try:
        assert tcp_sockets(d.proc.pid) == [], tcp_sockets(d.proc.pid)
        s = status_json(d)
        assert s["peer_self"] == "" and s["peers"] == [], s
        assert "PEERS" not in d.run([OVLCTL, "status"]).stdout
        p = d.run([OVLCTL, "peer", "ping", "127.0.0.1:1"], check=False)
        assert p.returncode == 1 and "peer_listen is not set" in p.stderr, p.stderr
        assert tcp_sockets(d.proc.pid) == []
        assert d.stop() == 0
    finally:
        d.cleanup()
    n = Node()
    try:
        listening = [s for s in tcp_sockets(n.d.proc.pid) if s[0] == LISTEN]
        assert (LISTEN, n.port, 0) in listening, listening
        assert n.d.stop() == 0
    finally:
        n.cleanup()


def test_ping_status_stats():
    a, b = Node(), Node()
    try:
        # each way; the second finds the session the first made
        for x, y in ((a, b), (b, a)):
            out = x.ctl("peer", "ping", y.addr).stdout
            m = PING_OUT.match(out.strip())
            assert m and m.group(1) == y.addr and float(m.group(2)) > 0, out
        j = json.loads(a.ctl("peer", "ping", "--json", b.addr).stdout)
        assert j["address"] == b.addr and j["rtt_s"] > 0 and re.fullmatch(r"[0-9a-f]{32}",
                                                                          j["instance"]), j
        # status --json: the other is up with a round trip, on both sides
        for x, y in ((a, b), (b, a)):
            s = x.status()
            assert s["peer_self"] == x.addr, s
            row = x.peer(y.addr)
            assert row and row["state"] == "up" and row["rtt_s"] > 0, s["peers"]
            assert row["msgs_in"] > 0 and row["msgs_out"] > 0 and row["bytes_in"] > 0, row
            assert row["errors"] == 0 and row["last_error"] == "", row
            assert set(row) == {"address", "state", "rtt_s", "msgs_in", "msgs_out", "bytes_in",
                                "bytes_out", "errors", "last_error"}, row
        # the table
        table = a.ctl("status").stdout
        sec = table[table.index("\nPEERS (1), this node: %s\n" % a.addr):]
        assert re.search(r"^  ADDRESS +STATE +ROUND TRIP +MSGS IN +MSGS OUT +ERRORS +LAST ERROR$",
                         sec, re.M), table
        assert re.search(r"^  %s +up +\d+\.\d{3} ms +\d+ +\d+ +0  -$" % re.escape(b.addr), sec,
                         re.M), table
        # heartbeats keep them up and counting
        before = json.loads(a.ctl("stats", "--json").stdout)["total"]
        time.sleep(TIMEOUT_MS / 1000 * 1.5)
        after = json.loads(a.ctl("stats", "--json").stdout)["total"]
        assert after["peer_msgs_out"] >= before["peer_msgs_out"] + 4, (before, after)
        assert after["peer_msgs_in"] >= before["peer_msgs_in"] + 4, (before, after)
        assert after["peer_bytes_out"] > before["peer_bytes_out"]
        assert after["peer_errors"] == after["peer_auth_refused"] == after["peer_dropped"] == 0
        # links but no job: no rows moved (test_multinode.py moves some)
        xfer = {k: v for k, v in after.items() if k.startswith("xfer_")}
        assert len(xfer) == 6 and not any(xfer.values()), after
        assert a.peer(b.addr)["state"] == "up"
        text = a.ctl("stats").stdout
        assert re.search(r"^  peer_msgs_in +\d+ +\d+$", text, re.M), text
        assert re.search(r"^  xfer_sends +0 +0$", text, re.M), text
        prom = a.ctl("stats", "--prometheus").stdout
        m = re.search(r"^ovl_peer_messages_sent_total (\d+)$", prom, re.M)
        assert m and int(m.group(1)) > 0, prom
        assert re.search(r"^ovl_peer_auth_refused_total 0$", prom, re.M), prom
        # this ovld itself, the wildcard, a name: refused with words
        for addr, words in ((a.addr, "own address"), ("0.0.0.0:7411", "wildcard"),
                            ("localhost:7411", "names are not looked up"),
                            ("127.0.0.1", "expected IPV4:PORT or [IPV6]:PORT")):
            p = a.ctl("peer", "ping", addr, check=False)
            assert p.returncode == 1 and words in p.stderr, (addr, p.stderr)
        # unreachable: nothing listens there
        nobody = "127.0.0.1:%d" % free_port()
        p = a.ctl("peer", "ping", nobody, check=False)
        assert p.returncode == 1, p
        assert p.stderr.startswith("ovlctl: peer ping: %s: unreachable: cannot connect" % nobody), \
            p.stderr
        assert a.peer(nobody)["state"] == "down"
        assert a.d.stop() == 0 and b.d.stop() == 0
        for n in (a, b):  # one line each way about the other
            assert "peer %s: up (instance " % (b.addr if n is a else a.addr) in n.log()
    finally:
        a.cleanup()
        b.cleanup()


def test_wrong_key():
    a, c = Node(), Node(key=OTHER_KEY)
    try:
        p = a.ctl("peer", "ping", c.addr, check=False)
        assert p.returncode == 1, p
        assert re.fullmatch(r"ovlctl: peer ping: %s: authentication refused: wrong cluster key: .*"
                            r"peer_key_file.*\n" % re.escape(c.addr), p.stderr), p.stderr
        # both sides say so, once, naming the other
        time.sleep(0.3)
        # (log_messages also checks that every line is ovld's: none of UCX's own)
        la = [m for m in log_messages(a.d, "warn") if "authentication refused" in m]
        lc = [m for m in log_messages(c.d, "warn") if "authentication refused" in m]
        assert len(la) == 1 and la[0].startswith(
            "peer %s: authentication refused: wrong cluster key" % c.addr), la
        assert len(lc) == 1 and re.match(
            r"peer connection from 127\.0\.0\.1:\d+ \(claims to be %s\): authentication refused:"
            r" the other side refused: wrong cluster key" % re.escape(a.addr), lc[0]), lc
        # and the other way round
        p = c.ctl("peer", "ping", a.addr, check=False)
        assert p.returncode == 1 and "wrong cluster key" in p.stderr, p.stderr
        # nothing up, nothing half-open: no connection between them remains
        assert a.peer(c.addr)["state"] == "down" and "wrong cluster key" in \
            a.peer(c.addr)["last_error"]
        assert c.peer(a.addr)["state"] == "down"

        def no_links():
            for n, other in ((a, c), (c, a)):
                for st, lport, rport in tcp_sockets(n.d.proc.pid):
                    if st == ESTABLISHED and other.port in (lport, rport):
                        return False
            return True

        wait_for(no_links, 3, "the refused connections closed")
        for n in (a, c):
            st = json.loads(n.ctl("stats", "--json").stdout)["total"]
            assert st["peer_auth_refused"] == 2, st  # one per ping, on each side
        assert a.d.stop() == 0 and c.d.stop() == 0
    finally:
        a.cleanup()
        c.cleanup()


def test_peer_killed():
    """A peer killed (SIGKILL) is down within peer_timeout_ms + 1 s; when it
    comes back on its port, as a new instance, the next ping reaches it."""
    a, b = Node(), Node()
    b2 = None
    try:
        first = PING_OUT.match(a.ctl("peer", "ping", b.addr).stdout.strip()).group(3)
        assert a.peer(b.addr)["state"] == "up"
        b.d.proc.send_signal(signal.SIGKILL)
        b.d.proc.wait()
        t0 = time.monotonic()
        wait_for(lambda: a.peer(b.addr)["state"] == "down", TIMEOUT_MS / 1000 + 1,
                 "the killed peer seen down")
        took = time.monotonic() - t0
        row = a.peer(b.addr)
        assert row["last_error"] and row["errors"] >= 1, row
        assert re.search(r"peer %s: down: " % re.escape(b.addr), a.log()), log_excerpt(a.d)
        print("  killed peer down after %.2f s: %s" % (took, row["last_error"]))
        # and it answers a ping with why
        p = a.ctl("peer", "ping", b.addr, check=False)
        assert p.returncode == 1 and "unreachable" in p.stderr, p.stderr
        # back, a new instance on the same port: a new episode
        b2 = Node(port=b.port)
        second = PING_OUT.match(a.ctl("peer", "ping", b.addr).stdout.strip()).group(3)
        assert second != first
        assert a.peer(b.addr)["state"] == "up"
        assert a.d.stop() == 0 and b2.d.stop() == 0
    finally:
        a.cleanup()
        b.cleanup()
        if b2:
            b2.cleanup()


def test_peer_silent():
    """A peer that stops answering (SIGSTOP: its connections stay open) is
    down on heartbeats alone, within peer_timeout_ms + 1 s; once it runs
    again, it sees the same, and a ping links them again."""
    a, b = Node(), Node()
    try:
        a.ctl("peer", "ping", b.addr)
        os.kill(b.d.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            wait_for(lambda: a.peer(b.addr)["state"] == "down", TIMEOUT_MS / 1000 + 1,
                     "the silent peer seen down")
            took = time.monotonic() - t0
            row = a.peer(b.addr)
            assert re.match(r"timeout: not heard from for \d+ ms \(peer_timeout_ms %d\)$"
                            % TIMEOUT_MS, row["last_error"]), row
            assert took > TIMEOUT_MS / 1000 * 0.5, took
        finally:
            os.kill(b.d.proc.pid, signal.SIGCONT)
        wait_for(lambda: b.peer(a.addr)["state"] == "down", TIMEOUT_MS / 1000 + 1,
                 "the other side's down")
        a.ctl("peer", "ping", b.addr)
        b.ctl("peer", "ping", a.addr)
        assert a.peer(b.addr)["state"] == "up" and b.peer(a.addr)["state"] == "up"
        assert a.d.stop() == 0 and b.d.stop() == 0
    finally:
        a.cleanup()
        b.cleanup()


def test_garbage_on_the_port():
    """Raw TCP to peer_listen: garbage, an HTTP request, a huge frame
    header, zeros, a connection that says nothing: each refused and closed,
    said in the log and counted; ovld answers on, and its peer still
    pings."""
    a, b = Node(), Node()
    try:
        a.ctl("peer", "ping", b.addr)
        payloads = [os.urandom(4096), b"GET / HTTP/1.0\r\n\r\n", b"\0" * 100000,
                    b"\x01\x00\x00\x00\xff\xff\xff\xff", b"\x05\x00\x00\x00\x00\x00\x00\x00",
                    b"\x01\x00\x00\x00\x10\x00\x00\x00" + os.urandom(16)]
        for data in payloads:
            s = socket.create_connection(("127.0.0.1", a.port), timeout=5)
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                # ovld closes it (after its Refuse, for the frames it could read)
                s.settimeout(5)
                while s.recv(4096):
                    pass
            except (ConnectionResetError, BrokenPipeError):
                pass  # closed before it read it all
            except OSError as e:
                assert e.errno == 107, e  # ENOTCONN: closed already
            finally:
                s.close()
        # silence: closed after peer_timeout_ms
        s = socket.create_connection(("127.0.0.1", a.port), timeout=5)
        t0 = time.monotonic()
        s.settimeout(TIMEOUT_MS / 1000 + 3)
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass
        took = time.monotonic() - t0
        s.close()
        assert TIMEOUT_MS / 1000 - 0.2 < took < TIMEOUT_MS / 1000 + 1.5, took
        # still serving, still linked
        assert a.status()["pid"] == a.d.proc.pid
        a.ctl("peer", "ping", b.addr)
        assert a.peer(b.addr)["state"] == "up"
        refused = [m for m in log_messages(a.d, "warn")
                   if re.match(r"peer connection from 127\.0\.0\.1:\d+: authentication refused: ", m)]
        assert len(refused) == len(payloads) + 1, "\n".join(refused)
        assert any("timeout: not authenticated within %d ms" % TIMEOUT_MS in ln for ln in refused)
        assert any("protocol error" in ln for ln in refused)
        st = json.loads(a.ctl("stats", "--json").stdout)["total"]
        assert st["peer_auth_refused"] == len(payloads) + 1, st
        assert "event loop has not turned" not in a.log()
        assert a.d.stop() == 0 and b.d.stop() == 0
    finally:
        a.cleanup()
        b.cleanup()


def test_half_open_flood():
    """Half-open connections to peer_listen (no key, nothing said): 70 from
    127.0.0.2 and 8 from each of 127.0.0.3..127.0.0.10, held open for the
    whole handshake deadline. A node holding the key, linking from
    127.0.0.1 meanwhile, still gets in: one address holds at most
    OVLD_PEERS_MAX_UNAUTH_SOURCE handshakes (the rest refused at once,
    named in the log), and with OVLD_PEERS_MAX_UNAUTH of them running the
    newcomer evicts the oldest of the address holding the most."""
    a = Node(timeout_ms=20000)
    b = Node()
    flood = []
    try:
        def connect_from(src):
            s = socket.socket()
            s.bind((src, 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", a.port))
            flood.append(s)

        for _ in range(70):
            connect_from("127.0.0.2")
        for i in range(3, 11):
            for _ in range(8):
                connect_from("127.0.0.%d" % i)
        wait_for(lambda: sum(1 for st, lp, _ in tcp_sockets(a.d.proc.pid)
                             if st == ESTABLISHED and lp == a.port) >= 64,
                 10, "64 handshakes running")
        # b holds the key: it links to a, and a to b, through the flood
        b.ctl("peer", "ping", a.addr)
        assert b.peer(a.addr)["state"] == "up"
        a.ctl("peer", "ping", b.addr)
        wait_for(lambda: sum(1 for m in log_messages(a.d, "warn")
                             if "(OVLD_PEERS_MAX_UNAUTH_SOURCE)" in m) >= 62,
                 10, "62 connections from 127.0.0.2 refused")
        warns = log_messages(a.d, "warn")
        refused = [m for m in warns if "(OVLD_PEERS_MAX_UNAUTH_SOURCE)" in m]
        assert all(m.startswith("peer connection from 127.0.0.2:") for m in refused), refused
        assert any("evicted: 64 connections were authenticating (OVLD_PEERS_MAX_UNAUTH)" in m
                   for m in warns), "\n".join(warns)
        assert a.status()["pid"] == a.d.proc.pid
        assert a.d.stop() == 0 and b.d.stop() == 0
    finally:
        for s in flood:
            s.close()
        a.cleanup()
        b.cleanup()


def start_fails(cfg_text):
    """Runs ovld with cfg_text in the foreground; it must exit nonzero
    within 10 s. Returns its output."""
    with tempfile.TemporaryDirectory(prefix="ovl-test-") as d:
        cfg = os.path.join(d, "ovld.conf")
        with open(cfg, "w") as f:
            f.write(cfg_text.replace("DIR", d))
        keydir = os.path.join(d, "k")
        os.mkdir(keydir)
        p = subprocess.run([OVLD, "--foreground", "--backend", "host", "--socket",
                            os.path.join(d, "ovld.sock"), "--config", cfg],
                           capture_output=True, text=True, timeout=10,
                           env=dict(os.environ, **ENV), cwd=d,
                           preexec_fn=None)
        assert p.returncode != 0, (p.returncode, p.stdout, p.stderr)
        assert not os.path.exists(os.path.join(d, "ovld.sock")), "the socket was left"
        return p.stdout + p.stderr


def test_key_file_refusals():
    """ovld does not start with a key file others may read, a short key,
    or none; the message says what it found and what is needed."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ovl-test-key-") as kd:
        key = os.path.join(kd, "cluster.key")
        with open(key, "w") as f:
            f.write(KEY)
        base = "peer_listen = 127.0.0.1:%d\npeer_key_file = %s\n" % (port, key)
        for mode in (0o644, 0o640, 0o604):
            os.chmod(key, mode)
            out = start_fails(base)
            assert ("peer_key_file %s has mode %04o: group and others must have no access "
                    "(0600 or stricter: chmod 600 %s)" % (key, mode, key)) in out, out
        os.chmod(key, 0o600)
        with open(key, "w") as f:
            f.write("too short\n")
        out = start_fails(base)
        assert "holds 9 bytes of key (trailing whitespace trimmed); a key is 32 to 4096 bytes" \
            in out, out
        os.unlink(key)
        out = start_fails(base)
        assert "peer_key_file %s: No such file or directory" % key in out, out
        # the port in use
        with open(key, "w") as f:
            f.write(KEY)
        os.chmod(key, 0o600)
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen(1)
        try:
            out = start_fails(base)
            assert "cannot listen for peers on 127.0.0.1:%d (peer_listen): address already in use" \
                % port in out, out
        finally:
            s.close()


def test_ping_other_user():
    """Root and ovld's own user may ping peers; another may not."""
    if os.getuid() != 0:
        print("  SKIP: it needs root to run ovlctl as another user")
        return
    a = Node()
    try:
        os.chmod(a.d.dir, 0o755)

        def as_nobody():
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)

        p = a.ctl("peer", "ping", "127.0.0.1:1", check=False, preexec_fn=as_nobody, cwd="/")
        assert p.returncode == 1, p
        assert "only root or ovld's own user (uid 0) may ping peers" in p.stderr, p.stderr
        # status is anyone's, peers included
        p = a.ctl("status", "--json", preexec_fn=as_nobody, cwd="/")
        assert json.loads(p.stdout)["peer_self"] == a.addr
        assert a.d.stop() == 0
    finally:
        a.cleanup()


if __name__ == "__main__":
    run_tests([test_no_port_without_peer_listen, test_ping_status_stats, test_wrong_key,
               test_peer_killed, test_peer_silent, test_garbage_on_the_port, test_half_open_flood,
               test_key_file_refusals,
               test_ping_other_user])
