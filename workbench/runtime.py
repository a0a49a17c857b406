"""Registering built libraries with torch: open one, define its ops, add its kernels and the
spec's Python (fake function, autograd formula); and importing an ahead-of-time package.

Self-contained on purpose (torch, ctypes and the standard library only): the JIT loader
(:mod:`workbench.loader`) uses it for every build it swaps in, and a wheel made by ``wb wheel``
(:mod:`workbench.ship`) carries a copy of this file as ``<package>/_runtime.py``. An installed
wheel thus registers its ops with the same code as the JIT, and imports nothing of the
workbench: no compiler, no ninja, no cache.
"""

from __future__ import annotations

import _ctypes
import ctypes
import functools
import importlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

# The meaning of the libraries' C entry points (bindings/registry.cpp, wb_abi_version).
ABI_VERSION = 9
# What an ahead-of-time package records about its build, beside its __init__.py.
BUILD_INFO = "_build.json"


class VersionError(RuntimeError):
    """A library whose entry points are of another version than this runtime's."""


def op_name(schema: str) -> str:
    return schema.split("(", 1)[0].split(".", 1)[0].strip()


def open_library(
    path: str | os.PathLike[str],
) -> tuple[ctypes.CDLL, dict[str, str], frozenset[str]]:
    """Open a built library (RTLD_LOCAL: it binds to nobody); its schemas by op name and the
    ops to which it gives a C++ autograd kernel (``WB_AUTOGRAD``), read by one call
    (``wb_describe``).

    Opening registers nothing. Raises OSError when the loader refuses the file.
    """
    cdll = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    try:
        describe = cdll.wb_describe
    except AttributeError:  # a library older than the call: its version says so
        describe = None
    lines = _describe(describe).splitlines() if describe is not None else []
    version = int(lines[0]) if lines else cdll.wb_abi_version()
    if version != ABI_VERSION:
        _ctypes.dlclose(cdll._handle)
        raise VersionError(f"{path} has entry-point version {version}, want {ABI_VERSION}")
    # Each other entry point gets its types where it is called: looking one up costs a dlsym and
    # a Python object, and most of them are never called in a process.
    schemas, autograd = {}, set()
    for line in lines[1:]:
        kind, _, text = line.partition("\t")
        if kind == "schema":
            schemas[op_name(text)] = text
        elif kind == "autograd":
            autograd.add(text)
    return cdll, schemas, frozenset(autograd)


def _describe(describe: Any) -> str:
    describe.restype = ctypes.c_char_p
    describe.argtypes = []
    return str(describe().decode())


class AutogradError(RuntimeError):
    """An op's spec and its library disagree about who differentiates it."""


def check_autograd(spec: Any, op: str, cpp_autograd: bool) -> None:
    """Raise AutogradError unless ``spec`` (or None) agrees with the library on op's autograd.

    An op has one autograd kernel: the spec's Python formula (``OpSpec.backward``), registered
    by :func:`register_python`, or the library's C++ one (``WB_AUTOGRAD``, registered with its
    other kernels), which the spec declares with ``OpSpec.cpp_autograd`` so that the check's
    gradcheck and ``wb bench --backward`` know the op is differentiable.
    """
    if spec is None:
        return
    declared = bool(getattr(spec, "cpp_autograd", False))
    if cpp_autograd == declared and not (cpp_autograd and spec.backward is not None):
        return  # agreed (the spec's reference, named below, is not looked up: it may import)
    code = getattr(spec.reference, "__code__", None)
    where = f"its spec ({code.co_filename})" if code is not None else "its spec"
    if cpp_autograd and spec.backward is not None:
        raise AutogradError(
            f"op {op}: {where} declares a Python backward (OpSpec.backward), but its library "
            "registers a C++ autograd kernel for it (WB_AUTOGRAD in its binding); an op has one "
            "autograd kernel: remove backward= and setup_context= from the OpSpec and set "
            "cpp_autograd=True, or remove the WB_AUTOGRAD line"
        )
    if cpp_autograd and not declared:
        raise AutogradError(
            f"op {op}: its library registers a C++ autograd kernel (WB_AUTOGRAD in its binding), "
            f"but {where} does not declare it: set cpp_autograd=True in its OpSpec (the check's "
            "gradcheck and `wb bench --backward` read it)"
        )
    if declared and not cpp_autograd:
        raise AutogradError(
            f"op {op}: {where} sets cpp_autograd=True, but its library registers no C++ "
            f'autograd kernel for it: add WB_AUTOGRAD("{op}", ...) to its binding (wb/autograd.h), '
            "or drop cpp_autograd and give the spec a Python backward"
        )


