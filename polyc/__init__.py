"""polyc: a polyhedral operator compiler for tensor subgraphs."""
from .errors import GraphError, PolycError
from .graph import GraphBuilder, Limits, load_graph

__version__ = "0.1.0"
__all__ = ["GraphBuilder", "GraphError", "Limits", "PolycError", "load_graph"]
