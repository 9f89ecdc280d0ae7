//===- FusionAnalysis.cpp - fusion-candidate analysis ---------------------===//

#include "KForge/FusionAnalysis.h"
#include "KForge/RegionHash.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/IR/LinalgInterfaces.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringSet.h"

#include <optional>
#include <queue>

using namespace mlir;
using namespace mlir::kforge;

/// Scalar ops a region body may hold: the set the kernel spec (docs/kernel-spec.md) defines.
static bool isSupportedScalarOp(Operation *op) {
  static const llvm::StringSet<> supported = {
      "arith.constant", "arith.cmpf",     "arith.cmpi",     "arith.addf",
      "arith.subf",     "arith.mulf",     "arith.divf",     "arith.remf",
      "arith.negf",     "arith.maximumf", "arith.minimumf", "arith.maxnumf",
      "arith.minnumf",  "arith.addi",     "arith.subi",     "arith.muli",
      "arith.divsi",    "arith.divui",    "arith.remsi",    "arith.andi",
      "arith.ori",      "arith.xori",     "arith.select",   "arith.extf",
      "arith.truncf",   "arith.sitofp",   "arith.uitofp",   "arith.fptosi",
      "arith.fptoui",   "arith.index_cast", "arith.extsi",  "arith.extui",
      "arith.trunci",   "arith.bitcast",  "math.exp",       "math.exp2",
      "math.expm1",     "math.log",       "math.log1p",     "math.log2",
      "math.sqrt",      "math.rsqrt",     "math.tanh",      "math.erf",
      "math.erfc",      "math.sin",       "math.cos",       "math.absf",
      "math.powf",      "math.fpowi",     "math.floor",     "math.ceil",
      "math.round",     "math.roundeven", "math.sigmoid",   "math.atan",
      "math.atan2",     "math.tan",       "linalg.index",   "linalg.yield",
      // torch-mlir's runtime checks; the spec leaves them out.
      "cf.assert"};
  return supported.contains(op->getName().getStringRef());
}

static bool isRankedTensor(Type type) { return isa<RankedTensorType>(type); }

/// Small dense tensor constants are recomputed inside regions; large ones and resource blobs
/// (weights) stay outside as region inputs.
static bool isSmallTensorConstant(arith::ConstantOp constant) {
  auto type = dyn_cast<RankedTensorType>(constant.getType());
  if (!type || !type.hasStaticShape())
    return false;
  auto dense = dyn_cast<DenseElementsAttr>(constant.getValue());
  if (!dense)
    return false;
  return dense.isSplat() || type.getNumElements() <= 4096;
}

bool FusionCandidateAnalysis::isSupportedPad(tensor::PadOp pad) {
  if (!isRankedTensor(pad.getSource().getType()) ||
      !isRankedTensor(pad.getResult().getType()))
    return false;
  if (!pad.getLow().empty() || !pad.getHigh().empty())
    return false; // dynamic amounts
  Value padding = pad.getConstantPaddingValue();
  return padding && matchPattern(padding, m_Constant());
}

void FusionCandidateAnalysis::getUsedValues(Operation *op,
                                            llvm::SetVector<Value> &values) {
  op->walk([&](Operation *nested) {
    for (Value operand : nested->getOperands()) {
      Region *defRegion = operand.getParentRegion();
      // Defined inside `op` (a nested op's result or block argument): not used from outside.
      if (defRegion && op->isProperAncestor(defRegion->getParentOp()))
        continue;
      if (defRegion && defRegion->getParentOp() == op)
        continue;
      values.insert(operand);
    }
  });
}

static bool hasSupportedBody(linalg::LinalgOp op) {
  if (op->getNumRegions() != 1 || !op->getRegion(0).hasOneBlock())
    return false;
  for (Operation &inner : op->getRegion(0).front())
    if (!isSupportedScalarOp(&inner) || inner.getNumRegions() != 0)
      return false;
  return true;
}

static bool bodyHasMultiply(linalg::LinalgOp op) {
  if (op->getNumRegions() != 1 || op->getRegion(0).empty())
    return false;
  for (Operation &inner : op->getRegion(0).front())
    if (isa<arith::MulFOp, arith::MulIOp>(inner))
      return true;
  return false;
}

static bool isFill(linalg::LinalgOp op) {
  if (isa<linalg::FillOp>(op))
    return true;
  if (auto generic = dyn_cast<linalg::GenericOp>(op.getOperation()))
    return linalg::isaFillOpInterface(generic).has_value();
  return false;
}

