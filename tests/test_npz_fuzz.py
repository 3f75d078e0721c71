"""Corrupted own-data `.npz` files: each one either loads with the original arrays or is refused
with one `DatasetError` naming the file, never another exception (zlib, zipfile, numpy).

The two views that must agree: a damaged file that still loads holds exactly the arrays that
were saved (the zip CRCs guard the contents).
"""

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s5jax.data import DatasetError
from s5jax.data._npz import SPLITS, load_user_npz


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {f"x_{s}": rng.normal(size=(6, 5, 2)).astype(np.float32) for s in SPLITS}
    arrays |= {f"y_{s}": rng.integers(0, 3, size=6) for s in SPLITS}
    arrays |= {"lengths_train": np.full(6, 5), "n_classes": np.array(3)}
    return arrays


def _file_bytes(compressed: bool) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **_arrays())
    return buffer.getvalue()


_VALID = {compressed: _file_bytes(compressed) for compressed in (False, True)}


@st.composite
def _corruptions(draw) -> tuple[bool, bytes]:
    compressed = draw(st.booleans())
    data = bytearray(_VALID[compressed])
    kind = draw(st.sampled_from(["flip", "truncate", "insert", "overwrite"]))
    at = draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        for offset in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=4)):
            data[offset] ^= draw(st.integers(1, 255))
    elif kind == "truncate":
        del data[at:]
    elif kind == "insert":
        data[at:at] = draw(st.binary(min_size=1, max_size=32))
    else:
        garbage = draw(st.binary(min_size=1, max_size=64))
        data[at : at + len(garbage)] = garbage
    return compressed, bytes(data)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=_corruptions())
def test_a_corrupted_npz_loads_exactly_or_is_one_dataset_error(tmp_path, case):
    _, data = case
    path = tmp_path / "mine.npz"
    path.write_bytes(data)
    try:
        dataset = load_user_npz(path)
    except DatasetError as e:
        assert str(path) in str(e)
        assert "\n" not in str(e)
        return
    original = _arrays()
    for s in SPLITS:
        np.testing.assert_array_equal(dataset.splits[s].x, original[f"x_{s}"])
        np.testing.assert_array_equal(dataset.splits[s].y, original[f"y_{s}"])


@pytest.mark.parametrize("compressed", [False, True])
def test_damage_inside_an_array_names_the_key(tmp_path, compressed):
    data = bytearray(_VALID[compressed])
    # The member's data starts right after its local header "x_val.npy"; damage it there.
    start = data.index(b"x_val.npy") + len(b"x_val.npy")
    for offset in range(start + 20, start + 40):
        data[offset] ^= 0x5A
    path = tmp_path / "mine.npz"
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"mine\.npz: key 'x_val' .*corrupt"):
        load_user_npz(path)


def test_the_valid_files_load(tmp_path):
    for compressed, data in _VALID.items():
        path = tmp_path / f"ok{int(compressed)}.npz"
        path.write_bytes(data)
        assert load_user_npz(path).splits["train"].x.shape == (6, 5, 2)


def test_a_member_flagged_encrypted_is_one_dataset_error(tmp_path):
    # zipfile raises RuntimeError ("password required") for a member whose encryption bit is
    # set: a one-bit corruption hypothesis found. Set bit 0 of every header's flags.
    buf = io.BytesIO()
    np.savez(buf, **_arrays())
    data = bytearray(buf.getvalue())
    for sig, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = data.find(sig)
        while at != -1:
            data[at + flags_at] |= 1
            at = data.find(sig, at + 4)
    path = tmp_path / "mine.npz"
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"mine\.npz") as err:
        load_user_npz(path)
    assert "\n" not in str(err.value)
