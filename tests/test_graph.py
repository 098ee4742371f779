"""add_graph: torch (fx and the jit fallback), ONNX and Paddle models converted to the graph payload
with exact node/edge counts, shapes and parameter counts; the facades' signatures; bad input; the
event recorded and served by /api/events."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest
import trio

import recorder
from tests.conftest import http_request
from vdl_stream import LogWriter, SummaryWriter, attach, codec, graphs
from vdl_stream.server import run_server

torch = pytest.importorskip("torch")
nn = torch.nn


class Block(nn.Module):
    """conv + residual add + relu: a scope with a function call (the add) inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.conv(x) + x)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.fc = nn.Linear(3, 2)
        self.scale = nn.Parameter(torch.ones(2))

    def forward(self, x):
        return self.fc(torch.flatten(self.block(x).mean((2, 3)), 1)) * self.scale


class Branchy(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it, torch.jit.trace can."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return torch.relu(self.fc(x))
        return self.fc(x)


def by_name(graph: dict) -> dict[str, dict]:
    return {n["name"]: n for n in graph["nodes"]}


def named_edges(graph: dict) -> set[tuple[str, str]]:
    nodes = graph["nodes"]
    return {(nodes[s]["name"], nodes[d]["name"]) for s, d, _ in graph["edges"]}


def test_a_torch_module_becomes_its_fx_graph_with_shapes_scopes_and_parameters():
    model = Tiny().train()
    g = graphs.model_graph(model, torch.randn(2, 3, 4, 4))
    assert g["framework"] == "torch" and g["name"] == "Tiny"
    assert [(n["name"], n["op"], n["scope"]) for n in g["nodes"]] == [
        ("x", "Input", ""),
        ("block.conv", "Conv2d", "block"),
        ("add", "add", "block"),
        ("block.relu", "ReLU", "block"),
        ("mean", "mean", ""),
        ("flatten", "flatten", ""),
        ("fc", "Linear", ""),
        ("mul", "mul", ""),  # reads the parameter `scale`: its 2 elements count here
        ("output", "Output", ""),
    ]
    assert named_edges(g) == {
        ("x", "block.conv"),
        ("block.conv", "add"),
        ("x", "add"),
        ("add", "block.relu"),
        ("block.relu", "mean"),
        ("mean", "flatten"),
        ("flatten", "fc"),
        ("fc", "mul"),
        ("mul", "output"),
    }
    nodes = by_name(g)
    assert [nodes[k]["params"] for k in ("block.conv", "fc", "mul", "add")] == [84, 8, 2, 0]
    assert sum(n["params"] for n in g["nodes"]) == sum(p.numel() for p in model.parameters())
    assert nodes["block.conv"]["outputs"] == [{"shape": [2, 3, 4, 4], "dtype": "float32"}]
    assert nodes["mean"]["outputs"][0]["shape"] == [2, 3]
    assert nodes["add"]["inputs"] == [{"shape": [2, 3, 4, 4], "dtype": "float32"}] * 2
    assert "kernel_size=(3, 3)" in nodes["block.conv"]["attrs"]["module"]
    assert model.training and model.block.training  # the shape pass ran in eval mode, put back


def test_without_inputs_a_torch_graph_has_structure_but_no_shapes():
    g = graphs.model_graph(Tiny())
    assert len(g["nodes"]) == 9 and len(g["edges"]) == 9
    assert all(n["outputs"] == [{"shape": None, "dtype": None}] for n in g["nodes"])


def test_a_torch_resnet50_graph_has_every_parameter_once():
    from tests.graph_models import RESNET50_PARAMS, resnet50

    g = graphs.model_graph(resnet50(), torch.randn(1, 3, 64, 64))
    ops = [n["op"] for n in g["nodes"]]
    assert (len(g["nodes"]), len(g["edges"])) == (177, 192)
    assert (ops.count("Conv2d"), ops.count("BatchNorm2d"), ops.count("add")) == (53, 53, 16)
    assert sum(n["params"] for n in g["nodes"]) == RESNET50_PARAMS
    assert by_name(g)["layer3.5.conv2"]["scope"] == "layer3/5"
    assert by_name(g)["fc"]["outputs"][0]["shape"] == [1, 1000]


def test_a_module_fx_cannot_trace_falls_back_to_jit_trace_with_the_input():
    model = Branchy()
    g = graphs.model_graph(model, torch.ones(1, 4))
    assert [n["op"] for n in g["nodes"]] == ["Input", "linear", "relu", "Output"]
    assert [n["name"] for n in g["nodes"]][1:3] == ["fc.linear", "relu"]
    assert by_name(g)["fc.linear"]["scope"] == "fc"
    assert by_name(g)["fc.linear"]["params"] == 20
    assert by_name(g)["fc.linear"]["outputs"] == [{"shape": [1, 4], "dtype": "float"}]
    assert len(g["edges"]) == 3
    with pytest.raises(ValueError, match="pass input_to_model"):
        graphs.model_graph(model)


def tiny_onnx():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    w = helper.make_tensor("W", TensorProto.FLOAT, [4, 3], np.ones(12, np.float32))
    b = helper.make_tensor("B", TensorProto.FLOAT, [3], np.zeros(3, np.float32))
    shape = helper.make_tensor("S", TensorProto.INT64, [2], np.array([-1, 3], np.int64))
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="/fc/MatMul"),
        helper.make_node("Add", ["h", "B"], ["h2"], name="/fc/Add"),
        helper.make_node("Relu", ["h2"], ["r"], name="/act/Relu"),
        helper.make_node("Reshape", ["r", "S"], ["y"], name="/Reshape"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, b, shape],
    )
    return onnx, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_onnx_model_and_its_file_give_the_same_graph(tmp_path):
    onnx, model = tiny_onnx()
    g = graphs.model_graph(model)
    assert g["framework"] == "onnx" and g["name"] == "tiny"
    assert [(n["name"], n["op"], n["scope"], n["params"]) for n in g["nodes"]] == [
        ("x", "Input", "", 0),
        ("/fc/MatMul", "MatMul", "fc", 12),
        ("/fc/Add", "Add", "fc", 3),
        ("/act/Relu", "Relu", "act", 0),
        ("/Reshape", "Reshape", "", 2),  # its shape initializer: 2 elements
        ("y", "Output", "", 0),
    ]
    assert named_edges(g) == {
        ("x", "/fc/MatMul"),
        ("/fc/MatMul", "/fc/Add"),
        ("/fc/Add", "/act/Relu"),
        ("/act/Relu", "/Reshape"),
        ("/Reshape", "y"),
    }
    nodes = by_name(g)
    assert nodes["x"]["outputs"] == [{"shape": ["batch", 4], "dtype": "float"}]
    assert nodes["/fc/MatMul"]["outputs"][0]["shape"] == ["batch", 3]  # from shape inference
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    assert graphs.model_graph(str(path)) == g and graphs.model_graph(path) == g


