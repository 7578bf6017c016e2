#!/usr/bin/env python3
"""gen_seeds.py: writes the hand-made seeds of the fuzz corpora.

    tests/fuzz/gen_seeds.py [FUZZ_DIR]     (default: this script's directory)

Writes seed_*.bin into corpus_request/ (framed Requests, encoded here by
hand from proto/ovl.proto: standard library only), corpus_peer/
(handshake frames and active messages of proto/peer.proto for
fuzz_peer.c), corpus_xfer/ (the bodies of proto/xfer.proto for
fuzz_xfer.c), corpus_cluster/ (the bodies of proto/cluster.proto for
fuzz_cluster.c), corpus_doorbell/
(scripts for fuzz_doorbell.c) and seed_*.conf into corpus_config/
(deploy/ovld.conf and variants). Files the fuzzer added (named by their
SHA-1) are left alone. Run it again after changing the schema or a target's
input format, then merge (docs/fuzzing.md).
"""
import os
import re
import struct
import sys

# the protobuf encoders and the frame of the integration tests (standard
# library only)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from ovltest import f_bytes, f_varint, frame, varint  # noqa: E402

# ------------------------------------------------------------- protobuf


def request(rid, field, body):
    return f_varint(1, rid) + f_bytes(field, body)


UUID = b"ovl-host" + bytes(7) + b"\x01"


def hello(version=5):
    return (f_varint(1, version) + f_bytes(2, "0.3.0") + f_varint(3, 1234)
            + f_bytes(4, "seed") + f_varint(5, 1))


def comm_init(job=b"train", world=4, rank=1, uuid=UUID):
    return f_bytes(1, job) + f_varint(2, world) + f_varint(3, rank) + f_bytes(4, uuid)


def mem_register(nbytes=1 << 20, fd_count=1, ipc=b"", uuid=b""):
    b = f_varint(1, 0x7F0000001000) + f_varint(2, nbytes) + f_varint(3, fd_count) + f_varint(4, 0)
    if ipc:
        b += f_bytes(5, ipc) + f_varint(6, 256)
    if uuid:
        b += f_bytes(7, uuid)
    return b


def bufref(mem, off=0):
    return f_varint(1, mem) + f_varint(2, off)


def op_buf(slot, mem, ld, off=0):
    # an Op's OpBuf: slot, ref, ld
    return f_varint(1, slot) + f_bytes(2, bufref(mem, off)) + f_varint(3, ld)


def ag_gemm(seq=1, dtype=0, algo=3, chunks=4, streams=2, m=16, n=64, k=64, a_out=True,
            more_ns=(), kind=1, slots=None):
    # an Op of kind ag_gemm (1): A, B, C (and a_out) in slots 0 to 3, B i
    # and C i in 3 + i and 10 + i, the parameters in field 5
    bufs = [(0, 1, k), (1, 2, n), (2, 3, n)] + ([(3, 4, k)] if a_out else [])
    for i, mn in enumerate(more_ns):
        if i < 7:
            bufs += [(4 + i, 5 + i, mn), (11 + i, 5 + i, mn)]
    if slots is not None:
        bufs = [(sl, mem, ld) for (sl, (_, mem, ld)) in zip(slots, bufs)]
    params = (f_varint(1, m) + f_varint(2, n) + f_varint(3, k) + f_varint(4, dtype)
              + f_varint(5, algo) + f_varint(6, chunks) + f_varint(7, streams) + f_varint(8, 1))
    if more_ns:
        params += f_bytes(9, b"".join(varint(x) for x in more_ns))
    b = f_varint(1, 1) + f_varint(2, seq) + f_varint(3, kind)
    for slot, mem, ld in bufs:
        b += f_bytes(4, op_buf(slot, mem, ld, 1 << 16 if slot >= 11 else 0))
    return b + f_bytes(5, params)


def gemm_rs(seq=1, dtype=0, algo=2, chunks=2, streams=2, m=64, n=32, k=16, reduce_op=0,
            kind=2, with_ag=False):
    # an Op of kind gemm_rs (2): A, B, C in slots 0 to 2, the parameters in
    # field 6 (with_ag: ag_gemm's in field 5 as well, which is refused)
    params = (f_varint(1, m) + f_varint(2, n) + f_varint(3, k) + f_varint(4, dtype)
              + f_varint(5, algo) + f_varint(6, chunks) + f_varint(7, streams) + f_varint(8, 1)
              + f_varint(9, reduce_op))
    b = f_varint(1, 1) + f_varint(2, seq) + f_varint(3, kind)
    for slot, mem, ld in ((0, 1, k), (1, 2, n), (2, 3, n)):
        b += f_bytes(4, op_buf(slot, mem, ld))
    if with_ag:
        b += f_bytes(5, f_varint(1, m) + f_varint(2, n) + f_varint(3, k))
    return b + f_bytes(6, params)


