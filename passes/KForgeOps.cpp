//===- KForgeOps.cpp - kforge dialect operations --------------------------===//

#include "KForge/KForgeOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::kforge;

//===----------------------------------------------------------------------===//
// FusionRegionOp
//===----------------------------------------------------------------------===//

bool FusionRegionOp::isValidRootKind(StringRef kind) {
  return kind == "contraction" || kind == "convolution" || kind == "reduction" ||
         kind == "elementwise";
}

void FusionRegionOp::build(OpBuilder &builder, OperationState &state,
                           TypeRange resultTypes, ValueRange inputs,
                           StringRef rootKind) {
  state.addOperands(inputs);
  state.addTypes(resultTypes);
  state.addAttribute(getRootKindAttrName(state.name),
                     builder.getStringAttr(rootKind));
  Region *body = state.addRegion();
  Block *block = new Block();
  body->push_back(block);
  for (Value input : inputs)
    block->addArgument(input.getType(), input.getLoc());
}

// %r = kforge.fusion_region "kind" (%a = %x, %b = %y) : (tx, ty) -> tr
//        attributes {...} { ... kforge.yield %v : tr }
ParseResult FusionRegionOp::parse(OpAsmParser &parser, OperationState &result) {
  StringAttr rootKind;
  if (parser.parseAttribute(rootKind, getRootKindAttrName(result.name),
                            result.attributes))
    return failure();

  SmallVector<OpAsmParser::Argument> args;
  SmallVector<OpAsmParser::UnresolvedOperand> operands;
  if (parser.parseLParen())
    return failure();
  if (failed(parser.parseOptionalRParen())) {
    do {
      OpAsmParser::Argument arg;
      OpAsmParser::UnresolvedOperand operand;
      if (parser.parseArgument(arg) || parser.parseEqual() ||
          parser.parseOperand(operand))
        return failure();
      args.push_back(arg);
      operands.push_back(operand);
    } while (succeeded(parser.parseOptionalComma()));
    if (parser.parseRParen())
      return failure();
  }

  FunctionType type;
  llvm::SMLoc typeLoc = parser.getCurrentLocation();
  if (parser.parseColon() || parser.parseType(type))
    return failure();
  if (type.getNumInputs() != operands.size())
    return parser.emitError(typeLoc)
           << "expected " << operands.size() << " input types, got "
           << type.getNumInputs();
  for (auto [arg, argType] : llvm::zip(args, type.getInputs()))
    arg.type = argType;
  if (parser.resolveOperands(operands, type.getInputs(), typeLoc,
                             result.operands))
    return failure();
  result.addTypes(type.getResults());

  if (parser.parseOptionalAttrDictWithKeyword(result.attributes))
    return failure();

  Region *body = result.addRegion();
  if (parser.parseRegion(*body, args, /*enableNameShadowing=*/false))
    return failure();
  if (body->empty()) {
    Block *block = new Block();
    body->push_back(block);
    for (auto &arg : args)
      block->addArgument(arg.type, result.location);
  }
  FusionRegionOp::ensureTerminator(*body, parser.getBuilder(), result.location);
  return success();
}

void FusionRegionOp::print(OpAsmPrinter &p) {
  p << " ";
  p.printAttribute(getRootKindAttr());
  p << " (";
  llvm::interleaveComma(
      llvm::zip(getBodyBlock().getArguments(), getInputs()), p, [&](auto pair) {
        p << std::get<0>(pair) << " = " << std::get<1>(pair);
      });
  p << ") : ";
  p << FunctionType::get(getContext(), getInputs().getTypes(),
                         getResultTypes());
  p.printOptionalAttrDictWithKeyword((*this)->getAttrs(),
                                     {getRootKindAttrName()});
  p << " ";
  p.printRegion(getBody(), /*printEntryBlockArgs=*/false,
                /*printBlockTerminators=*/true);
}

