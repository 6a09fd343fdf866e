#!/usr/bin/env python3
"""Generate ``src/cudnnkit/lib/_cudnn.py`` from the installed cuDNN 9 headers.

The headers come from the ``nvidia-cudnn-cu13`` (or ``-cu12``) wheel:
``cudnn_version.h``, ``cudnn_graph.h``, ``cudnn_ops.h``, ``cudnn_cnn.h`` and
``cudnn_adv.h``, and ``cudnn_subquadratic_ops.h``/``cudnn_gnn_ops.h`` where the wheel has them. The output
holds, with no hand editing:

* every ``#define`` whose value is a number, as a module constant;
* every enum as an ``IntEnum`` (deprecated members included, marked);
* every struct as a ``ctypes.Structure``, every opaque handle as ``c_void_p``,
  the callback type as a ``CFUNCTYPE``;
* a ``Prototype`` for every function (restype, argument names and ctypes
  types, the C declaration, the header it came from);
* the set of deprecated names (functions, types, enum members).

The parser is deliberately small: cuDNN's public headers are plain C with one
declaration per statement, no nested conditionals around code, and no macros
in declarations other than ``CUDNNWINAPI``, ``CUDNN_DEPRECATED`` and
``CUDNN_DEPRECATED_ENUM``. Anything it does not recognise stops the generator
with an error naming the statement, so a future header cannot be mistranslated
silently.

Usage::

    python tools/gen_bindings.py            # write the module
    python tools/gen_bindings.py --check    # exit 1 if the committed file differs
    python tools/gen_bindings.py --stdout   # print instead of writing
"""

from __future__ import annotations

import argparse
import ast
import operator
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

HEADERS = ("cudnn_graph.h", "cudnn_ops.h", "cudnn_cnn.h", "cudnn_adv.h")
# Headers of the sub-libraries newer releases add (subquadratic ops since 9.22, GNN ops since 9.26): parsed
# when the wheel ships them.
OPTIONAL_HEADERS = ("cudnn_subquadratic_ops.h", "cudnn_gnn_ops.h")
VERSION_HEADER = "cudnn_version.h"
ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "src" / "cudnnkit" / "lib" / "_cudnn.py"

# C scalar types -> ctypes expression
SCALARS = {
    "int": "ctypes.c_int",
    "unsigned": "ctypes.c_uint",
    "unsigned int": "ctypes.c_uint",
    "long": "ctypes.c_long",
    "long long": "ctypes.c_longlong",
    "long long int": "ctypes.c_longlong",
    "unsigned long long": "ctypes.c_ulonglong",
    "unsigned long long int": "ctypes.c_ulonglong",
    "size_t": "ctypes.c_size_t",
    "int8_t": "ctypes.c_int8",
    "uint8_t": "ctypes.c_uint8",
    "int32_t": "ctypes.c_int32",
    "uint32_t": "ctypes.c_uint32",
    "int64_t": "ctypes.c_int64",
    "uint64_t": "ctypes.c_uint64",
    "float": "ctypes.c_float",
    "double": "ctypes.c_double",
    "char": "ctypes.c_char",
    # CUDA runtime types that cuDNN's headers use but do not define
    "cudaStream_t": "ctypes.c_void_p",
    "cudaGraph_t": "ctypes.c_void_p",
    "libraryPropertyType": "ctypes.c_int",  # enum from library_types.h
}


class HeaderError(Exception):
    pass


@dataclass
class Enum:
    name: str
    header: str
    members: list[tuple[str, int, bool]] = field(default_factory=list)  # name, value, deprecated
    deprecated: bool = False


@dataclass
class Struct:
    name: str
    header: str
    fields: list[tuple[str, str, int | None]]  # name, C type, array length
    deprecated: bool = False


@dataclass
class Opaque:
    name: str
    header: str
    c_decl: str
    deprecated: bool = False


@dataclass
class FuncPtr:
    name: str
    header: str
    restype: str
    params: list[tuple[str, str]]
    c_decl: str


