// The tuner's cache: plans, problem keys, the file format, and the process-wide state. Plain
// C++ (no CUDA), so CPU-only builds read, write and test the same files.
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "gemm_tuner.h"

#ifndef GEMMT_VERSION
#define GEMMT_VERSION "0.0.0"
#endif

namespace gemmt::wrapper::tuning {
namespace {

constexpr const char* kMagic = "gemmt-tuning-cache 1";

const char* orient_name(int o) {
  return o == 1 ? "given" : (o == 2 ? "swapped" : "auto");
}

bool parse_int(std::string_view s, long lo, long hi, int* out) {
  if (s.empty() || s.size() > 6) return false;
  std::size_t i = 0;
  const bool neg = s[0] == '-';
  if (neg) ++i;
  if (i == s.size()) return false;
  long v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  if (neg) v = -v;
  if (v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parse_us(const std::string& s, double* out) {
  if (s.empty() || s.size() > 32) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v) || v < 0.0) return false;
  *out = v;
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = s.find(sep, start);
    parts.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) break;
    start = at + 1;
  }
  return parts;
}

// Device and problem names must stay one tab-separated field of one line.
bool clean_field(const std::string& s) {
  if (s.empty() || s.size() > 512) return false;
  for (unsigned char ch : s) {
    if (ch < 0x20 || ch == 0x7f) return false;
  }
  return true;
}

int alignment_class(const void* p, int64_t stride, int64_t elt) {
  int a = 16;
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  while (a > 1 && (addr % a != 0 || (stride * elt) % a != 0)) a /= 2;
  return a;
}

char layout_class(int64_t rows_stride, int64_t inner_stride, char inner, char outer) {
  if (inner_stride == 1) return inner;
  if (rows_stride == 1) return outer;
  return 's';
}

std::string format_us(double v) {
  std::ostringstream s;
  s.precision(6);
  s << v;
  return s.str();
}

// ---- Process-wide state ---------------------------------------------------------------
struct State {
  std::mutex mu;  // guards everything below but `mode`
  std::atomic<int> mode{0};
  std::string path;
  EntryMap entries;
  Stats stats;
  std::mutex file_mu;  // one file write at a time in this process
};

bool truthy(const std::string& v, bool* out) {
  std::string s;
  for (char ch : v) s += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (s == "1" || s == "true" || s == "on" || s == "yes") {
    *out = true;
    return true;
  }
  if (s.empty() || s == "0" || s == "false" || s == "off" || s == "no") {
    *out = false;
    return true;
  }
  return false;
}

bool read_file(const std::string& path, std::string* text, bool* exists, std::string* why) {
  *exists = false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return true;
    *why = std::string("cannot open it: ") + std::strerror(errno);
    return false;
  }
  *exists = true;
  text->clear();
  char buf[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got < 0) {
      if (errno == EINTR) continue;
      *why = std::string("cannot read it: ") + std::strerror(errno);
      ::close(fd);
      return false;
    }
    if (got == 0) break;
    text->append(buf, static_cast<std::size_t>(got));
    if (text->size() > (std::size_t{64} << 20)) {
      *why = "it is larger than 64 MiB";
      ::close(fd);
      return false;
    }
  }
  ::close(fd);
  return true;
}

// Reads and parses `path`. *ok: false when it exists but cannot be used (reason in *why).
EntryMap read_cache(const std::string& path, bool* ok, bool* exists, std::string* why) {
  EntryMap map;
  std::string text;
  *ok = read_file(path, &text, exists, why);
  if (*ok && *exists) *ok = parse_cache_text(text, library_version(), &map, why);
  return map;
}

