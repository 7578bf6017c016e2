"""`ovlctl status` and `ovlctl stats` against a real ovld: the human tables
(compared with golden files once their volatile parts are normalized), the
JSON fields and their types, the Prometheus text format (checked by a small
parser of exposition format 0.0.4, and by promtool where installed), exact
counters after ovl-demo workloads of known size, --reset (allowed to root,
refused to another user), --watch and usage errors.

OVL_UPDATE_GOLDEN=1 rewrites tests/golden/ovlctl_status.txt and
ovlctl_stats.txt (or those in $OVL_GOLDEN_DIR) instead of comparing.

What ovl-demo does, from client/ovl_demo.c: W rank processes, one
connection each; a rank allocates a, b and c with ovl_host_alloc (and a_out
with --a-out), so 3 (or 4) registrations per rank; per algorithm one untimed
warm-up op, then -i ops: 3 * (iters + 1) ops with -a all, iters + 1 with one
algorithm. A rank joins on device rank % host_devices."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time

from ovltest import DEMO, OVLCTL, Daemon, run_tests

GOLDEN = os.environ.get("OVL_GOLDEN_DIR", os.path.join(os.path.dirname(__file__), "..", "golden"))
UPDATE = os.environ.get("OVL_UPDATE_GOLDEN") == "1"

DTYPE_SIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
ALGOS = ("naive", "collective", "ring")
KINDS = ("ag_gemm", "gemm_rs")


# ------------------------------------------------------------------ helpers

def ctl(d, *args, check=True, timeout=30, **kw):
    """Runs ovlctl against d (or no daemon: d None); returns CompletedProcess."""
    env = d.env() if d else dict(os.environ)
    p = subprocess.run([OVLCTL, *args], env=env, capture_output=True, text=True,
                       timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError("ovlctl %s exited %d\nstdout:\n%s\nstderr:\n%s%s" % (
            " ".join(args), p.returncode, p.stdout, p.stderr,
            ("\novld log:\n" + d.log_text()[-4000:]) if d else ""))
    return p


def stats_json(d, *extra):
    return json.loads(ctl(d, "stats", "--json", *extra).stdout)


def status_json(d):
    return json.loads(ctl(d, "status", "--json").stdout)


class Demo:
    """One ovl-demo run of a known shape, with what it should add to the
    daemon's counters."""

    def __init__(self, world, algo="ring", iters=1, dtype="fp32", m=16, n=16, k=16,
                 a_out=False, job=None):
        self.world, self.algo, self.iters, self.dtype = world, algo, iters, dtype
        self.m, self.n, self.k, self.a_out, self.job = m, n, k, a_out, job
        self.proc = None

    def argv(self):
        a = [DEMO, "-w", str(self.world), "-a", self.algo, "-i", str(self.iters), "-d",
             self.dtype, "-m", str(self.m), "-n", str(self.n), "-k", str(self.k), "--seed", "7"]
        if self.a_out:
            a.append("--a-out")
        if self.job:
            a += ["--job", self.job]
        return a

    def algos(self):
        return ALGOS if self.algo == "all" else (self.algo,)

    def ops(self):
        """{(algo, dtype): ops} this run adds."""
        return {("ag_gemm", a, self.dtype): self.iters + 1 for a in self.algos()}

    def nops(self):
        return sum(self.ops().values())

    def flops(self):
        # daemon/util/stats.c: 2 * (world*m) * n * k per op on every rank
        rows = self.world * self.m
        return self.nops() * 2 * rows * self.n * self.k * self.world

    def comm_bytes(self):
        # core/kind_ag_gemm.c: the gathered A, (world*m) * k * dtype size per
        # op on every rank
        rows = self.world * self.m
        return self.nops() * rows * self.k * DTYPE_SIZE[self.dtype] * self.world

    def registrations(self):
        return self.world * (4 if self.a_out else 3)

    def start(self, d):
        self.proc = subprocess.Popen(self.argv(), env=d.env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        return self

    def wait(self, d, expect_rc=0, timeout=60):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("%s did not finish within %d s" % (" ".join(self.argv()), timeout))
        if expect_rc is not None and self.proc.returncode != expect_rc:
            raise AssertionError("%s exited %d, not %d\n%s%s\novld log:\n%s" % (
                " ".join(self.argv()), self.proc.returncode, expect_rc, out, err,
                d.log_text()[-4000:]))
        return out + err

    def run(self, d, expect_rc=0):
        self.start(d)
        return self.wait(d, expect_rc)

    def kill(self):
        """SIGTERM to the demo and its ranks (its own process group)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the demo still lives: the group is ours
            self.proc.communicate()


def expected(demos):
    ops, total = {}, dict(ops_done=0, flops=0, comm_bytes=0, registrations=0, ranks=0)
    for x in demos:
        for key, n in x.ops().items():
            ops[key] = ops.get(key, 0) + n
        total["ops_done"] += x.nops()
        total["flops"] += x.flops()
        total["comm_bytes"] += x.comm_bytes()
        total["registrations"] += x.registrations()
        total["ranks"] += x.world
    return ops, total


def wait_for_job(d, job, world, timeout=30, demo=None):
    """Polls status --json until job is ready with every rank joined, holding
    its 3 buffers, and past its first op (so that scratch is allocated)."""
    deadline = time.monotonic() + timeout
    s = None
    while time.monotonic() < deadline:
        if demo is not None and demo.proc.poll() is not None:
            raise AssertionError("ovl-demo ended before the job was seen:\n" + demo.wait(d, None))
        s = status_json(d)
        jobs = [j for j in s["jobs"] if j["id"] == job]
        ranks = sorted(c["rank"] for c in s["clients"] if c["job"] == job and c["buffers"] == 3)
        if (jobs and jobs[0]["state"] == "ready" and jobs[0]["local_ranks"] == world and
                jobs[0]["ops_done"] > 0 and ranks == list(range(world))):
            return s
        time.sleep(0.02)
    raise AssertionError("job %r never showed all %d ranks ready; last status: %s" % (
        job, world, s))


def compare_golden(name, text):
    path = os.path.join(GOLDEN, name)
    if UPDATE:
        with open(path, "w") as f:
            f.write(text)
        print("  wrote %s" % path)
        return
    with open(path) as f:
        want = f.read()
    if text != want:
        import difflib
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                            "golden/" + name, "actual"))
        raise AssertionError("output differs from golden/%s (OVL_UPDATE_GOLDEN=1 rewrites it):\n%s"
                             % (name, diff))


def justify(old, placeholder):
    """placeholder in the width of old, right-aligned if old was."""
    w = len(old)
    return placeholder.rjust(w) if old.startswith(" ") else placeholder.ljust(w)


def put(line, m, group, placeholder):
    """line with match m's group replaced by placeholder in the group's width,
    so that columns stay where ovlctl put them."""
    s, e = m.span(group)
    return line[:s] + justify(line[s:e], placeholder) + line[e:]


def put_all(line, m, groups):
    for g, ph in sorted(groups.items(), key=lambda gp: -m.start(gp[0])):
        line = put(line, m, g, ph)
    return line


# ovlctl.c print_status_table: rows are "  " + fields of these widths joined
# by "  " (0: the rest of the line)
DEV_COLS = (5, 41, 16, 10, 7, 10, 0)
JOB_COLS = (20, 6, 5, 5, 16, 8, 10, 9, 0)
CLIENT_COLS = (4, 8, 6, 16, 20, 4, 7, 10)


def put_cols(line, widths, fields):
    """Replaces fields {index: placeholder} of a fixed-width row; a row that
    does not fit the widths (a value too wide) is left as it is."""
    spans, pos = [], 2
    for w in widths:
        end = pos + w if w else len(line)
        if end > len(line) or line[end:end + 2].strip():
            return line
        spans.append((pos, end))
        pos = end + 2
    if not line.startswith("  ") or (widths[-1] and spans[-1][1] != len(line)):
        return line
    for i in sorted(fields, reverse=True):
        s, e = spans[i]
        line = line[:s] + justify(line[s:e], fields[i]) + line[e:]
    return line


RE_HEAD = re.compile(r"^ovld (\S+) \(protocol \d+\), pid (\d+), up ([0-9.]+) s$")


def normalize_status(text, d):
    """Volatile parts of the status table become placeholders: version, pids,
    uptime, the temporary directory, host memory size, uids, client ids, ops
    done and in flight. Client rows are sorted: ovld lists its connections
    newest first, and the ranks connect in either order."""
    out, section, clients = [], None, []
    for line in text.replace(d.dir, "<DIR>").split("\n"):
        m = RE_HEAD.match(line)
        if m:
            line = put_all(line, m, {1: "<VERSION>", 2: "<PID>", 3: "<UPTIME>"})
        elif line.startswith(("DEVICES", "JOBS", "CLIENTS")):
            section = line.split()[0]
        elif line == "":
            out += sorted(clients)
            clients = []
        elif line.startswith("  ID ") or line.startswith("  INDEX "):
            pass
        elif section == "DEVICES":
            line = put_cols(line, DEV_COLS, {3: "<MEM>"})
        elif section == "JOBS":
            line = put_cols(line, JOB_COLS, {1: "<UID>", 6: "<N>", 7: "<N>"})
        elif section == "CLIENTS":
            clients.append(put_cols(line, CLIENT_COLS, {0: "<ID>", 1: "<PID>", 2: "<UID>"}))
            continue
        out.append(line)
    return "\n".join(out + sorted(clients))


RE_STATS_HEAD = re.compile(r"^ovld up ([0-9.]+) s, heap in use ([0-9.]+) MiB")
RE_STATS_ROW = re.compile(r"^  (.{24}) (.{18}) (.{18})$")  # "  %-24s %18s %18s"
# the table names a time it shows in milliseconds _ms (the JSON's key is _s)
TIMING_ROWS = ("seconds", "busy_s", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms",
               "latency_max_ms", "issue_s", "issue_p50_ms", "issue_p99_ms", "issue_max_ms",
               "tflops (per busy s)")


def normalize_stats(text):
    """Timings (uptime, seconds, busy, latencies, tflops) become placeholders;
    every count stays exact."""
    out = []
    for line in text.split("\n"):
        m = RE_STATS_HEAD.match(line)
        if m:
            line = put_all(line, m, {1: "<UPTIME>", 2: "<HEAP>"})
        m = RE_STATS_ROW.match(line)
        if m and m.group(1).strip() in TIMING_ROWS:
            ph = "<MS> ms" if m.group(2).endswith(" ms") else "<S>"
            if m.group(1).startswith("tflops"):
                ph = "<TFLOPS>"
            line = put_all(line, m, {2: ph, 3: ph})
        out.append(line)
    return "\n".join(out)


# ------------------------------------------------------------- Prometheus

METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def parse_value(s):
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", s):
        raise AssertionError("bad sample value %r" % s)
    return float(s)


def parse_labels(s, pos, line):
    """Parses {k="v",...} starting at s[pos] == '{'; returns (dict, end)."""
    labels = {}
    pos += 1
    while True:
        if s[pos] == "}":
            return labels, pos + 1
        m = LABEL.match(s, pos)
        assert m, "bad label name at %d in %r" % (pos, line)
        name = m.group()
        assert not name.startswith("__"), "reserved label %r in %r" % (name, line)
        pos = m.end()
        assert s[pos:pos + 2] == '="', "expected =\" after %s in %r" % (name, line)
        pos += 2
        val = []
        while s[pos] != '"':
            if s[pos] == "\\":
                esc = s[pos + 1]
                assert esc in '\\"n', "bad escape \\%s in %r" % (esc, line)
                val.append("\n" if esc == "n" else esc)
                pos += 2
            else:
                assert s[pos] != "\n"
                val.append(s[pos])
                pos += 1
        pos += 1
        assert name not in labels, "label %s twice in %r" % (name, line)
        labels[name] = "".join(val)
        if s[pos] == ",":
            pos += 1
        else:
            assert s[pos] == "}", "expected , or } in %r" % line


def family_of(name, types):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and types.get(name[:-len(suffix)]) in ("histogram", "summary"):
            return name[:-len(suffix)]
    return name


def parse_prometheus(text):
    """Checks text against the text exposition format 0.0.4 and ovl's naming
    rules; returns {family: {"type": t, "samples": [(name, labels, value)]}}."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    fams, types, helps, seen_samples = {}, {}, set(), set()
    current = None
    for line in text[:-1].split("\n"):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                assert METRIC.fullmatch(name), "bad metric name in %r" % line
                if parts[1] == "TYPE":
                    assert len(parts) == 4 and parts[3] in TYPES, "bad TYPE line %r" % line
                    assert name not in types, "second TYPE line for %s" % name
                    assert name not in fams, "TYPE for %s after its samples" % name
                    types[name] = parts[3]
                    fams[name] = {"type": parts[3], "samples": []}
                    current = name
                else:
                    assert name not in helps, "second HELP line for %s" % name
                    helps.add(name)
            continue
        m = METRIC.match(line)
        assert m, "bad sample line %r" % line
        name, pos = m.group(), m.end()
        labels = {}
        if pos < len(line) and line[pos] == "{":
            try:
                labels, pos = parse_labels(line, pos, line)
            except IndexError:
                raise AssertionError("unterminated labels in %r" % line) from None
        assert line[pos:pos + 1] == " ", "expected a space before the value in %r" % line
        rest = line[pos + 1:].split(" ")
        assert 1 <= len(rest) <= 2, "bad value/timestamp in %r" % line
        value = parse_value(rest[0])
        if len(rest) == 2:
            assert re.fullmatch(r"-?\d+", rest[1]), "bad timestamp in %r" % line
        fam = family_of(name, types)
        assert fam in types, "sample %s has no TYPE line before it" % name
        assert fam == current, "samples of %s are not grouped together (in %r)" % (fam, line)
        key = (name, tuple(sorted(labels.items())))
        assert key not in seen_samples, "duplicate sample %r" % (key,)
        seen_samples.add(key)
        if types[fam] == "histogram":
            assert name != fam, "histogram %s has a bare sample" % fam
            assert ("le" in labels) == name.endswith("_bucket"), line
        else:
            assert "le" not in labels or types[fam] == "untyped", line
        fams[fam]["samples"].append((name, labels, value))
    # ovl's rules
    for fam, f in fams.items():
        assert fam.startswith("ovl_"), "metric %s does not start with ovl_" % fam
        if f["type"] == "counter":
            assert fam.endswith("_total"), "counter %s does not end with _total" % fam
            for _, _, v in f["samples"]:
                assert v >= 0 and not math.isnan(v), "counter %s is %r" % (fam, v)
        if f["type"] == "histogram":
            check_histogram(fam, f["samples"])
    return fams


def check_histogram(fam, samples):
    by_series = {}
    for name, labels, v in samples:
        rest = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        by_series.setdefault(rest, []).append((name, labels, v))
    for rest, ss in by_series.items():
        buckets = [(parse_value(l["le"]), v) for n, l, v in ss if n == fam + "_bucket"]
        sums = [v for n, _, v in ss if n == fam + "_sum"]
        counts = [v for n, _, v in ss if n == fam + "_count"]
        assert len(sums) == 1 and len(counts) == 1, "%s: one _sum and one _count" % fam
        assert buckets and buckets[-1][0] == math.inf, "%s: the last bucket is not +Inf" % fam
        les = [b[0] for b in buckets]
        assert les == sorted(les) and len(set(les)) == len(les), "%s: le not increasing" % fam
        cum = [b[1] for b in buckets]
        assert all(a <= b for a, b in zip(cum, cum[1:])), "%s: buckets not cumulative" % fam
        assert buckets[-1][1] == counts[0], "%s: +Inf bucket %r != _count %r" % (
            fam, buckets[-1][1], counts[0])
        assert sums[0] >= 0


def sample(fams, fam, series=None, **labels):
    """The value of family fam's sample series (default: fam) with exactly
    these labels."""
    for n, l, v in fams[fam]["samples"]:
        if n == (series or fam) and l == labels:
            return v
    raise AssertionError("no sample %s%r" % (series or fam, labels))


# ------------------------------------------------------------- JSON shape

NUM = "number"
STATUS_FIELDS = {"version": str, "protocol_version": int, "pid": int, "uptime_s": NUM,
                 "backend": str, "socket": str, "config_file": str, "connections": int,
                 "devices": list, "jobs": list, "clients": list, "peer_self": str, "peers": list,
                 "op_kinds": list}
DEVICE_FIELDS = {"index": int, "uuid": str, "name": str, "total_memory": int, "streams": int,
                 "held_bytes": int, "mps": bool}
JOB_FIELDS = {"id": str, "owner_uid": int, "world": int, "local_ranks": int, "state": str,
              "ops_done": int, "ops_in_flight": int, "last_error": str, "rank_devices": list}
CLIENT_FIELDS = {"id": int, "pid": int, "uid": int, "gid": int, "name": str, "job": str,
                 "rank": int, "buffers": int, "mapped_bytes": int}
STATS_FIELDS = {"uptime_s": NUM, "reset_done": bool, "heap_bytes": int, "total": dict,
                "since_reset": dict}
BLOCK_FIELDS = {"seconds": NUM, "ops_done": int, "ops_failed": int, "comm_bytes": int,
                "bytes_gathered": int,
                "flops": int, "busy_s": NUM, "latency_p50_s": NUM, "latency_p90_s": NUM,
                "latency_p99_s": NUM, "latency_max_s": NUM, "registrations": int,
                "deregistrations": int, "registry_hits": int, "registry_misses": int,
                "connections_accepted": int, "connections_refused": int, "tflops": NUM,
                "ops": list, "errors": list, "latency_count": int, "latency_sum_s": NUM,
                "latency_buckets": list, "issue_s": NUM, "issue_p50_s": NUM,
                "issue_p99_s": NUM, "issue_max_s": NUM, "issue_count": int,
                "ops_replayed": int, "ops_captured": int,
                "peer_msgs_in": int, "peer_msgs_out": int, "peer_bytes_in": int,
                "peer_bytes_out": int, "peer_errors": int, "peer_dropped": int,
                "peer_auth_refused": int, "xfer_sends": int, "xfer_recvs": int,
                "xfer_bytes_out": int, "xfer_bytes_in": int, "xfer_errors": int,
                "xfer_dropped": int}
# What only an ovld with links to other nodes counts (test_peers.py and
# test_multinode.py see them move): 0 on one node, ops or not.
NODE_LINK_FIELDS = [k for k in BLOCK_FIELDS if k.startswith(("peer_", "xfer_"))]
OP_FIELDS = {"kind": str, "algo": str, "dtype": str, "count": int}
ERROR_FIELDS = {"status": int, "name": str, "count": int}
BUCKET_FIELDS = {"le_s": NUM, "count": int}


def check_fields(obj, fields, what):
    assert isinstance(obj, dict), "%s is %r, not an object" % (what, obj)
    missing = set(fields) - set(obj)
    assert not missing, "%s lacks %s: %r" % (what, sorted(missing), obj)
    for k, t in fields.items():
        v = obj[k]
        if t == NUM:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        elif t is int:
            ok = isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, t)
        assert ok, "%s.%s is %r, not %s" % (what, k, v, t if t == NUM else t.__name__)
        if t in (int, NUM) and k not in ("rank", "status"):
            assert v >= 0, "%s.%s is negative: %r" % (what, k, v)


