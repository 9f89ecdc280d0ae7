//===- FormRegions.cpp - --kforge-form-regions ----------------------------===//
//
// Groups linalg-on-tensors ops into kforge.fusion_region ops, as the fusion-candidate analysis
// (FusionAnalysis.h) decides. This file only acts on the analysis' answers.
//
//===----------------------------------------------------------------------===//

#include "KForge/FusionAnalysis.h"
#include "KForge/KForgeOps.h"
#include "KForge/Passes.h"
#include "KForge/RegionHash.h"

#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Transforms/RegionUtils.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringExtras.h"

namespace mlir {
namespace kforge {
#define GEN_PASS_DEF_KFORGEFORMREGIONS
#include "KForge/Passes.h.inc"
} // namespace kforge
} // namespace mlir

using namespace mlir;
using namespace mlir::kforge;

namespace {

/// Unused, and free of side effects other than runtime checks.
static bool isDeadExceptChecks(Operation *op) {
  if (!op->use_empty())
    return false;
  if (isOpTriviallyDead(op))
    return true;
  WalkResult result = op->walk([&](Operation *nested) {
    if (nested == op || isPure(nested) ||
        nested->getName().getStringRef() == "cf.assert" ||
        nested->hasTrait<OpTrait::IsTerminator>())
      return WalkResult::advance();
    if (auto effects = dyn_cast<MemoryEffectOpInterface>(nested))
      if (effects.hasNoEffect())
        return WalkResult::advance();
    return WalkResult::interrupt();
  });
  return !result.wasInterrupted() && isa<linalg::LinalgOp>(op);
}

/// Builds one kforge.fusion_region from a group the analysis formed.
class RegionBuilder {
public:
  RegionBuilder(const FusionGroup &group,
                llvm::DenseSet<Operation *> &allMembers,
                bool fuseProducers)
      : group(group), allMembers(allMembers), fuseProducers(fuseProducers),
        members(group.ops.begin(), group.ops.end()) {}

  void build() {
    for (Operation *op : group.ops) {
      llvm::SetVector<Value> used;
      FusionCandidateAnalysis::getUsedValues(op, used);
      for (Value value : used)
        collect(value);
    }
    Block *block = group.seed->getBlock();
    SmallVector<Value> results;
    for (Operation *op : group.ops)
      for (Value result : op->getResults())
        if (llvm::any_of(result.getUsers(), [&](Operation *user) {
              return !members.contains(block->findAncestorOpInBlock(*user));
            }))
          results.push_back(result);
    if (results.empty())
      return; // dead code: leave it to the canonicalizer
    canonicalizeOrder(results);

    Operation *last = group.ops.back();
    OpBuilder builder(last->getContext());
    builder.setInsertionPointAfter(last);
    SmallVector<Type> resultTypes;
    for (Value result : results)
      resultTypes.push_back(result.getType());
    auto region = FusionRegionOp::create(builder, group.seed->getLoc(), resultTypes,
                                         inputs.getArrayRef(), group.rootKind);
    SmallVector<StringRef> fused(group.fused.begin(), group.fused.end());
    region.setFusedAttr(builder.getStrArrayAttr(fused));

    IRMapping mapping;
    Block &body = region.getBodyBlock();
    for (auto [input, arg] : llvm::zip(inputs, body.getArguments()))
      mapping.map(input, arg);
    builder.setInsertionPointToStart(&body);
    for (Operation *clone : clones)
      builder.clone(*clone, mapping);
    for (Operation *op : group.ops)
      builder.clone(*op, mapping);
    SmallVector<Value> yielded;
    for (Value result : results)
      yielded.push_back(mapping.lookup(result));
    YieldOp::create(builder, last->getLoc(), yielded);

    for (auto [result, replacement] : llvm::zip(results, region.getResults()))
      result.replaceUsesWithIf(replacement, [&](OpOperand &use) {
        return !members.contains(block->findAncestorOpInBlock(*use.getOwner()));
      });
    for (Operation *op : llvm::reverse(group.ops)) {
      allMembers.erase(op); // its address may be reused by a new op
      op->erase();
    }
    // Originals of recomputed producers that nothing else reads. The region recomputes them,
    // runtime checks (cf.assert) included, so the originals go even with such checks.
    for (Operation *clone : llvm::reverse(clones))
      if (!allMembers.contains(clone) && isDeadExceptChecks(clone))
        clone->erase();
  }

private:
  /// Orders inputs and results by structure, not by program order, so that the region (and
  /// its hash) does not depend on the order of independent ops.
  void canonicalizeOrder(SmallVector<Value> &results) {
    auto leaf = [&](Value value) -> std::optional<uint64_t> {
      if (!inputs.contains(value))
        return std::nullopt;
      return hashCombine({hashString("input"), hashType(value.getType()),
                          getWeightName(value) ? 1u : 0u});
    };
    StructuralHasher hasher(leaf);
    using Key = std::pair<SmallVector<uint64_t>, unsigned>;
    SmallVector<std::pair<Key, Value>> keyed;
    for (auto [index, input] : llvm::enumerate(inputs)) {
      SmallVector<uint64_t> signature;
      for (OpOperand &use : input.getUses()) {
        Operation *user = use.getOwner();
        if (members.contains(user) || clones.contains(user))
          signature.push_back(
              hashCombine({hasher.hashOp(user), use.getOperandNumber()}));
      }
      llvm::sort(signature);
      keyed.push_back({{signature, static_cast<unsigned>(index)}, input});
    }
    llvm::sort(keyed, [](const auto &a, const auto &b) { return a.first < b.first; });
    inputs.clear();
    for (auto &entry : keyed)
      inputs.insert(entry.second);

    SmallVector<std::pair<std::pair<uint64_t, unsigned>, Value>> keyedResults;
    for (auto [index, result] : llvm::enumerate(results))
      keyedResults.push_back(
          {{hasher.hashValue(result), static_cast<unsigned>(index)}, result});
    llvm::sort(keyedResults,
               [](const auto &a, const auto &b) { return a.first < b.first; });
    for (auto [index, entry] : llvm::enumerate(keyedResults))
      results[index] = entry.second;
  }