// An advisory lock on <path>.lock, held while a writer reads, merges and renames. Waits up
// to ten seconds for another writer, then goes on without it (a stuck lock must not stop the
// program; the rename still keeps the file whole).
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      why_ = std::string("cannot open it: ") + std::strerror(errno);
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if ((errno != EWOULDBLOCK && errno != EINTR) || std::chrono::steady_clock::now() > deadline) {
        why_ = "another writer held it for 10 s";
        ::close(fd_);
        fd_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    locked_ = true;
  }
  ~FileLock() {
    if (fd_ >= 0) {
      if (locked_) ::flock(fd_, LOCK_UN);
      ::close(fd_);
    }
  }
  bool locked() const { return locked_; }
  const std::string& why() const { return why_; }

 private:
  std::string why_;
  int fd_ = -1;
  bool locked_ = false;
};

bool write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t put = ::write(fd, text.data() + done, text.size() - done);
    if (put < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<std::size_t>(put);
  }
  return true;
}

State& state() {
  // The environment gives the starting mode, read once at the first use of the tuner.
  static State* s = [] {
    auto* st = new State();
    const char* tune = std::getenv("GEMMT_TUNE");
    const char* file = std::getenv("GEMMT_TUNE_FILE");
    bool on = false;
    if (tune != nullptr && !truthy(tune, &on)) {
      TORCH_WARN("gemmt: GEMMT_TUNE='", tune,
                 "' is not one of 1/true/on/yes or 0/false/off/no; tuning stays off");
    }
    const std::string path = file != nullptr ? file : "";
    st->mode = static_cast<int>(on ? Mode::kTune : (path.empty() ? Mode::kOff : Mode::kCached));
    st->path = path;
    return st;
  }();
  return *s;
}

std::once_flag env_file_loaded;
// The environment's file is read on first use, after state() exists (load() needs it).
State& ready_state() {
  State& s = state();
  std::call_once(env_file_loaded, [&] {
    std::string path;
    {
      std::lock_guard<std::mutex> lk(s.mu);
      path = s.path;
    }
    if (!path.empty()) load(path);
  });
  return s;
}
}  // namespace

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kCached:
      return "cached";
    case Mode::kTune:
      return "tune";
    default:
      return "off";
  }
}

std::string Plan::str() const {
  std::string s = gemm_variant_name(variant);
  if (forced()) {
    s += ":bn=" + std::to_string(bn) + ":splits=" + std::to_string(splits) +
         ":orient=" + orient_name(orient);
  }
  return s;
}

bool Plan::parse(std::string_view text, Plan* out) {
  std::vector<std::string> parts = split(std::string(text), ':');
  Plan p;
  if (!gemm_variant_from_name(parts[0], &p.variant) || p.variant == GemmVariant::kAuto ||
      p.variant == GemmVariant::kCount) {
    return false;
  }
  if (parts.size() == 1) {
    *out = p;
    return true;
  }
  if (parts.size() != 4 || p.variant != GemmVariant::kWgmma) return false;
  const std::string_view bn = parts[1], sp = parts[2], orient = parts[3];
  if (bn.substr(0, 3) != "bn=" || sp.substr(0, 7) != "splits=" ||
      orient.substr(0, 7) != "orient=") {
    return false;
  }
  if (!parse_int(bn.substr(3), 0, 256, &p.bn) || !parse_int(sp.substr(7), -4, 4096, &p.splits)) {
    return false;
  }
  if (p.bn != 0 && p.bn != 64 && p.bn != 128 && p.bn != 192 && p.bn != 256) return false;
  const std::string_view o = orient.substr(7);
  p.orient = o == "auto" ? 0 : (o == "given" ? 1 : (o == "swapped" ? 2 : -1));
  if (p.orient < 0 || !p.forced()) return false;
  *out = p;
  return true;
}

