"""Scaled (fp8) ops end to end on the host backend: real client processes
(ovl-demo -d fp8e4m3 / fp8e5m2) through a real ovld, all-gather + GEMM
(naive, collective, ring) and GEMM + reduce-scatter (naive, collective,
ring, push), worlds 1, 2 and 3 (ranks sharing the daemon's 4 host
devices). Each run checks every rank's C against the double-precision
reference of the scaled product (sa(i) * sb(j) * A @ op(B) + bias, rs:
summed over the ranks, avg divided by the world; client/demo_scaled.h).

The cross product is sampled, not walked: dtype pairs e4m3 x e4m3, e5m2 x
e4m3 and e4m3 x e5m2, outputs bf16, fp16 and fp32, A's and B's scales by
tensor and by row, with and without bias, rs with sum and avg, chunks that
do not divide the rows, each value of each axis at least twice per kind;
every run takes every algorithm of its kind (-a all). Block scales
(DeepSeek-V3's: A by 1x128, B by 1x128 or 128x128) have cases of their own
in both tables: worlds 1 to 3, k a multiple of 128 and not (a last block
of 1 to 72 columns), n within one 128 x 128 tile and past it, chunks that
the row granule of 4 rounds (ovld cuts A 1x128's rows in fours: --chunks 3
of 8 rows gives 2 chunks of 4, of 20 rows 8, 8 and 4), sum and avg. These shapes are
small: each rank's reference covers every row of its C (the check samples
rows only past 2^28 multiply-adds per rank). Then: GEMM + reduce-scatter
with a bias and avg (naive, collective and push; ovld's planner refuses
ring with words), the check over a sample of rows forced with
--check-rows (block scales too: a sample not in fours, which the
reference pads), ovl-demo's own refusals of the scaled options, the block
scales' refusals in the words of ovl's rule (A by 128x128, block with tensor
or row, m or n not in fours), which are ovld's (`ovlctl plan --daemon`
asks ovld's planner), the plans of block-scaled ops as ovlctl prints them,
and ovld's stats counting the ops under their fp8 dtype.

The worst relative error seen per output dtype is printed; on the host
(an fp32 sum) it stays within ovl_demo_tolerance's bounds, fp32's 1e-5
included, which ovl-demo relaxes to 5e-4 for a scaled fp32 C (the GPU's fp8
accumulation)."""
import json
import os
import re
import subprocess

from ovltest import DEMO, OVLCTL, Daemon, run_tests