def register_kernels(cdll: ctypes.CDLL, ns: str) -> str | None:
    """Add the library's kernels under ``ns`` (``wb_register``): None, or the library's error."""
    err = ctypes.create_string_buffer(8192)
    cdll.wb_register.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    if cdll.wb_register(ns.encode(), err, len(err)) != 0:
        return err.value.decode()
    return None


def gate_autograd(cdll: ctypes.CDLL, ns: str) -> str | None:
    """Make the library's autograd gates under ``ns`` again (``wb_autograd_gate``), after its ops'
    Python registrations were made anew: None, or the library's error."""
    err = ctypes.create_string_buffer(8192)
    cdll.wb_autograd_gate.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    if cdll.wb_autograd_gate(ns.encode(), err, len(err)) != 0:
        return err.value.decode()
    return None


def register_autograd(cdll: ctypes.CDLL, ns: str) -> str | None:
    """Add only the library's C++ autograd kernels under ``ns`` (``wb_register_autograd``): the
    public namespace of a routed family, whose other kernels are routers. None, or the error."""
    err = ctypes.create_string_buffer(8192)
    cdll.wb_register_autograd.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    if cdll.wb_register_autograd(ns.encode(), err, len(err)) != 0:
        return err.value.decode()
    return None


_INTS, _TEXTS = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_char_p)
# wb_module_load(file, count, majors, minors, specific, paths, lowered, err, err_size)
_MODULE_LOAD_TYPES: list[Any] = [ctypes.c_char_p, ctypes.c_int, _INTS, _INTS, _INTS]
_MODULE_LOAD_TYPES += [_TEXTS, _TEXTS, ctypes.c_char_p, ctypes.c_size_t]


@functools.cache  # every image of every module of a load names one of a few
def _arch_numbers(arch: str) -> tuple[int, int, int]:
    """sm_90a -> (9, 0, 1); sm_120 -> (12, 0, 0); sm_86 -> (8, 6, 0)."""
    m = re.fullmatch(r"sm_(\d+)(\d)([af]?)", arch)
    if m is None:
        raise ValueError(f"not a GPU architecture: {arch}")
    return int(m.group(1)), int(m.group(2)), int(bool(m.group(3)))


def load_module(
    cdll: ctypes.CDLL, file: str, images: list[tuple[str, str, dict[str, str]]]
) -> str | None:
    """Make ``images`` the live module of device-only TU ``file`` (``wb_module_load``).

    Each image: its architecture ("sm_90a"), the cubin's path (the library reads it at the first
    launch that needs it), and the mangled name of each kernel expression. None, or the
    library's error.
    """
    n = len(images)
    ints = ctypes.c_int * n
    numbers = [_arch_numbers(arch) for arch, _, _ in images]
    columns = list(zip(*numbers, strict=True)) or [(), (), ()]
    majors, minors, specific = (ints(*column) for column in columns)
    paths = (ctypes.c_char_p * n)(*[os.fsencode(path) for _, path, _ in images])
    lowered = (ctypes.c_char_p * n)(
        *["".join(f"{k}\t{v}\n" for k, v in names.items()).encode() for _, _, names in images]
    )
    err = ctypes.create_string_buffer(2048)
    cdll.wb_module_load.argtypes = _MODULE_LOAD_TYPES
    status = cdll.wb_module_load(
        file.encode(), n, majors, minors, specific, paths, lowered, err, len(err)
    )
    return err.value.decode() if status != 0 else None