def check_block(b, what):
    check_fields(b, BLOCK_FIELDS, what)
    for i, o in enumerate(b["ops"]):
        check_fields(o, OP_FIELDS, "%s.ops[%d]" % (what, i))
        assert o["kind"] in KINDS and o["algo"] in ALGOS and o["dtype"] in DTYPE_SIZE, o
        assert o["count"] > 0, o
    for i, e in enumerate(b["errors"]):
        check_fields(e, ERROR_FIELDS, "%s.errors[%d]" % (what, i))
        assert e["status"] < 0 and e["name"] and e["count"] > 0, e
    assert len(b["latency_buckets"]) > 0
    for i, h in enumerate(b["latency_buckets"]):
        check_fields(h, BUCKET_FIELDS, "%s.latency_buckets[%d]" % (what, i))
    les = [h["le_s"] for h in b["latency_buckets"]]
    cum = [h["count"] for h in b["latency_buckets"]]
    assert les == sorted(les) and len(set(les)) == len(les), "le_s not increasing: %r" % les
    assert all(x <= y for x, y in zip(cum, cum[1:])), "buckets not cumulative: %r" % cum
    # "<= le": every op at or under a bound is in its bucket (the bounds are
    # edges of ovld's fine buckets, so this is exact)
    for h in b["latency_buckets"]:
        if h["le_s"] >= b["latency_max_s"]:
            assert h["count"] == b["latency_count"], (h, b["latency_max_s"], b["latency_count"])
    assert cum[-1] <= b["latency_count"]
    # internal consistency of one block
    assert b["ops_done"] == sum(o["count"] for o in b["ops"]), b
    # bytes_gathered is comm_bytes by its name from before op kinds
    assert b["bytes_gathered"] == b["comm_bytes"], b
    assert b["latency_count"] == b["ops_done"], "latency_count %d != ops_done %d" % (
        b["latency_count"], b["ops_done"])
    assert math.isclose(b["busy_s"], b["latency_sum_s"], rel_tol=1e-6, abs_tol=1e-9), b
    assert b["latency_p50_s"] <= b["latency_p90_s"] <= b["latency_p99_s"] <= b["latency_max_s"], b
    assert b["latency_max_s"] <= b["latency_sum_s"] + 1e-9, b
    # every op done was issued first (ops refused before issue are not);
    # since a reset, an op issued before it may be done after it
    if not what.endswith("since_reset"):
        assert b["issue_count"] >= b["ops_done"], b
    assert b["issue_p50_s"] <= b["issue_p99_s"] <= b["issue_max_s"] <= b["issue_s"] + 1e-9, b
    assert (b["issue_s"] > 0) == (b["issue_count"] > 0), b
    if b["busy_s"] > 0:
        assert math.isclose(b["tflops"], b["flops"] / b["busy_s"] / 1e12, rel_tol=1e-4), b
    else:
        assert b["tflops"] == 0


