"""Each process's compiled programs kept on disk (workload/compiled_programs.py): a second process
start loads what the first compiled, a damaged file costs a compile and nothing else, and another
program or another place in the world never loads someone else's executable."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from slicekeeper.workload.compiled_programs import ProgramCache


def lowered(scale: float) -> jax.stages.Lowered:
    return jax.jit(lambda x: (x * scale).sum()).lower(jax.ShapeDtypeStruct((4, 3), jnp.float32))


def test_a_restarted_process_loads_what_it_compiled_and_it_computes_the_same(tmp_path):
    x = jnp.arange(12, dtype=jnp.float32).reshape(4, 3)
    first = ProgramCache(tmp_path)
    compiled = first.load_or_compile("step", lowered(2.0))
    assert (first.compiled, first.loaded) == (["step"], [])
    again = ProgramCache(tmp_path)
    loaded = again.load_or_compile("step", lowered(2.0))
    assert (again.compiled, again.loaded) == ([], ["step"])
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(compiled(x)))
    other = ProgramCache(tmp_path)  # the control: another program is compiled, not loaded
    other.load_or_compile("step", lowered(3.0))
    assert other.compiled == ["step"]


def test_a_damaged_file_is_compiled_again_and_replaced(tmp_path, capsys):
    ProgramCache(tmp_path).load_or_compile("step", lowered(2.0))
    [stored] = (tmp_path / "executables").glob("step-*.bin")
    stored.write_bytes(stored.read_bytes()[:100])
    cache = ProgramCache(tmp_path)
    program = cache.load_or_compile("step", lowered(2.0))
    assert cache.compiled == ["step"] and "not loadable" in capsys.readouterr().err
    assert float(program(jnp.ones((4, 3), jnp.float32))) == 24.0
    assert ProgramCache(tmp_path).load_or_compile("step", lowered(2.0)) is not None
    assert [p.name for p in (tmp_path / "executables").iterdir()] == [stored.name]  # no leftovers


def test_the_key_holds_the_process_place_and_the_program(tmp_path, monkeypatch):
    cache = ProgramCache(tmp_path)
    mine = cache.key("step", lowered(2.0).as_text())
    assert cache.key("step", lowered(2.0).as_text()) == mine
    assert cache.key("step", lowered(3.0).as_text()) != mine
    with jax.default_matmul_precision("highest"):  # jax's configuration is part of the key
        assert cache.key("step", lowered(2.0).as_text()) != mine
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    assert cache.key("step", lowered(2.0).as_text()) != mine


class Lowerings:
    """A program's lowering, counted: a signature hit must not trace or lower anything."""

    def __init__(self, scale: float) -> None:
        self.scale, self.calls = scale, 0

    def __call__(self) -> jax.stages.Lowered:
        self.calls += 1
        return lowered(self.scale)


def test_with_a_signature_a_restart_loads_without_lowering_and_another_signature_compiles(tmp_path):
    first = Lowerings(2.0)
    ProgramCache(tmp_path).load_or_compile("step", first, signature="model v1")
    assert first.calls == 1
    again, cache = Lowerings(2.0), ProgramCache(tmp_path)
    program = cache.load_or_compile("step", again, signature="model v1")
    assert (again.calls, cache.loaded) == (0, ["step"])
    assert float(program(jnp.ones((4, 3), jnp.float32))) == 24.0
    changed, cache = Lowerings(3.0), ProgramCache(tmp_path)  # the control: the model changed
    assert float(cache.load_or_compile("step", changed, signature="model v2")(jnp.ones((4, 3)))) == 36.0
    assert (changed.calls, cache.compiled) == (1, ["step"])


def test_without_a_directory_every_program_is_compiled_and_said_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cache = ProgramCache(None)
    for _ in range(2):
        cache.load_or_compile("step", lowered(2.0), signature="model v1")
    assert (cache.compiled, cache.loaded) == (["step", "step"], [])
    assert list(tmp_path.iterdir()) == [] and capsys.readouterr().err == ""  # nothing written, no noise


def test_a_directory_that_cannot_be_made_costs_compiles_and_says_why(tmp_path, capsys):
    (tmp_path / "cache").write_text("a file where the folder should be")
    cache = ProgramCache(tmp_path / "cache")
    assert cache.load_or_compile("step", lowered(2.0)) is not None and cache.compiled == ["step"]
    assert "cannot be made" in capsys.readouterr().err


def test_the_directory_is_made_private(tmp_path):
    ProgramCache(tmp_path / "cache")
    assert (tmp_path / "cache" / "executables").stat().st_mode & 0o777 == 0o700


def test_a_directory_others_may_write_to_is_neither_read_nor_written(tmp_path, capsys):
    ProgramCache(tmp_path).load_or_compile("step", lowered(2.0))  # a program stored while private
    (tmp_path / "executables").chmod(0o777)
    cache = ProgramCache(tmp_path)
    assert cache.refusal is not None and "others may write" in capsys.readouterr().err
    program = cache.load_or_compile("step", lowered(2.0))
    assert (cache.compiled, cache.loaded) == (["step"], [])  # compiled, the pickle never opened
    assert float(program(jnp.ones((4, 3), jnp.float32))) == 24.0
    (tmp_path / "executables").chmod(0o700)  # the control: private again, it loads
    assert ProgramCache(tmp_path).load_or_compile("step", lowered(2.0)) is not None
    assert len(list((tmp_path / "executables").glob("step-*.bin"))) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_program_file_of_another_user_is_not_loaded(tmp_path, capsys):
    ProgramCache(tmp_path).load_or_compile("step", lowered(2.0))
    [stored] = (tmp_path / "executables").glob("step-*.bin")
    os.chown(stored, 12345, 12345)
    cache = ProgramCache(tmp_path)
    cache.load_or_compile("step", lowered(2.0))
    assert cache.compiled == ["step"] and "another user" in capsys.readouterr().err
