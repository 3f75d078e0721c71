"""`s5jax export` / `export_run`: the deserialised forward and step functions (jax alone, no
s5jax classes) give the live model's outputs; the loader example runs where s5jax cannot be
imported; a bidirectional model exports only its forward."""

import json
import pathlib
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from s5jax.cli import main
from s5jax.train import export_run

from ._fixtures import read_npz
from .test_predict import alone, features, make_run

pytest.importorskip("flatbuffers")  # jax.export's serialisation needs it

ROOT = Path(__file__).resolve().parents[1]
# Float32 forward (sequential scan, whole sequence) against the same model's offline forward
# or its one-step recurrence: rounding differences of a few ulps per step over ~10 steps and
# two layers, on outputs of order 1.
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _load(folder):
    spec = json.loads((folder / "spec.json").read_text())
    forward = jax.export.deserialize(bytearray((folder / "forward.jax").read_bytes()))
    return spec, forward


def _steps(folder, spec, x, dt):
    """Step the exported step function over (n, L) sequences; outputs stacked on axis 1."""
    step = jax.export.deserialize(bytearray((folder / "step.jax").read_bytes()))
    init = read_npz(folder / "init_state.npz")
    state = tuple(np.broadcast_to(init[s["name"]], (len(x), *s["shape"])) for s in spec["state"])
    outs = []
    for k in range(x.shape[1]):
        state, out = step.call(state, x[:, k], dt[:, k], np.full(len(x), k == 0))
        outs.append(out)
    return jax.tree.map(lambda *o: np.stack(o, axis=1), *outs)


def _dt(t):
    return np.concatenate([np.ones_like(t[:, :1]), np.diff(t, axis=1)], axis=1).astype(np.float32)


def test_pooled_classifier_forward_and_step_equal_the_live_model(
    tmp_path, user_facing, monkeypatch
):
    # (`user_facing`: the test-time jaxtyping checks reject symbolic dimensions.)
    rng = np.random.default_rng(0)
    arrays = features(rng, lengths=True, times=True)
    run_dir, _ = make_run(tmp_path, arrays, "model.pooling=masked_mean",
                          "model.timestep_mode=irregular")  # fmt: skip
    folder = export_run(run_dir, tmp_path / "exp")
    spec, forward = _load(folder)
    assert [i["name"] for i in spec["forward"]["inputs"]] == ["x", "lengths", "dt"]
    assert spec["forward"]["inputs"][0]["shape"] == ["b", "l", 3]
    assert spec["forward"]["length"] == "symbolic" and spec["metric"] == "accuracy"
    assert "no times" not in spec["forward"]["call"] + spec["step"]["call"]  # times matter
    # Another batch size and length than training's (10): both dimensions are symbolic.
    x = rng.standard_normal((5, 13, 3)).astype(np.float32)
    lengths = np.array([13, 1, 7, 12, 5], np.int32)
    dt = _dt(np.cumsum(rng.uniform(0.1, 2.0, (5, 13)), axis=1))
    want = alone(run_dir, x, lengths, dt)
    np.testing.assert_allclose(forward.call(x, lengths, dt), want, **TOL)
    # spec.json's hint, run in the export folder as written, loads the same program (and
    # closes the file: an unclosed one is a ResourceWarning, an error in this suite)
    monkeypatch.chdir(folder)
    load = spec["forward"]["call"].split(".call(")[0]
    hinted = eval(load, {"jax": jax, "pathlib": pathlib})
    np.testing.assert_array_equal(hinted.call(x, lengths, dt), forward.call(x, lengths, dt))
    online = _steps(folder, spec, x, dt)  # (5, 13, C): the pooled output after every step
    np.testing.assert_allclose(online[np.arange(5), lengths - 1], want, **TOL)


def test_per_step_gaussian_forward_and_step_equal_the_live_model(tmp_path):
    rng = np.random.default_rng(1)
    arrays = features(rng, D=2)
    for s in ("train", "val", "test"):
        arrays[f"y_{s}"] = rng.standard_normal((*arrays[f"x_{s}"].shape[:2], 2)).astype(np.float32)
    run_dir, _ = make_run(tmp_path, arrays, "model.head=gaussian", "model.timestep_mode=drop")
    folder = export_run(run_dir, tmp_path / "exp", length=10)
    spec, forward = _load(folder)
    assert spec["forward"]["length"].startswith("fixed length 10")
    assert [o["name"] for o in spec["forward"]["outputs"]] == ["mean", "variance"]
    x = arrays["x_test"][:6]
    mean, var = alone(run_dir, x)
    got = forward.call(x)
    np.testing.assert_allclose(got[0], mean, **TOL)
    np.testing.assert_allclose(got[1], var, **TOL)
    online = _steps(folder, spec, x, np.ones(x.shape[:2], np.float32))
    np.testing.assert_allclose(online[0], mean, **TOL)
    np.testing.assert_allclose(online[1], var, **TOL)


