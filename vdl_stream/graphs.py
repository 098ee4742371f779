"""Model graphs: torch modules, ONNX models and Paddle layers as one framework-neutral payload.

``add_graph`` turns a model into a ``graph`` event (docs/protocol.md, "graph events") that the page
draws as a layered, collapsible diagram. The conversion runs once, in the training process, so the
browser never needs a framework:

- **torch** (``torch.nn.Module``): ``torch.fx.symbolic_trace``; with ``input_to_model``, fx's shape
  propagation adds every tensor's shape and dtype. A module fx cannot trace (data-dependent
  control flow) is traced with ``torch.jit.trace`` on ``input_to_model`` instead.
- **ONNX** (``onnx.ModelProto`` or the path of a ``.onnx`` file): the graph's nodes, with shapes
  from ONNX shape inference; initializers count as parameters.
- **Paddle** (``paddle.nn.Layer``): ``paddle.jit.to_static`` with ``input_spec`` gives the static
  program; the layer's own ``forward`` is put back afterwards.

Each framework is imported only when a model of it is given. The payload (see :func:`model_graph`):

``{"framework", "name", "nodes": [node, ...], "edges": [[src, dst, slot], ...]}`` where a node is
``{"name", "op", "scope", "inputs": [tensor], "outputs": [tensor], "params", "attrs"}`` and a
tensor ``{"shape": [int | str | None, ...] | None, "dtype": str | None}``. ``scope`` is the
``/``-separated path of the module holding the op (``"layer1/0"``; ``""`` at the top), which the
page collapses into one box. ``params`` counts the parameter elements the op owns, each parameter
counted at its first user only, so the nodes' sum is the model's total. An edge carries
``nodes[src].outputs[slot]`` into ``nodes[dst]``. Graph inputs and outputs are nodes of op
``"Input"`` and ``"Output"``.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Any

from . import codec, summaries

#: Graphs with more nodes than this are refused (the page lays out every node it is sent).
MAX_GRAPH_NODES = codec.MAX_GRAPH_NODES
#: Attributes kept per node, and the characters kept of each value.
MAX_ATTRS = 16
MAX_ATTR_CHARS = 200
#: The default tag of a graph event.
DEFAULT_TAG = "graph"

_UNKNOWN: dict[str, Any] = {"shape": None, "dtype": None}


def _describe(value: object) -> str:
    return f"{type(value).__name__} {value!r:.60}"


def _tensor(shape: Any, dtype: Any) -> dict[str, Any]:
    """A tensor description: dims as int (or str for a symbolic dim, None for unknown)."""
    dims = None
    if shape is not None:
        dims = []
        for d in shape:
            if isinstance(d, str):
                dims.append(d[:64])
            elif d is None or int(d) < 0:
                dims.append(None)
            else:
                dims.append(int(d))
    name = None if dtype is None else str(dtype).removeprefix("torch.").removeprefix("paddle.")
    return {"shape": dims, "dtype": name}


def _attrs(items: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in list(items.items())[:MAX_ATTRS]:
        text = str(value)
        out[str(key)[: codec.MAX_KEY_LENGTH]] = (
            text if len(text) <= MAX_ATTR_CHARS else text[: MAX_ATTR_CHARS - 1] + "…"
        )
    return out


class _Builder:
    """Collects nodes and edges, giving every node a unique name."""

    def __init__(self, framework: str, name: str) -> None:
        self.framework = framework
        self.name = name
        self.nodes: list[dict[str, Any]] = []
        self.edges: list[list[int]] = []
        self._names: set[str] = set()

    def node(
        self,
        name: str,
        op: str,
        scope: str = "",
        outputs: list[dict[str, Any]] | None = None,
        params: int = 0,
        attrs: dict[str, Any] | None = None,
    ) -> int:
        if len(self.nodes) >= MAX_GRAPH_NODES:
            raise ValueError(f"model graph has more than {MAX_GRAPH_NODES} nodes, the limit")
        unique, k = name or op, 1
        while unique in self._names:
            unique, k = f"{name}_{k}", k + 1
        self._names.add(unique)
        self.nodes.append(
            {
                "name": unique,
                "op": op,
                "scope": scope.strip("/"),
                "inputs": [],
                "outputs": outputs or [dict(_UNKNOWN)],
                "params": int(params),
                "attrs": _attrs(attrs or {}),
            }
        )
        return len(self.nodes) - 1

    def edge(self, src: int, dst: int, slot: int = 0) -> None:
        outputs = self.nodes[src]["outputs"]
        slot = slot if 0 <= slot < len(outputs) else 0
        self.edges.append([src, dst, slot])
        self.nodes[dst]["inputs"].append(outputs[slot])

    def payload(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "name": self.name[:200],
            "nodes": self.nodes,
            "edges": self.edges,
        }


# -- torch ----------------------------------------------------------------------------------------


def _torch_args(torch: Any, input_to_model: Any) -> tuple[Any, ...] | None:
    if input_to_model is None:
        return None
    if isinstance(input_to_model, torch.Tensor):
        return (input_to_model,)
    if isinstance(input_to_model, (tuple, list)) and input_to_model:
        return tuple(input_to_model)
    raise TypeError(
        "input_to_model must be None, a torch.Tensor or a non-empty tuple/list of inputs, "
        f"got {_describe(input_to_model)}"
    )


def _torch_meta(meta: Any) -> list[dict[str, Any]]:
    """The output tensors of an fx node from its ``tensor_meta`` (one, or a tuple of them)."""
    if meta is None:
        return [dict(_UNKNOWN)]
    if hasattr(meta, "shape"):
        return [_tensor(tuple(meta.shape), meta.dtype)]
    if isinstance(meta, (tuple, list)) and meta:
        return [_torch_meta(m)[0] if hasattr(m, "shape") else dict(_UNKNOWN) for m in meta]
    return [dict(_UNKNOWN)]


def _fx_op(node: Any) -> str:
    target = node.target
    if node.op == "call_method":
        return str(target)
    return getattr(target, "__name__", None) or str(target)


def _module_scope(path: str) -> str:
    return path.replace(".", "/")


def torch_graph(model: Any, input_to_model: Any = None, use_strict_trace: bool = True) -> dict:
    """The graph payload of a ``torch.nn.Module`` (see the module doc).

    ``torch.fx.symbolic_trace`` first; with ``input_to_model`` (a tensor or a tuple of inputs)
    shapes are propagated by running the model once in eval mode without gradients (its
    training flag is restored). When fx cannot trace the model, ``torch.jit.trace`` is used on
    ``input_to_model`` (``use_strict_trace`` is its ``strict``).

    Raises:
        TypeError: ``input_to_model`` is not a tensor or a tuple of inputs.
        ValueError: fx cannot trace the model and no ``input_to_model`` was given, or tracing
            failed; the message says why.
    """
    import torch
    import torch.fx

    args = _torch_args(torch, input_to_model)
    try:
        gm = torch.fx.symbolic_trace(model)
    except Exception as exc:
        if args is None:
            raise ValueError(
                f"model could not be traced symbolically by torch.fx ({type(exc).__name__}: "
                f"{exc}); pass input_to_model to trace it with torch.jit.trace instead"
            ) from exc
        return _torch_jit_graph(torch, model, args, use_strict_trace)
    if args is not None:
        from torch.fx.passes.shape_prop import ShapeProp

        with _eval_mode(model), torch.no_grad():
            try:
                ShapeProp(gm).propagate(*args)
            except Exception as exc:
                raise ValueError(
                    f"model failed on input_to_model ({type(exc).__name__}: {exc})"
                ) from exc
    return _fx_payload(gm, type(model).__name__)


class _eval_mode:
    """Run a module in eval mode for a moment: a trace must not move BatchNorm's statistics."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.modes = [(m, m.training) for m in module.modules()]

    def __enter__(self) -> None:
        self.module.eval()

    def __exit__(self, *exc_info: object) -> None:
        for m, training in self.modes:
            m.training = training