@dataclass
class Function:
    name: str
    header: str
    restype: str
    params: list[tuple[str, str]]  # name, C type (with pointers, [] as *)
    c_decl: str
    deprecated: bool = False


@dataclass
class Parsed:
    version: tuple[int, int, int] = (0, 0, 0)
    headers: tuple[str, ...] = ()
    constants: dict[str, int | float] = field(default_factory=dict)
    constant_headers: dict[str, str] = field(default_factory=dict)
    enums: list[Enum] = field(default_factory=list)
    structs: list[Struct] = field(default_factory=list)
    opaques: list[Opaque] = field(default_factory=list)
    funcptrs: list[FuncPtr] = field(default_factory=list)
    functions: list[Function] = field(default_factory=list)


# ---------------------------------------------------------------- evaluation

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.floordiv,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
    ast.BitAnd: operator.and_,
    ast.BitXor: operator.xor,
}
_UNOPS = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}


def evaluate(expr: str, names: dict[str, int | float]) -> int | float:
    """Evaluate a C constant expression (integers, floats, names, + - * / << >> | & ~)."""
    text = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", expr.strip())
    text = re.sub(r"\(\s*cudnn\w+_t\s*\)", "", text)  # drop enum casts
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise HeaderError(f"cannot parse constant expression {expr!r}") from exc

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise HeaderError(f"unknown name {node.id!r} in {expr!r}")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
            return _UNOPS[type(node.op)](ev(node.operand))
        raise HeaderError(f"unsupported constant expression {expr!r}")

    return ev(tree)


# ---------------------------------------------------------------- lexing


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def preprocess(text: str, header: str, parsed: Parsed) -> str:
    """Drop preprocessor lines and C++-only blocks; record numeric #defines."""
    out: list[str] = []
    lines = iter(strip_comments(text).splitlines())
    for line in lines:
        s = line.strip()
        if s.startswith("#"):
            # join continuation lines
            while s.endswith("\\"):
                s = s[:-1] + " " + next(lines).strip()
            if re.match(r"#\s*if\s+defined\s*\(\s*__cplusplus\s*\)", s):
                for inner in lines:  # skip to the matching #endif (no nesting inside)
                    if re.match(r"\s*#\s*endif", inner):
                        break
                continue
            m = re.match(r"#\s*define\s+([A-Za-z_]\w*)\s+(.+)$", s)
            if m and not m.group(1).endswith("_H_"):
                name, value = m.group(1), m.group(2).strip()
                try:
                    parsed.constants[name] = evaluate(value, {**parsed.constants, **enum_values(parsed)})
                    parsed.constant_headers[name] = header
                except HeaderError:
                    pass  # non-numeric macro (CUDNNWINAPI, attribute macros)
            continue
        out.append(line)
    return "\n".join(out)


def enum_values(parsed: Parsed) -> dict[str, int]:
    return {n: v for e in parsed.enums for n, v, _ in e.members}


