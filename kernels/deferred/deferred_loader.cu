// Builds, caches and loads the kernel groups a build compiles on first use
// (include/gemmt/deferred.h). Host code only. The compile command, the group's files and the
// build's source tree come from gemmt_deferred_config.h, which CMake writes when
// GEMMT_DEFERRED_GROUPS names any group; without it every group is in the module and this file
// only answers that nothing is deferred.
#include "gemmt/deferred.h"

#include <string>

#ifdef GEMMT_DEFERRED_KERNELS
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "gemmt_deferred_config.h"
#ifdef GEMMT_DEFERRED_DIGEST_HEADER
#include "gemmt_header_digest.h"  // cmake/header_digest.py, rewritten when a header changes
#else
#define GEMMT_DEFERRED_HEADER_DIGEST ""  // no Python at configure time: not checked
#endif

extern char** environ;
#endif

namespace gemmt {
namespace deferred {
namespace {

thread_local std::string last_failure;

bool fail(std::string why) {
  last_failure = std::move(why);
  return false;
}

}  // namespace

const char* failure() {
  return last_failure.c_str();
}

bool refuse(const char** why) {
  if (why != nullptr) *why = failure();
  return false;
}

#ifndef GEMMT_DEFERRED_KERNELS

const char* groups() {
  return "";
}
bool load(const char*) {
  return true;
}
void* symbol(const char* group, const char* name) {
  fail(std::string("gemmt: kernel group '") + group + "' is part of the module, so " + name +
       " is not looked up");
  return nullptr;
}

#else

namespace {

std::vector<std::string> split_lines(const char* text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

bool is_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// The sources the group libraries compile from: GEMMT_SOURCE_DIR, else the copy installed
// beside the module (the wheel's gemmt/_src), else the tree the module was built from.
std::string source_root() {
  const std::string given = env_or("GEMMT_SOURCE_DIR", "");
  if (!given.empty()) return given;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&groups), &info) != 0 && info.dli_fname != nullptr) {
    std::string dir(info.dli_fname);
    const size_t slash = dir.rfind('/');
    dir = slash == std::string::npos ? "." : dir.substr(0, slash);
    if (is_file(dir + "/_src/sources.txt")) return dir + "/_src";
  }
  return GEMMT_DEFERRED_SOURCE_DIR;
}

std::string cache_root() {
  std::string root = env_or("GEMMT_CACHE_DIR", "");
  if (!root.empty()) return root;
  root = env_or("XDG_CACHE_HOME", "");
  if (!root.empty()) return root + "/gemmt";
  root = env_or("HOME", "");
  if (!root.empty()) return root + "/.cache/gemmt";
  return "/tmp/gemmt-" + std::to_string(::getuid());
}

bool make_dirs(const std::string& path) {
  for (size_t pos = 1; pos != std::string::npos;) {
    pos = path.find('/', pos + 1);
    const std::string part = path.substr(0, pos);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}

// 64-bit FNV-1a: identifies a tree of sources and a command, not a security boundary.
struct Hash {
  uint64_t h = 1469598103934665603ull;
  void add(const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // separates consecutive strings
  }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }
};

// Every header under dir (recursively), sorted, so the key sees any header a source includes.
void list_headers(const std::string& dir, std::vector<std::string>* out) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      list_headers(path, out);
    } else if (name.size() > 2 && (name.rfind(".h") == name.size() - 2 ||
                                   (name.size() > 4 && name.rfind(".cuh") == name.size() - 4))) {
      out->push_back(path);
    }
  }
}

struct GroupBuild {
  std::string group, root, nvcc, dir, library;
  std::vector<std::string> sources;  // relative to root
  std::vector<std::string> flags;
};

std::vector<std::string> group_sources(const std::string& group) {
  std::vector<std::string> out;
  for (const std::string& line : split_lines(GEMMT_DEFERRED_FILES)) {
    const size_t colon = line.find(':');
    if (line.compare(0, colon, group) == 0) out.push_back(line.substr(colon + 1));
  }
  for (const std::string& f : split_lines(GEMMT_DEFERRED_SUPPORT_FILES)) out.push_back(f);
  return out;
}

