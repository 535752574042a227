// Ascend C emulated on CPU: the runtime linked into every emulated kernel.
//
// A launch runs in a forked child process (driver.py): the child runs the cores one after another in the
// order the driver chose, each with a fresh, poisoned UB between guard pages. Every detected fault writes its
// message to a shared status block and ends the child with _exit, so no fault can take down the Python
// process; memory faults of raw pointer accesses (generated scalar / SIMT code) are caught by a SIGSEGV
// handler that classifies the address (UB guard, GM guard of an argument, SIMT stack guard).
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <array>
#include <string>
#include <deque>
#include <map>
#include <tuple>
#include <vector>

#include "emu/asc_emu.h"

namespace emu {
State st;
}
int64_t block_idx = 0;
int64_t block_num = 1;
emu_dim3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, blockDim{1, 1, 1}, gridDim{1, 1, 1};

namespace {
struct Status {
  int32_t state;  // 0 running, 1 failed, 2 finished
  int32_t core;
  char msg[4088];
};
Status *g_status = nullptr;
emu::Counters *g_counters = nullptr;
uint8_t g_poison[4] = {0xff, 0xff, 0xff, 0xff};
size_t g_page = 4096;
uint32_t g_timeout_s = 0;
uint8_t *g_ub_map = nullptr;  // guard | UB (rounded to pages) | guard
size_t g_ub_map_bytes = 0, g_ub_guard = 64 * 1024;
struct GuardRange {
  const uint8_t *lo, *hi;
  int arg;
};
std::vector<GuardRange> g_gm_guards;
std::map<std::tuple<int, int, int>, std::deque<std::array<uint32_t, emu::NT>>> g_flags;
std::vector<std::string> g_names;

// SIMT coroutines
enum ThreadState { READY, AT_BLOCK, AT_WARP, DONE };
struct SimtThread {
  ucontext_t ctx;
  int state;
  int phase;
};
constexpr size_t kStack = 256 * 1024;
std::vector<SimtThread> g_thr;
std::vector<uint8_t *> g_stacks;
ucontext_t g_sched;
int g_cur = -1;
int g_nthr = 0;
cce::dim3 g_dim;
void (*g_body)(void *) = nullptr;
void *g_ctx = nullptr;
std::vector<uint64_t> g_slots[2];
std::vector<uint32_t> g_live[2];

void set_thread_idx(int t) {
  threadIdx.x = (uint32_t)t % g_dim.x;
  threadIdx.y = ((uint32_t)t / g_dim.x) % g_dim.y;
  threadIdx.z = (uint32_t)t / (g_dim.x * g_dim.y);
}
}  // namespace

