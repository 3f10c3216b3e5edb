"""What an exercise's hidden tests reach in the student's code, read without running it,
and what on that path the reader cannot vouch for (flagged for review, never a point).

The path starts at the exercise's definition and follows every name it loads from the
notebook's scope to the student's definition of that name, scopes resolved: a name a
function binds itself (a parameter, a local ``out``) is not the module's. The course's
given cells are the course's code: their imports name modules, their definitions are not
followed. Top-level statements that change an object other than a plain name
(``torch.Tensor.f = ...``, ``setattr(...)``, ``globals()[...] = ...``) are on every path:
whatever the tests call may reach what they change.

On the path, the reader fails closed. It reports:

- a lookup by a name that is not a literal (``getattr(F, name)``, ``vars``, ``globals``,
  ``__dict__``, ``__import__``, ``operator.attrgetter(name)``...);
- a module outside the chapter's allowlist (``NAMESPACES``), PyTorch's private names
  (``torch._C``), and any module other than a few harmless ones;
- functions or code objects built at run time (``exec``, ``eval`` and ``compile`` of
  anything but a string literal, ``__code__``, ``types.FunctionType``);
- raw memory (``data_ptr``, ``untyped_storage``, ``__array_interface__``);
- a name that no cell defines and Python does not provide (put there at run time).

A string literal given to ``eval``, ``exec`` or ``compile`` is read as the code it is.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import inspect
import sys
import types
from collections.abc import Iterator

# Modules every chapter's exercises may use: PyTorch's public tensor maths and
# training, and a few standard modules that reach nothing. A name ending in ".*"
# allows its submodules too.
COMMON = frozenset(
    {
        "torch",
        "torch.nn",
        "torch.nn.functional",
        "torch.nn.init",
        "torch.nn.parameter",
        "torch.nn.utils",
        "torch.linalg",
        "torch.special",
        "torch.fft",
        "torch.autograd",
        "torch.optim",
        "torch.optim.lr_scheduler",
        "torch.utils.data",
        "torch.cuda",
        "torch.mps",
        "torch.amp",
        "torch.random",
        "torch.types",
        "torch.testing",
        "torch.backends.*",
        "math",
        "cmath",
        "numbers",
        "functools",
        "itertools",
        "collections",
        "collections.abc",
        "typing",
        "dataclasses",
        "abc",
        "enum",
        "warnings",
        "contextlib",
        "operator",
        "random",
        "statistics",
        "time",
        "copy",
        "string",
        "numpy.*",
        "einops.*",
        "logging",
    }
)
# Modules that reach anything (``sys.modules``, ``os.system``), of which an exercise may
# use only these harmless names.
HARMLESS_NAMES = {
    "sys": frozenset(
        {"float_info", "maxsize", "version_info", "platform", "stdout", "stderr"}
    ),
    "os": frozenset({"environ", "getenv", "cpu_count", "path", "sep"}),
}
# What a chapter's exercises need beyond the common modules.
EXTRA: dict[str, frozenset[str]] = {
    "11_kernels": frozenset({"triton", "triton.language.*", "triton.testing"}),
}


def namespaces(chapter: str | None) -> frozenset[str]:
    """The modules ``chapter``'s exercises may reach."""
    return COMMON | EXTRA.get(chapter or "", frozenset())