# ------------------------------------------------------------------ tests

def test_status_table_golden():
    d = Daemon(config="host_devices = 2\n")
    demo = Demo(2, algo="naive", iters=20000, dtype="fp32", m=64, n=64, k=64, job="golden-job")
    try:
        demo.start(d)
        wait_for_job(d, "golden-job", 2, demo=demo)
        table = ctl(d, "status").stdout
        demo.kill()
        compare_golden("ovlctl_status.txt", normalize_status(table, d))
        assert d.stop() == 0, d.log_text()[-4000:]
    finally:
        demo.kill()
        d.cleanup()


def test_stats_table_golden():
    d = Daemon(config="host_devices = 2\n")
    try:
        Demo(2, algo="ring", iters=5, dtype="fp32", m=32, n=32, k=32).run(d)
        table = ctl(d, "stats").stdout
        compare_golden("ovlctl_stats.txt", normalize_stats(table))
        assert d.stop() == 0, d.log_text()[-4000:]
    finally:
        d.cleanup()


def test_json_fields_and_types():
    d = Daemon(config="host_devices = 2\n")
    demo = Demo(2, algo="collective", iters=20000, dtype="bf16", m=16, n=16, k=16, job="json-job")
    try:
        demo.start(d)
        wait_for_job(d, "json-job", 2, demo=demo)
        s = status_json(d)
        check_fields(s, STATUS_FIELDS, "status")
        assert s["op_kinds"] == list(KINDS), s["op_kinds"]
        assert s["backend"] == "host" and s["socket"] == d.socket and s["pid"] == d.proc.pid
        assert s["config_file"] == os.path.join(d.dir, "ovld.conf")
        assert s["connections"] == 3, s  # two ranks and this ovlctl
        assert len(s["devices"]) == 2
        for i, dev in enumerate(s["devices"]):
            check_fields(dev, DEVICE_FIELDS, "status.devices[%d]" % i)
            assert dev["index"] == i
            assert dev["uuid"] == "HOST-6f766c2d-686f-7374-0000-%012x" % i, dev
            assert dev["mps"] is False
        assert len(s["jobs"]) == 1
        for i, j in enumerate(s["jobs"]):
            check_fields(j, JOB_FIELDS, "status.jobs[%d]" % i)
        job = s["jobs"][0]
        assert (job["id"], job["owner_uid"], job["world"], job["local_ranks"], job["state"],
                job["last_error"]) == ("json-job", os.getuid(), 2, 2, "ready", ""), job
        assert len(s["clients"]) == 3
        for i, c in enumerate(s["clients"]):
            check_fields(c, CLIENT_FIELDS, "status.clients[%d]" % i)
            assert c["uid"] == os.getuid() and c["gid"] == os.getgid() and c["pid"] > 0
        ranks = sorted((c["name"], c["job"], c["rank"], c["buffers"]) for c in s["clients"])
        assert ranks == [("ovl-demo", "json-job", 0, 3), ("ovl-demo", "json-job", 1, 3),
                         ("ovlctl", "", -1, 0)], ranks
        demo.kill()
        # a request ovld refuses, so that errors[] is not empty
        p = ctl(d, "plan", "--daemon", "--world", "0", "--rank", "0", "-m", "8", "-n", "8",
                "-k", "8", check=False)
        assert p.returncode == 1, p
        st = stats_json(d)
        check_fields(st, STATS_FIELDS, "stats")
        assert st["reset_done"] is False
        assert 0 < st["heap_bytes"] < 1 << 30, st["heap_bytes"]  # a live ovld's, not a stub's
        check_block(st["total"], "stats.total")
        check_block(st["since_reset"], "stats.since_reset")
        assert st["total"]["ops_done"] > 0 and st["total"]["registrations"] == 6
        # the refused plan, and the aborts of the demo's stopped job
        errs = {e["status"]: e for e in st["total"]["errors"]}
        assert errs.get(-1) == {"status": -1, "name": "invalid argument", "count": 1}, errs
        assert set(errs) <= {-1, -17}, errs
        # one node: no links, and the job's rows never left it
        for block in ("total", "since_reset"):
            moved = {k: st[block][k] for k in NODE_LINK_FIELDS if st[block][k]}
            assert not moved, (block, moved)
        assert d.stop() == 0, d.log_text()[-4000:]
    finally:
        demo.kill()
        d.cleanup()


