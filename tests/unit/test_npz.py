"""The `.npz` export's writers: the library's (`vit_core.export.npz_bytes`) and the server's, which copies without
the GIL (`vit_core.serving.npz_bytes`): the same bytes, as np.savez writes them."""

import concurrent.futures
import io
import threading
import zipfile

import numpy as np
import pytest

from vit_core import export, serving


@pytest.mark.parametrize("npz_bytes", [export.npz_bytes, serving.npz_bytes], ids=["library", "server"])
def test_npz_bytes_writes_each_array_as_np_savez_does(npz_bytes):
    """The export's own .npz writers, the library's and the server's (one copy of each array, not np.savez's two):
    every member of a C-ordered array is the same bytes np.savez writes; other layouts and 0-d, empty and bool
    arrays load back equal."""
    rng = np.random.default_rng(0)
    arrays = {"pattern": rng.random((2, 3, 5, 5), dtype=np.float32), "count": np.asarray(3, dtype=np.int64),
              "mask": rng.random((4, 3)) > 0.5, "empty": np.zeros((0, 4), np.float32), "pixels": np.arange(6, dtype=np.uint8),
              "fortran": np.asfortranarray(rng.random((5, 7))), "strided": rng.random((10, 10))[::2, 1::3]}
    mine = npz_bytes(arrays)
    reference = io.BytesIO()
    np.savez(reference, **arrays)
    with np.load(io.BytesIO(mine)) as got:
        assert sorted(got.files) == sorted(arrays)
        for name, array in arrays.items():
            assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
            assert np.array_equal(got[name], array), name
    with zipfile.ZipFile(io.BytesIO(mine)) as ours, zipfile.ZipFile(reference) as numpys:
        for name in ("pattern", "count", "mask", "empty", "pixels"):
            assert ours.read(f"{name}.npy") == numpys.read(f"{name}.npy"), name
    with pytest.raises(ValueError, match="object array"):
        npz_bytes({"labels": np.array(["a", None], dtype=object)})


def test_npz_bytes_in_one_thread_after_a_larger_or_refused_export_and_in_two_threads_at_once():
    """Each thread writes its exports through one scratch file it keeps (vit_core.serving.npz._scratch_file): an export
    is exactly its own bytes, whatever the thread wrote before, and threads never see each other's."""
    rng = np.random.default_rng(1)
    small = {"a": rng.random((3, 4), dtype=np.float32)}
    large = {"b": rng.random((300, 400), dtype=np.float32), "c": np.arange(10)}

    def in_a_new_thread(arrays):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(serving.npz_bytes, arrays).result()

    alone = in_a_new_thread(small)
    serving.npz_bytes(large)
    assert serving.npz_bytes(small) == alone
    with pytest.raises(ValueError, match="object array"):
        serving.npz_bytes({"fine": np.ones(1000), "labels": np.array(["a", None], dtype=object)})
    assert serving.npz_bytes(small) == alone
    with np.load(io.BytesIO(alone)) as got:
        assert np.array_equal(got["a"], small["a"])

    barrier = threading.Barrier(2)

    def at_once(arrays):
        barrier.wait(10)
        return [serving.npz_bytes(arrays) for _ in range(5)]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        smalls, larges = pool.submit(at_once, small), pool.submit(at_once, large)
        assert set(smalls.result()) == {alone} and set(larges.result()) == {in_a_new_thread(large)}