def _fx_payload(gm: Any, name: str) -> dict[str, Any]:
    b = _Builder("torch", name)
    index: dict[Any, int] = {}
    attr_params: dict[Any, int] = {}
    counted: set[Any] = set()
    for node in gm.graph.nodes:
        outputs = _torch_meta(node.meta.get("tensor_meta"))
        if node.op == "get_attr":
            # A parameter or buffer read by an op: its elements count at the op that uses it.
            value = _get_attr(gm, node.target)
            attr_params[node] = int(value.numel()) if hasattr(value, "numel") else 0
            continue
        params = _first_use(node.all_input_nodes, attr_params, counted)
        if node.op == "placeholder":
            i = b.node(str(node.target), "Input", "", outputs)
        elif node.op == "output":
            i = b.node("output", "Output", "", outputs)
        elif node.op == "call_module":
            mod = gm.get_submodule(node.target)
            scope = node.target.rpartition(".")[0]
            params += sum(p.numel() for p in mod.parameters())
            extra = mod.extra_repr() if hasattr(mod, "extra_repr") else ""
            i = b.node(
                node.target,
                type(mod).__name__,
                _module_scope(scope),
                outputs,
                params,
                {"module": extra} if extra else None,
            )
        else:
            stack = node.meta.get("nn_module_stack") or {}
            scope = next(reversed(stack)) if stack else ""
            i = b.node(node.name, _fx_op(node), _module_scope(str(scope)), outputs, params)
        index[node] = i
        for arg in node.all_input_nodes:
            if arg in index:
                slot = 0
                if node.op == "call_function" and _fx_op(node) == "getitem" and len(node.args) > 1:
                    slot = node.args[1] if isinstance(node.args[1], int) else 0
                b.edge(index[arg], i, slot)
    return b.payload()


