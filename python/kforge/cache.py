"""The kernel cache: synthesized kernels, content-addressed, shared by every compile.

A key is the SHA-256 of everything that decides what kernel synthesis produces: the region's
content hash, the target, the precision policy, the provider and its (non-secret) options, and
the versions of triton and torch (a new Triton may compile the same source differently). An
entry holds the kernel source, its launch config and its verification record.

Location: $KFORGE_CACHE, else ~/.cache/kforge. Entries are written atomically (a temporary
file in the same directory, then rename), so a killed compile leaves either the old entry or the
new one. Each entry carries a checksum of its payload; an entry that does not parse or whose
checksum does not match is reported, removed and recomputed.

Workers on several machines share one cache directory (on shared storage; kforge.workers).
No two of them write the same entry: a worker holds the entry's claim (`claim`, a POSIX lock
on `<digest>.lock` beside it, which the kernel drops if the worker dies) while it synthesizes;
a second worker waits for it, then reads the entry the first one wrote.

Modes: "use" (read and write), "only" (`--cache-only`: a miss is an error: reproducible builds
that never synthesize), "refresh" (ignore what is there, write new results), "off".
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from kforge.errors import UserError

SCHEMA = "kforge.cache-entry"
VERSION = 1
MODES = ("use", "only", "refresh", "off")


class CacheMiss(UserError):
    """`--cache-only` and the cache has no kernel for a region."""


def default_root() -> Path:
    env = os.environ.get("KFORGE_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kforge"


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for pkg in ("torch", "triton"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "none"
    return out


@functools.lru_cache(maxsize=1)
def builtin_generator_digest() -> str:
    """Digest of the builtin generator's own code, and of the targets' (their configuration
    spaces and math spellings): a kernel it made before a change to either is not served for
    its key afterwards (the new generator may make a better one)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for folder in (root / "providers" / "builtin", root / "kernels", root / "targets"):
        for path in sorted(folder.glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def builtin_knobs() -> dict:
    """The builtin generator's switches set in the environment (KFORGE_BUILTIN_TMA,
    KFORGE_BUILTIN_PAIRED, ...): they change the configurations it offers, so a kernel made
    under one setting is not served under another."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("KFORGE_BUILTIN_")}


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()


@dataclass(frozen=True)
class CacheKey:
    region: str
    target: str
    precision: str
    provider: str
    provider_config: dict = field(default_factory=dict)
    versions: dict = field(default_factory=_versions)

    def fields(self) -> dict:
        out = {"schema": VERSION, "region": self.region, "target": self.target,
               "precision": self.precision, "provider": self.provider,
               "provider_config": self.provider_config, "versions": self.versions}
        if self.provider == "builtin":
            out["generator"] = builtin_generator_digest()
            knobs = builtin_knobs()
            if knobs:           # (absent when none is set: the keys of earlier entries hold)
                out["builtin_env"] = knobs
        return out

    @property
    def digest(self) -> str:
        return hashlib.sha256(_canonical(self.fields())).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """What synthesis produced for one key: the kernel and how it fared."""
    status: str                  # verified | candidate (generated for an absent target)
    source: str
    provider: str
    config: dict = field(default_factory=dict)
    verification: dict = field(default_factory=dict)   # VerificationRecord.to_json()
    time_ms: float | None = None
    rounds: int = 0
    notes: str = ""

    def to_json(self) -> dict:
        return {"status": self.status, "source": self.source, "provider": self.provider,
                "config": self.config, "verification": self.verification,
                "time_ms": self.time_ms, "rounds": self.rounds, "notes": self.notes}

    @staticmethod
    def from_json(d: dict) -> "CacheEntry":
        return CacheEntry(status=d["status"], source=d["source"], provider=d["provider"],
                          config=d.get("config") or {}, verification=d.get("verification") or {},
                          time_ms=d.get("time_ms"), rounds=int(d.get("rounds") or 0),
                          notes=d.get("notes") or "")


class KernelCache:
    def __init__(self, root: str | os.PathLike | None = None, mode: str = "use"):
        if mode not in MODES:
            raise UserError(f"unknown cache mode {mode!r} (use one of {', '.join(MODES)})")
        self.root = Path(root).expanduser() if root else default_root()
        self.mode = mode
        self.corrupt: list[Path] = []     # entries found damaged (and removed) this session

    def path(self, key: CacheKey) -> Path:
        d = key.digest
        return self.root / f"v{VERSION}" / d[:2] / f"{d}.json"

    def get(self, key: CacheKey) -> CacheEntry | None:
        """The entry for `key`, or None. In "only" mode a miss raises CacheMiss."""
        if self.mode in ("off", "refresh"):
            return None
        path = self.path(key)
        entry = self._read(path, key)
        if entry is None and self.mode == "only":
            raise CacheMiss(
                f"--cache-only: no cached kernel for region {key.region} (target {key.target}, "
                f"precision {key.precision}, provider {key.provider}, torch "
                f"{key.versions.get('torch')}, triton {key.versions.get('triton')}) in "
                f"{self.root}; run once without --cache-only to synthesize it")
        return entry

    def _read(self, path: Path, key: CacheKey) -> CacheEntry | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw)
            payload = doc["payload"]
            ok = doc.get("schema") == SCHEMA and doc.get("version") == VERSION and \
                doc.get("checksum") == hashlib.sha256(_canonical(payload)).hexdigest() and \
                payload.get("key") == key.fields()
            entry = CacheEntry.from_json(payload["entry"]) if ok else None
        except (ValueError, KeyError, TypeError):
            entry = None
        if entry is None:
            self.corrupt.append(path)
            warnings.warn(f"kforge cache: damaged entry {path} removed; the region is "
                          "synthesized again", RuntimeWarning, stacklevel=3)
            try:
                path.unlink()
            except OSError:
                pass
        return entry

    def put(self, key: CacheKey, entry: CacheEntry) -> Path | None:
        if self.mode == "off":
            return None
        payload = {"key": key.fields(), "entry": entry.to_json()}
        doc = {"schema": SCHEMA, "version": VERSION,
               "checksum": hashlib.sha256(_canonical(payload)).hexdigest(), "payload": payload}
        path = self.path(key)
        atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True))
        return path

    def put_missing(self, key: CacheKey, entry: CacheEntry) -> bool:
        """Write `entry` unless the cache holds it already (a worker wrote it to this same,
        shared directory). Returns whether it wrote."""
        if self.mode == "off":
            return False
        path = self.path(key)
        if path.is_file():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                have = KernelCache(self.root, "use")._read(path, key)
            if have is not None and \
                    _canonical(have.to_json()) == _canonical(entry.to_json()):
                return False
        self.put(key, entry)
        return True

    @contextlib.contextmanager
    def claim(self, key: CacheKey):
        """Hold the right to synthesize and write `key`'s entry for the block. Waits while
        another process holds it; the lock goes with the holder's process if it dies. POSIX
        locks (lockf) also hold across hosts on NFS."""
        if self.mode == "off":
            yield
            return
        path = self.path(key).with_suffix(".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            yield
        finally:
            try:
                fcntl.lockf(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a file so that readers see the old content or the new, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
