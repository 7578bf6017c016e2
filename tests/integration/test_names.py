"""Names that clients choose, on an operator's terminal: client names (a
client's argv[0], sent in Hello) and job ids (sent in CommInit) come from
clients, and `ovlctl status` prints them.

A real ovld cleans client names (invalid bytes and control characters
become '?', at most 63 bytes, cut between characters) and refuses job ids
that are not clean text with OVL_ERR_INVALID. ovlctl escapes whatever it
prints anyway: a fake ovld in this file sends it hostile bytes in every
string, and neither the table nor the JSON may carry them raw; its plans
ignore transb and the Bs asked for, as an older ovld's would, and ovlctl
does not show them as theirs. Run as
root, it also checks the restricted view: another user sees only their
own jobs and clients, and counts of the others.

The requests are encoded here by hand (a few protobuf fields), so that
nothing on the client side gets to clean them first. test_join.c's
test_join_hostile_fields and test_join_bad_job_id refuse ids through
libovl (NUL, bad UTF-8, control characters, lengths); this file adds the
empty id on the wire, overlong and surrogate encodings, the exact Error
frame, the log, and what ovlctl shows. The restricted view's counts are
test_limits.c's test_status_restricted; here it is ovlctl's rendering of
them against a real ovld."""
import json
import os
import re
import socket
import struct
import subprocess
import tempfile
import threading

from ovltest import OVLCTL, Daemon, Skip, f_bytes, f_varint, frame, log_records, run_tests, varint


def _protocol_version():
    """OVL_PROTOCOL_VERSION, read from include/ovl/ovl.h: the one place."""
    root = os.environ.get("OVL_SOURCE_DIR") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..")
    with open(os.path.join(root, "include", "ovl", "ovl.h"), encoding="utf-8") as f:
        m = re.search(r"^#define OVL_PROTOCOL_VERSION ([0-9]+)$", f.read(), re.M)
    assert m, "include/ovl/ovl.h defines no OVL_PROTOCOL_VERSION"
    return int(m.group(1))


PROTOCOL_VERSION = _protocol_version()
OVL_ERR_INVALID = -1
TIMEOUT = 10.0

HOSTILE_NAMES = [
    b"\x1b[31mRED\x1b]0;title\x07",  # colour, then a window title (OSC ... BEL)
    b"\xff\xfe\xc3",                  # not UTF-8, the last one cut short
    "\u00e9".encode() * 40,           # 80 bytes: longer than ovld keeps
]
# what ovld keeps of them (common/text.h, ovl_text_sanitize)
CLEAN_NAMES = ["?[31mRED?]0;title?", "???", "\u00e9" * 31]


# ------------------------------------------------------------- protobuf

def f_double(num, x):
    return varint(num << 3 | 1) + struct.pack("<d", x)


def decode(buf):
    """{field number: [values]}: varints as unsigned ints, length-delimited
    fields as bytes, fixed64/fixed32 as raw bytes."""
    fields, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(buf, i)
        elif wt == 2:
            n, i = read_varint(buf, i)
            assert i + n <= len(buf), "truncated field %d" % num
            v, i = buf[i:i + n], i + n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise AssertionError("wire type %d of field %d" % (wt, num))
        fields.setdefault(num, []).append(v)
    return fields


def read_varint(buf, i):
    v = shift = 0
    while True:
        assert i < len(buf) and shift < 70, "bad varint"
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def signed(v):
    """An int32 field's value from its (64-bit) varint."""
    return v - (1 << 64) if v >= 1 << 63 else v


def hello_request(rid, name):
    h = f_varint(1, PROTOCOL_VERSION) + f_bytes(2, "test_names") + f_varint(3, os.getpid())
    h += f_bytes(4, name)
    return f_varint(1, rid) + f_bytes(2, h)


def comm_init_request(rid, job_id, uuid, world=1, rank=0):
    ci = f_bytes(1, job_id) + f_varint(2, world) + f_varint(3, rank) + f_bytes(4, uuid)
    return f_varint(1, rid) + f_bytes(4, ci)


