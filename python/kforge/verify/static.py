"""Static checks on a candidate's source, before anything of it runs.

They reject, with a reason a kernel writer can act on, candidates that:
  * do not define `launch` or never launch a `@triton.jit` kernel;
  * compute results with torch (torch.matmul, F.*, `@`, tensor methods such as .sum(), host
    round trips such as .cpu().numpy());
  * catch their own failures (any try/except);
  * keep state between calls (globals written from functions, mutated module-level containers,
    attributes set on functions or modules, functools caches, mutable default arguments,
    tensors allocated at import);
  * play timing games (time, clocks, sleeps, torch.cuda.synchronize/Event/Stream);
  * reach outside the kernel (imports other than torch/triton/math, subprocess/os, KForge's own
    reference, eval/exec/open, private or dunder attributes).
The sandboxed run enforces the essential ones again dynamically (kforge.verify._worker).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

ALLOWED_IMPORT_ROOTS = ("torch", "triton", "math", "typing", "__future__", "functools")
FORBIDDEN_TORCH_MODULES = ("torch.nn", "torch.fft", "torch.linalg", "torch.special",
                           "torch.testing", "torch.utils", "torch.distributed", "torch.func",
                           "torch.autograd", "torch.compiler", "torch._dynamo", "torch._inductor")
TIMING_MODULES = ("time", "timeit", "datetime", "triton.testing", "torch.cuda.Event",
                  "torch.profiler")
PROCESS_MODULES = ("os", "sys", "subprocess", "multiprocessing", "ctypes", "signal", "socket",
                   "shutil", "pathlib", "importlib", "builtins", "gc", "inspect", "threading",
                   "pickle", "io")

# torch functions a launcher may call: allocation, layout, dtype/device queries.
ALLOWED_TORCH_CALLS = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full", "full_like",
    "device", "dtype", "Size", "is_tensor", "is_floating_point", "finfo", "iinfo",
    "promote_types", "result_type", "get_default_dtype", "no_grad", "inference_mode",
}
ALLOWED_TORCH_CUDA_CALLS = {"device", "current_device", "get_device_capability",
                            "get_device_properties", "is_available", "device_count"}
ALLOWED_TORCH_XPU_CALLS = ALLOWED_TORCH_CUDA_CALLS
TIMING_TORCH_CALLS = {"synchronize", "Event", "Stream", "stream", "_sleep", "set_sync_debug_mode",
                      "current_stream", "default_stream"}
# Tensor methods that compute values or bring data to the host (the receiver's type is not
# known statically, so only names that mean tensor compute are listed).
COMPUTE_METHODS = {
    "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "sum", "mean", "prod", "exp", "log",
    "sqrt", "rsqrt", "relu", "sigmoid", "tanh", "softmax", "log_softmax", "gelu", "silu",
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "pow", "neg", "abs", "clamp",
    "clamp_", "addcmul", "addcdiv", "lerp", "erf", "cumsum", "amax", "amin", "argmax", "argmin",
    "maximum", "minimum", "where", "masked_fill", "masked_fill_", "copy_", "index_select",
    "gather", "scatter", "scatter_add", "norm", "var", "std", "max", "min", "dot", "outer",
    "conv2d", "linear", "sin", "cos", "reciprocal", "square",
    "numpy", "tolist", "item", "cpu",
}
FORBIDDEN_BUILTINS = {"eval", "exec", "compile", "__import__", "open", "globals", "locals",
                      "vars", "getattr", "setattr", "delattr", "input", "breakpoint", "exit",
                      "quit", "memoryview", "type", "super", "id", "hash", "object"}
MUTATING_METHODS = {"append", "extend", "insert", "update", "setdefault", "pop", "popitem",
                    "clear", "add", "discard", "remove", "__setitem__", "copy_", "fill_",
                    "zero_"}
CACHE_DECORATORS = {"cache", "lru_cache", "cached_property", "memoize"}
JIT_DECORATORS = {"jit", "autotune", "heuristics"}


@dataclass(frozen=True)
class Violation:
    """One static-check failure: a reason code, a message for the kernel writer, a line."""
    reason: str        # no_launch_function | no_triton_kernel | torch_compute | swallows_errors |
    # keeps_state | timing | forbidden_import | forbidden_builtin | introspection | syntax_error
    message: str
    line: int = 0

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.message}"


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Checker:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.violations: list[Violation] = []
        self.aliases: dict[str, str] = {}          # local name -> module path
        self.jit_functions: set[str] = set()
        self.module_names: set[str] = set()        # names bound at module level
        self.functions: dict[str, ast.FunctionDef] = {}

    def add(self, reason: str, message: str, node: ast.AST | None = None):
        self.violations.append(Violation(reason, message, getattr(node, "lineno", 0)))

    def resolve(self, node: ast.AST) -> str | None:
        name = _dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        if head in self.aliases:
            full = self.aliases[head]
            return f"{full}.{rest}" if rest else full
        return name

    # ----------------------------------------------------------------------------------------
    def run(self) -> list[Violation]:
        self.collect_module()
        for node in ast.walk(self.tree):
            self.check_node(node)
        for fn in self.functions.values():
            if fn.name not in self.jit_functions:
                self.check_host_function(fn)
        self.check_launch()
        return self.violations

    def collect_module(self):
        for node in self.tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.check_import(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
                self.module_names.add(node.name)
                if any(self.is_jit_decorator(d) for d in node.decorator_list):
                    self.jit_functions.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            self.module_names.add(n.id)
                if node.value is not None and not self.is_constant_expr(node.value):
                    self.add("keeps_state", "module-level value is computed at import "
                             f"(`{ast.unparse(node.value)[:60]}`); module level may hold only "
                             "constants, imports and functions", node)
            elif isinstance(node, ast.ClassDef):
                self.add("keeps_state", f"defines class {node.name}; a kernel module holds "
                         "functions only", node)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                pass    # docstring
            elif isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.Expr,
                                   ast.AugAssign, ast.Delete)):
                if not isinstance(node, ast.Try):   # try is reported by check_node
                    self.add("keeps_state", "module-level statement "
                             f"`{ast.unparse(node).splitlines()[0][:60]}` runs at import; "
                             "module level may hold only constants, imports and functions", node)

    def is_jit_decorator(self, dec: ast.AST) -> bool:
        target = dec.func if isinstance(dec, ast.Call) else dec
        full = self.resolve(target) or ""
        return full.startswith("triton.") and full.rsplit(".", 1)[-1] in JIT_DECORATORS

    def is_constant_expr(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return all(self.is_constant_expr(e) for e in node.elts)
        if isinstance(node, ast.Dict):
            return all(k is None or self.is_constant_expr(k) for k in node.keys) and \
                all(self.is_constant_expr(v) for v in node.values)
        if isinstance(node, (ast.Name, ast.Attribute)):
            return True
        if isinstance(node, ast.UnaryOp):
            return self.is_constant_expr(node.operand)
        if isinstance(node, ast.BinOp):
            return self.is_constant_expr(node.left) and self.is_constant_expr(node.right)
        if isinstance(node, ast.Call):
            full = self.resolve(node.func) or ""
            ok = full in ("triton.language.constexpr", "triton.Config", "triton.cdiv",
                          "triton.next_power_of_2", "dict", "tuple", "float", "int") or \
                full.startswith("math.")
            return ok and all(self.is_constant_expr(a) for a in node.args) and \
                all(self.is_constant_expr(k.value) for k in node.keywords)
        return False

    def check_import(self, node: ast.AST):
        if isinstance(node, ast.Import):
            items = [(a.name, a.asname or a.name.split(".")[0], a.name if a.asname else
                      a.name.split(".")[0]) for a in node.names]
        else:
            if node.level:
                self.add("forbidden_import", "relative import; kernels may import only "
                         "torch, triton and math", node)
                return
            mod = node.module or ""
            items = [(f"{mod}.{a.name}", a.asname or a.name, f"{mod}.{a.name}")
                     for a in node.names]
            self.check_module_name(mod, node)
        for full, local, bound in items:
            self.check_module_name(full if isinstance(node, ast.Import) else full, node,
                                   from_item=isinstance(node, ast.ImportFrom))
            self.aliases[local] = bound
            self.module_names.add(local)

    def check_module_name(self, full: str, node: ast.AST, from_item: bool = False):
        root = full.split(".")[0]
        if root == "kforge":
            self.add("forbidden_import", f"imports {full}: a kernel may not use KForge itself "
                     "(its reference is the oracle it is checked against)", node)
        elif any(full == m or full.startswith(m + ".") for m in TIMING_MODULES):
            self.add("timing", f"imports {full}: kernels may not read clocks, sleep or time "
                     "themselves", node)
        elif root in PROCESS_MODULES:
            self.add("forbidden_import", f"imports {full}: kernels may not touch the process, "
                     "the OS or the interpreter", node)
        elif root not in ALLOWED_IMPORT_ROOTS:
            self.add("forbidden_import", f"imports {full}: kernels may import only torch, "
                     "triton and math", node)
        elif any(full == m or full.startswith(m + ".") for m in FORBIDDEN_TORCH_MODULES):
            self.add("torch_compute", f"imports {full}: results must come from Triton kernels, "
                     "not torch", node)
        elif root == "functools" and full.split(".")[-1] in CACHE_DECORATORS and from_item:
            self.add("keeps_state", f"imports {full}: results may not be cached between calls",
                     node)

    # ----------------------------------------------------------------------------------------
    def check_node(self, node: ast.AST):
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            self.add("swallows_errors", "try/except: a kernel may not catch its own failures "
                     "(let errors propagate so they are reported)", node)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            self.add("keeps_state", f"`{ast.unparse(node)}`: functions may not write global "
                     "or enclosing state", node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and node not in self.tree.body:
            self.add("forbidden_import", "import inside a function; import at module level", node)
            self.check_import(node)
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                self.add("introspection", f"accesses private attribute `.{node.attr}`", node)
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                self.add("keeps_state", f"assigns attribute `{ast.unparse(node)}`: kernels may "
                         "not attach state to functions, modules or tensors", node)
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_BUILTINS and \
                isinstance(node.ctx, ast.Load) and node.id not in self.module_names:
            self.add("forbidden_builtin", f"uses builtin `{node.id}`", node)
        elif isinstance(node, ast.Call):
            self.check_call(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            defaults = list(node.args.defaults) + [d for d in node.args.kw_defaults if d]
            for d in defaults:
                if isinstance(d, (ast.List, ast.Dict, ast.Set, ast.Call)):
                    self.add("keeps_state", "mutable default argument "
                             f"`{ast.unparse(d)[:40]}` keeps state between calls", d)
            for dec in getattr(node, "decorator_list", []):
                target = dec.func if isinstance(dec, ast.Call) else dec
                full = self.resolve(target) or ""
                if full.rsplit(".", 1)[-1] in CACHE_DECORATORS:
                    self.add("keeps_state", f"@{full} caches results between calls", dec)
        elif isinstance(node, ast.ClassDef) and node not in self.tree.body:
            self.add("keeps_state", f"defines class {node.name}", node)

    def check_call(self, node: ast.Call):
        full = self.resolve(node.func) or ""
        last = full.rsplit(".", 1)[-1]
        if full.startswith(("torch.cuda.", "torch.xpu.")):
            if last in TIMING_TORCH_CALLS:
                self.add("timing", f"calls {full}: kernels may not synchronize or time "
                         "themselves (the verifier and the timer do that)", node)
            elif last not in ALLOWED_TORCH_CUDA_CALLS:
                self.add("torch_compute", f"calls {full}", node)
        elif full.split(".")[0] == "functools" and last in CACHE_DECORATORS:
            self.add("keeps_state", f"calls {full}: results may not be cached", node)

    def check_host_function(self, fn: ast.FunctionDef):
        """Torch compute and module-state mutation in non-jit functions."""
        weights_prep = fn.name == "prepare_weights"
        local_names = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                local_names.add(node.id)
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                full = self.resolve(node.func) or ""
                root = full.split(".")[0]
                if not weights_prep and root == "torch" and full.count(".") >= 1 and \
                        not full.startswith(("torch.cuda.", "torch.xpu.")):
                    name = full[len("torch."):]
                    if name not in ALLOWED_TORCH_CALLS:
                        self.add("torch_compute", f"calls {full}: results must be computed by "
                                 "Triton kernels, not torch (only allocation such as "
                                 "torch.empty is allowed in launch)", node)
                if isinstance(node.func, ast.Attribute) and root not in ("torch", "triton",
                                                                           "math"):
                    method = node.func.attr
                    recv = node.func.value
                    recv_name = recv.id if isinstance(recv, ast.Name) else None
                    if not weights_prep and method in COMPUTE_METHODS:
                        kind = ("brings data to the host" if method in ("numpy", "tolist",
                                                                       "item", "cpu")
                                else "computes with torch")
                        self.add("torch_compute", f"`.{method}()` {kind}: results must be "
                                 "computed by Triton kernels", node)
                    if recv_name and recv_name in self.module_names and \
                            recv_name not in local_names and method in MUTATING_METHODS:
                        self.add("keeps_state", f"`{recv_name}.{method}(...)` mutates "
                                 "module-level state between calls", node)
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and \
                    not weights_prep:
                self.add("torch_compute", "`@` computes a matrix product with torch: results "
                         "must be computed by Triton kernels", node)
            elif isinstance(node, (ast.Subscript,)) and isinstance(node.ctx, (ast.Store,
                                                                            ast.Del)):
                base = node.value
                while isinstance(base, ast.Subscript):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in self.module_names and \
                        base.id not in local_names:
                    self.add("keeps_state", f"`{ast.unparse(node)}` writes module-level state "
                             "between calls", node)
                elif isinstance(base, ast.Name) and not weights_prep:
                    # in-place tensor writes from torch (x[...] = ...) compute on the host side
                    self.add("torch_compute", f"`{ast.unparse(node)[:40]} = ...` writes a "
                             "tensor with torch indexing; results must be written by Triton "
                             "kernels", node)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and \
                    node.target.id in self.module_names and node.target.id not in local_names:
                self.add("keeps_state", f"`{ast.unparse(node)}` updates module-level state",
                         node)

    def check_launch(self):
        fn = self.functions.get("launch")
        if fn is None:
            self.add("no_launch_function", "the source defines no module-level "
                     "`def launch(*args)` returning the region's results")
            return
        if not self.jit_functions:
            self.add("no_triton_kernel", "the source defines no @triton.jit kernel; results "
                     "must be computed by a Triton kernel")
            return
        launched = False
        for f in self.functions.values():
            if f.name in self.jit_functions:
                continue
            for node in ast.walk(f):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and \
                        isinstance(node.func.value, ast.Name) and \
                        node.func.value.id in self.jit_functions:
                    launched = True
        if not launched:
            self.add("no_triton_kernel", "no host function launches a @triton.jit kernel "
                     "(`kernel[grid](...)`)", fn)


def static_check(source: str) -> list[Violation]:
    """All static-check violations of a candidate's source (empty when it passes)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [Violation("syntax_error", f"SyntaxError: {exc.msg}", exc.lineno or 0)]
    seen, out = set(), []
    for v in _Checker(tree).run():
        if (v.reason, v.message, v.line) not in seen:
            seen.add((v.reason, v.message, v.line))
            out.append(v)
    return out