def statements(text: str) -> list[str]:
    """Split at ';' outside braces. Returns normalised single-line statements."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == ";" and depth == 0:
            stmt = " ".join("".join(cur).split())
            if stmt:
                out.append(stmt)
            cur = []
        else:
            cur.append(ch)
    if " ".join("".join(cur).split()):
        raise HeaderError(f"trailing text without ';': {''.join(cur)[:80]!r}")
    return out


# ---------------------------------------------------------------- parsing

DEPRECATED_MARK = "CUDNN_DEPRECATED"


def take_deprecated(s: str) -> tuple[str, bool]:
    dep = bool(re.search(r"\bCUDNN_DEPRECATED\b", s))
    return re.sub(r"\s*\bCUDNN_DEPRECATED\b\s*", " ", s).strip(), dep


def parse_param(p: str) -> tuple[str, str]:
    p = p.strip()
    m = re.match(r"^(.*?)([A-Za-z_]\w*)\s*(\[\s*\w*\s*\])?$", p)
    if not m or not m.group(1).strip():
        raise HeaderError(f"cannot parse parameter {p!r}")
    ctype = m.group(1).strip()
    if m.group(3):
        ctype += " *"
    return m.group(2), normalise_type(ctype)


def normalise_type(t: str) -> str:
    t = re.sub(r"\s*\*\s*", " *", t.strip())
    return " ".join(t.split()).replace("* *", "**")


def split_commas(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [x.strip() for x in out if x.strip()]


def parse_statement(stmt: str, header: str, parsed: Parsed) -> None:
    if re.fullmatch(r"struct \w+", stmt):
        return  # forward declaration
    m = re.fullmatch(r"typedef enum\s*\w*\s*\{(.*)\}\s*(\w+)\s*(CUDNN_DEPRECATED)?", stmt)
    if m:
        e = Enum(m.group(2), header, deprecated=bool(m.group(3)))
        known = {**parsed.constants, **enum_values(parsed)}
        nxt = 0
        for item in split_commas(m.group(1)):
            im = re.fullmatch(r"(\w+)\s*(CUDNN_DEPRECATED_ENUM)?\s*(?:=\s*(.+))?", item)
            if not im:
                raise HeaderError(f"cannot parse enum member {item!r} in {e.name}")
            value = int(evaluate(im.group(3), known)) if im.group(3) else nxt
            e.members.append((im.group(1), value, bool(im.group(2))))
            known[im.group(1)] = value
            nxt = value + 1
        parsed.enums.append(e)
        return
    m = re.fullmatch(r"typedef struct\s*\w*\s*\{(.*)\}\s*(\w+)\s*(CUDNN_DEPRECATED)?", stmt)
    if m:
        fields = []
        for f in m.group(1).split(";"):
            f = f.strip()
            if not f:
                continue
            fm = re.fullmatch(r"(.+?)\s*(\w+)\s*(?:\[\s*(\w+)\s*\])?", f)
            if not fm:
                raise HeaderError(f"cannot parse struct field {f!r}")
            n = fm.group(3)
            length = None if n is None else int(evaluate(n, parsed.constants))
            fields.append((fm.group(2), normalise_type(fm.group(1)), length))
        parsed.structs.append(Struct(m.group(2), header, fields, bool(m.group(3))))
        return
    m = re.fullmatch(r"typedef (struct \w+ ?\*|void ?\*|struct \w+) ?(\w+)\s*(CUDNN_DEPRECATED)?", stmt)
    if m:
        parsed.opaques.append(Opaque(m.group(2), header, stmt, bool(m.group(3))))
        return
    m = re.fullmatch(r"typedef (.+?)\(\s*\*\s*(\w+)\s*\)\s*\((.*)\)", stmt)
    if m:
        params = [parse_param(p) for p in split_commas(m.group(3)) if p != "void"]
        parsed.funcptrs.append(FuncPtr(m.group(2), header, normalise_type(m.group(1)), params, stmt))
        return
    body, dep = take_deprecated(stmt)
    m = re.fullmatch(r"(.+?)\s*CUDNNWINAPI\s+(\w+)\s*\((.*)\)", body)
    if m:
        params = [parse_param(p) for p in split_commas(m.group(3)) if p != "void"]
        c_decl = f"{normalise_type(m.group(1))} {m.group(2)}({', '.join(f'{t} {n}' for n, t in params)})"
        parsed.functions.append(Function(m.group(2), header, normalise_type(m.group(1)), params, c_decl, dep))
        return
    raise HeaderError(f"{header}: unrecognised statement {stmt[:120]!r}")


def headers_in(include_dir: Path) -> tuple[str, ...]:
    """The headers to parse in ``include_dir``: every one of :data:`HEADERS`, and the optional ones it has."""
    return HEADERS + tuple(h for h in OPTIONAL_HEADERS if (include_dir / h).exists())


def parse(include_dir: Path) -> Parsed:
    parsed = Parsed()
    preprocess((include_dir / VERSION_HEADER).read_text(), VERSION_HEADER, parsed)
    c = parsed.constants
    parsed.version = (int(c["CUDNN_MAJOR"]), int(c["CUDNN_MINOR"]), int(c["CUDNN_PATCHLEVEL"]))
    parsed.headers = headers_in(include_dir)
    for h in parsed.headers:
        text = preprocess((include_dir / h).read_text(), h, parsed)
        for stmt in statements(text):
            parse_statement(stmt, h, parsed)
            # enum values may be used by later #defines in the same header
    # second pass for #defines that reference enum members (CUDNN_SEV_*_EN)
    for h in parsed.headers:
        preprocess((include_dir / h).read_text(), h, parsed)
    return parsed


# ---------------------------------------------------------------- emitting


class TypeMapper:
    def __init__(self, parsed: Parsed):
        self.enums = {e.name for e in parsed.enums}
        self.structs = {s.name for s in parsed.structs}
        self.opaques = {o.name for o in parsed.opaques}
        # `typedef struct X X`: an incomplete struct, only ever used through a pointer
        self.incomplete = {o.name for o in parsed.opaques if "*" not in o.c_decl}
        self.funcptrs = {f.name for f in parsed.funcptrs}

    def __call__(self, ctype: str) -> str:
        t = ctype.replace("const ", "").replace(" const", "").strip()
        stars = t.count("*")
        base = t.replace("*", "").strip()
        if base == "char" and stars == 1:
            return "ctypes.c_char_p"
        if base == "void":
            if stars == 0:
                return "None"
            inner, stars = "ctypes.c_void_p", stars - 1
        elif base in SCALARS:
            inner = SCALARS[base]
        elif base in self.enums:
            inner = "ctypes.c_int"
        elif base in self.structs or base in self.funcptrs:
            inner = base
        elif base in self.incomplete and stars:
            inner, stars = "ctypes.c_void_p", stars - 1
        elif base in self.opaques:
            inner = "ctypes.c_void_p"
        else:
            raise HeaderError(f"no ctypes mapping for C type {ctype!r}")
        for _ in range(stars):
            inner = f"ctypes.POINTER({inner})"
        return inner


def emit(parsed: Parsed) -> str:
    tm = TypeMapper(parsed)
    v = ".".join(map(str, parsed.version))
    w: list[str] = []
    a = w.append
    a(f"# Generated by tools/gen_bindings.py from the cuDNN {v} headers. DO NOT MODIFY.")
    a("# Regenerate with `python tools/gen_bindings.py`; tests/test_bindings.py checks it.")
    a('"""Raw cuDNN declarations: constants, enums, structs and function prototypes.')
    a("")
    a("This module is data only. ``cudnnkit.lib`` resolves the functions lazily")
    a("against the loaded libcudnn and checks every ``cudnnStatus_t`` they return.")
    a('"""')
    a("")
    a("# ruff: noqa")
    a("from __future__ import annotations")
    a("")
    a("import ctypes")
    a("from enum import IntEnum")
    a("from typing import NamedTuple")
    a("")
    a(f"HEADER_VERSION = {parsed.version[0] * 10000 + parsed.version[1] * 100 + parsed.version[2]}")
    a(f'HEADER_VERSION_STRING = "{v}"')
    a(f"HEADERS = {(VERSION_HEADER, *parsed.headers)!r}")
    a("")
    a("")
    a("class Prototype(NamedTuple):")
    a('    """One C function: its ctypes restype, named ctypes argtypes, C declaration, header."""')
    a("")
    a("    restype: object")
    a("    args: tuple[tuple[str, object], ...]")
    a("    c_decl: str")
    a("    header: str")
    a("    deprecated: bool")
    a("    returns_status: bool")
    a("")
    a("")
    a("# ---- #define constants")
    for name, value in parsed.constants.items():
        a(f"{name} = {value!r}  # {parsed.constant_headers[name]}")
    a("")
    a("")
    a("# ---- enums")
    for e in parsed.enums:
        a("")
        a(f"class {e.name}(IntEnum):")
        a(f'    """``{e.name}`` ({e.header}){" -- deprecated" if e.deprecated else ""}."""')
        a("")
        for n, val, dep in e.members:
            a(f"    {n} = {val}" + ("  # deprecated" if dep else ""))
        a("")
    a("")
    a("ENUMS = (" + "".join(f"\n    {e.name}," for e in parsed.enums) + "\n)")
    a("")
    a("# ---- opaque handles (pointers to incomplete structs)")
    for o in parsed.opaques:
        a(f"{o.name} = ctypes.c_void_p  # {o.c_decl}")
    a("")
    a("# ---- structs")
    for s in parsed.structs:
        a("")
        a("")
        a(f"class {s.name}(ctypes.Structure):")
        a(f'    """``{s.name}`` ({s.header}){" -- deprecated" if s.deprecated else ""}."""')
        a("")
        a("    _fields_ = [")
        for fname, ftype, length in s.fields:
            ct = tm(ftype)
            if length is not None:
                ct = f"{ct} * {length}"
            a(f'        ("{fname}", {ct}),')
        a("    ]")
    a("")
    a("")
    a("# ---- function pointer types")
    for f in parsed.funcptrs:
        args = ", ".join(tm(t) for _, t in f.params)
        a(f"{f.name} = ctypes.CFUNCTYPE({tm(f.restype)}, {args})  # {f.c_decl}")
    a("")
    a("# ---- functions: name -> Prototype")
    a("FUNCTIONS: dict[str, Prototype] = {")
    for f in parsed.functions:
        status = f.restype == "cudnnStatus_t"
        restype = "ctypes.c_int" if status else tm(f.restype)
        a(f'    "{f.name}": Prototype(')
        a(f"        {restype},")
        if f.params:
            a("        (")
            for n, t in f.params:
                a(f'            ("{n}", {tm(t)}),')
            a("        ),")
        else:
            a("        (),")
        a(f'        "{f.c_decl}",')
        a(f'        "{f.header}",')
        a(f"        {f.deprecated},")
        a(f"        {status},")
        a("    ),")
    a("}")
    a("")
    dep: list[str] = [f.name for f in parsed.functions if f.deprecated]
    dep += [e.name for e in parsed.enums if e.deprecated]
    dep += [s.name for s in parsed.structs if s.deprecated]
    dep += [o.name for o in parsed.opaques if o.deprecated]
    dep += [n for e in parsed.enums for n, _, d in e.members if d]
    a("# ---- names the headers mark CUDNN_DEPRECATED / CUDNN_DEPRECATED_ENUM")
    a("DEPRECATED: frozenset[str] = frozenset({" + "".join(f'\n    "{n}",' for n in sorted(dep)) + "\n})")
    a("")
    return "\n".join(w)


# ---------------------------------------------------------------- entry


def find_include_dir() -> Path:
    """The include folder of the installed nvidia-cudnn wheel (cu13, then cu12)."""
    import importlib.util

    for pkg in ("nvidia.cudnn",):
        try:
            spec = importlib.util.find_spec(pkg)
        except ModuleNotFoundError:
            spec = None
        if spec and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                inc = Path(loc) / "include"
                if (inc / "cudnn_graph.h").exists():
                    return inc
    raise SystemExit("cuDNN headers not found: install nvidia-cudnn-cu13 (or pass --include DIR)")


def generate(include_dir: Path | None = None) -> str:
    return emit(parse(include_dir or find_include_dir()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--include", type=Path, help="folder holding the cuDNN headers")
    ap.add_argument("--check", action="store_true", help="compare with the committed file")
    ap.add_argument("--stdout", action="store_true", help="print instead of writing")
    ns = ap.parse_args(argv)
    text = generate(ns.include)
    if ns.stdout:
        sys.stdout.write(text)
    elif ns.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is out of date; run tools/gen_bindings.py", file=sys.stderr)
            return 1
        print(f"{OUTPUT} is up to date")
    else:
        OUTPUT.write_text(text)
        print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