def plan(world=4, rank=3, algo=3, dtype=1, chunks=0, streams=0, transb=False, more_ns=(),
         packed=True, kind=1, given=(3,), params=True):
    # a PlanRequest: world 2, rank 3, kind 13, its kind's parameters (as an
    # Op's AgGemmParams) in 14, the optional slots it gives in 15
    p = (f_varint(1, 1024) + f_varint(2, 256) + f_varint(3, 512) + f_varint(4, dtype)
         + f_varint(5, algo) + f_varint(6, chunks) + f_varint(7, streams))
    if transb:
        p += f_varint(8, 1)
    # more_n: packed, as proto3 writes a repeated scalar; a parser takes
    # the unpacked form too
    if more_ns and packed:
        p += f_bytes(9, b"".join(varint(n) for n in more_ns))
    elif more_ns:
        p += b"".join(f_varint(9, n) for n in more_ns)
    b = f_varint(2, world) + f_varint(3, rank) + f_varint(13, kind)
    if params:
        b += f_bytes(14, p)
    if given:
        b += f_bytes(15, b"".join(varint(x) for x in given))
    return b


def request_seeds():
    s = {}
    s["hello"] = frame(request(1, 2, hello()))
    s["hello_version_wide"] = frame(request(1, 2, hello(version=(1 << 32) + 4)))
    s["status"] = frame(request(2, 3, b""))
    s["comm_init"] = frame(request(3, 4, comm_init()))
    s["comm_init_world_wraps"] = frame(request(3, 4, comm_init(world=(1 << 32) + 2, rank=0)))
    s["comm_init_world_max"] = frame(request(3, 4, comm_init(world=1024, rank=1023)))
    s["comm_init_rank_eq_world"] = frame(request(3, 4, comm_init(world=2, rank=2)))
    s["comm_init_id_esc"] = frame(request(3, 4, comm_init(job=b"x\x1b[2Jy")))
    s["comm_init_id_c1"] = frame(request(3, 4, comm_init(job=b"x\xc2\x9by")))
    s["comm_init_id_nul"] = frame(request(3, 4, comm_init(job=b"tr\x00in")))
    s["comm_init_id_utf8"] = frame(request(3, 4, comm_init(job="j\u00e9b-\U0001f680".encode())))
    s["comm_init_id_63"] = frame(request(3, 4, comm_init(job=b"j" * 63)))
    s["comm_init_id_64"] = frame(request(3, 4, comm_init(job=b"j" * 64)))
    s["comm_init_uuid_short"] = frame(request(3, 4, comm_init(uuid=UUID[:15])))
    s["comm_destroy"] = frame(request(4, 5, f_varint(1, 1)))
    s["comm_check"] = frame(request(5, 6, f_varint(1, 1)))
    s["mem_register"] = frame(request(6, 7, mem_register()))
    s["mem_register_two_fds"] = frame(request(6, 7, mem_register(fd_count=2)))
    s["mem_register_fds_wrap"] = frame(request(6, 7, mem_register(fd_count=(1 << 32) + 1)))
    s["mem_register_zero"] = frame(request(6, 7, mem_register(nbytes=0, fd_count=0)))
    s["mem_register_ipc"] = frame(request(6, 7, mem_register(fd_count=0, ipc=bytes(64), uuid=UUID)))
    s["mem_register_ipc_long"] = frame(request(6, 7, mem_register(fd_count=0, ipc=bytes(65))))
    s["mem_deregister"] = frame(request(7, 8, f_varint(1, 1)))
    s["ag_gemm"] = frame(request(0, 14, ag_gemm()))
    s["ag_gemm_plain"] = frame(request(0, 14, ag_gemm(algo=0, chunks=0, streams=0, a_out=False)))
    s["ag_gemm_dtype_bad"] = frame(request(0, 14, ag_gemm(dtype=3)))
    s["ag_gemm_chunks_wrap"] = frame(request(0, 14, ag_gemm(chunks=(1 << 32) + 4)))
    s["ag_gemm_streams_9"] = frame(request(0, 14, ag_gemm(streams=9)))
    s["ag_gemm_m_zero"] = frame(request(0, 14, ag_gemm(m=0)))
    s["ag_gemm_3_bs"] = frame(request(0, 14, ag_gemm(more_ns=(32, 96))))
    s["ag_gemm_8_bs"] = frame(request(0, 14, ag_gemm(more_ns=(1,) * 7)))
    s["ag_gemm_9_bs"] = frame(request(0, 14, ag_gemm(more_ns=(1,) * 8)))
    s["ag_gemm_b2_n_zero"] = frame(request(0, 14, ag_gemm(more_ns=(8, 0))))
    s["op_kind_none"] = frame(request(0, 14, ag_gemm(kind=0)))
    s["op_kind_unknown"] = frame(request(0, 14, ag_gemm(kind=2)))
    s["op_slot_twice"] = frame(request(0, 14, ag_gemm(slots=(0, 1, 1, 3))))
    s["op_slot_18"] = frame(request(0, 14, ag_gemm(slots=(0, 1, 2, 18))))
    s["ag_gemm_old_field_9"] = frame(request(0, 9, b"\x08\x01"))
    s["plan"] = frame(request(8, 10, plan()))
    s["plan_world_1025"] = frame(request(8, 10, plan(world=1025, rank=0)))
    s["plan_algo_4"] = frame(request(8, 10, plan(algo=4)))
    s["plan_3_bs"] = frame(request(8, 10, plan(transb=True, more_ns=(64, 96))))
    s["plan_8_bs_unpacked"] = frame(request(8, 10, plan(more_ns=(1,) * 7, packed=False)))
    s["plan_9_bs"] = frame(request(8, 10, plan(more_ns=(1,) * 8)))
    s["plan_b2_n_zero"] = frame(request(8, 10, plan(more_ns=(8, 0))))
    s["plan_kind_none"] = frame(request(8, 10, plan(kind=0)))
    s["plan_no_params"] = frame(request(8, 10, plan(params=False)))
    s["plan_given_twice"] = frame(request(8, 10, plan(given=(3, 3))))
    s["plan_given_18"] = frame(request(8, 10, plan(given=(18,))))
    s["plan_given_a"] = frame(request(8, 10, plan(given=(0,))))
    s["gemm_rs"] = frame(request(0, 14, gemm_rs()))
    s["gemm_rs_avg_transb"] = frame(request(0, 14, gemm_rs(reduce_op=1, dtype=2)))
    s["gemm_rs_ring"] = frame(request(0, 14, gemm_rs(algo=3)))
    s["gemm_rs_reduce_2"] = frame(request(0, 14, gemm_rs(reduce_op=2)))
    s["gemm_rs_both_params"] = frame(request(0, 14, gemm_rs(with_ag=True)))
    s["plan_gemm_rs"] = frame(request(8, 10, f_varint(2, 4) + f_varint(3, 1) + f_varint(13, 2)
                                      + f_bytes(16, f_varint(1, 64) + f_varint(2, 8)
                                                + f_varint(3, 8) + f_varint(5, 2))))
    s["plan_old_fields"] = frame(request(8, 10, f_varint(1, 3) + f_varint(2, 4) + f_varint(4, 64)))
    s["stats_reset"] = frame(request(9, 11, f_varint(1, 1)))
    s["peer_ping"] = frame(request(10, 12, f_bytes(1, "10.0.0.5:7411")))
    s["peer_ping_64"] = frame(request(10, 12, f_bytes(1, "1" * 64)))
    s["peer_ping_esc"] = frame(request(10, 12, f_bytes(1, b"10.0.0.5\x1b:7411")))
    s["no_body"] = frame(f_varint(1, 10))
    s["empty"] = frame(b"")
    s["session"] = b"".join(
        frame(x) for x in [
            request(1, 2, hello()),
            request(2, 4, comm_init()),
            request(3, 7, mem_register()),
            request(4, 7, mem_register()),
            request(5, 7, mem_register()),
            request(0, 14, ag_gemm(seq=1)),
            request(0, 14, ag_gemm(seq=2, algo=1)),
            request(6, 6, f_varint(1, 1)),
            request(7, 10, plan()),
            request(8, 5, f_varint(1, 1)),
        ])
    out = {}
    for name, stream in s.items():
        out["seed_" + name + ".bin"] = b"\x00" + stream
    # the session also byte by byte, and through space/commit in random pieces
    out["seed_session_bytewise.bin"] = b"\x01" + s["session"]
    out["seed_session_socket.bin"] = b"\x83" + s["session"]
    return out


