"""L0: the backend attribute table and generic set/get, on real backend descriptors (no GPU needed)."""

from __future__ import annotations

import ctypes

import pytest

from cudnnkit import lib
from cudnnkit.lib import backend
from cudnnkit.lib._backend_table import ALSO_ACCEPTS, DEPRECATED, READ_ONLY, UNVERIFIED
from cudnnkit.lib.backend import ATTRIBUTES, VARIABLE, BackendDescriptor


def test_table_covers_every_attribute_in_the_header():
    names = set(lib.cudnnBackendAttributeName_t.__members__)
    assert set(ATTRIBUTES) == names, (sorted(names - set(ATTRIBUTES)), sorted(set(ATTRIBUTES) - names))


def test_table_entries_are_valid():
    for name, (desc, typ, count) in ATTRIBUTES.items():
        assert desc in lib.cudnnBackendDescriptorType_t.__members__, name
        assert typ in lib.cudnnBackendAttributeType_t.__members__, name
        assert count == VARIABLE or count >= 1, name
    for names in (DEPRECATED, READ_ONLY, UNVERIFIED, ALSO_ACCEPTS):
        assert set(names) <= set(ATTRIBUTES), sorted(set(names) - set(ATTRIBUTES))
    for name, types in ALSO_ACCEPTS.items():
        assert types[0] == ATTRIBUTES[name][1] and len(set(types)) == len(types) > 1, name
        assert set(types) <= set(lib.cudnnBackendAttributeType_t.__members__), name


# one element per type: null pointers (libcudnn checks the type before it looks at them), 1 for numbers and
# booleans, 0 (the first member) for enum values
def _one_element(attr_type: str):
    ct = backend.element_ctype(lib.cudnnBackendAttributeType_t[attr_type])
    if ct is ctypes.c_void_p:
        return ct()
    if ct is ctypes.c_char:
        return ct(b"x")
    if ct is lib.cudnnFraction_t:
        return ct(1, 1)
    return ct(0) if ct is ctypes.c_int else ct(1)


# attributes libcudnn refuses on a fresh descriptor, whatever the type, until another one is set
_PREREQUISITE = {"CUDNN_ATTR_TENSOR_CONSTANT_VALUE": ("CUDNN_ATTR_TENSOR_IS_BY_VALUE", True)}


def _set_one(desc_type: str, name: str, attr_type: str):
    """cudnnBackendSetAttribute of one element on a fresh descriptor: None if taken, else (status, last error)."""
    with BackendDescriptor(desc_type) as d:
        if name in _PREREQUISITE:
            d.set(*_PREREQUISITE[name])
        elem = _one_element(attr_type)
        try:
            lib.cudnnBackendSetAttribute(
                d,
                lib.cudnnBackendAttributeName_t[name],
                lib.cudnnBackendAttributeType_t[attr_type],
                1,
                ctypes.byref(elem),
            )
        except lib.CudnnError as e:
            return e.status, e.last_error
    return None


def _usable(name: str, desc: str) -> bool:
    return lib.available(name) and lib.available(desc)


def test_loaded_library_takes_each_settable_attribute_with_the_table_type():
    # The table's type gets past libcudnn's type check (accepted, or refused later for the null or placeholder
    # value); another type is refused with libcudnn's wrong-type answer, which names the expected type and so
    # is the same for every wrong type. A wrong owner or type in the table makes both answers equal.
    wrong, checked = [], 0
    for name, (desc, typ, _) in ATTRIBUTES.items():
        if name in READ_ONLY or name in UNVERIFIED or not _usable(name, desc):
            continue  # names newer than the loaded libcudnn are refused by lib.require, never passed on
        other = "CUDNN_TYPE_INT64" if typ == "CUDNN_TYPE_BOOLEAN" else "CUDNN_TYPE_BOOLEAN"
        assert other not in ALSO_ACCEPTS.get(name, ()), name
        if typ == "CUDNN_TYPE_BACKEND_DESCRIPTOR" and lib.version_tuple() < (9, 19, 0):
            continue  # before 9.19 libcudnn gives one generic text for a NULL descriptor of either type
        taken, refused = _set_one(desc, name, typ), _set_one(desc, name, other)
        if refused is None or taken == refused:
            wrong.append((name, typ, taken, refused))
        checked += 1
    assert not wrong, wrong
    assert checked >= (250 if lib.version_tuple() >= (9, 19, 0) else 100)  # 9.12.0: 102 names, 9.19.0: 266, 9.28.1: 347