/// Transposes, broadcasts, slices and copies: data movement, cheap to recompute where it is
/// read.
static bool isDataMovement(linalg::LinalgOp op) {
  if (isa<linalg::TransposeOp, linalg::BroadcastOp, linalg::CopyOp>(op))
    return true;
  auto generic = dyn_cast<linalg::GenericOp>(op.getOperation());
  if (!generic || generic.getNumDpsInputs() != 1 || generic.getNumDpsInits() != 1)
    return false;
  if (generic.getNumReductionLoops() != 0)
    return false;
  // The body only forwards its input, or converts it between float types (a bf16 model's
  // activations widened for a product, or narrowed after it): free where it is read.
  Block &body = generic.getRegion().front();
  auto yield = dyn_cast<linalg::YieldOp>(body.getTerminator());
  if (!yield || yield.getNumOperands() != 1)
    return false;
  Value forwarded = yield.getOperand(0);
  if (body.getOperations().size() == 2) {
    Operation *cast = forwarded.getDefiningOp();
    if (!cast || !isa<arith::ExtFOp, arith::TruncFOp>(cast))
      return false;
    forwarded = cast->getOperand(0);
  } else if (body.getOperations().size() != 1) {
    return false;
  }
  if (forwarded != body.getArgument(0))
    return false;
  // Any input map: transposes, broadcasts, and slices (offset/strided maps) alike.
  return generic.getIndexingMapsArray()[1].isIdentity();
}

LinalgOpKind FusionCandidateAnalysis::getKind(Operation *op) {
  auto linalgOp = dyn_cast<linalg::LinalgOp>(op);
  if (!linalgOp)
    return LinalgOpKind::Other;
  if (linalgOp.getNumLoops() == linalgOp.getNumParallelLoops())
    return LinalgOpKind::Elementwise;
  if (linalgOp.getNumReductionLoops() == 0)
    return LinalgOpKind::Other;
  if (linalg::isaContractionOpInterface(linalgOp))
    return LinalgOpKind::Contraction;
  bool projected = llvm::all_of(linalgOp.getIndexingMapsArray(), [](AffineMap map) {
    return map.isProjectedPermutation();
  });
  if (projected && linalgOp.getNumDpsInputs() >= 2 && bodyHasMultiply(linalgOp) &&
      succeeded(linalg::inferContractionDims(linalgOp)))
    return LinalgOpKind::Contraction;
  if (bodyHasMultiply(linalgOp) && linalg::isaConvolutionOpInterface(linalgOp))
    return LinalgOpKind::Convolution;
  // Pooling and every other reduction.
  return LinalgOpKind::Reduction;
}

FusionRole FusionCandidateAnalysis::getRole(Operation *op) {
  if (op->getNumResults() == 0)
    return FusionRole::Outside;
  if (auto linalgOp = dyn_cast<linalg::LinalgOp>(op)) {
    if (!linalgOp.hasPureTensorSemantics() || !hasSupportedBody(linalgOp))
      return FusionRole::Outside;
    if (!llvm::all_of(op->getResultTypes(), isRankedTensor))
      return FusionRole::Outside;
    for (Value operand : op->getOperands())
      if (!isRankedTensor(operand.getType()) && !operand.getType().isIntOrIndexOrFloat())
        return FusionRole::Outside;
    // Values the body captures from above must be recomputable scalars (constants).
    llvm::SetVector<Value> used;
    getUsedValues(op, used);
    for (Value value : used) {
      if (llvm::is_contained(op->getOperands(), value))
        continue;
      if (isRankedTensor(value.getType()) || !isCloneable(value, false))
        return FusionRole::Outside;
    }
    if (isFill(linalgOp))
      return FusionRole::Cheap;
    switch (getKind(op)) {
    case LinalgOpKind::Contraction:
    case LinalgOpKind::Convolution:
      return FusionRole::Anchor;
    case LinalgOpKind::Reduction:
      return FusionRole::Reduction;
    case LinalgOpKind::Elementwise:
      return FusionRole::Elementwise;
    case LinalgOpKind::Other:
      return FusionRole::Outside;
    }
  }
  if (isa<tensor::ExpandShapeOp, tensor::CollapseShapeOp>(op))
    return isRankedTensor(op->getOperand(0).getType()) ? FusionRole::Reshape
                                                       : FusionRole::Outside;
  if (auto pad = dyn_cast<tensor::PadOp>(op))
    return isSupportedPad(pad) ? FusionRole::Cheap : FusionRole::Outside;
  if (auto empty = dyn_cast<tensor::EmptyOp>(op))
    return isRankedTensor(empty.getType()) ? FusionRole::Cheap : FusionRole::Outside;
  if (isa<tensor::DimOp>(op))
    return isRankedTensor(op->getOperand(0).getType()) ? FusionRole::Cheap
                                                       : FusionRole::Outside;
  if (auto constant = dyn_cast<arith::ConstantOp>(op)) {
    if (constant.getType().isIntOrIndexOrFloat() || isSmallTensorConstant(constant))
      return FusionRole::Cheap;
    return FusionRole::Outside;
  }
  // Index arithmetic computing dynamic sizes.
  if (op->getDialect() && op->getDialect()->getNamespace() == "arith" &&
      op->getNumResults() == 1 && op->getNumRegions() == 0 &&
      op->getResult(0).getType().isIndex() && isPure(op))
    return FusionRole::Cheap;
  return FusionRole::Outside;
}