# (world, A's dtype, B's dtype, out dtype, A scales, B scales, bias,
#  (m per rank, n, k), extra args)
AG_CASES = [
    (1, "fp8e4m3", "fp8e4m3", "bf16", "row", "row", False, (9, 11, 17), ["--chunks", "2"]),
    (2, "fp8e5m2", "fp8e4m3", "fp16", "row", "tensor", True, (7, 5, 13),
     ["--chunks", "3", "--a-out"]),
    (3, "fp8e4m3", "fp8e5m2", "fp32", "row", "row", True, (21, 40, 130),
     ["--chunks", "4", "--streams", "2"]),
    (2, "fp8e4m3", "fp8e4m3", "fp32", "row", "tensor", False, (16, 8, 24), ["--fast-accum"]),
    (3, "fp8e5m2", "fp8e4m3", "bf16", "row", "row", True, (9, 11, 17), ["--chunks", "2"]),
    (1, "fp8e4m3", "fp8e5m2", "fp16", "row", "tensor", False, (7, 5, 13), []),
    # one A scale (by tensor), which every rank shares
    (2, "fp8e4m3", "fp8e4m3", "bf16", "tensor", "row", True, (9, 11, 17), ["--chunks", "2"]),
    (3, "fp8e5m2", "fp8e4m3", "fp32", "tensor", "tensor", False, (7, 5, 13), ["--chunks", "3"]),
    (1, "fp8e4m3", "fp8e5m2", "fp16", "tensor", "row", True, (10, 13, 33), []),
    # block scales: A 1x128 (gathered with its rows), B 1x128 or 128x128
    (1, "fp8e4m3", "fp8e4m3", "fp32", "1x128", "128x128", True, (8, 136, 300), ["--chunks", "3"]),
    (2, "fp8e4m3", "fp8e5m2", "bf16", "1x128", "1x128", False, (12, 20, 256),
     ["--chunks", "2", "--a-out"]),
    (3, "fp8e5m2", "fp8e4m3", "fp16", "1x128", "128x128", True, (20, 40, 130),
     ["--chunks", "3", "--streams", "2"]),
    (2, "fp8e4m3", "fp8e4m3", "fp32", "1x128", "128x128", False, (16, 132, 384), ["--fast-accum"]),
    (3, "fp8e4m3", "fp8e4m3", "bf16", "1x128", "1x128", True, (4, 8, 172), ["--chunks", "3"]),
]
# (world, A, B, out, A scales, B scales, bias, reduce, (m, n, k), extra)
RS_CASES = [
    (1, "fp8e4m3", "fp8e4m3", "bf16", "tensor", "row", True, "sum", (10, 13, 17),
     ["--chunks", "4"]),
    (2, "fp8e5m2", "fp8e4m3", "fp16", "row", "tensor", False, "avg", (9, 11, 6), ["--chunks", "2"]),
    (3, "fp8e4m3", "fp8e5m2", "fp32", "tensor", "tensor", True, "sum", (33, 31, 29),
     ["--chunks", "3", "--streams", "3", "--strided"]),
    (2, "fp8e4m3", "fp8e4m3", "fp32", "row", "row", False, "avg", (16, 8, 24), ["--fast-accum"]),
    (3, "fp8e5m2", "fp8e4m3", "bf16", "row", "tensor", True, "sum", (20, 40, 150),
     ["--chunks", "3"]),
    (1, "fp8e4m3", "fp8e5m2", "fp16", "tensor", "row", False, "avg", (9, 11, 6), []),
    (3, "fp8e4m3", "fp8e4m3", "fp16", "row", "row", False, "avg", (7, 5, 13), ["--chunks", "3"]),
    # block scales: each rank's block of C (m rows) in fours
    (1, "fp8e4m3", "fp8e4m3", "fp32", "1x128", "128x128", True, "sum", (12, 136, 200),
     ["--chunks", "2"]),
    (2, "fp8e5m2", "fp8e4m3", "bf16", "1x128", "1x128", False, "avg", (8, 12, 256),
     ["--chunks", "3", "--strided"]),
    (3, "fp8e4m3", "fp8e5m2", "fp16", "1x128", "128x128", True, "sum", (20, 24, 130),
     ["--chunks", "3", "--streams", "2"]),
    (2, "fp8e4m3", "fp8e4m3", "fp32", "1x128", "128x128", False, "avg", (16, 140, 384),
     ["--fast-accum"]),
    (3, "fp8e4m3", "fp8e4m3", "bf16", "1x128", "1x128", False, "avg", (4, 16, 129), []),
]
# The host's sum is fp32 throughout: its errors stay within
# ovl_demo_tolerance's bounds, below what ovl-demo accepts of a scaled fp32
# C (5e-4: Hopper's tensor cores sum fp8 products in fewer bits than fp32).
HOST_BOUND = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-5}
AG_ALGOS = ("naive", "collective", "ring")
RS_ALGOS = ("naive", "collective", "ring", "push")
OUTS = ("bf16", "fp16", "fp32")

# The worst relative error per output dtype, over every test.
WORST = {}


def scaled_args(a, b, out, amode, bmode, bias):
    return ["-d", a, "--b-dtype", b, "--out-dtype", out, "--a-scale", amode, "--b-scale", bmode,
            *(["--bias"] if bias else [])]


def demo(d, op, world, shape, args, job, iters=2, check=True):
    m, n, k = shape
    cmd = [DEMO, "--op", op, "-w", str(world), "-m", str(m), "-n", str(n), "-k", str(k), "-i",
           str(iters), "--seed", str(world * 1000 + m * 10 + k), "--job", job, *args]
    return d.run(cmd, check=check)


def check_rows(out, algos, outdt, sampled=False):
    """Every algorithm's row OK, its error taken into WORST; the verdict.
    Unless sampled, the check covered every row (no "(checked N of M rows"
    in the verdict)."""
    for algo in algos:
        row = [ln for ln in out.splitlines() if ln.startswith(algo + " ")]
        assert len(row) == 1 and row[0].rstrip().endswith("OK"), out
        err = float(row[0].split()[3])
        assert err < HOST_BOUND[outdt], (algo, err, out)
        WORST[outdt] = max(WORST.get(outdt, 0.0), err)
    assert "all checks passed" in out, out
    assert sampled or "(checked " not in out, out


