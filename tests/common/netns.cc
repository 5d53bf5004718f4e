#include "tests/common/netns.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "tests/common/deployment.h"

namespace strata::testing {

int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) text.append(buffer, n);
  const int status = pclose(pipe);
  if (output != nullptr) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

absl::StatusOr<std::unique_ptr<NetnsHosts>> NetnsHosts::Create(const std::string& tag, int count) {
  auto hosts = std::unique_ptr<NetnsHosts>(new NetnsHosts);
  hosts->tag_ = absl::StrCat(tag, getpid() % 10000);
  hosts->subnet_ = 200 + getpid() % 50;
  hosts->count_ = count;
  auto run = [&](const std::string& command) -> absl::Status {
    std::string output;
    if (RunCommand(command, &output) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("`", command, "` failed: ", output));
    }
    return absl::OkStatus();
  };
  const std::string sw = "st-" + hosts->tag_ + "-sw";
  absl::Status s = run("ip netns add " + sw);
  if (!s.ok()) return s;
  hosts->created_.push_back(sw);
  const std::string in_sw = "ip netns exec " + sw + " ";
  if (!(s = run(in_sw + "ip link add br0 type bridge")).ok()) return s;
  if (!(s = run(in_sw + "ip link set br0 up")).ok()) return s;
  if (!(s = run(in_sw + "ip link set lo up")).ok()) return s;
  // The test's own namespace on the bridge.
  hosts->root_link_ = "st" + hosts->tag_ + "r";
  if (!(s = run(
            absl::StrCat("ip link add ", hosts->root_link_, " type veth peer name p0 netns ", sw)))
           .ok()) {
    return s;
  }
  if (!(s = run(in_sw + "ip link set p0 master br0 up")).ok()) return s;
  if (!(s = run(absl::StrCat("ip addr add ", hosts->OwnAddress(), "/24 dev ", hosts->root_link_)))
           .ok()) {
    return s;
  }
  if (!(s = run("ip link set " + hosts->root_link_ + " up")).ok()) return s;
  for (int k = 1; k <= count; ++k) {
    const std::string ns = hosts->Namespace(k);
    if (!(s = run("ip netns add " + ns)).ok()) return s;
    hosts->created_.push_back(ns);
    if (!(s = run(absl::StrCat("ip netns exec ", ns, " ip link add eth0 type veth peer name p", k,
                               " netns ", sw)))
             .ok()) {
      return s;
    }
    if (!(s = run(absl::StrCat(in_sw, "ip link set p", k, " master br0 up"))).ok()) return s;
    const std::string in_ns = "ip netns exec " + ns + " ";
    if (!(s = run(absl::StrCat(in_ns, "ip addr add ", hosts->Address(k), "/24 dev eth0"))).ok()) {
      return s;
    }
    if (!(s = run(in_ns + "ip link set eth0 up")).ok()) return s;
    if (!(s = run(in_ns + "ip link set lo up")).ok()) return s;
  }
  // Processes that connect across hosts retry (registration, health polling), so a link
  // that takes a moment to come up needs no wait here.
  return hosts;
}

NetnsHosts::~NetnsHosts() {
  if (!root_link_.empty()) RunCommand("ip link del " + root_link_);
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
    RunCommand("ip netns pids " + *it + " | xargs -r kill -9");
    RunCommand("ip netns del " + *it);
  }
}

std::string NetnsHosts::Namespace(int host) const { return absl::StrCat("st-", tag_, "-h", host); }

std::string NetnsHosts::Address(int host) const {
  return absl::StrCat("10.", subnet_, ".0.", host);
}

std::string NetnsHosts::OwnAddress() const { return absl::StrCat("10.", subnet_, ".0.254"); }

pid_t NetnsHosts::Spawn(int host, const std::vector<std::string>& argv,
                        const std::vector<std::string>& env) const {
  std::vector<std::string> full = {"/usr/sbin/ip", "netns", "exec", Namespace(host)};
  full.insert(full.end(), argv.begin(), argv.end());
  return SpawnProcess(full, env);
}

namespace {

// Token bucket on `device`: a burst of about 1 ms at the rate (at least 32 KiB), a 50 ms
// queue.
absl::Status ShapeDevice(const std::string& prefix, const std::string& device, int mbit) {
  RunCommand(prefix + "tc qdisc del dev " + device + " root");
  if (mbit <= 0) return absl::OkStatus();
  const int burst = std::max(32 * 1024, mbit * 1000 / 8);
  std::string output;
  if (RunCommand(absl::StrCat(prefix, "tc qdisc add dev ", device, " root tbf rate ", mbit,
                              "mbit burst ", burst, " latency 50ms"),
                 &output) != 0) {
    return absl::FailedPreconditionError("tc failed: " + output);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NetnsHosts::Shape(int host, int mbit) const {
  return ShapeDevice("ip netns exec " + Namespace(host) + " ", "eth0", mbit);
}

absl::Status NetnsHosts::ShapeOwn(int mbit) const { return ShapeDevice("", root_link_, mbit); }

}  // namespace strata::testing