def _first_use(inputs: Any, sizes: dict[Any, int], counted: set[Any]) -> int:
    """The parameters among ``inputs`` not counted yet, now counted (each parameter counts at
    its first user only)."""
    total = 0
    for x in inputs:
        if x in sizes and x not in counted:
            counted.add(x)
            total += sizes[x]
    return total


def _get_attr(gm: Any, target: str) -> Any:
    value = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


_JIT_PASS = frozenset(
    {"prim::ListConstruct", "prim::TupleConstruct", "prim::ListUnpack", "prim::TupleUnpack"}
)
_JIT_SKIP = frozenset({"prim::Constant", "prim::NumToTensor"})


def _jit_tensor(value: Any) -> dict[str, Any]:
    try:
        kind = value.type()
        sizes = kind.sizes()
        dtype = kind.scalarType()
    except Exception:  # not a complete tensor type: shape unknown
        return dict(_UNKNOWN)
    return _tensor(sizes, None if dtype is None else str(dtype).lower())


def _torch_jit_graph(torch: Any, model: Any, args: tuple[Any, ...], strict: bool) -> dict:
    try:
        with _eval_mode(model), torch.no_grad():
            traced = torch.jit.trace(model, args, strict=bool(strict), check_trace=False)
    except Exception as exc:
        raise ValueError(
            f"model could be traced neither by torch.fx nor by torch.jit.trace on "
            f"input_to_model ({type(exc).__name__}: {exc})"
        ) from exc
    graph = traced.inlined_graph
    b = _Builder("torch", type(model).__name__)
    producers: dict[Any, list[tuple[int, int]]] = {}
    objects: dict[Any, Any] = {}
    counted: set[int] = set()
    inputs = list(graph.inputs())
    if inputs:
        objects[inputs[0]] = model  # self
    for value in inputs[1:]:
        i = b.node(value.debugName().split(".")[0], "Input", "", [_jit_tensor(value)])
        producers[value] = [(i, 0)]
    for node in graph.nodes():
        kind = node.kind()
        outs = list(node.outputs())
        if kind == "prim::GetAttr":
            parent = objects.get(node.input())
            if parent is not None:
                objects[outs[0]] = getattr(parent, node.s("name"), None)
            continue
        if kind in _JIT_SKIP:
            continue
        if kind in _JIT_PASS:
            feeds = [p for v in node.inputs() for p in producers.get(v, [])]
            for v in outs:
                producers[v] = feeds
            continue
        params = 0
        feeds = []
        for v in node.inputs():
            obj = objects.get(v)
            if isinstance(obj, torch.Tensor):
                if id(obj) not in counted:
                    counted.add(id(obj))
                    params += int(obj.numel())
                continue
            feeds.extend(producers.get(v, []))
        scope = node.scopeName().rpartition("/")[2].removeprefix("__module.")
        op = kind.split("::", 1)[-1]
        i = b.node(
            f"{scope}.{op}" if scope else op,
            op,
            _module_scope(scope),
            [_jit_tensor(v) for v in outs] or [dict(_UNKNOWN)],
            params,
        )
        for src, slot in feeds:
            b.edge(src, i, slot)
        for slot, v in enumerate(outs):
            producers[v] = [(i, slot)]
    for value in graph.outputs():
        i = b.node("output", "Output", "", [_jit_tensor(value)])
        for src, slot in producers.get(value, []):
            b.edge(src, i, slot)
    return b.payload()