def rows_checked(out):
    """The verdict's "(checked N of M rows of each rank's C)": (N, M), or
    None where every row was checked."""
    m = re.search(r"\(checked (\d+) of (\d+) rows of each rank's C\)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def header(a, b, out, amode, bmode, bias):
    return "%s x %s -> %s, scales %s/%s%s" % (a, b, out, amode, bmode, ", bias" if bias else "")


def test_fp8_ag():
    """All-gather + GEMM, scaled: A's scales by row and by 1x128 (gathered
    with A's rows) and by tensor (one, every rank's own, which the ranks
    share), B's by row, by tensor, by 1x128 and by 128x128."""
    d = Daemon(config="host_devices = 4\n")
    try:
        for i, (world, a, b, out, amode, bmode, bias, shape, extra) in enumerate(AG_CASES):
            args = scaled_args(a, b, out, amode, bmode, bias) + extra
            p = demo(d, "ag", world, shape, args, "ag-%d" % i)
            assert header(a, b, out, amode, bmode, bias) in p.stdout.splitlines()[0], p.stdout
            check_rows(p.stdout, AG_ALGOS, out)
        # the defaults (B fp8e4m3, C bf16, scales by row), --scale for both
        # sides and --b-scale over it, transb implied
        p = demo(d, "ag", 2, (6, 8, 16), ["-d", "fp8e4m3", "--scale", "tensor", "--b-scale",
                                          "row"], "ag-defaults")
        assert ("fp8e4m3 x fp8e4m3 -> bf16, scales tensor/row, transb," in
                p.stdout.splitlines()[0]), p.stdout
        check_rows(p.stdout, AG_ALGOS, "bf16")
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_fp8_rs():
    """GEMM + reduce-scatter, scaled: each rank's partial with its own
    scales (A's by row and 1x128: the rows of each rank's block) and bias,
    summed or averaged."""
    d = Daemon(config="host_devices = 4\n")
    try:
        for i, (world, a, b, out, amode, bmode, bias, red, shape, extra) in enumerate(RS_CASES):
            args = scaled_args(a, b, out, amode, bmode, bias) + ["--reduce", red] + extra
            p = demo(d, "rs", world, shape, args, "rs-%d" % i)
            assert header(a, b, out, amode, bmode, bias) in p.stdout.splitlines()[0], p.stdout
            assert (", " + red + ",") in p.stdout.splitlines()[0], p.stdout
            check_rows(p.stdout, RS_ALGOS, out)
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_fp8_rs_bias_avg():
    """A bias with avg: each rank's partial plus its bias, the sum divided
    by the world, by naive, collective and push; ring, which adds each
    rank's bias at its GEMM, is refused by ovld's planner with words."""
    d = Daemon(config="host_devices = 4\n")
    try:
        for world, out in ((2, "bf16"), (3, "fp32")):
            args = scaled_args("fp8e4m3", "fp8e4m3", out, "row", "row", True) + [
                "--reduce", "avg", "--chunks", "2"]
            for algo in ("naive", "collective", "push"):
                p = demo(d, "rs", world, (9, 7, 11), args + ["-a", algo],
                         "rsba-%d-%s" % (world, algo))
                check_rows(p.stdout, (algo,), out)
            p = demo(d, "rs", world, (9, 7, 11), args + ["-a", "ring"], "rsba-%d-ring" % world,
                     check=False)
            assert p.returncode == 1 and "ring adds each rank's bias" in p.stdout, p.stdout
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_fp8_sampled_rows():
    """The check over a sample of C's rows, forced small with --check-rows 8
    (by default it samples only past 2^28 multiply-adds per rank): all-gather
    + GEMM's gathered C of 2 x 20 rows (each rank's block's first and last
    rows and the boundaries of --chunks 3's chunks), GEMM + reduce-scatter's
    24 rows of each rank, both kinds' every algorithm; the verdict says how
    many rows each rank checked. --check-rows 0, or at least C's rows, checks
    every row. (A wrong C that the sample catches is not provoked here:
    neither ovld nor ovl-demo has a way to corrupt a result short of a
    fault injection.)"""
    d = Daemon(config="host_devices = 4\n")
    try:
        ag = scaled_args("fp8e4m3", "fp8e4m3", "fp32", "row", "row", True) + ["--chunks", "3"]
        p = demo(d, "ag", 2, (20, 12, 24), ag + ["--check-rows", "8"], "sample-ag")
        check_rows(p.stdout, AG_ALGOS, "fp32", sampled=True)
        assert rows_checked(p.stdout) == (8, 40), p.stdout
        for n in ("0", "40", "100"):
            p = demo(d, "ag", 2, (20, 12, 24), ag + ["--check-rows", n], "sample-ag-" + n)
            check_rows(p.stdout, AG_ALGOS, "fp32")
        # by-tensor scales, a_out, a world of 3: 3 blocks' ends and more
        ag3 = scaled_args("fp8e5m2", "fp8e4m3", "bf16", "tensor", "row", False) + ["--a-out"]
        p = demo(d, "ag", 3, (9, 11, 17), ag3 + ["--check-rows", "10"], "sample-ag3")
        check_rows(p.stdout, AG_ALGOS, "bf16", sampled=True)
        assert rows_checked(p.stdout) == (10, 27), p.stdout
        rs = scaled_args("fp8e4m3", "fp8e5m2", "fp16", "row", "tensor", True) + [
            "--reduce", "sum", "--chunks", "2", "--strided"]
        p = demo(d, "rs", 2, (24, 10, 16), rs + ["--check-rows", "8"], "sample-rs")
        check_rows(p.stdout, RS_ALGOS, "fp16", sampled=True)
        assert rows_checked(p.stdout) == (8, 24), p.stdout
        p = demo(d, "rs", 3, (16, 8, 24), scaled_args("fp8e4m3", "fp8e4m3", "fp32", "row", "row",
                                                      False) + ["--reduce", "avg",
                                                                "--check-rows", "5"],
                 "sample-rs3")
        check_rows(p.stdout, RS_ALGOS, "fp32", sampled=True)
        assert rows_checked(p.stdout) == (5, 16), p.stdout
        # block scales: 7 and 5 rows, not in fours (the double reference
        # takes A 1x128 in fours: the demo pads the sample with zero rows)
        blk = scaled_args("fp8e4m3", "fp8e4m3", "fp32", "1x128", "128x128", True)
        p = demo(d, "ag", 2, (20, 136, 300), blk + ["--chunks", "3", "--check-rows", "7"],
                 "sample-ag-blk")
        check_rows(p.stdout, AG_ALGOS, "fp32", sampled=True)
        assert rows_checked(p.stdout) == (7, 40), p.stdout
        p = demo(d, "rs", 2, (24, 12, 256), blk + ["--reduce", "sum", "--check-rows", "5"],
                 "sample-rs-blk")
        check_rows(p.stdout, RS_ALGOS, "fp32", sampled=True)
        assert rows_checked(p.stdout) == (5, 24), p.stdout
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_fp8_demo_refusals():
    """ovl-demo's own refusals of the scaled options (exit 2, one line, before
    it connects), and its help. (An fp8 dtype without scaling, which ovld
    refuses, is not something ovl-demo can send.)"""
    for args, words in (
            (["-d", "bf16", "--bias"], "--bias is a scaled op's"),
            (["--out-dtype", "fp32"], "--out-dtype is a scaled op's"),
            (["-d", "fp16", "--scale", "row"], "--scale is a scaled op's"),
            (["-d", "fp32", "--fast-accum"], "--fast-accum is a scaled op's"),
            (["-d", "fp8e4m3", "--out-dtype", "fp8e5m2"], "--out-dtype: 'fp8e5m2' is not bf16"),
            (["-d", "fp8e4m3", "--b-dtype", "bf16"], "--b-dtype: 'bf16' is not fp8e4m3"),
            (["-d", "fp8e5m2", "--b-dtype", "fp8e5m2"], "fp8e5m2 x fp8e5m2 has no GEMM"),
            (["-d", "fp8e4m3", "--scale", "col"],
             "--scale: 'col' is not tensor, row, 1x128 or 128x128"),
            (["-d", "fp8e4m3", "--a-scale", "block"],
             "--a-scale: 'block' is not tensor, row, 1x128 or 128x128"),
            (["-d", "fp8e4m3", "--more-n", "8"], "takes one B"),
            (["-d", "bf16", "--check-rows", "8"], "--check-rows is a scaled op's"),
            (["-d", "fp8e4m3", "--check-rows", "some"], "--check-rows: 'some' is not a number"),
    ):
        p = subprocess.run([DEMO, *args], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, OVL_SOCKET="/nonexistent/ovld.sock"))
        assert p.returncode == 2, (args, p.returncode, p.stdout, p.stderr)
        assert words in p.stderr and len(p.stderr.splitlines()) == 1, (args, p.stderr)
        assert p.stdout == "", (args, p.stdout)
    h = subprocess.run([DEMO, "--help"], capture_output=True, text=True, timeout=30)
    assert h.returncode == 0, h
    for opt in ("--b-dtype", "--out-dtype", "--scale", "--a-scale", "--b-scale", "--bias",
                "--fast-accum", "--check-rows", "--transb is implied", "fp8e4m3", "1x128",
                "128x128", "DeepSeek-V3's"):
        assert opt in h.stdout, (opt, h.stdout)