def test_loaded_library_refuses_setting_read_only_attributes():
    usable = [(n, ATTRIBUTES[n]) for n in sorted(READ_ONLY) if _usable(n, ATTRIBUTES[n][0])]
    assert len(usable) >= 20
    for name, (desc, typ, _) in usable:
        if desc == "CUDNN_BACKEND_INTERMEDIATE_INFO_DESCRIPTOR":
            with pytest.raises(lib.CudnnError):  # a placeholder: libcudnn 9.19 and 9.28 cannot create it
                BackendDescriptor(desc)
            continue
        assert _set_one(desc, name, typ) is not None, name


@pytest.mark.parametrize(
    "name, desc, typ",
    [
        ("CUDNN_ATTR_TENSOR_DIMENSIONS", "CUDNN_BACKEND_TENSOR_DESCRIPTOR", "CUDNN_TYPE_INT64"),
        ("CUDNN_ATTR_TENSOR_DATA_TYPE", "CUDNN_BACKEND_TENSOR_DESCRIPTOR", "CUDNN_TYPE_DATA_TYPE"),
        ("CUDNN_ATTR_TENSOR_IS_VIRTUAL", "CUDNN_BACKEND_TENSOR_DESCRIPTOR", "CUDNN_TYPE_BOOLEAN"),
        ("CUDNN_ATTR_POINTWISE_MODE", "CUDNN_BACKEND_POINTWISE_DESCRIPTOR", "CUDNN_TYPE_POINTWISE_MODE"),
        ("CUDNN_ATTR_OPERATIONGRAPH_OPS", "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR", "CUDNN_TYPE_BACKEND_DESCRIPTOR"),
        ("CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS", "CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR", "CUDNN_TYPE_VOID_PTR"),
        ("CUDNN_ATTR_ENGINEHEUR_MODE", "CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR", "CUDNN_TYPE_HEUR_MODE"),
    ],
)
def test_spot_checked_entries(name, desc, typ):
    d, t, _ = backend.attribute_info(name)
    assert (d.name, t.name) == (desc, typ)


def test_tensor_descriptor_set_finalize_read_back():
    with BackendDescriptor("CUDNN_BACKEND_TENSOR_DESCRIPTOR") as t:
        t.set("CUDNN_ATTR_TENSOR_DATA_TYPE", lib.CUDNN_DATA_HALF)
        t.set("CUDNN_ATTR_TENSOR_DIMENSIONS", [8, 64, 56, 56])
        t.set("CUDNN_ATTR_TENSOR_STRIDES", [200704, 1, 3584, 64])  # NHWC
        t.set("CUDNN_ATTR_TENSOR_UNIQUE_ID", 42)
        t.set("CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT", 16)
        t.set("CUDNN_ATTR_TENSOR_IS_VIRTUAL", False)
        t.finalize()
        assert t.get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [8, 64, 56, 56]
        assert t.get("CUDNN_ATTR_TENSOR_STRIDES") == [200704, 1, 3584, 64]
        assert t.get("CUDNN_ATTR_TENSOR_UNIQUE_ID") == 42
        assert t.get("CUDNN_ATTR_TENSOR_DATA_TYPE") == lib.CUDNN_DATA_HALF
        assert t.get("CUDNN_ATTR_TENSOR_IS_VIRTUAL") is False


