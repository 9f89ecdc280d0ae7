//===- KernelSpec.cpp - kernel specs and host plans as JSON ---------------===//

#include "KForge/KernelSpec.h"
#include "KForge/FusionAnalysis.h"
#include "KForge/KForgeOps.h"
#include "KForge/LinalgOpInfo.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/AffineExpr.h"
#include "mlir/IR/AffineMap.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Matchers.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>

using namespace mlir;
using namespace mlir::kforge;
namespace json = llvm::json;

static std::string printToString(Type type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  type.print(os);
  return text;
}

static std::string printToString(AffineMap map) {
  std::string text;
  llvm::raw_string_ostream os(text);
  map.print(os);
  return text;
}

static std::string printToString(Operation *op) {
  std::string text;
  llvm::raw_string_ostream os(text);
  op->print(os, OpPrintingFlags().useLocalScope());
  return text;
}

static json::Value floatJson(const APFloat &value) {
  if (value.isNaN())
    return "nan";
  if (value.isInfinity())
    return value.isNegative() ? "-inf" : "inf";
  bool losesInfo = false;
  APFloat copy = value;
  copy.convert(APFloat::IEEEdouble(), APFloat::rmNearestTiesToEven, &losesInfo);
  return copy.convertToDouble();
}

static json::Value intJson(const APInt &value, Type type) {
  if (type.isInteger(1))
    return value.isZero() ? 0 : 1;
  if (value.getBitWidth() > 64)
    return value.getSExtValue(); // wider integers are not in the spec; keep the low bits
  return type.isUnsignedInteger() ? json::Value(value.getZExtValue())
                                  : json::Value(value.getSExtValue());
}

/// The JSON of a scalar attribute value, if it is one.
static std::optional<json::Value> scalarJson(Attribute attr) {
  if (auto f = dyn_cast<FloatAttr>(attr))
    return floatJson(f.getValue());
  if (auto i = dyn_cast<IntegerAttr>(attr))
    return intJson(i.getValue(), i.getType());
  if (auto b = dyn_cast<BoolAttr>(attr))
    return json::Value(b.getValue() ? 1 : 0);
  return std::nullopt;
}

static json::Value affineJson(AffineExpr expr) {
  if (auto dim = dyn_cast<AffineDimExpr>(expr))
    return json::Object{{"d", static_cast<int64_t>(dim.getPosition())}};
  if (auto sym = dyn_cast<AffineSymbolExpr>(expr))
    return json::Object{{"s", static_cast<int64_t>(sym.getPosition())}};
  if (auto cst = dyn_cast<AffineConstantExpr>(expr))
    return json::Object{{"c", cst.getValue()}};
  auto bin = cast<AffineBinaryOpExpr>(expr);
  StringRef op;
  switch (bin.getKind()) {
  case AffineExprKind::Add:
    op = "add";
    break;
  case AffineExprKind::Mul:
    op = "mul";
    break;
  case AffineExprKind::Mod:
    op = "mod";
    break;
  case AffineExprKind::FloorDiv:
    op = "floordiv";
    break;
  case AffineExprKind::CeilDiv:
    op = "ceildiv";
    break;
  default:
    op = "add";
    break;
  }
  return json::Object{{"op", op},
                      {"lhs", affineJson(bin.getLHS())},
                      {"rhs", affineJson(bin.getRHS())}};
}

static json::Value affineMapJson(AffineMap map) {
  json::Array results;
  for (AffineExpr expr : map.getResults())
    results.push_back(affineJson(expr));
  return json::Object{{"num_dims", static_cast<int64_t>(map.getNumDims())},
                      {"results", std::move(results)},
                      {"text", printToString(map)}};
}

/// Element types the spec names.
static bool isSpecDtype(Type type) {
  return type.isF16() || type.isBF16() || type.isF32() || type.isF64() ||
         type.isIndex() || type.isSignlessInteger(1) || type.isSignlessInteger(8) ||
         type.isSignlessInteger(16) || type.isSignlessInteger(32) ||
         type.isSignlessInteger(64);
}

namespace {
/// Names values (`arg<i>`, `v<i>`) and writes op records for one function.
class RecordWriter {
public:
  explicit RecordWriter(func::FuncOp func) : func(func) {}

