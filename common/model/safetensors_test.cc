#include "common/model/safetensors.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/base/bfloat16.h"
#include "common/model/model_generator.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string Floats(std::initializer_list<float> values) {
  std::string bytes;
  for (float v : values) bytes.append(reinterpret_cast<const char*>(&v), 4);
  return bytes;
}

// A file with the given raw header text and `data_bytes` zero bytes of data.
std::string RawFile(const std::string& header, size_t data_bytes) {
  uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  return bytes + header + std::string(data_bytes, '\0');
}

void ExpectOpenFails(const std::string& bytes, absl::StatusCode code, const std::string& needle) {
  const std::string dir = TempDir("corrupt");
  WriteAll(dir + "/model.safetensors", bytes);
  auto archive = WeightArchive::Open(dir);
  ASSERT_FALSE(archive.ok()) << "opened a corrupt file: " << needle;
  EXPECT_EQ(archive.status().code(), code) << archive.status();
  EXPECT_NE(archive.status().message().find(needle), std::string::npos) << archive.status();
  EXPECT_NE(archive.status().message().find("model.safetensors"), std::string::npos)
      << "error must name the file: " << archive.status();
}

TEST(Safetensors, WriteThenReadRoundTrip) {
  const std::string dir = TempDir("roundtrip");
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors",
                               {{"a", DType::kF32, {2, 2}, Floats({1, 2, 3, 4})},
                                {"b", DType::kF32, {1}, Floats({5})}})
                  .ok());
  auto archive = WeightArchive::Open(dir);
  ASSERT_TRUE(archive.ok()) << archive.status();
  auto a = (*archive)->Get("a", {2, 2});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ((*a)->num_bytes, 16u);
  float values[4];
  std::memcpy(values, (*a)->data, 16);
  EXPECT_EQ(values[3], 4.0f);
  EXPECT_EQ((*archive)->num_tensors(), 2u);
  // The data section starts 8-byte aligned, as the format recommends.
  const std::string bytes = ReadAll(dir + "/model.safetensors");
  uint64_t header_bytes;
  std::memcpy(&header_bytes, bytes.data(), 8);
  EXPECT_EQ(header_bytes % 8, 0u);
}

TEST(Safetensors, MissingTensorAndWrongShapeNameFileAndTensor) {
  const std::string dir = TempDir("shape");
  ASSERT_TRUE(
      WriteSafetensors(dir + "/model.safetensors", {{"w", DType::kF32, {1, 2}, Floats({1, 2})}})
          .ok());
  auto archive = WeightArchive::Open(dir);
  ASSERT_TRUE(archive.ok());
  auto missing = (*archive)->Get("lm_head.weight", {2, 2});
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("lm_head.weight"), std::string::npos);
  EXPECT_NE(missing.status().message().find("model.safetensors"), std::string::npos);
  auto wrong = (*archive)->Get("w", {2, 1});
  ASSERT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("[1, 2]"), std::string::npos) << wrong.status();
  EXPECT_NE(wrong.status().message().find("\"w\""), std::string::npos) << wrong.status();
}

TEST(Safetensors, RejectsNonFloatWeights) {
  const std::string dir = TempDir("int");
  WriteAll(dir + "/model.safetensors",
           RawFile(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8));
  auto archive = WeightArchive::Open(dir);
  ASSERT_TRUE(archive.ok()) << archive.status();
  auto w = (*archive)->Get("w", {1});
  EXPECT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("I64"), std::string::npos);
}

