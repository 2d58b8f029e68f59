"""The decode step kept on the device (Context.select_device, fetch_device)
on the CUDA backend, through the host fake of the plug-in that CTest builds:
its "device" memory is host memory the fake registers, handed to the binding
as objects with __cuda_array_interface__ (what CuPy and Numba arrays offer;
CUDA torch tensors are read through data_ptr the same way). The selection and
the fetched rows must equal the host-positions calls'. Skipped outside CTest
(PQ_FAKE_CUDA_PLUGIN names the fake)."""

import ctypes
import os

import numpy as np
import pytest

import pqcache

FAKE = os.environ.get("PQ_FAKE_CUDA_PLUGIN")
pytestmark = pytest.mark.skipif(
    not FAKE, reason="PQ_FAKE_CUDA_PLUGIN is not set: run through CTest, which builds the fake")


class FakeDeviceArray:
    """An array in the fake's device memory, with __cuda_array_interface__."""

    def __init__(self, lib, shape, dtype):
        self.lib, self.shape, self.dtype = lib, tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
        self.ptr = lib.pq_fake_cuda_malloc(max(self.nbytes, 1))
        assert self.ptr, "the fake could not allocate"

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "strides": None, "version": 3}

    def host(self):
        """A numpy view of the memory (it is host memory in the fake)."""
        buf = (ctypes.c_char * self.nbytes).from_address(self.ptr)
        return np.frombuffer(buf, self.dtype).reshape(self.shape)

    def __del__(self):
        self.lib.pq_fake_cuda_free(ctypes.c_void_p(self.ptr))


@pytest.fixture(scope="module")
def fake():
    lib = ctypes.CDLL(FAKE)  # the instance libpqcache loads: one set of allocations
    lib.pq_fake_cuda_malloc.restype = ctypes.c_void_p
    lib.pq_fake_cuda_malloc.argtypes = [ctypes.c_size_t]
    lib.pq_fake_cuda_free.argtypes = [ctypes.c_void_p]
    return lib


def make(backend, **kw):
    options = dict(sink_tokens=4, local_tokens=16, topk_tokens=24, pq_subspaces=4,
                   kmeans_iterations=5, worker_threads=1, backend=backend)
    if backend == "cuda":
        options["cuda_plugin_path"] = FAKE
    options.update(kw)
    return pqcache.Context(1, 8, 2, 32, "f16", **options)


def test_device_step_equals_the_host_step(fake):
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((500, 2, 32)).astype(np.float16)
    values = rng.standard_normal((500, 2, 32)).astype(np.float16)
    query = rng.standard_normal((8, 32)).astype(np.float16)
    with make("cpu") as cpu, make("cuda") as cuda:
        assert cuda.backend() == "cuda"
        for ctx in (cpu, cuda):
            ctx.add_sequence(1)
            ctx.prefill(1, 0, keys, values)
            ctx.wait_builds()
        want = cpu.select(1, 0, query)
        k_want, v_want = cpu.fetch(1, 0, want)
        cap = cuda.capacity(1, 0)
        positions = FakeDeviceArray(fake, (2, cap), np.int32)
        counts = FakeDeviceArray(fake, (2,), np.int32)
        dq = FakeDeviceArray(fake, (8, 32), np.float16)
        dq.host()[:] = query
        sel = pqcache.DeviceSelection(positions, counts)
        assert cuda.select_device(1, 0, dq, sel) is sel
        dk = FakeDeviceArray(fake, (2, cap, 32), np.float16)
        dv = FakeDeviceArray(fake, (2, cap, 32), np.float16)
        dk.host()[:] = 0
        dv.host()[:] = 0
        cuda.fetch_device(1, 0, sel, dk, dv)
        fake.pq_fake_cuda_synchronize_all()
        assert counts.host().tolist() == want.counts.tolist()
        for h in range(2):
            n = want.counts[h]
            assert positions.host()[h, :n].tolist() == want.positions[h, :n].tolist()
            assert np.array_equal(dk.host()[h, :n], k_want[h, :n])
            assert np.array_equal(dv.host()[h, :n], v_want[h, :n])


