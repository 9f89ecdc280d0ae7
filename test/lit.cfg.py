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

try:
    import jsonschema  # noqa: F401
    config.available_features.add("jsonschema")
except ImportError:
    pass
