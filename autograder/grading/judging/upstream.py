"""The earlier exercises a test's exercise uses, and the course's answers for them.

One mistake is charged once, where it was made. A hidden test of a later exercise
(``MultiHeadAttention``) calls the student's earlier ones (``attention``) through the
notebook's namespace, so an unscaled ``attention`` would fail both. Each such test
therefore runs a second time in the sealed child with the earlier exercises replaced by
stand-ins whose answers the grader computes from the reference (:class:`ReferenceServer`),
outside the student's process: the course's code never enters it (``probe._Oracle``,
``window._StandInRuns``). The test passes when either run passes; when only the second
does, the feedback names the earlier exercise (``judge.verdict``, ``judge.attribute``).

Which earlier exercises: every exercise of any chapter that the reference implementation
of the tested one reaches through the names its code reads (following the references'
own definitions, across chapters: chapter 6's layers reach chapter 4's attention), and
every notebook name the test's calls pass as an argument. A function stands in as a
function, an ``nn.Module`` class as a module whose parameters live in the child (the
test's weights load into them) and whose forward and own methods (``load_torch_weights``)
run in the grader. Anything else (an autograd Function, a Triton kernel), or a reference
that takes a function or a random generator, is not replaced, and a stand-in cannot carry
gradients: there the second run counts for nothing and the first decides, as before.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import sys
import types
import typing
from collections import OrderedDict
from typing import Any

import torch

from autograder.grading.judging import one_interpreter
from autograder.grading.judging.spec import graded_chapters
from autograder.grading.sealed import probe
from autograder.paths import module_name


@functools.cache
def exercise_names() -> frozenset[str]:
    """Every graded exercise of the course, by name, read from the hidden tests alone
    (a chapter's known mistakes or reference may need what this machine lacks: Triton)."""
    names: set[str] = set()
    for chapter in graded_chapters():
        module = importlib.import_module(
            f"autograder.hidden_tests.{module_name(chapter)}"
        )
        names |= {t.exercise for t in module.TESTS}
    return frozenset(names)


def _reads(value) -> set[str]:
    """The global names a function's or a class's code reads (its methods' too)."""
    codes = []
    if inspect.isfunction(value):
        codes.append(value.__code__)
    else:
        for attribute in vars(value).values():
            if isinstance(attribute, property):
                attribute = attribute.fget
            function = getattr(
                attribute, "__func__", attribute
            )  # static, class methods
            if inspect.isfunction(function):
                codes.append(function.__code__)
    names: set[str] = set()
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if inspect.iscode(c))
    return names


def _the_courses(value) -> bool:
    """A function or class of the course's references (``solutions``)."""
    module = getattr(value, "__module__", None) or ""
    return module.split(".")[0] == "solutions" and (
        inspect.isfunction(value) or inspect.isclass(value)
    )


def reached(reference: dict, exercise: str) -> set[str]:
    """The other exercises the reference of ``exercise`` reaches, by their names."""
    exercises = exercise_names()
    found: set[str] = set()
    todo, seen = [reference[exercise]], set()
    while todo:
        value = todo.pop()
        if id(value) in seen or not _the_courses(value):
            continue
        seen.add(id(value))
        defined_in = vars(sys.modules[value.__module__])
        for name in _reads(value):
            target = defined_in.get(name)
            if target is not None and _the_courses(target):
                if name in exercises and name != exercise:
                    found.add(name)
                todo.append(target)
    return found


_DATA = (torch.Tensor, int, float, bool, str, type(None), list, tuple, dict)


