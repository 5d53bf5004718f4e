#include "common/base/cpu_quota.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/base/file.h"

namespace strata {
namespace {

// A cgroup hierarchy as mounted: the cgroup its mount shows at the mount point (not "/"
// inside a container whose runtime mounted its own cgroup there) and where.
struct Hierarchy {
  bool v2 = false;
  std::string root;
  std::string mount_point;
};

// mountinfo escapes blanks and backslashes in paths as \ooo (octal).
std::string Unescape(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const absl::string_view digits = s.substr(i + 1, 3);
      if (digits.size() == 3 &&
          std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        out.push_back(
            static_cast<char>((digits[0] - '0') * 64 + (digits[1] - '0') * 8 + (digits[2] - '0')));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

bool HasWord(absl::string_view list, absl::string_view word) {
  for (absl::string_view w : absl::StrSplit(list, ',')) {
    if (w == word) return true;
  }
  return false;
}

// The v2 hierarchy and the v1 hierarchy with the cpu controller, where mounted.
std::vector<Hierarchy> CpuHierarchies(absl::string_view mountinfo) {
  std::vector<Hierarchy> out;
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n', absl::SkipEmpty())) {
    // id parent major:minor root mount-point options [optional fields] - type source super
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    const absl::string_view type = dash[1], super = dash[3];
    if (type == "cgroup2") {
      out.push_back({true, Unescape(f[3]), Unescape(f[4])});
    } else if (type == "cgroup" && HasWord(super, "cpu")) {
      out.push_back({false, Unescape(f[3]), Unescape(f[4])});
    }
  }
  return out;
}

// This process's cgroup in `h`, from /proc/self/cgroup ("0::/path" for v2,
// "N:cpu,cpuacct:/path" for v1); nullopt where it has none there.
std::optional<std::string> CgroupPath(absl::string_view cgroup, const Hierarchy& h) {
  for (absl::string_view line : absl::StrSplit(cgroup, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    if (h.v2 ? (f[0] == "0" && f[1].empty()) : HasWord(f[1], "cpu")) return std::string(f[2]);
  }
  return std::nullopt;
}

std::optional<std::string> ReadFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return std::nullopt;
  return *std::move(text);
}

std::optional<int64_t> ReadInt(const std::string& path) {
  auto text = ReadFile(path);
  int64_t value;
  if (!text || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value)) return std::nullopt;
  return value;
}

// The quota set on the cgroup directory `dir` itself, in cores.
std::optional<double> QuotaAt(const std::string& dir, bool v2) {
  int64_t quota = 0, period = 0;
  if (v2) {
    auto text = ReadFile(dir + "/cpu.max");  // "max 100000" or "250000 100000"
    if (!text) return std::nullopt;
    const std::vector<absl::string_view> f =
        absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &quota) || !absl::SimpleAtoi(f[1], &period)) {
      return std::nullopt;
    }
  } else {
    auto q = ReadInt(dir + "/cpu.cfs_quota_us");  // -1: none
    auto p = ReadInt(dir + "/cpu.cfs_period_us");
    if (!q || !p) return std::nullopt;
    quota = *q;
    period = *p;
  }
  if (quota <= 0 || period <= 0) return std::nullopt;
  return static_cast<double>(quota) / static_cast<double>(period);
}

}  // namespace

std::optional<double> CgroupCpuLimitFrom(const std::string& mountinfo, const std::string& cgroup,
                                         const std::string& fs_root) {
  std::optional<double> lowest;
  for (const Hierarchy& h : CpuHierarchies(mountinfo)) {
    std::optional<std::string> path = CgroupPath(cgroup, h);
    // ("/../x": a cgroup outside this process's cgroup namespace, not visible here.)
    if (!path || path->empty() || (*path)[0] != '/' || path->find("/..") != std::string::npos) {
      continue;
    }
    // The cgroup below the mount's own root; one outside it is not visible here.
    std::string below = *path;
    if (h.root != "/") {
      if (below == h.root) {
        below = "/";
      } else if (below.compare(0, h.root.size() + 1, h.root + "/") == 0) {
        below = below.substr(h.root.size());
      } else {
        continue;
      }
    }
    const std::string top = fs_root + h.mount_point;
    std::string dir = top + (below == "/" ? "" : below);
    while (true) {
      if (auto quota = QuotaAt(dir, h.v2)) lowest = lowest ? std::min(*lowest, *quota) : *quota;
      if (dir.size() <= top.size()) break;
      dir.resize(dir.rfind('/'));
    }
  }
  return lowest;
}

std::optional<double> CgroupCpuLimit() {
  auto mountinfo = ReadFile("/proc/self/mountinfo");
  auto cgroup = ReadFile("/proc/self/cgroup");
  if (!mountinfo || !cgroup) return std::nullopt;
  return CgroupCpuLimitFrom(*mountinfo, *cgroup, "");
}

}  // namespace strata
