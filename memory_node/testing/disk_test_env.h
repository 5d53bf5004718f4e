// What the disk-tier tests share: whether io_uring can run here, a fresh directory under the
// test's temporary directory, and a KV store of random rows.
#ifndef STRATA_MEMORY_NODE_TESTING_DISK_TEST_ENV_H_
#define STRATA_MEMORY_NODE_TESTING_DISK_TEST_ENV_H_

#include <liburing.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "memory_node/kv_store.h"

namespace strata::testing_env {

// Empty when io_uring works; otherwise why not. It can be switched off (a container's
// seccomp profile, kernel.io_uring_disabled): the tier then cannot run at all, which the
// tests cannot change, so they skip.
inline std::string IoUringUnavailable() {
  io_uring ring;
  const int rc = io_uring_queue_init(1, &ring, 0);
  if (rc < 0) return std::string("io_uring is not available here: ") + std::strerror(-rc);
  io_uring_queue_exit(&ring);
  return "";
}

// `name` under TEST_TMPDIR (or /tmp), removed if it exists (not created).
inline std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base != nullptr ? base : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

// A store of `config` whose every K and V element is random (seeded).
inline std::unique_ptr<KvStore> RandomStore(KvStoreConfig config, uint32_t seed) {
  config.prefault = false;
  auto store = std::move(*KvStore::Create(config));
  std::mt19937 rng(seed);
  for (int l = 0; l < config.num_layers; ++l) {
    for (int64_t i = 0; i < config.num_slots * store->row_elements(); ++i) {
      store->k(l)[i] = static_cast<uint16_t>(rng());
      store->v(l)[i] = static_cast<uint16_t>(rng());
    }
  }
  return store;
}

}  // namespace strata::testing_env

#endif  // STRATA_MEMORY_NODE_TESTING_DISK_TEST_ENV_H_