  /// Names and types the function arguments.
  LogicalResult defineArguments(json::Array &out) {
    for (BlockArgument arg : func.getArguments()) {
      std::string name = "arg" + std::to_string(arg.getArgNumber());
      json::Object entry;
      if (failed(typeFields(arg.getType(), entry)))
        return emitError(func.getLoc())
               << "argument #" << arg.getArgNumber() << " has type " << arg.getType()
               << ", which the kernel spec cannot describe (ranked tensors and scalars of "
                  "f16/bf16/f32/f64/i1/i8/i16/i32/i64/index only)";
      entry["name"] = name;
      auto weight =
          func.getArgAttrOfType<StringAttr>(arg.getArgNumber(), "kforge.weight");
      entry["weight"] = weight ? json::Value(weight.getValue()) : json::Value(nullptr);
      names[arg] = name;
      out.push_back(std::move(entry));
    }
    return success();
  }

  /// Names a new intermediate value.
  LogicalResult define(Value value) {
    json::Object entry;
    if (failed(typeFields(value.getType(), entry)))
      return failure();
    std::string name = "v" + std::to_string(values.size());
    entry["name"] = name;
    names[value] = name;
    values.push_back(std::move(entry));
    return success();
  }

  /// Names every result of `op`; fails, with the reason in `why`, if a type cannot be
  /// described (then none is named).
  LogicalResult defineResults(Operation *op, json::Array &out, std::string &why) {
    for (Value result : op->getResults()) {
      json::Object probe;
      if (failed(typeFields(result.getType(), probe))) {
        why = "a result of '" + op->getName().getStringRef().str() + "' has type " +
              printToString(result.getType()) + ", which the spec cannot describe";
        return failure();
      }
    }
    for (Value result : op->getResults()) {
      (void)define(result);
      out.push_back(*nameOf(result));
    }
    return success();
  }

  std::optional<std::string> nameOf(Value value) const {
    auto it = names.find(value);
    if (it == names.end())
      return std::nullopt;
    return it->second;
  }

  /// Ops that only compute sizes (index scalars, tensor.dim): the spec derives sizes from
  /// shapes, so these are left out.
  static bool isSizeComputation(Operation *op) {
    if (op->getNumResults() == 0 || !isPure(op) || op->getNumRegions() != 0)
      return false;
    return llvm::all_of(op->getResultTypes(),
                        [](Type type) { return type.isIndex(); });
  }

  /// The record of `op`, or failure with a reason (not emitted).
  FailureOr<json::Object> record(Operation *op, std::string &why) {
    if (auto linalgOp = dyn_cast<linalg::LinalgOp>(op))
      return genericRecord(linalgOp, why);
    if (isa<tensor::ExpandShapeOp, tensor::CollapseShapeOp>(op))
      return reshapeRecord(op, why);
    if (auto empty = dyn_cast<tensor::EmptyOp>(op))
      return emptyRecord(empty, why);
    if (auto constant = dyn_cast<arith::ConstantOp>(op))
      return constantRecord(constant, why);
    if (auto pad = dyn_cast<tensor::PadOp>(op))
      return padRecord(pad, why);
    why = "the kernel spec has no record for '" + op->getName().getStringRef().str() + "'";
    return failure();
  }

  json::Array takeValues() { return std::move(values); }

  /// Records of scalar constants that the last record reads; they go before it.
  json::Array takePending() {
    json::Array out = std::move(pending);
    pending = json::Array();
    return out;
  }

  /// Scalar constants are written where they are first read (see operandNames).
  static bool isDeferred(Operation *op) {
    auto constant = dyn_cast<arith::ConstantOp>(op);
    return constant && constant.getType().isIntOrFloat();
  }

  /// Follows a dynamic size back to the function argument dimension it comes from.
  std::optional<std::pair<std::string, int64_t>> traceSize(Value size,
                                                           unsigned depth = 0) {
    if (depth > 64)
      return std::nullopt;
    auto dim = size.getDefiningOp<tensor::DimOp>();
    if (!dim)
      return std::nullopt;
    std::optional<int64_t> index = dim.getConstantIndex();
    if (!index)
      return std::nullopt;
    return traceDim(dim.getSource(), *index, depth + 1);
  }

