"""nki.isa and nki.collectives names between NeuronCores, in trnsim's world of one
NeuronCore (rank 0): values against numpy, other ranks or cores refused by name."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.collectives as ncc
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.compute.machine import rng_state_words
from trnsim.nki import KernelError

RNG = np.random.default_rng(23)
A = RNG.standard_normal((64, 32)).astype(np.float32)
B = RNG.standard_normal((64, 32)).astype(np.float32)


def test_sendrecv_to_this_rank_is_a_copy_and_another_peer_is_refused():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        got = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=t, dst=got, send_to_rank=0, recv_from_rank=0, pipe_id=0)
        nl.store(out, got)
        return out

    @nki.jit
    def peer_one(a):
        t = nl.load(a)
        nisa.sendrecv(t, t, 1, 0, 0)
        return None

    np.testing.assert_array_equal(k(A), A)
    with pytest.raises(KernelError, match=r"sendrecv: send_to_rank=1 names another rank"):
        peer_one(A)


def test_core_barrier_orders_the_work_around_it_and_other_cores_are_refused():
    @nki.jit(chip="trn2")
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        nisa.core_barrier(out, (0,))
        t = nl.load(out)
        nl.store(out, nl.multiply(t, 2.0))
        return out

    @nki.jit(chip="trn2")
    def two_cores(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nisa.core_barrier(data=out, cores=(0, 1))
        return out

    np.testing.assert_array_equal(k(A), A * np.float32(2.0))
    with pytest.raises(KernelError, match=r"core_barrier over cores \[0, 1\]: .*cores \[1\] do not exist"):
        two_cores(A)


@pytest.mark.parametrize("chip, engine, words", [("trn2", None, 6), ("trn3", "vector", 24)])
def test_rand_get_state_writes_the_simulated_generators_state(chip, engine, words):
    @nki.jit(chip=chip)
    def k(seeds):
        out = nl.ndarray((32, words), nl.uint32, buffer=nl.shared_hbm)
        nisa.set_rng_seed(nl.load(seeds))
        state = nl.ndarray((32, words), nl.uint32, buffer=nl.sbuf)
        nisa.rand_get_state(state, engine=nisa.vector_engine if engine else None)
        nl.store(out, state)
        return out

    seeds = np.array([[7, 11]], dtype=np.uint32)
    expected = rng_state_words(np.random.default_rng([7, 11]), words)
    np.testing.assert_array_equal(k(seeds), np.broadcast_to(expected, (32, words)))
    words_of_seed_0 = rng_state_words(np.random.default_rng(0), 8)
    assert words_of_seed_0[:4].tolist() != expected[:4].tolist()


def test_rand_get_state_checks_its_destination():
    @nki.jit(chip="trn2")
    def wrong(a):
        state = nl.ndarray((32, 5), nl.uint32, buffer=nl.sbuf)
        nisa.rand_get_state(state, engine=nisa.gpsimd_engine)
        return None

    with pytest.raises(KernelError, match=r"dst has 5 elements per partition; the GPSIMD engine's state is 6"):
        wrong(A)


def test_implicit_permutes_over_a_ring_of_one_rank():
    group = ncc.ReplicaGroup([[0]])

    @nki.jit
    def k(a, b):
        moved = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        reduced = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        ncc.collective_permute_implicit([[a]], [[moved]], group)
        assert ncc.collective_permute_implicit_current_processing_rank_id(0) == 0
        ncc.collective_permute_implicit_reduce([[a]], [[nl.load(b)]], [[reduced]], group, op=nl.maximum)
        return moved, reduced

    @nki.jit
    def ring_of_two(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        ncc.collective_permute_implicit([[a]], [[out]], ncc.ReplicaGroup([[0, 1]]))
        return out

    moved, reduced = k(A, B)
    np.testing.assert_array_equal(moved, A)
    np.testing.assert_array_equal(reduced, np.maximum(A, B))
    with pytest.raises(KernelError, match=r"collective_permute_implicit over ranks \[0, 1\]"):
        ring_of_two(A)


@pytest.mark.parametrize("name", ["all_gather_v", "all_to_all_v"])
def test_metadata_driven_collectives_stay_refused_naming_themselves(name):
    with pytest.raises(KernelError, match=rf"nki\.collectives\.{name} is not supported by trnsim: .*metadata tensor"):
        getattr(ncc, name)()
