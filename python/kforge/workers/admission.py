"""Several tasks on one device: admission by free memory, and timing alone.

With `--gpu-share K` a Ray cluster places up to K region tasks on one GPU (num_gpus = 1/K), so
that one task's Triton compiles and sandbox start-ups overlap another's checks. Two things keep
that honest:

* memory admission: a task starts its work only when the device's free memory, less what the
  tasks already admitted on it have reserved and not yet taken, covers its estimate; its
  reservation lasts until it ends. A task alone on a device is always admitted (it could never
  be otherwise). What a reservation has taken is what the driver reports for its process and
  the processes below it (its sandboxes), so memory in use is not counted twice, once in the
  free figure and once in the reservation (that made decode regions wait behind the prefill
  regions' large reservations on the H200: "86.4 GiB free, 90.8 GiB reserved"). Where the
  driver names no processes (another PID namespace, no nvidia-smi) every reservation counts in
  full: the rule can then refuse a task that would have fit, never admit one that does not.
* timing alone: the task's sandbox processes (kforge/verify/_worker.py) run correctness checks
  under a shared lock on the device and timed runs under an exclusive one (the lock file named
  by $KFORGE_GPU_LOCK), so every time in a verification record was taken with the GPU to itself.

Reservations are files in a per-device folder on this host (the device is this host's), one per
admitted task, removed when it ends; a reservation whose process is gone is ignored.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

# per sandbox process: a CUDA context, PyTorch's caching allocator and Triton's compiler. An
# allowance, not a measurement; KFORGE_TASK_CONTEXT_MB overrides it.
CONTEXT_BYTES = 1 << 30
# operands, their pristine copies, prepared weights, outputs and the poisoned fill (_worker.py)
OPERAND_COPIES = 6


def lock_root() -> Path:
    return Path(os.environ.get("KFORGE_DEVICE_LOCKS") or
                Path(tempfile.gettempdir()) / f"kforge-devices-{os.getuid()}")


def device_tag(target: str) -> str:
    """This process's device: the first GPU CUDA_VISIBLE_DEVICES names (what Ray gave the
    task), or the host's memory for the cpu target."""
    if target == "cpu":
        return "host-memory"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return f"{target}-{visible or '0'}"


def device_lock_path(tag: str) -> Path:
    """The lock the sandbox's timed runs take on a device ($KFORGE_GPU_LOCK)."""
    folder = lock_root() / tag
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "timing.lock"


def estimate_bytes(spec, *, context_bytes: int | None = None) -> int:
    """Device memory one verification of the region needs, roughly."""
    if context_bytes is None:
        mb = os.environ.get("KFORGE_TASK_CONTEXT_MB")
        context_bytes = int(float(mb) * (1 << 20)) if mb else CONTEXT_BYTES
    return int(context_bytes + OPERAND_COPIES * int(getattr(spec, "min_bytes", 0) or 0))


def _nvml(index: str, ask: Callable):
    """ask(pynvml, handle) for the GPU `index` (a number or a UUID), between NVML's init and
    shutdown; ImportError where pynvml is not installed."""
    import pynvml
    pynvml.nvmlInit()
    try:
        return ask(pynvml, pynvml.nvmlDeviceGetHandleByUUID(index) if index.startswith("GPU-")
                   else pynvml.nvmlDeviceGetHandleByIndex(int(index)))
    finally:
        pynvml.nvmlShutdown()