# ------------------------------------------------------------- peers

# daemon/net/peer_wire.h: handshake frames on TCP (type, length: u32 LE each),
# active messages over UCX (type, length, 16-byte session id)
HELLO, CHALLENGE, AUTH, REFUSE, PING, PONG, BYE = range(1, 8)
UCX_ADDR = bytes(range(256)) * 2  # a stand-in for a UCX worker address


def peer_frame(t, body):
    return struct.pack("<II", t, len(body)) + body


def peer_am(t, body, hdr_len=24, session=b"S" * 16, length=None):
    hdr = struct.pack("<II", t, len(body) if length is None else length) + session
    return b"\x01" + bytes([hdr_len]) + hdr[:hdr_len] + body


def peer_hello(version=2, nonce=b"n" * 32, inst=b"i" * 16, addr="10.0.0.5:7411", ucx=UCX_ADDR):
    return (f_varint(1, version) + f_bytes(2, nonce) + f_bytes(3, inst) + f_bytes(4, addr)
            + f_bytes(5, ucx))


def peer_challenge(version=2, addr="10.0.0.6:7411", mac=b"m" * 32):
    return (f_varint(1, version) + f_bytes(2, b"n" * 32) + f_bytes(3, b"j" * 16) + f_bytes(4, addr)
            + f_bytes(5, mac) + f_bytes(6, UCX_ADDR))