bool describe(const std::string& group, GroupBuild* b) {
  b->group = group;
  b->root = source_root();
  b->nvcc = env_or("GEMMT_NVCC", GEMMT_DEFERRED_NVCC);
  b->sources = group_sources(group);
  b->flags = split_lines(GEMMT_DEFERRED_FLAGS);
  std::string upper = group;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  b->flags.push_back("-DGEMMT_DEFERRED_GROUP_LIB");
  b->flags.push_back("-DGEMMT_DEFER_" + upper);
  b->flags.push_back("-I" + b->root + "/include");
  b->flags.push_back("-I" + b->root + "/kernels");
  Hash key;
  key.add(b->nvcc);
  for (const std::string& f : b->flags) key.add(f);
  key.add(GEMMT_DEFERRED_SPLIT_FLAG);
  for (const std::string& rel : b->sources) {
    std::string text;
    if (!read_file(b->root + "/" + rel, &text)) {
      return fail("gemmt: the sources of kernel group '" + group + "' are not at " + b->root +
                  " (" + rel + " is missing); set GEMMT_SOURCE_DIR to a gemmt source tree");
    }
    key.add(rel);
    key.add(text);
  }
  // The headers carry the types both sides of the boundary share: a group compiled from
  // headers other than the module's could misread its arguments, so it is refused.
  Hash headers_digest;
  std::vector<std::string> headers;
  list_headers(b->root + "/include", &headers);
  list_headers(b->root + "/kernels", &headers);
  for (const std::string& path : headers) {
    std::string text;
    if (read_file(path, &text)) {
      headers_digest.add(path.substr(b->root.size()));
      headers_digest.add(text);
    }
  }
  const std::string built_with = GEMMT_DEFERRED_HEADER_DIGEST;
  if (!built_with.empty() && headers_digest.hex() != built_with) {
    return fail("gemmt: the headers at " + b->root + " are not the ones the module was built " +
                "with (digest " + headers_digest.hex() + ", the module's " + built_with +
                "), so kernel group '" + group + "' is not compiled from them; rebuild the " +
                "module, or set GEMMT_SOURCE_DIR to the sources it was built from");
  }
  key.add(headers_digest.hex());
  b->dir = cache_root() + "/kernels-" + key.hex();
  b->library = b->dir + "/libgemmt_" + group + ".so";
  return true;
}

// Starts argv with its output to log: its pid, or -1 when it could not start.
pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) errno = rc;  // posix_spawnp returns its error rather than setting errno
  return rc == 0 ? pid : -1;
}

bool wait_ok(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string log_tail(const std::string& log) {
  std::string text;
  read_file(log, &text);
  return text.size() > 2000 ? "..." + text.substr(text.size() - 2000) : text;
}

bool split_compiles(const std::string& rel) {
  // CMakeLists.txt: the Hopper GEMM's instance files compile in one thread.
  return rel.rfind("kernels/sm90/instances_", 0) != 0;
}

// Compiles every source into an object (as many at once as there are cores), links the
// library under a temporary name and renames it into place.
bool compile(const GroupBuild& b) {
  const std::string work = b.dir + "/" + b.group + ".build." + std::to_string(::getpid());
  if (!make_dirs(work)) return fail("gemmt: cannot create " + work);
  std::fprintf(stderr,
               "gemmt: compiling the '%s' kernels on first use (%zu files) into %s; later runs "
               "load them from there\n",
               b.group.c_str(), b.sources.size(), b.library.c_str());
  const auto start = std::chrono::steady_clock::now();
  const size_t jobs = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> objects, logs;
  std::vector<std::pair<pid_t, size_t> > running;
  bool ok = true;
  std::string why;
  auto reap = [&](size_t keep) {
    while (running.size() > keep) {
      const auto [pid, i] = running.front();
      running.erase(running.begin());
      if (!wait_ok(pid) && ok) {
        ok = false;
        why = "compiling " + b.sources[i] + " failed (" + logs[i] + "):\n" + log_tail(logs[i]);
      }
    }
  };
  for (size_t i = 0; i < b.sources.size(); ++i) {
    objects.push_back(work + "/" + std::to_string(i) + ".o");
    logs.push_back(work + "/" + std::to_string(i) + ".log");
    std::vector<std::string> args{b.nvcc};
    args.insert(args.end(), b.flags.begin(), b.flags.end());
    if (split_compiles(b.sources[i]) && *GEMMT_DEFERRED_SPLIT_FLAG != '\0') {
      args.push_back(GEMMT_DEFERRED_SPLIT_FLAG);
    }
    args.insert(args.end(), {"-x", "cu", "-c", b.root + "/" + b.sources[i], "-o", objects[i]});
    reap(jobs - 1);
    const pid_t pid = spawn(args, logs[i]);
    if (pid < 0) {
      reap(0);
      return fail("gemmt: cannot run the CUDA compiler '" + b.nvcc + "' (" + std::strerror(errno) +
                  ") to build kernel group '" + b.group +
                  "'; set GEMMT_NVCC, or build gemmt with -DGEMMT_DEFERRED_GROUPS= to compile "
                  "every group at install time");
    }
    running.emplace_back(pid, i);
  }
  reap(0);
  if (!ok) return fail("gemmt: building kernel group '" + b.group + "': " + why);
  const std::string temp = work + "/libgemmt_" + b.group + ".so";
  std::vector<std::string> link{b.nvcc, "-shared", "-cudart", "shared"};
  for (const std::string& f : split_lines(GEMMT_DEFERRED_LINK_FLAGS)) link.push_back(f);
  link.insert(link.end(), objects.begin(), objects.end());
  link.insert(link.end(), {"-o", temp});
  const std::string link_log = work + "/link.log";
  const pid_t pid = spawn(link, link_log);
  if (pid < 0 || !wait_ok(pid)) {
    return fail("gemmt: linking kernel group '" + b.group + "' failed (" + link_log + "):\n" +
                log_tail(link_log));
  }
  if (std::rename(temp.c_str(), b.library.c_str()) != 0) {
    return fail("gemmt: cannot move " + temp + " to " + b.library + ": " + std::strerror(errno));
  }
  for (size_t i = 0; i < objects.size(); ++i) {
    std::remove(objects[i].c_str());
    std::remove(logs[i].c_str());
  }
  std::remove(link_log.c_str());
  ::rmdir(work.c_str());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "gemmt: the '%s' kernels compiled in %.1f s\n", b.group.c_str(), s);
  return true;
}