def test_prometheus_format():
    d = Daemon(config="host_devices = 3\n")
    try:
        Demo(3, algo="all", iters=2, dtype="fp16").run(d)
        ctl(d, "plan", "--daemon", "--world", "0", "--rank", "0", "-m", "8", "-n", "8",
            "-k", "8", check=False)  # one refused request: an ovl_errors_total sample
        text = ctl(d, "stats", "--prometheus").stdout
        fams = parse_prometheus(text)
        want = {"ovl_uptime_seconds": "gauge", "ovl_heap_bytes": "gauge",
                "ovl_ops_total": "counter",
                "ovl_ops_failed_total": "counter", "ovl_gathered_bytes_total": "counter",
                "ovl_comm_bytes_total": "counter",
                "ovl_flops_total": "counter", "ovl_busy_seconds_total": "counter",
                "ovl_op_latency_max_seconds": "gauge", "ovl_issue_seconds_total": "counter",
                "ovl_op_issue_max_seconds": "gauge", "ovl_registrations_total": "counter",
                "ovl_ops_replayed_total": "counter", "ovl_ops_captured_total": "counter",
                "ovl_deregistrations_total": "counter", "ovl_registry_hits_total": "counter",
                "ovl_registry_misses_total": "counter",
                "ovl_connections_accepted_total": "counter",
                "ovl_connections_refused_total": "counter", "ovl_errors_total": "counter",
                "ovl_peer_messages_received_total": "counter",
                "ovl_peer_messages_sent_total": "counter",
                "ovl_peer_received_bytes_total": "counter", "ovl_peer_sent_bytes_total": "counter",
                "ovl_peer_errors_total": "counter", "ovl_peer_dropped_messages_total": "counter",
                "ovl_peer_auth_refused_total": "counter",
                "ovl_xfer_sends_total": "counter", "ovl_xfer_recvs_total": "counter",
                "ovl_xfer_sent_bytes_total": "counter",
                "ovl_xfer_received_bytes_total": "counter", "ovl_xfer_errors_total": "counter",
                "ovl_xfer_dropped_messages_total": "counter",
                "ovl_op_latency_seconds": "histogram"}
        assert {f: x["type"] for f, x in fams.items()} == want, fams.keys()
        for a in ALGOS:
            assert sample(fams, "ovl_ops_total", kind="ag_gemm", algo=a, dtype="fp16") == 3
        assert len(fams["ovl_ops_total"]["samples"]) == 3
        assert sample(fams, "ovl_errors_total", status="-1", name="invalid argument") == 1
        assert sample(fams, "ovl_op_latency_seconds", "ovl_op_latency_seconds_count") == 9
        assert sample(fams, "ovl_op_latency_seconds", "ovl_op_latency_seconds_bucket",
                      le="+Inf") == 9
        assert sample(fams, "ovl_registrations_total") == 9
        if shutil.which("promtool"):
            p = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                               capture_output=True, timeout=30)
            assert p.returncode == 0, "promtool check metrics:\n" + p.stdout + p.stderr
        else:
            print("  (promtool is not installed: only the built-in parser checked the output)")
        assert d.stop() == 0, d.log_text()[-4000:]
    finally:
        d.cleanup()


