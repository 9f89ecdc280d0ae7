//===- Passes.td - KForge passes ---------------------------*- tablegen -*-===//

#ifndef KFORGE_PASSES
#define KFORGE_PASSES

include "mlir/Pass/PassBase.td"

def KForgePrintRegionStats : Pass<"kforge-print-region-stats", "::mlir::ModuleOp"> {
  let summary = "Print statistics of the linalg ops in each function";
  let description = [{
    An analysis: for each function it counts the linalg ops by kind, the contractions and
    convolutions among them, and estimates their FLOPs from static shapes (a dynamic dimension
    counts as 1; a contraction costs 2 FLOPs per point of its iteration domain, any other
    structured op one per scalar arith/math op of its body and point). The IR is unchanged; the
    report goes to stderr (or stdout with `to-stdout`).

    Input:
    ```mlir
    func.func @mlp(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>, %o: tensor<4x16xf32>)
        -> tensor<4x16xf32> {
      %0 = linalg.matmul ins(%x, %w : tensor<4x8xf32>, tensor<8x16xf32>)
                         outs(%o : tensor<4x16xf32>) -> tensor<4x16xf32>
      return %0 : tensor<4x16xf32>
    }
    ```
    Report:
    ```
    kforge region stats: @mlp
      linalg ops: 1 (contractions: 1, convolutions: 0, reductions: 0, elementwise: 0)
      flops: 1024
      linalg.matmul: 1
    ```
    With `json=true` the same as one JSON object per function:
    `{"function":"mlp","linalg_ops":1,"contractions":1,...,"ops":{"linalg.matmul":1}}`.
  }];
  let options = [
    Option<"json", "json", "bool", /*default=*/"false",
           "Print one JSON object per function instead of text">,
    Option<"toStdout", "to-stdout", "bool", /*default=*/"false",
           "Print to stdout instead of stderr">,
    Option<"includeEmpty", "include-empty", "bool", /*default=*/"false",
           "Also report functions without linalg ops">,
  ];
  let dependentDialects = ["::mlir::linalg::LinalgDialect"];
}