def route(
    cdll: ctypes.CDLL, ns: str, op: str, key: str, arg: int, fallback: str, tables: str
) -> str | None:
    """Register a router as ``ns::op``'s kernel for dispatch key ``key`` (``wb_route``).

    ``tables``: one line per (device, dtype), ``device \\t dtype \\t bounds \\t namespaces``
    (bounds and namespaces comma-separated, one more namespace than bounds); ``fallback``: the
    namespace that serves calls no table matches. None, or the library's error.
    """
    err = ctypes.create_string_buffer(8192)
    cdll.wb_route.argtypes = [
        *(ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int),
        *(ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t),
    ]
    args = (ns, op, key)
    if cdll.wb_route(*(a.encode() for a in args), arg, fallback.encode(), tables.encode(),
                     err, len(err)) != 0:  # fmt: skip
        return err.value.decode()
    return None


def define(ns: str, schema: str) -> torch.library.Library:
    """Define one op from Python; the op lives as long as the returned object."""
    definition = torch.library.Library(ns, "FRAGMENT")
    definition.define(schema)
    return definition


def register_python(ns: str, spec: Any, schema: str) -> torch.library.Library:
    """Register an OpSpec's fake function and, when it has one, its autograd formula (an op
    with a C++ autograd kernel has none: :func:`check_autograd` refuses a spec that gives one).

    An op that returns one of the arguments it writes (``scale_(Tensor(a!) x, float s) ->
    Tensor(a!)``) gets a functional twin instead of a fake function (see :func:`returns_alias`);
    ``spec`` may then be None.
    """
    lib = torch.library.Library(ns, "FRAGMENT")
    name = op_name(schema)
    qualname = f"{ns}::{name}"
    if returns_alias(schema):
        _register_functional_twin(lib, ns, name, schema, getattr(spec, "fake", None))
    else:
        _register_fake(lib, qualname, spec.fake)
    if spec is not None and spec.backward is not None:
        ops = getattr(torch.ops, ns)
        user_setup = spec.setup_context

        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            ctx.ops = ops
            if user_setup is not None:
                user_setup(ctx, inputs, output)

        _register_autograd(lib, qualname, schema, spec.backward, setup_context)
    return lib


def autograd_twin(name: str) -> str:
    """The op that carries ``name``'s Python formula for its library's gate (``wb_register``,
    bindings/registry.cpp): the gate, a C++ Autograd kernel, sends there the calls that need a
    gradient and every other call straight below autograd."""
    return f"_wb_autograd_{name}"  # a prefix no user op takes: the gate finds its twin by name


def returns_alias(schema: str) -> bool:
    """Whether the op returns an argument it writes into (a return with an alias annotation).

    torch.compile cannot functionalize such a custom op by itself (it refuses returns with alias
    annotations); :func:`_register_functional_twin` gives it the way.
    """
    if "Tensor(" not in schema.rsplit("->", 1)[-1]:
        return False
    return any(r.alias_info is not None for r in torch._C.parse_schema(schema).returns)


def _strip_aliases(text: str) -> str:
    return re.sub(r"Tensor\([a-z0-9.]+!?\)", "Tensor", text)