# --------------------------------------------------------------- frames

def recv_exact(s, n, fds):
    buf = bytearray()
    while len(buf) < n:
        data, anc, _, _ = s.recvmsg(n - len(buf), socket.CMSG_SPACE(16 * 4))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(int.from_bytes(payload[j:j + 4], "little")
                           for j in range(0, len(payload) - len(payload) % 4, 4))
        if not data:
            raise EOFError("the peer closed the connection after %d of %d bytes" % (len(buf), n))
        buf += data
    return bytes(buf)


def recv_frame(s):
    """One frame's body; descriptors that came with it are closed."""
    fds = []
    try:
        head = recv_exact(s, 8, fds)
        assert head[:4] == b"OVL1", "bad magic %r" % head[:4]
        return recv_exact(s, int.from_bytes(head[4:], "little"), fds)
    finally:
        for fd in fds:
            os.close(fd)


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    s.connect(path)
    return s


def call(s, body):
    """Sends one request, returns the Response's fields."""
    s.sendall(frame(body))
    return decode(recv_frame(s))


def hello(d, name):
    """A connection that said Hello as `name`; returns (socket, HelloReply fields)."""
    s = connect(d.socket)
    r = call(s, hello_request(1, name))
    assert 3 in r, "no HelloReply for name %r: %r\n%s" % (name, r, log_tail(d))
    return s, decode(r[3][0])


def log_tail(d):
    """The end of ovld's log, whatever bytes it holds."""
    with open(d.log_path, "rb") as f:
        return f.read()[-3000:].decode("utf-8", errors="replace")


def log_text(d):
    """ovld's log, which must be UTF-8 whatever clients sent."""
    with open(d.log_path, "rb") as f:
        return f.read().decode("utf-8")


# the bidirectional formatting controls, escaped as the other controls
BIDI = {0x061C, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068,
        0x2069}


def term_escape(b):
    """What ovlctl's tables make of bytes b (common/text.h,
    ovl_text_escape_term)."""
    out, i = [], 0
    names = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\x1b": "\\e", "\\": "\\\\"}
    while i < len(b):
        for n in (1, 2, 3, 4):
            try:
                c = b[i:i + n].decode("utf-8", errors="strict")
                break
            except UnicodeDecodeError:
                c = None
        if c is None or len(c) != 1:  # not a whole character: one bad byte
            out.append("\\x%02x" % b[i])
            i += 1
            continue
        i += n
        o = ord(c)
        if c in names:
            out.append(names[c])
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02x" % o)
        elif 0x80 <= o <= 0x9F or o in BIDI:
            out.append("\\u%04x" % o)
        else:
            out.append(c)
    return "".join(out)