def test_pointwise_descriptor_enum_and_float_attributes():
    # cuDNN 9.19 does not support reading pointwise attributes back (NOT_SUPPORTED), so this
    # checks that the table's types are the ones cuDNN accepts and that a wrong type is refused.
    with BackendDescriptor("CUDNN_BACKEND_POINTWISE_DESCRIPTOR") as p:
        p.set("CUDNN_ATTR_POINTWISE_MODE", lib.CUDNN_POINTWISE_RELU_FWD)
        p.set("CUDNN_ATTR_POINTWISE_MATH_PREC", lib.CUDNN_DATA_FLOAT)
        p.set("CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE", 0.125)
        p.finalize()
        assert p.finalized
    import ctypes

    with BackendDescriptor("CUDNN_BACKEND_POINTWISE_DESCRIPTOR") as p:
        v = ctypes.c_int64(int(lib.CUDNN_POINTWISE_RELU_FWD))
        with pytest.raises(lib.BadParamError):
            lib.cudnnBackendSetAttribute(p, lib.CUDNN_ATTR_POINTWISE_MODE, lib.CUDNN_TYPE_INT64, 1, ctypes.byref(v))


def test_unfinalized_tensor_is_rejected_by_cudnn():
    t = BackendDescriptor("CUDNN_BACKEND_TENSOR_DESCRIPTOR")
    t.set("CUDNN_ATTR_TENSOR_DIMENSIONS", [2, 3])
    with pytest.raises(lib.CudnnError) as ei:
        t.finalize()  # no strides, dtype, uid
    assert ei.value.function == "cudnnBackendFinalize"


def test_attribute_of_another_descriptor_is_a_value_error():
    with BackendDescriptor("CUDNN_BACKEND_TENSOR_DESCRIPTOR") as t:
        with pytest.raises(ValueError, match="belongs to CUDNN_BACKEND_POINTWISE_DESCRIPTOR"):
            t.set("CUDNN_ATTR_POINTWISE_MODE", lib.CUDNN_POINTWISE_ADD)
    with pytest.raises(ValueError, match="unknown backend attribute"):
        backend.attribute_info("CUDNN_ATTR_NOT_A_THING")
    with pytest.raises(ValueError, match="unknown backend descriptor type"):
        BackendDescriptor("CUDNN_BACKEND_NOPE")


def test_fixed_count_is_enforced():
    with BackendDescriptor("CUDNN_BACKEND_TENSOR_DESCRIPTOR") as t:
        with pytest.raises(ValueError, match="takes 1 element"):
            t.set("CUDNN_ATTR_TENSOR_UNIQUE_ID", [1, 2])


def test_descriptor_valued_attribute_keeps_reference():
    x = BackendDescriptor("CUDNN_BACKEND_TENSOR_DESCRIPTOR")
    for k, v in (
        ("CUDNN_ATTR_TENSOR_DATA_TYPE", lib.CUDNN_DATA_FLOAT),
        ("CUDNN_ATTR_TENSOR_DIMENSIONS", [1, 4]),
        ("CUDNN_ATTR_TENSOR_STRIDES", [4, 1]),
        ("CUDNN_ATTR_TENSOR_UNIQUE_ID", 1),
        ("CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT", 4),
    ):
        x.set(k, v)
    x.finalize()
    pw = BackendDescriptor("CUDNN_BACKEND_POINTWISE_DESCRIPTOR")
    pw.set("CUDNN_ATTR_POINTWISE_MODE", lib.CUDNN_POINTWISE_RELU_FWD).set(
        "CUDNN_ATTR_POINTWISE_MATH_PREC", lib.CUDNN_DATA_FLOAT
    ).finalize()
    op = BackendDescriptor("CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR")
    op.set("CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR", pw)
    op.set("CUDNN_ATTR_OPERATION_POINTWISE_XDESC", x)
    assert pw in op._keep and x in op._keep