def _register_functional_twin(
    lib: torch.library.Library, ns: str, name: str, schema: str, fake: Any
) -> None:
    """Make an op that returns an argument it writes traceable by torch.compile and opcheck.

    The twin ``<name>_functional`` takes the same arguments, none of them written, and returns
    the new values of the written ones (then the op's other returns): it calls the op on copies.
    The op itself gets a CompositeImplicitAutograd kernel, "call the twin, copy its results into
    the written arguments, return them", which is what torch.compile and opcheck trace (and
    functionalize: the twin is functional, ``copy_`` is ATen's), and which the CPU and CUDA
    kernels of the op take precedence over when it runs eagerly. The op's fake function (the
    spec's ``fake``; torch allows none on an op with a composite kernel) runs inside the twin's,
    for its checks and its other returns.
    """
    parsed = torch._C.parse_schema(schema)
    args = list(parsed.arguments)
    written = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    by_set = {tuple(args[i].alias_info.before_set): i for i in written}  # type: ignore[union-attr]
    returns = [by_set.get(tuple(r.alias_info.before_set)) if r.alias_info else None
               for r in parsed.returns]  # fmt: skip
    others = [str(r.type) for r, i in zip(parsed.returns, returns, strict=True) if i is None]
    head = schema.rsplit("->", 1)[0].strip()
    twin = f"{name}_functional"
    twin_head = _strip_aliases(twin + head[len(name) :])
    outs = ["Tensor"] * len(written) + others
    lib.define(
        f"{twin_head} -> ({', '.join(outs)})" if len(outs) != 1 else f"{twin_head} -> Tensor"
    )
    op = getattr(getattr(torch.ops, ns), name)
    twin_op = getattr(getattr(torch.ops, ns), twin)

    def bind(a: tuple[Any, ...], kw: dict[str, Any]) -> list[Any]:
        """Every argument in schema order (defaults filled in)."""
        it = iter(a)
        return [
            kw.get(arg.name, arg.default_value) if arg.kwarg_only else next(it, arg.default_value)
            for arg in args
        ]

    def split(values: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        pos = [v for v, arg in zip(values, args, strict=True) if not arg.kwarg_only]
        return pos, {arg.name: v for v, arg in zip(values, args, strict=True) if arg.kwarg_only}

    def twin_kernel(*a: Any, **kw: Any) -> Any:
        values = bind(a, kw)
        for i in written:
            values[i] = _layout_copy(values[i])
        pa, pk = split(values)
        result = op(*pa, **pk)
        extra = [r for r, i in zip(_as_list(result), returns, strict=False) if i is None]
        outs = [values[i] for i in written] + extra
        return outs[0] if len(outs) == 1 else tuple(outs)

    def twin_fake(*a: Any, **kw: Any) -> Any:
        values = bind(a, kw)
        result = fake(*a, **kw) if fake is not None else None
        extra = [r for r, i in zip(_as_list(result), returns, strict=False) if i is None]
        outs = [_like(values[i]) for i in written] + extra
        return outs[0] if len(outs) == 1 else tuple(outs)

    def composite(*a: Any, **kw: Any) -> Any:
        values = bind(a, kw)
        new = _as_list(twin_op(*a, **kw))
        for k, i in enumerate(written):
            values[i].copy_(new[k])
        extra = iter(new[len(written) :])
        rets = [values[i] if i is not None else next(extra) for i in returns]
        return None if not rets else rets[0] if len(rets) == 1 else tuple(rets)

    lib.impl(twin, twin_kernel, "CompositeExplicitAutograd")
    _register_fake(lib, f"{ns}::{twin}", twin_fake)
    lib.impl(name, composite, "CompositeImplicitAutograd")


def _as_list(x: Any) -> list[Any]:
    if x is None:
        return []
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _layout_copy(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)


def source_of(fn: Any) -> str:
    """``file:line`` of a function, as torch names a fake function in its errors; a stand-in of
    ``workbench.specfile`` carries its spec function's own (``wb_source``)."""
    source = getattr(fn, "wb_source", None)
    if source is not None:
        return str(source)
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else repr(fn)


def _register_fake(lib: torch.library.Library, qualname: str, fake: Any) -> None:
    """``torch.library.register_fake(qualname, fake, lib=lib)``, without its caller lookup.

    torch looks up its caller's source line and module with ``inspect`` (a third of the cost of
    loading an op) to name them in error messages; the fake function's own location is named
    here instead. Where torch's internals differ, torch's function is called.
    """
    source = source_of(fake)
    try:
        holder = torch._library.simple_registry.singleton.find(qualname).fake_impl
        handle = holder.register(fake, source, lib=lib)
    except (AttributeError, TypeError):
        torch.library.register_fake(qualname, fake, lib=lib)
        return
    lib._registration_handles.append(handle)


def _register_autograd(
    lib: torch.library.Library, qualname: str, schema: str, backward: Any, setup_context: Any
) -> None:
    """``torch.library.register_autograd``, with torch's autograd kernel made on first call.

    Making it (an ``autograd.Function`` subclass and a dataclass per op) is most of the cost of
    loading an op, and most ops of a registry are never differentiated in a given process. The
    kernel registered here makes torch's own (``make_autograd_impl``, what register_autograd
    registers) the first time it runs and then calls it, so autograd behaves exactly as torch's.
    Where torch's internals differ, or the op is one torch refuses, torch's function is called.
    """
    try:
        from torch._library import autograd as torch_autograd
        from torch._library import utils

        # The checks register_autograd makes, on the schema alone: looking the op up costs as
        # much as the rest. (Its out= check needs tags, which WB_DEF never gives.)
        parsed = torch._C.parse_schema(schema)
        kwarg_only_tensors = getattr(utils, "has_kwarg_only_tensors", lambda schema: False)
        refused = not utils.is_functional_schema(parsed) or kwarg_only_tensors(parsed)
        make, info = torch_autograd.make_autograd_impl, torch_autograd.Info(backward, setup_context)
    except (ImportError, AttributeError, TypeError):
        refused = True
    if refused:  # torch raises its own error for an op it refuses (and it gets no gate)
        torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=lib)
        return
    name = qualname.split("::", 1)[1]
    # The twin: the op's schema under another name, with the kernel below (the op's) as its only
    # one: the gate calls it at the Autograd key alone. An overloaded name gets none (no gate).
    head, args = schema.split("(", 1)
    twin = autograd_twin(name) if "." not in head else None
    if twin is not None:
        lib.define(f"{twin}({args}")
    impl: Any = None
    op: Any = None
    grad_enabled, below = torch._C.is_grad_enabled, torch._C._AutoDispatchBelowAutograd
    after_autograd = torch._C._after_autograd_keyset

    def autograd_kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal impl, op
        if op is None:
            op = utils.lookup_op(qualname)
        # Where no input needs a gradient, what torch's kernel runs then (its forward_no_grad),
        # without its layers: every eager call of the op passes here, and those layers cost a
        # few microseconds a call. (An out= op whose out requires grad goes on to torch's kernel,
        # which refuses it as torch does.)
        if not (grad_enabled() and _any_requires_grad(*args, **kwargs)):
            with below():
                return op.redispatch(keyset & after_autograd, *args, **kwargs)
        if impl is None:
            impl = make(op, info)
        return impl(keyset, *args, **kwargs)

    lib.impl(name, autograd_kernel, "Autograd", with_keyset=True)  # where no gate is
    if twin is not None:
        lib.impl(twin, autograd_kernel, "Autograd", with_keyset=True)