def peer_seeds():
    s = {}
    hs = [peer_frame(HELLO, peer_hello()), peer_frame(CHALLENGE, peer_challenge()),
          peer_frame(AUTH, f_bytes(1, b"m" * 32))]
    s["handshake"] = b"\x00" + b"".join(hs)
    s["hello_v1"] = b"\x00" + peer_frame(HELLO, peer_hello(version=1))
    s["hello_v3"] = b"\x00" + peer_frame(HELLO, peer_hello(version=3))
    s["hello_v_wide"] = b"\x00" + peer_frame(HELLO, peer_hello(version=(1 << 32) + 1))
    s["hello_wildcard"] = b"\x00" + peer_frame(HELLO, peer_hello(addr="0.0.0.0:7411"))
    s["hello_ipv6"] = b"\x00" + peer_frame(HELLO, peer_hello(addr="[fd00::5]:7411"))
    s["hello_name"] = b"\x00" + peer_frame(HELLO, peer_hello(addr="node1:7411"))
    s["hello_nonce_31"] = b"\x00" + peer_frame(HELLO, peer_hello(nonce=b"n" * 31))
    s["hello_no_ucx"] = b"\x00" + peer_frame(HELLO, peer_hello(ucx=b""))
    s["hello_ucx_max"] = b"\x00" + peer_frame(HELLO, peer_hello(ucx=b"u" * 32768))
    s["hello_ucx_over"] = b"\x00" + peer_frame(HELLO, peer_hello(ucx=b"u" * 32769))
    s["frame_over"] = b"\x00" + struct.pack("<II", HELLO, 65537)
    s["frame_type_ping"] = b"\x00" + peer_frame(PING, f_varint(1, 1))
    s["frame_type_0"] = b"\x00" + peer_frame(0, b"")
    s["refuse"] = b"\x00" + peer_frame(REFUSE, f_varint(1, (1 << 64) - 9) + f_bytes(2, "wrong key"))
    s["refuse_long"] = b"\x00" + peer_frame(REFUSE, f_bytes(2, "r" * 201))
    s["refuse_esc"] = b"\x00" + peer_frame(REFUSE, f_bytes(2, b"a\x1b[2Jb\xff"))
    s["garbage"] = b"\x00GET / HTTP/1.0\r\n\r\n"
    s["am_ping"] = peer_am(PING, f_varint(1, 7))
    s["am_pong"] = peer_am(PONG, f_varint(1, (1 << 64) - 1))
    s["am_bye"] = peer_am(BYE, f_bytes(1, "shutting down") + f_varint(2, (1 << 64) - 19))
    s["am_user"] = peer_am(16, b"\x00\x01\x02")
    s["am_user_max"] = peer_am(0xFFFFFFFF, b"")
    s["am_hello"] = peer_am(HELLO, peer_hello())
    s["am_type_8"] = peer_am(8, b"")
    s["am_hdr_8"] = peer_am(PING, b"", hdr_len=8)
    s["am_len_lies"] = peer_am(16, b"abc", length=2)
    return {"seed_" + k + ".bin": v for k, v in s.items()}


# ----------------------------------------------------------------- xfer

# daemon/net/xfer_wire.h: a type byte (type - 32, mod 16), then the body
READY, TAKEN, WITHDRAWN = 0, 1, 2


def xfer_transfer(job=b"0123456789abcdef", seq=5, index=1, frm=0, to=3):
    return (f_bytes(1, job) + f_varint(2, seq) + f_varint(3, index) + f_varint(4, frm)
            + f_varint(5, to))