# -- ONNX -----------------------------------------------------------------------------------------


def _onnx_dims(type_proto: Any) -> tuple[list[Any] | None, str | None]:
    import onnx

    if not type_proto.HasField("tensor_type"):
        return None, None
    tensor = type_proto.tensor_type
    dtype = onnx.TensorProto.DataType.Name(tensor.elem_type).lower() if tensor.elem_type else None
    if not tensor.HasField("shape"):
        return None, dtype
    dims: list[Any] = []
    for d in tensor.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims, dtype


def onnx_graph(model: Any) -> dict:
    """The graph payload of an ONNX model: an ``onnx.ModelProto`` or the path of a ``.onnx`` file.

    Shapes come from ``onnx.shape_inference`` (where it fails, from the model's own value
    infos). Initializers are parameters; ``Constant`` nodes are folded away.

    Raises:
        ValueError: the file is not a readable ONNX model (named in the message).
        OSError: the file cannot be opened.
    """
    import onnx

    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            model = onnx.load(path)
        except OSError:
            raise
        except Exception as exc:
            raise ValueError(f"model {path!r} is not an ONNX file ({exc})") from exc
    # A model shape inference cannot follow is still drawn, with the shapes it declares.
    with contextlib.suppress(Exception):
        model = onnx.shape_inference.infer_shapes(model)
    g = model.graph
    sizes = {t.name: math.prod(t.dims) for t in g.initializer}
    infos: dict[str, dict[str, Any]] = {}
    for vi in [*g.input, *g.output, *g.value_info]:
        infos[vi.name] = _tensor(*_onnx_dims(vi.type))
    for t in g.initializer:
        infos.setdefault(
            t.name, _tensor(t.dims, onnx.TensorProto.DataType.Name(t.data_type).lower())
        )
    b = _Builder("onnx", g.name or "model")
    producers: dict[str, tuple[int, int]] = {}
    for vi in g.input:
        if vi.name in sizes:
            continue
        producers[vi.name] = (b.node(vi.name, "Input", "", [infos[vi.name]]), 0)
    counted: set[str] = set()
    for k, n in enumerate(g.node):
        if n.op_type == "Constant":
            continue
        params = _first_use(n.input, sizes, counted)
        op = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        name = n.name or f"{op}_{k}"
        scope = name.strip("/").rpartition("/")[0] if "/" in name.strip("/") else ""
        attrs = {
            a.name: onnx.helper.get_attribute_value(a) for a in n.attribute if a.type != a.GRAPH
        }
        outputs = [infos.get(o, dict(_UNKNOWN)) for o in n.output]
        i = b.node(name, op, scope, outputs, params, attrs)
        for name_in in n.input:
            if name_in in producers:
                src, slot = producers[name_in]
                b.edge(src, i, slot)
        for slot, o in enumerate(n.output):
            producers[o] = (i, slot)
    for vi in g.output:
        i = b.node(vi.name, "Output", "", [infos.get(vi.name, dict(_UNKNOWN))])
        if vi.name in producers:
            src, slot = producers[vi.name]
            b.edge(src, i, slot)
    return b.payload()


# -- Paddle ---------------------------------------------------------------------------------------

