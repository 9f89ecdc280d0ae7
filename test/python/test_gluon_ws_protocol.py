"""The warp-specialized Gluon GEMM's synchronization (kforge.providers.builtin.gluon_ws), run on
the CPU: the generated partitions' own source (loader and consumers, as the template writes
them) executed as Python threads against a model of Hopper's mbarriers, TMA loads and
asynchronous wgmma groups. No GPU runs Gluon here, and a barrier mistake would hang the GPU
for the verifier's whole time limit; this finds it first.

The model: an mbarrier has a phase, an arrival count and a transaction count; `wait(bar, p)`
passes once the phase of parity p has completed (a fresh barrier counts as its phase of parity
1 done); `expect` arrives and adds bytes, a TMA load writes its tile's coordinates into the
stage and completes its bytes. A wgmma records which stage and coordinates it read and stays
in flight until `warpgroup_mma_wait` retires it; a TMA load into a stage that an in-flight
wgmma still reads is a race. The epilogue is replaced by a check that the consumer's
accumulator read exactly its tile's rows and columns at every K step, in order.
"""
from __future__ import annotations

import threading
import types

import numpy as np
import pytest

from kforge.providers.builtin import gluon_ws

TIMEOUT_S = 20.0


class Deadlock(Exception):
    pass


class Barrier:
    def __init__(self, sim):
        self.sim, self.count, self.pending, self.tx, self.phase = sim, 0, 0, 0, 0

    def init(self, count):
        self.count = self.pending = count

    def _progress(self):            # under the lock
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count
            self.sim.cond.notify_all()

    def arrive(self, tx=0):
        with self.sim.cond:
            self.tx += tx
            self.pending -= 1
            assert self.pending >= 0, "more arrivals than the barrier's count"
            self._progress()

    def complete_tx(self, nbytes):
        with self.sim.cond:
            self.tx -= nbytes
            assert self.tx >= 0, "more bytes than expected"
            self._progress()

    def wait(self, parity):
        with self.sim.cond:
            # the phase of this parity is done once the current phase's parity differs
            if not self.sim.cond.wait_for(lambda: self.phase % 2 != parity or self.sim.failed,
                                          timeout=TIMEOUT_S):
                self.sim.failed = True
                self.sim.cond.notify_all()
                raise Deadlock("an mbarrier wait never completed")
            if self.sim.failed:
                raise Deadlock("another partition failed")


class Smem:
    """A [stages, rows, cols] shared buffer (or one stage, or a row slice of one)."""

    def __init__(self, sim, stages, rows=0, row0=0, cells=None, slot=None, barriers=None):
        self.sim, self.rows, self.row0, self.slot = sim, rows, row0, slot
        self.cells = cells if cells is not None else [None] * stages
        self.barriers = barriers

    def index(self, i):
        if self.barriers is not None:
            return self.barriers[i]
        return Smem(self.sim, 0, self.rows, 0, self.cells, i)

    def slice(self, start, length, dim=0):
        return Smem(self.sim, 0, length, self.row0 + start, self.cells, self.slot)

    def permute(self, order):
        return self


class Acc:
    def __init__(self):
        self.reads = []