def xfer_ready(t=None, addr=0x7F0000001000, nbytes=81920, rkey=b"k" * 40):
    return (f_bytes(1, xfer_transfer() if t is None else t) + f_varint(2, addr)
            + f_varint(3, nbytes) + f_bytes(4, rkey))


def xfer_status(status=0, reason=b"", t=None):
    return f_bytes(1, xfer_transfer() if t is None else t) + f_varint(2, status) + f_bytes(3, reason)


def xfer_seeds():
    s = {}
    s["ready"] = bytes([READY]) + xfer_ready()
    s["ready_0_bytes"] = bytes([READY]) + xfer_ready(nbytes=0)
    s["ready_over"] = bytes([READY]) + xfer_ready(nbytes=(1 << 40) + 1)
    s["ready_wraps"] = bytes([READY]) + xfer_ready(addr=(1 << 64) - 100)
    s["ready_no_key"] = bytes([READY]) + xfer_ready(rkey=b"")
    s["ready_key_max"] = bytes([READY]) + xfer_ready(rkey=b"k" * 16384)
    s["ready_key_over"] = bytes([READY]) + xfer_ready(rkey=b"k" * 16385)
    s["ready_job_15"] = bytes([READY]) + xfer_ready(t=xfer_transfer(job=b"x" * 15))
    s["ready_rank_wide"] = bytes([READY]) + xfer_ready(t=xfer_transfer(to=1 << 32))
    s["ready_no_transfer"] = bytes([READY]) + f_varint(3, 8)
    s["taken"] = bytes([TAKEN]) + xfer_status()
    s["taken_mismatch"] = bytes([TAKEN]) + xfer_status((1 << 64) - 13, b"rank 0 sends 8 bytes")
    s["taken_unknown"] = bytes([TAKEN]) + xfer_status((1 << 64) - 1000, b"what")
    s["taken_positive"] = bytes([TAKEN]) + xfer_status(5)
    s["taken_long"] = bytes([TAKEN]) + xfer_status((1 << 64) - 17, b"r" * 201)
    s["taken_esc"] = bytes([TAKEN]) + xfer_status((1 << 64) - 17, b"a\x1b[2Jb\xff")
    s["withdrawn"] = bytes([WITHDRAWN]) + xfer_status((1 << 64) - 17, b"rank 3 left")
    s["withdrawn_0"] = bytes([WITHDRAWN]) + xfer_status(0)
    s["type_35"] = bytes([3]) + xfer_status()
    return {"seed_" + k + ".bin": v for k, v in s.items()}


# -------------------------------------------------------------- cluster

# daemon/cluster/cluster_wire.h: a type byte (type - 16, mod 16), then the body
JOIN, JOIN_REPLY, START, OP_READY, OP_GO, LEAVE, END = range(7)
NONCE = b"0123456789abcdef"
KEY = bytes(range(128))  # a stand-in for an ncclUniqueId


def packed(num, values):
    return f_bytes(num, b"".join(varint(v) for v in values))


def cl_join(nonce=NONCE, instance=b"i" * 16, world=4, rank=1, uid=1000, backend=b"host", device=0):
    return (f_varint(1, 7) + f_bytes(2, nonce) + f_bytes(3, instance) + f_varint(4, world)
            + f_varint(5, rank) + f_varint(6, uid) + f_bytes(7, backend) + f_varint(8, device))


def cl_reply(status=0, reason=b""):
    return f_varint(1, 7) + f_varint(2, status) + f_bytes(3, reason)


def cl_start(world=4, node_of=(0, 0, 1, 1), nodes=("10.0.0.5:7411", "10.0.0.6:7411"), self_node=1,
             key=KEY, rail_keys=(), pack=True):
    b = f_bytes(1, NONCE) + f_varint(2, world)
    b += packed(3, node_of) if pack else b"".join(f_varint(3, n) for n in node_of)
    b += b"".join(f_bytes(4, n) for n in nodes) + f_varint(5, self_node)
    if key:
        b += f_bytes(6, key)
    return b + b"".join(f_bytes(7, k) for k in rail_keys)


def cl_ready(seq=3, status=0, reason=b"", first_rank=2, dtype=1, algo=3, chunks=4, streams=2, nb=1,
             more=(), nonce=NONCE):
    return (f_bytes(1, nonce) + f_varint(2, seq) + f_varint(3, status) + f_bytes(4, reason)
            + f_varint(5, first_rank) + f_varint(6, 1024) + f_varint(7, 256) + f_varint(8, 512)
            + f_varint(9, dtype) + f_varint(10, algo) + f_varint(11, chunks) + f_varint(12, streams)
            + f_varint(13, 1) + f_varint(14, 1) + f_varint(15, nb) + packed(16, more)
            + f_varint(17, 0) + f_varint(18, 1))


