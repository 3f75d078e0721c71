"""LRA text tasks: ListOps (generator + reader), Text (IMDB) and Retrieval (AAN).

Fixtures are written in each real on-disk format (`_fixtures.py`), then read back by the
readers; the expected token ids are worked out by hand from the S4/S5 rules (`datasets.md`
§2.1, §2.3, §2.4, §5): specials `<pad>`=0, `<unk>`=1, `<eos>`=2 first, then train tokens
(counted after truncation) by descending count, ties in string order.
"""

import json
import logging

import numpy as np
import pytest

from s5jax.data import DatasetError, load_prepared
from s5jax.data._aan import prepare_retrieval
from s5jax.data._imdb import prepare_text
from s5jax.data._listops import (
    _to_string,
    _to_value,
    evaluate_listops,
    generate_listops,
    generate_listops_examples,
    listops_tokenize,
    prepare_listops,
)
from s5jax.data._vocab import build_vocab

from ._fixtures import write_aan, write_imdb, write_listops

# ---------------------------------------------------------------------------------------
# Helpers


def assert_nothing_cached(out):
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


LISTOPS_ROWS = {
    "train": [("( ( ( [MAX 4 ) 5 ) ] )", 5), ("( ( ( [SM 4 ) 4 ) ] )", 8)],
    "val": [("( ( ( [MIN 7 ) 4 ) ] )", 4)],
    "test": [("( ( ( [MED 4 ) 5 ) ] )", 4), ("4", 4)],
}

# ---------------------------------------------------------------------------------------
# Vocabulary


def test_build_vocab_is_torchtext_order():
    counts = {"b": 3, "a": 3, "X": 5, "c": 1, "<eos>": 9}
    assert build_vocab(counts) == ["<pad>", "<unk>", "<eos>", "X", "a", "b", "c"]
    assert build_vocab(counts, min_freq=3) == ["<pad>", "<unk>", "<eos>", "X", "a", "b"]


# ---------------------------------------------------------------------------------------
# ListOps: string form, labels, generator


def test_listops_tokenize_and_lra_string_form():
    tree = (((("[MAX", 4), 5), 3), "]")
    assert _to_string(tree) == "( ( ( ( [MAX 4 ) 5 ) 3 ) ] )"  # the example in §2.1
    assert listops_tokenize(_to_string(tree)) == ["[MAX", "4", "5", "3", "X"]
    assert _to_value(tree) == 5


@pytest.mark.parametrize(
    "expr, value",
    [
        ("[MIN 3 1 4 ]", 1),
        ("[MAX 3 1 4 ]", 4),
        ("[MED 3 1 4 ]", 3),
        ("[MED 1 2 ]", 1),  # median 1.5 truncated
        ("[MED 3 4 5 8 ]", 4),  # median 4.5 truncated
        ("[MED 9 8 ]", 8),  # median 8.5 truncated
        ("[SM 9 8 7 ]", 4),  # 24 mod 10
        ("[SM 5 5 ]", 0),
        ("[MAX 2 [MIN 9 7 ] [SM 5 6 ] 3 ]", 7),
        ("( ( ( [MED ( ( ( [SM 9 ) 9 ) ] ) ) 4 ) ] )", 6),  # MED(8, 4) = 6
        ("7", 7),
    ],
)
def test_evaluate_listops_by_hand(expr, value):
    assert evaluate_listops(expr) == value


def test_evaluate_listops_rejects_malformed():
    for bad in ("[MAX 3", "[MAX ]", "3 4", "[FOO 1 ]", "]"):
        with pytest.raises(ValueError):
            evaluate_listops(bad)


