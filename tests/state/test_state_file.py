"""The saved-state file (docs/contract.md §13, `numbakv.core.seq_file`): `SeqState.save` then
`SeqState.load` gives back an equal state in every storage format, and a damaged, hostile
or inconsistent file is a StateError naming the file and the reason — never another
exception, never a different state."""

import io
import json
import os
import tracemalloc
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv.core.config import CacheConfig
from numbakv.core.errors import StateError
from numbakv.core.formats import ARRAY_DTYPES, FORMATS
from numbakv.core.seq_file import VERSION, checksum, header_checksum
from numbakv.core.seq_state import Geometry, SeqState

from helpers import npy

SCALES = (((0.5, 2.0), (0.25, 4.0)), ((1.5, 0.75), (3.0, 0.125)), ((1.0, 1.0), (8.0, 0.0625)))
# three layers storing all six formats between them, fp8 scales that are not 1
MIXED = CacheConfig(
    n_layers=3, n_kv_heads=2, head_dim=32, capacity=32, max_width=4, max_seqs=2,
    windows=(0, 3, 0), layer_dtypes=(("float32", "q8_0"), ("bfloat16", "fp8_e4m3"),
                                     ("q4_0", "float16")), fp8_scales=SCALES,
)  # fmt: skip


def random_state(config: CacheConfig, n: int, start: int = 0, seed: int = 0,
                 tokens: bool = False) -> SeqState:  # fmt: skip
    """A state of `config`'s geometry holding positions start .. start + n - 1, its K/V
    random bytes of each layer's array dtype (any bit pattern: NaNs and all); with
    `tokens`, random token ids of positions 0 .. start + n - 1."""
    geometry, rng = Geometry.of(config), np.random.default_rng(seed)
    kv = [[], []]
    for layer in range(config.n_layers):
        for which in (0, 1):
            dtype = ARRAY_DTYPES[geometry.formats[layer][which]]
            shape = (n, *geometry.entry_shape(layer, which))
            raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
            kv[which].append(raw.view(dtype).reshape(shape))
    positions = np.arange(start, start + n, dtype=np.int32)
    ids = rng.integers(0, 2**40, size=start + n) if tokens else None
    return SeqState(geometry, positions, tuple(kv[0]), tuple(kv[1]), start, tokens=ids)


def saved(state: SeqState, path) -> bytes:
    state.save(path)
    return path.read_bytes()


