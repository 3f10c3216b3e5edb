"""Reading the student's code: it finds PyTorch features on an exercise's call path, adds
remarks for features that are not attention, and flags for review what no honest answer
needs; it never takes a point. PyTorch's attention itself is switched off by the guard
(tests/test_guard.py), and a refused call fails its test with the guard's message."""

import inspect
import textwrap

import torch.nn.functional as F

from autograder.grading.judging import delegation
from autograder.grading.judging.delegation import FEATURES, flags, remarks, static_uses
from autograder.grading.judging.judge import verdict
from autograder.grading.judging.prepare import prepare
from autograder.grading.judging.spec import graded_chapters, load_chapter_tests
from autograder.grading.running.student_code import StudentCode, given_sources
from autograder.grading.sealed import guard
from solutions import self_attention as sa
from tests.answers import code_of, verdicts
from tests.notebooks import COLAB_CELLS, SCRATCH_CELLS, answers

OWN = """
import math, torch
def scaled_dot_product_attention(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    return weights @ v, weights
class SelfAttention(torch.nn.Module):
    def forward(self, x, mask=None):
        return scaled_dot_product_attention(x, x, x, mask)
"""


def _sdpa(source):
    return static_uses([source], "scaled_dot_product_attention", ("sdpa",))


def test_the_students_own_function_of_the_same_name_is_not_delegation():
    assert _sdpa(OWN) == []
    assert static_uses([OWN], "SelfAttention", ("sdpa",)) == []


def test_a_scratch_cell_comparing_with_pytorch_is_not_delegation():
    scratch = "import torch.nn.functional as F\nprint(F.scaled_dot_product_attention(q, k, v))"
    assert _sdpa(OWN) == _sdpa(OWN + scratch) == []


def test_direct_aliased_indirect_and_string_uses_are_found():
    direct = "import torch.nn.functional as F\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    return F.scaled_dot_product_attention(q, k, v), None"
    aliased = "from torch.nn.functional import scaled_dot_product_attention as fast\ndef helper(q, k, v):\n    return fast(q, k, v)\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    return helper(q, k, v), None"
    by_string = "import torch.nn.functional as F\nfn = getattr(F, 'scaled_dot_product_attention')\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    return fn(q, k, v), None"
    flash = "from torch.nn.attention import sdpa_kernel, SDPBackend\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):\n        return q, q"
    for source in (direct, aliased, by_string, flash):
        assert _sdpa(source) == ["sdpa"], source
    # through a method of the student's module
    module = OWN.replace(
        "return scaled_dot_product_attention(x, x, x, mask)",
        "return torch.nn.functional.scaled_dot_product_attention(x, x, x)",
    )
    assert static_uses([module], "SelfAttention", ("sdpa",)) == ["sdpa"]
    mha = "import torch\nclass MultiHeadAttention(torch.nn.Module):\n    def __init__(self, d, h):\n        super().__init__()\n        self.inner = torch.nn.MultiheadAttention(d, h, batch_first=True)"
    assert static_uses([mha], "MultiHeadAttention", ("mha",)) == ["mha"]


def test_type_hints_and_isinstance_checks_are_not_delegation():
    hinted = (
        "import torch\nfrom torch import nn\n"
        "class MultiHeadAttention(nn.Module):\n"
        "    def load_torch_weights(self, mha: nn.MultiheadAttention) -> None:\n"
        "        assert isinstance(mha, nn.MultiheadAttention)\n"
        "        layer: nn.MultiheadAttention = mha\n"
        "        self.w = mha.in_proj_weight\n"
    )
    assert static_uses([hinted], "MultiHeadAttention", ("mha",)) == []


def test_unparseable_cells_are_skipped_not_fatal():
    assert _sdpa("def broken(:\n") == []


def test_the_reference_passes_with_nothing_to_remark():
    tests = load_chapter_tests("03_self_attention")
    for v in verdicts(tests, vars(sa)).values():
        assert v.passed and not v.remark and "Remark" not in v.message


def test_a_call_the_guard_refused_fails_with_the_guards_message_alone():
    tests = load_chapter_tests("03_self_attention")
    (p,) = prepare(tests, [tests.test("sdpa_basic")], 0)
    error = "RuntimeError: " + guard.refusal("scaled_dot_product_attention")
    got = [
        {"error": error + "\nException raised from operator() at guard.cpp:1"}
    ] * len(p.cases)
    found = verdict(tests, p, got, StudentCode([OWN]))
    assert not found.passed
    assert found.message == guard.refusal("scaled_dot_product_attention")
    assert found.refused.startswith(guard.MARK)