def test_generator_lengths_labels_and_determinism():
    ex = generate_listops_examples(25, seed=3)
    lengths = [len(listops_tokenize(s)) for s, _ in ex]
    assert all(500 < n < 2000 for n in lengths)
    assert len({s for s, _ in ex}) == 25
    # Two views agree: the label from the tree (LRA to_value) and from parsing the string.
    assert all(evaluate_listops(s) == y for s, y in ex)
    assert ex == generate_listops_examples(25, seed=3)
    assert ex != generate_listops_examples(25, seed=4)
    small = generate_listops_examples(200, seed=0, min_length=10, max_length=40, max_depth=4)
    tokens = [listops_tokenize(s) for s, _ in small]
    assert all(10 < len(t) < 40 for t in tokens)
    assert all(0 <= y <= 9 and evaluate_listops(s) == y for s, y in small)
    assert {t for ts in tokens for t in ts} <= {"[MIN", "[MAX", "[MED", "[SM", "X"} | set(
        "0123456789"
    )
    assert {t[0] for t in tokens} == {"[MIN", "[MAX", "[MED", "[SM"}


def _shape(tokens):
    """(argument counts of every operator, deepest operator nesting) of a token list."""
    counts, stack, deepest = [], [], 0
    for tok in tokens:
        if tok.startswith("["):
            stack.append(0)
            deepest = max(deepest, len(stack))
        elif tok == "X":
            counts.append(stack.pop())
            if stack:
                stack[-1] += 1
        else:
            stack[-1] += 1
    return counts, deepest


def test_generator_respects_max_args_and_max_depth():
    """LRA's tree: an operator takes 2..max_args arguments, and every node at max_depth is a
    leaf, so operators nest at most max_depth - 1 deep; both bounds are reached."""
    ex = generate_listops_examples(300, seed=5, max_depth=4, max_args=3, min_length=5,
                                   max_length=60)  # fmt: skip
    shapes = [_shape(listops_tokenize(s)) for s, _ in ex]
    counts = [c for cs, _ in shapes for c in cs]
    assert min(counts) == 2 and max(counts) == 3
    assert max(d for _, d in shapes) == 3
    lengths = [len(listops_tokenize(s)) for s, _ in ex]
    assert 5 < min(lengths) and max(lengths) < 60
    ops = {t for s, _ in ex for t in listops_tokenize(s) if t.startswith("[")}
    assert ops == {"[MIN", "[MAX", "[MED", "[SM"}


def test_generate_then_prepare_round_trip(tmp_path):
    folder = generate_listops(
        tmp_path / "gen",
        n_train=30,
        n_val=5,
        n_test=4,
        seed=1,
        min_length=10,
        max_length=60,
        progress=False,
    )
    raw = (folder / "basic_train.tsv").read_bytes()
    assert raw.startswith(b"Source\tTarget\r\n") and raw.endswith(b"\r\n")
    with pytest.raises(DatasetError, match="already exists"):
        generate_listops(tmp_path / "gen", n_train=1, n_val=1, n_test=1, progress=False)
    # overwrite=True replaces only a generated folder, never one that may be LRA's release
    small = dict(n_train=2, n_val=1, n_test=1, min_length=10, max_length=60, progress=False)
    release = tmp_path / "lra" / "listops-1000"
    release.mkdir(parents=True)
    (release / "basic_train.tsv").write_text("Source\tTarget\r\n")
    with pytest.raises(DatasetError, match=r"was not generated here .*LRA release"):
        generate_listops(tmp_path / "lra", overwrite=True, **small)
    assert sorted(p.name for p in release.iterdir()) == ["basic_train.tsv"]
    again = generate_listops(tmp_path / "again", seed=1, **small)
    generate_listops(tmp_path / "again", seed=2, overwrite=True, **small)
    assert json.loads((again / "generator.json").read_text())["seed"] == 2  # replaced
    ds = prepare_listops(tmp_path / "gen", tmp_path / "out", progress=False)
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 30, "val": 5, "test": 4}
    expected = generate_listops_examples(39, seed=1, min_length=10, max_length=60)
    itos = ds.meta["vocab"]
    assert itos[:3] == ["<pad>", "<unk>", "<eos>"] and ds.vocab_size == len(itos) == 18
    for split, (lo, hi) in {"train": (0, 30), "val": (30, 35), "test": (35, 39)}.items():
        sp = ds.splits[split]
        assert sp.x.shape == (hi - lo, 2048) and sp.x.dtype == np.int32
        for i, (src, label) in enumerate(expected[lo:hi]):
            toks = listops_tokenize(src)
            assert sp.y[i] == label and sp.lengths[i] == len(toks) + 1
            assert [itos[t] for t in sp.x[i, : len(toks) + 1]] == [*toks, "<eos>"]
            assert not sp.x[i, len(toks) + 1 :].any()