def test_multi_token_select_on_the_device_equals_the_host(fake):
    rng = np.random.default_rng(5)
    keys = rng.standard_normal((700, 2, 32)).astype(np.float16)
    queries = rng.standard_normal((3, 8, 32)).astype(np.float16)
    with make("cpu") as cpu, make("cuda") as cuda:
        for ctx in (cpu, cuda):
            ctx.add_sequence(1)
            ctx.prefill(1, 0, keys, keys)
            ctx.wait_builds()
        dq = FakeDeviceArray(fake, (3, 8, 32), np.float16)
        dq.host()[:] = queries
        for rows in ("per_token", "per_head", "per_request"):
            want_positions, want_counts = cpu.select_multi(1, 0, queries, rows=rows)
            n_rows, cap = cuda.selection_capacity_multi(1, 0, 3, rows)
            positions = FakeDeviceArray(fake, (n_rows, cap), np.int32)
            counts = FakeDeviceArray(fake, (n_rows,), np.int32)
            sel = pqcache.DeviceSelection(positions, counts)
            assert cuda.select_multi_device(1, 0, dq, sel, rows=rows) is sel
            fake.pq_fake_cuda_synchronize_all()
            assert counts.host().tolist() == want_counts.tolist(), rows
            assert positions.host().tolist() == want_positions.tolist(), rows
        with pytest.raises(pqcache.PQError) as e:
            cpu.select_multi_device(1, 0, dq, sel, rows="per_request")
        assert e.value.status_name == "PQ_ERR_UNSUPPORTED"
        with pytest.raises(ValueError, match="rows"):
            cuda.select_multi_device(1, 0, dq, sel, rows="per_layer")


def test_device_step_refusals(fake):
    with make("cpu") as cpu, make("cuda") as cuda:
        for ctx in (cpu, cuda):
            ctx.add_sequence(1)
            ctx.prefill(1, 0, np.ones((100, 2, 32), np.float16), np.ones((100, 2, 32), np.float16))
        positions = FakeDeviceArray(fake, (2, 40), np.int32)
        counts = FakeDeviceArray(fake, (2,), np.int32)
        sel = pqcache.DeviceSelection(positions, counts)
        dq = FakeDeviceArray(fake, (8, 32), np.float16)
        with pytest.raises(pqcache.PQError) as e:
            cpu.select_device(1, 0, dq, sel)
        assert e.value.status_name == "PQ_ERR_UNSUPPORTED"
        assert "CUDA backend" in e.value.message
        # numpy arrays are host memory: refused before the library sees them.
        with pytest.raises(TypeError, match="device arrays"):
            cuda.select_device(1, 0, np.zeros((8, 32), np.float16), sel)
        with pytest.raises(TypeError, match="int32"):
            pqcache.DeviceSelection(FakeDeviceArray(fake, (2, 40), np.float32), counts)
        with pytest.raises(ValueError, match="entries for 2 rows"):
            pqcache.DeviceSelection(positions, FakeDeviceArray(fake, (3,), np.int32))
        small = pqcache.DeviceSelection(FakeDeviceArray(fake, (2, 3), np.int32), counts)
        with pytest.raises(pqcache.PQError) as e:
            cuda.select_device(1, 0, dq, small)
        assert e.value.status_name == "PQ_ERR_BUFFER_TOO_SMALL"


class TorchLikeCudaTensor:
    """What pqcache.device reads of a CUDA torch tensor (data_ptr, is_cuda,
    dtype, shape, stride), over the fake's device memory: the torch path of
    the binding, tested without a GPU. test_torch_batch_on_a_gpu runs the
    real thing where torch sees a CUDA device."""

    class _Dtype:
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return self.name

    def __init__(self, array, torch_dtype):
        self.array, self.is_cuda = array, True
        self.dtype = self._Dtype(torch_dtype)
        self.shape = array.shape
        self.device = "cuda:0"

    def data_ptr(self):
        return self.array.ptr

    def stride(self):
        strides, step = [], 1
        for extent in reversed(self.shape):
            strides.insert(0, step)
            step *= extent
        return tuple(strides)