def test_a_torch_model_exported_to_onnx_keeps_its_module_scopes(tmp_path):
    pytest.importorskip("onnx")
    path = tmp_path / "tiny.onnx"
    try:
        torch.onnx.export(Tiny(), (torch.randn(1, 3, 4, 4),), str(path), dynamo=False)
    except Exception as exc:  # the exporter's own dependencies (onnxscript) may be missing
        pytest.skip(f"torch.onnx.export unavailable: {exc}")
    g = graphs.model_graph(path)
    scopes = {n["scope"] for n in g["nodes"]}
    assert "block/conv" in scopes and sum(n["params"] for n in g["nodes"]) >= 94


paddle_source = """
import paddle
from paddle import nn


class PBlock(nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2D(3, 3, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.conv(x) + x)


class PTiny(nn.Layer):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(PBlock(), PBlock())
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(paddle.flatten(self.blocks(x).mean((2, 3)), 1))
"""


@pytest.fixture
def paddle_tiny(tmp_path, monkeypatch):
    """PTiny from a real file: paddle.jit.to_static reads the layer's source."""
    pytest.importorskip("paddle")
    (tmp_path / "paddle_tiny.py").write_text(paddle_source)
    monkeypatch.syspath_prepend(str(tmp_path))
    import paddle_tiny

    return paddle_tiny


