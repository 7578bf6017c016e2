"""The ovl Python package on the CUDA backend, with torch tensors: a real
ovld, WORLD rank processes (--world, default 1), ranks round-robin over the
GPUs (rank r on GPU r mod G: on one GPU they share it). Each rank checks,
against a float32 torch reference of the gathered A computed on its GPU:

- one B, bf16 and fp16, and B stored n x k (transb);
- three Bs of different n in one op (A gathered once), with the gathered A
  returned (a_out must equal the ranks' shards exactly);
- the stream contract: 50 iterations on a side stream without
  synchronizing (a producer copy writes A on the stream, the op, a consumer
  copy reads C), every iteration's result right afterwards.

Skips (exit 77, ctest's skip code) without torch, without a GPU, or when
ovld cannot start the CUDA backend. OVL_LIBRARY names the libovl the
package loads (ctest sets it to the built one)."""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from ovltest import Daemon, share  # noqa: E402

SKIP_CODE = 77
TOL = {"bf16": 2e-2, "fp16": 5e-3}
ITERS = 50


class CudaDaemon(Daemon):
    """ovld on the CUDA backend: it makes a context per GPU before it
    listens, slower than the host backend."""

    def __init__(self, config=None, env=None):
        super().__init__(backend="cuda", config=config, env=env)

    def wait_ready(self, timeout=60.0):
        return super().wait_ready(timeout)


def skip(why):
    print("SKIP: %s" % why, flush=True)
    sys.exit(SKIP_CODE)


def shard(torch, rank, i, m, k, dtype):
    """Rank `rank`'s shard of case i, the same in every process."""
    g = torch.Generator().manual_seed(1000 * i + rank)
    return torch.rand((m, k), generator=g).sub_(0.5).to(dtype)


def rank_main(sock, job, world, rank, q):
    try:
        import torch
        import ovl
        ngpu = torch.cuda.device_count()
        dev = rank % ngpu
        torch.cuda.set_device(dev)
        cuda = torch.device("cuda", dev)
        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
        worst = {}
        with ovl.connect(sock) as client, client.comm(job, world, rank, dev) as comm:
            i = 0
            for name, dt in dtypes.items():
                for transb in (False, True):
                    for ns in ((768,), (256, 128, 384)):
                        m, k = 256, 512
                        a = shard(torch, rank, i, m, k, dt).to(cuda)
                        g = torch.Generator().manual_seed(777 + i)
                        bs = [torch.rand((n, k) if transb else (k, n), generator=g).sub_(0.5)
                              .to(dt).to(cuda) for n in ns]
                        arg = bs if len(ns) > 1 else bs[0]
                        outs, a_all = comm.all_gather_matmul(a, arg, transb=transb,
                                                             return_a=True)
                        outs = outs if len(ns) > 1 else [outs]
                        torch.cuda.synchronize()
                        ga = torch.cat([shard(torch, r, i, m, k, dt) for r in range(world)])
                        assert torch.equal(a_all.cpu(), ga), "case %d: a_out differs" % i
                        ga32 = ga.float().to(cuda)
                        for b, c in zip(bs, outs):
                            ref = ga32 @ (b.float().t() if transb else b.float())
                            err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
                            assert c.shape == ref.shape, (c.shape, ref.shape)
                            assert err < TOL[name], "case %d (%s, transb %s, Bs %s): %.3g" % (
                                i, name, transb, ns, err)
                            worst[name] = max(worst.get(name, 0.0), err)
                        i += 1
            # The stream contract: nothing synchronizes until the end.
            m, k, n = 256, 512, 384
            s = torch.cuda.Stream()
            srcs = [shard(torch, rank, 100 + j, m, k, torch.bfloat16).to(cuda)
                    for j in range(ITERS)]
            g = torch.Generator().manual_seed(4242)
            b = torch.rand((k, n), generator=g).sub_(0.5).to(torch.bfloat16).to(cuda)
            a = torch.empty((m, k), dtype=torch.bfloat16, device=cuda)
            hist = torch.empty((ITERS, world * m, n), dtype=torch.bfloat16, device=cuda)
            torch.cuda.synchronize()
            with torch.cuda.stream(s):
                for j in range(ITERS):
                    a.copy_(srcs[j])                                   # producer
                    c = comm.all_gather_matmul(a, b, stream=s)
                    hist[j].copy_(c)                                   # consumer
            s.synchronize()
            comm.check()
            for j in range(ITERS):
                ga = torch.cat([shard(torch, r, 100 + j, m, k, torch.bfloat16)
                                for r in range(world)]).float().to(cuda)
                ref = ga @ b.float()
                err = ((hist[j].float() - ref).abs().max() / ref.abs().max()).item()
                assert err < TOL["bf16"], "stream contract, iteration %d: %.3g" % (j, err)
                worst["stream"] = max(worst.get("stream", 0.0), err)
        q.put((rank, worst, None))
    except BaseException as e:  # the parent reports it
        import traceback
        q.put((rank, None, "%r\n%s" % (e, traceback.format_exc())))


