// The opt-in GEMM tuner: it times the candidate schedules of each product it meets and keeps
// the fastest one whose result matches the default plan's within rounding, in memory and in a
// cache file that can be shipped with a model and read back without timing anything.
//
// Modes: off (the planner's choice, the cache unused), cached (cached winners, never timing)
// and tune (cached winners; problems not in the cache are timed once, then cached). The
// environment sets the starting mode at the first use: GEMMT_TUNE=1 tunes, GEMMT_TUNE_FILE
// names the cache file (read, and written after each newly tuned problem; with GEMMT_TUNE
// unset it is only read). gemmt.tune() changes both at run time.
//
// The cache file is a versioned text format, one entry a line (see cache_text()). Every
// entry names the GPU it was measured on (name, SM count, compute capability, driver), so a
// file can hold several GPUs; the whole file belongs to one library version. A file that
// does not parse, or comes from another library version, is ignored with a warning. Writers
// hold an advisory lock on <file>.lock, merge with the file's current contents, write a
// temporary file in the same folder and rename it over the old one, so readers never see a
// partial file and concurrent writers lose nothing.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gemmt/gemm_args.h"
#include "gemmt/gemm_variant.h"

#ifdef GEMMT_WITH_CUDA
#include <ATen/ATen.h>
#include <cuda_runtime.h>
#endif

namespace gemmt::wrapper::tuning {

enum class Mode : int { kOff = 0, kCached = 1, kTune = 2 };

const char* mode_name(Mode m);

// One schedule: a kernel family and, for the Hopper family, a forced tile width, split count
// (gemm_tc_hooks.h: >0 k-slices, -1/-4 stream-k) and orientation (0 auto, 1 as given, 2
// swapped). All zero: the family's own choice.
struct Plan {
  GemmVariant variant = GemmVariant::kAuto;
  int bn = 0;
  int splits = 0;
  int orient = 0;
  bool forced() const { return bn != 0 || splits != 0 || orient != 0; }
  bool operator==(const Plan& o) const {
    return variant == o.variant && bn == o.bn && splits == o.splits && orient == o.orient;
  }
  // "wgmma", or "wgmma:bn=128:splits=4:orient=swapped".
  std::string str() const;
  // Parses str()'s form; false (and *out untouched) for anything else.
  static bool parse(std::string_view text, Plan* out);
};

struct Entry {
  Plan plan;
  double tuned_us = 0.0;    // the winner's median time when it was tuned
  double default_us = 0.0;  // the default plan's, on the same inputs
};

// (device identity, problem key) -> winner.
using EntryMap = std::map<std::pair<std::string, std::string>, Entry>;

// The problem's cache key: dtype (tf32 apart from float32), m x n x k, operand layouts
// (which stride is unit), alignment of each operand's base and row stride (bytes, up to
// 16), the epilogue (bias and its direction, activation, pre-activation output), whether
// beta reads C, and the SMs the kernels may fill.
std::string problem_key(const GemmArgs& args);

// The file's text for `entries`, written by library version `library`.
std::string cache_text(const EntryMap& entries, const std::string& library);
// Parses cache_text()'s form. False with the reason in *why when it does not parse or comes
// from another library version (then *out is left empty).
bool parse_cache_text(const std::string& text, const std::string& library, EntryMap* out,
                      std::string* why);

// The version the cache files are keyed by (the library's).
const std::string& library_version();

// ---- Process-wide state (thread-safe) ------------------------------------------------
Mode mode();
std::string cache_path();
// Sets the mode and the cache file ("" keeps the cache in memory only). A new path is read
// and merged into memory: winners already in memory stay (a process never changes the plan
// of a problem it has run), the file's others are added. Problems in the file warn here.
void configure(Mode m, const std::string& path);
// Reads `path` into memory as configure() does; false (with a warning) when it is corrupt,
// from another version or unreadable. A missing file is an empty cache (true).
bool load(const std::string& path);
// Merges memory into the file at `path` (see the file comment). False with a warning when
// the file cannot be written.
bool save(const std::string& path);
EntryMap entries();
void insert(const std::string& device, const std::string& problem, const Entry& e);
void clear();

// What tuning has cost and found since the last reset.
struct ProblemStats {
  std::string device, problem;
  double seconds = 0.0;  // wall time of the tuning: runs, timing, verification
  int candidates = 0;    // schedules timed, the default included
  int rejected = 0;      // schedules whose result differed from the default plan's
  int failed = 0;        // schedules that would not launch
  Plan winner;
  double tuned_us = 0.0, default_us = 0.0;
  // Every schedule timed, the default first, with its time (us): what a planner rule is
  // fitted to.
  std::vector<std::pair<Plan, double>> timed;
};
struct Stats {
  std::vector<ProblemStats> problems;
  int64_t cache_hits = 0;      // products run with a cached winner
  int64_t capture_skips = 0;   // untuned products met during CUDA-graph capture
  int64_t untuned_cached = 0;  // untuned products met in cached mode (default plan run)
  int64_t tuning_skipped = 0;  // products tuning gave up on (out of memory, k == 0, ...)
};
Stats stats();
void reset_stats();

// For the timing side (gemm_tuner.cpp): the cached entry of a problem; adding a newly tuned
// winner (a plan already cached stays) with its costs, then writing the file when one is
// set; counting; whether the cache holds anything measured on `device`.
std::optional<Entry> lookup(const std::string& device, const std::string& problem);
void record(const std::string& device, const std::string& problem, const Entry& e,
            const ProblemStats& ps);
void count(int64_t Stats::* counter);
bool knows_device(const std::string& device);

#ifdef GEMMT_WITH_CUDA
// Runs the product with the plan the mode gives it (mode() != kOff): the cached winner, or
// the default plan, tuning the problem first in tune mode when the stream is not capturing.
// `c` is the output tensor (for its device and options). Returns the launch status.
cudaError_t run_auto(const char* op, const GemmArgs& args, const at::Tensor& c,
                     cudaStream_t stream);
#endif

}  // namespace gemmt::wrapper::tuning
