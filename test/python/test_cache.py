"""The kernel cache: keys, atomic writes, corruption, cache-only mode, and a cached synth."""
from __future__ import annotations

import importlib.util
import json
import time
import warnings
from pathlib import Path

import pytest

from kforge.cache import CacheEntry, CacheKey, CacheMiss, KernelCache, default_root
from kforge.spec import load_spec
from kforge.synth import SynthOptions, cache_key, synthesize_region

FIXTURES = Path(__file__).parent / "fixtures" / "engine"
_spec = importlib.util.spec_from_file_location("engine_fixture_provider_cache",
                                               FIXTURES / "fixture_provider.py")
fixture_provider = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixture_provider)

ENTRY = CacheEntry(status="verified", source="def launch(): pass\n", provider="builtin",
                   config={"BLOCK": 16}, verification={"status": "verified"}, time_ms=1.5)


def key(**kw):
    base = dict(region="e1e1e1e1e1e1e1e1", target="cpu", precision="strict",
                provider="builtin", versions={"torch": "2.13.0", "triton": "3.9.0"})
    base.update(kw)
    return CacheKey(**base)


def test_roundtrip_and_key_fields(tmp_path):
    cache = KernelCache(tmp_path)
    assert cache.get(key()) is None
    cache.put(key(), ENTRY)
    assert cache.get(key()) == ENTRY
    for other in (key(target="cuda"), key(precision="bf16"), key(provider="anthropic"),
                  key(versions={"torch": "2.13.0", "triton": "3.10.0"}),
                  key(versions={"torch": "2.14.0", "triton": "3.9.0"}),
                  key(provider_config={"model": "x"}), key(region="ffffffffffffffff")):
        assert other.digest != key().digest
        assert cache.get(other) is None
    assert not list(tmp_path.rglob("*.tmp"))          # atomic: no temporaries left behind


def test_builtin_switches_are_part_of_the_key(monkeypatch, tmp_path):
    """A kernel made with KFORGE_BUILTIN_PAIRED=1 (another configuration space) is not served
    without it, nor the other way round; other providers' keys do not depend on them."""
    for k in [k for k in __import__("os").environ if k.startswith("KFORGE_BUILTIN_")]:
        monkeypatch.delenv(k)
    cache = KernelCache(tmp_path)
    plain, other = key().digest, key(provider="anthropic").digest
    cache.put(key(), ENTRY)
    monkeypatch.setenv("KFORGE_BUILTIN_PAIRED", "1")
    assert key().digest != plain and cache.get(key()) is None
    assert key(provider="anthropic").digest == other
    monkeypatch.setenv("KFORGE_BUILTIN_PAIRED", "0")
    assert key().digest != plain
    monkeypatch.delenv("KFORGE_BUILTIN_PAIRED")
    assert key().digest == plain and cache.get(key()) == ENTRY


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.setenv("KFORGE_CACHE", str(tmp_path / "c"))
    assert default_root() == tmp_path / "c"
    monkeypatch.delenv("KFORGE_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_root() == Path.home() / ".cache" / "kforge"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "edit"])
def test_corruption_is_detected_and_removed(tmp_path, damage):
    cache = KernelCache(tmp_path)
    path = cache.put(key(), ENTRY)
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff" * 100)
    else:   # valid JSON, payload changed behind the checksum's back
        doc = json.loads(text)
        doc["payload"]["entry"]["source"] = "def launch(): return 42\n"
        path.write_text(json.dumps(doc))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.get(key()) is None
    assert any("damaged" in str(w.message) for w in caught)
    assert not path.exists() and cache.corrupt == [path]


def test_cache_only_miss_is_an_error(tmp_path):
    with pytest.raises(CacheMiss, match="--cache-only"):
        KernelCache(tmp_path, "only").get(key())
    KernelCache(tmp_path).put(key(), ENTRY)
    assert KernelCache(tmp_path, "only").get(key()) == ENTRY


def test_second_synthesis_is_served_from_cache(tmp_path):
    spec = load_spec(FIXTURES / "add_relu.json")
    cache = KernelCache(tmp_path)
    options = SynthOptions(rounds=0, provider="scripted")
    t0 = time.monotonic()
    first = synthesize_region(spec, options, cache=cache,
                              provider=fixture_provider.ScriptedProvider([("good",)]))
    first_s = time.monotonic() - t0
    assert first.status == "verified" and not first.from_cache
    assert cache.get(cache_key(spec, options)).status == "verified"
    provider = fixture_provider.ScriptedProvider([("good",)])
    t0 = time.monotonic()
    second = synthesize_region(spec, options, cache=cache, provider=provider)
    second_s = time.monotonic() - t0
    assert second.status == "verified" and second.from_cache
    assert provider.calls == 0 and second.candidate.source == first.candidate.source
    assert second_s < first_s / 5
    with pytest.raises(CacheMiss):
        synthesize_region(load_spec(FIXTURES / "matmul_bias.json"), options,
                          cache=KernelCache(tmp_path, "only"), provider=provider)