LogicalResult FusionRegionOp::verify() {
  if (!isValidRootKind(getRootKind()))
    return emitOpError("root kind must be one of contraction, convolution, "
                       "reduction, elementwise; got '")
           << getRootKind() << "'";
  Block &block = getBodyBlock();
  if (block.getNumArguments() != getInputs().size())
    return emitOpError("body has ")
           << block.getNumArguments() << " arguments but the region has "
           << getInputs().size() << " inputs";
  for (auto [i, pair] :
       llvm::enumerate(llvm::zip(block.getArgumentTypes(), getInputs()))) {
    auto [argType, input] = pair;
    if (argType != input.getType())
      return emitOpError("body argument #")
             << i << " has type " << argType << " but input #" << i
             << " has type " << input.getType();
  }
  auto yield = dyn_cast<YieldOp>(block.getTerminator());
  if (!yield)
    return emitOpError("body must end with kforge.yield");
  if (!llvm::equal(yield.getValues().getTypes(), getResultTypes()))
    return yield.emitOpError("yields types (")
           << yield.getValues().getTypes()
           << ") that do not match the region's result types ("
           << getResultTypes() << ")";
  return success();
}

//===----------------------------------------------------------------------===//
// KernelOp
//===----------------------------------------------------------------------===//

static constexpr llvm::StringLiteral kTargetBackends[] = {"cuda", "xpu", "cpu"};

ArrayRef<llvm::StringLiteral> KernelOp::targetBackends() { return kTargetBackends; }

std::string KernelOp::targetBackendsText() {
  return llvm::join(llvm::map_range(kTargetBackends,
                                    [](llvm::StringLiteral s) { return s.str(); }),
                    ", ");
}

StringRef KernelOp::targetBackend(StringRef target) { return target.split(':').first; }

bool KernelOp::isValidTarget(StringRef target) {
  auto [backend, arch] = target.split(':');
  if (!llvm::is_contained(kTargetBackends, backend))
    return false;
  if (!target.contains(':'))
    return true;
  return !arch.empty() && llvm::all_of(arch, [](char c) {
    return llvm::isAlnum(c) || c == '_';
  });
}

static bool isRegionHash(StringRef hash) {
  return hash.size() == 16 && llvm::all_of(hash, [](char c) {
           return llvm::isDigit(c) || (c >= 'a' && c <= 'f');
         });
}

LogicalResult KernelOp::verify() {
  if (!isValidTarget(getTarget()))
    return emitOpError("target must be BACKEND or BACKEND:ARCH with BACKEND one of ")
           << targetBackendsText() << "; got '" << getTarget() << "'";
  if (!isRegionHash(getRegionHash()))
    return emitOpError("region hash must be 16 lowercase hex digits; got '")
           << getRegionHash() << "'";
  auto status = getVerification().getAs<StringAttr>("status");
  if (!status)
    return emitOpError("verification record needs a string 'status'");
  if (status.getValue() != "verified")
    return emitOpError("only verified kernels may be declared; status is '")
           << status.getValue() << "'";
  return success();
}

//===----------------------------------------------------------------------===//
// CustomCallOp
//===----------------------------------------------------------------------===//

LogicalResult
CustomCallOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  Operation *symbol =
      symbolTable.lookupNearestSymbolFrom(*this, getCalleeAttr());
  auto kernel = dyn_cast_or_null<KernelOp>(symbol);
  if (!kernel)
    return emitOpError("'")
           << getCalleeAttr() << "' does not reference a kforge.kernel";
  FunctionType type = kernel.getFunctionType();
  if (!llvm::equal(type.getInputs(), getOperands().getTypes()))
    return emitOpError("operand types (")
           << getOperands().getTypes() << ") do not match kernel "
           << getCalleeAttr() << " inputs (" << type.getInputs() << ")";
  if (!llvm::equal(type.getResults(), getResultTypes()))
    return emitOpError("result types (")
           << getResultTypes() << ") do not match kernel " << getCalleeAttr()
           << " results (" << type.getResults() << ")";
  return success();
}

#define GET_OP_CLASSES
#include "KForge/KForgeOps.cpp.inc"
