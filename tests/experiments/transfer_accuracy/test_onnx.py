"""ONNX -> transformers.BertModel conversion: a tiny synthetic graph in the export's naming scheme,
and (slow) the real paraphrase-MiniLM-L3-v2 file against onnxruntime."""

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
transformers = pytest.importorskip("transformers")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from ftlab.data.text import bert_from_onnx  # noqa: E402

PREFIX = "model.0.auto_model."


def _tiny_config():
    return transformers.BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=12, max_position_embeddings=16, type_vocab_size=2)


def _export_like(model, path):
    """Write a graph shaped like the sentence-transformers export: named tensors for embeddings, biases and
    LayerNorms; every Linear as MatMul(x, anonymous (in, out) weight) followed by Add(bias, .)."""
    inits, nodes = [], []
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    x = "hidden"
    for i, (name, p) in enumerate(model.state_dict().items()):
        if name.endswith("position_ids"):
            continue
        arr = p.detach().numpy()
        mod = name.rsplit(".", 1)[0]
        if mod in linears and name.endswith(".weight"):
            anon = f"onnx::MatMul_{400 + i}"
            inits.append(numpy_helper.from_array(np.ascontiguousarray(arr.T), anon))
            out = f"/{mod}/MatMul_output_0"
            nodes.append(helper.make_node("MatMul", [x, anon], [out]))
            nodes.append(helper.make_node("Add", [PREFIX + mod + ".bias", out], [f"/{mod}/Add_output_0"]))
        else:
            inits.append(numpy_helper.from_array(arr, PREFIX + name))
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info(f"/{m}/Add_output_0", TensorProto.FLOAT, None)
                               for m in sorted(linears)], inits)
    onnx.save(helper.make_model(graph), str(path))


def test_synthetic_graph_round_trip(tmp_path):
    torch.manual_seed(0)
    cfg = _tiny_config()
    ref = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    path = tmp_path / "tiny.onnx"
    _export_like(ref, path)
    got = bert_from_onnx(path, cfg, prefix=PREFIX)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(got.state_dict()[k], v, rtol=0, atol=0, msg=k)
    ids = torch.randint(0, 30, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(got(input_ids=ids).last_hidden_state, ref(input_ids=ids).last_hidden_state)


def test_depth_mismatch_is_an_error(tmp_path):
    torch.manual_seed(0)
    cfg = _tiny_config()
    _export_like(transformers.BertModel(cfg, add_pooling_layer=False), tmp_path / "tiny.onnx")
    deeper = _tiny_config()
    deeper.num_hidden_layers = 3
    with pytest.raises(ValueError, match="encoder.layer.2"):
        bert_from_onnx(tmp_path / "tiny.onnx", deeper, prefix=PREFIX)


@pytest.mark.slow
def test_real_minilm_l3_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    from ftlab.data.text import load_minilm_l3, minilm_l3_onnx_path

    model, tok = load_minilm_l3()
    enc = tok(["a member of the genus Canis", "a motor vehicle with four wheels"], padding=True, return_tensors="np")
    sess = ort.InferenceSession(str(minilm_l3_onnx_path()))
    outs = sess.run(None, {"input_ids": enc["input_ids"].astype(np.int64),
                           "attention_mask": enc["attention_mask"].astype(np.int64)})
    ref = next(o for o in outs if o.ndim == 3)
    with torch.no_grad():
        got = model(input_ids=torch.from_numpy(enc["input_ids"]),
                    attention_mask=torch.from_numpy(enc["attention_mask"])).last_hidden_state.numpy()
    assert np.abs(got - ref).max() < 1e-4
