#include "server/api/json_body.h"

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata::api {
namespace {

using ojson = nlohmann::ordered_json;

// Builds an ordered_json from SAX events: values are appended to the innermost open array
// or object; an object finds a repeated key through its index instead of a scan.
class OrderedBuilder final : public nlohmann::json_sax<ojson> {
 public:
  bool null() override { return Add(ojson(nullptr)); }
  bool boolean(bool value) override { return Add(ojson(value)); }
  bool number_integer(number_integer_t value) override { return Add(ojson(value)); }
  bool number_unsigned(number_unsigned_t value) override { return Add(ojson(value)); }
  bool number_float(number_float_t value, const string_t&) override { return Add(ojson(value)); }
  bool string(string_t& value) override { return Add(ojson(std::move(value))); }
  bool binary(binary_t&) override { return false; }  // JSON text has none
  bool start_object(std::size_t) override { return Open(ojson::object()); }
  bool key(string_t& key) override {
    open_.back().key = std::move(key);
    return true;
  }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(ojson::array()); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t, const std::string&, const ojson::exception&) override {
    return false;
  }

  bool too_deep() const { return too_deep_; }
  ojson& root() { return root_; }

 private:
  struct Container {
    ojson value;                                 // an array or an object
    std::string key;                             // objects: the key of the coming value
    std::unordered_map<std::string, size_t> at;  // objects: key -> position in value
  };

  bool Open(ojson value) {
    if (open_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      too_deep_ = true;
      return false;
    }
    open_.push_back({std::move(value), {}, {}});
    return true;
  }

  bool Close() {
    ojson value = std::move(open_.back().value);
    open_.pop_back();
    return Add(std::move(value));
  }

  bool Add(ojson value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return true;
    }
    Container& c = open_.back();
    if (c.value.is_array()) {
      c.value.get_ref<ojson::array_t&>().push_back(std::move(value));
      return true;
    }
    auto& object = c.value.get_ref<ojson::object_t&>();
    const auto [it, inserted] = c.at.try_emplace(c.key, object.size());
    if (inserted) {
      object.emplace_back(std::move(c.key), std::move(value));
    } else {
      (object.begin() + static_cast<std::ptrdiff_t>(it->second))->second = std::move(value);
    }
    return true;
  }

  std::vector<Container> open_;
  ojson root_;
  bool too_deep_ = false;
};

}  // namespace

std::variant<ojson, ApiError> ParseJsonBody(std::string_view body) {
  OrderedBuilder builder;
  const bool parsed = ojson::sax_parse(body.begin(), body.end(), &builder);
  if (builder.too_deep()) {
    return BadRequest(
        absl::StrCat("the request body nests deeper than ", kMaxJsonDepth, " levels"));
  }
  if (!parsed) return BadRequest("the request body is not valid JSON (or not valid UTF-8)");
  if (!builder.root().is_object()) return BadRequest("the request body must be a JSON object");
  return std::move(builder.root());
}

}  // namespace strata::api