def members_of(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def zipped(members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> bytes:
    """A zip of `members` with good CRCs."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def header_of(members: dict[str, bytes]) -> dict:
    return json.loads(str(np.load(io.BytesIO(members["header.npy"]))))


def with_header(members: dict[str, bytes], header: dict, seal: bool = True) -> dict[str, bytes]:
    """`members` with `header` as its header; `seal`: its header checksum recomputed, so that
    the edit is refused (or not) for what it says, not for the checksum."""
    header = json.loads(json.dumps(header))
    if seal:
        header["checksums"]["header"] = header_checksum(header)
    return members | {"header.npy": npy(np.array(json.dumps(header)))}


def with_array(members: dict[str, bytes], name: str, array: np.ndarray) -> dict[str, bytes]:
    """`members` with `array` as member `name` and its checksum in the sealed header."""
    header = header_of(members)
    header["checksums"][name] = checksum(array)
    return with_header(members | {f"{name}.npy": npy(array)}, header)


def load(data: bytes, path) -> SeqState:
    path.write_bytes(data)
    return SeqState.load(path)


# -- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_state_of_every_format_loads_equal(fmt, tmp_path):
    v_fmt = FORMATS[(FORMATS.index(fmt) + 2) % len(FORMATS)]  # K and V differ
    config = CacheConfig(
        n_layers=2, n_kv_heads=2, head_dim=64, capacity=16, max_width=4, max_seqs=2,
        windows=(0, 3), k_dtype=fmt, v_dtype=v_fmt, fp8_scales=SCALES[:2],
    )  # fmt: skip
    state = random_state(config, n=5)
    state.save(tmp_path / "s.state")
    got = SeqState.load(tmp_path / "s.state")
    assert got == state and got.geometry == Geometry.of(config)
    assert [x.dtype for x in got.k] == [ARRAY_DTYPES[fmt]] * 2
    assert all(not x.flags.writeable for x in (got.positions, *got.k, *got.v))


@pytest.mark.parametrize(
    ("n", "start", "tokens"),
    [(7, 0, False), (4, 9, False), (0, 0, False), (0, 6, False), (1, 2**31 - 1, False),
     (7, 0, True), (4, 9, True), (0, 0, True), (0, 6, True)],
)  # fmt: skip
def test_mixed_formats_a_start_and_empty_states_load_equal(n, start, tokens, tmp_path):
    state = random_state(MIXED, n, start, tokens=tokens)
    state.save(tmp_path / "s")
    got = SeqState.load(tmp_path / "s")
    assert got == state and (got.start, got.n_tokens) == (start, n)
    assert (got.tokens is None) != tokens
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no suffix added


def test_a_state_with_default_fp8_scales_loads_equal(tmp_path):
    state = random_state(CacheConfig(1, 1, 32, 8, 2, 1, dtype="fp8_e4m3"), n=3, start=1)
    state.save(tmp_path / "s.npz")
    assert SeqState.load(tmp_path / "s.npz") == state


def test_the_file_is_the_documented_npz(tmp_path):
    state = random_state(MIXED, 3, 2, tokens=True)
    members = members_of(saved(state, tmp_path / "s"))
    layers = [f"{kv}_{i}.npy" for i in range(3) for kv in "kv"]
    assert list(members) == ["header.npy", "positions.npy", "tokens.npy", *layers]
    header = header_of(members)
    assert header["magic"] == "numbakv-seqstate" and header["version"] == VERSION
    assert (header["n_tokens"], header["start"]) == (3, 2)
    assert header["geometry"] == json.loads(json.dumps(state.geometry.as_dict()))
    assert header["checksums"]["k_1"] == checksum(state.k[1])
    with np.load(tmp_path / "s") as data:  # plain arrays: numpy reads it without pickles
        np.testing.assert_array_equal(data["v_2"], state.v[2])
        assert data["positions"].dtype == np.int32 and data["tokens"].shape == (5,)


# -- fuzz ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """(folder, state, its file's bytes, another state of the same geometry, its bytes)."""
    folder = tmp_path_factory.mktemp("fuzz")
    state = random_state(MIXED, 3, 2, seed=1, tokens=True)
    other = random_state(MIXED, 3, 5, seed=2, tokens=True)
    return folder, state, saved(state, folder / "a"), other, saved(other, folder / "b")


def flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2**32) | st.floats() | st.text(max_size=8)
    | st.sampled_from(["float32", "q4_0", "numbakv-seqstate", "f4", "0" * 64]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=10,
)  # fmt: skip


@st.composite
def variants(draw, data: bytes, other: bytes):
    """(a damaged or edited copy of the file `data`, whether an edit was sealed: its
    header checksum recomputed)."""
    members, kind = members_of(data), draw(st.sampled_from(
        ["bits", "truncate", "member", "graft", "pickle", "value", "digit", "edit", "sealed edit"]
    ))  # fmt: skip
    names = sorted(members) if kind != "value" else sorted(set(members) - {"header.npy"})
    if kind == "bits":
        return flip(data, draw(st.integers(0, 8 * len(data) - 1))), False
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))], False
    name = draw(st.sampled_from(names))
    if kind == "member":  # reaches the .npy parser, the JSON and the checksums
        bit = draw(st.integers(0, 8 * len(members[name]) - 1))
        return zipped(members | {name: flip(members[name], bit)}), False
    if kind == "graft":
        return zipped(members | {name: members_of(other)[name]}), False
    if kind == "pickle":
        return zipped(members | {name: npy(np.array([{"x": 1}, None], dtype=object))}), False
    header = header_of(members)
    if kind == "digit":  # one digit of the header's text changed: a window, a scale, ...
        text = json.dumps(header)
        at = draw(st.sampled_from([i for i, c in enumerate(text) if c.isdigit()]))
        digit = draw(st.sampled_from([d for d in "0123456789" if d != text[at]]))
        text = text[:at] + digit + text[at + 1 :]
        return zipped(members | {"header.npy": npy(np.array(text))}), False
    if kind == "value":  # one array element changed, the header kept
        array = np.load(io.BytesIO(members[name])).copy()
        flat = array.reshape(-1).view(np.uint8)
        flat[draw(st.integers(0, flat.size - 1))] ^= draw(st.integers(1, 255))
        return zipped(members | {name: npy(array)}), False
    keys = [(key,) for key in header] + [("geometry", key) for key in header["geometry"]]
    path, value = draw(st.sampled_from(keys)), draw(JSON)
    where = header
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    sealed = kind == "sealed edit" and isinstance(header.get("checksums"), dict)
    sealed = sealed and is_strict(header)
    return zipped(with_header(members, header, seal=sealed)), sealed