# Block scales that ovl's rule (common/scaling.c) refuses: (ovl-demo's
# arguments past -d fp8e4m3, `ovlctl plan`'s for the same op past --dtype
# fp8e4m3, the rule's words). ovlctl's -m is ag's rows a rank and rs's rows
# of the sum (world times ovl-demo's).
BLOCK_REFUSALS = [
    (["--scale", "128x128"], ["--scale", "128x128"], "A's scales by 128x128 tile: not taken"),
    (["--a-scale", "128x128", "--b-scale", "1x128"], ["--a-scale", "128x128", "--b-scale", "1x128"],
     "A's scales by 128x128 tile: not taken"),
    (["--a-scale", "1x128"], ["--a-scale", "1x128"],
     "block scales (1x128, 128x128) go with block scales on the other operand"),
    (["--a-scale", "tensor", "--b-scale", "128x128"],
     ["--a-scale", "tensor", "--b-scale", "128x128"],
     "block scales (1x128, 128x128) go with block scales on the other operand"),
    (["--a-scale", "1x128", "--b-scale", "128x128", "-m", "6"],
     ["--a-scale", "1x128", "--b-scale", "128x128", "-m", "6"],
     "A's 1x128 scales need its rows in multiples of 4"),
    (["--op", "rs", "-w", "2", "--scale", "1x128", "-m", "10"],
     ["--kind", "gemm_rs", "--scale", "1x128", "-m", "20"],
     "A's 1x128 scales need its rows in multiples of 4"),
    (["--scale", "1x128", "-m", "8", "-n", "10"], ["--scale", "1x128", "-m", "8", "-n", "10"],
     "B's 1x128 scales need n in multiples of 4"),
]


