//===- GathersToReshapes.cpp - --kforge-gathers-to-reshapes ---------------===//
//
// A gather (`tensor.extract` in a linalg.generic body) whose indices come from constant index
// tensors and visit the source in row-major order is a reshape; write it as one.
//
//===----------------------------------------------------------------------===//

#include "KForge/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir {
namespace kforge {
#define GEN_PASS_DEF_KFORGEGATHERSTORESHAPES
#include "KForge/Passes.h.inc"
} // namespace kforge
} // namespace mlir

using namespace mlir;
using namespace mlir::kforge;

namespace {

/// The integer values of a constant index tensor, row-major (dense or resource blob).
static std::optional<SmallVector<int64_t>> readIndices(Value value, int64_t count) {
  Attribute attr;
  if (!matchPattern(value, m_Constant(&attr)))
    return std::nullopt;
  SmallVector<int64_t> out;
  if (auto dense = dyn_cast<DenseIntElementsAttr>(attr)) {
    if (dense.getNumElements() != count)
      return std::nullopt;
    out.reserve(count);
    for (const APInt &x : dense.getValues<APInt>())
      out.push_back(x.getSExtValue());
    return out;
  }
  if (auto blob = dyn_cast<DenseI64ResourceElementsAttr>(attr)) {
    std::optional<ArrayRef<int64_t>> data = blob.tryGetAsArrayRef();
    if (!data || static_cast<int64_t>(data->size()) != count)
      return std::nullopt;
    out.assign(data->begin(), data->end());
    return out;
  }
  if (auto blob = dyn_cast<DenseI32ResourceElementsAttr>(attr)) {
    std::optional<ArrayRef<int32_t>> data = blob.tryGetAsArrayRef();
    if (!data || static_cast<int64_t>(data->size()) != count)
      return std::nullopt;
    out.assign(data->begin(), data->end());
    return out;
  }
  return std::nullopt;
}

/// The block argument an index of the extract comes from: `index_cast(x)`, optionally with
/// torch's wrap of negative indices, `select(x < 0, x + size, x)`.
static BlockArgument traceIndex(Value index, int64_t size, bool &wraps) {
  wraps = false;
  if (auto cast = index.getDefiningOp<arith::IndexCastOp>())
    index = cast.getIn();
  if (auto arg = dyn_cast<BlockArgument>(index))
    return arg;
  auto select = index.getDefiningOp<arith::SelectOp>();
  if (!select)
    return nullptr;
  auto arg = dyn_cast<BlockArgument>(select.getFalseValue());
  auto cmp = select.getCondition().getDefiningOp<arith::CmpIOp>();
  auto add = select.getTrueValue().getDefiningOp<arith::AddIOp>();
  if (!arg || !cmp || !add || cmp.getPredicate() != arith::CmpIPredicate::slt ||
      cmp.getLhs() != arg || !matchPattern(cmp.getRhs(), m_Zero()))
    return nullptr;
  APInt addend;
  Value other = add.getLhs() == arg ? add.getRhs() : add.getLhs();
  if ((add.getLhs() != arg && add.getRhs() != arg) ||
      !matchPattern(other, m_ConstantInt(&addend)) || addend.getSExtValue() != size)
    return nullptr;
  wraps = true;
  return arg;
}

struct GatherToReshape : public OpRewritePattern<linalg::GenericOp> {
  GatherToReshape(MLIRContext *context, int64_t maxElements)
      : OpRewritePattern(context), maxElements(maxElements) {}