  /// Appends the names of `operands`; a scalar constant read for the first time gets its
  /// record (see takePending). Fails, with the reason in `why`, on an unnamed value.
  LogicalResult operandNames(Operation *op, ValueRange operands, json::Array &out,
                             std::string &why) {
    for (Value operand : operands) {
      // Scalar constants get their record where they are first read (a fill value, say);
      // those only captured by bodies become statements there and need none.
      if (!nameOf(operand))
        if (auto constant = operand.getDefiningOp<arith::ConstantOp>())
          if (constant.getType().isIntOrFloat()) {
            FailureOr<json::Object> record = constantRecord(constant, why);
            if (failed(record))
              return failure();
            pending.push_back(std::move(*record));
          }
      std::optional<std::string> name = nameOf(operand);
      if (!name) {
        why = "an operand of '" + op->getName().getStringRef().str() +
              "' is not a tensor or scalar the spec names";
        return failure();
      }
      out.push_back(*name);
    }
    return success();
  }

private:
  std::optional<std::pair<std::string, int64_t>> traceDim(Value tensor, int64_t index,
                                                          unsigned depth) {
    if (depth > 64)
      return std::nullopt;
    if (auto arg = dyn_cast<BlockArgument>(tensor)) {
      if (std::optional<std::string> name = nameOf(arg))
        if (StringRef(*name).starts_with("arg"))
          return std::make_pair(*name, index);
      return std::nullopt;
    }
    Operation *def = tensor.getDefiningOp();
    if (auto dps = dyn_cast_or_null<DestinationStyleOpInterface>(def)) {
      auto result = cast<OpResult>(tensor);
      return traceDim(dps.getTiedOpOperand(result)->get(), index, depth + 1);
    }
    if (auto empty = dyn_cast_or_null<tensor::EmptyOp>(def)) {
      if (!empty.getType().isDynamicDim(index))
        return std::nullopt;
      return traceSize(empty.getDynamicSize(index), depth + 1);
    }
    return std::nullopt;
  }

  LogicalResult typeFields(Type type, json::Object &entry) {
    json::Array shape;
    Type element = type;
    if (auto ranked = dyn_cast<RankedTensorType>(type)) {
      for (int64_t dim : ranked.getShape())
        shape.push_back(ShapedType::isDynamic(dim) ? json::Value(nullptr)
                                                   : json::Value(dim));
      element = ranked.getElementType();
    } else if (isa<ShapedType>(type)) {
      return failure();
    }
    if (!isSpecDtype(element))
      return failure();
    entry["shape"] = std::move(shape);
    entry["dtype"] = printToString(element);
    return success();
  }


  FailureOr<json::Object> genericRecord(linalg::LinalgOp op, std::string &why) {
    if (!op.hasPureTensorSemantics()) {
      why = "'" + op->getName().getStringRef().str() + "' works on buffers, not tensors";
      return failure();
    }
    Block *block = op.getBlock();
    if (!block) {
      why = "'" + op->getName().getStringRef().str() + "' has no body";
      return failure();
    }
    json::Array operands;
    SmallVector<Value> ordered;
    for (OpOperand *input : op.getDpsInputOperands())
      ordered.push_back(input->get());
    for (OpOperand &init : op.getDpsInitsMutable())
      ordered.push_back(init.get());
    if (ordered.size() != op->getNumOperands()) {
      why = "'" + op->getName().getStringRef().str() + "' has operands besides inputs and inits";
      return failure();
    }
    if (failed(operandNames(op, ordered, operands, why)))
      return failure();
    json::Array maps;
    for (AffineMap map : op.getIndexingMapsArray())
      maps.push_back(affineMapJson(map));
    json::Array iterators;
    for (utils::IteratorType type : op.getIteratorTypesArray())
      iterators.push_back(type == utils::IteratorType::parallel ? "parallel"
                                                                : "reduction");
    FailureOr<json::Object> body = bodyJson(op, *block, why);
    if (failed(body))
      return failure();
    json::Array results;
    if (failed(defineResults(op, results, why)))
      return failure();
    json::Object record{
        {"op", "generic"},
        {"name", op->getName().getStringRef()},
        {"operands", std::move(operands)},
        {"num_inputs", static_cast<int64_t>(op.getNumDpsInputs())},
        {"results", std::move(results)},
        {"iterator_types", std::move(iterators)},
        {"indexing_maps", std::move(maps)},
        {"body", std::move(*body)},
        {"kind", stringifyLinalgOpKind(FusionCandidateAnalysis::getKind(op))},
        {"label", FusionCandidateAnalysis::getLabel(op)},
    };
    return record;
  }

