//===- SlicesToGenerics.cpp - --kforge-slices-to-generics -----------------===//
//
// A static tensor.extract_slice is a copy with an affine input map; write it as one, so that
// fusion and the kernel spec see an ordinary elementwise op.
//
//===----------------------------------------------------------------------===//

#include "KForge/Passes.h"

#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/AffineExpr.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir {
namespace kforge {
#define GEN_PASS_DEF_KFORGESLICESTOGENERICS
#include "KForge/Passes.h.inc"
} // namespace kforge
} // namespace mlir

using namespace mlir;
using namespace mlir::kforge;

namespace {
struct SliceToGeneric : public OpRewritePattern<tensor::ExtractSliceOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(tensor::ExtractSliceOp slice,
                                PatternRewriter &rewriter) const override {
    RankedTensorType sourceType = slice.getSourceType();
    RankedTensorType resultType = slice.getResultType();
    if (!slice.getOffsets().empty() || !slice.getSizes().empty() ||
        !slice.getStrides().empty() || !resultType.hasStaticShape() ||
        resultType.getRank() == 0)
      return rewriter.notifyMatchFailure(slice, "dynamic or 0-d slice");
    if (!sourceType.hasStaticShape())
      return rewriter.notifyMatchFailure(slice, "dynamic source");
    llvm::SmallBitVector dropped = slice.getDroppedDims();
    ArrayRef<int64_t> offsets = slice.getStaticOffsets();
    ArrayRef<int64_t> strides = slice.getStaticStrides();
    MLIRContext *context = rewriter.getContext();
    unsigned rank = resultType.getRank();
    SmallVector<AffineExpr> inputExprs;
    unsigned loop = 0;
    for (int64_t dim = 0; dim < sourceType.getRank(); ++dim) {
      AffineExpr offset = getAffineConstantExpr(offsets[dim], context);
      if (dropped.test(dim)) {
        inputExprs.push_back(offset);
        continue;
      }
      if (loop >= rank)
        return rewriter.notifyMatchFailure(slice, "unexpected rank reduction");
      int64_t size = resultType.getDimSize(loop);
      AffineExpr index = getAffineDimExpr(loop++, context);
      if (offsets[dim] == 0 && strides[dim] == 1 && size != sourceType.getDimSize(dim)) {
        // A plain `d` would tell linalg that the loop spans the whole source dimension;
        // `d mod <size of the source dimension>` is the same index (d < size) without that
        // claim.
        inputExprs.push_back(index % sourceType.getDimSize(dim));
        continue;
      }
      inputExprs.push_back(offset + index * strides[dim]);
    }
    if (loop != rank)
      return rewriter.notifyMatchFailure(slice, "unexpected rank reduction");
    AffineMap inputMap = AffineMap::get(rank, 0, inputExprs, context);
    AffineMap outputMap = rewriter.getMultiDimIdentityMap(rank);
    Location loc = slice.getLoc();
    Value init = tensor::EmptyOp::create(rewriter, loc, resultType.getShape(),
                                         resultType.getElementType());
    SmallVector<utils::IteratorType> iterators(rank, utils::IteratorType::parallel);
    auto copy = linalg::GenericOp::create(
        rewriter, loc, TypeRange{resultType}, ValueRange{slice.getSource()},
        ValueRange{init}, ArrayRef<AffineMap>{inputMap, outputMap}, iterators,
        [](OpBuilder &b, Location nested, ValueRange args) {
          linalg::YieldOp::create(b, nested, args[0]);
        });
    rewriter.replaceOp(slice, copy.getResults());
    return success();
  }
};

struct SlicesToGenericsPass
    : public kforge::impl::KForgeSlicesToGenericsBase<SlicesToGenericsPass> {
  using Base::Base;
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<SliceToGeneric>(&getContext());
    GreedyRewriteConfig config;
    config.setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled);
    config.enableFolding(false);
    (void)applyPatternsGreedily(getOperation(), std::move(patterns), config);
  }
};
} // namespace