def test_reading_the_code_never_takes_a_point():
    """A first try that calls PyTorch's attention above the answer, a scratch cell
    comparing with it, an alias: the verdict rests on what the answer returns."""
    tests = load_chapter_tests("03_self_attention")
    (p,) = prepare(tests, [tests.test("sdpa_basic")], 0)
    from autograder.grading.sealed import probe

    got = probe.run_test(vars(sa), p.test_plan)
    first_try = (
        "import torch.nn.functional as F\n"
        "def scaled_dot_product_attention(q, k, v, mask=None):\n"
        "    return F.scaled_dot_product_attention(q, k, v), None\n"
    )
    scratch = "print(F.scaled_dot_product_attention(q, q, q))\n"
    code = StudentCode([first_try, OWN, scratch])
    assert verdict(tests, p, got, code).passed


def test_softmax_in_the_flash_tiles_is_a_remark_not_a_zero():
    source = (
        "import torch\n"
        "def flash_attention(q, k, v, block_size=64, causal=False):\n"
        "    return torch.softmax(q @ k.transpose(-2, -1), -1) @ v\n"
    )
    remark = remarks([source], "flash_attention", ("sdpa", "softmax"))
    assert "took no point" in remark and FEATURES["softmax"].description in remark
    assert remark.startswith("Remark on your code, not on a test's result")
    # attention is the guard's business: no remark for it
    assert remarks([source], "flash_attention", ("sdpa",)) == ""
    own = source.replace("torch.softmax(", "my_softmax(")
    assert remarks([own], "flash_attention", ("sdpa", "softmax")) == ""


# Switching the watch off: caught in the code, and while the code runs.