# Builtins the path may not call: lookups by a built name, code built at run time.
_BUILTIN_LOOKUPS = {
    "vars": "looks names up in a namespace (vars)",
    "globals": "looks names up in the notebook's namespace (globals)",
    "locals": "looks names up in a namespace (locals)",
    "__import__": "imports by a name built at run time (__import__)",
}
_BY_NAME = {
    "getattr",
    "setattr",
    "delattr",
}  # their second argument: a literal, or flag
_ATTRGETTERS = {"attrgetter", "methodcaller"}  # operator's lookups by name
# Attributes that reach what the reader cannot follow.
_ATTRIBUTES = {
    "__dict__": "looks names up in a namespace (__dict__)",
    "__getattribute__": "looks names up by a name built at run time (__getattribute__)",
    "__builtins__": "reaches Python's builtins (__builtins__)",
    "__globals__": "reaches a function's namespace (__globals__)",
    "__code__": "reaches code objects (__code__)",
    "__closure__": "reaches a function's cells (__closure__)",
    "__defaults__": "edits a function's defaults (__defaults__)",
    "__kwdefaults__": "edits a function's defaults (__kwdefaults__)",
    "__wrapped__": "reaches a wrapped function (__wrapped__)",
    "__subclasses__": "walks the class tree (__subclasses__)",
    "__mro__": "walks the class tree (__mro__)",
    "__bases__": "walks the class tree (__bases__)",
    "__base__": "walks the class tree (__base__)",
    "f_globals": "reaches a frame's namespace (f_globals)",
    "f_locals": "reaches a frame's namespace (f_locals)",
    "f_back": "reaches a caller's frame (f_back)",
    "gi_frame": "reaches a frame (gi_frame)",
    "tb_frame": "reaches a frame (tb_frame)",
    "data_ptr": "takes raw pointers (data_ptr)",
    "untyped_storage": "reaches tensor storage (untyped_storage)",
    "_typed_storage": "reaches tensor storage (_typed_storage)",
    "__array_interface__": "reads raw memory (__array_interface__)",
    "__cuda_array_interface__": "reads raw memory (__cuda_array_interface__)",
    "__dlpack__": "shares raw memory (__dlpack__)",
}
# Names IPython puts in the notebook's namespace.
_IPYTHON_NAMES = {"display", "In", "Out", "_", "__", "___", "exit", "quit"}


class Found(list):
    """What the reader reports on a path: sentences, each once, in order."""

    def add(self, what: str) -> None:
        if what not in self:
            self.append(what)


# Scopes resolved.

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _arguments(args: ast.arguments) -> set[str]:
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    return {a.arg for a in every}


def _own_statements(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of a function's body but what nested scopes hold (their names, their
    decorators and defaults, which the function evaluates, are kept)."""
    todo = list(body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            todo += node.decorator_list + node.args.defaults
            todo += [d for d in node.args.kw_defaults if d is not None]
        elif isinstance(node, ast.ClassDef):
            todo += node.decorator_list + node.bases + [k.value for k in node.keywords]
        elif isinstance(node, ast.Lambda):
            todo += node.args.defaults
        elif isinstance(node, _COMPREHENSIONS):
            todo.append(node.generators[0].iter)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _locals_of(function: ast.AST) -> set[str]:
    """The names ``function`` binds in its own scope (not declared global)."""
    names = _arguments(function.args)
    if isinstance(function, ast.Lambda):
        return names
    declared_global = set()
    for node in _own_statements(function.body):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.Global):
            declared_global.update(node.names)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
    return names - declared_global


def module_scope_names(node: ast.AST) -> Iterator[ast.Name]:
    """Every ``Name`` under ``node`` (a top-level statement) that Python looks up in the
    notebook's scope, loads and stores: a function's own names are its own. Iterative:
    code nested thousands deep is read like any other."""
    todo = [(node, frozenset())]
    while todo:
        sub, local = todo.pop()
        if isinstance(sub, ast.Name):
            if sub.id not in local:
                yield sub
        elif isinstance(sub, _FUNCTIONS):
            outer = list(sub.args.defaults) + [d for d in sub.args.kw_defaults if d]
            if not isinstance(sub, ast.Lambda):
                outer += sub.decorator_list
                if sub.returns is not None:
                    outer.append(sub.returns)
            todo += [(o, local) for o in outer]
            inner = local | _locals_of(sub)
            body = [sub.body] if isinstance(sub, ast.Lambda) else sub.body
            todo += [(statement, inner) for statement in body]
        elif isinstance(sub, ast.ClassDef):
            outer = sub.decorator_list + sub.bases + [k.value for k in sub.keywords]
            # a class body's names are not seen by its methods: the enclosing scope's are
            todo += [(o, local) for o in [*outer, *sub.body]]
        elif isinstance(sub, _COMPREHENSIONS):
            bound = set()
            for generator in sub.generators:
                bound |= {
                    n.id for n in ast.walk(generator.target) if isinstance(n, ast.Name)
                }
            inner = local | bound
            todo.append((sub.generators[0].iter, local))
            rest = [g.iter for g in sub.generators[1:]]
            rest += [c for g in sub.generators for c in g.ifs]
            rest += [sub.key, sub.value] if isinstance(sub, ast.DictComp) else [sub.elt]
            todo += [(r, inner) for r in rest]
        else:
            todo += [(child, local) for child in ast.iter_child_nodes(sub)]


# Modules, resolved.


def _import_targets(node: ast.AST) -> dict[str, str]:
    """The dotted path each name an import binds stands for."""
    found = {}
    if isinstance(node, ast.Import):
        for a in node.names:
            found[a.asname or a.name.split(".")[0]] = (
                a.name if a.asname else a.name.split(".")[0]
            )
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for a in node.names:
            if a.name != "*":
                found[a.asname or a.name] = f"{node.module}.{a.name}"
    return found


def _chain(node: ast.AST) -> tuple[ast.Name, list[str]] | None:
    """``a.b.c`` (and ``getattr(a.b, "c")``) as its root name and attribute names."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            parts.append(node.args[1].value)
            node = node.args[0]
        elif isinstance(node, ast.Name):
            return node, parts[::-1]
        else:
            return None


