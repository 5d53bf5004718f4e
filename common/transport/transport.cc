#include "common/transport/transport.h"

#include <array>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace strata::transport {

std::string Capabilities::ToString() const {
  return absl::StrCat(backend, " (", details,
                      "); dead-peer detection: ", detects_dead_peers ? "yes" : "no",
                      "; one-sided put: ", one_sided_put ? "yes" : "no",
                      "; device memory: ", device_memory ? "yes" : "no");
}

namespace {

// One slot per Backend, filled by static initializers before main; read-only after.
std::array<TransportFactory, std::size(kBackendNames)>& Factories() {
  static std::array<TransportFactory, std::size(kBackendNames)> factories{};
  return factories;
}

}  // namespace

bool UcxTlsNamesSharedMemory(absl::string_view tls) {
  for (absl::string_view tl : absl::StrSplit(tls, ',')) {
    if (tl == "sm" || tl == "shm" || tl == "posix" || tl == "sysv") return true;
  }
  return false;
}

bool RegisterTransportBackend(Backend backend, TransportFactory factory) {
  Factories()[static_cast<size_t>(backend)] = factory;
  return true;
}

absl::StatusOr<std::unique_ptr<Transport>> Transport::Create(const TransportConfig& config) {
  const size_t index = static_cast<size_t>(config.backend);
  if (index >= Factories().size()) return absl::InvalidArgumentError("unknown transport backend");
  if (Factories()[index] == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("transport backend '",
                                                      EnumNameOf(config.backend, kBackendNames),
                                                      "' is not linked into this binary"));
  }
  return Factories()[index](config);
}

absl::StatusOr<RemoteRegion> Transport::RegisterRegion(void*, size_t) {
  return absl::UnimplementedError(
      absl::StrCat(capabilities().backend, " transport has no one-sided put"));
}

void Transport::PutWithFlag(PeerId, const RemoteRegion&, uint64_t, std::span<const uint8_t>,
                            uint64_t, uint64_t, SendDone done) {
  done(absl::UnimplementedError(
      absl::StrCat(capabilities().backend, " transport has no one-sided put")));
}

absl::Status SendAndWait(Transport& transport, PeerId peer, Tag tag,
                         std::span<const uint8_t> header,
                         std::vector<std::span<const uint8_t>> payload, absl::Duration timeout) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<absl::Status> status;
  };
  auto state = std::make_shared<State>();
  transport.Send(peer, tag, header, std::move(payload), [state](absl::Status status) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->status = std::move(status);
    state->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(state->mu);
  if (!state->cv.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                          [&] { return state->status.has_value(); })) {
    return absl::DeadlineExceededError(
        absl::StrCat("send not complete after ", absl::FormatDuration(timeout)));
  }
  return *state->status;
}

}  // namespace strata::transport