FLASH_HEAD = "import torch\nimport torch.nn.functional as F\n"
ISSUE_EVASION = (
    FLASH_HEAD
    + "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    + "    name = ''.join(map(chr, [115, 99, 97, 108, 101, 100, 95, 100, 111, 116, 95, 112,"
    + " 114, 111, 100, 117, 99, 116, 95, 97, 116, 116, 101, 110, 116, 105, 111, 110]))\n"
    + "    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():\n"
    + "        return getattr(F, name)(q, k, v, is_causal=causal)\n"
)
BUILT = "''.join(reversed('noitnetta_tcudorp_tod_delacs'))"
EVASIONS = {
    "issue": ISSUE_EVASION,
    "torch_C_nn": FLASH_HEAD
    + f"def flash_attention(q, k, v, block_size=64, causal=False):\n"
    f"    return getattr(torch._C._nn, {BUILT})(q, k, v, is_causal=causal)\n",
    "vars_of_F": FLASH_HEAD
    + f"def flash_attention(q, k, v, block_size=64, causal=False):\n"
    f"    return vars(F)[{BUILT}](q, k, v, is_causal=causal)\n",
    "ops_aten_no_dispatch": FLASH_HEAD
    + "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    "    op = ''.join(reversed('upc_rof_noitnetta_hsalf_tcudorp_tod_delacs_'))\n"
    "    with torch._C._DisableTorchDispatch():\n"
    "        return getattr(torch.ops.aten, op)(q, k, v, is_causal=causal)[0]\n",
    "pop_mode_stack": FLASH_HEAD + "from torch.overrides import _pop_mode, _push_mode\n"
    "from torch.utils import _python_dispatch as d\n"
    "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    "    modes = _pop_mode(), d._pop_mode()\n"
    "    try:\n"
    "        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)\n"
    "    finally:\n"
    "        _push_mode(modes[0])\n"
    "        d._push_mode(modes[1])\n",
    "eval_encoded": FLASH_HEAD
    + "CODE = bytes.fromhex('462e7363616c65645f646f745f70726f647563745f617474656e74696f6e').decode()\n"
    "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    "    return eval(CODE)(q, k, v, is_causal=causal)\n",
    "builtins_injection": FLASH_HEAD + "import builtins\n"
    f"setattr(builtins, 'fast_kernel', getattr(F, {BUILT}))\n"
    "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    "    return fast_kernel(q, k, v, is_causal=causal)\n",
    "globals_injection": FLASH_HEAD
    + f"globals()['fast_kernel'] = F.__dict__[{BUILT}]\n"
    "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    "    return fast_kernel(q, k, v, is_causal=causal)\n",
    "patch_called_at_top_level": FLASH_HEAD + "def prepare():\n"
    "    torch.autograd.profiler.profile = lambda *a, **k: None\n"
    "prepare()\n"
    "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    "    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)\n",
    "restart_profiler": FLASH_HEAD
    + "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    "    torch.autograd._disable_profiler_legacy()\n"
    "    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():\n"
    "        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)\n",
    "module_written_to_disk": FLASH_HEAD + "import pathlib, importlib\n"
    "pathlib.Path('fa_helper.py').write_text(bytes.fromhex('00').decode())  # its code\n"
    "from fa_helper import fast as flash_attention\n",
    "profiler_patched_by_alias": FLASH_HEAD
    + "from torch.autograd import profiler as p\n"
    "class Quiet(p.profile):\n"
    "    pass  # would filter function_events\n"
    "p.profile = Quiet\n"
    "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    "    return q\n",
    "cell_magic": "%%capture\n" + ISSUE_EVASION,
}


# Work done in another thread or process: left to the run-time side, where the hidden
# inputs reach only a sealed process forked after the last student cell. Reading the code
# still refuses what names PyTorch's attention on the exercise's call path.
ELSEWHERE = {
    "fork_child": FLASH_HEAD + "import os, pickle\n"
    "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    "    r, w = os.pipe()\n"
    "    if os.fork() == 0:\n"
    "        os.write(w, pickle.dumps(F.scaled_dot_product_attention(q, k, v)))\n"
    "        os._exit(0)\n"
    "    return pickle.loads(os.read(r, 1 << 30))\n",
    "thread": FLASH_HEAD + "from concurrent.futures import ThreadPoolExecutor\n"
    "POOL = ThreadPoolExecutor(1)\n"
    "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    "    return POOL.submit(F.scaled_dot_product_attention, q, k, v).result()\n",
    "worker_process": FLASH_HEAD + "import subprocess, sys, os, time\n"
    "WORKER = subprocess.Popen([sys.executable, 'worker.py'])  # computes with F.sdpa\n"
    "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    "    torch.save((q, k, v), 'in.pt')\n"
    "    while not os.path.exists('out.pt'):\n"
    "        time.sleep(0.01)\n"
    "    return torch.load('out.pt')\n",
}


FLASH = [("flash_attention", ("sdpa",))]
EFFICIENT = "08_efficient_attention"


def _on_path(body: str, head: str = FLASH_HEAD, chapter: str = EFFICIENT) -> list[str]:
    """The flags of a flash_attention whose body is ``body``."""
    source = head + "def flash_attention(q, k, v, block_size=64, causal=False):\n"
    return flags([source + textwrap.indent(body, "    ")], FLASH, [], chapter)


def test_what_no_guard_stops_is_flagged_for_review():
    """Constructs that reach past the guard (native code, raw memory, the dispatcher,
    code objects, code built at run time) are flagged."""
    flagged = {
        "issue": "torch._C",
        "torch_C_nn": "torch._C",
        "ops_aten_no_dispatch": "torch.ops",
        "eval_encoded": "eval",
        "restart_profiler": "torch._C",
        "vars_of_F": "vars",
        "builtins_injection": "fast_kernel",
        "globals_injection": "__dict__",
        "pop_mode_stack": "torch.overrides",
        "module_written_to_disk": "fa_helper",
        "thread": "concurrent",
        "fork_child": "`os`",
    }
    for name, what in flagged.items():
        found = flags([{**EVASIONS, **ELSEWHERE}[name]], FLASH, [], EFFICIENT)
        assert any(what in f for f in found), (name, found)
    # wherever they stand: they change the process for good, or cannot be read
    anywhere = {
        "ctypes": "import ctypes\nctypes.CDLL(None)\n",
        "code_object": "def f():\n    pass\nf.__code__ = (lambda: 1).__code__\n",
        "library": "import torch\nlib = torch.library.Library('aten', 'IMPL')\n",
        "from_torch_C": "from torch._C import _DisableTorchDispatch\n",
        "getattr_C": "import torch\nC = getattr(torch, '_C')\n",
        "exec_built": "exec(''.join(['x', ' = 1']))\n",
        "exec_literal_inside": "exec('import ctypes')\n",
        "shell_hook": "get_ipython().events.register('pre_run_cell', print)\n",
        "shell_alias": "ip = get_ipython()\nip.user_ns['x'] = 1\n",
        "probe_by_parts": "name = '_grader' + '_probe'\n",
        "tracer": "import sys\nsys.settrace(None)\n",
    }
    for name, source in anywhere.items():
        assert flags([source]), name
    # on the path only: raw memory
    assert any("data_ptr" in f for f in _on_path("q.data_ptr()\nreturn q\n"))
    interface = _on_path("q.numpy().__array_interface__\nreturn q\n")
    assert any("__array_interface__" in f for f in interface)


# Round 5's kinds: what the reader cannot resolve on the path counts as what cannot be
# stopped.
UNRESOLVED = {
    "getattr_built": (
        "name = 'soft' + 'max'\nreturn getattr(torch, name)(q, -1)\n",
        "getattr",
    ),
    "vars": ("return vars(F)['softmax'](q, -1)\n", "vars"),
    "dunder_dict": ("return F.__dict__['softmax'](q, -1)\n", "__dict__"),
    "globals": ("return globals()['helper'](q)\n", "globals"),
    "importlib": (
        "import importlib\nm = importlib.import_module('torch.ao.nn.' + 'quantizable')\n"
        "return m.MultiheadAttention(8, 1)(q, k, v)[0]\n",
        "importlib",
    ),
    "attrgetter": (
        "import operator\nreturn operator.attrgetter(''.join('xam'))(q)\n",
        "attrgetter",
    ),
    "quantizable_mha": (
        "from torch.ao.nn.quantizable import MultiheadAttention\n"
        "return MultiheadAttention(8, 1)(q, k, v)[0]\n",
        "torch.ao",
    ),
    "inductor_pattern": (
        "from torch._inductor.fx_passes import fuse_attention\n"
        "return fuse_attention._sfdp_pattern_1(q, k, v, 1.0)\n",
        "torch._inductor",
    ),
    "flex": (
        "from torch.nn.attention.flex_attention import flex_attention\n"
        "return flex_attention(q, k, v)\n",
        "torch.nn.attention",
    ),
    "decomposition": (
        "import torch._decomp.decompositions as d\nreturn d.matmul(q, k)\n",
        "torch._decomp",
    ),
    "function_from_code": (
        "import types\n"
        "g = types.FunctionType(F.multi_head_attention_forward.__code__, {})\n"
        "return g(q, k, v)\n",
        "__code__",
    ),
    "code_replace": (
        "c = F.softmax.__code__.replace(co_name='mine')\nreturn q\n",
        "__code__",
    ),
    "builtins": ("import builtins\nreturn builtins.max(q)\n", "builtins"),
    "frames": ("import sys\nreturn sys._getframe().f_globals['x']\n", "sys"),
    "subclasses": ("return object.__subclasses__()[0](q)\n", "__subclasses__"),
}


def test_what_the_reader_cannot_resolve_on_the_path_is_flagged():
    for name, (body, what) in UNRESOLVED.items():
        found = _on_path(body)
        assert any(what in f for f in found), (name, found)


def test_a_name_no_cell_defines_on_the_path_is_flagged():
    found = _on_path("return fast_kernel(q, k, v)\n")
    assert any("fast_kernel" in f for f in found), found
    # a name a given cell defines, a builtin, IPython's display: none of them
    given = ["import torch\ndef course_helper(x):\n    return x\n"]
    source = (
        "def flash_attention(q, k, v):\n"
        "    display(len(q))\n"
        "    return course_helper(q)\n"
    )
    assert flags([source], FLASH, given, EFFICIENT) == []
    # a name a function binds for the notebook
    counted = (
        "def count():\n    global calls\n    calls = 1\n"
        "def flash_attention(q, k, v):\n    count()\n    return q * calls\n"
    )
    assert flags([counted], FLASH, [], EFFICIENT) == []
    # harmless names of modules that reach anything
    harmless = "import sys, os\nreturn q * sys.float_info.epsilon * os.cpu_count()\n"
    assert _on_path(harmless) == []
    assert _on_path("import sys\nreturn sys.modules['torch.ao'].x(q)\n")


def test_a_module_mutated_at_the_top_is_on_every_path():
    """A statement that changes a shared object is read as if the tests reached it:
    whatever they call may reach what it changed."""
    changes = FLASH_HEAD + (
        "import torch.ao.nn.quantizable as qz\n"
        "torch.Tensor.attend = lambda q, k, v: qz.MultiheadAttention(8, 1)(q, k, v)[0]\n"
        "def flash_attention(q, k, v, block_size=64, causal=False):\n"
        "    return q.attend(k, v)\n"
    )
    found = flags([changes], FLASH, [], EFFICIENT)
    assert any("torch.ao" in f for f in found), found
    inside = FLASH_HEAD + (
        "def prepare():\n"
        "    torch.Tensor.attend = vars(F)['scaled_dot_product_attention']\n"
        "prepare()\n"
        "def flash_attention(q, k, v, block_size=64, causal=False):\n"
        "    return q.attend(k, v)\n"
    )
    found = flags([inside], FLASH, [], EFFICIENT)
    assert any("vars" in f for f in found), found


def test_the_chapters_allowlist_decides_which_modules_the_path_may_use():
    triton = "import triton\nimport triton.language as tl\n"
    body = "return triton.cdiv(q.shape[0], tl.constexpr(2))\n"
    assert _on_path(body, triton, "11_kernels") == []
    assert any("triton" in f for f in _on_path(body, triton, EFFICIENT))


HONEST_SCRATCH = [
    # a comparison with PyTorch's attention, whose result is named like the answer's local
    "import torch\nimport torch.nn.functional as F\nq = k = v = torch.randn(1, 4, 8)\n"
    "out = F.scaled_dot_product_attention(q, k, v)\n",
    # eval of a literal
    "print(eval('1 + 2'))\n",
    # a view shares its storage (PyTorch's documentation checks it so)
    "import torch\nt = torch.randn(3, 4)\nprint(t.data_ptr() == t.t().data_ptr())\n",
    "import gc, sys, inspect\nprint(sys.version, gc.isenabled())\n",
    "import importlib\nprint(importlib.util.find_spec('einops') is not None)\n",
    "exec('x_mine = 3')\nprint(getattr(torch, 'soft' + 'max'))\n",
]


def test_scratch_cells_never_flag():
    """Flags come only from what the tests reach: a scratch cell comparing with
    PyTorch, an eval of a literal, a data_ptr check, a module used for a print."""
    own = FLASH_HEAD + (
        "def flash_attention(q, k, v, block_size=64, causal=False):\n"
        "    out = torch.softmax(q @ k.transpose(-2, -1), -1) @ v\n"
        "    return out\n"
    )
    assert flags([*HONEST_SCRATCH, own], FLASH, [], EFFICIENT) == []


HONEST_CELLS = [
    *COLAB_CELLS,
    *SCRATCH_CELLS,
    "import importlib.util, subprocess, sys\n"
    "if 'google.colab' in sys.modules and not importlib.util.find_spec('einops'):\n"
    "    subprocess.run([sys.executable, '-m', 'pip', 'install', 'einops'])\n",
    "import os, socket, asyncio, queue\nos.system('nvidia-smi')\n"
    "from concurrent.futures import ThreadPoolExecutor\n"
    "with ThreadPoolExecutor(2) as pool:\n    print(list(pool.map(abs, [-1, 2])))\n",
    "import torch\ntorch.backends.cuda.matmul.allow_tf32 = False\n"
    "with torch.profiler.record_function('mine'):\n    pass\n"
    "if 'flash_attention' in globals():\n    print(globals().get('flash_attention'))\n",
]


def test_honest_notebooks_and_the_references_are_not_flagged():
    sdpa = [("scaled_dot_product_attention", ("sdpa",)), ("SelfAttention", ("sdpa",))]
    assert flags([OWN, FLASH_HEAD, *HONEST_CELLS], sdpa, [], "03_self_attention") == []
    for chapter in graded_chapters():
        cells = [*answers(chapter).values(), *HONEST_CELLS]
        tests = load_chapter_tests(chapter)
        exercises = sorted({(t.exercise, t.forbidden) for t in tests.tests})
        given = given_sources(chapter)
        assert flags(cells, exercises, given, chapter) == [], chapter


def test_pytorchs_attention_pasted_in_is_flagged():
    pasted = textwrap.dedent(inspect.getsource(F.multi_head_attention_forward))
    pasted = pasted.replace("def multi_head_attention_forward(", "def mine(")
    answer = (
        "def scaled_dot_product_attention(q, k, v, mask=None):\n    return mine(q)\n"
    )
    sdpa = [("scaled_dot_product_attention", ("sdpa",))]
    found = flags(["import torch\n" + pasted, answer], sdpa)
    assert any("multi_head_attention_forward" in f for f in found), found
    # pasted but not on the path: a scratch cell's
    assert flags(["import torch\n" + pasted, OWN], sdpa) == []
    assert delegation.similarity([OWN]) == []


BOUND_UNDER = {
    "if": "if True:\n    from torch.nn.functional import scaled_dot_product_attention as f\n",
    "try": "try:\n    f = F.scaled_dot_product_attention\nexcept Exception:\n    pass\n",
    "with": "import contextlib\nwith contextlib.nullcontext(F.scaled_dot_product_attention) as f:\n    pass\n",
    "for": "for f in [F.scaled_dot_product_attention]:\n    pass\n",
    "while": "while True:\n    f = F.scaled_dot_product_attention\n    break\n",
    "match": "match F:\n    case object(scaled_dot_product_attention=f):\n        pass\n",
}


def test_bindings_under_compound_statements_are_followed():
    for name, binding in BOUND_UNDER.items():
        source = (
            FLASH_HEAD
            + binding
            + "def flash_attention(q, k, v):\n    return f(q, k, v)\n"
        )
        assert static_uses([source], "flash_attention", ("sdpa",)) == ["sdpa"], name


def test_code_of_a_namespace_is_read_as_a_notebook():
    code = code_of(vars(sa), "03_self_attention")
    assert any("def scaled_dot_product_attention" in c for c in code.cells)


def _doubled_cross_entropy(logits, targets):
    import torch.nn.functional as F

    flat = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return 2 * flat


def test_a_remark_is_never_on_the_line_of_a_lost_point():
    """A wrong answer that also calls a feature the exercise asks students to write: the
    failure says what failed; the remark is on a line of its own and says it took no point."""
    from autograder.grading.nbgrader_bridge import test_cell_outputs
    from solutions import language_model as lm

    tests = load_chapter_tests("10_language_model")
    namespace = {**vars(lm), "cross_entropy": _doubled_cross_entropy}
    selected = [tests.test("lm_cross_entropy")]
    (v,) = verdicts(tests, namespace, 0, selected).values()
    assert not v.passed and v.score == 0
    assert "Remark" not in v.message and "cross-entropy" not in v.message.lower()
    assert v.remark.startswith("Remark on your code, not on a test's result")
    assert "took no point" in v.remark
    error, remark = test_cell_outputs(v.as_json())
    assert error.output_type == "error" and "Remark" not in error.evalue
    assert remark.output_type == "stream" and remark.text.startswith(
        "Remark on your code"
    )


def test_code_nested_too_deep_to_read_is_flagged_not_a_crash():
    for depth in (900, 50_000):
        deep = "    return " + " + ".join(["q"] * depth) + "\n"
        source = "def flash_attention(q, k, v, block_size=64, causal=False):\n" + deep
        found = flags([source], FLASH, [], EFFICIENT)
        # read, where Python's recursion limit allows it, else flagged
        assert all("too deep" in f for f in found), found
        assert found or depth < 10_000
        assert remarks([source], "flash_attention", ("sdpa", "softmax")) == ""


def test_a_dead_first_try_is_not_flagged_but_one_kept_alive_is():
    first_try = (
        "import torch.nn.functional as F\n"
        "def scaled_dot_product_attention(q, k, v, mask=None):\n"
        "    return F.scaled_dot_product_attention(q, k, v), None\n"
    )
    sdpa = [("scaled_dot_product_attention", ("sdpa",))]
    assert flags([first_try, OWN], sdpa) == []
    # kept under another name before the answer replaced it, and called by the answer
    kept = "fast = scaled_dot_product_attention\n"
    calls = OWN.replace("weights @ v, weights", "fast(q, k, v)[0], weights")
    assert flags([first_try, kept, calls], sdpa)
    # replaced only under a condition: both may run
    conditional = "if True:\n" + textwrap.indent(OWN, "    ")
    assert flags([first_try, conditional], sdpa)