namespace emu {
[[noreturn]] void fail_v(const char *pipe, const char *fmt, va_list ap) {
  char buf[3500];
  vsnprintf(buf, sizeof buf, fmt, ap);
  if (g_status) {
    snprintf(g_status->msg, sizeof g_status->msg, "kernel %s, core %d (block_idx), %s: %s", st.kernel, st.core, pipe,
             buf);
    g_status->core = st.core;
    g_status->state = 1;
  } else {
    fprintf(stderr, "emulator fault outside a launch: %s\n", buf);
  }
  _exit(3);
}
[[noreturn]] void unemulated(const char *name) {
  fail(st.in_simt || st.in_simd_vf ? "PIPE_V" : "PIPE_S",
       "%s is declared by the emulator but not emulated (it was reached)", name);
}
uint8_t poison_byte(uint64_t off) { return g_poison[off % 4]; }

void sync_notify(int src, int dst, int ev) {
  int s = track_of(src, "asc_sync_notify"), d = track_of(dst, "asc_sync_notify");
  std::array<uint32_t, NT> v;
  for (int x = 0; x < NT; ++x) v[x] = st.know[s][x];
  v[s] = st.issue[s];  // the flag is set once every op issued on src before it has completed
  g_flags[{s, d, ev}].push_back(v);
}
void sync_wait(int src, int dst, int ev) {
  int s = track_of(src, "asc_sync_wait"), d = track_of(dst, "asc_sync_wait");
  auto it = g_flags.find({s, d, ev});
  if (it == g_flags.end() || it->second.empty())
    fail(track_name(d), "asc_sync_wait(%s, %s, %d) with no pending asc_sync_notify: a deadlock on hardware",
         track_name(s), track_name(d), ev);
  auto v = it->second.front();
  it->second.pop_front();
  for (int x = 0; x < NT; ++x)
    if (v[x] > st.know[d][x]) st.know[d][x] = v[x];
}
void sync_all() {
  for (int q = 0; q < NT; ++q)
    for (int x = 0; x < NT; ++x) st.know[q][x] = st.issue[x];
}
void pipe_fence(int p) {
  int q = track_of(p, "pipe_barrier");
  st.know[q][q] = st.issue[q];
}
// asc_mem_bar (reg/sync_control/asc_mem_bar.md): VST_VLD / VV_ALL order earlier vector stores before later
// vector loads inside a SIMD VF; the other kinds order accesses this model does not track inside a VF.
void mem_bar(int kind) {
  if (kind == VST_VLD || kind == VV_ALL) st.vf_gen += 2;
}

void simt_run(cce::dim3 d, void (*body)(void *), void *ctx) {
  if (st.in_simt) fail("PIPE_V", "asc_vf_call inside a SIMT VF");
  int n = (int)(d.x * d.y * d.z);
  if (n < 1 || n > 2048) fail("PIPE_V", "asc_vf_call with %d threads (1..2048 emulated)", n);
  st.ctr->simt_vf_calls++;
  st.ctr->simt_threads += (uint64_t)n;
  int saved_cur = st.cur;
  st.cur = T_V;
  st.in_simt = true;
  g_dim = d;
  blockDim = {d.x, d.y, d.z};
  g_body = body;
  g_ctx = ctx;
  g_nthr = n;
  if ((int)g_thr.size() < n) g_thr.resize(n);
  while ((int)g_stacks.size() < n) {
    uint8_t *m = (uint8_t *)mmap(nullptr, kStack + g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fail("PIPE_V", "cannot map a SIMT thread stack");
    mprotect(m, g_page, PROT_NONE);  // guard below the stack
    g_stacks.push_back(m);
  }
  for (int k = 0; k < 2; ++k) {
    g_slots[k].assign((size_t)n + 32, 0);
    g_live[k].assign((size_t)n / 32 + 2, 0);
  }
  for (int t = 0; t < n; ++t) {
    SimtThread &th = g_thr[t];
    th.state = READY;
    th.phase = 0;
    getcontext(&th.ctx);
    th.ctx.uc_stack.ss_sp = g_stacks[t] + g_page;
    th.ctx.uc_stack.ss_size = kStack;
    th.ctx.uc_link = &g_sched;
    makecontext(&th.ctx, (void (*)()) + []() {
      g_body(g_ctx);
      g_thr[g_cur].state = DONE;
    }, 0);
  }
  for (;;) {
    for (int t = 0; t < n; ++t)
      if (g_thr[t].state == READY) {
        g_cur = t;
        set_thread_idx(t);
        swapcontext(&g_sched, &g_thr[t].ctx);
      }
    int done = 0, at_block = 0;
    for (int t = 0; t < n; ++t) {
      done += g_thr[t].state == DONE;
      at_block += g_thr[t].state == AT_BLOCK;
    }
    if (done == n) break;
    bool released = false;
    for (int w0 = 0; w0 < n; w0 += 32) {
      int w1 = w0 + 32 < n ? w0 + 32 : n;
      int waiting = 0, live = 0, phase = -1;
      bool mixed = false;
      for (int t = w0; t < w1; ++t) {
        if (g_thr[t].state == DONE) continue;
        live++;
        if (g_thr[t].state == AT_WARP) {
          waiting++;
          if (phase >= 0 && phase != g_thr[t].phase) mixed = true;
          phase = g_thr[t].phase;
        }
      }
      if (waiting && waiting == live) {
        if (mixed) fail("PIPE_V", "SIMT warp %d: its threads reached different warp collectives", w0 / 32);
        uint32_t mask = 0;
        for (int t = w0; t < w1; ++t)
          if (g_thr[t].state == AT_WARP) {
            mask |= 1u << (t - w0);
            g_thr[t].state = READY;
          }
        g_live[phase][w0 / 32] = mask;
        released = true;
      }
    }
    if (!released && at_block == n - done) {
      for (int t = 0; t < n; ++t)
        if (g_thr[t].state == AT_BLOCK) g_thr[t].state = READY;
      released = true;
    }
    if (!released)
      fail("PIPE_V",
           "SIMT VF deadlock: %d of %d live threads wait in asc_syncthreads while the others wait in a warp "
           "collective",
           at_block, n - done);
  }
  st.in_simt = false;
  st.cur = saved_cur;
  threadIdx = {0, 0, 0};
}
void simt_syncthreads() {
  if (!st.in_simt) fail(track_name(st.cur), "asc_syncthreads outside a SIMT VF");
  g_thr[g_cur].state = AT_BLOCK;
  int me = g_cur;
  swapcontext(&g_thr[me].ctx, &g_sched);
}
const uint64_t *simt_warp_collect(uint64_t v, uint32_t *live_mask) {
  if (!st.in_simt) fail(track_name(st.cur), "a warp collective outside a SIMT VF");
  int me = g_cur;
  int ph = g_thr[me].phase;
  g_slots[ph][me] = v;
  g_thr[me].state = AT_WARP;
  swapcontext(&g_thr[me].ctx, &g_sched);
  g_thr[me].phase ^= 1;
  *live_mask = g_live[ph][me / 32];
  return &g_slots[ph][(me / 32) * 32];
}
uint32_t simt_lane() { return (uint32_t)g_cur & 31; }
}  // namespace emu

namespace {
void on_signal(int sig, siginfo_t *si, void *) {
  using emu::st;
  const uint8_t *a = (const uint8_t *)si->si_addr;
  const char *pipe = emu::track_name(st.cur);
  if (g_status && (sig == SIGSEGV || sig == SIGBUS)) {
    if (g_ub_map && a >= g_ub_map && a < g_ub_map + g_ub_map_bytes)
      emu::fail(pipe, "UB access outside the UB: raw access at byte offset %lld of a %u-byte UB (guard page)",
                (long long)(a - st.ub), st.ub_limit);
    // a guard page between two regions belongs to both: name the argument whose bytes are nearest
    int best = -1;
    uint64_t best_dist = UINT64_MAX;
    for (auto &g : g_gm_guards)
      if (a >= g.lo && a < g.hi) {
        const emu::GmArg &arg = st.gm[g.arg];
        uint64_t dist = a < arg.base ? (uint64_t)(arg.base - a) : (uint64_t)(a - (arg.base + arg.size));
        if (dist < best_dist) best = g.arg, best_dist = dist;
      }
    if (best >= 0) {
      const emu::GmArg &arg = st.gm[best];
      emu::fail(pipe, "GM access outside the tensor argument '%s': raw access at byte offset %lld of a %llu-byte tensor",
                arg.name, (long long)(a - arg.base), (unsigned long long)arg.size);
    }
    for (auto *s : g_stacks)
      if (a >= s && a < s + g_page) emu::fail(pipe, "SIMT thread stack overflow (%zu-byte stacks)", kStack);
    emu::fail(pipe, "segmentation fault at address %p (no UB or GM argument)", (const void *)a);
  }
  if (sig == SIGABRT) emu::fail(pipe, "abort() (a failed device assert or a C++ runtime error)");
  if (sig == SIGALRM)
    emu::fail(pipe, "the launch did not finish within %u s (OPS_TILELANG_EMU_TIMEOUT_S): an endless loop?", g_timeout_s);
  emu::fail(pipe, "signal %d (%s) at address %p", sig, strsignal(sig), (const void *)a);
}
}  // namespace

extern "C" {
// ---- parent side: shared memory for the GM arena and the status block
void *emu_map_shared(uint64_t bytes) {
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}
int emu_protect_none(void *p, uint64_t bytes) { return mprotect(p, bytes, PROT_NONE); }
int emu_unmap(void *p, uint64_t bytes) { return munmap(p, bytes); }
uint64_t emu_page_size() { return (uint64_t)sysconf(_SC_PAGESIZE); }
uint64_t emu_counters_size() { return sizeof(emu::Counters); }

// ---- configuration (called in the parent before fork; the child inherits it)
void emu_configure(const char *kernel, uint32_t ub_limit, int64_t grid, int saturate, int strict_pad, int vf_membar,
                   void *status, void *counters) {
  g_names.clear();
  g_names.emplace_back(kernel);
  emu::st.kernel = g_names[0].c_str();
  emu::st.ub_limit = ub_limit;
  emu::st.grid = grid;
  emu::st.saturate = saturate != 0;
  emu::st.strict_pad = strict_pad != 0;
  emu::st.vf_membar = vf_membar != 0;
  g_status = (Status *)status;
  g_counters = (emu::Counters *)counters;
  block_num = grid;
  gridDim = {(uint32_t)grid, 1, 1};
  emu::st.ngm = 0;
  g_gm_guards.clear();
}
int emu_add_gm_arg(const char *name, const void *base, uint64_t size, const void *guard_lo_start,
                   const void *guard_lo_end, const void *guard_hi_start, const void *guard_hi_end) {
  if (emu::st.ngm >= 64) return -1;
  g_names.emplace_back(name);
  int i = emu::st.ngm++;
  emu::st.gm[i] = {(const uint8_t *)base, size, nullptr};
  g_gm_guards.push_back({(const uint8_t *)guard_lo_start, (const uint8_t *)guard_lo_end, i});
  g_gm_guards.push_back({(const uint8_t *)guard_hi_start, (const uint8_t *)guard_hi_end, i});
  return i;
}

// ---- child side
void emu_child_start(uint32_t poison_word, uint32_t timeout_s) {
  for (int i = 0; i < emu::st.ngm; ++i) emu::st.gm[i].name = g_names[(size_t)i + 1].c_str();
  std::memcpy(g_poison, &poison_word, 4);
  g_page = (size_t)sysconf(_SC_PAGESIZE);
  static std::vector<uint8_t> altstack(256 * 1024);
  stack_t ss{};
  ss.ss_sp = altstack.data();
  ss.ss_size = altstack.size();
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) sigaction(sig, &sa, nullptr);
  g_timeout_s = timeout_s;
  if (timeout_s) alarm(timeout_s);  // an endless loop (or a spin on a flag no core sets) ends the launch
  uint32_t lim = emu::st.ub_limit;
  size_t ub_round = (lim + g_page - 1) / g_page * g_page;
  g_ub_map_bytes = ub_round + 2 * g_ub_guard;
  g_ub_map = (uint8_t *)mmap(nullptr, g_ub_map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (g_ub_map == MAP_FAILED) emu::fail("PIPE_S", "cannot map the UB");
  // the UB ends exactly at a guard page when its limit is a multiple of the page size (248 KB and 216 KB are)
  emu::st.ub = g_ub_map + g_ub_guard + (ub_round - lim);
  mprotect(g_ub_map + g_ub_guard, ub_round, PROT_READ | PROT_WRITE);
  emu::st.written = new uint8_t[lim];
  emu::st.pad = new uint8_t[lim];
  emu::st.wpipe = new int8_t[lim];
  emu::st.wtime = new uint32_t[lim];
  for (auto &r : emu::st.rtime) r = new uint32_t[lim];
  emu::st.vst_gen = new uint32_t[lim];
}
void emu_core_begin(int core) {
  using emu::st;
  uint32_t lim = st.ub_limit;
  st.core = core;
  block_idx = core;
  blockIdx = {(uint32_t)core, 0, 0};
  st.ctr = &g_counters[core];
  std::memset(st.ctr, 0, sizeof *st.ctr);
  for (uint32_t i = 0; i < lim; ++i) st.ub[i] = g_poison[i % 4];
  std::memset(st.written, 0, lim);
  std::memset(st.pad, 0, lim);
  std::memset(st.wpipe, -1, lim);
  std::memset(st.wtime, 0, 4ull * lim);
  for (auto &r : st.rtime) std::memset(r, 0, 4ull * lim);
  std::memset(st.vst_gen, 0, 4ull * lim);
  std::memset(st.issue, 0, sizeof st.issue);
  std::memset(st.know, 0, sizeof st.know);
  st.cur = emu::T_S;
  st.in_simd_vf = st.in_simt = false;
  g_flags.clear();
  if (g_status) g_status->core = core;
}
// End of a core: every notify must have been waited for (an unmatched flag is a synchronisation bug).
void emu_core_end() {
  using emu::st;
  std::string left;
  int n = 0;
  for (auto &[k, q] : g_flags)
    if (!q.empty()) {
      char b[128];
      snprintf(b, sizeof b, "%s(%s, %s, %d) x%zu", n ? "; " : "", emu::track_name(std::get<0>(k)),
               emu::track_name(std::get<1>(k)), std::get<2>(k), q.size());
      left += b;
      n += (int)q.size();
    }
  if (n) emu::fail("PIPE_S", "%d asc_sync_notify still pending when the core ended: %s", n, left.c_str());
}
void emu_child_done() {
  if (g_status) g_status->state = 2;
}
void emu_child_fail(const char *msg) { emu::fail("PIPE_S", "%s", msg); }
}
