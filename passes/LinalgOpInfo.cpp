//===- LinalgOpInfo.cpp - what kind of linalg op is this? -----------------===//

#include "KForge/LinalgOpInfo.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/LinalgInterfaces.h"
#include "mlir/IR/BuiltinTypes.h"

using namespace mlir;
using namespace mlir::kforge;

LinalgOpKind mlir::kforge::classifyLinalgOp(linalg::LinalgOp op) {
  if (linalg::isaContractionOpInterface(op))
    return LinalgOpKind::Contraction;
  if (linalg::isaConvolutionOpInterface(op))
    return LinalgOpKind::Convolution;
  if (op.getNumReductionLoops() > 0)
    return LinalgOpKind::Reduction;
  if (op.getNumLoops() == op.getNumParallelLoops())
    return LinalgOpKind::Elementwise;
  return LinalgOpKind::Other;
}

StringRef mlir::kforge::stringifyLinalgOpKind(LinalgOpKind kind) {
  switch (kind) {
  case LinalgOpKind::Contraction:
    return "contraction";
  case LinalgOpKind::Convolution:
    return "convolution";
  case LinalgOpKind::Reduction:
    return "reduction";
  case LinalgOpKind::Elementwise:
    return "elementwise";
  case LinalgOpKind::Other:
    return "other";
  }
  return "other";
}

static int64_t saturatingMul(int64_t a, int64_t b) {
  if (a == 0 || b == 0)
    return 0;
  if (a > std::numeric_limits<int64_t>::max() / b)
    return std::numeric_limits<int64_t>::max();
  return a * b;
}

int64_t mlir::kforge::getStaticIterationPoints(linalg::LinalgOp op) {
  int64_t points = 1;
  for (int64_t range : op.getStaticLoopRanges())
    points = saturatingMul(points, ShapedType::isDynamic(range) ? 1 : range);
  return points;
}

int64_t mlir::kforge::estimateFlops(linalg::LinalgOp op) {
  int64_t points = getStaticIterationPoints(op);
  LinalgOpKind kind = classifyLinalgOp(op);
  if (kind == LinalgOpKind::Contraction || kind == LinalgOpKind::Convolution)
    return saturatingMul(points, 2);
  int64_t scalarOps = 0;
  if (Block *body = op.getBlock()) {
    for (Operation &inner : *body) {
      StringRef ns = inner.getName().getDialectNamespace();
      if ((ns == "arith" || ns == "math") && !isa<arith::ConstantOp>(inner))
        ++scalarOps;
    }
  }
  return saturatingMul(points, scalarOps);
}

int64_t mlir::kforge::getStaticByteSize(Type type) {
  auto shaped = dyn_cast<ShapedType>(type);
  if (!shaped || !shaped.hasRank())
    return 0;
  Type elem = shaped.getElementType();
  int64_t bits = elem.isIntOrFloat() ? elem.getIntOrFloatBitWidth() : 64;
  if (isa<IndexType>(elem))
    bits = 64;
  int64_t elems = 1;
  for (int64_t dim : shaped.getShape())
    elems = saturatingMul(elems, ShapedType::isDynamic(dim) ? 1 : dim);
  return saturatingMul(elems, std::max<int64_t>(1, (bits + 7) / 8));
}