def cl_go(seq=3, status=0, reason=b"", algo=3, chunks=4, streams=2, allgather=0):
    return (f_bytes(1, NONCE) + f_varint(2, seq) + f_varint(3, status) + f_bytes(4, reason)
            + f_varint(5, algo) + f_varint(6, chunks) + f_varint(7, streams)
            + f_varint(8, allgather) + f_varint(9, 1) + f_varint(10, 0))


def cl_leave(rank=1, abort=0, reason=b"the client left"):
    return f_bytes(1, NONCE) + f_varint(2, rank) + f_varint(3, abort) + f_bytes(4, reason)


def cl_end(abort=1, status=-17, reason=b"rank 1 left the job"):
    return f_bytes(1, NONCE) + f_varint(2, abort) + f_varint(3, status) + f_bytes(4, reason)


def cluster_seeds():
    s = {}
    s["join"] = bytes([JOIN]) + cl_join()
    s["join_world_max"] = bytes([JOIN]) + cl_join(world=1024, rank=1023, backend=b"cuda", device=7)
    s["join_world_0"] = bytes([JOIN]) + cl_join(world=0, rank=0)
    s["join_world_1025"] = bytes([JOIN]) + cl_join(world=1025, rank=0)
    s["join_rank_eq_world"] = bytes([JOIN]) + cl_join(world=2, rank=2)
    s["join_uid_wide"] = bytes([JOIN]) + cl_join(uid=1 << 32)
    s["join_device_wide"] = bytes([JOIN]) + cl_join(device=1 << 32)
    s["join_backend_15"] = bytes([JOIN]) + cl_join(backend=b"b" * 15)
    s["join_backend_16"] = bytes([JOIN]) + cl_join(backend=b"b" * 16)
    s["join_backend_empty"] = bytes([JOIN]) + cl_join(backend=b"")
    s["join_backend_esc"] = bytes([JOIN]) + cl_join(backend=b"h\x1b[2J\xff")
    s["join_nonce_15"] = bytes([JOIN]) + cl_join(nonce=NONCE[:15])
    s["join_instance_17"] = bytes([JOIN]) + cl_join(instance=b"i" * 17)
    s["reply"] = bytes([JOIN_REPLY]) + cl_reply()
    s["reply_refused"] = bytes([JOIN_REPLY]) + cl_reply(-11, b"rank 1 of job 0123 already joined")
    s["reply_unknown"] = bytes([JOIN_REPLY]) + cl_reply(-1000, b"what")
    s["reply_positive"] = bytes([JOIN_REPLY]) + cl_reply(5)
    s["reply_long"] = bytes([JOIN_REPLY]) + cl_reply(-4, "\u00e9".encode() * 150)
    s["reply_esc"] = bytes([JOIN_REPLY]) + cl_reply(-4, b"a\x1b[2Jb\xff\xe2\x80\xae")
    s["start"] = bytes([START]) + cl_start()
    s["start_host"] = bytes([START]) + cl_start(key=b"")
    s["start_unpacked"] = bytes([START]) + cl_start(pack=False)
    s["start_ipv6"] = bytes([START]) + cl_start(nodes=("[fd00::5]:7411", "[fd00::6]:7411"))
    s["start_rails"] = bytes([START]) + cl_start(key=b"", rail_keys=(KEY, KEY))
    s["start_rails_3"] = bytes([START]) + cl_start(key=b"", rail_keys=(KEY, KEY, KEY))
    s["start_rails_and_key"] = bytes([START]) + cl_start(rail_keys=(KEY, KEY))
    s["start_rails_over"] = bytes([START]) + cl_start(key=b"", rail_keys=(KEY,) * 5)
    s["start_rail_key_127"] = bytes([START]) + cl_start(key=b"", rail_keys=(KEY, KEY[:127]))
    s["start_key_127"] = bytes([START]) + cl_start(key=KEY[:127])
    s["start_world_0"] = bytes([START]) + cl_start(world=0, node_of=())
    s["start_world_1025"] = bytes([START]) + cl_start(world=1025, node_of=(0,) * 1025)
    s["start_node_of_short"] = bytes([START]) + cl_start(node_of=(0, 0, 1))
    s["start_node_of_out"] = bytes([START]) + cl_start(node_of=(0, 0, 1, 2))
    s["start_node_no_rank"] = bytes([START]) + cl_start(node_of=(0, 0, 0, 0))
    s["start_self_out"] = bytes([START]) + cl_start(self_node=2)
    s["start_addr_empty"] = bytes([START]) + cl_start(nodes=("10.0.0.5:7411", ""))
    s["start_addr_63"] = bytes([START]) + cl_start(nodes=("10.0.0.5:7411", "1" * 63))
    s["start_addr_64"] = bytes([START]) + cl_start(nodes=("10.0.0.5:7411", "1" * 64))
    s["start_addr_esc"] = bytes([START]) + cl_start(nodes=("10.0.0.5:7411", b"10.0.0.6\x00:7411"))
    s["start_nodes_over"] = bytes([START]) + cl_start(world=2, node_of=(0, 1),
                                                       nodes=("a:1", "b:1", "c:1"))
    s["ready"] = bytes([OP_READY]) + cl_ready()
    s["ready_8_bs"] = bytes([OP_READY]) + cl_ready(nb=8, more=(1, 2, 3, 4, 5, 6, (1 << 64) - 1))
    s["ready_9_bs"] = bytes([OP_READY]) + cl_ready(nb=9, more=(1,) * 8)
    s["ready_0_bs"] = bytes([OP_READY]) + cl_ready(nb=0)
    s["ready_more_short"] = bytes([OP_READY]) + cl_ready(nb=3, more=(64,))
    s["ready_first_rank_wide"] = bytes([OP_READY]) + cl_ready(first_rank=1 << 32)
    s["ready_dtype_wide"] = bytes([OP_READY]) + cl_ready(dtype=1 << 32)
    s["ready_streams_wide"] = bytes([OP_READY]) + cl_ready(streams=(1 << 32) + 2)
    s["ready_failed"] = bytes([OP_READY]) + cl_ready(status=-14, reason=b"B 1 outside its buffer")
    s["ready_status_unknown"] = bytes([OP_READY]) + cl_ready(status=-22)
    s["ready_status_positive"] = bytes([OP_READY]) + cl_ready(status=1)
    s["ready_nonce_0"] = bytes([OP_READY]) + cl_ready(nonce=b"")
    s["go"] = bytes([OP_GO]) + cl_go()
    s["go_edges"] = bytes([OP_GO]) + cl_go(algo=3, chunks=64, streams=8, allgather=2)
    s["go_auto"] = bytes([OP_GO]) + cl_go(algo=0)
    s["go_algo_4"] = bytes([OP_GO]) + cl_go(algo=4)
    s["go_chunks_65"] = bytes([OP_GO]) + cl_go(chunks=65)
    s["go_streams_9"] = bytes([OP_GO]) + cl_go(streams=9)
    s["go_allgather_bad"] = bytes([OP_GO]) + cl_go(allgather=99)
    s["go_failed"] = bytes([OP_GO]) + cl_go(status=-13, reason=b"ranks disagree on m", algo=99)
    s["go_status_unknown"] = bytes([OP_GO]) + cl_go(status=-99)
    s["leave"] = bytes([LEAVE]) + cl_leave()
    s["leave_no_rank"] = bytes([LEAVE]) + cl_leave(rank=(1 << 32) - 1, abort=1)
    s["leave_rank_wide"] = bytes([LEAVE]) + cl_leave(rank=1 << 32)
    s["leave_long"] = bytes([LEAVE]) + cl_leave(reason=b"r" * 300)
    s["end"] = bytes([END]) + cl_end()
    s["end_ended"] = bytes([END]) + cl_end(abort=0, status=-17, reason=b"")
    s["end_status_0"] = bytes([END]) + cl_end(status=0)
    s["end_unknown"] = bytes([END]) + cl_end(status=-1000)
    s["type_23"] = bytes([7]) + cl_end()
    s["garbage"] = bytes([START]) + b"\xff" * 12
    return {"seed_" + k + ".bin": v for k, v in s.items()}


