"""KForge: MLIR fusion regions turned into verified Triton kernels."""
__version__ = "0.1.0"
