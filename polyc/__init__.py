"""polyc: a polyhedral operator compiler for tensor subgraphs.

    import polyc
    compiled = polyc.compile(graph, target="cpu")   # a Graph, a dict, JSON text or a path
    graph = polyc.import_akg("kernel.info")          # a MindSpore/AKG composite kernel
    fast = torch.compile(fn, backend=polyc.torch_backend)  # PyTorch code through polyc
    outputs = compiled(x=np.ones(...))               # numpy arrays in and out, by name
"""
from .errors import GraphError, PolycError
from .graph import GraphBuilder, Limits, load_graph
from .version import __version__  # noqa: F401 (re-exported)

__all__ = ["GraphBuilder", "GraphError", "Limits", "Options", "PolycError", "compile",
           "import_akg", "import_onnx", "load_graph", "torch_backend"]

# islpy and cgen load on first use, onnx only when a model is imported, torch only
# when its backend is asked for
_LAZY = {"compile": "compiler", "Options": "compiler", "import_onnx": "frontends.onnx",
         "import_akg": "frontends", "torch_backend": "torch_compile"}


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'polyc' has no attribute {name!r}")