def check_counts(st, demos, errors, ctl_calls, more_conns=(0, 0), more_regs=(0, 0),
                 aborted_max=0):
    """st's counters since start are exactly what demos did, plus errors
    [(status, name, count)]; connections: Daemon.wait_ready's probe, every
    rank, ctl_calls ovlctl runs, and between more_conns[0] and [1] others;
    registrations: the demos' and between more_regs[0] and [1] others; up to
    aborted_max OVL_ERR_ABORTED errors, failed ops among them."""
    ops, tot = expected(demos)
    t = st["total"]
    check_block(t, "total")
    got_ops = {(o["kind"], o["algo"], o["dtype"]): o["count"] for o in t["ops"]}
    assert got_ops == ops, "ops by (kind, algo, dtype): %r, not %r" % (got_ops, ops)
    assert t["ops_done"] == tot["ops_done"], (t["ops_done"], tot["ops_done"])
    assert t["latency_count"] == tot["ops_done"]
    assert t["flops"] == tot["flops"], (t["flops"], tot["flops"])
    assert t["comm_bytes"] == tot["comm_bytes"], (t["comm_bytes"], tot["comm_bytes"])
    assert (tot["registrations"] + more_regs[0] <= t["registrations"] <=
            tot["registrations"] + more_regs[1]), (t["registrations"], tot["registrations"],
                                                   more_regs)
    assert t["deregistrations"] == 0  # the host path unmaps at exit, never deregisters
    assert t["registry_hits"] + t["registry_misses"] == t["registrations"], t
    assert t["ops_replayed"] == 0 and t["ops_captured"] == 0, t  # the host backend never replays
    got_err = sorted((e["status"], e["name"], e["count"]) for e in t["errors"])
    aborted = sum(c for s, _, c in got_err if s == -17)
    assert aborted <= aborted_max, "%d ops or joins aborted: %r" % (aborted, got_err)
    assert t["ops_failed"] <= aborted, t  # a failed op counts in ops_failed and errors
    got_err = [e for e in got_err if e[0] != -17]
    assert got_err == sorted(errors), "errors %r, not %r" % (got_err, errors)
    assert t["connections_accepted"] >= tot["ranks"]
    base = 1 + tot["ranks"] + ctl_calls
    assert base + more_conns[0] <= t["connections_accepted"] <= base + more_conns[1], (
        t["connections_accepted"], base, more_conns)
    assert t["connections_refused"] == 0
    # no reset yet: both blocks count the same
    for k in ("ops_done", "flops", "comm_bytes", "registrations", "latency_count", "ops",
              "errors", "latency_buckets", "connections_accepted"):
        assert st["since_reset"][k] == t[k], k


