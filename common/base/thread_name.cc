#include "common/base/thread_name.h"

#include <pthread.h>

namespace strata {

void SetCurrentThreadName(std::string_view name) {
  const std::string kept(name.substr(0, 15));
  pthread_setname_np(pthread_self(), kept.c_str());
}

std::string CurrentThreadName() {
  char name[16] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof(name)) != 0) return "";
  return name;
}

}  // namespace strata
