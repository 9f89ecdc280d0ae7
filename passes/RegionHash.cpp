//===- RegionHash.cpp - stable content hashes of regions ------------------===//

#include "KForge/RegionHash.h"

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Support/xxhash.h"

using namespace mlir;
using namespace mlir::kforge;

uint64_t mlir::kforge::hashString(StringRef text) {
  return llvm::xxh3_64bits(text);
}

uint64_t mlir::kforge::hashCombine(ArrayRef<uint64_t> parts) {
  return llvm::xxh3_64bits(ArrayRef<uint8_t>(
      reinterpret_cast<const uint8_t *>(parts.data()), parts.size() * sizeof(uint64_t)));
}

uint64_t mlir::kforge::hashType(Type type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  type.print(os);
  return hashString(text);
}

static uint64_t hashAttribute(Attribute attr) {
  if (!attr)
    return 0;
  std::string text;
  llvm::raw_string_ostream os(text);
  attr.print(os);
  return hashString(text);
}

uint64_t StructuralHasher::hashValue(Value value) {
  auto it = values.find(value);
  if (it != values.end())
    return it->second;
  uint64_t hash;
  if (std::optional<uint64_t> leaf = leafHash(value)) {
    hash = *leaf;
  } else if (auto result = dyn_cast<OpResult>(value)) {
    hash = hashCombine({hashString("result"), hashOp(result.getOwner()),
                        result.getResultNumber()});
  } else {
    // A block argument of a nested block (e.g. a linalg body): its position and type; the
    // op that owns the block brings in the context.
    auto arg = cast<BlockArgument>(value);
    hash = hashCombine({hashString("barg"), arg.getArgNumber(), hashType(arg.getType())});
  }
  values[value] = hash;
  return hash;
}

uint64_t StructuralHasher::hashOp(Operation *op) {
  auto it = ops.find(op);
  if (it != ops.end())
    return it->second;
  SmallVector<uint64_t> parts;
  parts.push_back(hashString(op->getName().getStringRef()));
  parts.push_back(hashAttribute(op->getPropertiesAsAttribute()));
  parts.push_back(hashAttribute(op->getDiscardableAttrDictionary()));
  for (Type type : op->getResultTypes())
    parts.push_back(hashType(type));
  parts.push_back(op->getNumOperands());
  for (Value operand : op->getOperands())
    parts.push_back(hashValue(operand));
  parts.push_back(op->getNumSuccessors());
  for (Region &region : op->getRegions()) {
    parts.push_back(hashString("region"));
    for (Block &block : region) {
      parts.push_back(block.getNumArguments());
      for (Type type : block.getArgumentTypes())
        parts.push_back(hashType(type));
      // The block computes what its terminator uses; pure ops nothing uses do not count.
      if (!block.empty())
        parts.push_back(hashOp(&block.back()));
    }
  }
  uint64_t hash = hashCombine(parts);
  ops[op] = hash;
  return hash;
}

std::string mlir::kforge::computeRegionHash(Block &body,
                                            ArrayRef<bool> argIsWeight) {
  auto leaf = [&](Value value) -> std::optional<uint64_t> {
    auto arg = dyn_cast<BlockArgument>(value);
    if (!arg || arg.getOwner() != &body)
      return std::nullopt;
    bool weight = arg.getArgNumber() < argIsWeight.size() &&
                  argIsWeight[arg.getArgNumber()];
    return hashCombine({hashString("arg"), arg.getArgNumber(),
                        hashType(arg.getType()), weight ? 1u : 0u});
  };
  StructuralHasher hasher(leaf);
  SmallVector<uint64_t> parts;
  parts.push_back(hashString("kforge.region.v1"));
  for (BlockArgument arg : body.getArguments())
    parts.push_back(hasher.hashValue(arg));
  if (!body.empty()) {
    Operation *terminator = &body.back();
    parts.push_back(terminator->getNumOperands());
    for (Value operand : terminator->getOperands())
      parts.push_back(hasher.hashValue(operand));
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::format_hex_no_prefix(hashCombine(parts), 16, /*Upper=*/false);
  return text;
}

StringAttr mlir::kforge::getWeightName(Value value) {
  auto arg = dyn_cast<BlockArgument>(value);
  if (!arg)
    return nullptr;
  auto func = dyn_cast_or_null<FunctionOpInterface>(arg.getOwner()->getParentOp());
  if (!func || arg.getOwner() != &func.getFunctionBody().front())
    return nullptr;
  return func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), "kforge.weight");
}
