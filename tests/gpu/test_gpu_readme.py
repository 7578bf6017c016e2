"""README.md's ovl.torch example, as it stands there: the python code block
that begins with the line "# example.py" is written to a temporary
directory and run with `python3 -m torch.distributed.run --standalone
--nproc-per-node WORLD example.py` (--world, default 1) against a real ovld
on the CUDA backend (OVL_SOCKET), the package from the tree (PYTHONPATH) and
the libovl that OVL_LIBRARY names (ctest sets it to the built one). The
example picks each rank's GPU itself (LOCAL_RANK mod the GPUs: on one GPU
the ranks share it) and torch.distributed's backend (NCCL, or gloo when
ranks share a GPU).

Checks: torchrun exits 0 within its time; every rank printed its op line
(A and q of the shapes the example makes), its torch.compile line and one
loss line per step, steps 0, 1, ... in order; the ranks print the same loss
at each step (it is all-reduced); the loss decreased from the first step to
the last; then ovld stops with exit 0.

Skips (exit 77, ctest's skip code) without torch, without a GPU, or when
ovld cannot start the CUDA backend."""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "python"))

from ovltest import share  # noqa: E402

MARKER = "# example.py"
TIMEOUT = 420  # seconds for torchrun: start, torch.compile, the steps

# What the example prints, searched for in torchrun's stdout as a whole: the
# ranks' lines may interleave there (each print's text is one write, its
# newline another)
OP_LINE = re.compile(r"rank (\d+) op A \(([\d, ]+)\) q \(([\d, ]+)\)")
COMPILED_LINE = re.compile(r"rank (\d+) compiled \(([\d, ]+)\)")
LOSS_LINE = re.compile(r"rank (\d+) step (\d+) loss (-?\d+\.\d+)")


def extract_example(readme):
    """The code of README.md's python block that begins with the line
    MARKER; fails if there is not exactly one such block."""
    with open(readme) as f:
        lines = f.read().splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        if i == 0 or lines[i - 1].strip() != "```python":
            raise AssertionError("%s:%d: %r is not the first line of a ```python block"
                                 % (readme, i + 1, MARKER))
        for j in range(i + 1, len(lines)):
            if lines[j].strip() == "```":
                found.append("\n".join(lines[i:j]) + "\n")
                break
        else:
            raise AssertionError("%s:%d: the ```python block of %r is not closed"
                                 % (readme, i + 1, MARKER))
    if len(found) != 1:
        raise AssertionError("%s: %d python blocks begin with %r, expected exactly one"
                             % (readme, len(found), MARKER))
    return found[0]


def shape(text):
    return tuple(int(v) for v in text.split(",") if v.strip())


def check_output(out, world):
    """Checks what the ranks printed (torchrun's stdout); returns
    {rank: [loss of each step]}."""
    ops, compiled, losses = {}, {}, {}
    for m in OP_LINE.finditer(out):
        ops[int(m.group(1))] = (shape(m.group(2)), shape(m.group(3)))
    for m in COMPILED_LINE.finditer(out):
        compiled[int(m.group(1))] = shape(m.group(2))
    for m in LOSS_LINE.finditer(out):
        losses.setdefault(int(m.group(1)), []).append((int(m.group(2)), float(m.group(3))))
    ranks = set(range(world))
    for what, got in (("op", ops), ("compiled", compiled), ("loss", losses)):
        assert set(got) == ranks, "%s lines from ranks %s, expected %s" % (
            what, sorted(got), sorted(ranks))
    for r in sorted(ranks):
        # x: 4 x 1024/world x 512 per rank, gathered along dim 1; wq: 512 x 256
        assert ops[r] == ((4, 1024, 512), (4, 1024, 256)), "rank %d: op shapes %s" % (r, ops[r])
        assert compiled[r] == (4, 1024, 256), "rank %d: compiled shape %s" % (r, compiled[r])
    steps = [s for s, _ in losses[0]]
    assert len(steps) >= 2 and steps == list(range(len(steps))), (
        "rank 0 printed the losses of steps %s, expected 0, 1, ... (2 steps or more)" % steps)
    res = {}
    for r in sorted(ranks):
        assert [s for s, _ in losses[r]] == steps, "rank %d: steps %s, rank 0's %s" % (
            r, [s for s, _ in losses[r]], steps)
        res[r] = [v for _, v in losses[r]]
        for s, (a, b) in enumerate(zip(res[r], res[0])):
            assert abs(a - b) <= 1e-4 * abs(b), (
                "step %d: rank %d's loss %g, rank 0's %g (the loss is all-reduced)" % (s, r, a, b))
        assert res[r][-1] < res[r][0], "rank %d: the loss did not decrease: %s" % (r, res[r])
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=1)
    world = ap.parse_args().world
    code = extract_example(os.path.join(ROOT, "README.md"))
    from test_gpu_python import start_daemon, torch_or_skip
    torch, _ = torch_or_skip()
    ngpu = torch.cuda.device_count()
    d = start_daemon()
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="ovl-readme-")
    try:
        print("world %d on %d GPU%s: %s; torch %s, torch.distributed on %s" % (
            world, ngpu, "" if ngpu == 1 else "s", share(world, ngpu), torch.__version__,
            "nccl" if ngpu >= world else "gloo (ranks share a GPU: NCCL refuses that)"),
            flush=True)
        script = os.path.join(tmp, "example.py")
        with open(script, "w") as f:
            f.write(code)
        env = dict(os.environ)
        env["OVL_SOCKET"] = d.socket
        py = os.path.join(ROOT, "python")
        env["PYTHONPATH"] = py + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # Inductor's caches of this run only (its FX graph cache does not key
        # on the world size, which the op's output shapes depend on)
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
        env["PYTHONUNBUFFERED"] = "1"  # what the ranks printed, up to a hang
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(world), script]
        # its own session: on a timeout the ranks are killed with torchrun
        p = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise AssertionError("torchrun did not end within %d s\nstdout:\n%s\nstderr:\n%s\n"
                                 "ovld:\n%s" % (TIMEOUT, out[-4000:], err[-6000:],
                                                d.log_text()[-3000:]))
        print(out, end="", flush=True)
        assert p.returncode == 0, "torchrun exited %d\nstderr:\n%s\novld:\n%s" % (
            p.returncode, err[-8000:], d.log_text()[-3000:])
        try:
            losses = check_output(out, world)
        except AssertionError as e:
            raise AssertionError("%s\nstderr:\n%s" % (e, err[-6000:]))
        print("the example at world %d: %d steps, loss %s" % (
            world, len(losses[0]), " -> ".join("%.5f" % v for v in losses[0])), flush=True)
        assert d.stop() == 0, d.log_text()[-3000:]
        print("PASS test_gpu_readme world %d %.1f s" % (world, time.monotonic() - t0))
    finally:
        d.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
