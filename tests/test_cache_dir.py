from pathlib import Path

from litlab.lit_modules.core.io import cache_dir


def test_cache_dir_is_the_environment_variable_else_runs_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("LITLAB_CACHE")
    assert cache_dir() == Path("runs/cache")
    # `export LITLAB_CACHE=` must not scatter cache files over the working directory
    monkeypatch.setenv("LITLAB_CACHE", "")
    assert cache_dir() == Path("runs/cache")