#: Static-program ops that hold constants: folded away, like ONNX ``Constant``.
_PADDLE_SKIP = frozenset({"pd_op.full_int_array", "pd_op.full", "builtin.combine", "builtin.split"})


def _paddle_specs(paddle: Any, input_spec: Any) -> list[Any]:
    if input_spec is None:
        raise ValueError(
            "input_spec is required for a paddle.nn.Layer: a list of paddle.static.InputSpec "
            "or of example tensors"
        )
    specs = input_spec if isinstance(input_spec, (list, tuple)) else [input_spec]
    out = []
    for k, spec in enumerate(specs):
        if isinstance(spec, paddle.static.InputSpec):
            out.append(spec)
        elif isinstance(spec, paddle.Tensor):
            out.append(paddle.static.InputSpec.from_tensor(spec, name=f"input_{k}"))
        else:
            raise TypeError(
                "input_spec must be a list of paddle.static.InputSpec or paddle.Tensor, "
                f"got {_describe(spec)} at index {k}"
            )
    if not out:
        raise ValueError("input_spec must not be empty")
    return out


def paddle_graph(model: Any, input_spec: Any) -> dict:
    """The graph payload of a ``paddle.nn.Layer`` from its static program.

    ``input_spec``: a list of ``paddle.static.InputSpec`` (or example tensors), as VisualDL's
    ``add_graph`` takes. The layer is converted with ``paddle.jit.to_static`` and its own
    ``forward`` is put back, so it keeps running in dynamic mode. Scopes are the layers' struct
    names (``Sequential/BottleneckBlock_1/Conv2D``).

    Raises:
        TypeError, ValueError: a bad ``input_spec``, or a layer to_static cannot convert.
    """
    import paddle

    specs = _paddle_specs(paddle, input_spec)
    had = "forward" in model.__dict__
    before = model.__dict__.get("forward")
    try:
        static = paddle.jit.to_static(model, input_spec=specs, full_graph=True)
        program = static.forward.concrete_program
    except Exception as exc:
        raise ValueError(
            f"model could not be converted by paddle.jit.to_static ({type(exc).__name__}: {exc})"
        ) from exc
    finally:
        if had:
            model.__dict__["forward"] = before
        else:
            model.__dict__.pop("forward", None)
    b = _Builder("paddle", type(model).__name__)
    producers: dict[str, tuple[int, int]] = {}
    params: dict[str, int] = {}
    for op in program.main_program.global_block().ops:
        name = op.name()
        results = list(op.results())
        attrs = op.attrs()
        if name == "builtin.parameter":
            shape = list(results[0].shape)
            params[results[0].id] = math.prod(shape)
            continue
        if name in _PADDLE_SKIP:
            continue
        outs = [_tensor(list(v.shape), v.dtype) for v in results]
        short = name.partition(".")[2] or name
        if name == "pd_op.data":
            i = b.node(str(attrs.get("name", "input")), "Input", "", outs)
        else:
            owned = 0
            feeds = []
            for operand in op.operands():
                src = operand.source()
                if src is None:
                    continue
                key = src.id
                if key in params:
                    owned += params.pop(key)  # counted once, at its first user
                elif key in producers:
                    feeds.append(producers[key])
            scope = str(attrs.get("struct_name") or "").strip("/")
            keep = {k: v for k, v in attrs.items() if k not in _PADDLE_HIDDEN_ATTRS}
            i = b.node(f"{scope}/{short}" if scope else short, short, scope, outs, owned, keep)
            for src_i, slot in feeds:
                b.edge(src_i, i, slot)
        for slot, v in enumerate(results):
            producers[v.id] = (i, slot)
    for k, value in enumerate(program.outputs):
        i = b.node(
            f"output_{k}" if k else "output", "Output", "", [_tensor(value.shape, value.dtype)]
        )
        if value.id in producers:
            src, slot = producers[value.id]
            b.edge(src, i, slot)
    return b.payload()


_PADDLE_HIDDEN_ATTRS = frozenset({"op_callstack", "struct_name", "stop_gradient", "place", "name"})


# -- TensorFlow GraphDef (TensorBoard event files) ------------------------------------------------