  FailureOr<json::Object> bodyJson(linalg::LinalgOp op, Block &block,
                                   std::string &why) {
    DenseMap<Value, std::string> local;
    json::Array args, stmts, yields;
    for (BlockArgument arg : block.getArguments()) {
      std::string name = "a" + std::to_string(arg.getArgNumber());
      local[arg] = name;
      args.push_back(name);
    }
    unsigned nextStmt = 0, nextConst = 0;
    // A captured scalar constant becomes a constant statement of the body.
    auto nameOperand = [&](Value value) -> std::optional<std::string> {
      auto it = local.find(value);
      if (it != local.end())
        return it->second;
      Attribute attr;
      if (!matchPattern(value, m_Constant(&attr)))
        return std::nullopt;
      std::optional<json::Value> number = scalarJson(attr);
      if (!number)
        return std::nullopt;
      std::string id = "c" + std::to_string(nextConst++);
      stmts.push_back(json::Object{{"id", id},
                                   {"op", "arith.constant"},
                                   {"operands", json::Array()},
                                   {"type", printToString(value.getType())},
                                   {"value", std::move(*number)}});
      local[value] = id;
      return id;
    };
    for (Operation &inner : block) {
      if (auto yield = dyn_cast<linalg::YieldOp>(inner)) {
        for (Value value : yield.getOperands()) {
          std::optional<std::string> name = nameOperand(value);
          if (!name) {
            why = "the body of '" + op->getName().getStringRef().str() +
                  "' yields a value defined outside it";
            return failure();
          }
          yields.push_back(*name);
        }
        continue;
      }
      // Runtime checks (torch-mlir emits cf.assert) have no result and no meaning here.
      if (inner.getName().getStringRef() == "cf.assert")
        continue;
      if (inner.getNumResults() != 1 || inner.getNumRegions() != 0) {
        why = "the body of '" + op->getName().getStringRef().str() + "' holds '" +
              inner.getName().getStringRef().str() +
              "', which is not a scalar statement of the spec";
        return failure();
      }
      json::Object stmt;
      json::Array operands;
      for (Value operand : inner.getOperands()) {
        std::optional<std::string> name = nameOperand(operand);
        if (!name) {
          why = "'" + inner.getName().getStringRef().str() + "' in the body of '" +
                op->getName().getStringRef().str() +
                "' reads a value from outside the body that is not a scalar constant";
          return failure();
        }
        operands.push_back(*name);
      }
      std::string id = "t" + std::to_string(nextStmt++);
      stmt["id"] = id;
      stmt["op"] = inner.getName().getStringRef();
      stmt["operands"] = std::move(operands);
      stmt["type"] = printToString(inner.getResult(0).getType());
      if (auto constant = dyn_cast<arith::ConstantOp>(inner)) {
        std::optional<json::Value> number = scalarJson(constant.getValue());
        if (!number) {
          why = "a constant in the body of '" + op->getName().getStringRef().str() +
                "' is not a scalar";
          return failure();
        }
        stmt["value"] = std::move(*number);
      } else if (auto cmpf = dyn_cast<arith::CmpFOp>(inner)) {
        stmt["predicate"] = arith::stringifyCmpFPredicate(cmpf.getPredicate());
      } else if (auto cmpi = dyn_cast<arith::CmpIOp>(inner)) {
        stmt["predicate"] = arith::stringifyCmpIPredicate(cmpi.getPredicate());
      } else if (auto index = dyn_cast<linalg::IndexOp>(inner)) {
        stmt["dim"] = static_cast<int64_t>(index.getDim());
      }
      local[inner.getResult(0)] = id;
      stmts.push_back(std::move(stmt));
    }
    return json::Object{{"args", std::move(args)},
                        {"stmts", std::move(stmts)},
                        {"yields", std::move(yields)}};
  }