std::string problem_key(const GemmArgs& a) {
  const char* dt = a.dtype == ScalarType::kFloat16    ? "f16"
                   : a.dtype == ScalarType::kBFloat16 ? "bf16"
                   : a.allow_tf32                     ? "tf32"
                                                      : "f32";
  const int64_t elt = a.dtype == ScalarType::kFloat32 ? 4 : 2;
  std::ostringstream s;
  s << dt << ' ' << a.m << 'x' << a.n << 'x' << a.k;
  s << " a:" << layout_class(a.a_stride_m, a.a_stride_k, 'k', 'm')
    << " b:" << layout_class(a.b_stride_n, a.b_stride_k, 'k', 'n');
  s << " align:" << alignment_class(a.a, a.a_stride_k == 1 ? a.a_stride_m : a.a_stride_k, elt)
    << ',' << alignment_class(a.b, a.b_stride_k == 1 ? a.b_stride_n : a.b_stride_k, elt) << ','
    << alignment_class(a.c, a.ldc, elt);
  const GemmEpilogue& e = a.epilogue;
  s << " epi:" << (e.bias == nullptr ? "-" : (e.bias_per_row ? "bias_row" : "bias_col")) << ','
    << kActivationNames[static_cast<int>(e.activation)] << ','
    << (e.preact == nullptr ? "-" : "preact");
  s << " beta:" << (a.beta != 0.f ? 1 : 0) << " sms:" << a.sm_count;
  return s.str();
}

const std::string& library_version() {
  static const std::string v = GEMMT_VERSION;
  return v;
}

std::string cache_text(const EntryMap& entries, const std::string& library) {
  std::ostringstream s;
  s << kMagic << '\n' << "library " << library << '\n';
  for (const auto& [key, e] : entries) {
    s << "entry\t" << key.first << '\t' << key.second << '\t' << e.plan.str() << '\t'
      << format_us(e.tuned_us) << '\t' << format_us(e.default_us) << '\n';
  }
  s << "end " << entries.size() << '\n';
  return s.str();
}

bool parse_cache_text(const std::string& text, const std::string& library, EntryMap* out,
                      std::string* why) {
  out->clear();
  std::vector<std::string> lines = split(text, '\n');
  // The last line ends with '\n': drop the empty piece after it; a file without the final
  // newline is truncated.
  if (lines.empty() || !lines.back().empty()) {
    *why = "it does not end with a complete line (truncated?)";
    return false;
  }
  lines.pop_back();
  if (lines.size() < 3 || lines[0] != kMagic) {
    *why = std::string("it does not start with '") + kMagic + "'";
    return false;
  }
  if (lines[1].rfind("library ", 0) != 0) {
    *why = "its second line is not 'library <version>'";
    return false;
  }
  const std::string file_library = lines[1].substr(8);
  if (file_library != library) {
    *why = "it was written by gemmt " + file_library + ", this is gemmt " + library;
    return false;
  }
  EntryMap map;
  std::size_t entries = 0;
  for (std::size_t i = 2; i + 1 < lines.size(); ++i) {
    const std::vector<std::string> f = split(lines[i], '\t');
    Entry e;
    if (f.size() != 6 || f[0] != "entry" || !clean_field(f[1]) || !clean_field(f[2]) ||
        !Plan::parse(f[3], &e.plan) || !parse_us(f[4], &e.tuned_us) ||
        !parse_us(f[5], &e.default_us)) {
      *why = "line " + std::to_string(i + 1) + " is not a valid entry";
      return false;
    }
    map[{f[1], f[2]}] = e;
    ++entries;
  }
  int count = -1;
  const std::string& last = lines.back();
  if (last.rfind("end ", 0) != 0 ||
      !parse_int(std::string_view(last).substr(4), 0, 999999, &count) ||
      static_cast<std::size_t>(count) != entries) {
    *why = "it does not end with 'end " + std::to_string(entries) + "' (truncated or edited?)";
    return false;
  }
  *out = std::move(map);
  return true;
}

Mode mode() {
  return static_cast<Mode>(ready_state().mode.load(std::memory_order_relaxed));
}

std::string cache_path() {
  State& s = ready_state();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.path;
}

void configure(Mode m, const std::string& path) {
  State& s = ready_state();
  bool new_path = false;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    new_path = path != s.path;
    s.path = path;
  }
  if (new_path && !path.empty()) load(path);
  s.mode.store(static_cast<int>(m));
}

