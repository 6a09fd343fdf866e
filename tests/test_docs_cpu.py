"""Docstrings of the public L2 ops, and the examples' registration in the GPU tier (CPU only, no GPU needed).

The strict check covers the ops whose docstrings follow the standard (summary, each parameter under ``Args:``,
``Returns:``, the cuDNN call, an ``Example:``): the softmax, dropout, LRN and divisive normalization, CTC, spatial
transformer, tensor, arithmetic, activation, pooling, convolution, normalization, RNN and attention families, and
the fp8 attention functions of ``cudnnkit.ops.attention_fp8`` (not re-exported by ``cudnnkit.ops``). Every other
public name of ``cudnnkit.ops`` is listed in ``NOT_YET`` with the reason, so a new op cannot slip past: the
router's own names. Every public name is still required to have a docstring.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from cudnnkit import ops

ROOT = Path(__file__).resolve().parents[1]

#: the public L2 names whose docstrings follow the standard
DOCUMENTED = (
    "softmax_forward softmax_backward DropoutState default_state dropout_forward dropout_backward lrn_forward "
    "lrn_backward divisive_normalization_forward divisive_normalization_backward ctc_loss affine_grid_forward "
    "affine_grid_backward grid_sample_forward grid_sample_backward set_tensor scale_tensor add_tensor "
    "transform_tensor op_tensor reduce_tensor activation_forward activation_backward Pooling pooling_forward "
    "pooling_backward Convolution convolution_forward convolution_backward_data convolution_backward_filter "
    "convolution_backward_bias batch_norm_forward batch_norm_backward layer_norm_forward layer_norm_backward "
    "rms_norm_forward rms_norm_backward instance_norm_forward instance_norm_backward RNN LinearParams rnn_forward "
    "rnn_backward load_torch_params to_torch_params torch_param_names sdpa_forward sdpa_backward attention_forward "
    "attention_backward"
).split()

#: the public functions of cudnnkit.ops.attention_fp8 (its FP8_FORWARD/FP8_BACKWARD are declarations, not calls)
DOCUMENTED_FP8 = ["attention_fp8_forward", "attention_fp8_backward"]


#: public names not held to the standard yet, and why
NOT_YET = {
    "REGISTRY": "the primitives' registry (data)",
    "Primitive": "the declaration class of the shared machinery (fields documented in _primitive.py)",
    "last_path": "the router's per-thread record (no cuDNN call)",
}


def _obj(name: str):
    """A checked name's object: from cudnnkit.ops, or from cudnnkit.ops.attention_fp8 for the fp8 functions."""
    from cudnnkit.ops import attention_fp8

    return getattr(attention_fp8 if name in DOCUMENTED_FP8 else ops, name)


def _params(obj) -> list[str]:
    sig = inspect.signature(obj)
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [n for n, p in sig.parameters.items() if p.kind not in skip and not n.startswith("_") and n != "self"]


def _section(doc: str, name: str) -> str:
    """The indented block under ``name:`` (a Google-style section), or ''."""
    m = re.search(rf"(?m)^{name}:\n((?:[ \t]+.*\n?|\n)+)", doc)
    return m.group(1) if m else ""


def test_every_public_op_has_a_docstring():
    missing = [n for n in ops.__all__ if not (inspect.getdoc(getattr(ops, n)) or "").strip()]
    assert not missing


def test_documented_names_are_public():
    assert set(DOCUMENTED) <= set(ops.__all__)


def test_every_public_op_is_documented_or_listed_as_not_yet():
    assert not set(DOCUMENTED) & set(NOT_YET)
    assert set(ops.__all__) - set(DOCUMENTED) == set(NOT_YET), "document the new name, or say why in NOT_YET"


def test_every_fp8_attention_function_is_checked_and_in_the_api_reference():
    from cudnnkit.ops import attention_fp8

    functions = {n for n in attention_fp8.__all__ if inspect.isfunction(getattr(attention_fp8, n))}
    assert functions == set(DOCUMENTED_FP8)
    pages = "\n".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.md"))
    assert re.search(r"(?m)^\.\. automodule:: cudnnkit\.ops\.attention_fp8$", pages), "no API page for attention_fp8"


@pytest.mark.parametrize("name", DOCUMENTED + DOCUMENTED_FP8)
def test_docstring_names_every_parameter(name):
    obj = _obj(name)
    doc = inspect.getdoc(obj)
    args = _section(doc, "Args")
    assert args, f"{name}: no Args: section"
    listed = re.findall(r"(?m)^    (\w+):", args)
    assert listed == _params(obj), f"{name}: Args lists {listed}, the signature has {_params(obj)}"


@pytest.mark.parametrize("name", DOCUMENTED + DOCUMENTED_FP8)
def test_docstring_states_returns_call_and_example(name):
    obj = _obj(name)
    doc = inspect.getdoc(obj)
    if inspect.isfunction(obj):
        assert _section(doc, "Returns"), f"{name}: no Returns: section"
    assert re.search(r"cudnn[A-Z]\w+", doc), f"{name}: the docstring names no cuDNN call"
    example = _section(doc, "Example")
    assert ">>> " in example, f"{name}: no Example: section with code"
    for line in example.splitlines():  # the example's code parses (names come from the surrounding text)
        if line.strip().startswith(">>> "):
            ast.parse(line.strip()[4:])


def test_every_example_is_run_by_the_gpu_tier():
    from tests.gpu.test_examples_gpu import REQUIRES, scripts

    assert scripts(), "examples/ has no scripts"
    assert set(scripts()) == set(REQUIRES), "each example needs its libraries and time limit in REQUIRES"
    for name in scripts():
        ast.parse((ROOT / "examples" / name).read_text())