def ctl_bytes(d, *args, check=True):
    p = subprocess.run([OVLCTL, *args], env=d.env(), capture_output=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError("ovlctl %s: %d\n%r\n%r" % (" ".join(args), p.returncode, p.stdout,
                                                        p.stderr))
    return p


def assert_terminal_safe(out, what):
    """Bytes fit for a terminal: strict UTF-8 and no control character but
    the line break (no ESC, no BEL, no C1 such as U+009B)."""
    assert b"\x1b" not in out and b"\x07" not in out, "%s holds ESC or BEL: %r" % (what, out)
    try:
        text = out.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        raise AssertionError("%s is not UTF-8 (%s): %r" % (what, e, out)) from None
    bad = [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F or
           ord(c) in BIDI]
    assert not bad, "%s holds control characters %r: %r" % (what, bad, text)
    return text


def status_json_strict(d):
    out = ctl_bytes(d, "status", "--json").stdout
    try:
        text = out.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        raise AssertionError("status --json is not UTF-8 (%s): %r" % (e, out)) from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise AssertionError("status --json is not JSON (%s): %r" % (e, text)) from None


# ------------------------------------------------------- a real ovld

def test_hostile_client_names():
    d = Daemon()
    conns = []
    try:
        for name in HOSTILE_NAMES:
            conns.append(hello(d, name)[0])
        table = assert_terminal_safe(ctl_bytes(d, "status").stdout, "status")
        s = status_json_strict(d)
        # ovld's cleaning: '?' for each control character and each bad
        # byte; cut between characters (31 of the 40 two-byte ones, 62
        # bytes); every client is one of ours, or the asking ovlctl
        names = sorted(c["name"] for c in s["clients"])
        assert names == sorted(CLEAN_NAMES + ["ovlctl"]), names
        assert "\u00e9" * 31 in table and "\u00e9" * 32 not in table, table
        assert "?[31mRED?]0;title?" in table, table
        # nor does ovld's own log carry them raw: it is UTF-8, and its
        # hello lines name the clients as cleaned
        log = log_text(d)
        assert "\x1b" not in log, log[-2000:]
        hello_line = re.compile(r"client \d+: hello from '(.*)' \(pid %d, uid %d, libovl "
                                r"test_names\)" % (os.getpid(), os.getuid()))
        said = [m.group(1) for m in (hello_line.fullmatch(x) for _, x in
                                     log_records(log, d.proc.pid)) if m]
        assert said == CLEAN_NAMES, said
        for c in conns:
            c.close()
        assert d.stop() == 0
    finally:
        for c in conns:
            c.close()
        d.cleanup()


def test_hostile_job_ids():
    d = Daemon()
    conns = []
    try:
        s, hr = hello(d, b"test_names")
        conns.append(s)
        devices = [decode(dev) for dev in hr.get(6, [])]
        assert devices, "the HelloReply names no device: %r" % hr
        uuid = devices[0][2][0]
        assert len(uuid) == 16, uuid
        text = ("job id must be UTF-8 text without control characters (ids are shown to "
                "operators)")
        bad_ids = [(b"nul\x00tail", "job id holds a NUL byte at 3"), (b"esc\x1b[2J", text),
                   (b"\xff\xfe", text), (b"csi\xc2\x9b2J", text),
                   (b"", "job id must be 1 to 63 bytes, not 0"),
                   (b"x" * 64, "job id must be 1 to 63 bytes, not 64"),
                   (b"\xc0\x80", text),      # an overlong NUL
                   (b"\xed\xa0\x80", text),  # a UTF-16 surrogate
                   # bidi controls: a right-to-left override, an isolate, ALM
                   (b"job\xe2\x80\xaegnp.exe", text), (b"\xe2\x81\xa6x", text),
                   (b"a\xd8\x9cb", text)]
        for rid, (job, why) in enumerate(bad_ids, start=2):
            # each on a connection of its own, which the refusal leaves open
            s, _ = hello(d, b"test_names")
            conns.append(s)
            r = call(s, comm_init_request(rid, job, uuid))
            # an Error with the request's id, OVL_ERR_INVALID (an int32: -1
            # goes as a 10-byte varint) and the reason, and nothing else
            want = "cannot join: " + why
            assert r == {1: [rid], 2: [f_varint(1, OVL_ERR_INVALID) + f_bytes(2, want)]}, (
                "job id %r: %r, not %r\n%s" % (job, r, want, log_tail(d)))
            r = call(s, f_varint(1, 100 + rid) + f_bytes(3, b""))  # still serves: a Status
            assert r.get(1) == [100 + rid] and 4 in r, (
                "the connection no longer serves after refusing %r: %r" % (job, r))
        # each refusal logged once, with the client and the reason
        refused = [m.group(1) for m in (re.fullmatch(r"client \d+ \(pid %d, uid %d\): request "
                                                     r"refused: (.*)" % (os.getpid(), os.getuid()),
                                                     x)
                                        for _, x in log_records(log_text(d), d.proc.pid)) if m]
        assert refused == ["cannot join: " + why for _, why in bad_ids], refused
        assert status_json_strict(d)["jobs"] == []
        # a clean non-ASCII id of 63 bytes is a job id like any other
        good = "caf\u00e9-".encode() + b"k" * 57
        assert len(good) == 63
        r = call(conns[0], comm_init_request(50, good, uuid))
        assert 5 in r, "clean job id %r refused: %r\n%s" % (good, r, log_tail(d))
        st = status_json_strict(d)
        assert [j["id"] for j in st["jobs"]] == [good.decode()], st["jobs"]
        table = assert_terminal_safe(ctl_bytes(d, "status").stdout, "status")
        assert good.decode() in table, table
        for c in conns:
            c.close()
        conns = []
        assert d.stop() == 0
    finally:
        for c in conns:
            c.close()
        d.cleanup()


def test_restricted_view():
    """A user other than root and ovld's own sees their own jobs and clients
    and only counts of the others. Needs root, to run ovlctl as nobody."""
    if os.getuid() != 0:
        raise Skip("needs root, to run ovlctl as nobody")
    d = Daemon(config="socket_mode = 0666\n")
    conns = []
    try:
        os.chmod(d.dir, 0o755)
        s, hr = hello(d, b"root-client")
        conns.append(s)
        uuid = decode(hr[6][0])[2][0]
        r = call(s, comm_init_request(2, b"root-job", uuid))
        assert 5 in r, "CommInit refused: %r\n%s" % (r, log_tail(d))
        # root sees everything
        st = status_json_strict(d)
        assert st["restricted"] is False and st["other_jobs"] == 0, st
        assert [j["id"] for j in st["jobs"]] == ["root-job"], st
        assert "other users not shown" not in ctl_bytes(d, "status").stdout.decode()
        # nobody sees its own connection (ovlctl itself) and counts the rest
        nobody = dict(user=65534, group=65534, extra_groups=[])
        p = subprocess.run([OVLCTL, "status", "--json"], env=d.env(), capture_output=True,
                           timeout=60, **nobody)
        assert p.returncode == 0, p
        st = json.loads(p.stdout.decode("utf-8", errors="strict"))
        assert st["restricted"] is True, st
        assert st["jobs"] == [] and st["other_jobs"] == 1, st
        assert [c["uid"] for c in st["clients"]] == [65534], st["clients"]
        assert st["other_clients"] == 1, st
        p = subprocess.run([OVLCTL, "status"], env=d.env(), capture_output=True, timeout=60,
                           **nobody)
        assert p.returncode == 0, p
        table = assert_terminal_safe(p.stdout, "status")
        assert "(1 job and 1 client of other users not shown)" in table, table
        assert "root-job" not in table and "root-client" not in table, table
        for c in conns:
            c.close()
        conns = []
        assert d.stop() == 0
    finally:
        for c in conns:
            c.close()
        d.cleanup()


# ------------------------------------------------------- a hostile ovld

# ends with a right-to-left override (U+202E), which reorders a line
EVIL = b"\x1b[31mX\x1b]0;t\x07\xff\xc2\x9b2J\r\t\\\"\x7f\xed\xa0\x80\xe2\x80\xae"
# what ovlctl's table makes of EVIL (common/text.h)
EVIL_TERM = "\\e[31mX\\e]0;t\\x07\\xff\\u009b2J\\r\\t\\\\\"\\x7f\\xed\\xa0\\x80\\u202e"
# and what JSON gives back once parsed: U+FFFD for each bad byte
EVIL_JSON = "\x1b[31mX\x1b]0;t\x07\ufffd\u009b2J\r\t\\\"\x7f\ufffd\ufffd\ufffd\u202e"
UUID = bytes(range(16))


def evil_device():
    return (f_varint(1, 0) + f_bytes(2, UUID) + f_bytes(3, EVIL) + f_varint(4, 1 << 30) +
            f_varint(5, 2) + f_varint(6, 0))


def evil_response(rid, req):
    """The fake ovld's answer to one request: every string is EVIL."""
    if 2 in req:  # Hello
        hr = (f_varint(1, PROTOCOL_VERSION) + f_bytes(2, EVIL) + f_bytes(3, "host") +
              f_varint(4, 1) + f_varint(5, 7) + f_bytes(6, evil_device()))
        return f_varint(1, rid) + f_bytes(3, hr)
    if 3 in req:  # Status
        job = (f_bytes(1, EVIL) + f_varint(2, 1000) + f_varint(3, 2) + f_varint(4, 1) +
               f_bytes(5, EVIL) + f_varint(6, 5) + f_varint(7, 0) + f_bytes(8, EVIL))
        # a clean two-byte id pads by characters, not bytes
        job2 = f_bytes(1, "\u00e9\u00e9\u00e9") + f_varint(2, 1001) + f_bytes(5, "ready")
        client = (f_varint(1, 9) + f_varint(2, 4242) + f_varint(3, 1000) + f_varint(4, 1000) +
                  f_bytes(5, EVIL) + f_bytes(6, EVIL) + f_varint(7, -1) + f_varint(8, 0) +
                  f_varint(9, 0))
        sr = (f_bytes(1, EVIL) + f_varint(2, 1) + f_double(3, 1.5) + f_bytes(4, EVIL) +
              f_bytes(5, EVIL) + f_bytes(6, EVIL) + f_varint(7, 1) + f_bytes(8, evil_device()) +
              f_bytes(9, job) + f_bytes(9, job2) + f_bytes(10, client) +
              f_varint(11, PROTOCOL_VERSION) + f_varint(12, 1) + f_varint(13, 2) +
              f_varint(14, 3) + f_bytes(17, EVIL))
        return f_varint(1, rid) + f_bytes(4, sr)
    if 11 in req and not decode(req[11][0]).get(1, [0])[0]:  # Stats, without --reset
        op = f_bytes(1, EVIL) + f_bytes(2, EVIL) + f_varint(3, 4) + f_bytes(4, EVIL)
        bucket = f_double(1, 1e-3) + f_varint(2, 4)
        error = f_varint(1, -13) + f_bytes(2, EVIL) + f_varint(3, 1)
        block = (f_double(1, 2.0) + f_bytes(2, op) + f_varint(3, 4) + f_bytes(14, bucket) +
                 f_bytes(19, error))
        return f_varint(1, rid) + f_bytes(10, f_double(1, 2.0) + f_bytes(2, block) +
                                          f_bytes(3, block))
    if 10 in req:  # Plan
        pr = f_bytes(1, "ring") + f_bytes(2, b"plan algo=ring " + EVIL + b"\nSTEP 1\x1b[2J\n")
        return f_varint(1, rid) + f_bytes(8, pr)
    err = f_varint(1, OVL_ERR_INVALID) + f_bytes(2, b"refused: " + EVIL)
    return f_varint(1, rid) + f_bytes(2, err)


class EvilDaemon:
    """A fake ovld on a socket of its own that answers every request with
    EVIL in each string."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ovl-evil-")
        self.socket = os.path.join(self.dir, "ovld.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.socket)
        self.srv.listen(8)
        self.srv.settimeout(0.2)
        self.stopping = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stopping:
            try:
                c, _ = self.srv.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            c.settimeout(TIMEOUT)
            try:
                while True:
                    req = decode(recv_frame(c))
                    c.sendall(frame(evil_response(req.get(1, [0])[0], req)))
            except (EOFError, OSError):
                pass
            finally:
                c.close()

    def env(self):
        return dict(os.environ, OVL_SOCKET=self.socket)

    def log_text(self):
        return ""

    def close(self):
        self.stopping = True
        self.thread.join(5)
        self.srv.close()
        os.unlink(self.socket)
        os.rmdir(self.dir)


def test_ovlctl_escapes_a_hostile_daemon():
    d = EvilDaemon()
    try:
        table = assert_terminal_safe(ctl_bytes(d, "status").stdout, "status")
        assert EVIL_TERM in table, table
        assert "(2 jobs and 3 clients of other users not shown)" in table, table
        lines = table.split("\n")
        # escaped, then padded: the columns after an id stay in place
        head = [ln for ln in lines if ln.startswith("  ID") and "OWNER" in ln][0]
        end = head.index("OWNER") + len("OWNER")
        for job, uid in (("\u00e9\u00e9\u00e9", "1001"),):
            row = [ln for ln in lines if ln.startswith("  " + job)][0]
            assert row[end - 6:end].strip() == uid, (head, row)
            assert row[2:22] == job.ljust(20), row
        s = status_json_strict(d)
        assert s["restricted"] is True and s["other_jobs"] == 2 and s["other_clients"] == 3, s
        for v in (s["version"], s["backend"], s["socket"], s["config_file"],
                  s["devices"][0]["name"], s["jobs"][0]["id"], s["jobs"][0]["state"],
                  s["jobs"][0]["last_error"], s["clients"][0]["name"], s["clients"][0]["job"],
                  s["op_kinds"][0]):
            assert v == EVIL_JSON, (v, EVIL_JSON)
        assert term_escape(EVIL) == EVIL_TERM, (term_escape(EVIL), EVIL_TERM)
        p = ctl_bytes(d, "version")
        out = assert_terminal_safe(p.stdout, "version")
        # libovl keeps 31 bytes of the version, maybe cut inside a character
        assert "ovld " + term_escape(EVIL[:31]) + " (protocol" in out, out
        p = ctl_bytes(d, "plan", "--daemon", "--world", "2", "--rank", "0", "-m", "8", "-n", "8",
                      "-k", "8")
        out = assert_terminal_safe(p.stdout, "plan --daemon")
        assert out == "plan algo=ring " + EVIL_TERM + "\nSTEP 1\\e[2J\n", out
        # a plan that ignored transb and the Bs asked for (as an ovld older
        # than them in the Plan request does) is not shown as theirs
        for opt in (["--transb"], ["--more-n", "4,5"]):
            p = ctl_bytes(d, "plan", "--daemon", *opt, "--world", "2", "--rank", "0", "-m", "8",
                          "-n", "8", "-k", "8", check=False)
            assert (p.returncode, p.stdout, p.stderr) == (
                1, b"", b"ovlctl: plan: ovld ignored --transb or --more-n (it is older than "
                b"ovlctl); plan here, without --daemon\n"), (opt, p)
        # stats: the table, JSON, and Prometheus label values (which know
        # only the escapes \\, \" and \n)
        out = assert_terminal_safe(ctl_bytes(d, "stats").stdout, "stats")
        assert EVIL_TERM in out, out
        st = json.loads(ctl_bytes(d, "stats", "--json").stdout.decode("utf-8", errors="strict"))
        op, e = st["total"]["ops"][0], st["total"]["errors"][0]
        assert op["kind"] == op["algo"] == op["dtype"] == e["name"] == EVIL_JSON, st["total"]
        out = assert_terminal_safe(ctl_bytes(d, "stats", "--prometheus").stdout, "prometheus")
        label = r'"(?:[^"\\\n]|\\[\\"n])*"'
        lines = [ln for ln in out.split("\n")
                 if ln.startswith(("ovl_ops_total{", "ovl_errors_total{"))]
        assert len(lines) == 2, out
        for ln in lines:
            assert re.fullmatch(r'ovl_\w+\{(\w+=%s,?)+\} \d+' % label, ln), ln
        prom = EVIL_TERM.replace("\\", "\\\\").replace('"', '\\"')
        assert 'algo="%s"' % prom in out and 'name="%s"' % prom in out, out
        assert 'kind="%s"' % prom in out, out
        # an error from ovld, on stderr
        p = ctl_bytes(d, "stats", "--reset", check=False)
        assert p.returncode == 1, p
        err = assert_terminal_safe(p.stderr, "stats' error")
        assert "refused: " + EVIL_TERM in err, err
    finally:
        d.close()


if __name__ == "__main__":
    run_tests([test_hostile_client_names, test_hostile_job_ids, test_restricted_view,
               test_ovlctl_escapes_a_hostile_daemon])