# ------------------------------------------------------------- doorbell

# opcodes of fuzz_doorbell.c
STORE, RAW, ISSUE, ISSUE_NOMEM, STEP, READY, RELEASE, OVERWRITE = range(8)
F_READY, F_DONE, F_ERROR, F_WAKE, F_ERROR_SEQ = range(5)


def store(field, value):
    return bytes([STORE, field]) + struct.pack("<Q", value & ((1 << 64) - 1))


def doorbell_seeds():
    s = {}
    # the client leaves with an op waiting, then writes ready = 0
    s["hostile_ready"] = bytes([0, ISSUE, 0, STEP, RELEASE]) + store(F_READY, 0) + bytes([STEP, STEP])
    # a well-behaved session: ready, wait, done, three ops
    s["session"] = bytes([0]) + bytes([ISSUE, 0, READY, 0, STEP, STEP] * 3)
    # done written ahead of ovld by the client, rings out of order
    s["done_ahead"] = (bytes([0]) + store(F_DONE, (1 << 64) - 1)
                       + bytes([ISSUE, 0, ISSUE, 5, ISSUE_NOMEM, READY, 2, STEP, STEP, STEP, STEP]))
    # the error word set by the client before the first failure
    s["error_preset"] = bytes([0]) + store(F_ERROR, 1) + bytes([ISSUE, 7, READY, 0, STEP, STEP])
    # the wake counter about to wrap
    s["wake_wrap"] = bytes([0]) + store(F_WAKE, 0xFFFFFFFF) + bytes([ISSUE, 0, READY, 0, STEP, STEP])
    # a page of 0xff, base seq near 2^32
    s["page_ff"] = bytes([0xFF, ISSUE, 1, STEP, RELEASE, STEP, STEP])
    s["base_2p32"] = bytes([0x41, ISSUE, 0, ISSUE, 0, READY, 1, STEP, STEP, STEP])
    # unaligned raw writes across ready/done, and an overwrite of the head
    s["raw_unaligned"] = (bytes([0, ISSUE, 0, RAW, 5, 0, 7]) + bytes(range(1, 9))
                          + bytes([STEP, OVERWRITE, 24]) + bytes([0xAB] * 24) + bytes([STEP, STEP]))
    # slots written (ovld ignores them on the host backend)
    s["slots"] = (bytes([0]) + store(5, 1) + store(5 + 64, 1) + store(5 + 63, (1 << 63))
                  + bytes([ISSUE, 0, STEP, RELEASE]))
    # a full stream queue, then the release
    s["full_queue"] = bytes([0]) + bytes([ISSUE, 0] * 40) + bytes([RELEASE])
    return {"seed_" + k + ".bin": v for k, v in s.items()}


