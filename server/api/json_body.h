// Request bodies parsed into JSON objects in time linear in their size.
//
// Keys keep the order the client wrote them in (chat templates render tool schemas and
// arguments in that order), as in nlohmann's ordered_json. But ordered_json::parse finds
// each new key by scanning the keys before it, so an object of n keys costs n²/2
// comparisons: 14 s for a logit_bias of 100k entries, on the thread that parses. This
// parser builds the same value through nlohmann's SAX interface with a hash index per
// object. A key given twice keeps its first position and its last value, as ordered_json
// does.
#ifndef STRATA_SERVER_API_JSON_BODY_H_
#define STRATA_SERVER_API_JSON_BODY_H_

#include <string_view>
#include <variant>

#include "nlohmann/json.hpp"
#include "server/api/api_error.h"

namespace strata::api {

// Deepest array/object nesting a body may have (the body object itself is level 1). Real
// requests, tool schemas included, stay far below; the limit keeps hostile nesting from
// recursing through the stack wherever the value is walked.
inline constexpr int kMaxJsonDepth = 64;

// The body as a JSON object; a 400 ApiError for invalid JSON (or UTF-8), nesting deeper
// than kMaxJsonDepth, or a value that is not an object.
std::variant<nlohmann::ordered_json, ApiError> ParseJsonBody(std::string_view body);

}  // namespace strata::api

#endif  // STRATA_SERVER_API_JSON_BODY_H_
