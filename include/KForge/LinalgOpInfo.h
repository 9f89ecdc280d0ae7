//===- LinalgOpInfo.h - what kind of linalg op is this? ---------*- C++ -*-===//
//
// Small queries on single linalg ops shared by the analyses and passes: the op's kind as the
// fusion analysis sees it, and cost estimates from static shapes.
//
//===----------------------------------------------------------------------===//
#ifndef KFORGE_LINALGOPINFO_H
#define KFORGE_LINALGOPINFO_H

#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "llvm/ADT/StringRef.h"

namespace mlir {
namespace kforge {

/// The kind of a linalg op, from its iteration space and body.
enum class LinalgOpKind { Contraction, Convolution, Reduction, Elementwise, Other };

LinalgOpKind classifyLinalgOp(linalg::LinalgOp op);
llvm::StringRef stringifyLinalgOpKind(LinalgOpKind kind);

/// Product of the static loop ranges; a dynamic range counts as 1.
int64_t getStaticIterationPoints(linalg::LinalgOp op);

/// Estimated FLOPs: 2 per iteration point for contractions and convolutions, otherwise one per
/// iteration point and scalar arith/math op of the body.
int64_t estimateFlops(linalg::LinalgOp op);

/// Bytes of a shaped type with static dims (dynamic dims count as 1); 0 for non-shaped types
/// whose size is unknown.
int64_t getStaticByteSize(Type type);

} // namespace kforge
} // namespace mlir

#endif // KFORGE_LINALGOPINFO_H
