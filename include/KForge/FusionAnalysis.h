//===- FusionAnalysis.h - which ops go into which fusion region -*- C++ -*-===//
//
// The fusion-candidate analysis. It answers questions and changes nothing: given a block of
// linalg-on-tensors ops, which groups of ops should each become one kernel, and for each op,
// what role it can play (an anchor, a consumer, a cheap producer to recompute, or an op that
// stays outside). `--kforge-form-regions` acts on its answers.
//
// Grouping, in short:
//  * Anchors, in program order: contractions (matmul, batch_matmul, transposed variants,
//    contraction-shaped generics) and convolutions. Then, with `standalone`, the remaining
//    reductions and elementwise ops seed their own groups.
//  * A group grows by its consumers (ops that use its values) of the enabled kinds:
//    elementwise, reduction (row reductions, softmax, norms, pooling), reshape.
//  * Cheap producers of its operands (fills, transposes, broadcasts, empties, small constants,
//    reshapes of inputs) are recomputed inside (cloned), never moved.
//  * A group is placed where its last op was. Growth stops where that would break dominance:
//    an operand produced after that point, or a value of the group needed by an op outside
//    before it. A value used outside stays available as a region result; nothing is computed
//    twice except pure cheap producers.
//  * A group without an anchor whose values only one later group reads is merged into that
//    group, when their reductions are over the same rows: a sibling chain off a shared input,
//    like torch-mlir's f32 mean of a layer norm beside its f64 variance, is one kernel with it.
//  * A group that is one contraction (and reshapes) whose values only one other group reads is
//    merged into it when that group's contraction reads an input of it too and has its result
//    type: SwiGLU's `silu(x @ Wg^T) * (x @ Wu^T)` is one region, whose two products a kernel
//    may compute from one pass over x.
//
//===----------------------------------------------------------------------===//
#ifndef KFORGE_FUSIONANALYSIS_H
#define KFORGE_FUSIONANALYSIS_H

#include "KForge/LinalgOpInfo.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Block.h"
#include "mlir/IR/Operation.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/SmallVector.h"

#include <string>

namespace mlir {
namespace kforge {

struct FusionOptions {
  /// Most linalg ops a region holds (cloned cheap producers not counted).
  unsigned maxOps = 32;
  bool fuseElementwise = true; ///< elementwise epilogues
  bool fuseReductions = true;  ///< row reductions, softmax, norms, pooling
  bool fuseReshapes = true;    ///< expand_shape / collapse_shape between them
  bool fuseProducers = true;   ///< recompute cheap producers inside
  bool standalone = true;      ///< regions for reductions/elementwise without an anchor
  /// Merge a lone contraction into the one region that reads it when that region's own
  /// contraction shares an input and the result type (sibling products, SwiGLU's gate and up).
  bool siblingContractions = true;
};

/// What an op can be in a fusion region.
enum class FusionRole {
  Anchor,      ///< contraction or convolution: seeds a region
  Reduction,   ///< a reduction (incl. pooling) with a supported body
  Elementwise, ///< all-parallel linalg op with a supported body
  Reshape,     ///< tensor.expand_shape / tensor.collapse_shape
  Cheap,       ///< cloned into regions that need it (fill, empty, constant, dim, ...)
  Outside,     ///< anything else: never enters a region
};

struct FusionGroup {
  /// Ops moved into the region, in program order.
  SmallVector<Operation *> ops;
  /// The op the group was formed around.
  Operation *seed = nullptr;
  /// contraction | convolution | reduction | elementwise
  std::string rootKind;
  /// Human-readable kinds of the fused ops ("matmul", "bias", "relu", ...), for reports.
  SmallVector<std::string> fused;
};

class FusionCandidateAnalysis {
public:
  FusionCandidateAnalysis(Block &block, const FusionOptions &options);

  ArrayRef<FusionGroup> getGroups() const { return groups; }

  /// The role `op` can play, from the op alone.
  static FusionRole getRole(Operation *op);

  /// The kind of a structured op for region purposes (pooling counts as a reduction, a
  /// contraction-shaped generic as a contraction).
  static LinalgOpKind getKind(Operation *op);

  /// True for ops that are recomputed inside regions rather than moved (see FusionRole::Cheap);
  /// also true for transposes and broadcasts, which may be either.
  static bool isCheapProducer(Operation *op);

  /// True if `value`, defined outside a region, can be recomputed inside it (its defining op
  /// and all the ops it needs are cheap), with tensors it reads from outside becoming region
  /// inputs. Scalars that cannot be recomputed cannot cross into a region.
  static bool isCloneable(Value value, bool fuseProducers);

  /// A tensor.pad the kernel spec describes: static amounts, a constant padding value.
  static bool isSupportedPad(tensor::PadOp pad);

  /// A short label for reports ("matmul", "bias", "relu", "reduce_sum", ...).
  static std::string getLabel(Operation *op);

  /// Appends to `values` every value used by `op` or ops nested in it that is defined
  /// outside `op` (operands and values captured by its regions), without duplicates.
  static void getUsedValues(Operation *op, llvm::SetVector<Value> &values);

private:
  struct Group {
    llvm::SetVector<Operation *> ops;
    int64_t position = -1;
    unsigned linalgOps = 0;
  };

  void grow(Operation *seed);
  void mergeSiblingGroups();
  void mergeSiblingContractions();
  /// Moves every op of group `from` into group `into` (placed where the later of the two was).
  void moveGroup(unsigned from, unsigned into);
  bool canMerge(unsigned from, unsigned into) const;
  bool canAdd(unsigned groupId, Operation *op);
  void add(unsigned groupId, Operation *op);
  bool consumerAllowed(Operation *op) const;
  FusionRole role(Operation *op) const;
  int64_t effectivePosition(Operation *op) const;
  int64_t effectivePosition(Value value) const;
  bool externalOperandsOk(Value value, unsigned groupId, Operation *candidate,
                          int64_t position, unsigned depth) const;

  Block &block;
  FusionOptions options;
  llvm::DenseMap<Operation *, int64_t> position;
  llvm::DenseMap<Operation *, unsigned> groupOf;
  llvm::DenseMap<Operation *, FusionRole> roles;
  /// Values already found available in the current canAdd query.
  mutable llvm::DenseSet<Value> checked;
  SmallVector<Group> work;
  SmallVector<FusionGroup> groups;
};

} // namespace kforge
} // namespace mlir

#endif // KFORGE_FUSIONANALYSIS_H
