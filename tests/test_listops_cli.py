"""ListOps at a chosen length: `s5jax data prepare listops` with the generator's length and
size options and `--l-max`; `data.seq_len` reaching the reader; lengths reaching the pooling."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from s5jax.cli import main
from s5jax.config import DataConfig, ModelConfig, OptimConfig
from s5jax.data import generate_listops, generate_listops_examples, listops_tokenize
from s5jax.nn import build_model
from s5jax.train import build_optimizer
from s5jax.train._datasets import load_dataset
from s5jax.train._steps import make_steps

GEN = ["--min-length", "10", "--max-length", "40", "--n-train", "30", "--n-val", "5"]
GEN += ["--n-test", "4", "--seed", "1"]


def test_generate_short_listops_at_a_matching_length(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    src = tmp_path / "src"
    argv = ["data", "prepare", "listops", "--generate", "--source", str(src), "--l-max", "40"]
    assert main([*argv, *GEN]) == 0
    assert "length L = 40" in capsys.readouterr().out
    ds = load_dataset(DataConfig(dataset="listops", seq_len=40))
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 30, "val": 5, "test": 4}
    assert ds.meta["generated"]["params"]["min_length"] == 10
    assert ds.meta["generated"]["params"]["max_length"] == 40
    expected = generate_listops_examples(39, seed=1, min_length=10, max_length=40)
    itos = ds.meta["vocab"]
    for split, lo in (("train", 0), ("val", 30), ("test", 35)):
        sp = ds.splits[split]
        assert sp.x.shape[1] == 40
        for i in range(len(sp)):
            src_text, label = expected[lo + i]
            toks = listops_tokenize(src_text)
            assert sp.y[i] == label and sp.lengths[i] == len(toks) + 1 <= 40
            assert [itos[t] for t in sp.x[i, : sp.lengths[i]]] == [*toks, "<eos>"]


def test_generating_again_replaces_only_a_generated_copy(tmp_path, monkeypatch, capsys):
    """A second --generate with another seed replaces the earlier generated copy (and the
    prepared cache follows it); a listops-1000 that was not generated is never replaced."""
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    argv = ["data", "prepare", "listops", "--generate", "--source", str(tmp_path / "src")]
    argv += ["--l-max", "40", *GEN[:-2]]
    assert main([*argv, "--seed", "1"]) == 0
    assert main([*argv, "--seed", "2"]) == 0
    ds = load_dataset(DataConfig(dataset="listops", seq_len=40))
    assert ds.meta["generated"]["seed"] == 2
    want = [label for _, label in generate_listops_examples(30, seed=2, min_length=10,
                                                             max_length=40)]  # fmt: skip
    assert ds.splits["train"].y.tolist() == want
    release = tmp_path / "lra" / "listops-1000"
    release.mkdir(parents=True)
    (release / "basic_train.tsv").write_text("Source\tTarget\r\n")
    capsys.readouterr()
    assert main(["data", "prepare", "listops", "--generate", "--source", str(tmp_path / "lra"),
                 *GEN]) == 2  # fmt: skip
    assert "was not generated here" in capsys.readouterr().err
    assert sorted(p.name for p in release.iterdir()) == ["basic_train.tsv"]


def test_l_max_shorter_than_the_trees_truncates_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    argv = ["data", "prepare", "listops", "--generate", "--source", str(tmp_path / "src")]
    assert main([*argv, "--l-max", "16", *GEN]) == 0
    assert "truncated" in capsys.readouterr().err
    ds = load_dataset(DataConfig(dataset="listops", seq_len=16))
    assert ds.splits["train"].lengths.max() == 16


def test_short_trees_padded_to_the_paper_length_name_the_shorter_options(
    tmp_path, monkeypatch, capsys
):
    # Without --l-max the data matches the listops experiment (L = 2048); the note says how
    # to train at the trees' own length instead.
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    argv = ["data", "prepare", "listops", "--generate", "--source", str(tmp_path / "src")]
    assert main([*argv, *GEN]) == 0
    err = capsys.readouterr().err
    assert "padded to L = 2048" in err and "51 times less work" in err
    assert "--l-max 40 and train with --set data.seq_len=40" in err
    ds = load_dataset(DataConfig(dataset="listops", seq_len=2048))
    assert ds.splits["train"].x.shape[1] == 2048
    assert main([*argv, "--l-max", "40", *GEN]) == 0  # given --l-max: no note
    assert "padded to L" not in capsys.readouterr().err


def test_list_says_which_prepared_copy_cannot_train_the_experiment(tmp_path, monkeypatch, capsys):
    # `s5jax list` said "ready" for a generated L = 40 copy that `train listops` then refuses at
    # its length check; the note names the length and that the copy is generated.
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    argv = ["data", "prepare", "listops", "--generate", "--source", str(tmp_path / "src")]
    assert main([*argv, "--l-max", "40", *GEN]) == 0
    capsys.readouterr()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("listops "))
    assert [c.strip() for c in row.split("|")][2] == "ready (generated; L 40, not 2048)"
    assert "train with --set data.seq_len=N" in out
    assert main([*argv, *GEN]) == 0  # at the experiment's length: generated, nothing more
    capsys.readouterr()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    row = next(x for x in out.splitlines() if x.startswith("listops "))
    assert [c.strip() for c in row.split("|")][2] == "ready (generated)"
    assert "data.seq_len=N" not in out


def test_l_max_reads_an_existing_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    generate_listops(tmp_path / "src", n_train=6, n_val=2, n_test=2, seed=0, min_length=5,
                     max_length=30, progress=False)  # fmt: skip
    assert (
        main(["data", "prepare", "listops", "--source", str(tmp_path / "src"), "--l-max", "30"])
        == 0
    )
    assert load_dataset(DataConfig(dataset="listops")).splits["val"].x.shape == (2, 30)


def test_a_damaged_prepared_copy_is_prepared_again(tmp_path, monkeypatch):
    """Without data.root the prepared cache under the data root is used; when it cannot be
    read (a file cut short) the dataset is prepared again from the copy there."""
    root = tmp_path / "root"
    monkeypatch.setenv("S5JAX_DATA", str(root))
    generate_listops(root, n_train=6, n_val=2, n_test=2, seed=0, min_length=5, max_length=30,
                     progress=False)  # fmt: skip
    cfg = DataConfig(dataset="listops", seq_len=30)
    first = load_dataset(cfg)
    cache = root / "prepared" / "listops"
    damaged = sorted(cache.glob("*.npy"))[0]
    damaged.write_bytes(damaged.read_bytes()[:40])
    again = load_dataset(cfg)
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(again.splits[split].x, first.splits[split].x)
    assert damaged.stat().st_size > 40  # written whole again


def test_data_root_is_prepared_at_data_seq_len(tmp_path, monkeypatch):
    # With data.root set, the reader used to run at l_max = 2048 whatever data.seq_len said,
    # so a short ListOps could not be trained from its folder.
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "root"))
    generate_listops(tmp_path / "src", n_train=6, n_val=2, n_test=2, seed=0, min_length=5,
                     max_length=30, progress=False)  # fmt: skip
    ds = load_dataset(DataConfig(dataset="listops", root=str(tmp_path / "src"), seq_len=30))
    assert ds.splits["train"].x.shape == (6, 30)
    paper = load_dataset(DataConfig(dataset="listops", root=str(tmp_path / "src")))
    assert paper.splits["train"].x.shape == (6, 2048)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--min-length", "10"], "only apply with --generate"),
        (["--n-train", "10"], "only apply with --generate"),
        (["--generate", "--l-max", "1"], "--l-max must be at least 2"),
        (["--generate", "--n-val", "0"], "--n-val must be at least 1"),
        (["--generate", "--min-length", "-1"], "--min-length must be non-negative"),
        (["--generate", "--min-length", "10", "--max-length", "11"], "hold no tree"),
        (
            ["--generate", "--max-length", "400"],
            "--min-length 500 (the default) and --max-length 400 hold no tree",
        ),
        (["--generate", "--count", "5"], "--count applies to pathfinder and pathx only"),
    ],
)
def test_listops_option_errors(tmp_path, monkeypatch, capsys, extra, message):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path))
    assert main(["data", "prepare", "listops", "--source", str(tmp_path / "src"), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "src").exists()  # nothing generated


@pytest.mark.parametrize("flag", ["--l-max", "--min-length", "--n-test"])
def test_listops_options_rejected_for_other_datasets(tmp_path, monkeypatch, capsys, flag):
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path))
    assert main(["data", "prepare", "pathfinder", "--generate", flag, "20"]) == 2
    assert "only apply to listops" in capsys.readouterr().err


def test_eval_step_pools_each_example_over_its_own_length():
    # Unidirectional, at inference (BatchNorm running statistics): outputs at steps < length
    # do not depend on later tokens, so with lengths reaching the masked mean the loss cannot
    # change when the padding is replaced by other tokens; without them it would.
    cfg = ModelConfig(n_layers=2, d_model=8, ssm_size=4, blocks=1, encoder="embedding",
                      pooling="masked_mean", activation="half_glu2")  # fmt: skip
    model, state = build_model(cfg, d_input=20, n_outputs=10, vocab=20, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    optimizer, _ = build_optimizer(OptimConfig(), model, steps_per_epoch=1, epochs=1)
    steps = make_steps(static, optimizer, "classification")
    rng = np.random.default_rng(0)
    x = rng.integers(3, 18, size=(3, 12)).astype(np.int32)
    lengths = np.array([4, 12, 7], np.int32)
    padded = np.where(np.arange(12) < lengths[:, None], x, 0).astype(np.int32)
    batch = {"x": padded, "y": np.array([1, 2, 3], np.int32), "mask": np.ones(3, bool),
             "lengths": lengths}  # fmt: skip
    out = steps.evaluate(params, state, batch, 1.0)
    other = steps.evaluate(params, state, {**batch, "x": x}, 1.0)
    np.testing.assert_allclose(float(out["loss_sum"]), float(other["loss_sum"]), rtol=1e-5)
    # ... and it is the sum of each example's own masked-mean prediction.
    manual = 0.0
    for i in range(3):
        logp, _ = model(
            jnp.asarray(padded[i]), state, inference=True, lengths=jnp.asarray(lengths[i])
        )
        manual -= float(logp[batch["y"][i]])
    np.testing.assert_allclose(float(out["loss_sum"]), manual, rtol=1e-5)
    unmasked = steps.evaluate(params, state, {**batch, "x": x, "lengths": np.full(3, 12)}, 1.0)
    assert abs(float(unmasked["loss_sum"]) - float(out["loss_sum"])) > 1e-4
