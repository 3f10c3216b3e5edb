"""Delegation to PyTorch is recognised both ways: reading the code, and watching it run."""

import json
import os
import subprocess
import sys

import torch.nn.functional as F

from autograder import paths
from autograder.grading.delegation import (
    FEATURES,
    features_in,
    refusal,
    static_tampering,
    static_uses,
    tampering_in,
)
from autograder.grading.spec import load_chapter_tests
from solutions import self_attention as sa
from tests.answers import verdicts
from tests.notebooks import COLAB_CELLS, SCRATCH_CELLS

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


def _delegating(q, k, v, mask=None):
    fn = getattr(
        F, "scaled_dot_" + "product_attention"
    )  # invisible to reading the code
    out = fn(q, k, v, attn_mask=mask)
    return out, sa.scaled_dot_product_attention(q, k, v, mask)[1]


def test_delegation_seen_while_running_fails_with_a_message():
    tests = load_chapter_tests("03_self_attention")
    results = verdicts(tests, {**vars(sa), "scaled_dot_product_attention": _delegating})
    for test_id in ("sdpa_basic", "sdpa_masked", "sdpa_edge_cases"):
        assert not results[test_id].passed
        assert FEATURES["sdpa"].description in results[test_id].message
    assert results["causal_mask_values"].passed  # other exercises are unaffected


def test_the_reference_is_not_flagged():
    tests = load_chapter_tests("03_self_attention")
    assert all(v.passed for v in verdicts(tests, vars(sa)).values())


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


def _tampering(source, exercise="flash_attention"):
    return static_tampering([source], exercise)


def test_switching_the_watch_off_is_found_in_the_code():
    for name, source in EVASIONS.items():
        found = _tampering(source)
        assert found, name
        message = refusal([source], "flash_attention", ("sdpa", "softmax"))
        assert "ask your instructor to review it" in message, name


def test_what_the_issue_evasion_is_refused_for():
    found = " ".join(_tampering(ISSUE_EVASION))
    assert "torch._C" in found and "DisableTorchFunction" in found


def test_tampering_counts_only_for_tests_that_forbid_something():
    assert refusal([ISSUE_EVASION], "flash_attention", ()) is None


def test_ordinary_answers_are_not_tampering():
    ordinary = FLASH_HEAD + (
        "import math, matplotlib\n"
        "torch.manual_seed(0)\n"
        "torch.backends.cudnn.deterministic = True\n"
        "def flash_attention(q: torch.Tensor, k, v, block_size=64, causal=False) -> torch.Tensor:\n"
        "    assert isinstance(q, torch.Tensor)\n"
        "    w = torch.einsum('...id,...jd->...ij', q, k) / math.sqrt(q.size(-1))\n"
        "    out = torch.zeros_like(q)\n"
        "    for i in range(q.size(-2)):\n"
        "        row = torch.exp(w[..., i, :] - w[..., i, :].amax(-1, keepdim=True))\n"
        "        out[..., i, :] = (row / row.sum(-1, keepdim=True)) @ v\n"
        "    return out\n"
        "class Layer(torch.nn.Module):\n"
        "    def __init__(self, d):\n"
        "        super().__init__()\n"
        "        for name in ('wq', 'wk'):\n"
        "            setattr(self, name, torch.nn.Linear(d, d))\n"
        "    def forward(self, x, which='wq'):\n"
        "        return flash_attention(getattr(self, which)(x), x, x)\n"
        "    def load(self, mha: torch.nn.MultiheadAttention):\n"
        "        for name in ('in_proj_weight', 'in_proj_bias'):\n"
        "            getattr(mha, name)\n"
        "model = Layer(8).eval()\n"
        "for step in range(2):\n"
        "    loss = model(torch.randn(2, 8)).sum()\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2])\n"
        "display(model)\n"
    )
    scratch = (
        "q = torch.randn(1, 4, 8)\nprint(F.scaled_dot_product_attention(q, q, q))\n"
    )
    profiled = (
        "with torch.profiler.profile() as prof:\n"
        "    flash_attention(q, q, q)\n"
        "print(prof.key_averages().table())\n"
    )
    magic = (
        "%timeit flash_attention(q, q, q)\n!pip install einops\n%matplotlib inline\n"
    )
    for exercise in ("flash_attention", "Layer"):
        assert static_tampering([ordinary, scratch, magic, profiled], exercise) == []
        assert refusal([ordinary, scratch], exercise, ("sdpa", "softmax")) is None
    assert static_tampering([OWN], "SelfAttention") == []


def test_a_misspelt_exception_is_a_bug_not_injection():
    source = (
        "def flash_attention(q, k, v):\n"
        "    if q.dim() != 4:\n"
        "        raise ValueErorr('q must be (B, h, n, d)')\n"
        "    return q\n"
    )
    assert _tampering(source) == []
    assert any(
        "`helper`" in f
        for f in _tampering(source.replace("return q", "return helper(q)"))
    )


def test_a_name_nothing_defines_is_refused_only_in_a_passed_test():
    source = "def flash_attention(q, k, v):\n    return q * scale\n"  # NameError
    assert "ask your instructor" in refusal([source], "flash_attention", ("sdpa",))
    assert refusal([source], "flash_attention", ("sdpa",), passed=False) is None
    hidden = ISSUE_EVASION  # real tampering is refused whether the test passed or not
    assert refusal([hidden], "flash_attention", ("sdpa",), passed=False) is not None


def test_names_nothing_defines_are_injection_unless_given_or_builtin():
    source = "def flash_attention(q, k, v):\n    return helper(q, k, v) + len(q)\n"
    assert any("`helper`" in f for f in _tampering(source))
    given = "from course_utils import helper\n"
    assert static_tampering([source], "flash_attention", [given]) == []
    star = "from course_utils import *\n"  # then what is defined is unknown
    assert static_tampering([source], "flash_attention", [star]) == []


