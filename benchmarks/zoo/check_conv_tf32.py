"""Is a conv model's mismatch on the GPU cuDNN's TF32 (on by default for convolutions in PyTorch)?
Eager against the package's no-kernel route (aten programs op by op), with
torch.backends.cudnn.allow_tf32 on (PyTorch's default) and off.

    KFORGE_ZOO_SIZE=real python benchmarks/zoo/check_conv_tf32.py --packages DIR resnet convnext vit
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="+")
    p.add_argument("--packages", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    os.environ["KFORGE_COMPILE_REFERENCES"] = "0"
    os.environ["KFORGE_CUDA_GRAPHS"] = "0"
    from kforge.runtime import load_package
    from measure_zoo import zoo_model_on_gpu
    rows = []
    for name in args.models:
        model, inputs = zoo_model_on_gpu(name)
        route = load_package(args.packages / name, module=model, target="cuda", tune=False,
                             use_kernels=False)
        row = {"model": name}
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            with torch.no_grad():
                want = model(*inputs).double()
                got = route(*inputs).double()
            rms = float(want.pow(2).mean().sqrt())
            row[f"cudnn_tf32_{tf32}"] = {"max_abs_err": float((got - want).abs().max()),
                                         "output_rms": rms}
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