def takes_data(function) -> bool:
    """A reference whose parameters are all data, as its annotations say (tensors,
    numbers, strings, None, and containers of them; a parameter without an annotation
    counts as data): what a stand-in can send to the grader. ``SublayerConnection``
    takes a function, ``sample`` a random generator: they never stand in."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 (an annotation that does not resolve: not data)
        return False
    hints.pop("return", None)

    def data(hint) -> bool:
        origin = typing.get_origin(hint)
        if origin is None:
            return isinstance(hint, type) and issubclass(hint, _DATA)
        if origin in (typing.Union, types.UnionType) or origin in _DATA:
            return all(data(a) for a in typing.get_args(hint) if a is not Ellipsis)
        return False

    return all(data(h) for h in hints.values())


def _passed_names(value) -> set[str]:
    """The notebook names a plan passes as arguments (``spec.notebook_function``)."""
    if isinstance(value, dict):
        names = {value["notebook"]} if isinstance(value.get("notebook"), str) else set()
        for v in value.values():
            names |= _passed_names(v)
        return names
    if isinstance(value, list | tuple):
        return set().union(*map(_passed_names, value)) if value else set()
    return set()


@functools.cache
def _reached_in(module: str, exercise: str) -> frozenset[str]:
    return frozenset(reached(vars(sys.modules[module]), exercise))


def stand_ins(reference: dict, exercise: str, calls: list[dict]) -> dict | None:
    """What a test's second run replaces: ``{"functions": [...], "modules": [...]}``, or
    None when the exercise uses no other exercise that can stand in."""
    names = set(_reached_in(reference["__name__"], exercise))
    for call in calls:
        names |= _passed_names([call["args"], call["kwargs"], call["init"]])
    names.discard(exercise)
    functions = sorted(
        n
        for n in names
        if inspect.isfunction(reference.get(n)) and takes_data(reference[n])
    )
    modules = sorted(
        n
        for n in names
        if inspect.isclass(reference.get(n))
        and issubclass(reference[n], torch.nn.Module)
        and takes_data(reference[n].forward)
    )
    if not functions and not modules:
        return None
    return {"functions": functions, "modules": modules, "largest": largest(calls)}


def largest(calls: list[dict]) -> list[int]:
    """The largest dimension and the largest tensor among a test's calls (its inputs and
    its weights): what bounds a stand-in's arguments (``window.within``) and answers
    (``ReferenceServer``). Taken from the test's tensors alone: an integer a call passes
    (a vocabulary size, a length) never widens it."""
    side, numel = 1, 1
    todo = list(calls)
    while todo:
        value = todo.pop()
        if isinstance(value, torch.Tensor):
            side = max(side, *value.shape, 1)
            numel = max(numel, value.numel())
        elif isinstance(value, list | tuple):
            todo.extend(value)
        elif isinstance(value, dict):
            todo.extend(value.values())
    return [side, numel]


def methods(cls) -> list[str]:
    """The course's own methods of a module a stand-in plays, beside forward
    (``load_torch_weights``): those its class defines, not PyTorch's."""
    return sorted(
        name
        for name, value in vars(cls).items()
        if inspect.isfunction(value) and not name.startswith("_") and name != "forward"
    )


def _rebuilt(value):
    """A stand-in's arguments with each PyTorch layer it sent built again, as the plan
    built it (``probe._sendable``): only the layers a plan may build."""
    if isinstance(value, dict) and set(value) == {"torch.nn layer", "path"}:
        made = value["torch.nn layer"]
        if made.get("torch.nn") not in probe._TORCH_LAYERS:
            raise TooLarge("not a layer a plan builds")
        layer_class = getattr(torch.nn, made["torch.nn"])
        _sized_on_meta(lambda: layer_class(*made["args"], **made["kwargs"]), "layer")
        layer = probe._materialise(made, {})
        return layer.get_submodule(value["path"])
    if isinstance(value, list):
        return [_rebuilt(v) for v in value]
    if isinstance(value, dict):
        return {k: _rebuilt(v) for k, v in value.items()}
    return value


class TooLarge(ValueError):
    """A request the grader will not compute: the stand-in's run counts for nothing."""


def _sized_on_meta(build, what: str) -> None:
    """Build the module on PyTorch's meta device first (shapes, no memory): one of more
    than ``ReferenceServer.MAX_NUMBERS`` numbers is refused before it is built."""
    with torch.device("meta"):
        size = _numbers(build().state_dict())
    if size > ReferenceServer.MAX_NUMBERS:
        raise TooLarge(f"a {what} of {size:,} numbers is more than the grader builds")


def _numbers(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, list | tuple):
        return sum(_numbers(v) for v in value)
    if isinstance(value, dict):
        return sum(_numbers(v) for v in value.values())
    return 0


# While an answer is sized on the meta device, a Triton kernel the reference launches does
# nothing: its wrapper has made its output buffers already (on meta: their shapes), and a
# kernel only writes into buffers it is given. Only in the thread that sizes, only on
# meta tensors; every real launch runs as it is.
_SIZING = contextvars.ContextVar("sizing_on_meta", default=False)