# ---------------------------------------------------------------------------------------
# ListOps reader


def test_listops_reader_exact_ids(tmp_path):
    src = write_listops(tmp_path, LISTOPS_ROWS)
    ds = prepare_listops(tmp_path, tmp_path / "out", progress=False)
    # train counts: 4 x3, X x2, then 5, [MAX, [SM x1 (string order: '5' < '[')
    assert ds.meta["vocab"] == ["<pad>", "<unk>", "<eos>", "4", "X", "5", "[MAX", "[SM"]
    assert ds.vocab_size == 8 and ds.n_classes == 10
    assert ds.meta["source"] == str(src.resolve())
    tr, va, te = ds.splits["train"], ds.splits["val"], ds.splits["test"]
    assert tr.x.shape == (2, 2048) and tr.x.dtype == np.int32
    np.testing.assert_array_equal(tr.x[:, :6], [[6, 3, 5, 4, 2, 0], [7, 3, 3, 4, 2, 0]])
    assert not tr.x[:, 6:].any()
    np.testing.assert_array_equal(tr.lengths, [5, 5])
    np.testing.assert_array_equal(tr.y, [5, 8])
    np.testing.assert_array_equal(va.x[0, :6], [1, 1, 3, 4, 2, 0])  # [MIN and 7 are <unk>
    np.testing.assert_array_equal(te.x[:, :6], [[1, 3, 5, 4, 2, 0], [3, 2, 0, 0, 0, 0]])
    np.testing.assert_array_equal(te.lengths, [5, 2])
    assert [tr.y.dtype, tr.lengths.dtype] == [np.int32, np.int32]


def test_listops_quoted_sources_read_as_pandas_does(tmp_path):
    rows = {split: list(r) for split, r in LISTOPS_ROWS.items()}
    rows["train"] = [('"( ( ( [MAX 4 ) 5 ) ] )"', 5), *rows["train"][1:]]
    write_listops(tmp_path / "q", rows)
    write_listops(tmp_path / "plain", LISTOPS_ROWS)
    quoted = prepare_listops(tmp_path / "q", tmp_path / "out-q", progress=False)
    plain = prepare_listops(tmp_path / "plain", tmp_path / "out-p", progress=False)
    assert quoted.meta["vocab"] == plain.meta["vocab"]
    np.testing.assert_array_equal(quoted.splits["train"].x, plain.splits["train"].x)


def test_listops_truncation_before_vocab(tmp_path):
    write_listops(tmp_path, LISTOPS_ROWS)
    ds = prepare_listops(tmp_path / "listops-1000", tmp_path / "out", l_max=4, progress=False)
    # truncated to 3 tokens: X never reaches the train counts, so it is <unk>
    assert ds.meta["vocab"] == ["<pad>", "<unk>", "<eos>", "4", "5", "[MAX", "[SM"]
    np.testing.assert_array_equal(ds.splits["train"].x, [[5, 3, 4, 2], [6, 3, 3, 2]])
    np.testing.assert_array_equal(ds.splits["train"].lengths, [4, 4])
    np.testing.assert_array_equal(ds.splits["test"].x, [[1, 3, 4, 2], [3, 2, 0, 0]])


def test_prepare_is_idempotent(tmp_path):
    write_listops(tmp_path, LISTOPS_ROWS)
    out = tmp_path / "out"
    prepare_listops(tmp_path, out, progress=False)
    stamp = (out / "meta.json").stat().st_mtime_ns
    again = prepare_listops(tmp_path, out, progress=False)
    assert (out / "meta.json").stat().st_mtime_ns == stamp
    assert again.meta["options"] == {"l_max": 2048}
    other = prepare_listops(tmp_path, out, l_max=16, progress=False)
    assert other.splits["train"].x.shape == (2, 16)
    assert load_prepared(out).meta["options"] == {"l_max": 16}


