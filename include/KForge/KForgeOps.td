//===- KForgeOps.td - kforge dialect operations ------------*- tablegen -*-===//

#ifndef KFORGE_OPS
#define KFORGE_OPS

include "KForge/KForgeDialect.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/IR/BuiltinAttributes.td"

def KForge_FusionRegionOp : KForge_Op<"fusion_region", [
    IsolatedFromAbove,
    SingleBlockImplicitTerminator<"::mlir::kforge::YieldOp">,
    RecursiveMemoryEffects]> {
  let summary = "A group of ops that one kernel computes.";
  let description = [{
    A fusion region is one kernel candidate: its body computes the results from the operands
    alone (it is isolated from above; each operand is bound to a block argument). `root_kind`
    names the op the region was formed around: `contraction`, `convolution`, `reduction` or
    `elementwise`. `fused` optionally lists the fused op kinds, for reports.

    ```mlir
    %0 = kforge.fusion_region "contraction" (%a = %arg0, %b = %arg1)
        : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32> {
      %e = tensor.empty() : tensor<4x16xf32>
      %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x16xf32>)
                         outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
      kforge.yield %m : tensor<4x16xf32>
    }
    ```
  }];
  let arguments = (ins Variadic<AnyType>:$inputs, StrAttr:$root_kind,
                       OptionalAttr<StrArrayAttr>:$fused);
  let results = (outs Variadic<AnyType>:$results);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let skipDefaultBuilders = 1;
  let builders = [
    OpBuilder<(ins "::mlir::TypeRange":$resultTypes, "::mlir::ValueRange":$inputs,
                   "::llvm::StringRef":$rootKind)>
  ];
  let extraClassDeclaration = [{
    ::mlir::Block &getBodyBlock() { return getBody().front(); }
    /// The root kinds a region may have.
    static bool isValidRootKind(::llvm::StringRef kind);
  }];
}

def KForge_YieldOp : KForge_Op<"yield", [
    Pure, ReturnLike, Terminator, HasParent<"FusionRegionOp">]> {
  let summary = "Returns the results of a fusion region.";
  let description = [{
    Terminates the body of a `kforge.fusion_region`; its operands become the region's results.

    ```mlir
    kforge.yield %0, %1 : tensor<4x16xf32>, tensor<4xf32>
    ```
  }];
  let arguments = (ins Variadic<AnyType>:$values);
  let builders = [OpBuilder<(ins), [{ /* nothing to yield */ }]>];
  let assemblyFormat = "attr-dict ($values^ `:` type($values))?";
}

def KForge_KernelOp : KForge_Op<"kernel", [
    Symbol, HasParent<"::mlir::ModuleOp">]> {
  let summary = "Declares a verified kernel for a fusion region.";
  let description = [{
    A module-level declaration of a kernel that KForge synthesized for the region whose content
    hash is `region_hash` and verified on `target`: a backend (`cuda`, `xpu` or `cpu`),
    optionally at an architecture (`cuda:sm_90`, `xpu:pvc`). `launch` holds the
    launch data (grid, warps, stages, tuning config); `verification` the verification record,
    whose `status` must be `"verified"`: only verified kernels are ever declared.

    ```mlir
    kforge.kernel @kforge_kernel_3f9a0c1d2e4b5a69_cuda
        : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
        target "cuda" hash "3f9a0c1d2e4b5a69"
        launch {grid = [1, 1, 1], num_warps = 4 : i64}
        verification {status = "verified", max_abs_err = 3.1e-06 : f64}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<FunctionType>:$function_type,
                       StrAttr:$target, StrAttr:$region_hash,
                       DictionaryAttr:$launch, DictionaryAttr:$verification);
  let assemblyFormat = [{
    $sym_name `:` $function_type `target` $target `hash` $region_hash
    `launch` $launch `verification` $verification attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// `BACKEND` or `BACKEND:ARCH`, BACKEND one of targetBackends() and ARCH a name of
    /// letters, digits and `_` (`cuda:sm_90`, `xpu:pvc`).
    static bool isValidTarget(::llvm::StringRef target);
    /// The backends KForge compiles for: the one list the verifier, the link pass and their
    /// diagnostics use (Python's is kforge.targets).
    static ::llvm::ArrayRef<::llvm::StringLiteral> targetBackends();
    /// "cuda, xpu, cpu", for diagnostics.
    static std::string targetBackendsText();
    /// The backend of a target: "cuda" for "cuda:sm_90".
    static ::llvm::StringRef targetBackend(::llvm::StringRef target);
  }];
}

def KForge_CustomCallOp : KForge_Op<"custom_call", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Calls a verified kernel.";
  let description = [{
    Calls the `kforge.kernel` named by `callee`. The operand and result types must match the
    kernel's function type.

    ```mlir
    %0 = kforge.custom_call @kforge_kernel_3f9a0c1d2e4b5a69_cuda(%arg0, %arg1)
        : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$callee, Variadic<AnyType>:$operands);
  let results = (outs Variadic<AnyType>:$results);
  let assemblyFormat = [{
    $callee `(` $operands `)` attr-dict `:` functional-type($operands, $results)
  }];
}

#endif // KFORGE_OPS
