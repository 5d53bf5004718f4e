#include "common/base/cpu_affinity.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/cpu_quota.h"

namespace strata {
namespace {

constexpr int kMaxCpu = CPU_SETSIZE - 1;

absl::StatusOr<int> ParseCpu(absl::string_view text, const std::string& list) {
  int cpu;
  if (text.empty() || !absl::SimpleAtoi(text, &cpu) || cpu < 0 || cpu > kMaxCpu ||
      text.find_first_not_of("0123456789") != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("CPU list \"", list, "\": \"", text, "\" is not a core number"));
  }
  return cpu;
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& list) {
  std::vector<int> cpus;
  if (list.empty()) return absl::InvalidArgumentError("empty CPU list");
  for (absl::string_view piece : absl::StrSplit(list, ',')) {
    const size_t dash = piece.find('-');
    if (dash == absl::string_view::npos) {
      auto cpu = ParseCpu(piece, list);
      if (!cpu.ok()) return cpu.status();
      cpus.push_back(*cpu);
      continue;
    }
    auto first = ParseCpu(piece.substr(0, dash), list);
    if (!first.ok()) return first.status();
    auto last = ParseCpu(piece.substr(dash + 1), list);
    if (!last.ok()) return last.status();
    if (*last < *first) {
      return absl::InvalidArgumentError(
          absl::StrCat("CPU list \"", list, "\": range ", piece, " runs backwards"));
    }
    for (int cpu = *first; cpu <= *last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::vector<std::string> pieces;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    pieces.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(pieces, ",");
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

absl::Status PinProcessToCpus(const std::string& list) {
  auto cpus = ParseCpuList(list);
  if (!cpus.ok()) return cpus.status();
  const std::vector<int> allowed = AllowedCpus();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : *cpus) {
    if (!std::binary_search(allowed.begin(), allowed.end(), cpu)) {
      return absl::InvalidArgumentError(absl::StrCat("core ", cpu, " of \"", list,
                                                     "\" is not available to this process (",
                                                     FormatCpuList(allowed), " are)"));
    }
    CPU_SET(cpu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(absl::StrCat("sched_setaffinity(", list, ") failed"));
  }
  return absl::OkStatus();
}

int DefaultTeamSize() {
  const int allowed = std::max<int>(1, AllowedCpus().size());
  const std::optional<double> limit = CgroupCpuLimit();
  if (!limit) return allowed;
  return std::clamp(static_cast<int>(std::ceil(*limit - 1e-9)), 1, allowed);
}

absl::Status ApplyCpuFlags(const std::string& cpus, int threads) {
  if (!cpus.empty()) {
    if (absl::Status pinned = PinProcessToCpus(cpus); !pinned.ok()) return pinned;
  }
  if (threads <= 0 && (!cpus.empty() || std::getenv("OMP_NUM_THREADS") == nullptr)) {
    threads = DefaultTeamSize();
  }
  if (threads > 0) omp_set_num_threads(threads);
  return absl::OkStatus();
}

std::vector<std::vector<int>> SplitCpus(const std::vector<int>& cpus, int parts) {
  std::vector<std::vector<int>> out(std::max(0, parts));
  if (parts <= 0 || cpus.empty()) return out;
  if (static_cast<int>(cpus.size()) < parts) {
    for (int i = 0; i < parts; ++i) out[i].push_back(cpus[i % cpus.size()]);
    return out;
  }
  for (size_t i = 0; i < cpus.size(); ++i) out[i % parts].push_back(cpus[i]);
  return out;
}

absl::StatusOr<CorePartition> ParseCorePartition(const std::string& compute,
                                                 const std::string& memory,
                                                 const std::vector<int>& allowed) {
  CorePartition out;
  for (auto [flag, list, cpus] : {std::make_tuple("--compute_cpus", &compute, &out.compute),
                                  std::make_tuple("--memory_cpus", &memory, &out.memory)}) {
    auto parsed = ParseCpuList(*list);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", parsed.status().message()));
    }
    for (int cpu : *parsed) {
      if (!std::binary_search(allowed.begin(), allowed.end(), cpu)) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag, ": core ", cpu, " is not on this machine (", FormatCpuList(allowed), " are)"));
      }
    }
    *cpus = std::move(*parsed);
  }
  for (int cpu : out.compute) {
    if (std::binary_search(out.memory.begin(), out.memory.end(), cpu)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--compute_cpus and --memory_cpus overlap at core ", cpu));
    }
  }
  return out;
}

}  // namespace strata
