"""ovl.torch.install() under torch.compile's micro-pipeline TP pass: the
block of bench/torch_async_tp.py (a Llama MLP in TorchTitan's
sequence-parallel style: all-gather of the sequence, column-parallel w1 and
w3, SwiGLU, row-parallel w2, reduce-scatter; functional collectives with
autograd), small, compiled three ways on a real ovld: without the pass, with
the pass and PyTorch's own symm_mem kernels, with the pass and ovl installed
(a group comm made on the first call: install()'s one line). Each rank
checks, in float32 and bf16:

- the compiled forward with the pass calls symm_mem.fused_all_gather_matmul
  and fused_matmul_reduce_scatter (the pass left the backward's collectives
  unfused with torch 2.10 on CPU); without the pass, no symm_mem op;
- with ovl installed, ovl took calls of both ops (ovl.torch.stats()) and
  ovld counted the same ops (its stats), none handed back;
- the output and the gradients of x, w1, w3 and w2 of one training step
  equal the block's without the pass (float32 to 1e-4, bf16 to 2e-2
  relative), and the ones with PyTorch's kernels;
- after uninstall() the compiled block runs PyTorch's kernels (ovld counts
  no more).

NCCL only, one rank per GPU (skipped, 77, where ranks would share a GPU,
without torch 2.8 or a GPU, and at world 1). ctest: test_gpu_torch_tp_w1
(which skips), _w2, _w4, _w8. _w2 passed on 2 x H200 with PyTorch 2.11
(bench/results/2026-11-28-gpu-fp8-torchtp-f4268af-h200x2.md)."""
import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))

from ovltest import share  # noqa: E402

D, F, B, S_PER_RANK = 256, 1024, 2, 64


def ovld_ops(client):
    st = client.stats()["total"]
    return {k: sum(o["count"] for o in st["ops"] if o["kind"] == k)
            for k in ("ag_gemm", "gemm_rs")}


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def rank_main(sock, store, world, rank, q):
    try:
        import torch
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol
        os.environ["OVL_SOCKET"] = sock  # the lazy comm connects by libovl's rule
        import ovl
        import ovl.torch as otorch
        import torch_async_tp as tp
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = False
        dist.init_process_group("nccl", init_method="file://" + store, world_size=world,
                                rank=rank)
        gname = dist.group.WORLD.group_name
        tp.enable_symm_mem(gname)
        block = tp.make_block(torch, funcol, gname)
        worst = {}
        with ovl.connect(sock) as client:
            for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
                params = tp.make_params(torch, D, F, rank, world, dtype, dev)
                x = tp.make_input(torch, B, S_PER_RANK * world, D, rank, world, dtype, dev)
                res = {}
                for way in tp.WAYS:
                    f = tp.compile_way(torch, way, block)
                    before, taken0 = ovld_ops(client), otorch.stats()["taken"]
                    out, grads, per = tp.fused_ops_in(torch, f, x, params)
                    torch.cuda.synchronize()
                    dist.barrier()
                    res[way] = [out.detach().clone()] + [g.detach().clone() for g in grads]
                    want = [] if way == "nopass" else ["fused_all_gather_matmul",
                                                        "fused_matmul_reduce_scatter"]
                    if way == "nopass":
                        assert not any(per), per
                    else:
                        # the forward's gather + matmuls and matmul +
                        # reduce-scatter (the pass leaves the backward's
                        # collectives as they are with torch 2.10 on CPU)
                        assert per and per[0] == want, per
                    taken = {k: otorch.stats()["taken"].get(k, 0) - taken0.get(k, 0)
                             for k in want}
                    deadline = time.monotonic() + 5
                    while True:  # ovld counts an op once its completion is delivered
                        after = ovld_ops(client)
                        done = {k: after[k] - before[k] for k in after}
                        if way != "ovl" or done == {"ag_gemm": taken.get(
                                "fused_all_gather_matmul", 0), "gemm_rs": taken.get(
                                "fused_matmul_reduce_scatter", 0)} or time.monotonic() > deadline:
                            break
                        time.sleep(0.05)
                    if way == "ovl":
                        assert all(v > 0 for v in taken.values()), (taken, otorch.stats())
                        assert done == {"ag_gemm": taken["fused_all_gather_matmul"],
                                        "gemm_rs": taken["fused_matmul_reduce_scatter"]}, (
                            done, taken)
                        assert not otorch.stats()["fell_back"], otorch.stats()
                    else:
                        assert done == {"ag_gemm": 0, "gemm_rs": 0}, (way, done)
                        assert not any(taken.values()), (way, taken)
                names = ("out", "x.grad", "w1.grad", "w3.grad", "w2.grad")
                for way in ("torch", "ovl"):
                    for n, a, b in zip(names, res[way], res["nopass"]):
                        e = rel(a, b)
                        key = "%s %s" % (way, str(dtype)[6:])
                        worst[key] = max(worst.get(key, 0.0), e)
                        assert e <= tol, "%s %s %s: relative error %.3g over %g" % (
                            way, str(dtype)[6:], n, e, tol)
            otorch.uninstall()
            assert not otorch.installed()
            otorch.shutdown()
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, worst, None))
    except BaseException as e:  # the parent reports it
        import traceback
        q.put((rank, None, "%r\n%s" % (e, traceback.format_exc())))
        try:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=1)
    world = ap.parse_args().world
    from test_gpu_python import run_ranks, skip, start_daemon, torch_or_skip
    torch, mp = torch_or_skip()
    import ovl.torch as otorch
    if not otorch._override_supported():
        skip("PyTorch %s cannot replace the symm_mem kernels (2.8 or later)" % torch.__version__)
    ngpu = torch.cuda.device_count()
    if world < 2:
        skip("world 1: the pass fuses the collectives of 2 ranks or more")
    if ngpu < world:
        skip("world %d on %d GPU%s: the pass and PyTorch's kernels need a GPU per rank"
             % (world, ngpu, "" if ngpu == 1 else "s"))
    d = start_daemon()
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="ovl-torch-tp-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
    try:
        print("world %d on %d GPUs: %s; torch %s" % (world, ngpu, share(world, ngpu),
                                                    torch.__version__), flush=True)
        got = run_ranks(mp, d, rank_main, os.path.join(tmp, "store"), world, 540)
        for r in sorted(got):
            print("rank %d: compiled block without the pass, with PyTorch's kernels, with ovl; "
                  "worst relative errors against no pass: %s" % (
                      r, ", ".join("%s %.2g" % kv for kv in sorted(got[r].items()))), flush=True)
        assert d.stop() == 0, d.log_text()[-3000:]
        print("PASS test_gpu_torch_tp world %d %.1f s" % (world, time.monotonic() - t0))
    finally:
        d.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