@functools.lru_cache(maxsize=4096)
def _is_module(path: str) -> bool | None:
    """Whether ``path`` (``torch.ao``) names a module: True, False, or None where the
    reader cannot tell. Its parent, an allowed module, is imported if it is not yet;
    nothing else is."""
    parent, _, name = path.rpartition(".")
    try:
        owner = sys.modules.get(parent) or importlib.import_module(parent)
    except Exception:  # noqa: BLE001 (not installed, or broken: the reader cannot tell)
        return None
    try:
        value = inspect.getattr_static(owner, name)
    except AttributeError:
        pass
    else:
        return isinstance(value, types.ModuleType)
    if path in sys.modules:
        return True
    try:  # a submodule not imported yet (the parent is: nothing is run)
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError, AttributeError):
        return None


def _allowed(module: str, allowed: frozenset[str]) -> bool:
    if module in allowed:
        return True
    parts = module.split(".")
    return any(".".join(parts[:i]) + ".*" in allowed for i in range(1, len(parts) + 1))


def namespace_problem(path: str, allowed: frozenset[str]) -> str | None:
    """What is wrong with reaching ``path`` (a dotted name rooted at a module), or None.
    Every module along ``path`` must be allowed, and no name under a module may be
    private (``torch._C``)."""
    parts = path.split(".")
    if len(parts) > 1 and parts[1] in HARMLESS_NAMES.get(parts[0], ()):
        return None
    if not _allowed(parts[0], allowed):
        return f"uses the module `{parts[0]}`, which no exercise of this chapter needs"
    module = parts[0]
    for name in parts[1:]:
        if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
            return f"reaches `{module}.{name}`, a private part of `{module}`"
        child = f"{module}.{name}"
        if not _allowed(child, allowed):
            kind = _is_module(child)
            if kind is None:
                return f"reaches `{child}`, which the reader cannot resolve"
            if kind:
                return f"reaches `{child}`, which no exercise of this chapter needs"
            return None  # a function, class or constant of an allowed module
        module = child
    return None


# The path.


