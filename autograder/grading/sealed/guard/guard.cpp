// The attention guard: PyTorch's attention kernels, switched off one way.
//
// Loaded into the sandbox's zygote before any student code, this library captures, for
// each guarded operator overload, the kernel the dispatcher would run at each of its
// lowest compute keys, and registers over it a boxed kernel that forwards to the captured
// one while the process is unarmed and throws once it is armed. The registrations are C++
// statics: no Python object holds them, so nothing in Python can remove them (no
// `_destroy`), and a key excluded or a mode disabled only skips keys above them.
//
// Armed means: this process has at least two more seccomp filters than it had when the
// library was loaded. Seccomp filters cannot be removed, so once armed a process (and
// every thread and fork of it) stays armed; the grader reads the same count from outside
// (/proc/<pid>/status) before it hands over the tests that forbid PyTorch's attention.
#include <torch/library.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <linux/magic.h>
#include <sys/prctl.h>
#include <sys/vfs.h>
#include <unistd.h>

namespace {

const char* kMessage =
    "is switched off while this exercise's hidden tests run: write the attention "
    "yourself (scores = q @ k^T / sqrt(d), masked softmax, weights @ v).";

// the overloads that compute PyTorch's attention (name, overload)
const char* kGuarded[][2] = {
    {"aten::scaled_dot_product_attention", ""},
    {"aten::_scaled_dot_product_attention_math", ""},
    {"aten::_scaled_dot_product_attention_math_for_mps", ""},
    {"aten::_scaled_dot_product_flash_attention_for_cpu", ""},
    {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", ""},
    {"aten::_scaled_dot_product_fused_attention_overrideable", ""},
    {"aten::_scaled_dot_product_fused_attention_overrideable_backward", ""},
    {"aten::_scaled_dot_product_flash_attention", ""},
    {"aten::_scaled_dot_product_flash_attention_backward", ""},
    {"aten::_scaled_dot_product_efficient_attention", ""},
    {"aten::_scaled_dot_product_efficient_attention_backward", ""},
    {"aten::_scaled_dot_product_cudnn_attention", ""},
    {"aten::_scaled_dot_product_cudnn_attention_backward", ""},
    {"aten::_flash_attention_forward", ""},
    {"aten::_flash_attention_backward", ""},
    {"aten::_efficient_attention_forward", ""},
    {"aten::_efficient_attention_backward", ""},
    {"aten::_native_multi_head_attention", ""},
    {"aten::_native_multi_head_attention", "out"},
    {"aten::_transformer_encoder_layer_fwd", ""},
    {"aten::_transformer_encoder_layer_fwd", "out"},
    {"aten::_transformer_decoder_only_layer_fwd", ""},
    {"aten::_fused_sdp_choice", ""},
    // the fused masked softmax inside nn.MultiheadAttention's and the encoder's fast paths
    {"aten::_masked_softmax", ""},
    {"aten::_masked_softmax", "out"},
    {"aten::_masked_softmax_backward", ""},
    {"aten::_masked_softmax_backward", "out"},
};

// the keys a guard is registered at, where the overload has a kernel of its own there
const c10::DispatchKey kKeys[] = {
    c10::DispatchKey::CPU,
    c10::DispatchKey::CUDA,
    c10::DispatchKey::HIP,
    c10::DispatchKey::XPU,
    c10::DispatchKey::MPS,
    c10::DispatchKey::NestedTensorCPU,
    c10::DispatchKey::NestedTensorCUDA,
    c10::DispatchKey::CompositeExplicitAutograd,
    c10::DispatchKey::CompositeExplicitAutogradNonFunctional,
    c10::DispatchKey::CompositeImplicitAutograd,
    c10::DispatchKey::CompositeImplicitAutogradNestedTensor,
    c10::DispatchKey::FuncTorchBatched,
    c10::DispatchKey::FuncTorchVmapMode,
    c10::DispatchKey::FuncTorchBatchedDecomposition,
};

int g_base_mode = 0;     // prctl(PR_GET_SECCOMP) when loaded
int g_base_filters = 0;  // Seccomp_filters when loaded
std::atomic<bool> g_armed{false};

// This process's seccomp filter count from /proc/self/status, or -1 when that file
// cannot be trusted: not procfs, or the status of another process (a /proc mounted
// over with something else by the student's code in a namespace of its own).
int seccomp_filters() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  struct statfs fs;
  if (fstatfs(fileno(f), &fs) != 0 || fs.f_type != PROC_SUPER_MAGIC) {
    std::fclose(f);
    return -1;
  }
  char line[512];
  int count = -1, mode = -1;
  long own_pid = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "Seccomp_filters:", 16) == 0) {
      count = std::atoi(line + 16);
    } else if (std::strncmp(line, "Seccomp:", 8) == 0) {
      mode = std::atoi(line + 8);
    } else if (std::strncmp(line, "NSpid:", 6) == 0) {
      const char* last = std::strrchr(line, '\t');  // the innermost namespace's pid
      own_pid = last ? std::atol(last + 1) : -1;
    }
  }
  std::fclose(f);
  if (own_pid != static_cast<long>(getpid())) return -1;
  if (mode != prctl(PR_GET_SECCOMP, 0, 0, 0, 0)) return -1;
  return count;
}