// One build of a group at a time across processes: the lock file's holder compiles, the
// others wait, then find the library in place.
bool build_locked(const GroupBuild& b) {
  if (!make_dirs(b.dir)) return fail("gemmt: cannot create the kernel cache folder " + b.dir);
  const std::string lock_path = b.dir + "/" + b.group + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
  if (fd < 0) return fail("gemmt: cannot open " + lock_path + ": " + std::strerror(errno));
  while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  const bool ok = is_file(b.library) || compile(b);
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return ok;
}

bool is_deferred(const std::string& group) {
  std::istringstream in(GEMMT_DEFERRED_GROUP_LIST);
  for (std::string g; std::getline(in, g, ',');) {
    if (g == group) return true;
  }
  return false;
}

// What the process knows of a group: its library once loaded, or why it could not be had. A
// group that failed fails again at once, with the same reason, until the process restarts: a
// compile takes tens of seconds, and callers may ask on every launch.
struct GroupState {
  std::mutex mutex;  // held while the group builds, so two groups build side by side
  void* handle = nullptr;
  bool failed = false;
  std::string why;
};

GroupState& state_of(const std::string& group) {
  static std::mutex m;
  static std::map<std::string, GroupState> states;
  std::lock_guard<std::mutex> lock(m);
  return states[group];  // std::map never moves its elements
}

// The group's library handle, built and loaded on first use; nullptr with failure() set.
void* handle_of(const std::string& group) {
  GroupState& st = state_of(group);
  std::lock_guard<std::mutex> lock(st.mutex);
  if (st.handle != nullptr) return st.handle;
  if (st.failed) {
    fail(st.why);
    return nullptr;
  }
  GroupBuild b;
  if (describe(group, &b) && (is_file(b.library) || build_locked(b))) {
    st.handle = ::dlopen(b.library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (st.handle == nullptr) {
      fail("gemmt: cannot load kernel group '" + group + "' from " + b.library + ": " +
           ::dlerror());
    }
  }
  if (st.handle == nullptr) {
    st.failed = true;
    st.why = last_failure;
  }
  return st.handle;
}

}  // namespace

const char* groups() {
  return GEMMT_DEFERRED_GROUP_LIST;
}

bool load(const char* group) {
  if (!is_deferred(group)) return true;
  return handle_of(group) != nullptr;
}

void* symbol(const char* group, const char* name) {
  if (!is_deferred(group)) {
    fail(std::string("gemmt: kernel group '") + group + "' is part of the module");
    return nullptr;
  }
  void* h = handle_of(group);
  if (h == nullptr) return nullptr;
  void* s = ::dlsym(h, name);
  if (s == nullptr) {
    fail(std::string("gemmt: kernel group '") + group + "' has no " + name +
         " (a library of another build in the cache?)");
  }
  return s;
}

#endif  // GEMMT_DEFERRED_KERNELS

}  // namespace deferred
}  // namespace gemmt