  FailureOr<json::Object> reshapeRecord(Operation *op, std::string &why) {
    SmallVector<ReassociationIndices> reassociation;
    if (auto expand = dyn_cast<tensor::ExpandShapeOp>(op))
      reassociation = expand.getReassociationIndices();
    else
      reassociation = cast<tensor::CollapseShapeOp>(op).getReassociationIndices();
    json::Array groups;
    for (const ReassociationIndices &group : reassociation) {
      json::Array dims;
      for (int64_t dim : group)
        dims.push_back(dim);
      groups.push_back(std::move(dims));
    }
    json::Array operands, results;
    if (failed(operandNames(op, op->getOperand(0), operands, why)) ||
        failed(defineResults(op, results, why)))
      return failure();
    return json::Object{{"op", "reshape"},
                        {"name", op->getName().getStringRef()},
                        {"operands", std::move(operands)},
                        {"results", std::move(results)},
                        {"reassociation", std::move(groups)}};
  }

  FailureOr<json::Object> padRecord(tensor::PadOp pad, std::string &why) {
    if (!FusionCandidateAnalysis::isSupportedPad(pad)) {
      why = "a 'tensor.pad' with dynamic amounts or a computed padding value";
      return failure();
    }
    Attribute padding;
    (void)matchPattern(pad.getConstantPaddingValue(), m_Constant(&padding));
    std::optional<json::Value> value = scalarJson(padding);
    if (!value) {
      why = "a 'tensor.pad' whose padding value is not a scalar number";
      return failure();
    }
    json::Array low, high, operands, results;
    for (int64_t amount : pad.getStaticLow())
      low.push_back(amount);
    for (int64_t amount : pad.getStaticHigh())
      high.push_back(amount);
    if (failed(operandNames(pad, pad.getSource(), operands, why)) ||
        failed(defineResults(pad, results, why)))
      return failure();
    return json::Object{{"op", "pad"},
                        {"name", "tensor.pad"},
                        {"operands", std::move(operands)},
                        {"results", std::move(results)},
                        {"low", std::move(low)},
                        {"high", std::move(high)},
                        {"value", std::move(*value)}};
  }

  FailureOr<json::Object> emptyRecord(tensor::EmptyOp empty, std::string &why) {
    json::Array sizesFrom;
    for (Value size : empty.getDynamicSizes()) {
      auto traced = traceSize(size);
      if (!traced) {
        why = "cannot tell which argument dimension gives a dynamic size of "
              "'tensor.empty'";
        return failure();
      }
      sizesFrom.push_back(json::Array{traced->first, traced->second});
    }
    json::Array results;
    if (failed(defineResults(empty, results, why)))
      return failure();
    json::Object record{{"op", "empty"},
                        {"name", "tensor.empty"},
                        {"operands", json::Array()},
                        {"results", std::move(results)}};
    if (!sizesFrom.empty())
      record["dynamic_sizes_from"] = std::move(sizesFrom);
    return record;
  }