def test_bidirectional_model_exports_only_the_forward(tmp_path, capsys):
    rng = np.random.default_rng(2)
    arrays = features(rng, n=8)
    run_dir, _ = make_run(tmp_path, arrays, "model.bidirectional=true")
    assert main(["export", str(run_dir), "--out", str(tmp_path / "exp")]) == 0
    folder = tmp_path / "exp"
    assert sorted(p.name for p in folder.iterdir()) == ["forward.jax", "spec.json"]
    spec, forward = _load(folder)
    assert spec["step"] is None and "bidirectional" in spec["no_step"]
    x, dt = arrays["x_test"][:3], np.ones((3, 10), np.float32)  # timestep_mode irregular
    np.testing.assert_allclose(forward.call(x, dt), alone(run_dir, x, dt=dt), **TOL)
    # Trained without times, the model is the live model without dt when given ones: the
    # spec says to give ones.
    np.testing.assert_allclose(forward.call(x, dt), alone(run_dir, x), **TOL)
    assert "(the run's data had no times: all ones)" in spec["forward"]["call"]
    # An existing non-empty folder is refused (one line), unless --overwrite.
    capsys.readouterr()
    assert main(["export", str(run_dir), "--out", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--overwrite" in err
    assert main(["export", str(run_dir), "--out", str(folder), "--overwrite"]) == 0
    # --overwrite replaces only an earlier export: a user's file or folder given by mistake is
    # refused (one line) and left as it was, and nothing is left beside it.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    (tmp_path / "data.npz").write_bytes(b"keep too")
    before = sorted(p.name for p in tmp_path.iterdir())
    refusals = {"mine": "is not an s5jax export (it holds notes.txt)", "data.npz": "is a file"}
    for out, words in refusals.items():
        capsys.readouterr()
        assert main(["export", str(run_dir), "--out", str(tmp_path / out), "--overwrite"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("s5jax export: error: --out ") and words in err, err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    assert (tmp_path / "data.npz").read_bytes() == b"keep too"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_loader_example_runs_without_s5jax_and_matches_the_live_model(tmp_path, user_facing):
    rng = np.random.default_rng(3)
    arrays = features(rng, lengths=True)
    run_dir, _ = make_run(tmp_path, arrays, "model.pooling=masked_mean")
    folder = export_run(run_dir, tmp_path / "exp")
    data = tmp_path / "few.npz"
    np.savez(data, x=arrays["x_test"][:4], lengths=arrays["lengths_test"][:4])
    saved = tmp_path / "saved.npz"
    argv = [str(folder), "--data", str(data), "--save", str(saved)]
    code = (
        "import sys, runpy; sys.modules['s5jax'] = None; "
        f"sys.argv = ['load_exported.py', *{argv!r}]; "
        "runpy.run_path(sys.argv_script, run_name='__main__')"
    ).replace("sys.argv_script", repr(str(ROOT / "examples" / "load_exported.py")))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["n"] == 4 and report["max_abs_difference_forward_vs_step"] < 1e-5
    out = read_npz(saved)
    want = alone(run_dir, arrays["x_test"][:4], arrays["lengths_test"][:4].astype(np.int32),
                 dt=np.ones((4, 10), np.float32))  # fmt: skip
    np.testing.assert_allclose(out["forward_log_probs"], want, **TOL)
    np.testing.assert_allclose(out["step_log_probs"], want, **TOL)


def test_a_run_exports_and_predicts_without_its_training_data(tmp_path, capsys):
    """`s5jax train` records the data's shapes and normalisation in data_spec.json: from it
    alone (the training file moved away) export and predict --data NEW give what the model
    rebuilt from the training data gives (spec.json, the exported functions' outputs, the
    stream's initial state, the predictions); eval, which needs the examples, says what is
    missing."""
    rng = np.random.default_rng(5)
    data = tmp_path / "mine.npz"
    np.savez(data, **features(rng, n=16, lengths=True, times=True))
    new = tmp_path / "new.npz"
    times = np.cumsum(rng.uniform(0.5, 1.5, (3, 10)), axis=1)
    x_new = rng.standard_normal((3, 10, 3)).astype(np.float32)
    np.savez(new, x=x_new, lengths=np.array([10, 4, 9]), t=times)
    run = tmp_path / "run"
    sets = ["train.epochs=1", "model.n_layers=1", "model.d_model=8", "model.ssm_size=4",
            "model.blocks=1", "data.normalize=channel", "model.bidirectional=false"]  # fmt: skip
    argv = ["train", "--data", str(data), "--workdir", str(run), "--no-progress"]
    assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 0
    assert json.loads((run / "data_spec.json").read_text())["meta"]["normalization"]["mode"] == (
        "channel"
    )

    def outputs(tag):
        export = ["export", str(run), "--out", str(tmp_path / f"exp-{tag}")]
        predict = ["predict", str(run), "--data", str(new), "--out", str(tmp_path / f"{tag}.npz")]
        assert main(export) == 0 and main([*predict, "--no-progress"]) == 0
        folder = tmp_path / f"exp-{tag}"
        spec, forward = _load(folder)
        return (
            (folder / "spec.json").read_text(),
            {"forward": forward.call(x_new, np.array([10, 4, 9], np.int32), _dt(times))},
            dict(read_npz(folder / "init_state.npz")),
            {"online": _steps(folder, spec, x_new, _dt(times))},
            dict(read_npz(tmp_path / f"{tag}.npz")),
        )

    # the reference: the model rebuilt from the training data itself (no data_spec.json)
    (run / "data_spec.json").rename(tmp_path / "spec.json")
    with_data = outputs("with")
    (tmp_path / "spec.json").rename(run / "data_spec.json")
    data.rename(tmp_path / "moved.npz")
    without = outputs("without")
    assert with_data[0] == without[0]  # spec.json: shapes, normalisation, config
    for a, b in zip(with_data[1:], without[1:], strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2
    assert "export and predict --data NEW work without it" in capsys.readouterr().err
