//===- OutlineRegions.cpp - --kforge-outline-regions ----------------------===//
//
// Each kforge.fusion_region becomes a call of `func.func private @kforge_region_<hash>`.
//
//===----------------------------------------------------------------------===//

#include "KForge/KForgeOps.h"
#include "KForge/KernelSpec.h"
#include "KForge/LinalgOpInfo.h"
#include "KForge/Passes.h"
#include "KForge/RegionHash.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/StringSet.h"

namespace mlir {
namespace kforge {
#define GEN_PASS_DEF_KFORGEOUTLINEREGIONS
#include "KForge/Passes.h.inc"
} // namespace kforge
} // namespace mlir

using namespace mlir;
using namespace mlir::kforge;

static int64_t saturatingAdd(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() - b
             ? std::numeric_limits<int64_t>::max()
             : a + b;
}

namespace {
struct OutlineRegionsPass
    : public kforge::impl::KForgeOutlineRegionsBase<OutlineRegionsPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbolTable(module);
    SmallVector<FusionRegionOp> regions;
    module.walk([&](FusionRegionOp region) { regions.push_back(region); });
    for (FusionRegionOp region : regions)
      if (failed(outline(region, symbolTable)))
        return signalPassFailure();
  }

  /// {nodes, results}: the FX nodes the region's ops come from and the node behind each result
  /// ("" where none is known); see fxNodeOf. Null for IR without FX locations.
  static DictionaryAttr regionOrigin(FusionRegionOp region) {
    Builder b(region.getContext());
    SmallVector<Attribute> nodes, results;
    llvm::StringSet<> seen;
    region.getBodyBlock().walk([&](Operation *op) {
      if (std::optional<std::string> node = fxNodeOf(op->getLoc()))
        if (seen.insert(*node).second)
          nodes.push_back(b.getStringAttr(*node));
    });
    if (nodes.empty())
      return nullptr;
    Operation *terminator = region.getBodyBlock().getTerminator();
    for (Value value : terminator->getOperands()) {
      std::optional<std::string> node;
      if (Operation *def = value.getDefiningOp())
        node = fxNodeOf(def->getLoc());
      results.push_back(b.getStringAttr(node.value_or("")));
    }
    return b.getDictionaryAttr({b.getNamedAttr("nodes", b.getArrayAttr(nodes)),
                                b.getNamedAttr("results", b.getArrayAttr(results))});
  }

  LogicalResult outline(FusionRegionOp region, SymbolTable &symbolTable) {
    ModuleOp module = getOperation();
    MLIRContext *context = module.getContext();
    SmallVector<StringAttr> weights;
    SmallVector<bool> isWeight;
    for (Value input : region.getInputs()) {
      weights.push_back(getWeightName(input));
      isWeight.push_back(weights.back() != nullptr);
    }
    std::string hash = computeRegionHash(region.getBodyBlock(), isWeight);
    std::string name = "kforge_region_" + hash;
    auto type = FunctionType::get(context, region.getInputs().getTypes(),
                                  region.getResultTypes());

    // Provenance of this call site (the body below may be dropped for an equal region).
    DictionaryAttr origin = regionOrigin(region);

    Operation *existing = symbolTable.lookup(name);
    auto func = dyn_cast_or_null<func::FuncOp>(existing);
    if (existing && (!func || !func->hasAttr("kforge.hash")))
      return region.emitOpError("cannot outline: symbol @")
             << name << " already exists and is not an outlined region";
    if (func && func.getFunctionType() != type)
      return region.emitOpError("region hash ")
             << hash << " collides with @" << name << " of another type "
             << func.getFunctionType();

    if (!func) {
      OpBuilder builder(context); // detached: the symbol table inserts it
      func = func::FuncOp::create(builder, region.getLoc(), name, type);
      func.setPrivate();
      func.getBody().takeBody(region.getBody());
      Block &body = func.getBody().front();
      Operation *terminator = body.getTerminator();
      builder.setInsertionPoint(terminator);
      func::ReturnOp::create(builder, terminator->getLoc(), terminator->getOperands());
      terminator->erase();

      int64_t flops = 0;
      func.walk([&](linalg::LinalgOp op) {
        flops = saturatingAdd(flops, estimateFlops(op));
      });
      int64_t minBytes = 0;
      for (Type t : llvm::concat<const Type>(type.getInputs(), type.getResults()))
        minBytes = saturatingAdd(minBytes, getStaticByteSize(t));
      func->setAttr("kforge.hash", builder.getStringAttr(hash));
      func->setAttr("kforge.root_kind", region.getRootKindAttr());
      if (ArrayAttr fused = region.getFusedAttr())
        func->setAttr("kforge.fused", fused);
      func->setAttr("kforge.flops", builder.getI64IntegerAttr(flops));
      func->setAttr("kforge.min_bytes", builder.getI64IntegerAttr(minBytes));
      for (auto [index, weight] : llvm::enumerate(weights))
        if (weight)
          func.setArgAttr(index, "kforge.weight", weight);

      Operation *parent = module.getBody()->findAncestorOpInBlock(*region);
      symbolTable.insert(func, std::next(parent->getIterator()));
    }

    OpBuilder builder(region);
    auto call = func::CallOp::create(builder, region.getLoc(), func,
                                     region.getInputs());
    if (origin)
      call->setAttr("kforge.origin", origin);
    region.replaceAllUsesWith(call.getResults());
    region.erase();
    return success();
  }
};
} // namespace