def test_stats_under_load():
    d = Daemon(config="host_devices = 3\n")
    try:
        # two jobs at once, different dtypes and worlds
        a = Demo(2, algo="all", iters=7, dtype="bf16", m=16, n=24, k=32)          # 3 x 8 ops
        b = Demo(3, algo="ring", iters=4, dtype="fp16", m=8, n=16, k=40)          # 5 ops
        a.start(d)
        b.start(d)
        a.wait(d)
        b.wait(d)
        c = Demo(2, algo="naive", iters=2, dtype="fp32", m=12, n=8, k=16, a_out=True)  # 3 ops
        c.run(d)
        demos = [a, b, c]
        assert expected(demos)[1]["ops_done"] == 32
        st = stats_json(d)
        check_counts(st, demos, [], ctl_calls=1)
        fams = parse_prometheus(ctl(d, "stats", "--prometheus").stdout)
        n = st["total"]["latency_count"]
        assert sample(fams, "ovl_op_latency_seconds", "ovl_op_latency_seconds_bucket",
                      le="+Inf") == n
        assert sample(fams, "ovl_op_latency_seconds", "ovl_op_latency_seconds_count") == n
        assert sample(fams, "ovl_flops_total") == st["total"]["flops"]
        for (kind, algo, dtype), cnt in expected(demos)[0].items():
            assert sample(fams, "ovl_ops_total", kind=kind, algo=algo, dtype=dtype) == cnt
        buckets = [s for s in fams["ovl_op_latency_seconds"]["samples"]
                   if s[0].endswith("_bucket") and s[1]["le"] != "+Inf"]
        assert [(float(l["le"]), v) for _, l, v in buckets] == [
            (h["le_s"], h["count"]) for h in st["total"]["latency_buckets"]]

        # a join ovld refuses: a reload caps the ranks a uid may hold at 3, and
        # a 4-rank demo follows (4 ranks on 3 devices: two share one, which
        # is allowed). Exactly one rank is refused with OVL_ERR_LIMIT, naming
        # the limit; ovl-demo then stops the others before their job forms,
        # so no op completes.
        with open(os.path.join(d.dir, "ovld.conf"), "w") as f:
            f.write("host_devices = 3\nmax_ranks_per_uid = 3\n")
        reread = "configuration re-read from %s" % os.path.realpath(
            os.path.join(d.dir, "ovld.conf"))
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while reread not in d.log_text():
            assert time.monotonic() < deadline, d.log_text()[-4000:]
            time.sleep(0.02)
        bad = Demo(4, algo="ring", iters=1, dtype="fp32", job="too-wide")
        out = bad.run(d, expect_rc=1)
        assert re.search(r"uid \d+ holds 3 ranks \(max_ranks_per_uid = 3\)", out), out
        st = stats_json(d)
        # The refused rank and the three that joined connected. The three may
        # have registered their 3 buffers, and submitted their first op,
        # before they were stopped: that op then fails with OVL_ERR_ABORTED
        # when the first of them leaves (once: an op is one op for all its
        # ranks); a rank stopped late may also be refused with it when it
        # joins the aborted job.
        check_counts(st, demos, [(-12, "limit exceeded", 1)], ctl_calls=3, more_conns=(4, 4),
                     more_regs=(0, 9), aborted_max=4)
        assert d.stop() == 0, d.log_text()[-4000:]
    finally:
        d.cleanup()