def free_bytes(tag: str) -> int:
    """Free memory of a device (tag from device_tag): NVML or nvidia-smi for an NVIDIA GPU (no
    CUDA context is made for asking), MemAvailable for the host."""
    if tag == "host-memory":
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        raise OSError("/proc/meminfo has no MemAvailable")
    index = tag.rsplit("-", 1)[1]
    try:
        return _nvml(index, lambda nvml, gpu: int(nvml.nvmlDeviceGetMemoryInfo(gpu).free))
    except ImportError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise OSError(f"cannot read the free memory of {tag}: neither pynvml nor nvidia-smi")
    out = subprocess.run([smi, "-i", index, "--query-gpu=memory.free",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return int(float(out.strip().splitlines()[0])) * (1 << 20)


def process_usage(tag: str) -> dict[int, int]:
    """Device memory in use per process id on device `tag`, as the driver reports it ({} where
    it cannot say: the host's memory, no NVML or nvidia-smi)."""
    if tag == "host-memory":
        return {}
    index = tag.rsplit("-", 1)[1]
    try:
        return _nvml(index, lambda nvml, gpu: {
            int(p.pid): int(p.usedGpuMemory or 0)
            for p in nvml.nvmlDeviceGetComputeRunningProcesses(gpu)})
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - an unanswered question counts every reservation
        return {}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    try:
        out = subprocess.run([smi, "-i", index, "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    usage = {}
    for line in out.strip().splitlines():
        pid, _, mib = line.partition(",")
        try:
            usage[int(pid)] = int(float(mib)) * (1 << 20)
        except ValueError:
            continue
    return usage


def _children() -> dict[int, list[int]]:
    """Each process's children, from /proc (Linux; elsewhere none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()       # after "pid (comm) "
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return children


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every process below `pid`, whichever session it is in (`children`: a _children() map
    to walk, read afresh when not given)."""
    children = _children() if children is None else children
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reserved_bytes(folder: Path, usage: dict[int, int] | None = None) -> int:
    """What the live reservations in `folder` hold and have not yet taken: each one's bytes,
    less the device memory (`usage`, per process id) of its process and those below it."""
    return _outstanding(list(_live(folder)), usage)


def _outstanding(live: list[tuple[int, int]], usage: dict[int, int] | None) -> int:
    """reserved_bytes over (pid, bytes) pairs of live reservations (one read of /proc)."""
    if not usage:
        return sum(nbytes for _, nbytes in live)
    children = _children()
    return sum(max(0, nbytes - sum(usage.get(q, 0) for q in [pid] + descendants(pid, children)))
               for pid, nbytes in live)


def _live(folder: Path) -> Iterator[tuple[int, int]]:
    """(pid, bytes) of each reservation whose process lives; the others are removed."""
    for p in folder.glob("*.reservation"):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        pid = int(doc.get("pid", 0))
        if _alive(pid):
            yield pid, int(doc.get("bytes", 0))
        else:
            p.unlink(missing_ok=True)          # its task died: its memory is back


@contextlib.contextmanager
def admitted(need: int, tag: str, *, probe: Callable[[str], int] = free_bytes,
             poll_s: float = 0.5, on_wait: Callable[[str], None] | None = None,
             usage: Callable[[str], dict[int, int]] | None = process_usage):
    """Wait until `need` bytes of device `tag` are free for this task, reserve them for the
    block, and point $KFORGE_GPU_LOCK at the device's timing lock. Yields the seconds waited."""
    folder = lock_root() / tag
    folder.mkdir(parents=True, exist_ok=True)
    mine = folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.reservation"
    t0 = time.monotonic()
    said = False
    while True:
        with open(folder / "admit.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            free = probe(tag)
            live = list(_live(folder))
            reserved = _outstanding(live, usage(tag) if usage and live else None)
            if not live or free - reserved >= need:
                mine.write_text(json.dumps({"pid": os.getpid(), "bytes": int(need),
                                            "since": time.time()}))
                break
        if on_wait and not said:
            on_wait(f"waiting for {need / 2 ** 30:.1f} GiB on {tag} ({free / 2 ** 30:.1f} GiB "
                    f"free, {reserved / 2 ** 30:.1f} GiB reserved by other tasks)")
            said = True
        time.sleep(poll_s)
    old = os.environ.get("KFORGE_GPU_LOCK")
    os.environ["KFORGE_GPU_LOCK"] = str(device_lock_path(tag))
    try:
        yield time.monotonic() - t0
    finally:
        mine.unlink(missing_ok=True)
        if old is None:
            os.environ.pop("KFORGE_GPU_LOCK", None)
        else:
            os.environ["KFORGE_GPU_LOCK"] = old


__all__ = ["admitted", "descendants", "device_lock_path", "device_tag", "estimate_bytes",
           "free_bytes", "process_usage",
           "reserved_bytes"]