class Reader:
    """The student's cells (``sources``) and the course's (``given``), read once."""

    def __init__(self, sources: list[str], given: list[str], chapter: str | None):
        from autograder.grading.judging.delegation import _parse, _top_level_bindings

        self.trees = [t for t in map(_parse, sources) if t is not None]
        self.bound = _top_level_bindings(self.trees)
        given_trees = [t for t in map(_parse, given) if t is not None]
        self.given_bound = _top_level_bindings(given_trees)
        self.allowed = namespaces(chapter)
        # names a function binds for the notebook (``global counter``)
        self.declared_global = {
            name
            for tree in self.trees
            for node in ast.walk(tree)
            if isinstance(node, ast.Global)
            for name in node.names
        }
        self.aliases: dict[str, set[str]] = {}  # name -> dotted paths it may stand for
        self.stars: list[str] = []
        for tree in [*given_trees, *self.trees]:
            for node in ast.walk(tree):
                for name, path in _import_targets(node).items():
                    self.aliases.setdefault(name, set()).add(path)
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module
                    and any(a.name == "*" for a in node.names)
                ):
                    self.stars.append(node.module)
        # ``F = torch.nn.functional`` at the top: an alias too
        for tree in [*given_trees, *self.trees]:
            for node in tree.body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, chain = node.targets[0], _chain(node.value)
                    if isinstance(target, ast.Name) and chain:
                        root, parts = chain
                        for path in self.aliases.get(root.id, ()):
                            joined = ".".join([path, *parts])
                            self.aliases.setdefault(target.id, set()).add(joined)
        self._changes()

    def _changes(self) -> None:
        """Top-level statements that change an object's attribute or item, anywhere in
        them (a function's body too): a module's or a builtin's (``torch.Tensor.f =``,
        ``setattr(F, ...)``, ``globals()[...] =``) are on every path; the student's own
        object's are read where the path reaches that object's name."""
        self.shared_changes, self.changes = [], {}
        for tree in self.trees:
            for statement in tree.body:
                for root in _changed_roots(statement):
                    if root is None or root in self.aliases or root not in self.bound:
                        self.shared_changes.append(statement)
                    else:
                        self.changes.setdefault(root, []).append(statement)

    def path(self, exercises: list[str]) -> Iterator[ast.AST]:
        """The student's top-level definitions the exercises reach, each once, and the
        top-level statements that change objects."""
        seen, todo = set(), list(exercises)
        nodes = list(self.shared_changes)
        while todo or nodes:
            while nodes:
                node = nodes.pop()
                if id(node) in seen:
                    continue
                seen.add(id(node))
                yield node
                for name in module_scope_names(node):
                    if isinstance(name.ctx, ast.Load):
                        todo.append(name.id)
            if todo:
                name = todo.pop()
                if ("name", name) in seen:
                    continue
                seen.add(("name", name))
                nodes.extend(self.bound.get(name, []))
                nodes.extend(self.changes.get(name, []))

    def problems(self, exercises: list[str]) -> list[str]:
        """What on the exercises' path the reader cannot vouch for."""
        found = Found()
        for exercise in exercises:
            if exercise in self.aliases:  # ``from helper import fast as exercise``
                self._check_name(exercise, found)
        for node in self.path(exercises):
            self._check(node, found, depth=0)
        return list(found)

    def _check(self, node: ast.AST, found: Found, depth: int) -> None:
        from autograder.grading.judging.delegation import _not_calls, _walk

        skip = _not_calls(node)
        loads = [n for n in module_scope_names(node) if isinstance(n.ctx, ast.Load)]
        in_scope = {id(n) for n in loads}
        # modules a function imports for itself: their uses are judged as the module's
        local_modules = {}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Import | ast.ImportFrom):
                for name, path in _import_targets(sub).items():
                    local_modules.setdefault(name, set()).add(path)
        judged = set()  # nodes judged as part of a longer chain
        for sub in _walk(node, lambda n: id(n) in skip):
            if isinstance(sub, ast.Attribute) and sub.attr in _ATTRIBUTES:
                found.add(_ATTRIBUTES[sub.attr])
            if isinstance(sub, ast.Call):
                self._check_call(sub, found, depth)
            elif isinstance(sub, ast.Import | ast.ImportFrom):  # a function's own too
                for path in _import_targets(sub).values():
                    if path in HARMLESS_NAMES:
                        continue  # what it is used for is judged
                    problem = namespace_problem(path, self.allowed)
                    if problem:
                        found.add(problem)
            stored = isinstance(getattr(sub, "ctx", None), ast.Store | ast.Del)
            if isinstance(sub, ast.Attribute | ast.Call) and id(sub) not in judged:
                # what a change is stored into is not reached: what is stored is
                if stored:
                    judged |= {id(n) for n in ast.walk(sub)}
                    continue
                chain = _chain(sub)
                if chain and chain[1] and id(chain[0]) in in_scope:
                    self._check_chain(*chain, found)
                    judged |= {id(n) for n in ast.walk(sub)}
                elif chain and chain[1] and chain[0].id in local_modules:
                    for path in local_modules[chain[0].id]:
                        joined = ".".join([path, *chain[1]])
                        problem = namespace_problem(joined, self.allowed)
                        if problem:
                            found.add(problem)
                    judged |= {id(n) for n in ast.walk(sub)}
        for name in loads:
            if id(name) not in judged:
                self._check_name(name.id, found)

    def _check_call(self, call: ast.Call, found: Found, depth: int) -> None:
        from autograder.grading.judging.delegation import (
            _CODE_AT_RUN_TIME,
            _literal_code,
        )

        func = call.func
        name = func.id if isinstance(func, ast.Name) else None
        attr = func.attr if isinstance(func, ast.Attribute) else None
        if name in _BY_NAME:
            if len(call.args) < 2 or not (
                isinstance(call.args[1], ast.Constant)
                and isinstance(call.args[1].value, str)
            ):
                found.add(f"looks up a name built at run time ({name})")
        elif name in _CODE_AT_RUN_TIME and name not in self.bound:
            tree = _literal_code(call) if depth < 3 else None
            if tree is None:
                found.add(_CODE_AT_RUN_TIME[name])
            else:
                self._check(tree, found, depth + 1)
        elif (name or attr) in _ATTRGETTERS:
            if not all(
                isinstance(a, ast.Constant) and isinstance(a.value, str)
                for a in call.args
            ):
                found.add(f"looks up a name built at run time ({name or attr})")

    def _check_name(self, name: str, found: Found) -> None:
        if name in self.aliases:  # a module, or a name imported from one
            for path in self.aliases[name]:
                problem = namespace_problem(path, self.allowed)
                if problem:
                    found.add(problem)
            return
        if name in self.bound or name in self.declared_global:
            return  # the student's own: followed
        if name in self.given_bound or name in _IPYTHON_NAMES:
            return
        if hasattr(builtins, name):
            if name in _BUILTIN_LOOKUPS:
                found.add(_BUILTIN_LOOKUPS[name])
            return
        for module in self.stars:
            owner = sys.modules.get(module)
            if owner is not None and hasattr(owner, name):
                problem = namespace_problem(f"{module}.{name}", self.allowed)
                if problem:
                    found.add(problem)
                return
        if name == "get_ipython":
            found.add("reaches the notebook's shell (get_ipython)")
        else:
            found.add(
                f"uses `{name}`, which no cell defines (put there at run time?): the "
                "reader cannot follow it"
            )

    def _check_chain(self, root: ast.Name, parts: list[str], found: Found) -> None:
        name = root.id
        if name in self.bound and name not in self.aliases:
            return  # the student's own object: its attributes are its own
        if name in self.aliases:
            for path in self.aliases[name]:
                problem = namespace_problem(".".join([path, *parts]), self.allowed)
                if problem:
                    found.add(problem)
            return
        self._check_name(name, found)


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call | ast.Starred):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _changed_roots(statement: ast.AST) -> Iterator[str | None]:
    """For each attribute or item ``statement`` changes (a function's body too), the
    notebook-scope name it hangs from, or None when it hangs from no name
    (``globals()[...]``); not those of a function's own names (``self.w = ...``)."""
    in_scope = {id(n) for n in module_scope_names(statement)}
    for node in ast.walk(statement):
        targets = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
        ):
            targets = [ast.Attribute(value=node.args[0], attr="?", ctx=ast.Store())]
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute | ast.Subscript):
                    root = _root(t)
                    if not isinstance(root, ast.Name):
                        yield None
                    elif id(root) in in_scope:
                        yield root.id