def _any_tensor_requires_grad(*args: Any, **kwargs: Any) -> bool:
    """Whether a tensor argument, or a tensor of a list argument, requires grad: torch's
    ``_C._any_requires_grad``, for a torch that lacks it."""
    for a in (*args, *kwargs.values()):
        items = a if isinstance(a, (list, tuple)) else (a,)
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in items):
            return True
    return False


_any_requires_grad = getattr(torch._C, "_any_requires_grad", _any_tensor_requires_grad)


# An ahead-of-time package (what ``wb wheel`` ships):
#   <package>/__init__.py        calls load_package(__name__, its folder)
#   <package>/_runtime.py        this file
#   <package>/_spec.py           workbench/spec.py (OpSpec and the sample helpers)
#   <package>/_specs/<family>.py each family's spec.py, importing from ``.._spec``
#   <package>/_lib/*.so          the libraries, as the workbench's cache holds them
#   <package>/_build.json        BUILD_INFO: namespace, torch, CUDA, archs, families


class Package:
    """An imported ahead-of-time package: its ops live under ``torch.ops.<namespace>``."""

    def __init__(self, name: str, info: dict[str, Any]) -> None:
        self.name = name
        self.info = info
        self.namespace: str = info["namespace"]
        self.specs: dict[str, Any] = {}  # op name -> OpSpec
        self.ops: list[str] = []
        # The libraries and the torch.library.Library objects that hold the registrations: an
        # op is removed when its Library object is collected, so they live with the package.
        self._keep: list[Any] = []

    def op(self, name: str) -> Any:
        if name not in self.ops:
            raise AttributeError(f"module {self.name!r} has no op {name!r}; ops: {self.ops}")
        return getattr(getattr(torch.ops, self.namespace), name)


