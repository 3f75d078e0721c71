"""Corrupted experiment TOMLs and checkpoint files (issue 17): every case ends in a correct run or
in one `s5jax <command>: error:` line with exit status 2, never a traceback, never an
"unexpected" status 1, and never a change to the run directory outside `checkpoints/`.

Own-data `.npz` corruption is covered by tests/test_npz_fuzz.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from s5jax.cli import main
from s5jax.config import experiment_path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

_TOML = experiment_path("synthetic").read_text(encoding="utf-8")
_VALUE_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) = (.*)$")


def _one_error_line(stderr: str, command: str) -> str:
    """The single error line of a failed command (the other lines may be warnings)."""
    assert "Traceback" not in stderr, stderr
    assert "Event loop is closed" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, stderr
    assert errors[0].startswith(f"s5jax {command}: error: "), stderr
    assert "unexpected" not in errors[0], stderr
    return errors[0]


# --- TOML configs -----------------------------------------------------------------------------

_keys = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
_scalars = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),  # nan, inf, -inf are TOML
    st.booleans().map(lambda b: "true" if b else "false"),
    st.text(max_size=12).map(json.dumps),
    st.sampled_from(['"none"', '""', '"zoh"', '"dense"', "0", "-1", "1e400", "1979-05-27"]),
)
_literals = st.one_of(
    _scalars,
    st.lists(_scalars, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
    st.dictionaries(_keys, _scalars, max_size=2).map(
        lambda d: "{" + ", ".join(f"{k} = {v}" for k, v in d.items()) + "}"
    ),
)


@st.composite
def _toml_texts(draw) -> bytes:
    lines = _TOML.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        values = [i for i, line in enumerate(lines) if _VALUE_LINE.match(line)]
        kind = draw(
            st.sampled_from(
                ["replace", "duplicate", "unknown", "delete_line", "section", "bytes"]
                if values
                else ["unknown", "section", "bytes"]
            )
        )
        if kind in ("replace", "duplicate"):
            i = draw(st.sampled_from(values))
            key = _VALUE_LINE.match(lines[i]).group(1)
            new = f"{key} = {draw(_literals)}"
            if kind == "replace":
                lines[i] = new
            else:
                lines.insert(i + 1, new)
        elif kind == "unknown":
            at = draw(st.integers(0, len(lines)))
            lines.insert(at, f"{draw(_keys)} = {draw(_literals)}")
        elif kind == "delete_line" and lines:
            del lines[draw(st.integers(0, len(lines) - 1))]
        elif kind == "section":
            header = draw(st.sampled_from(["[model]", "[optim]", "[data]", "[train]", "[paper]"]))
            lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from([header, "[x]"])))
        else:
            data = bytearray("\n".join(lines).encode("utf-8"))
            op = draw(st.sampled_from(["flip", "delete", "insert", "truncate"]))
            at = draw(st.integers(0, max(len(data) - 1, 0)))
            if op == "flip" and data:
                data[at] ^= draw(st.integers(1, 255))
            elif op == "delete":
                del data[at : at + draw(st.integers(1, 16))]
            elif op == "insert":
                data[at:at] = draw(st.binary(min_size=1, max_size=8))
            else:
                del data[at:]
            return bytes(data)
    return ("\n".join(lines) + "\n").encode("utf-8")


def _config(path: Path, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        status = main(["config", str(path)])
    except Exception as e:  # reported with the input that raised it
        raise AssertionError(f"main raised {type(e).__name__}: {e}") from e
    out, err = capsys.readouterr()
    return status, out, err


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=_toml_texts())
def test_a_corrupted_experiment_toml_loads_or_is_one_config_error(capsys, data):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mine.toml"
        path.write_bytes(data)
        status, out, err = _config(path, capsys)
        assert status in (0, 2), (status, err)
        event(f"config exit status {status}")
        if status == 2:
            line = _one_error_line(err, "config")
            assert str(path) in line, line
            assert out == ""
            return
        assert "Traceback" not in err, err
        printed = tomllib.loads(out)
        assert printed["data"]["dataset"]
        # What `config` prints is itself a config that loads to the same text.
        again = Path(folder) / "again.toml"
        again.write_text(out, encoding="utf-8")
        assert _config(again, capsys)[:2] == (0, out)


def test_the_pristine_toml_loads(capsys, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(_TOML, encoding="utf-8")
    status, out, _ = _config(path, capsys)
    assert status == 0
    assert tomllib.loads(out)["model"]["d_model"] == 16


def test_a_toml_that_is_not_utf8_names_the_file_and_line(capsys, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_bytes(_TOML.encode("utf-8").replace(b"d_model", b"d_\xffmodel", 1))
    status, _, err = _config(path, capsys)
    assert status == 2
    line = _one_error_line(err, "config")
    lineno = _TOML[: _TOML.index("d_model")].count("\n") + 1
    assert f"{path}: line {lineno}:" in line, line
    assert "UTF-8" in line, line


# --- checkpoint files -------------------------------------------------------------------------


def _snapshot(run: Path) -> dict[str, tuple[int, str]]:
    """Name, size and sha256 of every file of the run outside `checkpoints/`."""
    return {
        str(p.relative_to(run)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.relative_to(run).parts[0] != "checkpoints"
    }


def _eval(run: Path, which: str, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        status = main(["eval", str(run), "--checkpoint", which])
    except Exception as e:  # reported with the input that raised it
        raise AssertionError(f"main raised {type(e).__name__}: {e}") from e
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One tiny trained run (two epochs: latest steps 8 and 16, best step 8) and its losses."""
    run = tmp_path_factory.mktemp("pristine") / "run"
    status = main(
        ["train", "synthetic", "--workdir", str(run), "--set", "train.epochs=2", "--no-progress"]
    )
    assert status == 0
    steps = {
        which: sorted(int(p.name) for p in (run / "checkpoints" / which).iterdir() if p.is_dir())
        for which in ("latest", "best")
    }
    assert len(steps["latest"]) == 2, steps  # so `latest` has an older step to fall back to
    files = sorted(str(p.relative_to(run)) for p in (run / "checkpoints").rglob("*") if p.is_file())
    return run, steps, files


