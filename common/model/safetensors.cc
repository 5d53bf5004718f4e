#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/file.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using json = nlohmann::json;

// Bytes per element of every dtype the safetensors format defines.
int64_t ElementSize(std::string_view dtype) {
  static const std::map<std::string_view, int64_t> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

// Headers are small JSON; anything near this size is corrupt.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::ShapeString() const { return "[" + absl::StrJoin(shape, ", ") + "]"; }

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat(path, ": fstat failed: ", strerror(errno)));
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": truncated: ", file_bytes, " bytes, shorter than the 8-byte header"));
  }
  void* mapping = mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (mapping == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", strerror(errno)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile);
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapping_bytes_ = file_bytes;

  const uint8_t* base = static_cast<const uint8_t*>(mapping);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, base, 8);  // little-endian, as the format says
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt or truncated: header claims ",
                                            header_bytes, " bytes but the file has ", file_bytes));
  }
  json header = json::parse(base + 8, base + 8 + header_bytes, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt: header is not a JSON object"));
  }
  const uint8_t* data = base + 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - 8 - header_bytes;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    // A copy: lambdas may not capture a structured binding before C++20 in every compiler.
    const std::string tensor = name;
    auto bad = [&](const std::string& what) {
      return absl::DataLossError(absl::StrCat(path, ": tensor \"", tensor, "\": ", what));
    };
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      return bad("malformed entry (needs dtype, shape and two data_offsets)");
    }
    TensorView view;
    view.name = name;
    view.dtype_name = entry["dtype"].get<std::string>();
    const int64_t element_bytes = ElementSize(view.dtype_name);
    if (element_bytes == 0) return bad("unknown dtype \"" + view.dtype_name + "\"");
    uint64_t elements = 1;
    for (const json& d : entry["shape"]) {
      if (!d.is_number_unsigned()) return bad("shape must hold non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 40) || (dim != 0 && elements > (1ull << 50) / dim)) {
        return bad("shape is implausibly large");
      }
      elements *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      return bad("data_offsets must be non-negative integers");
    }
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_bytes) {
      return bad(absl::StrCat("data [", begin, ", ", end, ") lies outside the ", data_bytes,
                              " data bytes: the file is truncated or corrupt"));
    }
    if (end - begin != elements * element_bytes) {
      return bad(absl::StrCat("holds ", end - begin, " bytes but shape ", view.ShapeString(),
                              " of ", view.dtype_name, " needs ", elements * element_bytes));
    }
    view.data = data + begin;
    view.num_bytes = end - begin;
    view.file = &file->path_;
    file->tensors_.emplace(name, std::move(view));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::unique_ptr<WeightArchive>> WeightArchive::Open(const std::string& model_dir) {
  auto archive = std::make_unique<WeightArchive>();
  archive->model_dir_ = model_dir;
  const std::string index_path = model_dir + "/model.safetensors.index.json";
  // No index: one shard, model.safetensors. An index that is there but cannot be read is an
  // error, not a reason to fall back.
  absl::StatusOr<std::string> index_text = ReadFileToString(index_path);
  if (!index_text.ok() && !absl::IsNotFound(index_text.status())) return index_text.status();
  std::vector<std::string> shard_names;
  if (index_text.ok()) {
    json index = json::parse(*index_text, nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return absl::DataLossError(index_path + ": corrupt: needs a \"weight_map\" object");
    }
    std::set<std::string> seen;
    for (auto& [tensor, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) {
        return absl::DataLossError(
            absl::StrCat(index_path, ": weight_map entry \"", tensor, "\" is not a file name"));
      }
      const std::string shard_name = shard.get<std::string>();
      if (shard_name.find('/') != std::string::npos || shard_name == "..") {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": shard name \"", shard_name,
                                                       "\" must be a plain file name"));
      }
      if (seen.insert(shard_name).second) shard_names.push_back(shard_name);
    }
  } else {
    shard_names.push_back("model.safetensors");
  }
  for (const std::string& shard : shard_names) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(model_dir + "/" + shard));
    archive->files_.push_back(std::move(file));
  }
  for (const auto& file : archive->files_) {
    for (const auto& [name, view] : file->tensors()) {
      auto [it, inserted] = archive->index_.emplace(name, &view);
      if (!inserted) {
        return absl::DataLossError(absl::StrCat("tensor \"", name, "\" appears in both ",
                                                *it->second->file, " and ", file->path()));
      }
    }
  }
  return archive;
}

const TensorView* WeightArchive::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

size_t WeightArchive::num_tensors() const { return index_.size(); }

absl::StatusOr<const TensorView*> WeightArchive::Get(
    std::string_view name, const std::vector<int64_t>& expected_shape) const {
  const TensorView* view = Find(name);
  if (view == nullptr) {
    std::vector<std::string> paths;
    for (const auto& f : files_) paths.push_back(f->path());
    return absl::NotFoundError(absl::StrCat("tensor \"", AbslView(name), "\" is missing from ",
                                            absl::StrJoin(paths, ", ")));
  }
  if (!ParseDType(view->dtype_name)) {
    return absl::InvalidArgumentError(absl::StrCat(*view->file, ": tensor \"", AbslView(name),
                                                   "\" has dtype ", view->dtype_name,
                                                   "; weights must be F32, F16 or BF16"));
  }
  if (view->shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        *view->file, ": tensor \"", AbslView(name), "\" has shape ", view->ShapeString(),
        " but config.json implies [", absl::StrJoin(expected_shape, ", "), "]"));
  }
  return view;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  json header = json::object();
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string header_text = header.dump();
  while ((header_text.size() + 8) % 8 != 0) header_text.push_back(' ');
  const std::string tmp_path = path + ".tmp";
  std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(tmp_path + ": cannot create");
  const uint64_t header_bytes = header_text.size();
  out.write(reinterpret_cast<const char*>(&header_bytes), 8);
  out.write(header_text.data(), header_text.size());
  for (const TensorToWrite& t : tensors) out.write(t.bytes.data(), t.bytes.size());
  out.close();
  if (!out) return absl::ResourceExhaustedError(tmp_path + ": write failed (disk full?)");
  if (rename(tmp_path.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename to ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace strata