def test_a_paddle_layer_becomes_its_static_program_and_keeps_running_dynamically(paddle_tiny):
    import paddle

    model = paddle_tiny.PTiny()
    spec = [paddle.static.InputSpec([None, 3, 4, 4], "float32", "x")]
    g = graphs.model_graph(model, spec)
    assert g["framework"] == "paddle" and g["name"] == "PTiny"
    ops = [n["op"] for n in g["nodes"]]
    # Each Conv2D is conv2d + reshape (of its bias) + add; then the block's add and relu.
    assert ops == ["Input"] + ["conv2d", "reshape", "add", "add", "relu"] * 2 + [
        "mean",
        "flatten",
        "matmul",
        "add",
        "Output",
    ]
    assert len(g["edges"]) == 17
    assert g["edges"][-1] == [14, 15, 0]  # the last add into the Output node
    assert [n["scope"] for n in g["nodes"]][1:7] == [
        "Sequential/PBlock/Conv2D",
        "Sequential/PBlock/Conv2D",
        "Sequential/PBlock/Conv2D",
        "Sequential/PBlock",
        "Sequential/PBlock/ReLU",
        "Sequential/PBlock_1/Conv2D",
    ]
    assert sum(n["params"] for n in g["nodes"]) == sum(p.size for p in model.parameters()) == 176
    assert g["nodes"][0]["outputs"] == [{"shape": [None, 3, 4, 4], "dtype": "float32"}]
    assert g["nodes"][-2]["outputs"][0]["shape"] == [None, 2]
    # The layer's forward was put back: it still runs eagerly on any batch size.
    assert "forward" not in model.__dict__
    assert model(paddle.ones([5, 3, 4, 4])).shape == [5, 2]
    # Example tensors work as the spec too; no spec is a clear error.
    assert len(graphs.model_graph(model, [paddle.ones([1, 3, 4, 4])])["nodes"]) == 16
    with pytest.raises(ValueError, match="input_spec is required"):
        graphs.model_graph(model)


@pytest.mark.parametrize(
    ("model", "error", "message"),
    [
        (3, TypeError, r"model must be a torch\.nn\.Module, .* got int 3"),
        ({"layer": 1}, TypeError, r"model must be .* got dict"),
        ("weights.pt", ValueError, r"model path must name an \.onnx file, got 'weights\.pt'"),
    ],
)
def test_not_a_model_is_a_clear_error_naming_the_argument(tmp_path, model, error, message):
    with pytest.raises(error, match=message):
        graphs.model_graph(model)
    with attach(tmp_path, run="bad") as w, pytest.raises(error, match=message):
        w.add_graph(model)


