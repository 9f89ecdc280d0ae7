//===- Passes.h - KForge passes ---------------------------------*- C++ -*-===//
#ifndef KFORGE_PASSES_H
#define KFORGE_PASSES_H

#include "KForge/KForgeDialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir {
namespace kforge {

#define GEN_PASS_DECL
#include "KForge/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "KForge/Passes.h.inc"

/// Registers the `kforge-pipeline` pass pipeline.
void registerKForgePipeline();

/// Registers every KForge pass and the `kforge-pipeline` pass pipeline.
void registerKForgePassesAndPipelines();

} // namespace kforge
} // namespace mlir

#endif // KFORGE_PASSES_H