def test_listops_missing_folder_says_what_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    with pytest.raises(DatasetError) as err:
        prepare_listops(None, tmp_path / "out", progress=False)
    msg = str(err.value)
    assert "lra_release.gz" in msg
    assert str(tmp_path / "root" / "lra_release" / "lra_release" / "listops-1000") in msg
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "content, match",
    [
        (b"Source\tTarget\r\n[MAX 1 ]\t1\r\n[MAX 2\r\n", r"basic_train\.tsv, line 3: expected 2"),
        (b"Source\tTarget\r\n[MAX 1 ]\t1\r\n[MAX 2 ]\tseven\r\n", r"line 3: label 'seven'"),
        (b"Source\tTarget\r\n[MAX 1 ]\t10\r\n", r"line 2: label '10' is not an integer 0-9"),
        (b"Source\tTarget\r\n", r"basic_train\.tsv: the train split has no examples"),
        (b"[MAX 1 ]\t1\r\n", r"basic_train\.tsv, line 1: expected the header"),
        (b"Source\tTarget\r\n[MAX 1 ]\t1\r\n[MAX \xff ]\t2\r\n", r"line 3: not valid UTF-8"),
    ],
)
def test_listops_bad_input(tmp_path, content, match):
    d = write_listops(tmp_path, LISTOPS_ROWS)
    (d / "basic_train.tsv").write_bytes(content)
    out = tmp_path / "cache" / "listops"
    with pytest.raises(DatasetError, match=match):
        prepare_listops(tmp_path, out, progress=False)
    assert_nothing_cached(out)


def test_listops_missing_split_file(tmp_path):
    d = write_listops(tmp_path, LISTOPS_ROWS)
    (d / "basic_val.tsv").unlink()
    with pytest.raises(DatasetError, match=r"basic_val\.tsv is missing"):
        prepare_listops(tmp_path, tmp_path / "out", progress=False)


# ---------------------------------------------------------------------------------------
# Text (IMDB)

IMDB = {
    ("train", "neg"): {"10_2.txt": "abca", "2_1.txt": "bad<br />"},
    ("train", "pos"): {"5_9.txt": "aé"},
    ("test", "neg"): {"0_3.txt": "zab"},
    ("test", "pos"): {"1_8.txt": "é", "3_10.txt": "cab"},
}


def test_imdb_reader_exact_ids(tmp_path):
    write_imdb(tmp_path, IMDB)
    (tmp_path / "aclImdb" / "train" / "unsup").mkdir()
    (tmp_path / "aclImdb" / "train" / "unsup" / "0_0.txt").write_text("zzzzzzzz")
    ds = prepare_text(tmp_path, tmp_path / "out", min_freq=1, progress=False)
    # train chars (neg 2_1, neg 10_2, pos 5_9): a x4, b x3, c/d/r/< ... x1 ...
    counts = {"a": 4, "b": 3, "d": 1, "<": 1, "r": 1, " ": 1, "/": 1, ">": 1, "c": 1, "é": 1}
    itos = ["<pad>", "<unk>", "<eos>", "a", "b", " ", "/", "<", ">", "c", "d", "r", "é"]
    assert build_vocab(counts) == itos
    assert ds.meta["vocab"] == itos and ds.vocab_size == 13 and ds.n_classes == 2
    tr = ds.splits["train"]
    assert tr.x.shape == (3, 4096) and tr.x.dtype == np.int32
    np.testing.assert_array_equal(tr.y, [0, 0, 1])  # neg by id (2 before 10), then pos
    np.testing.assert_array_equal(tr.lengths, [10, 5, 3])
    np.testing.assert_array_equal(tr.x[0, :11], [4, 3, 10, 7, 4, 11, 5, 6, 8, 2, 0])
    np.testing.assert_array_equal(tr.x[1, :6], [3, 4, 9, 3, 2, 0])
    np.testing.assert_array_equal(tr.x[2, :4], [3, 12, 2, 0])
    te = ds.splits["test"]
    np.testing.assert_array_equal(te.y, [0, 1, 1])
    np.testing.assert_array_equal(te.x[:, :5], [[1, 3, 4, 2, 0], [12, 2, 0, 0, 0], [9, 3, 4, 2, 0]])
    np.testing.assert_array_equal(ds.splits["val"].x, te.x)  # test doubles as val
    assert ds.meta["val_is_test"] is True


