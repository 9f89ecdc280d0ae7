//===- ConcatToGenerics.cpp - --kforge-concat-to-generics -----------------===//
//
// A tensor.concat along a static dimension is an elementwise select between its inputs; write
// it as one, so that fusion and the kernel spec see an ordinary elementwise op.
//
//===----------------------------------------------------------------------===//

#include "KForge/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/AffineExpr.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir {
namespace kforge {
#define GEN_PASS_DEF_KFORGECONCATTOGENERICS
#include "KForge/Passes.h.inc"
} // namespace kforge
} // namespace mlir

using namespace mlir;
using namespace mlir::kforge;

namespace {
struct ConcatToGeneric : public OpRewritePattern<tensor::ConcatOp> {
  ConcatToGeneric(MLIRContext *context, unsigned maxInputs)
      : OpRewritePattern(context), maxInputs(maxInputs) {}

  LogicalResult matchAndRewrite(tensor::ConcatOp concat,
                                PatternRewriter &rewriter) const override {
    RankedTensorType resultType = concat.getResultType();
    unsigned rank = resultType.getRank();
    uint64_t dim = concat.getDim();
    ValueRange inputs = concat.getInputs();
    if (inputs.size() < 2 || inputs.size() > maxInputs)
      return rewriter.notifyMatchFailure(concat, "one input, or more than max-inputs");
    Type elementType = resultType.getElementType();
    if (!elementType.isIntOrIndexOrFloat())
      return rewriter.notifyMatchFailure(concat, "element type");
    if (resultType.isDynamicDim(dim))
      return rewriter.notifyMatchFailure(concat, "dynamic concatenated dimension");
    MLIRContext *context = rewriter.getContext();
    SmallVector<AffineMap> maps;
    SmallVector<int64_t> offsets;
    int64_t offset = 0;
    for (Value input : inputs) {
      auto type = cast<RankedTensorType>(input.getType());
      if (type.isDynamicDim(dim) || type.getDimSize(dim) == 0)
        return rewriter.notifyMatchFailure(concat, "dynamic or empty input along dim");
      int64_t size = type.getDimSize(dim);
      // (i + c) mod size == i - offset for offset <= i < offset + size, and in bounds for
      // every other i.
      int64_t shift = ((-offset) % size + size) % size;
      SmallVector<AffineExpr> exprs;
      for (unsigned d = 0; d < rank; ++d) {
        AffineExpr index = getAffineDimExpr(d, context);
        exprs.push_back(d == dim ? (index + shift) % size : index);
      }
      maps.push_back(AffineMap::get(rank, 0, exprs, context));
      offsets.push_back(offset);
      offset += size;
    }
    if (offset != resultType.getDimSize(dim))
      return rewriter.notifyMatchFailure(concat, "sizes do not add up");
    maps.push_back(rewriter.getMultiDimIdentityMap(rank));

    Location loc = concat.getLoc();
    SmallVector<OpFoldResult> sizes = tensor::getMixedSizes(rewriter, loc, inputs.front());
    sizes[dim] = rewriter.getIndexAttr(offset);
    Value init = tensor::EmptyOp::create(rewriter, loc, sizes, elementType);
    SmallVector<utils::IteratorType> iterators(rank, utils::IteratorType::parallel);
    unsigned count = inputs.size();
    auto generic = linalg::GenericOp::create(
        rewriter, loc, TypeRange{resultType}, inputs, ValueRange{init}, maps, iterators,
        [&](OpBuilder &b, Location nested, ValueRange args) {
          Value index = linalg::IndexOp::create(b, nested, dim);
          Value value = args[count - 1];
          for (unsigned k = count - 1; k-- > 0;) {
            Value bound = arith::ConstantIndexOp::create(b, nested, offsets[k + 1]);
            Value below = arith::CmpIOp::create(b, nested, arith::CmpIPredicate::ult, index,
                                                bound);
            value = arith::SelectOp::create(b, nested, below, args[k], value);
          }
          linalg::YieldOp::create(b, nested, value);
        });
    rewriter.replaceOp(concat, generic.getResults());
    return success();
  }

  unsigned maxInputs;
};

struct ConcatToGenericsPass
    : public kforge::impl::KForgeConcatToGenericsBase<ConcatToGenericsPass> {
  using Base::Base;
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<ConcatToGeneric>(&getContext(), maxInputs);
    GreedyRewriteConfig config;
    config.setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled);
    config.enableFolding(false);
    // Keep the bounds in the body, where the kernel spec reads them.
    config.enableConstantCSE(false);
    (void)applyPatternsGreedily(getOperation(), std::move(patterns), config);
  }
};
} // namespace