/// True for values computed from model parameters (function arguments marked
/// `kforge.weight`) and constants alone, such as the scale of an inference batch norm.
static bool isWeightDerived(Value value, unsigned depth) {
  if (depth > 8)
    return false;
  if (getWeightName(value) || matchPattern(value, m_Constant()))
    return true;
  Operation *def = value.getDefiningOp();
  if (!def)
    return false;
  if (isa<tensor::EmptyOp>(def))
    return true; // uninitialized: carries no data
  if (isa<tensor::ExpandShapeOp, tensor::CollapseShapeOp>(def))
    return isWeightDerived(def->getOperand(0), depth + 1);
  auto linalgOp = dyn_cast<linalg::LinalgOp>(def);
  if (!linalgOp)
    return false;
  FusionRole role = FusionCandidateAnalysis::getRole(def);
  if (role != FusionRole::Elementwise && role != FusionRole::Cheap)
    return false;
  llvm::SmallPtrSet<void *, 8> seen;
  for (OpOperand &operand : def->getOpOperands()) {
    // An init the body does not read only gives the shape.
    if (linalgOp.isDpsInit(&operand) &&
        !linalgOp.payloadUsesValueFromOperand(&operand))
      continue;
    if (!seen.insert(operand.get().getAsOpaquePointer()).second)
      continue;
    if (!isWeightDerived(operand.get(), depth + 1))
      return false;
  }
  return true;
}

bool FusionCandidateAnalysis::isCheapProducer(Operation *op) {
  FusionRole role = getRole(op);
  if (role == FusionRole::Cheap || role == FusionRole::Reshape)
    return true;
  if (role != FusionRole::Elementwise)
    return false;
  auto linalgOp = cast<linalg::LinalgOp>(op);
  if (isDataMovement(linalgOp))
    return true;
  // Small computations on parameters alone (folded batch-norm scales and the like) are
  // recomputed where they are read, like a transpose of a weight.
  constexpr int64_t kSmallPoints = 1 << 16;
  if (!linalgOp.hasDynamicShape() &&
      getStaticIterationPoints(linalgOp) <= kSmallPoints)
    return llvm::all_of(op->getResults(),
                        [](Value result) { return isWeightDerived(result, 0); });
  return false;
}

/// Ops that are always recomputed inside a region, even without `fuse-producers`: scalars,
/// dynamic sizes and uninitialized tensors.
static bool isAlwaysCloned(Operation *op) {
  if (isa<tensor::EmptyOp, tensor::DimOp>(op))
    return true;
  if (op->getNumResults() == 1 && op->getResult(0).getType().isIntOrIndexOrFloat())
    return true;
  return false;
}

static bool isCloneableImpl(Value value, bool fuseProducers, unsigned depth) {
  if (depth > 32)
    return false;
  Operation *def = value.getDefiningOp();
  if (!def || !FusionCandidateAnalysis::isCheapProducer(def))
    return false;
  if (!isAlwaysCloned(def) && !fuseProducers)
    return false;
  llvm::SetVector<Value> used;
  FusionCandidateAnalysis::getUsedValues(def, used);
  for (Value operand : used) {
    if (isRankedTensor(operand.getType()))
      continue; // read from outside: becomes a region input
    if (!isCloneableImpl(operand, fuseProducers, depth + 1))
      return false;
  }
  return true;
}