def test_fp8_block_refusals():
    """Block scales ovl's rule refuses: ovl-demo says so before it connects
    (exit 2, one line naming the modes, and -m and -n for a shape's
    refusal) in the rule's words, and they are ovld's: its planner, asked
    through `ovlctl plan --daemon` for the same op, refuses it with the same
    sentence. --scale 128x128 (A by tiles too) also names the usual pair."""
    d = Daemon(config="host_devices = 4\n")
    try:
        for demo_args, plan_args, words in BLOCK_REFUSALS:
            p = subprocess.run([DEMO, "-d", "fp8e4m3", *demo_args], capture_output=True,
                               text=True, timeout=30,
                               env=dict(os.environ, OVL_SOCKET="/nonexistent/ovld.sock"))
            assert p.returncode == 2 and p.stdout == "", (demo_args, p.returncode, p.stdout)
            assert len(p.stderr.splitlines()) == 1 and words in p.stderr, (demo_args, p.stderr)
            m = re.match(r"ovl-demo: scales (\S+)/(\S+?)(, -m \d+ -n \d+)?: (.*)$",
                         p.stderr.strip())
            assert m, p.stderr
            why = m.group(4).split(" (--scale sets both sides:")[0]
            if demo_args[:2] == ["--scale", "128x128"]:
                assert "(--scale sets both sides: --a-scale 1x128 --b-scale 128x128)" in p.stderr
            q = d.run([OVLCTL, "plan", "--daemon", "--dtype", "fp8e4m3",
                       "--world", "2", "--rank", "0", "-m", "16", "-n", "256", "-k", "300",
                       *plan_args], check=False)
            assert q.returncode == 1 and "cannot plan: " + why in q.stderr, (
                plan_args, why, q.stderr)
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_fp8_block_plans():
    """The plans of block-scaled ops as `ovlctl plan` prints them (offline,
    the planner ovld runs): A's 1x128 scales go with its rows (SA m x
    ceil(k/128), gathered into SG), B's 128x128 are ceil(n/128) x
    ceil(k/128), and chunks are cut in fours (--chunks 3 of 20 rows: 8, 8
    and 4; GEMM + reduce-scatter's blocks likewise)."""
    q = subprocess.run([OVLCTL, "plan", "--dtype", "fp8e4m3", "--a-scale", "1x128", "--b-scale",
                        "128x128", "--world", "2", "--rank", "1", "-m", "20", "-n", "256", "-k",
                        "300", "--algo", "collective", "--chunks", "3"],
                       capture_output=True, text=True, timeout=30)
    assert q.returncode == 0, q
    lines = q.stdout.splitlines()
    assert "chunks=3 chunk_rows=8 " in lines[0], q.stdout
    assert lines[1] == ("scaled b_dtype=fp8e4m3 out_dtype=bf16 a_scale=1x128 b_scale=128x128 "
                        "bias=no fast_accum=no"), q.stdout
    assert " SA=20x3 SB=2x3 SG=40x3(scratch) " in lines[2], q.stdout
    gemms = [ln for ln in lines if " GEMM " in ln]
    assert [g.split()[5] for g in gemms] == ["G[0+8]", "G[8+8]", "G[16+4]"], q.stdout
    assert all(g.endswith("scaled SG[%s] SB" % g.split()[5][2:-1]) for g in gemms), q.stdout
    q = subprocess.run([OVLCTL, "plan", "--kind", "gemm_rs", "--dtype", "fp8e4m3", "--scale",
                        "1x128", "--world", "2", "--rank", "0", "-m", "16", "-n", "12", "-k", "130",
                        "--algo", "push", "--chunks", "2"],
                       capture_output=True, text=True, timeout=30)
    assert q.returncode == 0, q
    lines = q.stdout.splitlines()
    assert "chunks=2 chunk_rows=4 " in lines[0], q.stdout
    assert "a_scale=1x128 b_scale=1x128" in lines[1], q.stdout
    assert " SA=16x2 SB=12x2 " in lines[2], q.stdout