def test_imdb_reviews_are_ordered_by_id_then_rating(tmp_path):
    """aclImdb names a review `<id>_<rating>.txt`; the reference lists them by id (as
    integers), whatever their ratings."""
    from s5jax.data._imdb import list_imdb_files

    for label, names in {"neg": ["3_4", "12_1", "7_2"], "pos": ["20_7", "4_10"]}.items():
        folder = tmp_path / "aclImdb" / "train" / label
        folder.mkdir(parents=True)
        for name in names:
            (folder / f"{name}.txt").write_text("x")
    files = list_imdb_files(tmp_path / "aclImdb", "train")
    assert [(p.stem, y) for p, y in files] == [
        ("3_4", 0), ("7_2", 0), ("12_1", 0), ("4_10", 1), ("20_7", 1)]  # fmt: skip


def test_text_files_without_a_final_newline_keep_their_last_row(tmp_path):
    d = write_listops(tmp_path, LISTOPS_ROWS)
    whole = prepare_listops(tmp_path, tmp_path / "a", progress=False)
    for name in ("basic_train.tsv", "basic_test.tsv"):
        path = d / name
        path.write_bytes(path.read_bytes().removesuffix(b"\r\n"))
    cut = prepare_listops(tmp_path, tmp_path / "b", progress=False)
    for split in ("train", "test"):
        np.testing.assert_array_equal(cut.splits[split].x, whole.splits[split].x)
        np.testing.assert_array_equal(cut.splits[split].y, whole.splits[split].y)


def test_imdb_min_freq_and_truncation(tmp_path):
    write_imdb(tmp_path, IMDB)
    ds = prepare_text(tmp_path / "aclImdb", tmp_path / "out", l_max=3, min_freq=3, progress=False)
    # truncated train: "ba", "ab", "aé" -> a x3, b x2, é x1: only 'a' reaches min_freq 3
    assert ds.meta["vocab"] == ["<pad>", "<unk>", "<eos>", "a"]
    np.testing.assert_array_equal(ds.splits["train"].x, [[1, 3, 2], [3, 1, 2], [3, 1, 2]])
    np.testing.assert_array_equal(ds.splits["train"].lengths, [3, 3, 3])
    assert prepare_text(tmp_path, tmp_path / "out", l_max=3, min_freq=3).meta["options"] == {
        "l_max": 3,
        "min_freq": 3,
    }


def test_imdb_missing_and_bad_input(tmp_path, monkeypatch):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    out = tmp_path / "cache" / "text"
    with pytest.raises(DatasetError) as err:
        prepare_text(out=out, progress=False)
    assert "aclImdb_v1.tar.gz" in str(err.value)
    assert str(tmp_path / "root" / "aclImdb" / "train" / "pos") in str(err.value)

    root = write_imdb(tmp_path / "root", IMDB)
    bad = root / "test" / "pos" / "7_7.txt"
    bad.write_bytes(b"caf\xe9")  # Latin-1, not UTF-8
    with pytest.raises(DatasetError, match=r"7_7\.txt: not valid UTF-8"):
        prepare_text(out=out, progress=False)
    assert_nothing_cached(out)

    bad.unlink()
    for f in (root / "test" / "pos").iterdir():
        f.unlink()
    with pytest.raises(DatasetError, match=r"test/pos holds no \.txt reviews"):
        prepare_text(out=out, progress=False)
    assert_nothing_cached(out)


# ---------------------------------------------------------------------------------------
# Retrieval (AAN)

AAN = {
    "train": [("1", "p1", "p2", "b'aab'", "b'c'"), ("0.0", "p3", "p4", "b'b'", '"a"')],
    "val": [("1.0", "p5", "p6", "b'z'", "b'")],
    "test": [("0", "p7", "p8", "cab", "b")],
}