bool FusionCandidateAnalysis::isCloneable(Value value, bool fuseProducers) {
  return isCloneableImpl(value, fuseProducers, 0);
}

//===----------------------------------------------------------------------===//
// Labels, for reports
//===----------------------------------------------------------------------===//

static std::string combinerLabel(linalg::LinalgOp op) {
  Block *body = op.getBlock();
  if (!body || body->getNumArguments() == 0)
    return "";
  auto yield = dyn_cast<linalg::YieldOp>(body->getTerminator());
  if (!yield || yield.getNumOperands() == 0)
    return "";
  Operation *combiner = yield.getOperand(0).getDefiningOp();
  if (!combiner)
    return "";
  if (isa<arith::AddFOp, arith::AddIOp>(combiner))
    return "sum";
  if (isa<arith::MaximumFOp, arith::MaxNumFOp, arith::MaxSIOp>(combiner))
    return "max";
  if (isa<arith::MinimumFOp, arith::MinNumFOp, arith::MinSIOp>(combiner))
    return "min";
  if (isa<arith::MulFOp, arith::MulIOp>(combiner))
    return "prod";
  return "";
}

static bool hasBroadcastInput(linalg::LinalgOp op) {
  for (OpOperand *input : op.getDpsInputOperands()) {
    AffineMap map = op.getMatchingIndexingMap(input);
    if (map.getNumResults() < op.getNumLoops())
      return true;
  }
  return false;
}

std::string FusionCandidateAnalysis::getLabel(Operation *op) {
  if (isa<tensor::ExpandShapeOp, tensor::CollapseShapeOp>(op))
    return "reshape";
  auto linalgOp = dyn_cast<linalg::LinalgOp>(op);
  if (!linalgOp)
    return op->getName().getStringRef().str();
  if (!isa<linalg::GenericOp>(op))
    return op->getName().stripDialect().str();
  switch (getKind(op)) {
  case LinalgOpKind::Contraction:
    return linalgOp.getNumParallelLoops() > 2 ? "batch_matmul" : "matmul";
  case LinalgOpKind::Convolution:
    return "conv";
  case LinalgOpKind::Reduction: {
    std::string combiner = combinerLabel(linalgOp);
    return combiner.empty() ? "reduce" : "reduce_" + combiner;
  }
  case LinalgOpKind::Other:
    return "generic";
  case LinalgOpKind::Elementwise:
    break;
  }
  if (isFill(linalgOp))
    return "fill";
  if (auto generic = dyn_cast<linalg::GenericOp>(op)) {
    if (linalg::isaTransposeOpInterface(generic))
      return "transpose";
    if (linalg::isaBroadcastOpInterface(generic))
      return "broadcast";
  }
  // Name the epilogue from its scalar body.
  llvm::StringSet<> names;
  SmallVector<std::string> order;
  bool constantOperand = false, zeroOperand = false;
  for (Operation &inner : *linalgOp.getBlock()) {
    if (isa<linalg::YieldOp, linalg::IndexOp, arith::ConstantOp>(inner))
      continue;
    std::string name = inner.getName().stripDialect().str();
    if (names.insert(name).second)
      order.push_back(name);
    for (Value operand : inner.getOperands()) {
      if (matchPattern(operand, m_Constant()))
        constantOperand = true;
      if (matchPattern(operand, m_AnyZeroFloat()))
        zeroOperand = true;
    }
  }
  auto has = [&](StringRef name) { return names.contains(name); };
  if (has("erf"))
    return "gelu";
  if (has("tanh"))
    return order.size() > 2 ? "gelu_tanh" : "tanh";
  if (has("sigmoid") || (has("exp") && has("divf") && has("negf")))
    return has("mulf") ? "silu" : "sigmoid";
  if (order.size() == 1) {
    StringRef only = order.front();
    if ((only == "maximumf" || only == "maxnumf") && constantOperand)
      return zeroOperand ? "relu" : "clamp_min";
    if ((only == "minimumf" || only == "minnumf") && constantOperand)
      return "clamp_max";
    if (only == "addf" || only == "addi")
      return hasBroadcastInput(linalgOp) ? "bias" : "add";
    if (only == "mulf" || only == "muli")
      return hasBroadcastInput(linalgOp) || constantOperand ? "scale" : "mul";
    if (only == "divf")
      return "div";
    if (only == "subf")
      return "sub";
    return only.str();
  }
  if ((has("maximumf") || has("maxnumf")) && (has("minimumf") || has("minnumf")))
    return "clamp";
  if (has("cmpf") && has("select"))
    return has("mulf") ? "leaky_relu" : (zeroOperand ? "relu" : "clamp");
  if (has("rsqrt") || has("sqrt"))
    return "normalize";
  std::string label;
  for (const std::string &name : llvm::ArrayRef(order).take_front(3))
    label += (label.empty() ? "" : "_") + name;
  return label.empty() ? "copy" : label;
}

