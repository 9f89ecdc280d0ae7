//===- KForgeOps.h - kforge dialect operations ------------------*- C++ -*-===//
#ifndef KFORGE_KFORGEOPS_H
#define KFORGE_KFORGEOPS_H

#include "KForge/KForgeDialect.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "KForge/KForgeOps.h.inc"

#endif // KFORGE_KFORGEOPS_H