def test_fp8_counted():
    """ovld's stats count scaled ops under their A's fp8 dtype and kind; the
    flops are the GEMMs', the bytes ag's gathered fp8 rows and rs's
    partials in the output dtype."""
    d = Daemon(config="host_devices = 2\n")
    try:
        base = scaled_args("fp8e4m3", "fp8e4m3", "fp32", "row", "row", True) + ["-a", "collective"]
        p = demo(d, "ag", 2, (8, 8, 16), base, "count-ag", iters=3)
        assert "all checks passed" in p.stdout, p.stdout
        p = demo(d, "rs", 2, (8, 8, 16), base, "count-rs", iters=3)
        assert "all checks passed" in p.stdout, p.stdout
        p = demo(d, "ag", 1, (4, 4, 8), ["-d", "fp8e5m2", "-a", "naive"], "count-e5", iters=1)
        assert "fp8e5m2 x fp8e4m3 -> bf16, scales row/row, transb" in p.stdout, p.stdout
        assert "all checks passed" in p.stdout, p.stdout
        st = json.loads(d.run([OVLCTL, "stats", "--json"]).stdout)["total"]
        ops = {(o["kind"], o["algo"], o["dtype"]): o["count"] for o in st["ops"]}
        # one untimed op and iters timed, on each rank
        assert ops == {("ag_gemm", "collective", "fp8e4m3"): 4,
                       ("gemm_rs", "collective", "fp8e4m3"): 4,
                       ("ag_gemm", "naive", "fp8e5m2"): 2}, st["ops"]
        # 2 (world m) n k flop on each rank: 16 rows in all (ag: gathered;
        # rs: every rank's A), n 8, k 16; ag: 4 x 8 x 1 x 2 of the e5m2 run
        assert st["flops"] == 2 * 4 * 2 * (2 * 16 * 8 * 16) + 2 * (2 * 4 * 4 * 8), st["flops"]
        # ag: 16 gathered rows of k fp8 on each rank; rs: 16 x n fp32
        # partials on each rank; the e5m2 run: 4 rows of 8
        assert st["comm_bytes"] == (4 * 2 * (16 * 16 * 1) + 4 * 2 * (16 * 8 * 4) +
                                    2 * (4 * 8 * 1)), st["comm_bytes"]
        assert d.stop() == 0
    finally:
        d.cleanup()


def print_worst():
    print("  worst ||C - ref|| / ||ref|| by output dtype:")
    for dt in OUTS:
        print("    %-5s %s" % (dt, "%.1e" % WORST[dt] if dt in WORST else "-"))


if __name__ == "__main__":
    try:
        run_tests([test_fp8_demo_refusals, test_fp8_block_refusals, test_fp8_block_plans,
                   test_fp8_ag, test_fp8_rs, test_fp8_rs_bias_avg, test_fp8_sampled_rows,
                   test_fp8_counted])
    finally:
        print_worst()