# The same evasions while they run, against the probe's watch. Each runs in a child
# process: an evasion that breaks PyTorch's profiler can abort or hang its process (in the
# grader that is the student's own kernel, which then earns nothing), never this test run.

_WATCH = """
import json, sys, torch
from autograder.grading import probe
from autograder.grading.delegation import FEATURES
source, before = json.loads(sys.stdin.read())
exec(before, {"torch": torch})
namespace = {}
exec(compile(source, "<student>", "exec"), namespace)
q = torch.randn(2, 3, 16, 8)
watch = probe._Watch(sorted({*FEATURES["sdpa"].ops, *FEATURES["softmax"].ops}))
try:
    with watch:
        namespace["flash_attention"](q, q, q)
except Exception:
    pass
restored = probe._mode_stacks() == ([], [])
print(json.dumps({"used": sorted(watch.used), "restored": restored}))
"""
CRASHED = "the evasion crashed or hung its own process"


def _watched(source, before=""):
    """What the watch recorded while ``source``'s flash_attention ran (``before`` runs
    first), or CRASHED."""
    try:
        run = subprocess.run(
            [sys.executable, "-c", _WATCH], input=json.dumps([source, before]),
            capture_output=True, text=True, timeout=60, cwd=paths.REPO,
            env={**os.environ, "PYTHONPATH": str(paths.REPO)},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return CRASHED
    if run.returncode != 0:
        return CRASHED
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["restored"], "the watch's modes were left off their stacks"
    return result["used"]


RUNTIME = (
    "issue",
    "ops_aten_no_dispatch",
    "pop_mode_stack",
    "eval_encoded",
    "restart_profiler",
)


def test_switching_the_watch_off_is_seen_while_it_runs():
    """Seen at run time, or the evasion broke its own kernel: either way it earns nothing
    there (and `test_switching_the_watch_off_is_found_in_the_code` refuses each by reading)."""
    for name in RUNTIME:
        used = _watched(EVASIONS[name])
        assert used == CRASHED or tampering_in(used) or features_in(used, ("sdpa",)), (
            name
        )
    # eval alone hides nothing at run time: it is plain delegation there
    for name in ("issue", "pop_mode_stack"):
        assert tampering_in(_watched(EVASIONS[name])), name


def test_a_profiler_left_running_is_tampering():
    left = "torch.autograd.profiler.profile(use_kineto=False).__enter__()\n"
    used = _watched(EVASIONS["issue"], before=left)
    assert (
        used == CRASHED
        or "a profiler was left running before the test" in tampering_in(used)
    )


def test_a_replaced_profiler_is_tampering():
    used = _watched(EVASIONS["patch_called_at_top_level"])  # profile = a lambda
    assert "PyTorch's profiler was replaced" in tampering_in(used)


def test_plain_delegation_is_delegation_and_own_code_is_nothing_at_run_time():
    direct = FLASH_HEAD + (
        "def flash_attention(q, k, v):\n    return F.scaled_dot_product_attention(q, k, v)\n"
    )
    used = _watched(direct)
    assert features_in(used, ("sdpa",)) == ["sdpa"] and tampering_in(used) == []
    own = FLASH_HEAD + (
        "def flash_attention(q, k, v):\n"
        "    w = torch.einsum('...id,...jd->...ij', q, k).exp()\n"
        "    return (w / w.sum(-1, keepdim=True)) @ v\n"
    )
    assert _watched(own) == []


def test_threads_and_processes_are_left_to_the_sealed_run():
    for name, source in ELSEWHERE.items():
        assert _tampering(source) == [], name
    for name in ("fork_child", "thread"):
        message = refusal([ELSEWHERE[name]], "flash_attention", ("sdpa",))
        assert "uses PyTorch's fused attention" in message, name


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


def test_honest_scratch_and_colab_cells_read_clean():
    for exercise in ("flash_attention", "SelfAttention"):
        cells = [FLASH_HEAD, OWN, *HONEST_CELLS]
        assert static_tampering(cells, exercise) == [], exercise
        assert refusal(cells, exercise, ("sdpa",)) is None


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
        message = refusal([source], "flash_attention", ("sdpa",))
        assert "uses PyTorch's fused attention" in message, name


FORGING = {
    "module_attribute": "torch.load = lambda *a, **k: None\n",
    "module_attribute_by_setattr": "setattr(torch, 'load', print)\n",
    "os_fork": "import os\nos.fork = lambda: 0\n",
    "aliased_profiler": "P = torch.autograd.profiler\nP.profile = object\n",
    "nested_patch": "if True:\n    for _ in range(1):\n        torch.autograd.profiler.profile = object\n",
    "sys_modules": "import sys\nsys.modules['torch.overrides'] = None\n",
    "settrace": "import sys\nsys.settrace(None)\n",
    "monitoring": "import sys\nsys.monitoring.use_tool_id(3, 'x')\n",
    "gc": "import gc\nprint(len(gc.get_objects()))\n",
    "frame": "import sys\nframe = sys._getframe()\n",
    "inspect_frame": "import inspect\nprint(inspect.currentframe().f_back.f_globals)\n",
    "ipython_events": "get_ipython().events.register('pre_run_cell', print)\n",
    "ipython_ast": "get_ipython().ast_transformers.append(object())\n",
    "ctypes": "import ctypes\n",
    "function_mode": "from torch.overrides import TorchFunctionMode\n",
}


def test_forging_the_watch_from_top_level_code_is_refused():
    for name, top_level in FORGING.items():
        source = (
            FLASH_HEAD + top_level + "def flash_attention(q, k, v):\n    return q\n"
        )
        assert _tampering(source), name
