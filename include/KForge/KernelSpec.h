//===- KernelSpec.h - kernel specs and host plans as JSON -------*- C++ -*-===//
//
// Builds the JSON documents of docs/kernel-spec.md: the kernel spec of an outlined region
// function and the host plan of a function that calls regions. The Python half reads them
// without MLIR, so everything it needs is spelled out: shapes, dtypes, indexing maps, and each
// op's scalar body as statements.
//
//===----------------------------------------------------------------------===//
#ifndef KFORGE_KERNELSPEC_H
#define KFORGE_KERNELSPEC_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Support/LLVM.h"
#include "llvm/Support/JSON.h"

#include <optional>
#include <string>

namespace mlir {
namespace kforge {

constexpr int64_t kSpecVersion = 1;

/// The kernel spec of an outlined region function (one with `kforge.hash`). Fails with a
/// located error if the function holds something the spec cannot describe.
FailureOr<llvm::json::Object> buildKernelSpec(func::FuncOp region);

/// The host plan of `func`: its region calls and the op records of everything else. Ops the
/// spec cannot describe become `opaque` records (with their MLIR text) and a warning.
FailureOr<llvm::json::Object> buildHostPlan(func::FuncOp func);

/// The FX node an op was imported from: the frontend names each location `"fx:<node>"(...)`
/// (python/kforge/frontend/fxgraph.py). Of locations CSE fused, the first named one.
std::optional<std::string> fxNodeOf(Location loc);

} // namespace kforge
} // namespace mlir

#endif // KFORGE_KERNELSPEC_H