  void collect(Value value) {
    Operation *def = value.getDefiningOp();
    if (def && members.contains(def))
      return;
    if (def && !allMembers.contains(def) &&
        FusionCandidateAnalysis::isCloneable(value, fuseProducers)) {
      if (clones.contains(def))
        return;
      llvm::SetVector<Value> used;
      FusionCandidateAnalysis::getUsedValues(def, used);
      for (Value operand : used)
        collect(operand);
      clones.insert(def);
      return;
    }
    inputs.insert(value);
  }

  const FusionGroup &group;
  llvm::DenseSet<Operation *> &allMembers;
  bool fuseProducers;
  llvm::DenseSet<Operation *> members;
  llvm::SetVector<Value> inputs;
  llvm::SetVector<Operation *> clones;
};

struct FormRegionsPass
    : public kforge::impl::KForgeFormRegionsBase<FormRegionsPass> {
  using Base::Base;

  void runOnOperation() override {
    FusionOptions fusionOptions;
    fusionOptions.maxOps = maxOps;
    fusionOptions.fuseProducers = fuseProducers;
    fusionOptions.standalone = standalone;
    fusionOptions.siblingContractions = siblingContractions;
    fusionOptions.fuseElementwise = false;
    fusionOptions.fuseReductions = false;
    fusionOptions.fuseReshapes = false;
    SmallVector<StringRef> kinds;
    StringRef(consumers).split(kinds, ',', -1, /*KeepEmpty=*/false);
    for (StringRef kind : kinds) {
      kind = kind.trim();
      if (kind == "elementwise")
        fusionOptions.fuseElementwise = true;
      else if (kind == "reduction")
        fusionOptions.fuseReductions = true;
      else if (kind == "reshape")
        fusionOptions.fuseReshapes = true;
      else if (kind != "none") {
        getOperation()->emitError()
            << "kforge-form-regions: unknown consumer kind '" << kind
            << "' in consumers=\"" << consumers
            << "\"; use a comma-separated list of elementwise, reduction, "
               "reshape (or none)";
        return signalPassFailure();
      }
    }
    if (maxOps == 0) {
      getOperation()->emitError("kforge-form-regions: max-ops must be at least 1");
      return signalPassFailure();
    }

    for (Operation &op : getOperation().getBody()->getOperations()) {
      auto func = dyn_cast<FunctionOpInterface>(&op);
      // Outlined regions are kernels already: leave them alone.
      if (!func || func.isExternal() || func->hasAttr("kforge.hash"))
        continue;
      for (Block &block : func.getFunctionBody()) {
        FusionCandidateAnalysis analysis(block, fusionOptions);
        llvm::DenseSet<Operation *> allMembers;
        for (const FusionGroup &group : analysis.getGroups())
          allMembers.insert(group.ops.begin(), group.ops.end());
        for (const FusionGroup &group : analysis.getGroups())
          RegionBuilder(group, allMembers, fuseProducers).build();
      }
    }
  }
};
} // namespace