  FailureOr<json::Object> constantRecord(arith::ConstantOp constant,
                                         std::string &why) {
    json::Object record{{"op", "constant"},
                        {"name", "arith.constant"},
                        {"operands", json::Array()}};
    Attribute value = constant.getValue();
    auto shaped = dyn_cast<ShapedType>(constant.getType());
    if (shaped && shaped.hasStaticShape() && shaped.getNumElements() == 0) {
      // an empty tensor (a cache before its first entry), whatever its attribute holds
      record["data"] = json::Array();
    } else if (std::optional<json::Value> number = scalarJson(value)) {
      record["splat"] = std::move(*number);
    } else if (auto dense = dyn_cast<DenseElementsAttr>(value)) {
      Type element = dense.getElementType();
      if (dense.isSplat()) {
        record["splat"] = isa<FloatType>(element)
                              ? floatJson(dense.getSplatValue<APFloat>())
                              : intJson(dense.getSplatValue<APInt>(), element);
      } else if (dense.getNumElements() <= 4096) {
        json::Array data;
        if (isa<FloatType>(element)) {
          for (const APFloat &x : dense.getValues<APFloat>())
            data.push_back(floatJson(x));
        } else if (element.isIntOrIndex()) {
          for (const APInt &x : dense.getValues<APInt>())
            data.push_back(intJson(x, element));
        } else {
          why = "a constant of element type " + printToString(element);
          return failure();
        }
        record["data"] = std::move(data);
      } else {
        why = "a dense constant of more than 4096 elements";
        return failure();
      }
    } else {
      why = "a constant stored as a resource blob (weights belong in function "
            "arguments)";
      return failure();
    }
    json::Array results;
    if (failed(defineResults(constant, results, why)))
      return failure();
    record["results"] = std::move(results);
    return record;
  }

  func::FuncOp func;
  DenseMap<Value, std::string> names;
  json::Array values;
  json::Array pending;
};

} // namespace

static json::Value stringArray(ArrayAttr attr) {
  json::Array out;
  if (attr)
    for (Attribute element : attr)
      if (auto str = dyn_cast<StringAttr>(element))
        out.push_back(str.getValue());
  return out;
}

FailureOr<json::Object> mlir::kforge::buildKernelSpec(func::FuncOp region) {
  auto hash = region->getAttrOfType<StringAttr>("kforge.hash");
  if (!hash)
    return region.emitError("not an outlined region: no kforge.hash attribute");
  if (!region.getBody().hasOneBlock())
    return region.emitError("an outlined region must have exactly one block");
  RecordWriter writer(region);
  json::Array args;
  if (failed(writer.defineArguments(args)))
    return failure();
  json::Array ops, results;
  for (Operation &op : region.getBody().front()) {
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      json::Array names;
      std::string why;
      if (failed(writer.operandNames(ret, ret.getOperands(), names, why)))
        return ret.emitError("kforge-export-regions: region @")
               << region.getSymName() << " cannot be exported: " << why;
      for (json::Value &constant : writer.takePending())
        ops.push_back(std::move(constant));
      for (Value value : ret.getOperands()) {
        std::optional<std::string> name = writer.nameOf(value);
        if (!name)
          return ret.emitError("kforge-export-regions: a returned value has no name in "
                               "the kernel spec");
        results.push_back(*name);
      }
      continue;
    }
    if (RecordWriter::isSizeComputation(&op) || RecordWriter::isDeferred(&op))
      continue;
    std::string why;
    FailureOr<json::Object> record = writer.record(&op, why);
    if (failed(record))
      return op.emitError("kforge-export-regions: region @")
             << region.getSymName() << " cannot be exported: " << why;
    for (json::Value &constant : writer.takePending())
      ops.push_back(std::move(constant));
    ops.push_back(std::move(*record));
  }
  auto intAttr = [&](StringRef name) -> int64_t {
    if (auto attr = region->getAttrOfType<IntegerAttr>(name))
      return attr.getInt();
    return 0;
  };
  auto rootKind = region->getAttrOfType<StringAttr>("kforge.root_kind");
  return json::Object{
      {"schema", "kforge.kernel-spec"},
      {"version", kSpecVersion},
      {"hash", hash.getValue()},
      {"name", region.getSymName()},
      {"root_kind", rootKind ? rootKind.getValue() : StringRef("elementwise")},
      {"fused", stringArray(region->getAttrOfType<ArrayAttr>("kforge.fused"))},
      {"flops", intAttr("kforge.flops")},
      {"min_bytes", intAttr("kforge.min_bytes")},
      {"args", std::move(args)},
      {"values", writer.takeValues()},
      {"ops", std::move(ops)},
      {"results", std::move(results)},
  };
}

