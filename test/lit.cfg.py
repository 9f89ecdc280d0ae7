# lit configuration for the KForge C++ half (kforge-opt, its passes, the mlir-opt plugin).
import os
import shutil

import lit.formats

config.name = "KForge"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.kforge_obj_root, "test")
# Python tests run under pytest; Inputs/ holds files that other tests read.
config.excludes = ["python", "Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py",
                   "Output"]

path = [config.kforge_tools_dir, config.llvm_tools_dir, config.mlir_tools_dir]
config.environment["PATH"] = os.pathsep.join(path + [config.environment.get("PATH", os.environ.get("PATH", ""))])

plugin = os.path.join(config.kforge_libs_dir, "KForgePlugin" + config.shlib_ext)
config.substitutions.append(("%kforge_plugin", plugin))
config.substitutions.append(("%python", config.python_executable))
config.substitutions.append(("%inputs", os.path.join(config.test_source_root, "Inputs")))

# Optional checks, run when the Python they need is there.
import subprocess


def python_has(code, env=None):
    try:
        return subprocess.run([config.python_executable, "-c", code], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


if python_has("import jsonschema"):
    config.available_features.add("jsonschema")
# The Python half's reader of the kernel spec (python/kforge/spec.py), to prove that what
# kforge-opt writes is what Python reads.
kforge_python = os.path.join(config.kforge_src_root, "python")
if python_has("import kforge.spec", env=dict(os.environ, PYTHONPATH=kforge_python)):
    config.available_features.add("kforge-python")
    config.substitutions.append(("%kforge_pythonpath", kforge_python))
config.substitutions.append(("%schema", os.path.join(config.kforge_src_root, "docs",
                                                     "kernel-spec.schema.json")))