#: tensorflow DataType enum values -> names (types.proto), for dtypes in GraphDef attributes.
_TF_DTYPES = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    7: "string",
    9: "int64",
    10: "bool",
    14: "bfloat16",
    17: "uint16",
    19: "float16",
    22: "uint32",
    23: "uint64",
}
#: Ops whose ``shape`` attribute is a parameter's shape (TensorFlow variables).
_TF_VARIABLES = frozenset({"VariableV2", "Variable", "VarHandleOp"})


def _tf_shape(raw: bytes) -> list[Any] | None:
    """A ``TensorShapeProto`` (dim = 2 {size = 1}, unknown_rank = 3) as dims, -1 as None."""
    from .protowire import group_fields, last_field, wire_fields

    g = group_fields(wire_fields(raw))
    if last_field(g, 3, 0):
        return None
    dims = []
    for _, dim in g.get(2, []):
        size = last_field(group_fields(wire_fields(dim)), 1, 0)
        size = size - (1 << 64) if size >= 1 << 63 else size
        dims.append(None if size < 0 else size)
    return dims


def graphdef_graph(data: bytes, name: str = "graph") -> dict:
    """The graph payload of a serialized TensorFlow ``GraphDef`` (an event file's ``graph_def``).

    Decoded by hand like the rest of vdl_stream.tfevents (field numbers from
    tensorflow/core/framework/graph.proto, node_def.proto, attr_value.proto)::

        GraphDef   node NodeDef = 1 (repeated)
        NodeDef    name = 1, op = 2, input = 3 (repeated: "src", "src:slot", "^control"), attr = 5
        attr       map entry {key = 1, value AttrValue = 2}
        AttrValue  list ListValue = 1, s = 2, i = 3, f = 4, b = 5, type = 6, shape = 7
        ListValue  shape = 7 (repeated TensorShapeProto)

    Scopes are the names' directories (``ResNet/Sequential[layer1]/...``, as tensorboardX and
    TensorFlow name ops); shapes come from the ``_output_shapes`` attribute, dtypes from ``T`` or
    ``dtype``; a variable's parameters from its ``shape``. Control inputs (``^x``) are left out.

    Raises:
        ValueError: ``data`` is not a well-formed GraphDef.
    """
    from .protowire import DecodeError, group_fields, last_field, wire_fields

    try:
        raw_nodes = [v for _, v in group_fields(wire_fields(data)).get(1, [])]
        decoded = []
        for raw in raw_nodes:
            g = group_fields(wire_fields(raw))
            attrs: dict[str, Any] = {}
            shapes: list[Any] = []
            dtype = None
            params = 0
            for _, entry in g.get(5, []):
                eg = group_fields(wire_fields(entry))
                key = bytes(last_field(eg, 1, b"")).decode("utf-8", "replace")
                value = group_fields(wire_fields(last_field(eg, 2, b"")))
                if key == "_output_shapes" and 1 in value:
                    listed = group_fields(wire_fields(last_field(value, 1)))
                    shapes = [_tf_shape(v) for _, v in listed.get(7, [])]
                elif key in ("T", "dtype") and 6 in value:
                    dtype = _TF_DTYPES.get(last_field(value, 6), f"type {last_field(value, 6)}")
                elif key == "shape" and 7 in value:
                    shape = _tf_shape(last_field(value, 7))
                    attrs[key] = shape
                    params = math.prod(shape) if shape and None not in shape else 0
                elif 2 in value:
                    attrs[key] = bytes(last_field(value, 2)).decode("utf-8", "replace")
                elif 3 in value:
                    attrs[key] = last_field(value, 3)
            decoded.append(
                (
                    bytes(last_field(g, 1, b"")).decode("utf-8", "replace"),
                    bytes(last_field(g, 2, b"")).decode("utf-8", "replace"),
                    [bytes(v).decode("utf-8", "replace") for _, v in g.get(3, [])],
                    shapes,
                    dtype,
                    params,
                    attrs,
                )
            )
    except (DecodeError, IndexError, TypeError, AttributeError) as exc:
        raise ValueError(f"graph_def is not a well-formed GraphDef ({exc})") from None
    b = _Builder("tensorflow", name)
    index: dict[str, int] = {}
    for node_name, op, _, shapes, dtype, params, attrs in decoded:
        scope = node_name.rpartition("/")[0]
        outputs = [_tensor(s, dtype) for s in shapes] or [_tensor(None, dtype)]
        owned = params if op in _TF_VARIABLES else 0
        index[node_name] = b.node(node_name, op, scope, outputs, owned, attrs)
    for dst, (_, _, inputs, *_) in enumerate(decoded):
        for source in inputs:
            if source.startswith("^"):
                continue
            src, _, slot = source.partition(":")
            if src in index:
                b.edge(index[src], dst, int(slot) if slot.isdigit() else 0)
    return b.payload()


