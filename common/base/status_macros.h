// Propagation helpers for absl::Status / absl::StatusOr. Abseil 20220623 ships no
// status_macros.h, so strata defines its own two.
//
//   RETURN_IF_ERROR(file.Validate());
//   ASSIGN_OR_RETURN(auto tensor, archive.Find("lm_head.weight"));
#ifndef STRATA_COMMON_BASE_STATUS_MACROS_H_
#define STRATA_COMMON_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define STRATA_STATUS_CONCAT_INNER(a, b) a##b
#define STRATA_STATUS_CONCAT(a, b) STRATA_STATUS_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status strata_status_ = (expr);          \
    if (!strata_status_.ok()) return strata_status_; \
  } while (0)

#define STRATA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL(STRATA_STATUS_CONCAT(strata_statusor_, __LINE__), lhs, expr)

#endif  // STRATA_COMMON_BASE_STATUS_MACROS_H_