def test_reset():
    d = Daemon(config="host_devices = 2\nsocket_mode = 0666\n")
    try:
        Demo(2, algo="naive", iters=2, dtype="fp32").run(d)  # 3 ops
        prom_before = parse_prometheus(ctl(d, "stats", "--prometheus").stdout)
        r = stats_json(d, "--reset")
        assert r["reset_done"] is True
        # the reply carries the counters as they were just before the reset
        assert r["since_reset"]["ops_done"] == 3 and r["total"]["ops_done"] == 3
        st = stats_json(d)
        assert st["reset_done"] is False
        t, w = st["total"], st["since_reset"]
        check_block(t, "total")
        check_block(w, "since_reset")
        assert t["ops_done"] == 3 and t["registrations"] == 6 and t["latency_count"] == 3
        for k in ("ops_done", "ops_failed", "comm_bytes", "bytes_gathered", "flops", "busy_s",
                  "registrations", "deregistrations", "registry_hits", "registry_misses",
                  "latency_count",
                  "latency_sum_s", "latency_max_s", "latency_p50_s"):
            assert w[k] == 0, "since_reset.%s is %r after --reset" % (k, w[k])
        assert w["ops"] == [] and w["errors"] == [], w
        assert all(h["count"] == 0 for h in w["latency_buckets"])
        assert w["connections_accepted"] == 1  # this ovlctl, after the reset
        assert w["seconds"] < t["seconds"]
        # Prometheus shows the counters since start: the reset changed none
        prom_after = parse_prometheus(ctl(d, "stats", "--prometheus").stdout)
        assert prom_after.keys() == prom_before.keys()
        for fam in prom_before:
            # gauges of the moment, and the connections counted below; the
            # heap moves with each ovlctl connection ovld serves (glibc's
            # figure: in a build without ASan, the allocator's own caches)
            if fam in ("ovl_uptime_seconds", "ovl_connections_accepted_total", "ovl_heap_bytes"):
                continue
            assert prom_after[fam]["samples"] == prom_before[fam]["samples"], fam
        # three more ovlctl connections since the first Prometheus read
        assert (sample(prom_after, "ovl_connections_accepted_total") ==
                sample(prom_before, "ovl_connections_accepted_total") + 3)
        # the table says it reset
        assert "(counters reset now)" in ctl(d, "stats", "--reset").stdout.splitlines()[0]

        # another user may read the counters but not reset them
        if os.getuid() != 0:
            print("  SKIP the refused reset: it needs root to run ovlctl as another user")
        else:
            os.chmod(d.dir, 0o755)  # mkdtemp made it 0700; the socket is 0666

            def as_nobody():
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)

            p = ctl(d, "stats", "--json", check=False, preexec_fn=as_nobody, cwd="/")
            assert p.returncode == 0, p.stderr
            p = ctl(d, "stats", "--reset", check=False, preexec_fn=as_nobody, cwd="/")
            assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1 and "only root or ovld's own user" in lines[0] and \
                "may reset" in lines[0], p.stderr
            assert p.stdout == ""
            st = stats_json(d)
            assert [(e["status"], e["count"]) for e in st["total"]["errors"]] == [(-9, 1)], st
            assert st["total"]["errors"][0]["name"] == "permission denied"
        assert d.stop() == 0, d.log_text()[-4000:]
    finally:
        d.cleanup()