//===----------------------------------------------------------------------===//
// Grouping
//===----------------------------------------------------------------------===//

FusionCandidateAnalysis::FusionCandidateAnalysis(Block &block,
                                                 const FusionOptions &options)
    : block(block), options(options) {
  int64_t index = 0;
  for (Operation &op : block) {
    position[&op] = index++;
    roles[&op] = getRole(&op);
  }

  // Contractions and convolutions first: they claim their epilogues.
  for (Operation &op : block)
    if (!groupOf.count(&op) && role(&op) == FusionRole::Anchor)
      grow(&op);
  if (options.siblingContractions)
    mergeSiblingContractions();
  if (options.standalone) {
    for (Operation &op : block) {
      if (groupOf.count(&op))
        continue;
      FusionRole opRole = role(&op);
      bool elementwise =
          opRole == FusionRole::Elementwise && !isCheapProducer(&op);
      if (opRole == FusionRole::Reduction || elementwise)
        grow(&op);
    }
    mergeSiblingGroups();
  }

  for (Group &group : work) {
    if (group.ops.empty())
      continue; // merged into another group
    FusionGroup result;
    result.ops.assign(group.ops.begin(), group.ops.end());
    llvm::sort(result.ops, [&](Operation *a, Operation *b) {
      return position.lookup(a) < position.lookup(b);
    });
    result.seed = group.ops.front();
    LinalgOpKind strongest = LinalgOpKind::Elementwise;
    auto rank = [](LinalgOpKind kind) {
      switch (kind) {
      case LinalgOpKind::Contraction:
        return 4;
      case LinalgOpKind::Convolution:
        return 3;
      case LinalgOpKind::Reduction:
        return 2;
      default:
        return 1;
      }
    };
    for (Operation *op : result.ops) {
      if (!isa<linalg::LinalgOp>(op))
        continue;
      LinalgOpKind kind = getKind(op);
      if (rank(kind) > rank(strongest))
        strongest = kind;
      result.fused.push_back(getLabel(op));
    }
    result.rootKind = stringifyLinalgOpKind(strongest).str();
    groups.push_back(std::move(result));
  }
}

FusionRole FusionCandidateAnalysis::role(Operation *op) const {
  auto it = roles.find(op);
  if (it != roles.end())
    return it->second;
  return getRole(op);
}

bool FusionCandidateAnalysis::consumerAllowed(Operation *op) const {
  switch (role(op)) {
  case FusionRole::Elementwise:
    return options.fuseElementwise;
  case FusionRole::Reduction:
    return options.fuseReductions;
  case FusionRole::Reshape:
    return options.fuseReshapes;
  default:
    return false;
  }
}

int64_t FusionCandidateAnalysis::effectivePosition(Operation *op) const {
  auto it = groupOf.find(op);
  if (it != groupOf.end())
    return work[it->second].position;
  return position.lookup(op);
}

int64_t FusionCandidateAnalysis::effectivePosition(Value value) const {
  Operation *def = value.getDefiningOp();
  if (!def)
    return -1; // block arguments come first
  Operation *ancestor = block.findAncestorOpInBlock(*def);
  if (!ancestor)
    return -1; // defined above the block
  return effectivePosition(ancestor);
}

bool FusionCandidateAnalysis::externalOperandsOk(Value value, unsigned groupId,
                                                 Operation *candidate,
                                                 int64_t pos,
                                                 unsigned depth) const {
  // Within one query the answer for a value does not change: check each value once.
  if (!checked.insert(value).second)
    return true;
  Operation *def = value.getDefiningOp();
  if (def && (def == candidate || (groupOf.count(def) &&
                                   groupOf.lookup(def) == groupId &&
                                   work[groupId].ops.contains(def))))
    return true;
  if (def && !groupOf.count(def) && depth < 32 &&
      isCloneable(value, options.fuseProducers)) {
    // Recomputed inside: what it reads must be available at the region.
    llvm::SetVector<Value> used;
    getUsedValues(def, used);
    for (Value operand : used)
      if (!externalOperandsOk(operand, groupId, candidate, pos, depth + 1))
        return false;
    return true;
  }
  if (!isRankedTensor(value.getType()))
    return false; // a scalar that cannot be recomputed cannot cross into a region
  return effectivePosition(value) < pos;
}