  LogicalResult matchAndRewrite(linalg::GenericOp op,
                                PatternRewriter &rewriter) const override {
    if (!op.hasPureTensorSemantics() || op.getNumResults() != 1 ||
        op.getNumReductionLoops() != 0 ||
        !llvm::all_of(op.getIndexingMapsArray(),
                      [](AffineMap map) { return map.isIdentity(); }))
      return rewriter.notifyMatchFailure(op, "not an all-parallel identity generic");
    auto resultType = dyn_cast<RankedTensorType>(op.getResult(0).getType());
    if (!resultType || !resultType.hasStaticShape())
      return rewriter.notifyMatchFailure(op, "dynamic result");
    Block &body = op.getRegion().front();
    auto yield = cast<linalg::YieldOp>(body.getTerminator());
    auto extract = yield.getOperand(0).getDefiningOp<tensor::ExtractOp>();
    if (!extract || extract->getBlock() != &body)
      return rewriter.notifyMatchFailure(op, "does not yield a tensor.extract");
    Value source = extract.getTensor();
    auto sourceType = dyn_cast<RankedTensorType>(source.getType());
    if (!sourceType || !sourceType.hasStaticShape() ||
        source.getParentRegion() == &op.getRegion() ||
        sourceType.getElementType() != resultType.getElementType() ||
        sourceType.getNumElements() != resultType.getNumElements())
      return rewriter.notifyMatchFailure(op, "source is not a static tensor of as many elements");
    if (sourceType.getRank() == 0 || resultType.getRank() == 0)
      return rewriter.notifyMatchFailure(op, "a 0-d tensor");
    int64_t count = resultType.getNumElements();
    if (count > maxElements)
      return rewriter.notifyMatchFailure(op, "too large to check");

    // Each source dimension's index, read from a constant input.
    SmallVector<SmallVector<int64_t>> indices;
    for (auto [dim, index] : llvm::enumerate(extract.getIndices())) {
      bool wraps;
      BlockArgument arg = traceIndex(index, sourceType.getDimSize(dim), wraps);
      if (!arg || arg.getOwner() != &body ||
          arg.getArgNumber() >= op.getNumDpsInputs())
        return rewriter.notifyMatchFailure(op, "an index is not a wrapped input");
      std::optional<SmallVector<int64_t>> values =
          readIndices(op.getDpsInputs()[arg.getArgNumber()], count);
      if (!values)
        return rewriter.notifyMatchFailure(op, "an index input is not a readable constant");
      if (wraps)
        for (int64_t &v : *values)
          if (v < 0)
            v += sourceType.getDimSize(dim);
      indices.push_back(std::move(*values));
    }
    // Row-major visit, element for element: a reshape.
    SmallVector<int64_t> strides(sourceType.getRank(), 1);
    for (int64_t d = sourceType.getRank() - 2; d >= 0; --d)
      strides[d] = strides[d + 1] * sourceType.getDimSize(d + 1);
    for (int64_t i = 0; i < count; ++i) {
      int64_t linear = 0;
      for (int64_t d = 0; d < sourceType.getRank(); ++d) {
        int64_t v = indices[d][i];
        if (v < 0 || v >= sourceType.getDimSize(d))
          return rewriter.notifyMatchFailure(op, "index out of range");
        linear += v * strides[d];
      }
      if (linear != i)
        return rewriter.notifyMatchFailure(op, "not a row-major visit");
    }

    Location loc = op.getLoc();
    Value flat = source;
    auto flatType = RankedTensorType::get({count}, sourceType.getElementType());
    if (sourceType.getRank() != 1) {
      ReassociationIndices all;
      for (int64_t d = 0; d < sourceType.getRank(); ++d)
        all.push_back(d);
      SmallVector<ReassociationIndices> groups{all};
      flat = tensor::CollapseShapeOp::create(rewriter, loc, flatType, source, groups);
    }
    Value result = flat;
    if (resultType.getRank() != 1) {
      ReassociationIndices all;
      for (int64_t d = 0; d < resultType.getRank(); ++d)
        all.push_back(d);
      SmallVector<ReassociationIndices> groups{all};
      result = tensor::ExpandShapeOp::create(rewriter, loc, resultType, flat, groups);
    }
    rewriter.replaceOp(op, result);
    return success();
  }

  int64_t maxElements;
};

struct GathersToReshapesPass
    : public kforge::impl::KForgeGathersToReshapesBase<GathersToReshapesPass> {
  using Base::Base;
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<GatherToReshape>(&getContext(), maxElements);
    // Only these rewrites, applied where they match; no folding of anything else.
    GreedyRewriteConfig config;
    config.setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled);
    config.enableFolding(false);
    (void)applyPatternsGreedily(getOperation(), std::move(patterns), config);
  }
};
} // namespace