# -- dispatch -------------------------------------------------------------------------------------


def _is(module: str, qualname: str, value: object) -> bool:
    """Whether ``value`` is an instance of ``module.qualname``, without importing the framework."""
    if module not in sys.modules:
        return False
    cls = sys.modules[module]
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    return isinstance(cls, type) and isinstance(value, cls)


def model_graph(model: Any, input_to_model: Any = None, *, use_strict_trace: bool = True) -> dict:
    """Convert a model to the framework-neutral graph payload (see the module doc).

    Args:
        model: a ``torch.nn.Module``, a ``paddle.nn.Layer``, an ``onnx.ModelProto`` or the path
            of an ``.onnx`` file.
        input_to_model: example inputs: for torch a tensor or tuple of them (optional: without
            it the graph has no shapes); for Paddle the ``input_spec`` (required); unused for
            ONNX.
        use_strict_trace: ``strict`` of ``torch.jit.trace``, when that is used.

    Raises:
        TypeError: ``model`` is none of those (the message names the argument and its type).
        ValueError: the model could not be traced; the message says why.
    """
    if _is("torch", "nn.Module", model):
        return torch_graph(model, input_to_model, use_strict_trace)
    if _is("paddle", "nn.Layer", model):
        return paddle_graph(model, input_to_model)
    if _is("onnx", "ModelProto", model):
        return onnx_graph(model)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not path.lower().endswith(".onnx"):
            raise ValueError(f"model path must name an .onnx file, got {path!r}")
        return onnx_graph(path)
    raise TypeError(
        "model must be a torch.nn.Module, a paddle.nn.Layer, an onnx.ModelProto or the path of "
        f"an .onnx file, got {_describe(model)}"
    )


def graph_event(
    model: Any,
    input_to_model: Any = None,
    *,
    tag: str = DEFAULT_TAG,
    step: int = 0,
    wall: float,
    use_strict_trace: bool = True,
    verbose: bool = False,
) -> dict[str, Any]:
    """A ``graph`` event of ``model`` (see :func:`model_graph`), checked like every event.

    ``verbose`` prints one line per node (op, name, output shapes, parameters) to stdout, as
    tensorboardX and VisualDL print theirs.
    """
    tag = codec.check_tag(tag)
    step = summaries.to_step(step)
    graph = model_graph(model, input_to_model, use_strict_trace=use_strict_trace)
    if verbose:
        print(format_graph(graph))
    event = {"kind": "graph", "tag": tag, "step": step, "wall": wall, **graph}
    try:
        codec.check_event(event)
    except codec.ProtocolError as exc:  # a converter bug, not the caller's: say so plainly
        raise ValueError(f"the graph of this model breaks the graph schema: {exc}") from None
    return event


def format_graph(graph: dict[str, Any]) -> str:
    """A plain-text listing of a graph payload: one line per node, then the totals."""
    lines = []
    for node in graph["nodes"]:
        shapes = ", ".join(
            "?"
            if t["shape"] is None
            else "x".join("?" if d is None else str(d) for d in t["shape"])
            for t in node["outputs"]
        )
        lines.append(f"{node['op']:<20} {node['name']:<40} [{shapes}] {node['params']}")
    total = sum(n["params"] for n in graph["nodes"])
    lines.append(f"{len(graph['nodes'])} nodes, {len(graph['edges'])} edges, {total} parameters")
    return "\n".join(lines)