@functools.cache
def _skip_triton_launches_on_meta() -> None:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # no Triton here: nothing launches kernels
        return
    launch = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        if _SIZING.get() and any(
            isinstance(a, torch.Tensor) and a.is_meta for a in (*args, *kwargs.values())
        ):
            return None
        return launch(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run


class ReferenceServer:
    """Answers the stand-ins' requests with the reference, in the grader's process.
    Requests are the student's, so every answer is sized on PyTorch's meta device (shapes,
    no numbers) before it is computed: a module before it is built (``MAX_NUMBERS``, for
    all the modules kept together), and a function's or a module's answer before it is
    computed (``SIZE_FACTOR`` times the test's largest tensor, at most ``MAX_OUTPUT``).
    What cannot be sized is not computed: the stand-in's run then counts for nothing."""

    MAX_NUMBERS = 2**23  # the kept modules' parameters and buffers (32 MB of float32)
    MAX_OUTPUT = 2**22  # the numbers one answer holds (16 MB of float32)
    SIZE_FACTOR = 16  # an answer may hold this many times the test's largest tensor
    KEPT = 16  # modules built, kept for the requests that follow

    def __init__(self, reference: dict):
        self.reference = reference
        self.modules: OrderedDict[str, torch.nn.Module] = OrderedDict()

    def __call__(self, request: dict, largest: list[int] | None = None) -> Any:
        numel = (largest or [1, self.MAX_OUTPUT])[1]
        with one_interpreter.LOCK:  # the reference may run Triton kernels
            self.max_output = min(self.MAX_OUTPUT, self.SIZE_FACTOR * numel)
            return self._answer(request)

    def _answer(self, request: dict) -> Any:
        target = self.reference[request["name"]]
        args, kwargs = request.get("args", []), request.get("kwargs", {})
        with torch.no_grad():
            if request["kind"] == "call":
                self._sized(target, args, kwargs)
                return probe._to_plain(target(*args, **kwargs))
            module = self._module(target, request["init"])
            state = module.state_dict()
            if request["kind"] == "init":
                parameters = dict(module.named_parameters())
                return {
                    "parameters": {k: v.clone() for k, v in parameters.items()},
                    "buffers": {
                        k: v.clone() for k, v in state.items() if k not in parameters
                    },
                    "methods": methods(target),
                }
            module.load_state_dict(request["state"])
            if request["kind"] == "method":
                if request.get("method") not in methods(target):
                    raise TooLarge(f"`{request.get('method')}` is not for stand-ins")
                args, kwargs = _rebuilt(args), _rebuilt(kwargs)
                self._sized(
                    getattr(self._on_meta(target, request), request["method"]),
                    args,
                    kwargs,
                )
                value = getattr(module, request["method"])(*args, **kwargs)
                return {"value": probe._to_plain(value), "state": module.state_dict()}
            module.train(bool(request["training"]))
            self._sized(self._on_meta(target, request), args, kwargs)
            return probe._to_plain(module(*args, **kwargs))

    def _on_meta(self, cls, request: dict) -> torch.nn.Module:
        """The module built on the meta device, to size its answers."""
        init_args, init_kwargs = request["init"]
        with torch.device("meta"):
            module = cls(*init_args, **init_kwargs)
        return module.train(bool(request.get("training")))

    def _sized(self, function, args, kwargs) -> None:
        _skip_triton_launches_on_meta()
        token = _SIZING.set(True)
        try:
            self._answer_size_on_meta(function, args, kwargs)
        finally:
            _SIZING.reset(token)

    def _answer_size_on_meta(self, function, args, kwargs) -> None:
        """Run ``function`` on PyTorch's meta device first (shapes, no numbers; what it
        creates is made there too): an answer larger than this test allows is refused
        before anything is computed, and so is one the meta device cannot compute (an
        operation without a meta kernel, a value read from the data). An error of the
        arguments themselves (shapes that do not fit) is the answer: it would be raised
        by the computation too."""
        try:
            with torch.device("meta"):
                meta = probe.map_tensors([args, kwargs], lambda t: t.to("meta"))
                size = _numbers(function(*meta[0], **meta[1]))
        except Exception as exc:
            if isinstance(exc, NotImplementedError) or "meta" in str(exc).lower():
                raise TooLarge(
                    "an answer the grader cannot size before computing it "
                    f"({type(exc).__name__})"
                ) from None
            raise
        if size > self.max_output:
            raise TooLarge(
                f"an answer of {size:,} numbers is more than the grader computes"
            )

    def _module(self, cls, init) -> torch.nn.Module:
        args, kwargs = init
        key = f"{cls.__qualname__}{init!r}"
        if key not in self.modules:
            _sized_on_meta(lambda: cls(*args, **kwargs), cls.__name__)
            self.modules[key] = cls(*args, **kwargs)
            while len(self.modules) > self.KEPT or (
                len(self.modules) > 1
                and _numbers([m.state_dict() for m in self.modules.values()])
                > self.MAX_NUMBERS
            ):
                self.modules.popitem(last=False)
        return self.modules[key]