// ---------------------------------------------------------------------------------------------
// Provenance: the frontend names each op's location after the FX node it came from,
// `loc("fx:<node>"(...))` (kforge.frontend.importer). A region call step records the nodes of
// its region and the node behind each operand and result, so that a region without a kernel can
// run the model's own aten ops (kforge.aten_regions). Locations fused by CSE keep their first.
// ---------------------------------------------------------------------------------------------
std::optional<std::string> mlir::kforge::fxNodeOf(Location loc) {
  std::optional<std::string> found;
  loc->walk([&](Location inner) {
    if (auto name = dyn_cast<NameLoc>(inner)) {
      StringRef text = name.getName().getValue();
      if (text.consume_front("fx:")) {
        found = text.str();
        return WalkResult::interrupt();
      }
    }
    return WalkResult::advance();
  });
  return found;
}

/// The FX node whose value `value` is: a region call's result as OutlineRegions recorded it
/// for that call site (`kforge.origin`: an equal region's body has another site's locations),
/// else its defining op's node.
static json::Value fxOriginOf(Value value) {
  Operation *def = value.getDefiningOp();
  if (!def)
    return nullptr;                 // a function argument: the plan names it argN
  if (auto origin = def->getAttrOfType<DictionaryAttr>("kforge.origin")) {
    auto results = origin.getAs<ArrayAttr>("results");
    unsigned index = cast<OpResult>(value).getResultNumber();
    auto node = results && index < results.size() ? dyn_cast<StringAttr>(results[index])
                                                  : StringAttr();
    if (node && !node.getValue().empty())
      return node.getValue();
    return nullptr;
  }
  if (std::optional<std::string> node = fxNodeOf(def->getLoc()))
    return *node;
  return nullptr;
}

static json::Object regionCallOrigin(func::CallOp call) {
  json::Array nodes, operands, results;
  if (auto origin = call->getAttrOfType<DictionaryAttr>("kforge.origin"))
    if (auto names = origin.getAs<ArrayAttr>("nodes"))
      for (Attribute name : names)
        if (auto text = dyn_cast<StringAttr>(name))
          nodes.push_back(text.getValue());
  for (Value operand : call.getOperands())
    operands.push_back(fxOriginOf(operand));
  for (Value result : call.getResults())
    results.push_back(fxOriginOf(result));
  return json::Object{{"nodes", std::move(nodes)},
                      {"operands", std::move(operands)},
                      {"results", std::move(results)}};
}

