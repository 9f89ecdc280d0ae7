"""KForge: MLIR fusion regions turned into verified Triton kernels.

`kforge.compile(model, example_inputs, target=..., provider=..., precision=...)` and
`kforge.load(PKG, module=None)` are loaded on first use, so `import kforge` stays light.
"""
__version__ = "0.1.0"

__all__ = ["compile", "load", "__version__"]


def __getattr__(name):
    if name in ("compile", "load"):
        from kforge import api
        return getattr(api, name)
    raise AttributeError(f"module 'kforge' has no attribute {name!r}")