def test_aan_reader_exact_ids(tmp_path):
    write_aan(tmp_path, AAN)
    ds = prepare_retrieval(tmp_path, tmp_path / "out", l_max=6, progress=False)
    # truncated train documents "b'aab", "b'c'", "b'b'", '"a"':
    # ' x5 and b x5 (tie: ' < b), a x3, " x2, c x1
    assert ds.meta["vocab"] == ["<pad>", "<unk>", "<eos>", "'", "b", "a", '"', "c"]
    assert ds.vocab_size == 8 and ds.n_classes == 2
    tr = ds.splits["train"]
    assert tr.x.shape == (2, 2, 6) and tr.lengths.shape == (2, 2) and tr.x.dtype == np.int32
    np.testing.assert_array_equal(tr.y, [1, 0])
    np.testing.assert_array_equal(
        tr.x,
        [[[4, 3, 5, 5, 4, 2], [4, 3, 7, 3, 2, 0]], [[4, 3, 4, 3, 2, 0], [6, 5, 6, 2, 0, 0]]],
    )
    np.testing.assert_array_equal(tr.lengths, [[6, 5], [5, 4]])
    va, te = ds.splits["val"], ds.splits["test"]
    np.testing.assert_array_equal(va.x, [[[4, 3, 1, 3, 2, 0], [4, 3, 2, 0, 0, 0]]])
    np.testing.assert_array_equal(va.lengths, [[5, 3]])
    np.testing.assert_array_equal(te.x[0, :, :4], [[7, 5, 4, 2], [4, 2, 0, 0]])
    np.testing.assert_array_equal([va.y[0], te.y[0]], [1, 0])


def test_aan_default_length(tmp_path):
    write_aan(tmp_path, AAN)
    ds = prepare_retrieval(tmp_path / "lra_release" / "tsv_data", tmp_path / "out", progress=False)
    assert ds.splits["train"].x.shape == (2, 2, 4000)
    assert ds.meta["options"] == {"l_max": 4000}


@pytest.mark.parametrize(
    "lines, match",
    [
        (b"1\ta\tb\tb'x'\tb'y'\n0\ta\tb\tb'x'\n", r"new_aan_pairs\.train\.tsv, line 2: expected 5"),
        (b"1\ta\tb\tb'x'\tb'y'\n2\ta\tb\tb'x'\tb'y'\n", r"train\.tsv, line 2: label '2'"),
        (b"", r"new_aan_pairs\.train\.tsv: the train split has no examples"),
        (b"1\ta\tb\tb'x'\tb'\xc3'\n", r"train\.tsv, line 1: not valid UTF-8"),
    ],
)
def test_aan_bad_input(tmp_path, lines, match):
    d = write_aan(tmp_path, AAN)
    (d / "new_aan_pairs.train.tsv").write_bytes(lines)
    out = tmp_path / "cache" / "retrieval"
    with pytest.raises(DatasetError, match=match):
        prepare_retrieval(tmp_path, out, progress=False)
    assert_nothing_cached(out)


def test_aan_missing_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    with pytest.raises(DatasetError) as err:
        prepare_retrieval(progress=False)
    msg = str(err.value)
    assert "lra_release.gz" in msg
    assert str(tmp_path / "root" / "lra_release" / "lra_release" / "tsv_data") in msg


def test_progress_is_logged_not_printed(tmp_path, capsys, caplog):
    write_listops(tmp_path, LISTOPS_ROWS)
    with caplog.at_level(logging.INFO, logger="s5jax.data"):
        prepare_listops(tmp_path, tmp_path / "out")
    assert "[listops train] 2 done" in caplog.text
    assert capsys.readouterr().out == ""


def test_progress_uses_the_installed_bar(tmp_path):
    """With a factory installed (the `s5jax` command installs the trainer's bar), each
    loop's bar reaches the number of items and is closed."""
    from s5jax.data import set_progress_factory

    bars = []

    class Bar:
        def __init__(self, label, total):
            self.label, self.total, self.n, self.closed = label, total, 0, False
            bars.append(self)

        def update(self, n):
            self.n += n

        def close(self):
            self.closed = True

    write_listops(tmp_path, LISTOPS_ROWS)
    previous = set_progress_factory(Bar)
    try:
        prepare_listops(tmp_path, tmp_path / "out")
    finally:
        set_progress_factory(previous)
    train = [b for b in bars if b.label == "listops train"]
    assert len(train) == 1 and train[0].n == 2 and train[0].closed