def is_strict(value) -> bool:
    """Whether `value` is strict JSON (no NaN or infinity)."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_damaged_file_is_refused_or_loads_equal(originals, data):
    folder, state, original, _, other_data = originals
    variant, sealed = data.draw(variants(original, other_data))
    path = folder / "variant"
    try:
        got = load(variant, path)
    except StateError as error:  # anything else escapes and fails the test
        assert str(path) in str(error)
        return
    if sealed:  # a sealed edit may say something else: what loads is what it says
        header = header_of(members_of(variant))
        assert json.dumps(got.geometry.as_dict()) == json.dumps(header["geometry"])
        assert (got.start, got.n_tokens) == (header["start"], header["n_tokens"])
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got.k, state.k, strict=True))
    else:
        assert got == state


# -- refusals, one by one --------------------------------------------------------------


@pytest.fixture
def good(tmp_path):
    """(the members of a saved MIXED state, the state, the path to write variants to)."""
    state = random_state(MIXED, 3, 2, tokens=True)
    return members_of(saved(state, tmp_path / "good")), state, tmp_path / "variant"


def refused(data: bytes, path, match: str) -> str:
    with pytest.raises(StateError, match=match) as error:
        load(data, path)
    assert str(path) in str(error.value)
    return str(error.value)


def test_a_missing_file_or_a_folder_is_refused(tmp_path):
    with pytest.raises(StateError, match=r"no state file at .*nope; check the path"):
        SeqState.load(tmp_path / "nope")
    with pytest.raises(StateError, match="is a folder, not a state file"):
        SeqState.load(tmp_path)


@pytest.mark.parametrize("keep", [0, 10, 200, 0.5, 0.99])
def test_a_truncated_file_is_refused(good, keep):
    data = zipped(good[0])
    cut = data[: int(keep * len(data)) if isinstance(keep, float) else keep]
    message = refused(cut, good[2], "is not a readable numbakv state")
    assert "save the sequence again" in message


def test_a_flipped_bit_in_the_payload_is_refused(good):
    members, state, path = good
    data = zipped(members)
    at = data.find(state.k[1].tobytes()[:32])
    refused(flip(data, 8 * (at + 40)), path, "Bad CRC-32 for file 'k_1.npy'")


def test_other_files_are_refused(good, tmp_path):
    np.save(tmp_path / "one.npy", np.arange(3))
    with pytest.raises(StateError, match=r"single \.npy array; a state is an \.npz of a header"):
        SeqState.load(tmp_path / "one.npy")
    refused(b"hello", good[2], "not a readable numbakv state")
    np.savez(tmp_path / "x.npz", x=np.arange(3))
    refused((tmp_path / "x.npz").read_bytes(), good[2], r"it has no header\.npy member")


def test_a_pickled_member_is_refused_unread(good):
    members, _, path = good
    pickle = npy(np.array([{"x": 1}], dtype=object))
    refused(zipped(members | {"v_0.npy": pickle}), path, r"v_0\.npy holds Python objects")


def test_members_claiming_huge_shapes_are_refused_before_allocating(good):
    members, _, path = good
    huge = members | {"k_0.npy": npy(np.zeros(4, np.float32), shape=(2**40, 2, 32))}
    header = header_of(members)
    header["n_tokens"], header["start"] = 2**31 - 1, 0  # a header that agrees with them
    claims = with_header(members, header) | {
        "positions.npy": npy(np.arange(3, dtype=np.int32), shape=(2**31 - 1,)),
        "k_0.npy": npy(np.zeros(4, np.float32), shape=(2**31 - 1, 2, 32)),
    }
    tracemalloc.start()
    refused(zipped(huge), path, r"k_0\.npy is float32 with shape \(1099511627776, 2, 32\)")
    refused(zipped(claims), path, r"positions\.npy declares shape \(2147483647,\) of int32")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20  # no 8 GiB allocation attempted, not even 1 MiB


@pytest.mark.parametrize(
    ("member", "array", "match"),
    [
        ("k_0", np.zeros((3, 2, 32), np.float16), r"k_0\.npy is float16 .* not float32 of shape"),
        ("v_0", np.zeros((4, 2, 34), np.uint8), r"v_0\.npy is uint8 with shape \(4, 2, 34\)"),
        ("k_2", np.zeros((3, 2, 32), np.uint8), r"not uint8 of shape \(3, 2, 18\)"),
        ("positions", np.arange(2, 5, dtype=np.int64), "not int32"),
        ("positions", np.array([2, 3, 5], np.int32), "positions are not 2, 3, ..."),
        ("tokens", np.arange(5, dtype=np.int32), r"tokens\.npy is int32 .* not int64"),
        ("tokens", np.arange(4), r"not int64 of shape \(5,\)"),
    ],
)
def test_members_that_disagree_with_the_header_are_refused(good, member, array, match):
    members, _, path = good
    refused(zipped(with_array(members, member, array)), path, match)


def test_a_changed_payload_or_header_fails_its_checksum(good):
    members, state, path = good
    k = state.k[1].copy()
    k[0, 0, 0] ^= 1
    changed = members | {"k_1.npy": npy(k)}
    refused(zipped(changed), path, r"member k_1\.npy's bytes do not match the header's checksum")
    header = header_of(members)
    header["geometry"]["windows"] = [0, 2, 0]  # a geometry a cache may have: only sealed
    refused(zipped(with_header(members, header, seal=False)), path, "header does not match its")
    header["checksums"]["v_2"] = "ab" * 31
    refused(zipped(with_header(members, header)), path, "checksum of v_2 is no sha256")


def test_extra_and_missing_members_are_refused(good):
    members, _, path = good
    extra = members | {"k_3.npy": members["k_0.npy"]}
    refused(zipped(extra), path, r"a member 'k_3\.npy', which a state of 3 layers has not")
    refused(zipped(members | {"notes.txt": b"hi"}), path, r"'notes\.txt', not an \.npy")
    missing = {name: data for name, data in members.items() if name != "v_1.npy"}
    refused(zipped(missing), path, r"it has no v_1\.npy member")
    untokened = {name: data for name, data in members.items() if name != "tokens.npy"}
    refused(zipped(untokened), path, r"it has no tokens\.npy member")
    header = header_of(members)
    del header["checksums"]["tokens"]  # which members there are is sealed too
    refused(zipped(with_header(untokened, header, seal=False)), path, "header does not match")
    refused(zipped(with_header(members, header)), path, r"a member 'tokens\.npy', which a")
    assert load(zipped(with_header(untokened, header)), path).tokens is None  # sealed: loads


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "its header is not JSON"),
        ('{"magic": NaN}', "NaN is not strict JSON"),
        ("[1, 2]", r"its header is \[1, 2\], not a JSON object"),
        ('{"magic": "numbakv-trace/2"}', "magic is 'numbakv-trace/2', not 'numbakv-seqstate'"),
    ],
)
def test_a_header_that_is_no_state_header_is_refused(good, text, match):
    members, _, path = good
    refused(zipped(members | {"header.npy": npy(np.array(text))}), path, match)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("version", 2, "a version 2 state; this numbakv reads 1"),
        ("version", True, "a version True state"),
        ("n_tokens", True, "n_tokens is True, not an int"),
        ("n_tokens", 4, r"positions\.npy is int32 with shape \(3,\), not int32 of shape \(4,\)"),
        ("start", -1, "start is -1, not an int"),
        ("start", 2**31 - 2, "positions 2147483646 .. 2147483648 pass int32"),
        ("start", 3, r"tokens\.npy is int64 with shape \(5,\), not int64 of shape \(6,\)"),
        ("extra", 1, "its header has the fields"),
        ("checksums", {"header": "0" * 64}, "checksums are of"),
    ],
)
def test_header_fields_are_checked(good, field, value, match):
    members, _, path = good
    header = header_of(members)
    header[field] = value
    refused(zipped(with_header(members, header)), path, match)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("n_layers", True, "n_layers must be an integer"),
        ("n_layers", 2, "windows has 3 entries but n_layers=2"),
        ("n_kv_heads", 2.0, "n_kv_heads must be an integer"),
        ("n_kv_heads", 0, "n_kv_heads=0 is below 1"),
        ("head_dim", 48, "head_dim=48 is not a multiple of 32"),
        ("windows", [0, -1, 0], r"windows\[1\]=-1 is below 0"),
        ("windows", [0, False, 0], r"windows\[1\] must be an integer"),
        ("formats", [["float32", "q8_0"], ["bfloat16", "float64"], ["q4_0", "float16"]],
         "float64' is not a storage format"),
        ("formats", [["float32", "q8_0"], ["bfloat16", "f2"], ["q4_0", "float16"]],
         "formats is .*, not as a cache holds it"),
        ("formats", ["float32", "bfloat16", "q4_0"], "formats is"),
        ("fp8_scales", 1.0, "fp8_scales is 1.0, not as a cache holds it"),
        ("fp8_scales", [[[0.5, 2.0], [0.25, 4.0]]] * 2, "fp8_scales has shape"),
        ("fp8_scales", [[[0.5, 2.0], [0.25, 0.0]], *SCALES[1:]], r"\[0\]\[1\]\[1\]=0.0 is not"),
        ("fp8_scales", [[[0.5, 2.0], [0.25, -4.0]], *SCALES[1:]], "finite positive"),
        ("fp8_scales", [[[0.5, 2.0], [0.25, 4]], *SCALES[1:]], "fp8_scales is"),
        ("fp8_scales", [[[0.5, 2.0], [0.25, 0.1]], *SCALES[1:]], "fp8_scales is"),  # no float32
        ("fp8_scales", [[[0.5, 2.0], [0.25, "4.0"]], *SCALES[1:]], "must be a real number"),
        ("shape", [1], "its geometry has the fields"),
    ],
)  # fmt: skip
def test_geometry_values_are_checked_strictly(good, field, value, match):
    members, _, path = good
    header = header_of(members)
    header["geometry"][field] = value
    refused(zipped(with_header(members, header)), path, match)


def test_a_deflated_file_is_refused_and_a_fortran_ordered_one_loads_equal(good):
    """`save` stores members: a deflated one (up to 1032 times its bytes once read) is a
    file `save` never wrote; Fortran order is only an .npy header's flag."""
    members, state, path = good
    refused(zipped(members, zipfile.ZIP_DEFLATED), path, r"compression method 8, not stored \(0\)")
    fortran = members | {"k_0.npy": npy(np.asfortranarray(state.k[0]))}
    got = load(zipped(fortran), path)
    assert got == state and got.k[0].flags.c_contiguous


def test_a_path_that_is_not_a_regular_file_or_not_a_path_is_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(StateError, match="not a regular file"):
        SeqState.load(fifo)
    for path in (None, 3, b"s.npz"):
        with pytest.raises(StateError, match="a str or a path"):
            SeqState.load(path)
        with pytest.raises(StateError, match="a str or a path"):
            random_state(MIXED, 1).save(path)


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    state, path = random_state(MIXED, 2), tmp_path / "s.npz"
    state.save(path)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(StateError, match="No space left"):
        random_state(MIXED, 3).save(path)
    assert SeqState.load(path) == state and sorted(p.name for p in tmp_path.iterdir()) == ["s.npz"]


def test_writing_where_no_file_can_be_is_refused(tmp_path):
    state = random_state(MIXED, 1)
    with pytest.raises(StateError, match="is a folder"):
        state.save(tmp_path)
    with pytest.raises(StateError, match="does not exist"):
        state.save(tmp_path / "no" / "s.state")