@st.composite
def _checkpoint_damage(draw, files: list[str]):
    name = draw(st.sampled_from(files))
    kind = draw(st.sampled_from(["flip", "truncate", "delete", "garbage", "empty"]))
    return name, kind, draw(st.randoms(use_true_random=False))


def _damage(path: Path, kind: str, rng) -> None:
    data = bytearray(path.read_bytes())
    if kind == "delete":
        path.unlink()
        return
    if kind == "flip" and data:
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= rng.randint(1, 255)
    elif kind == "truncate":
        del data[rng.randrange(len(data) + 1) if data else 0 :]
    elif kind == "garbage":
        data = bytearray(rng.randbytes(rng.randint(1, 64)))
    elif kind == "empty":
        data = bytearray()
    path.write_bytes(bytes(data))


def test_corrupted_checkpoint_files_fall_back_or_are_one_error(pristine, capsys):
    run, steps, files = pristine
    # The pristine losses: `latest` (its newest step) and `best`; the older `latest` step and
    # the `best` step are the same step (8), so falling back from latest lands on best's loss.
    expected = {}
    for which in ("latest", "best"):
        status, out, err = _eval(run, which, capsys)
        assert status == 0, err
        expected[which] = json.loads(out)["loss"]
    assert steps["latest"][0] == steps["best"][-1], steps
    older = expected["best"]

    @settings(
        max_examples=14,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(case=_checkpoint_damage(files))
    def check(case):
        name, kind, rng = case
        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder) / "run"
            shutil.copytree(run, copy)
            _damage(copy / name, kind, rng)
            before = _snapshot(copy)
            for which in ("latest", "best"):
                status, out, err = _eval(copy, which, capsys)
                assert status in (0, 2), (name, kind, which, status, err)
                event(f"eval {which} exit status {status}")
                if status == 2:
                    _one_error_line(err, "eval")
                    assert out == "", out
                    continue
                assert "Traceback" not in err and "Event loop is closed" not in err, err
                loss = json.loads(out)["loss"]
                # Only damage to the newest `latest` step may move `latest` back to step 8.
                newest = name.startswith(f"checkpoints/latest/{steps['latest'][-1]}/")
                allowed = {expected[which]} | ({older} if newest and which == "latest" else set())
                assert loss in allowed, (name, kind, which, loss, allowed, err)
            assert _snapshot(copy) == before, (name, kind)

    check()