bool load(const std::string& path) {
  State& s = state();
  bool ok = false, exists = false;
  std::string why;
  EntryMap file = read_cache(path, &ok, &exists, &why);
  if (!ok) {
    TORCH_WARN("gemmt: ignoring the tuning cache '", path, "': ", why);
    return false;
  }
  std::lock_guard<std::mutex> lk(s.mu);
  // insert() keeps the entries already present: the plans this process runs stay fixed.
  s.entries.insert(file.begin(), file.end());
  return true;
}

bool save(const std::string& path) {
  State& s = ready_state();
  std::lock_guard<std::mutex> file_lock(s.file_mu);
  FileLock lock(path);
  if (!lock.locked()) {
    TORCH_WARN("gemmt: could not lock '", path, ".lock' (", lock.why(),
               "); writing the tuning cache without it");
  }
  bool ok = false, exists = false;
  std::string why;
  EntryMap merged = read_cache(path, &ok, &exists, &why);
  if (!ok) {
    TORCH_WARN("gemmt: replacing the tuning cache '", path, "', which cannot be merged: ", why);
    merged.clear();
  }
  {
    std::lock_guard<std::mutex> lk(s.mu);
    for (const auto& [key, e] : s.entries) merged[key] = e;
  }
  const std::string text = cache_text(merged, library_version());
  static std::atomic<unsigned> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    TORCH_WARN("gemmt: cannot write the tuning cache '", tmp, "': ", std::strerror(errno));
    return false;
  }
  const bool written = write_all(fd, text) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) {
    TORCH_WARN("gemmt: cannot write the tuning cache '", path,
               "': ", std::strerror(written ? errno : err));
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

EntryMap entries() {
  State& s = ready_state();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.entries;
}

void insert(const std::string& device, const std::string& problem, const Entry& e) {
  TORCH_CHECK(clean_field(device),
              "gemmt.tuning: argument 'device' expected a non-empty name of "
              "at most 512 printable characters, got '",
              device, "'");
  TORCH_CHECK(clean_field(problem),
              "gemmt.tuning: argument 'problem' expected a non-empty key of "
              "at most 512 printable characters, got '",
              problem, "'");
  TORCH_CHECK(std::isfinite(e.tuned_us) && e.tuned_us >= 0 && std::isfinite(e.default_us) &&
                  e.default_us >= 0,
              "gemmt.tuning: the times expected finite values >= 0, got ", e.tuned_us, " and ",
              e.default_us);
  State& s = ready_state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.entries[{device, problem}] = e;
}

void clear() {
  State& s = ready_state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.entries.clear();
}

Stats stats() {
  State& s = ready_state();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.stats;
}

void reset_stats() {
  State& s = ready_state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.stats = Stats{};
}

// ---- For the timing side (gemm_tuner.cpp) -------------------------------------------------
std::optional<Entry> lookup(const std::string& device, const std::string& problem) {
  State& s = ready_state();
  std::lock_guard<std::mutex> lk(s.mu);
  auto it = s.entries.find({device, problem});
  if (it == s.entries.end()) return std::nullopt;
  return it->second;
}

void record(const std::string& device, const std::string& problem, const Entry& e,
            const ProblemStats& ps) {
  State& s = ready_state();
  std::string path;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.entries.insert({{device, problem}, e});
    s.stats.problems.push_back(ps);
    path = s.path;
  }
  if (!path.empty()) save(path);
}

void count(int64_t Stats::* counter) {
  State& s = ready_state();
  std::lock_guard<std::mutex> lk(s.mu);
  ++(s.stats.*counter);
}

bool knows_device(const std::string& device) {
  State& s = ready_state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.entries.empty()) return true;
  auto it = s.entries.lower_bound({device, std::string()});
  return it != s.entries.end() && it->first.first == device;
}

}  // namespace gemmt::wrapper::tuning