TEST(Safetensors, CorruptFilesAreClearErrors) {
  ExpectOpenFails("abc", absl::StatusCode::kDataLoss, "truncated");
  ExpectOpenFails(RawFile("{}", 0).substr(0, 9), absl::StatusCode::kDataLoss, "header claims");
  ExpectOpenFails(RawFile("[1, 2, 3]", 0), absl::StatusCode::kDataLoss, "not a JSON object");
  ExpectOpenFails(RawFile("{\"w\": ", 0), absl::StatusCode::kDataLoss, "not a JSON object");
  // Data range beyond the end of the file: a truncated download.
  ExpectOpenFails(RawFile(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
                  absl::StatusCode::kDataLoss, "truncated or corrupt");
  // Byte count disagrees with the shape.
  ExpectOpenFails(RawFile(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16),
                  absl::StatusCode::kDataLoss, "needs 12");
  ExpectOpenFails(RawFile(R"({"w":{"dtype":"Q4","shape":[3],"data_offsets":[0,16]}})", 16),
                  absl::StatusCode::kDataLoss, "unknown dtype");
  ExpectOpenFails(RawFile(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,16]}})", 16),
                  absl::StatusCode::kDataLoss, "non-negative");
  ExpectOpenFails(RawFile(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", 16),
                  absl::StatusCode::kDataLoss, "outside");
  ExpectOpenFails(RawFile(R"({"w":{"dtype":"F32","shape":[4]}})", 16), absl::StatusCode::kDataLoss,
                  "malformed entry");
  ExpectOpenFails(
      RawFile(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", 16),
      absl::StatusCode::kDataLoss, "implausibly large");
}

TEST(Safetensors, TruncatingAGeneratedModelIsDetected) {
  const std::string dir = TempDir("truncated_model");
  auto shape = NamedModelShape("tiny");
  ASSERT_TRUE(shape.ok());
  ASSERT_TRUE(GenerateModel(*shape, {}, dir).ok());
  const std::string path = dir + "/model.safetensors";
  const std::string bytes = ReadAll(path);
  WriteAll(path, bytes.substr(0, bytes.size() - 1000));
  auto archive = WeightArchive::Open(dir);
  ASSERT_FALSE(archive.ok());
  EXPECT_NE(archive.status().message().find("truncated"), std::string::npos) << archive.status();
}

TEST(Safetensors, ShardedModelOpensThroughIndex) {
  const std::string single = TempDir("single");
  const std::string sharded = TempDir("sharded");
  auto shape = NamedModelShape("tiny");
  ASSERT_TRUE(shape.ok());
  GenerateOptions options;
  options.seed = 7;
  ASSERT_TRUE(GenerateModel(*shape, options, single).ok());
  options.num_shards = 3;
  ASSERT_TRUE(GenerateModel(*shape, options, sharded).ok());
  EXPECT_TRUE(std::filesystem::exists(sharded + "/model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(sharded + "/model-00003-of-00003.safetensors"));
  auto a = WeightArchive::Open(single);
  auto b = WeightArchive::Open(sharded);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*b)->num_files(), 3u);
  EXPECT_EQ((*a)->num_tensors(), (*b)->num_tensors());
  const TensorView* wa = (*a)->Find("model.layers.1.mlp.down_proj.weight");
  const TensorView* wb = (*b)->Find("model.layers.1.mlp.down_proj.weight");
  ASSERT_TRUE(wa && wb);
  ASSERT_EQ(wa->num_bytes, wb->num_bytes);
  EXPECT_EQ(std::memcmp(wa->data, wb->data, wa->num_bytes), 0)
      << "same seed must give the same weights whatever the sharding";

  // A shard listed in the index but absent on disk is an error naming it.
  std::filesystem::remove(sharded + "/model-00002-of-00003.safetensors");
  auto broken = WeightArchive::Open(sharded);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("model-00002-of-00003"), std::string::npos);

  // An index that is there but cannot be read is an error, not a fall-back to
  // model.safetensors alone (here a directory in its place).
  const std::string index = single + "/model.safetensors.index.json";
  std::filesystem::create_directory(index);
  auto unreadable = WeightArchive::Open(single);
  ASSERT_FALSE(unreadable.ok());
  EXPECT_NE(unreadable.status().message().find(index + ": is a directory"), std::string::npos)
      << unreadable.status();
  std::filesystem::remove(index);
  EXPECT_TRUE(WeightArchive::Open(single).ok());
}

TEST(ModelGenerator, DeterministicAndSeedSensitive) {
  EXPECT_EQ(GeneratorNormal(1, 2, 3), GeneratorNormal(1, 2, 3));
  EXPECT_NE(GeneratorNormal(1, 2, 3), GeneratorNormal(2, 2, 3));
  // The generator's normals have mean ~0 and variance ~1.
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = GeneratorNormal(9, 9, i);
    sum += x;
    sum_sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.02);
}

TEST(ModelGenerator, WritesEveryDtypeAndAllShapesParse) {
  for (const std::string& name : {"tiny", "tiny-gqa", "tiny-qwen", "tiny-mistral"}) {
    auto shape = NamedModelShape(name);
    ASSERT_TRUE(shape.ok()) << name;
    for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
      const std::string dir = TempDir(name + DTypeName(dtype));
      GenerateOptions options;
      options.dtype = dtype;
      ASSERT_TRUE(GenerateModel(*shape, options, dir).ok());
      auto archive = WeightArchive::Open(dir);
      ASSERT_TRUE(archive.ok()) << archive.status();
      const TensorView* norm = (*archive)->Find("model.norm.weight");
      ASSERT_NE(norm, nullptr);
      EXPECT_EQ(norm->dtype_name, DTypeName(dtype));
      EXPECT_EQ((*archive)->Find("lm_head.weight") == nullptr, shape->tie_word_embeddings);
      EXPECT_EQ((*archive)->Find("model.layers.0.self_attn.q_proj.bias") != nullptr,
                shape->qkv_bias);
    }
  }
  EXPECT_FALSE(NamedModelShape("huge").ok());
  auto demo = NamedModelShape("demo");
  ASSERT_TRUE(demo.ok());
  EXPECT_EQ(demo->NumParameters(), 134105856);
}

}  // namespace
}  // namespace strata