def make_sim(M, N, K, programs):
    sim = types.SimpleNamespace(cond=threading.Condition(), failed=False, inflight={},
                                done=[], errors=[], M=M, N=N, K=K)

    def program_id(axis):
        return sim.local.pid

    def warp_specialize(parts, warps, regs):
        threads = []
        for fn, args in parts:
            def run(fn=fn, args=args, pid=sim.local.pid):
                sim.local.pid = pid
                sim.local.inflight = []
                try:
                    fn(*args)
                except Exception as exc:   # noqa: BLE001 - recorded, the test fails on it
                    with sim.cond:
                        sim.failed = True
                        sim.errors.append(repr(exc))
                        sim.cond.notify_all()
            threads.append(threading.Thread(target=run, daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(3 * TIMEOUT_S)
            if t.is_alive():
                sim.failed = True
                sim.errors.append("a partition did not finish")

    def allocate_shared_memory(dtype, shape, layout):
        if dtype is gl.int64:
            return Smem(sim, shape[0], barriers=[Barrier(sim) for _ in range(shape[0])])
        return Smem(sim, shape[0], shape[1])

    def load(desc, coord, bar, dst):
        with sim.cond:
            for owner, reading in sim.inflight.items():
                for slot, cells in reading:
                    assert not (cells is dst.cells and slot == dst.slot), \
                        f"a TMA load into stage {dst.slot} while a wgmma of {owner} reads it"
            dst.cells[dst.slot] = (desc, tuple(coord))
        bar.complete_tx(desc[2])

    def mma(a, b, acc, use_acc=True, is_async=False):
        me = threading.get_ident()
        with sim.cond:
            entry = (a.cells[a.slot], a.row0, a.rows, b.cells[b.slot])
            sim.local.inflight += [(a.slot, a.cells), (b.slot, b.cells)]
            sim.inflight[me] = list(sim.local.inflight)
        out = Acc()
        out.reads = (acc.reads if use_acc else []) + [entry]
        return out

    def mma_wait(num_outstanding=0, deps=()):
        me = threading.get_ident()
        with sim.cond:
            pending = sim.local.inflight          # two entries (A's and B's stage) a group
            del pending[:max(0, len(pending) - 2 * num_outstanding)]
            sim.inflight[me] = list(pending)
        return deps[0]

    gl = types.SimpleNamespace(
        constexpr=object, int64=object(), float32="f32", bfloat16="bf16", float16="f16",
        cdiv=lambda a, b: -(-a // b), minimum=min, program_id=program_id,
        num_programs=lambda axis: programs, static_range=range,
        zeros=lambda shape, dtype, layout: Acc(), arange=lambda a, b, layout=None: np.arange(a, b),
        NVMMADistributedLayout=lambda **kw: None, BlockedLayout=lambda *a: None,
        NVMMASharedLayout=lambda **kw: None, allocate_shared_memory=allocate_shared_memory,
        warp_specialize=warp_specialize)
    tma = types.SimpleNamespace(
        make_tensor_descriptor=lambda base, shape, strides, block, layout:
            (base, tuple(block), block[0] * block[1] * 2),
        async_copy_global_to_shared=load)
    mbarrier = types.SimpleNamespace(
        MBarrierLayout=lambda: None, init=lambda bar, count: bar.init(count),
        expect=lambda bar, nbytes: bar.arrive(tx=nbytes), wait=lambda bar, p: bar.wait(p),
        arrive=lambda bar, pred=True: bar.arrive() if pred else None)
    sim.local = threading.local()
    sim.ns = {"gl": gl, "tma": tma, "mbarrier": mbarrier, "warpgroup_mma": mma,
              "warpgroup_mma_wait": mma_wait, "warpgroup_mma_init": lambda x: x,
              "gluon": types.SimpleNamespace(jit=lambda f: f)}
    return sim


def run_kernel(M, N, K, programs, pingpong, stages, paired=False):
    config = dict(gluon_ws.PINGPONG if pingpong else gluon_ws.CONFIG, STAGES=stages)
    sim = make_sim(M, N, K, programs)

    def check(acc, pid_m, pid_n, role):
        BM, BN, BK = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
        rows = BM if pingpong else BM // 2
        row0 = 0 if pingpong else role * rows
        want = [((("A", (BM, BK), BM * BK * 2), (pid_m * BM, k * BK)), row0, rows,
                 (("B", (BN, BK), BN * BK * 2), (pid_n * BN, k * BK)))
                for k in range(-(-K // BK))]
        assert acc.reads == want, (pid_m, pid_n, role, acc.reads[:2], want[:2])
        with sim.cond:
            sim.done.append((pid_m, pid_n, role))

    sim.ns["_check"] = check
    src = gluon_ws.kernel_source("k", ["A", "B", "C"], "A", "B", M, N, K,
                                 ["        _check(acc, pid_m, pid_n, ROLE)"],
                                 pingpong=pingpong, paired=paired)
    exec(compile(src, "<gluon_ws template>", "exec"), sim.ns)
    consts = {k: config[k] for k in gluon_ws.CONSTS if k != "EPI_N"}
    consts["EPI_N"] = config["BLOCK_N"] // config["EPI_SPLIT"]
    for pid in range(programs):
        sim.local.pid = pid
        sim.ns["k"]("A", "B", "C", sim.ns["k_load_old"], **consts)
        assert not sim.errors, sim.errors
    return sim, config


@pytest.mark.parametrize("pingpong", [False, True], ids=["cooperative", "pingpong"])
@pytest.mark.parametrize("stages", [2, 3])
def test_every_tile_is_read_in_order_without_races_or_deadlock(pingpong, stages):
    """Ragged sizes (M, N and K not multiples of the tile), fewer programs than tiles, an odd
    number of tiles a program (ping-pong's second consumer then has one tile fewer): every
    tile's rows are computed once by the consumer(s) that own them, from the stages holding
    exactly that tile's K steps in order, no TMA load lands in a stage an in-flight wgmma
    reads, and every wait completes."""
    M, N, K = 1000, 600, 640 + 24
    programs = 4
    sim, config = run_kernel(M, N, K, programs, pingpong, stages)
    tiles = [(m, n) for m in range(-(-M // config["BLOCK_M"]))
             for n in range(-(-N // config["BLOCK_N"]))]
    roles = (0,) if pingpong else (0, 1)
    if pingpong:
        assert sorted((m, n) for m, n, _ in sim.done) == sorted(tiles)
        assert {r for _, _, r in sim.done} == {0, 1}          # both consumers took tiles
    else:
        assert sorted(sim.done) == sorted((m, n, r) for m, n in tiles for r in roles)


def test_the_model_catches_a_barrier_mistake(monkeypatch):
    """The model can fail: consumers that never release a stage leave the loader waiting for
    the second round of the ring, and the run is reported as a deadlock."""
    monkeypatch.setattr(__import__(__name__), "TIMEOUT_S", 2.0)
    release = "mbarrier.arrive(empty.index(prev), pred=k > 0)"
    assert release in gluon_ws._HELPERS
    monkeypatch.setattr(gluon_ws, "_HELPERS", gluon_ws._HELPERS.replace(release, "pass"))
    with pytest.raises(AssertionError, match="Deadlock|did not finish"):
        run_kernel(512, 512, 64 * 12, 2, False, 2)


def test_paired_tiles_walk_both_weights_rows():
    """PAIRED (SwiGLU's two products in one tile, the weights' rows interleaved by BLOCK_N / 2
    in one [2N, K] operand): N / (BLOCK_N / 2) tiles across, tile n reading B's rows
    [n * BLOCK_N, (n + 1) * BLOCK_N), each read once by both consumers, in order, without races
    or deadlock (ragged M and K)."""
    M, N, K = 1000, 640, 640 + 24
    sim, config = run_kernel(M, N, K, 3, False, 3, paired=True)
    across = N // (config["BLOCK_N"] // 2)
    tiles = [(m, n) for m in range(-(-M // config["BLOCK_M"])) for n in range(across)]
    assert sorted(sim.done) == sorted((m, n, r) for m, n in tiles for r in (0, 1))
    src = gluon_ws.kernel_source("k", ["A", "B"], "A", "B", M, N, K, [], paired=True)
    assert f"[{2 * N}, {K}]" in src and f"num_pid_n = {N} // (BLOCK_N // 2)" in src
