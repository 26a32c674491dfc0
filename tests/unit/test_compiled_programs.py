"""Each process's compiled programs kept on disk (workload/compiled_programs.py): a second process
start loads what the first compiled, a damaged file costs a compile and nothing else, and another
program or another place in the world never loads someone else's executable."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
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
    mine = cache.key("step", lowered(2.0))
    assert cache.key("step", lowered(2.0)) == mine
    assert cache.key("step", lowered(3.0)) != mine
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    assert cache.key("step", lowered(2.0)) != mine
