// For tests: this process under a real CPU quota for a scope. Needs a cgroup it may make and
// move itself into: root, with the process at the root of a v1 cpu hierarchy
// (/sys/fs/cgroup/cpu) or of a v2 one (/sys/fs/cgroup) whose children have the cpu controller.
// Where that is not so, ok() is false and the test skips.
#ifndef STRATA_COMMON_BASE_CPU_QUOTA_TESTING_H_
#define STRATA_COMMON_BASE_CPU_QUOTA_TESTING_H_

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace strata::testing {

class ScopedCpuQuota {
 public:
  // A child cgroup with a quota of `cores` cores (a whole number, at least 1), this process
  // moved into it. Processes it starts from then on start there too.
  explicit ScopedCpuQuota(int cores) {
    std::ifstream self("/proc/self/cgroup");
    const std::string cgroup((std::istreambuf_iterator<char>(self)), {});
    std::ifstream controls("/sys/fs/cgroup/cgroup.subtree_control");
    const std::string enabled((std::istreambuf_iterator<char>(controls)), {});
    if (std::filesystem::exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") &&
        cgroup.find(":cpu:/\n") != std::string::npos) {
      root_ = "/sys/fs/cgroup/cpu";
    } else if (enabled.find("cpu") != std::string::npos &&
               cgroup.find("0::/\n") != std::string::npos) {
      root_ = "/sys/fs/cgroup";
      v2_ = true;
    } else {
      why_ = "no cpu cgroup with this process at its root";
      return;
    }
    std::error_code ec;
    dir_ = root_ + "/strata-quota-test-" + std::to_string(getpid());
    if (access(root_.c_str(), W_OK) != 0 || !std::filesystem::create_directory(dir_, ec)) {
      why_ = "cannot make " + dir_;
      dir_.clear();
      return;
    }
    const std::string quota = std::to_string(cores * 100000);
    const bool limited = v2_ ? Write(dir_ + "/cpu.max", quota + " 100000")
                             : Write(dir_ + "/cpu.cfs_period_us", "100000") &&
                                   Write(dir_ + "/cpu.cfs_quota_us", quota);
    if (!limited || !Write(dir_ + "/cgroup.procs", std::to_string(getpid()))) {
      why_ = "cannot set a quota in " + dir_ + " or move into it";
      return;
    }
    ok_ = true;
  }
  // Moves this process back to the root and removes the cgroup. Processes still in it keep
  // it (and the quota) until they end; it cannot be removed before.
  ~ScopedCpuQuota() { Leave(); }
  void Leave() {
    if (ok_) Write(root_ + "/cgroup.procs", std::to_string(getpid()));
    ok_ = false;
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove(dir_, ec);
  }
  bool ok() const { return ok_; }
  const std::string& why_not() const { return why_; }

 private:
  static bool Write(const std::string& path, const std::string& text) {
    std::ofstream out(path);
    out << text;
    out.flush();
    return out.good();
  }
  std::string root_, dir_, why_;
  bool v2_ = false;
  bool ok_ = false;
};

}  // namespace strata::testing

#endif  // STRATA_COMMON_BASE_CPU_QUOTA_TESTING_H_
