// Network namespaces as "hosts" for multi-host tests and benchmarks on one machine.
//
// Each host is a namespace with one interface, eth0, at 10.<subnet>.0.<k>/24, plugged
// into a bridge in a "switch" namespace; the test's own namespace joins the bridge at
// 10.<subnet>.0.254. Links can be shaped (tc tbf) to a rate. Everything is removed when
// the object goes away. Creating namespaces needs root (CAP_NET_ADMIN): Create says so
// when it cannot, and callers skip.
#ifndef STRATA_TESTS_COMMON_NETNS_H_
#define STRATA_TESTS_COMMON_NETNS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::testing {

class NetnsHosts {
 public:
  // Hosts 1..count. `tag` keeps names unique (a short word).
  static absl::StatusOr<std::unique_ptr<NetnsHosts>> Create(const std::string& tag, int count);
  ~NetnsHosts();

  std::string Namespace(int host) const;  // host in [1, count]
  std::string Address(int host) const;    // its IPv4 address
  std::string OwnAddress() const;         // the test's address on the bridge
  const std::string& OwnDevice() const { return root_link_; }
  // Starts argv inside the host's namespace (a child that dies with the test).
  pid_t Spawn(int host, const std::vector<std::string>& argv,
              const std::vector<std::string>& env = {}) const;
  // Limits the host's outgoing traffic to `mbit` Mbit/s (0 removes the limit).
  absl::Status Shape(int host, int mbit) const;
  // The same for the test's own traffic into the bridge.
  absl::Status ShapeOwn(int mbit) const;

 private:
  NetnsHosts() = default;
  std::string tag_;
  int subnet_ = 0;
  int count_ = 0;
  std::vector<std::string> created_;  // namespaces to delete
  std::string root_link_;             // the test's veth, in its own namespace
};

// Runs a command; returns its exit status (and its output in `output` if given).
int RunCommand(const std::string& command, std::string* output = nullptr);

}  // namespace strata::testing

#endif  // STRATA_TESTS_COMMON_NETNS_H_
