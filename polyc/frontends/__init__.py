"""Front ends: other frameworks' graph formats turned into polyc `Graph`s.

Each front end is one module that reads its format, maps the ops onto polyc's (with
the source framework's semantics) and hands the result to `graph.load`, so every graph
it makes passes the same validation as the JSON format of DESIGN.md. `import_onnx`
(`onnx.py`) loads the onnx package only when called.
"""
from .akg import import_akg

__all__ = ["import_akg"]