bool FusionCandidateAnalysis::canAdd(unsigned groupId, Operation *op) {
  Group &group = work[groupId];
  unsigned linalgOps = group.linalgOps + (isa<linalg::LinalgOp>(op) ? 1 : 0);
  if (linalgOps > options.maxOps)
    return false;
  int64_t newPosition = std::max(group.position, position.lookup(op));

  llvm::SetVector<Value> used;
  getUsedValues(op, used);
  checked.clear();
  for (Value value : used)
    if (!externalOperandsOk(value, groupId, op, newPosition, 0))
      return false;

  // Every value of the group used outside it must be used after the region.
  auto usersAfter = [&](Operation *member) {
    for (Value result : member->getResults()) {
      for (Operation *user : result.getUsers()) {
        Operation *ancestor = block.findAncestorOpInBlock(*user);
        if (!ancestor)
          return false;
        if (ancestor == op || group.ops.contains(ancestor))
          continue;
        if (effectivePosition(ancestor) <= newPosition)
          return false;
      }
    }
    return true;
  };
  if (!usersAfter(op))
    return false;
  for (Operation *member : group.ops)
    if (!usersAfter(member))
      return false;
  return true;
}

void FusionCandidateAnalysis::add(unsigned groupId, Operation *op) {
  Group &group = work[groupId];
  group.ops.insert(op);
  group.position = std::max(group.position, position.lookup(op));
  if (isa<linalg::LinalgOp>(op))
    ++group.linalgOps;
  groupOf[op] = groupId;
}

/// Rows x columns of a reduction's iteration space (parallel x reduction points); none when
/// a loop range is dynamic.
static std::optional<std::pair<int64_t, int64_t>> getRowsAndCols(linalg::LinalgOp op) {
  int64_t rows = 1, cols = 1;
  for (auto [range, type] :
       llvm::zip(op.getStaticLoopRanges(), op.getIteratorTypesArray())) {
    if (ShapedType::isDynamic(range))
      return std::nullopt;
    (type == utils::IteratorType::reduction ? cols : rows) *= range;
  }
  return std::make_pair(rows, cols);
}

bool FusionCandidateAnalysis::canMerge(unsigned from, unsigned into) const {
  const Group &source = work[from], &target = work[into];
  if (source.linalgOps + target.linalgOps > options.maxOps)
    return false;
  // No anchors (their regions stay as they grew), and one pass over the same rows: every
  // reduction of both groups has the same rows x columns.
  std::optional<std::pair<int64_t, int64_t>> shape;
  for (const Group *group : {&source, &target}) {
    for (Operation *op : group->ops) {
      FusionRole opRole = role(op);
      if (opRole == FusionRole::Anchor)
        return false;
      if (group == &source && !consumerAllowed(op))
        return false;
      if (opRole != FusionRole::Reduction)
        continue;
      auto opShape = getRowsAndCols(cast<linalg::LinalgOp>(op));
      if (!opShape || (shape && *shape != *opShape))
        return false;
      shape = opShape;
    }
  }
  // The merged region is placed where `into` is: every other reader of `from` comes after.
  int64_t merged = std::max(source.position, target.position);
  for (Operation *op : source.ops) {
    for (Operation *user : op->getUsers()) {
      Operation *ancestor = block.findAncestorOpInBlock(*user);
      if (!ancestor)
        return false;
      if (source.ops.contains(ancestor) || target.ops.contains(ancestor))
        continue;
      if (effectivePosition(ancestor) <= merged)
        return false;
    }
  }
  return true;
}

void FusionCandidateAnalysis::moveGroup(unsigned from, unsigned into) {
  Group &source = work[from], &target = work[into];
  for (Operation *op : source.ops) {
    target.ops.insert(op);
    groupOf[op] = into;
  }
  target.linalgOps += source.linalgOps;
  target.position = std::max(target.position, source.position);
  source.ops.clear();
  source.linalgOps = 0;
}