FailureOr<json::Object> mlir::kforge::buildHostPlan(func::FuncOp func) {
  RecordWriter writer(func);
  json::Array inputs;
  if (failed(writer.defineArguments(inputs)))
    return failure();
  ModuleOp module = func->getParentOfType<ModuleOp>();
  json::Array steps, outputs;
  constexpr unsigned kMaxOpaqueWarnings = 5;
  unsigned opaqueSteps = 0;
  // Names a call's operands; the constant records they need become steps before it.
  auto nameOperands = [&](Operation *call, json::Array &operands, std::string &why) {
    bool named = succeeded(writer.operandNames(call, call->getOperands(), operands, why));
    for (json::Value &constant : writer.takePending())
      steps.push_back(std::move(constant));
    return success(named);
  };
  for (Operation &op : func.getBody().front()) {
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      json::Array names;
      std::string why;
      (void)writer.operandNames(ret, ret.getOperands(), names, why);
      for (json::Value &constant : writer.takePending())
        steps.push_back(std::move(constant));
      for (Value value : ret.getOperands()) {
        std::optional<std::string> name = writer.nameOf(value);
        if (!name)
          return ret.emitError("kforge-export-regions: a returned value of @")
                 << func.getSymName() << " has no name in the host plan";
        outputs.push_back(*name);
      }
      continue;
    }
    if (RecordWriter::isSizeComputation(&op) || RecordWriter::isDeferred(&op))
      continue;
    // A linked module: a custom call of a verified kernel (kforge-link-kernels).
    if (auto custom = dyn_cast<CustomCallOp>(op)) {
      auto kernel = module ? module.lookupSymbol<KernelOp>(custom.getCallee()) : KernelOp();
      if (kernel) {
        json::Array operands, results;
        std::string why;
        if (failed(nameOperands(custom, operands, why)) ||
            failed(writer.defineResults(custom, results, why)))
          return custom.emitError("kforge-export-regions: a kernel call cannot be described "
                                  "in the host plan: ")
                 << why;
        steps.push_back(json::Object{{"kernel", kernel.getRegionHash()},
                                     {"symbol", kernel.getSymName()},
                                     {"target", kernel.getTarget()},
                                     {"operands", std::move(operands)},
                                     {"results", std::move(results)}});
        continue;
      }
    }
    if (auto call = dyn_cast<func::CallOp>(op)) {
      auto callee = module ? module.lookupSymbol<func::FuncOp>(call.getCallee())
                           : func::FuncOp();
      auto hash = callee ? callee->getAttrOfType<StringAttr>("kforge.hash")
                         : StringAttr();
      if (hash) {
        json::Array operands, results;
        std::string why;
        if (succeeded(nameOperands(call, operands, why))) {
          if (failed(writer.defineResults(call, results, why)))
            return call.emitError("kforge-export-regions: a region call cannot be described "
                                  "in the host plan: ")
                   << why;
          json::Object step{{"call", hash.getValue()},
                            {"operands", std::move(operands)},
                            {"results", std::move(results)}};
          if (call->hasAttr("kforge.origin"))
            step["origin"] = regionCallOrigin(call);
          steps.push_back(std::move(step));
          continue;
        }
      }
      // A fallback op (docs/fallback-ops.md): a call of an external declaration that carries
      // the aten op's name and its argument list; the runtime executes it with PyTorch.
      auto aten = callee ? callee->getAttrOfType<StringAttr>("kforge.fallback") : StringAttr();
      if (aten) {
        auto argsText = callee->getAttrOfType<StringAttr>("kforge.args");
        llvm::Expected<json::Value> args = json::parse(argsText ? argsText.getValue() : "[]");
        if (!args) {
          std::string message = llvm::toString(args.takeError());
          return callee.emitError("kforge-export-regions: kforge.args is not valid JSON: ")
                 << message;
        }
        json::Array operands, results;
        std::string why;
        if (failed(nameOperands(call, operands, why)) ||
            failed(writer.defineResults(call, results, why)))
          return call.emitError("kforge-export-regions: fallback op ")
                 << aten.getValue() << " cannot be described in the host plan: " << why;
        steps.push_back(json::Object{{"op", "fallback"},
                                     {"name", aten.getValue()},
                                     {"symbol", call.getCallee().str()},
                                     {"args", std::move(*args)},
                                     {"operands", std::move(operands)},
                                     {"results", std::move(results)}});
        continue;
      }
    }
    std::string why;
    FailureOr<json::Object> record = writer.record(&op, why);
    for (json::Value &constant : writer.takePending())
      steps.push_back(std::move(constant));
    if (succeeded(record)) {
      steps.push_back(std::move(*record));
      continue;
    }
    // Not describable: keep its text so a reader can say what it is. A few warnings name
    // the first such ops; one more counts the rest.
    if (++opaqueSteps <= kMaxOpaqueWarnings)
      op.emitWarning("kforge-export-regions: this op stays outside every region and the "
                     "host plan cannot describe it (")
          << why << "); it is written as an 'opaque' step";
    json::Array operands, results;
    for (Value operand : op.getOperands())
      if (std::optional<std::string> name = writer.nameOf(operand))
        operands.push_back(*name);
    for (Value result : op.getResults())
      if (succeeded(writer.define(result)))
        results.push_back(*writer.nameOf(result));
    steps.push_back(json::Object{{"op", "opaque"},
                                 {"name", op.getName().getStringRef()},
                                 {"operands", std::move(operands)},
                                 {"results", std::move(results)},
                                 {"mlir", printToString(&op)}});
  }
  if (opaqueSteps > kMaxOpaqueWarnings)
    func.emitWarning("kforge-export-regions: ")
        << (opaqueSteps - kMaxOpaqueWarnings) << " more ops of @" << func.getSymName()
        << " are 'opaque' steps of the host plan";
  return json::Object{
      {"schema", "kforge.host-plan"}, {"version", kSpecVersion},
      {"function", func.getSymName()}, {"inputs", std::move(inputs)},
      {"values", writer.takeValues()}, {"steps", std::move(steps)},
      {"outputs", std::move(outputs)},
  };
}