bool armed() {
  if (g_armed.load(std::memory_order_relaxed)) return true;
  int mode = prctl(PR_GET_SECCOMP, 0, 0, 0, 0);
  if (mode == 0 && g_base_mode == 0) return false;  // no filter at all: unarmed
  int filters = seccomp_filters();
  // a count that cannot be read or trusted while a filter was added: armed (fail closed)
  if (filters < 0 ? mode != g_base_mode : filters >= g_base_filters + 2) {
    g_armed.store(true);
  }
  return g_armed.load();
}

struct Original {
  c10::SafeKernelFunction kernel;
  std::string name;
};

class Guard final : public c10::OperatorKernel {
 public:
  explicit Guard(std::shared_ptr<Original> original) : original_(std::move(original)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                  torch::jit::Stack* stack) {
    if (armed()) {
      TORCH_CHECK(false, "PyTorch's attention (", original_->name, ") ", kMessage);
    }
    original_->kernel.callBoxed(op, ks, stack);
  }

 private:
  std::shared_ptr<Original> original_;
};

struct Registrations {
  std::vector<std::unique_ptr<torch::Library>> libraries;
  std::vector<std::string> guarded;  // "name.overload@Key"
};

Registrations* g_registrations = nullptr;  // never freed: the guards stay for good

std::string short_name(const char* name) {
  std::string s(name);
  return s.rfind("aten::", 0) == 0 ? s.substr(6) : s;
}

// the dispatcher warns once that a kernel is overridden: expected here, so not shown
class Quiet final : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

void install() {
  Quiet quiet;
  c10::WarningUtils::WarningHandlerGuard silence(&quiet);
  g_base_mode = prctl(PR_GET_SECCOMP, 0, 0, 0, 0);
  g_base_filters = seccomp_filters();
  if (g_base_filters < 0) g_base_filters = 0;
  auto* regs = new Registrations();
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& entry : kGuarded) {
    auto op = dispatcher.findSchema({entry[0], entry[1]});
    if (!op.has_value()) continue;  // not in this build of PyTorch
    for (auto key : kKeys) {
      if (!op->hasKernelForDispatchKey(key)) continue;
      // the kernel that runs for this key now (for an alias key: for a key it serves)
      c10::DispatchKey probe = key;
      if (key == c10::DispatchKey::CompositeExplicitAutograd ||
          key == c10::DispatchKey::CompositeExplicitAutogradNonFunctional ||
          key == c10::DispatchKey::CompositeImplicitAutograd) {
        probe = c10::DispatchKey::CPU;
        if (op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
          // CPU has its own kernel (guarded above); the alias serves other backends
          probe = c10::DispatchKey::Meta;
          if (op->hasKernelForDispatchKey(probe)) continue;
        }
      } else if (key == c10::DispatchKey::CompositeImplicitAutogradNestedTensor) {
        probe = c10::DispatchKey::NestedTensorCPU;
      } else if (key == c10::DispatchKey::FuncTorchBatchedDecomposition) {
        probe = c10::DispatchKey::FuncTorchBatched;
      }
      auto original = std::make_shared<Original>(
          Original{op->getComputedKernelForDispatchKey(probe), short_name(entry[0])});
      auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key,
                                                  __FILE__, __LINE__);
      std::string qualified = entry[1][0] ? std::string(entry[0]) + "." + entry[1]
                                          : std::string(entry[0]);
      lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                       std::make_unique<Guard>(original)));
      regs->libraries.push_back(std::move(lib));
      regs->guarded.push_back(short_name(qualified.c_str()) + "@" + c10::toString(key));
    }
  }
  g_registrations = regs;
}

struct Installer {
  Installer() { install(); }
} g_installer;

}  // namespace

// Plain C entry points for the grader's checks (ctypes); none of them changes anything.
extern "C" {
int attention_guard_armed() { return armed() ? 1 : 0; }
int attention_guard_count() {
  return g_registrations ? static_cast<int>(g_registrations->guarded.size()) : 0;
}
const char* attention_guard_entry(int i) {
  if (!g_registrations || i < 0 ||
      i >= static_cast<int>(g_registrations->guarded.size()))
    return nullptr;
  return g_registrations->guarded[i].c_str();
}
int attention_guard_base_filters() { return g_base_filters; }
}