def test_bad_inputs_and_unreadable_files_are_named(tmp_path):
    with pytest.raises(TypeError, match=r"input_to_model must be None, a torch\.Tensor .* got str"):
        graphs.model_graph(Tiny(), "x")
    with pytest.raises(ValueError, match="model failed on input_to_model"):
        graphs.model_graph(Tiny(), torch.ones(1, 5, 4, 4))
    pytest.importorskip("onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="is not an ONNX file"):
        graphs.model_graph(junk)
    with pytest.raises(FileNotFoundError):
        graphs.model_graph(tmp_path / "missing.onnx")


def test_the_codec_refuses_a_graph_event_that_breaks_the_schema():
    event = graphs.graph_event(Tiny(), wall=1.0)
    assert codec.check_event(event) is event
    for bad, message in [
        ({"edges": [[0, 99, 0]]}, "within the nodes"),
        ({"edges": [[0, 1, 5]]}, "within the nodes"),
        ({"nodes": [{"name": "a"}], "edges": []}, "graph node 0"),
        ({"framework": 3}, "graph framework"),
    ]:
        with pytest.raises(codec.ProtocolError, match=message):
            codec.check_event(event | bad)


def read_graphs(run_dir) -> list[dict]:
    with recorder.RunReader(run_dir) as reader:
        return [r.data | {"tag": r.tag, "step": r.step} for r in reader.read_records(kind="graph")]


def test_writer_and_both_facades_record_graph_events(tmp_path, capsys):
    with attach(tmp_path, run="w") as w:
        w.add_graph(Tiny(), torch.randn(1, 3, 4, 4), tag="tiny", step=3)
    (ev,) = read_graphs(tmp_path / "w")
    assert (ev["tag"], ev["step"], len(ev["nodes"]), len(ev["edges"])) == ("tiny", 3, 9, 9)
    # tensorboardX / torch: add_graph(model, input_to_model, verbose, use_strict_trace).
    with SummaryWriter(tmp_path / "sw") as w:
        w.add_graph(Branchy(), torch.ones(1, 4), True, False)
    (ev,) = read_graphs(tmp_path / "sw")
    assert ev["tag"] == "graph" and ev["step"] == 0 and len(ev["nodes"]) == 4
    assert "4 nodes, 3 edges, 20 parameters" in capsys.readouterr().out  # verbose
    # VisualDL: add_graph(model, input_spec, verbose).
    _, onnx_model = tiny_onnx()
    with LogWriter(tmp_path / "lw") as w:
        w.add_graph(onnx_model, None, False)
    (ev,) = read_graphs(tmp_path / "lw")
    assert ev["framework"] == "onnx" and len(ev["nodes"]) == 6


@pytest.fixture
def graph_run(tmp_path):
    with attach(tmp_path, run="g") as w:
        w.add_graph(Tiny(), torch.randn(1, 3, 4, 4))
    return str(tmp_path)


async def test_the_http_api_serves_a_graph_event(nursery, graph_run):
    url = await nursery.start(partial(run_server, graph_run, "127.0.0.1", 0))
    with trio.fail_after(20):
        status, _, body = await trio.to_thread.run_sync(
            http_request, url + "/api/events?run=g&kind=graph"
        )
    assert status == 200
    (ev,) = json.loads(body)["events"]
    assert ev["kind"] == "graph" and ev["tag"] == "graph"
    assert by_name(ev)["fc"]["outputs"] == [{"shape": [1, 2], "dtype": "float32"}]
    assert len(ev["edges"]) == 9


def tensorboard_graph_def() -> bytes:
    """A GraphDef as tensorboardX writes it for a torch model (names carry the module path)."""
    pytest.importorskip("tensorboardX")
    from tensorboardX.proto import attr_value_pb2, graph_pb2, node_def_pb2, tensor_shape_pb2

    def shapes(*dims_list):
        return attr_value_pb2.AttrValue(
            list=attr_value_pb2.AttrValue.ListValue(
                shape=[
                    tensor_shape_pb2.TensorShapeProto(
                        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims]
                    )
                    for dims in dims_list
                ]
            )
        )

    def node(name, op, inputs, *dims_list, **attrs):
        attr = {"_output_shapes": shapes(*dims_list), **attrs}
        return node_def_pb2.NodeDef(name=name, op=op, input=inputs, attr=attr)

    f32 = attr_value_pb2.AttrValue(type=1)
    variable_shape = attr_value_pb2.AttrValue(
        shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in (3, 2)]
        )
    )
    nodes = [
        node("input/x", "IO Node", [], (-1, 3)),
        node("Net/Linear[fc]/weight", "VariableV2", [], (3, 2), shape=variable_shape, dtype=f32),
        node(
            "Net/Linear[fc]/MatMul",
            "aten::matmul",
            ["input/x", "Net/Linear[fc]/weight"],
            (-1, 2),
            T=f32,
        ),
        node("Net/split", "aten::split", ["Net/Linear[fc]/MatMul", "^input/x"], (-1, 1), (-1, 1)),
        node("output/y", "IO Node", ["Net/split:1"], (-1, 1)),
    ]
    return graph_pb2.GraphDef(node=nodes).SerializeToString()


