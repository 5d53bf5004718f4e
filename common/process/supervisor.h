// Starts and stops the local processes of a strata deployment (the embedded default of
// deploy/local/serve, and the cross-process tests).
//
// Children get their own process group (so a terminal's Ctrl-C reaches the launcher,
// which stops them in order) and die with the launcher (PR_SET_PDEATHSIG).
#ifndef STRATA_COMMON_PROCESS_SUPERVISOR_H_
#define STRATA_COMMON_PROCESS_SUPERVISOR_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata {

struct ChildSpec {
  std::string name;
  std::vector<std::string> argv;           // argv[0] is the binary
  std::map<std::string, std::string> env;  // added to the launcher's environment
};

class Supervisor {
 public:
  ~Supervisor();

  absl::StatusOr<pid_t> Spawn(const ChildSpec& spec);
  // Returns the name of a child that exited (and its status), if any did.
  bool Reap(std::string* name, int* status);
  // SIGTERM to `name` (all if empty), then SIGKILL after `grace`.
  void Stop(const std::string& name, absl::Duration grace);
  void StopAll(absl::Duration grace) { Stop("", grace); }
  bool Running(const std::string& name) const;
  pid_t Pid(const std::string& name) const;
  std::vector<std::string> Names() const;

 private:
  std::map<std::string, pid_t> children_;
};

// GET http://127.0.0.1:port/path; returns the status code, or -1 if unreachable.
int HttpGetStatus(int port, const std::string& path, absl::Duration timeout);

}  // namespace strata

#endif  // STRATA_COMMON_PROCESS_SUPERVISOR_H_