def load_package(package: str, folder: str | os.PathLike[str]) -> Package:
    """Check the torch in this process against the recorded one, then register every family."""
    root = Path(folder)
    info = json.loads((root / BUILD_INFO).read_text())
    check_torch(package, info)
    loaded = Package(package, info)
    ns = loaded.namespace
    for family in info["families"]:
        specs: dict[str, Any] = {}
        if family["spec"]:
            module = importlib.import_module(f"{package}._specs.{family['name']}")
            specs = {s.name: s for s in getattr(module, "OPS", [])}
        try:
            cdll, schemas, autograd = open_library(root / family["library"])
        except (OSError, VersionError) as e:
            raise ImportError(f"{package}: cannot open the library of {family['name']}: {e}") from e
        loaded._keep.append(cdll)
        for module in family.get("modules", []):  # device-only TUs: their cubins, per arch
            images = [(i["arch"], str(root / i["cubin"]), i["lowered"]) for i in module["images"]]
            error = load_module(cdll, module["file"], images)
            if error is not None:
                raise ImportError(f"{package}: loading {module['file']}: {error}")
        for name, schema in schemas.items():
            try:
                check_autograd(specs.get(name), name, name in autograd)
            except AutogradError as e:
                raise ImportError(f"{package}: {e}") from e
            loaded._keep.append(define(ns, schema))
            if name in specs or returns_alias(schema):
                loaded._keep.append(register_python(ns, specs.get(name), schema))
        error = register_kernels(cdll, ns)
        if error is not None:
            raise ImportError(f"{package}: registering the kernels of {family['name']}: {error}")
        loaded.specs.update(specs)
        loaded.ops += schemas
    return loaded


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def check_torch(package: str, info: dict[str, Any]) -> None:
    """Raise ImportError unless this torch is the one the package was built against.

    The libraries call torch's C++ API, which has no stable ABI: the torch release must be the
    same (a local tag such as ``+cpu`` or ``+cu130`` may differ), and so must the C++11 ABI
    flag; a package with CUDA kernels also needs the same CUDA version (its libraries link the
    CUDA runtime torch loads).
    """
    built = info["torch"]
    cuda = "cuda" in info["devices"]
    version, cuda_version = torch.__version__, torch.version.cuda
    cxx11_abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    if (
        _public(built["version"]) == _public(version)
        and built["cxx11_abi"] == cxx11_abi
        and (not cuda or built["cuda"] == cuda_version)
    ):
        return
    archs = ", ".join(info["archs"]) or "none"
    raise ImportError(
        f"{package} was built for torch {built['version']} (CUDA {built['cuda'] or 'none'}, "
        f"archs {archs}, C++11 ABI {int(built['cxx11_abi'])}), but this environment has torch "
        f"{version} (CUDA {cuda_version or 'none'}, C++11 ABI {int(cxx11_abi)}). "
        "Its libraries use torch's C++ ABI, which changes between releases: install "
        f"torch=={_public(built['version'])}"
        + (f" built for CUDA {built['cuda']}" if cuda else "")
        + ", or build the wheel again against this torch with `wb wheel`"
    )
