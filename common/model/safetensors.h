// Read-only, memory-mapped access to safetensors checkpoints, and a writer.
//
// A model directory holds either model.safetensors or shards listed by
// model.safetensors.index.json. Opening validates the whole header of every file: header
// length, JSON, dtype names, shapes, and that each tensor's byte range lies inside the
// file and matches its shape. A truncated or corrupt file is an error naming the file
// (and tensor); it never crashes. Tensor data stays in the page cache mapping until the
// archive is destroyed.
//
// Thread-safety: an opened archive is immutable and may be read from any thread.
#ifndef STRATA_COMMON_MODEL_SAFETENSORS_H_
#define STRATA_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/dtype.h"

namespace strata {

struct TensorView {
  std::string name;
  std::string dtype_name;  // as written in the file ("BF16", "I64", ...)
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping
  size_t num_bytes = 0;
  const std::string* file = nullptr;  // path of the file that holds it

  int64_t num_elements() const;
  std::string ShapeString() const;  // "[768, 2048]"
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }
  const TensorView* Find(std::string_view name) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  std::map<std::string, TensorView, std::less<>> tensors_;
};

class WeightArchive {
 public:
  // Opens <model_dir>/model.safetensors, or every shard named by
  // <model_dir>/model.safetensors.index.json.
  static absl::StatusOr<std::unique_ptr<WeightArchive>> Open(const std::string& model_dir);

  const TensorView* Find(std::string_view name) const;

  // Finds a weight and checks its shape, and that its dtype is F32, F16 or BF16. Errors
  // name the tensor and the file it was looked up in.
  absl::StatusOr<const TensorView*> Get(std::string_view name,
                                        const std::vector<int64_t>& expected_shape) const;

  size_t num_files() const { return files_.size(); }
  size_t num_tensors() const;

 private:
  std::string model_dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*, std::less<>> index_;
};

// A tensor to be written: raw little-endian element bytes.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Writes one safetensors file (tensors in the given order, 8-byte aligned header).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace strata

#endif  // STRATA_COMMON_MODEL_SAFETENSORS_H_