def watch(d, argvs, marker, reports=2, deadline_s=6.0):
    """Runs ovlctl with each of argvs at once until each printed `reports`
    lines holding its marker (marker[i]), or deadline_s; SIGTERMs them;
    returns [(stdout, [monotonic time of each marker line])]."""
    import threading
    ps = [subprocess.Popen([OVLCTL, *a], env=d.env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for a in argvs]
    got = [([], []) for _ in ps]

    def read(p, lines, times, mark):
        for line in p.stdout:
            lines.append(line)
            if mark in line:
                times.append(time.monotonic())

    threads = [threading.Thread(target=read, args=(p, g[0], g[1], m), daemon=True)
               for p, g, m in zip(ps, got, marker)]
    for t in threads:
        t.start()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and any(len(g[1]) < reports for g in got):
        time.sleep(0.05)
    out = []
    for a, p, t, g in zip(argvs, ps, threads, got):
        ended = p.poll()
        p.terminate()
        p.wait(timeout=10)
        t.join(timeout=10)
        err = p.stderr.read()
        p.stdout.close()
        p.stderr.close()
        assert ended is None, "ovlctl %s ended by itself (%d): %s%s" % (
            " ".join(a), ended, "".join(g[0]), err)
        out.append(("".join(g[0]), g[1]))
    return out


def test_watch_and_usage():
    d = Daemon(config="host_devices = 2\n")
    try:
        (table, tt), (js, jt), (prom, pt) = watch(
            d, [["stats", "--watch", "1"], ["stats", "--json", "--reset", "--watch", "1"],
                ["stats", "--prometheus", "--watch", "1"]],
            ["since reset", "{", "# TYPE ovl_uptime_seconds"])
        for what, out, times in (("table", table, tt), ("json", js, jt), ("prometheus", prom, pt)):
            assert len(times) >= 2, "--watch 1 (%s) printed %d reports:\n%s" % (
                what, len(times), out)
            gap = times[1] - times[0]
            assert 0.9 <= gap <= 3.0, "--watch 1 (%s): %.2f s between reports" % (what, gap)
        assert table.count("ovld up ") >= 2, table
        # JSON: one object a line; --reset applies to the first report only
        reports = [json.loads(l) for l in js.splitlines()]
        assert [x["reset_done"] for x in reports[:2]] == [True, False], js
        parse_prometheus(prom[:prom.index("# HELP", 1)])  # the first report alone

        # usage errors: exit 2, nothing on stdout, one exact line on stderr
        # (getopt's names the subcommand, as its argv[0])
        for cmd, args, err in (
                ("stats", ["--watch", "0"], "ovlctl: --watch: 0 is out of range 1..86400 seconds"),
                ("stats", ["--watch", "x"], "ovlctl: --watch: 'x' is not a number"),
                ("stats", ["--watch", "-1"], "ovlctl: --watch: '-1' is not a number"),
                ("stats", ["--watch", ""], "ovlctl: --watch: '' is not a number"),
                ("stats", ["--watch", "86401"],
                 "ovlctl: --watch: 86401 is out of range 1..86400 seconds"),
                ("stats", ["--watch"], "stats: option '--watch' requires an argument"),
                ("stats", ["--bogus"], "stats: unrecognized option '--bogus'"),
                ("stats", ["extra"], "ovlctl stats: unexpected argument 'extra'"),
                ("stats", ["--json", "--frob"], "stats: unrecognized option '--frob'"),
                ("status", ["--bogus"], "status: unrecognized option '--bogus'"),
                ("status", ["extra"], "ovlctl status: unexpected argument 'extra'")):
            p = ctl(d, cmd, *args, check=False, timeout=10)
            assert (p.returncode, p.stdout, p.stderr) == (2, "", err + "\n"), (
                cmd, args, p.returncode, p.stdout, p.stderr)
        # unreachable daemon: exit 1, one line naming the socket
        for cmd in ("stats", "status"):
            p = subprocess.run([OVLCTL, "--socket", "/nonexistent/ovld.sock", cmd],
                               capture_output=True, text=True, timeout=10)
            assert (p.returncode, p.stdout, p.stderr) == (
                1, "", "ovlctl: cannot connect to /nonexistent/ovld.sock: No such file or "
                "directory (is ovld running?)\n"), p
        # --help names stats' options
        h = ctl(d, "stats", "--help").stdout
        for word in ("--json", "--prometheus", "--watch", "--reset"):
            assert word in h, h
        assert d.stop() == 0, d.log_text()[-4000:]
    finally:
        d.cleanup()


if __name__ == "__main__":
    run_tests([test_status_table_golden, test_stats_table_golden, test_json_fields_and_types,
               test_prometheus_format, test_stats_under_load, test_reset, test_watch_and_usage])