def KForgeFormRegions : Pass<"kforge-form-regions", "::mlir::ModuleOp"> {
  let summary = "Group linalg ops into kforge.fusion_region kernel candidates";
  let description = [{
    Runs the fusion-candidate analysis on every function (except outlined regions) and wraps
    each group it finds in a `kforge.fusion_region`.

    Anchors, in program order: contractions (`linalg.matmul`, `batch_matmul`, transposed
    variants, contraction-shaped `linalg.generic`) and convolutions; then, with `standalone`,
    reductions and elementwise chains that no anchor took. A region grows by the consumers of
    its values, of the kinds in `consumers`: `elementwise` epilogues (bias, scale, residual add,
    activations, clamps, division), `reduction`s (row reductions, the pieces of softmax,
    log-softmax and normalizations, pooling), `reshape`s between them. Cheap producers of its
    operands (fills, transposes, broadcasts, empties, small constants, reshapes of inputs) are
    recomputed inside the region. A region without an anchor whose values only one later region
    reads is merged into it when all their reductions are over the same rows (the f32 mean that
    torch-mlir computes beside a layer norm's f64 variance). A region that is one contraction,
    read only by one other region whose contraction shares an input with it and has its result
    type, is merged into that region (`sibling-contractions`: SwiGLU's `silu(x @ Wg^T) *
    (x @ Wu^T)`, whose two products one kernel computes from one pass over x). A value that is also used outside
    the region stays available as a region result; no op is moved where that would break
    dominance; ops the analysis does not know stay outside, untouched.

    Before:
    ```mlir
    %t = linalg.transpose ins(%w : tensor<32x64xf32>) outs(%e0 : tensor<64x32xf32>) permutation = [1, 0]
    %f = linalg.fill ins(%zero : f32) outs(%e1 : tensor<8x32xf32>) -> tensor<8x32xf32>
    %m = linalg.matmul ins(%x, %t : tensor<8x64xf32>, tensor<64x32xf32>) outs(%f : tensor<8x32xf32>) -> tensor<8x32xf32>
    %r = linalg.generic {...relu...} ins(%m : tensor<8x32xf32>) outs(%e1 : tensor<8x32xf32>) -> tensor<8x32xf32>
    ```
    After:
    ```mlir
    %r = kforge.fusion_region "contraction" (%a = %x, %b = %w)
        : (tensor<8x64xf32>, tensor<32x64xf32>) -> tensor<8x32xf32>
        attributes {fused = ["transpose", "fill", "matmul", "relu"]} {
      ... the transpose, fill, matmul and relu, reading %a and %b ...
      kforge.yield %relu : tensor<8x32xf32>
    }
    ```
  }];
  let options = [
    Option<"maxOps", "max-ops", "unsigned", /*default=*/"32",
           "Most linalg ops one region may hold (recomputed producers not counted)">,
    Option<"consumers", "consumers", "std::string",
           /*default=*/"\"elementwise,reduction,reshape\"",
           "Consumer kinds fused into a region: comma-separated elementwise, reduction, "
           "reshape, or none">,
    Option<"fuseProducers", "fuse-producers", "bool", /*default=*/"true",
           "Recompute cheap producers (fill, transpose, broadcast, small constants, "
           "reshapes) inside regions">,
    Option<"standalone", "standalone", "bool", /*default=*/"true",
           "Also form regions around reductions and elementwise chains without a "
           "contraction or convolution">,
    Option<"siblingContractions", "sibling-contractions", "bool", /*default=*/"true",
           "Merge a lone contraction into the one region that reads it when that region's "
           "contraction reads an input of it too and has its result type (SwiGLU's gate and "
           "up projections: one region)">,
  ];
  let dependentDialects = ["::mlir::kforge::KForgeDialect",
                           "::mlir::linalg::LinalgDialect",
                           "::mlir::tensor::TensorDialect"];
}

def KForgeOutlineRegions : Pass<"kforge-outline-regions", "::mlir::ModuleOp"> {
  let summary = "Outline each fusion region into a kernel-candidate function";
  let description = [{
    Each `kforge.fusion_region` becomes a call of a private function
    `@kforge_region_<hash>`, where `<hash>` is 16 hex digits of a content hash of the region:
    independent of SSA names, the enclosing function's name and the order of independent ops;
    different for any change of an op, attribute, constant or shape (and of which arguments
    are weights). Regions with the same hash share one function. The function carries
    `kforge.hash`, `kforge.root_kind`, `kforge.fused`, `kforge.flops` (estimated from static
    shapes, dynamic dimensions count as 1) and `kforge.min_bytes` (sum of argument and result
    bytes); an argument that is a function argument marked `{kforge.weight = "name"}` keeps
    that attribute.

    Before:
    ```mlir
    func.func @main(%x: tensor<8x64xf32>, %w: tensor<32x64xf32> {kforge.weight = "fc.weight"}) -> tensor<8x32xf32> {
      %r = kforge.fusion_region "contraction" (%a = %x, %b = %w) : ... { ... }
      return %r : tensor<8x32xf32>
    }
    ```
    After:
    ```mlir
    func.func @main(...) -> tensor<8x32xf32> {
      %r = call @kforge_region_1f0c9e2b3a4d5c6e(%x, %w) : (...) -> tensor<8x32xf32>
      return %r : tensor<8x32xf32>
    }
    func.func private @kforge_region_1f0c9e2b3a4d5c6e(%a: tensor<8x64xf32>,
        %b: tensor<32x64xf32> {kforge.weight = "fc.weight"}) -> tensor<8x32xf32>
        attributes {kforge.flops = 33024 : i64, kforge.fused = [...], kforge.hash = "1f0c9e2b3a4d5c6e",
                    kforge.min_bytes = 11264 : i64, kforge.root_kind = "contraction"} { ... }
    ```
  }];
  let dependentDialects = ["::mlir::func::FuncDialect"];
}

def KForgeExportRegions : Pass<"kforge-export-regions", "::mlir::ModuleOp"> {
  let summary = "Write each outlined region's MLIR and kernel spec, and the host plan";
  let description = [{
    For every outlined region function (`kforge.hash` set) writes `<dir>/<hash>.mlir` (the
    function alone) and `<dir>/<hash>.json`, its kernel spec; for each function that calls
    regions, `<dir>/host_plan.json` (the first such function) or
    `<dir>/host_plan.<function>.json` (any other). The formats are those of
    docs/kernel-spec.md (schema docs/kernel-spec.schema.json). The IR is unchanged.

    ```
    kforge-opt model.mlir --kforge-pipeline --kforge-export-regions="dir=out/regions"
    out/regions/1f0c9e2b3a4d5c6e.mlir  out/regions/1f0c9e2b3a4d5c6e.json  out/regions/host_plan.json
    ```
  }];
  let options = [
    Option<"dir", "dir", "std::string", /*default=*/"\"\"",
           "Directory to write into (created if missing); required">,
    Option<"hostPlan", "host-plan", "bool", /*default=*/"true",
           "Also write the host plan of each calling function">,
  ];
}

def KForgeLinkKernels : Pass<"kforge-link-kernels", "::mlir::ModuleOp"> {
  let summary = "Replace region calls with calls of verified kernels from a manifest";
  let description = [{
    Reads the manifest (docs/kernel-spec.md, "Manifest") and replaces every call of an
    outlined region whose hash has an entry with `verification.status == "verified"` by a
    `kforge.custom_call` of a `kforge.kernel` declaration that carries the kernel's symbol,
    target, launch data and verification record. Calls of regions without a verified kernel
    stay as they are; a region function no call needs any more is removed. With
    `emit-func-calls=true`, emits `func.call`s of external `func.func private @<symbol>`
    declarations instead, for pipelines that do not load the kforge dialect. With
    `host-plan=PATH`, the host plan of the linked entry function is written to PATH: what a
    runtime executes (`kernel` steps for custom calls, `call` steps for regions left on their
    reference, `fallback` steps for fallback ops).

    Before:
    ```mlir
    %r = call @kforge_region_1f0c9e2b3a4d5c6e(%x, %w) : (tensor<8x64xf32>, tensor<32x64xf32>) -> tensor<8x32xf32>
    ```
    After:
    ```mlir
    kforge.kernel @kforge_kernel_1f0c9e2b3a4d5c6e_cuda : (tensor<8x64xf32>, tensor<32x64xf32>) -> tensor<8x32xf32>
        target "cuda" hash "1f0c9e2b3a4d5c6e" launch {...} verification {status = "verified", ...}
    %r = kforge.custom_call @kforge_kernel_1f0c9e2b3a4d5c6e_cuda(%x, %w) : (...) -> tensor<8x32xf32>
    ```
  }];
  let options = [
    Option<"manifest", "manifest", "std::string", /*default=*/"\"\"",
           "Path of manifest.json; required">,
    Option<"emitFuncCalls", "emit-func-calls", "bool", /*default=*/"false",
           "Emit func.call of external func.func declarations instead of kforge ops">,
    Option<"target", "target", "std::string", /*default=*/"\"\"",
           "Only link kernels for this target: cuda, xpu or cpu (any architecture), or "
           "BACKEND:ARCH (cuda:sm_90: that architecture and kernels recorded without one); "
           "empty: any">,
    Option<"hostPlan", "host-plan", "std::string", /*default=*/"\"\"",
           "Also write the linked module's host plan (JSON) to this path: the program a "
           "runtime executes, kernel calls as `kernel` steps">,
  ];
  let dependentDialects = ["::mlir::kforge::KForgeDialect",
                           "::mlir::func::FuncDialect"];
}

def KForgeGathersToReshapes : Pass<"kforge-gathers-to-reshapes", "::mlir::ModuleOp"> {
  let summary = "Turn gathers with constant indices that only reshape into tensor reshapes";
  let description = [{
    torch-mlir writes some views (e.g. the reshape back from groups in GroupNorm) as a
    `linalg.generic` that gathers with `tensor.extract` at indices read from constant index
    tensors. When those indices visit the source in row-major order, element for element, the
    gather is a reshape: this pass replaces it with `tensor.collapse_shape` and
    `tensor.expand_shape`, which the kernel spec describes and fusion can pull into a region.
    Other gathers are left alone.

    Before:
    ```mlir
    %g = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
        ins(%i0, %i1 : tensor<2x6xi64>, tensor<2x6xi64>) outs(%e : tensor<2x6xf32>) {
    ^bb0(%a: i64, %b: i64, %out: f32):
      %ia = arith.index_cast %a : i64 to index
      %ib = arith.index_cast %b : i64 to index
      %v = tensor.extract %src[%ia, %ib] : tensor<3x4xf32>
      linalg.yield %v : f32
    } -> tensor<2x6xf32>
    ```
    After (when `%i0`, `%i1` hold the row-major positions):
    ```mlir
    %flat = tensor.collapse_shape %src [[0, 1]] : tensor<3x4xf32> into tensor<12xf32>
    %g = tensor.expand_shape %flat [[0, 1]] output_shape [2, 6] : tensor<12xf32> into tensor<2x6xf32>
    ```
  }];
  let options = [
    Option<"maxElements", "max-elements", "int64_t", /*default=*/"1 << 22",
           "Largest gather (in elements) whose indices are checked">,
  ];
  let dependentDialects = ["::mlir::tensor::TensorDialect"];
}

def KForgeConcatToGenerics : Pass<"kforge-concat-to-generics", "::mlir::ModuleOp"> {
  let summary = "Write tensor.concat ops as linalg.generic selects";
  let description = [{
    The kernel spec has no record for `tensor.concat` (torch-mlir writes `torch.cat` so), and a
    concatenation left outside every region is one more pass over memory: `rotate_half` in
    RoPE (`cat(-x2, x1)`) wrote its halves, copied them, and read them again. A concatenation
    along a dimension of static sizes is an elementwise op: output index `i` reads input `k`
    at `i - offset(k)`, where `k` is the input whose range holds `i`. This pass writes it as a
    `linalg.generic` that reads every input at `(i + c(k)) mod size(k)`, with `c(k)` the
    non-negative residue of `-offset(k)` (the same index inside input `k`'s range, and an index
    inside the input elsewhere, so every read is in bounds), and selects input `k`'s value by
    comparing `linalg.index` with the offsets. Fusion then treats it as any elementwise op.
    Concatenations of more than `max-inputs` tensors (each element reads every input) or along
    a dynamic dimension are left alone.

    Before:
    ```mlir
    %c = tensor.concat dim(1) %a, %b : (tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x64xf32>
    ```
    After:
    ```mlir
    %e = tensor.empty() : tensor<8x64xf32>
    %c = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1 mod 32)>,
                                          affine_map<(d0, d1) -> (d0, d1 mod 32)>,
                                          affine_map<(d0, d1) -> (d0, d1)>],
                         iterator_types = ["parallel", "parallel"]}
        ins(%a, %b : tensor<8x32xf32>, tensor<8x32xf32>) outs(%e : tensor<8x64xf32>) {
    ^bb0(%x: f32, %y: f32, %out: f32):
      %i = linalg.index 1 : index
      %c32 = arith.constant 32 : index
      %lt = arith.cmpi ult, %i, %c32 : index
      %v = arith.select %lt, %x, %y : f32
      linalg.yield %v : f32
    } -> tensor<8x64xf32>
    ```
  }];
  let options = [
    Option<"maxInputs", "max-inputs", "unsigned", /*default=*/"4",
           "Most inputs of a concatenation written as a generic">,
  ];
  let dependentDialects = ["::mlir::linalg::LinalgDialect", "::mlir::tensor::TensorDialect",
                           "::mlir::arith::ArithDialect"];
}

def KForgeSlicesToGenerics : Pass<"kforge-slices-to-generics", "::mlir::ModuleOp"> {
  let summary = "Write static tensor.extract_slice ops as linalg.generic copies";
  let description = [{
    The kernel spec has no record for `tensor.extract_slice` (torch-mlir writes `x[:, :32]`
    and `chunk` that way), but a slice with static offsets, sizes and strides is a copy whose
    input indexing map adds the offsets and scales by the strides. This pass writes it so, and
    fusion and export treat it as any elementwise op. A dimension read from 0 with stride 1 but
    not to its end is written `d mod <source size>` (the same index, since `d` stays below the
    slice size), because a plain `d` would tell linalg the loop spans the whole source
    dimension. Dynamic slices are left alone.

    Before:
    ```mlir
    %s = tensor.extract_slice %x[0, 32] [8, 32] [1, 1] : tensor<8x64xf32> to tensor<8x32xf32>
    ```
    After:
    ```mlir
    %e = tensor.empty() : tensor<8x32xf32>
    %s = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1 + 32)>,
                                          affine_map<(d0, d1) -> (d0, d1)>],
                         iterator_types = ["parallel", "parallel"]}
        ins(%x : tensor<8x64xf32>) outs(%e : tensor<8x32xf32>) {
    ^bb0(%in: f32, %out: f32):
      linalg.yield %in : f32
    } -> tensor<8x32xf32>
    ```
  }];
  let dependentDialects = ["::mlir::linalg::LinalgDialect", "::mlir::tensor::TensorDialect"];
}

#endif // KFORGE_PASSES