def test_batched_device_step_equals_the_host_step_per_sequence(fake):
    rng = np.random.default_rng(7)
    seqs = [11, 12, 13]
    with make("cpu") as cpu, make("cuda") as cuda:
        for s in seqs:
            n = 300 + 57 * (s - 11)
            keys = rng.standard_normal((n, 2, 32)).astype(np.float16)
            values = rng.standard_normal((n, 2, 32)).astype(np.float16)
            for ctx in (cpu, cuda):
                ctx.add_sequence(s)
                ctx.prefill(s, 0, keys, values)
        for ctx in (cpu, cuda):
            ctx.wait_builds()
        queries = [rng.standard_normal((8, 32)).astype(np.float16) for _ in seqs]
        wants = [cpu.select(s, 0, q) for s, q in zip(seqs, queries)]
        cap = max(cuda.capacity(s, 0) for s in seqs)
        t = lambda shape, np_dtype, torch_dtype: TorchLikeCudaTensor(  # noqa: E731
            FakeDeviceArray(fake, shape, np_dtype), torch_dtype)
        dqs = [t((8, 32), np.float16, "torch.float16") for _ in seqs]
        for dq, q in zip(dqs, queries):
            dq.array.host()[:] = q
        sels = [pqcache.DeviceSelection(t((2, cap), np.int32, "torch.int32"),
                                        t((2,), np.int32, "torch.int32")) for _ in seqs]
        cuda.select_device_batch(0, seqs, dqs, sels)
        dks = [t((2, cap, 32), np.float16, "torch.float16") for _ in seqs]
        dvs = [t((2, cap, 32), np.float16, "torch.float16") for _ in seqs]
        cuda.fetch_device_batch(0, seqs, sels, dks, dvs)
        fake.pq_fake_cuda_synchronize_all()
        for s, want, sel, dk, dv in zip(seqs, wants, sels, dks, dvs):
            k_want, v_want = cpu.fetch(s, 0, want)
            counts = sel.counts.array.host()
            assert counts.tolist() == want.counts.tolist(), f"seq {s}"
            for h in range(2):
                n = want.counts[h]
                assert sel.positions.array.host()[h, :n].tolist() == want.positions[h, :n].tolist()
                assert np.array_equal(dk.array.host()[h, :n], k_want[h, :n])
                assert np.array_equal(dv.array.host()[h, :n], v_want[h, :n])
        # An item that fails fails alone: the others are written.
        with pytest.raises(pqcache.PQError) as e:
            cuda.select_device_batch(0, [11, 99], dqs[:2], sels[:2])
        assert e.value.status_name == "PQ_ERR_NOT_FOUND"
        assert list(e.value.statuses)[0] == 0
        with pytest.raises(ValueError, match="one entry per sequence"):
            cuda.select_device_batch(0, seqs, dqs[:2], sels)


def test_torch_batch_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device (the fake above covers the binding's torch path)")
    if not os.environ.get("PQ_CUDA_PLUGIN"):
        pytest.skip("PQ_CUDA_PLUGIN does not name the real plug-in")
    rng = np.random.default_rng(1)
    seqs = [1, 2]
    opts = dict(sink_tokens=4, local_tokens=16, topk_tokens=24, pq_subspaces=4,
                kmeans_iterations=5, worker_threads=1)
    with pqcache.Context(1, 8, 2, 32, "f16", backend="cpu", **opts) as cpu, \
            pqcache.Context(1, 8, 2, 32, "f16", backend="cuda",
                            cuda_plugin_path=os.environ["PQ_CUDA_PLUGIN"], **opts) as cuda:
        for s in seqs:
            keys = rng.standard_normal((400, 2, 32)).astype(np.float16)
            values = rng.standard_normal((400, 2, 32)).astype(np.float16)
            for ctx in (cpu, cuda):
                ctx.add_sequence(s)
                ctx.prefill(s, 0, keys, values)
                ctx.wait_builds()
        queries = [rng.standard_normal((8, 32)).astype(np.float16) for _ in seqs]
        cap = max(cuda.capacity(s, 0) for s in seqs)
        dqs = [torch.from_numpy(q).cuda() for q in queries]
        sels = [pqcache.DeviceSelection(torch.zeros((2, cap), dtype=torch.int32, device="cuda"),
                                        torch.zeros(2, dtype=torch.int32, device="cuda"))
                for _ in seqs]
        cuda.select_device_batch(0, seqs, dqs, sels)
        dks = [torch.zeros((2, cap, 32), dtype=torch.float16, device="cuda") for _ in seqs]
        dvs = [torch.zeros((2, cap, 32), dtype=torch.float16, device="cuda") for _ in seqs]
        cuda.fetch_device_batch(0, seqs, sels, dks, dvs)
        torch.cuda.synchronize()
        for s, q, sel, dk in zip(seqs, queries, sels, dks):
            want = cpu.select(s, 0, q)
            k_want, _ = cpu.fetch(s, 0, want)
            assert sel.counts.cpu().tolist() == want.counts.tolist()
            for h in range(2):
                n = want.counts[h]
                assert sel.positions[h, :n].cpu().tolist() == want.positions[h, :n].tolist()
                assert np.array_equal(dk[h, :n].cpu().numpy(), k_want[h, :n])
