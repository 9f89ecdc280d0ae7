//===- RegionHash.h - stable content hashes of regions ----------*- C++ -*-===//
//
// A Merkle-style structural hash: a value's hash is made of its defining op's name,
// attributes, result types and its operands' hashes; leaves (region inputs) are hashed by
// the caller. It ignores SSA names, locations and the order of independent ops, and changes
// with any op, attribute, constant or type.
//
//===----------------------------------------------------------------------===//
#ifndef KFORGE_REGIONHASH_H
#define KFORGE_REGIONHASH_H

#include "mlir/IR/Block.h"
#include "mlir/IR/Operation.h"
#include "mlir/IR/Value.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLFunctionalExtras.h"

#include <optional>
#include <string>

namespace mlir {
namespace kforge {

class StructuralHasher {
public:
  /// `leafHash` returns the hash of a value that is a leaf (a region input), or nullopt for
  /// values whose definition should be hashed.
  explicit StructuralHasher(
      llvm::function_ref<std::optional<uint64_t>(Value)> leafHash)
      : leafHash(leafHash) {}

  uint64_t hashValue(Value value);
  uint64_t hashOp(Operation *op);

private:
  llvm::function_ref<std::optional<uint64_t>(Value)> leafHash;
  llvm::DenseMap<Value, uint64_t> values;
  llvm::DenseMap<Operation *, uint64_t> ops;
};

/// Hash of the bytes of `text`.
uint64_t hashString(llvm::StringRef text);
/// Combines hashes in order.
uint64_t hashCombine(llvm::ArrayRef<uint64_t> parts);
/// Hash of a type's textual form.
uint64_t hashType(Type type);

/// The hash of a region whose entry block is `body`: its arguments (types, and which are
/// weights) in order and the hashes of the terminator's operands, as 16 lowercase hex digits.
std::string computeRegionHash(Block &body, llvm::ArrayRef<bool> argIsWeight);

/// The `kforge.weight` name of a value that is a function argument marked as a model
/// parameter, or null.
StringAttr getWeightName(Value value);

} // namespace kforge
} // namespace mlir

#endif // KFORGE_REGIONHASH_H