# --------------------------------------------------------------- config


def config_seeds(root):
    with open(os.path.join(root, "deploy", "ovld.conf"), "rb") as f:
        sample = f.read()
    # the sample's commented-out settings, "# key = value", uncommented
    every = b"".join(
        line[2:] + b"\n" for line in sample.splitlines()
        if re.fullmatch(rb"# [a-z_]+ = [^ ]+", line))
    s = {}
    s["ovld"] = sample
    s["every_key"] = every + b"socket_group = ovl\n"
    s["every_key_crlf"] = (every + b"socket_group = ovl\n").replace(b"\n", b"\r\n")
    s["no_final_newline"] = b"max_jobs = 5\nlog_level = debug"
    s["sizes"] = b"max_frame_bytes = 64MiB\nmax_mapped_bytes = 16T\nmax_mapped_bytes_per_uid = 4kb\n"
    s["auto"] = b"max_mappings = auto\ndefault_algo = ring\ndefault_chunks = 64\ndefault_streams = 8\n"
    s["limits"] = (b"max_connections_per_uid = 65536\nmax_jobs_per_uid = 1\nmax_ranks_per_uid = 65536\n"
                   b"max_registrations_per_uid = 1048576\nmax_mappings = 16777216\n"
                   b"hello_timeout_ms = 100\n")
    s["duplicate"] = b"max_jobs = 5\n\n# again\nmax_jobs = 6\n"
    s["unknown_key"] = b"log_level = info\nmax_job = 5\n"
    s["no_equals"] = b"backend host\n"
    s["empty_value"] = b"backend =\n"
    s["out_of_range"] = b"hello_timeout_ms = 99\n"
    s["overflow"] = b"max_mapped_bytes = 18446744073709551616\n"
    s["control"] = b"socket = /run/ovl/\x1b[2J.sock\n"
    s["long_line"] = b"# " + b"x" * 4100 + b"\n"
    s["long_socket"] = b"socket = /" + b"p" * 120 + b"\n"
    return {"seed_" + k + ".conf": v for k, v in s.items()}


def write(d, files):
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    print(f"{d}: {len(files)} seeds")


def main():
    here = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__))
    root = os.path.dirname(os.path.dirname(here))
    write(os.path.join(here, "corpus_request"), request_seeds())
    write(os.path.join(here, "corpus_doorbell"), doorbell_seeds())
    write(os.path.join(here, "corpus_config"), config_seeds(root))
    write(os.path.join(here, "corpus_peer"), peer_seeds())
    write(os.path.join(here, "corpus_xfer"), xfer_seeds())
    write(os.path.join(here, "corpus_cluster"), cluster_seeds())


if __name__ == "__main__":
    main()
