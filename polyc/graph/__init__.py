"""The graph layer: IR, loading and validation, decomposition, simplification, fusion,
and the numpy reference executor."""
from .builder import GraphBuilder
from .ir import Graph, Node, Tensor, TensorType
from .load import Limits, load_graph

__all__ = ["Graph", "GraphBuilder", "Limits", "Node", "Tensor", "TensorType", "load_graph"]