def test_a_tensorboard_graph_def_becomes_a_graph_with_scopes_shapes_and_slots():
    g = graphs.graphdef_graph(tensorboard_graph_def())
    assert g["framework"] == "tensorflow"
    assert [(n["op"], n["scope"], n["params"]) for n in g["nodes"]] == [
        ("IO Node", "input", 0),
        ("VariableV2", "Net/Linear[fc]", 6),
        ("aten::matmul", "Net/Linear[fc]", 0),
        ("aten::split", "Net", 0),
        ("IO Node", "output", 0),
    ]
    # The control input ^input/x is left out; "Net/split:1" is output slot 1.
    assert g["edges"] == [[0, 2, 0], [1, 2, 0], [2, 3, 0], [3, 4, 1]]
    assert g["nodes"][0]["outputs"] == [{"shape": [None, 3], "dtype": None}]
    assert g["nodes"][2]["outputs"] == [{"shape": [None, 2], "dtype": "float32"}]
    assert len(g["nodes"][3]["outputs"]) == 2
    with pytest.raises(ValueError, match="graph_def is not a well-formed GraphDef"):
        graphs.graphdef_graph(b"\x0a\xff")


def test_import_brings_the_graph_of_a_tensorboard_event_file(tmp_path, capsys):
    from tensorboardX import SummaryWriter as TbxWriter
    from tensorboardX.proto import event_pb2

    from vdl_stream.cli import main

    graph_def = tensorboard_graph_def()
    with TbxWriter(str(tmp_path / "tb" / "net")) as w:
        w.add_scalar("loss", 1.0, 0)
        w._get_file_writer().add_event(event_pb2.Event(graph_def=graph_def, wall_time=1e9))
    assert main(["import", str(tmp_path / "tb"), "--logdir", str(tmp_path / "runs")]) == 0
    assert "graph_def" not in capsys.readouterr().err  # not reported as skipped
    (ev,) = read_graphs(tmp_path / "runs" / "net")
    assert ev["tag"] == "graph" and ev["framework"] == "tensorflow"
    assert len(ev["nodes"]) == 5 and len(ev["edges"]) == 4


def test_the_lightning_logger_records_the_graph_of_log_graph(tmp_path):
    pytest.importorskip("lightning.pytorch")
    from vdl_stream.integrations.lightning import VdlStreamLogger

    model = Tiny()
    model.example_input_array = torch.randn(1, 3, 4, 4)
    logger = VdlStreamLogger(tmp_path / "logs", run="lg")
    logger.log_graph(model)  # input_array: the model's example_input_array
    logger.finalize("success")
    (ev,) = read_graphs(tmp_path / "logs" / "lg")
    assert len(ev["nodes"]) == 9 and by_name(ev)["fc"]["outputs"][0]["shape"] == [1, 2]


def test_log_writer_add_graph_takes_a_paddle_layer_and_its_input_spec(paddle_tiny, tmp_path):
    import paddle

    spec = [paddle.static.InputSpec([None, 3, 4, 4], "float32", "x")]
    with LogWriter(tmp_path / "pd") as w:
        w.add_graph(paddle_tiny.PTiny(), spec)  # VisualDL: add_graph(model, input_spec)
        with pytest.raises(ValueError, match="input_spec is required"):
            w.add_graph(paddle_tiny.PTiny())
    (ev,) = read_graphs(tmp_path / "pd")
    assert ev["framework"] == "paddle" and len(ev["nodes"]) == 16
    assert sum(n["params"] for n in ev["nodes"]) == 176


def test_a_rank_that_does_not_log_skips_add_graph_without_tracing(tmp_path, monkeypatch):
    for key, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with attach(tmp_path, run="ranked", telemetry=False) as w:
        w.add_graph(3)  # not even checked: the call costs nothing on this rank
    assert read_graphs(tmp_path / w.run) == []
