"""The sandboxed half of verification: runs one candidate on the checks of a job directory.

Started by kforge.verify.sandbox as `python _worker.py JOB_DIR [DEVICE]` (a script, so the
`kforge` package is never imported here and a candidate cannot reach KForge's reference), before
the parent computes its references: it imports torch and Triton and opens the device's context
(about 5 s on the H200, as long as the references take) and waits for job.json, which the
parent writes when its references are done (or exits when the parent is gone). Then it
regenerates each check's inputs from its seed (kforge/verify/inputs.py, loaded by path), runs
the candidate and writes what it observed: outputs_<i>.pt (the results: a JSON list of raw byte
files beside it, kforge.verify.verifier.load_outputs), result.json (launch counts, torch ops
seen during launch, inputs modified, timing, errors). It never decides whether the candidate is
correct: the parent compares the outputs with the reference it computed itself, as they come
(it deletes each check's outputs once compared; the worker waits for that before timing, so the
candidate is timed with the device to itself, and in job["stream"] mode after every check).

Guards installed before the candidate is imported:
  * imports of kforge, torch_mlir, mlir, subprocess... are refused;
  * torch.empty / empty_like / empty_strided / Tensor.new_empty return NaN-poisoned memory
    (and on GPUs the caching allocator is filled with NaN before each run), so an element the
    kernel does not write is NaN, never a stale correct value;
  * Triton launches are counted (a launch that runs no kernel is rejected by the parent);
  * a TorchFunctionMode records torch calls executed by `launch` outside kernel launches.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.abc
import importlib.util
import json
import math
import os
import sys
import time
import traceback

JOB = sys.argv[1] if len(sys.argv) > 1 else "."
BLOCKED_IMPORTS = ("kforge", "torch_mlir", "mlir", "subprocess", "multiprocessing", "ctypes",
                   "socket", "pickle", "shutil")
# torch functions/methods a launcher may call itself: allocation, views, copies, casts, metadata.
ALLOWED_TORCH = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "zero_", "fill_", "full", "full_like", "new_zeros", "new_full", "view",
    "reshape", "t", "transpose", "permute", "expand", "expand_as", "squeeze", "unsqueeze",
    "contiguous", "clone", "to", "detach", "float", "half", "bfloat16", "double", "int", "long",
    "bool", "cuda", "xpu", "size", "stride", "dim", "ndimension", "numel", "nelement",
    "is_contiguous", "data_ptr", "element_size", "storage_offset", "untyped_storage", "__get__",
    "__len__", "__getitem__", "__format__", "__repr__", "is_floating_point", "get_device",
    "unbind", "split", "chunk", "narrow", "select", "view_as", "reshape_as", "flatten",
    "unflatten", "set_", "dim_order", "is_complex", "type", "requires_grad_",
    "_set_grad_enabled", "_enter_inference_mode", "_exit_inference_mode",   # no_grad & co.
}

_state = {"launches": 0, "in_kernel": 0, "watching": False, "ops": []}


@contextlib.contextmanager
def _device_lock(exclusive: bool):
    """A GPU shared by several tasks (kforge.workers.admission, $KFORGE_GPU_LOCK): checks hold
    it shared, timed runs alone. Taking the turnstile first keeps a waiting timed run from being
    starved by a stream of checks."""
    path = os.environ.get("KFORGE_GPU_LOCK")
    if not path:
        yield
        return
    with open(path + ".turn", "a+") as turn, open(path, "a+") as lock:
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_json(name: str, obj) -> None:
    tmp = os.path.join(JOB, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, os.path.join(JOB, name))


class _ImportBlocker(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED_IMPORTS:
            raise ImportError(f"kforge sandbox: a kernel may not import {fullname}")
        return None


def _load_sibling(name: str):
    """kforge/verify/<name>.py, loaded by path (the worker imports nothing of kforge); once
    per process (a forked worker has the zygote's)."""
    loaded = sys.modules.get(f"_kforge_sandbox_{name}")
    if loaded is not None:
        return loaded
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_kforge_sandbox_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _install_guards(torch, device: str):
    from torch.overrides import TorchFunctionMode

    def poison(t):
        if t.numel():
            if t.dtype.is_floating_point or t.dtype.is_complex:
                t.fill_(float("nan"))
            elif t.dtype == torch.bool:
                t.fill_(True)
            else:
                t.fill_(torch.iinfo(t.dtype).min + 7)
        return t

    def wrap(fn):
        def poisoned(*args, **kwargs):
            return poison(fn(*args, **kwargs))
        poisoned.__name__ = getattr(fn, "__name__", "poisoned")
        return poisoned

    torch.empty = wrap(torch.empty)
    torch.empty_like = wrap(torch.empty_like)
    torch.empty_strided = wrap(torch.empty_strided)
    torch.Tensor.new_empty = wrap(torch.Tensor.new_empty)

    import triton.runtime.jit as jit
    classes = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    except ImportError:
        pass
    for cls in classes:
        original = cls.run

        def counted(self, *args, __original=original, **kwargs):
            if not kwargs.get("warmup", False):
                _state["launches"] += 1
            _state["in_kernel"] += 1
            try:
                return __original(self, *args, **kwargs)
            finally:
                _state["in_kernel"] -= 1
        cls.run = counted

    # Triton's own host code (autotuning benchmarks, heuristics) runs torch ops: not the launcher's
    try:
        import triton.runtime.autotuner as autotuner
        for cls in (autotuner.Autotuner, autotuner.Heuristics):
            original = cls.run

            def inside(self, *args, __original=original, **kwargs):
                _state["in_kernel"] += 1
                try:
                    return __original(self, *args, **kwargs)
                finally:
                    _state["in_kernel"] -= 1
            cls.run = inside
    except (ImportError, AttributeError):
        pass

    class ComputeWatch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if _state["watching"] and not _state["in_kernel"]:
                name = getattr(func, "__name__", str(func))
                if name not in ALLOWED_TORCH and len(_state["ops"]) < 20:
                    _state["ops"].append(f"torch {name}")
            return func(*args, **(kwargs or {}))

    return ComputeWatch, poison


def _fill_allocator(torch, device: str, nbytes: int):
    """Leave NaN in the GPU caching allocator's free blocks, so reused memory is poisoned."""
    if device == "cpu":
        return
    n = max(nbytes // 4, 1 << 20)
    buf = torch.full((n,), float("nan"), dtype=torch.float32, device=device)
    del buf


def _describe_error(exc: BaseException) -> dict:
    kind = "runtime_error"
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"CompilationError", "InterpreterError", "CompileTimeAssertionFailure",
                "OutOfResources", "SyntaxError", "NameError"}:
        kind = "compile_error"
    if isinstance(exc, ImportError):
        kind = "forbidden_import" if "kforge sandbox" in str(exc) else "compile_error"
    if "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower() or \
            isinstance(exc, MemoryError):
        kind = "out_of_memory"      # over the sandbox's memory limit (or the device's memory)
    if "illegal memory access" in str(exc) or "misaligned address" in str(exc) or \
            "AcceleratorError" in names:
        kind = "crash"      # a kernel fault on the device: the context is lost, as in a segfault
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(tb)
    if len(text) > 6000:
        text = text[:1500] + "\n...\n" + text[-4000:]
    return {"kind": kind, "type": type(exc).__name__, "message": str(exc)[:2000],
            "traceback": text}


def _warm_up(torch, device: str) -> None:
    """Open the device's context and Triton's driver and compiler while the parent computes
    its references, before any candidate code is loaded (and before launches are counted)."""
    if device in ("", "cpu"):
        return
    try:
        torch.empty(1, device=device)
        import triton
        import triton.language as tl

        @triton.jit
        def _kforge_warm_up(x_ptr):
            tl.store(x_ptr, tl.load(x_ptr) + 1)

        x = torch.zeros(1, device=device)
        _kforge_warm_up[(1,)](x)
        getattr(torch, device).synchronize()
        del x
    except Exception:   # noqa: BLE001 - only a head start: the checks will say what is wrong
        pass


# the parent's references take seconds to minutes (a prefill's LM head); past this the job
# will not come
JOB_WAIT_S = 3600.0
# how often the worker looks for its parent (_end_with_parent)
PARENT_POLL_S = 0.5


def _wait_for_job() -> bool:
    """Wait for the parent's job.json; False if it has not come in JOB_WAIT_S (a parent that
    is gone ends the worker meanwhile: _end_with_parent)."""
    path = os.path.join(JOB, "job.json")
    deadline = time.monotonic() + JOB_WAIT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _end_with_parent(parent: int) -> None:
    """The worker runs in a session of its own (the sandbox's setsid), so a signal to the
    verifier's process group (Ctrl-C, a killed `kforge tune`) does not reach it: once its parent
    is gone it ends itself, also in the middle of a candidate that never returns (seen here: an
    interpreted GEMM still running 48 minutes after its `kforge compile` was killed)."""
    import threading

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(3)

    threading.Thread(target=watch, name="kforge-parent-watch", daemon=True).start()


def main(parent: int | None = None) -> int:
    # the verifier's process (its pid from the sandbox: it may be gone before we could ask);
    # forked by a zygote (zygote()), the zygote, which ends with the verifier
    if parent is None:
        parent = int(os.environ.get("KFORGE_VERIFY_PARENT") or os.getppid())
    _end_with_parent(parent)
    early_device = sys.argv[2] if len(sys.argv) > 2 else ""
    write_json("progress.json", {"stage": "starting"})
    import torch
    import triton  # noqa: F401  (TRITON_INTERPRET is set by the parent for the cpu target)
    inputs_mod = _load_sibling("inputs")
    _load_sibling("interpreter").drop_overflow_checks()     # the cpu target: as on a GPU
    _warm_up(torch, early_device)
    ready_at = time.time()
    write_json("progress.json", {"stage": "waiting"})
    if not _wait_for_job():
        return 0
    t_job = time.perf_counter()
    with open(os.path.join(JOB, "job.json")) as f:
        job = json.load(f)
    device = job["device"]
    result = {"checks": [], "error": None, "timing": None, "ready_at": ready_at}
    write_json("progress.json", {"stage": "starting"})
    sig = inputs_mod.Signature.from_json(job["signature"])
    ComputeWatch, _poison = _install_guards(torch, device)
    sys.meta_path.insert(0, _ImportBlocker())
    torch.manual_seed(job.get("torch_seed", 0))

    write_json("progress.json", {"stage": "import"})
    try:
        spec = importlib.util.spec_from_file_location("kforge_candidate", job["source_path"])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        launch = getattr(module, "launch", None)
        if not callable(launch):
            raise NameError("the candidate defines no callable `launch`")
        prepare = getattr(module, "prepare_weights", None)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, never swallowed
        result["error"] = dict(_describe_error(exc), stage="import")
        write_json("result.json", result)
        return 0

    weight_idx = [i for i, a in enumerate(sig.args) if a.weight]

    def prepared_args(seed, size, domain):
        # drawn where they are used (the verifier draws the same ones from the same seed).
        # No pristine copies: after the launch the inputs are compared with the same draws
        # made again (inputs_mod.changed_inputs), so the device holds each input once
        tensors = inputs_mod.make_inputs(sig, seed, size, domain, device=device)
        args = list(tensors)
        if prepare is not None and weight_idx:
            with candidate_memory():
                new = prepare({i: args[i] for i in weight_idx})
            if not isinstance(new, dict):
                raise TypeError("prepare_weights must return a dict {arg index: tensor}")
            for i, t in new.items():
                args[int(i)] = t
        return tensors, args

    peaks = {"worker": 0, "candidate": 0}
    accel = getattr(torch, device, None) if device != "cpu" else None

    def _peak_now() -> int:
        try:
            return int(accel.max_memory_allocated())
        except Exception:   # noqa: BLE001 - informational
            return 0

    @contextlib.contextmanager
    def candidate_memory():
        """The device memory peak while the candidate's own code runs (its weight preparation,
        its launches), apart from the worker's own peak (inputs, outputs, checks)."""
        if accel is None or not hasattr(accel, "reset_peak_memory_stats"):
            yield
            return
        peaks["worker"] = max(peaks["worker"], _peak_now())
        accel.reset_peak_memory_stats()
        try:
            yield
        finally:
            peak = _peak_now()
            peaks["candidate"] = max(peaks["candidate"], peak)
            peaks["worker"] = max(peaks["worker"], peak)
            accel.reset_peak_memory_stats()

    def run_once(args):
        _state["launches"] = 0
        _state["ops"] = []
        _state["watching"] = True
        try:
            with ComputeWatch(), candidate_memory():
                outs = launch(*args)
        finally:
            _state["watching"] = False
        if device != "cpu":
            getattr(torch, device).synchronize()
        return outs

    def save_outputs(name, outs):
        if isinstance(outs, torch.Tensor):
            outs = (outs,)
        if not isinstance(outs, (tuple, list)) or \
                not all(isinstance(o, torch.Tensor) for o in outs):
            raise TypeError(f"launch must return a tuple of tensors, got {type(outs).__name__}")
        # one contiguous copy on the host per output (to("cpu") alone would keep a CPU view's
        # whole storage), its bytes written raw to NAME.<k> and the list of them to NAME as
        # JSON, last and under a temporary name renamed, so that a parent reading as the worker
        # goes on (job["stream"]) never sees half of it. Raw bytes, not torch.save: saving a
        # prefill LM head's logits (13 GB, four times) took 62 s of its verification (H200).
        metas = []
        for k, o in enumerate(outs):
            meta = {"shape": list(o.shape), "dtype": str(o.dtype).replace("torch.", ""),
                    "device": str(o.device), "file": f"{name}.{k}"}
            host = o.detach().to("cpu", copy=True).contiguous().reshape(-1)
            with open(os.path.join(JOB, meta["file"]), "wb") as f:
                if host.numel():
                    f.write(memoryview(host.view(torch.uint8).numpy()))
            del host
            metas.append(meta)
        part = os.path.join(JOB, name + ".part")
        with open(part, "w") as f:
            json.dump(metas, f)
        os.replace(part, os.path.join(JOB, name))
        return [{k: v for k, v in m.items() if k != "file"} for m in metas]

    out_bytes = sum(4 * math.prod(r.concrete(max(c["size"] for c in job["checks"])))
                    for r in sig.results)
    stage_s = result["stage_s"] = {"inputs": 0.0, "launch": 0.0, "save": 0.0, "check": 0.0}

    def spent(stage, t0):
        stage_s[stage] = round(stage_s.get(stage, 0.0) + time.perf_counter() - t0, 3)
        return time.perf_counter()

    for i, check in enumerate(job["checks"]):
        write_json("progress.json", {"stage": "check", "check": i, **check})
        entry = {"index": i}
        try:
            t0 = time.perf_counter()
            with _device_lock(exclusive=False):
                tensors, args = prepared_args(check["seed"], check["size"], check["domain"])
                t0 = spent("inputs", t0)
                _fill_allocator(torch, device, 2 * out_bytes)
                outs = run_once(args)
                t0 = spent("launch", t0)
            entry["launches"] = _state["launches"]
            entry["torch_ops"] = list(_state["ops"])
            entry["outputs"] = save_outputs(f"outputs_{i}.pt", outs)
            t0 = spent("save", t0)
            # the candidate's outputs and prepared weights go before the inputs are drawn
            # again to be compared with
            outs = args = None
            if job.get("stream"):
                # large outputs: the parent compares this check's and deletes them before the
                # next check runs, so that host memory and disk hold one check's at a time
                if device != "cpu":     # the parent computes its references meanwhile
                    getattr(torch, device).empty_cache()
                while os.path.exists(os.path.join(JOB, f"outputs_{i}.pt")):
                    time.sleep(0.05)
                t0 = spent("wait", t0)
            entry["inputs_modified"] = inputs_mod.changed_inputs(
                sig, check["seed"], check["size"], check["domain"], tensors, device=device)
            t0 = spent("check", t0)
        except BaseException as exc:  # noqa: BLE001
            result["error"] = dict(_describe_error(exc), stage="check", check=i)
            result["checks"].append(entry)
            write_json("result.json", result)
            return 0
        result["checks"].append(entry)
        del tensors, args, outs

    timing = job.get("timing")
    if timing:
        # the parent compares each check's outputs as they come: timed once it is done
        # (its comparison on the device would disturb the timing)
        t0 = time.perf_counter()
        write_json("progress.json", {"stage": "waiting for the comparison"})
        while job.get("compared_as_they_come") and any(os.path.exists(os.path.join(JOB, f"outputs_{i}.pt"))
                  for i in range(len(job["checks"]))):
            time.sleep(0.01)
        t0 = spent("wait", t0)
        write_json("progress.json", {"stage": "timing"})
        check = job["checks"][0]
        try:
            _, args = prepared_args(check["seed"], check["size"], check["domain"])
            samples = []
            if device == "cpu":
                launch(*args)
                for _ in range(int(timing.get("reps", 3))):
                    t0 = time.perf_counter()
                    outs = launch(*args)
                    samples.append((time.perf_counter() - t0) * 1e3)
            else:
                import triton.testing
                with _device_lock(exclusive=True):      # timed with the GPU to itself
                    samples = triton.testing.do_bench(lambda: launch(*args), warmup=25,
                                                      rep=100, return_mode="all")
                samples = [float(s) for s in samples]
                outs = run_once(args)
            result["timing"] = {"samples_ms": samples,
                                "outputs": save_outputs("outputs_timed.pt", outs)}
        except BaseException as exc:  # noqa: BLE001
            result["error"] = dict(_describe_error(exc), stage="timing")
        spent("timing", t0)
    if accel is not None:
        result["peak_bytes"] = max(peaks["worker"], _peak_now())
        result["candidate_peak_bytes"] = peaks["candidate"]
    result["job_s"] = round(time.perf_counter() - t_job, 3)
    write_json("result.json", result)
    return 0


def zygote() -> int:
    """`python _worker.py --zygote` (kforge.verify.sandbox, the cpu target): imports torch,
    Triton and the sandbox's own modules once, then forks one worker per request. A request is
    one JSON line on stdin, {"job_dir", "memory_mb", "env"}; the answer, one line on stdout,
    {"pid"}. The worker is what `python _worker.py JOB_DIR` would be, less its 1.5-2 s of
    imports: its own session and limits, its output to JOB_DIR/stderr.txt, the request's
    environment. When a worker ends, its exit status (as subprocess gives it: -N for signal N)
    goes to JOB_DIR/exit_status. The zygote ends when its stdin closes (the verifier is gone);
    its workers then end too (_end_with_parent). No torch op runs here before a fork: a thread
    pool started here would not survive it."""
    import resource
    import select
    import torch  # noqa: F401
    import triton  # noqa: F401
    _load_sibling("inputs")
    _load_sibling("interpreter").drop_overflow_checks()
    jobs: dict[int, str] = {}
    out = sys.stdout
    stdin = sys.stdin.fileno()
    print(json.dumps({"ready": True}), file=out, flush=True)

    def reap():
        while jobs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job_dir = jobs.pop(pid, None)
            if job_dir is not None:
                rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                tmp = os.path.join(job_dir, "exit_status.tmp")
                try:
                    with open(tmp, "w") as f:
                        f.write(str(rc))
                    os.replace(tmp, os.path.join(job_dir, "exit_status"))
                except OSError:
                    pass        # the verifier removed the job directory: nobody waits

    buf = b""
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.02)
        reap()
        if not ready:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            return 0
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.setsid()
                    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                    if req.get("memory_mb"):
                        limit = int(req["memory_mb"]) * 1024 * 1024
                        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
                    job_dir = req["job_dir"]
                    fd = os.open(os.path.join(job_dir, "stderr.txt"),
                                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    os.close(fd)
                    os.close(null)
                    os.chdir(job_dir)
                    os.environ.clear()
                    os.environ.update(req["env"])
                    global JOB
                    JOB = job_dir
                    sys.argv = [sys.argv[0], job_dir, "cpu"]
                    code = main(parent=os.getppid())
                except BaseException:   # noqa: BLE001 - what a subprocess would print
                    traceback.print_exc()
                finally:
                    with contextlib.suppress(Exception):
                        sys.stdout.flush()
                        sys.stderr.flush()
                    os._exit(code)
            jobs[pid] = req["job_dir"]
            print(json.dumps({"pid": pid}), file=out, flush=True)


if __name__ == "__main__":
    sys.exit(zygote() if sys.argv[1:2] == ["--zygote"] else main())