void FusionCandidateAnalysis::mergeSiblingGroups() {
  bool changed = true;
  while (changed) {
    changed = false;
    for (unsigned from = 0; from < work.size(); ++from) {
      if (work[from].ops.empty())
        continue;
      // The one other group that reads this group's values.
      std::optional<unsigned> reader;
      bool single = true;
      for (Operation *op : work[from].ops) {
        for (Operation *user : op->getUsers()) {
          Operation *ancestor = block.findAncestorOpInBlock(*user);
          auto it = ancestor ? groupOf.find(ancestor) : groupOf.end();
          if (it == groupOf.end() || it->second == from)
            continue;
          single &= !reader || *reader == it->second;
          reader = it->second;
        }
      }
      if (!reader || !single || !canMerge(from, *reader))
        continue;
      moveGroup(from, *reader);
      changed = true;
    }
  }
}

/// True when `a` and `b` read the same tensor (not a weight) as an input.
static bool readSameInput(Operation *a, Operation *b) {
  auto la = cast<linalg::LinalgOp>(a), lb = cast<linalg::LinalgOp>(b);
  for (OpOperand *x : la.getDpsInputOperands())
    for (OpOperand *y : lb.getDpsInputOperands())
      if (x->get() == y->get() && isRankedTensor(x->get().getType()) &&
          !isWeightDerived(x->get(), 0))
        return true;
  return false;
}

void FusionCandidateAnalysis::mergeSiblingContractions() {
  for (unsigned from = 0; from < work.size(); ++from) {
    Group &source = work[from];
    // One contraction, and reshapes or float casts of its result (a bf16 model's product is
    // narrowed to bf16 after it).
    Operation *contraction = nullptr;
    bool lone = !source.ops.empty();
    for (Operation *op : source.ops) {
      if (role(op) == FusionRole::Anchor && getKind(op) == LinalgOpKind::Contraction &&
          !contraction && op->getNumResults() == 1)
        contraction = op;
      else if (role(op) != FusionRole::Reshape &&
               !(isa<linalg::LinalgOp>(op) && isDataMovement(cast<linalg::LinalgOp>(op))))
        lone = false;
    }
    if (!lone || !contraction)
      continue;
    // Every reader outside it is in one other group.
    std::optional<unsigned> reader;
    bool single = true;
    for (Operation *op : source.ops) {
      for (Operation *user : op->getUsers()) {
        Operation *ancestor = block.findAncestorOpInBlock(*user);
        if (ancestor && source.ops.contains(ancestor))
          continue;
        auto it = ancestor ? groupOf.find(ancestor) : groupOf.end();
        single &= it != groupOf.end() && (!reader || *reader == it->second);
        if (it != groupOf.end())
          reader = it->second;
      }
    }
    if (!reader || !single)
      continue;
    Group &target = work[*reader];
    if (source.linalgOps + target.linalgOps > options.maxOps)
      continue;
    bool sibling = llvm::any_of(target.ops, [&](Operation *op) {
      return role(op) == FusionRole::Anchor && getKind(op) == LinalgOpKind::Contraction &&
             op->getNumResults() == 1 &&
             op->getResult(0).getType() == contraction->getResult(0).getType() &&
             readSameInput(op, contraction);
    });
    if (!sibling)
      continue;
    // The region stays where the reader is: the contraction's operands come before it, and
    // nothing else reads the contraction.
    moveGroup(from, *reader);
  }
}

void FusionCandidateAnalysis::grow(Operation *seed) {
  unsigned id = work.size();
  work.emplace_back();
  if (!canAdd(id, seed)) {
    work.pop_back();
    return;
  }
  // Visit the users of the group in program order: when an op is visited, every op before it
  // has been decided, as in a sweep over the block, but only users are looked at.
  using Entry = std::pair<int64_t, Operation *>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  llvm::DenseSet<Operation *> queued;
  auto addAndQueueUsers = [&](Operation *op) {
    add(id, op);
    for (Operation *user : op->getUsers()) {
      Operation *ancestor = block.findAncestorOpInBlock(*user);
      if (ancestor && queued.insert(ancestor).second)
        queue.push({position.lookup(ancestor), ancestor});
    }
  };
  addAndQueueUsers(seed);
  while (!queue.empty() && work[id].linalgOps < options.maxOps) {
    Operation *op = queue.top().second;
    queue.pop();
    if (groupOf.count(op) || !consumerAllowed(op))
      continue;
    if (canAdd(id, op))
      addAndQueueUsers(op);
  }
}