def torch_or_skip():
    """torch and torch.multiprocessing, or a SKIP exit without torch or a
    GPU; the ovl package must load (a failure, not a skip)."""
    try:
        import torch
        import torch.multiprocessing as mp
        import torch.distributed  # noqa: F401
    except ImportError as e:
        skip("no torch (%s)" % e)
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        skip("no GPU visible to torch")
    try:
        import ovl  # noqa: F401
    except Exception as e:
        raise AssertionError("the ovl package does not load: %r" % e)
    return torch, mp


def start_daemon(config=None, env=None):
    """ovld on the CUDA backend (config: its configuration file's text, env:
    added to its environment; as ovltest.Daemon's), or a SKIP exit where it
    cannot start it."""
    try:
        return CudaDaemon(config, env)
    except AssertionError as e:
        if "cannot start the cuda backend" in str(e):
            skip("ovld cannot start the CUDA backend")
        raise


def run_ranks(mp, d, target, arg, world, timeout):
    """Runs target(d.socket, arg, world, rank, q) in `world` spawned
    processes; returns {rank: result} of what each put on q as (rank,
    result, error), failing on the first error (with ovld's log) or past
    timeout seconds. Ranks still alive at the end (one stuck in a
    collective after another failed) are killed."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=target, args=(d.socket, arg, world, r, q)) for r in range(world)]
    try:
        for p in ps:
            p.start()
        got = {}
        deadline = time.monotonic() + timeout
        while len(got) < world:
            left = deadline - time.monotonic()
            assert left > 0, "ranks did not answer: %r" % sorted(got)
            r, res, err = q.get(timeout=left)
            assert err is None, "rank %d failed: %s\novld:\n%s" % (r, err, d.log_text()[-3000:])
            got[r] = res
        for p in ps:
            p.join(30)
        return got
    finally:
        for p in ps:
            if p.is_alive():
                p.join(5)
            if p.is_alive():
                p.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=1)
    world = ap.parse_args().world
    torch, mp = torch_or_skip()
    ngpu = torch.cuda.device_count()
    d = start_daemon()
    t0 = time.monotonic()
    try:
        print("world %d on %d GPU%s: %s" % (world, ngpu, "" if ngpu == 1 else "s",
                                          share(world, ngpu)), flush=True)
        job = "py-gpu-w%d-%d" % (world, os.getpid())
        got = run_ranks(mp, d, rank_main, job, world, 300)
        for r in sorted(got):
            print("rank %d: worst relative errors %s" % (
                r, ", ".join("%s %.2g" % kv for kv in sorted(got[r].items()))), flush=True)
        assert d.stop() == 0, d.log_text()[-3000:]
        print("PASS test_gpu_python world %d %.1f s" % (world, time.monotonic() - t0))
    finally:
        d.cleanup()


if __name__ == "__main__":
    main()
