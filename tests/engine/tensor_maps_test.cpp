// The Hopper kernels' TMA maps (engine/families/tensor_maps.hpp): the kernels compute their box
// coordinates from these exact shapes, so the shapes are pinned here, checked through a stand-in
// for cuTensorMapEncodeTiled that records what it was asked to encode (no driver, no GPU).
#include <gtest/gtest.h>

#include <cuda.h>

#include <vector>

#include "engine/families/tensor_maps.hpp"

namespace gmjit::engine {
namespace {

struct EncodedMap {
  CUtensorMapDataType type;
  cuuint32_t rank;
  const void* base;
  std::vector<cuuint64_t> dims, strides;
  std::vector<cuuint32_t> box;
  CUtensorMapSwizzle swizzle;
  CUtensorMapL2promotion promotion;
  CUtensorMapFloatOOBfill oob_fill;
};

std::vector<EncodedMap>& encoded() {
  static std::vector<EncodedMap> maps;
  return maps;
}
int fail_call = -1;  // the index of the encode call that fails (-1: none)

CUresult record_encode(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* base,
                       const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                       const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                       CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
                       CUtensorMapFloatOOBfill oob_fill) {
  EXPECT_EQ(interleave, CU_TENSOR_MAP_INTERLEAVE_NONE);
  for (cuuint32_t i = 0; i < rank; ++i) EXPECT_EQ(element_strides[i], 1u);
  encoded().push_back({type, rank, base, std::vector<cuuint64_t>(dims, dims + rank),
                       std::vector<cuuint64_t>(strides, strides + rank - 1),
                       std::vector<cuuint32_t>(box, box + rank), swizzle, promotion, oob_fill});
  *map = CUtensorMap{};
  return static_cast<int>(encoded().size()) - 1 == fail_call ? CUDA_ERROR_INVALID_VALUE
                                                             : CUDA_SUCCESS;
}

using Dims = std::vector<cuuint64_t>;
using Box = std::vector<cuuint32_t>;

class TensorMaps : public ::testing::Test {
 protected:
  void SetUp() override {
    encoded().clear();
    fail_call = -1;
  }

  // gpt-oss-like: K = 2880 (bf16 rows of 5760 bytes), 4 experts.
  static Sm90GemmOperands forward(Sm90BLayout layout, int n_total, int block_n) {
    return {a_, 100, 2880, b_, 4, n_total, 128, block_n, layout};
  }

  static inline const int a_storage_ = 0, b_storage_ = 0;
  static inline const void* const a_ = &a_storage_;
  static inline const void* const b_ = &b_storage_;
};

TEST_F(TensorMaps, EveryMapIsBf16With128ByteSwizzleAndZerosOutOfBounds) {
  kt::Sm90GemmParams params{};
  ASSERT_EQ(encode_sm90_gemm_maps(record_encode, forward(Sm90BLayout::kPlain, 2880, 256), params),
            CUDA_SUCCESS);
  ASSERT_EQ(encoded().size(), 2u);
  for (const EncodedMap& m : encoded()) {
    EXPECT_EQ(m.type, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
    EXPECT_EQ(m.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
    EXPECT_EQ(m.oob_fill, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);  // NONE fills zeros
    EXPECT_EQ(m.promotion, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
    EXPECT_EQ(m.box[0], 64u);  // one 128-byte swizzle row of bf16
  }
  EXPECT_EQ(encoded()[0].base, a_);
  EXPECT_EQ(encoded()[1].base, b_);
}

TEST_F(TensorMaps, ActivationsAreReadInBoxesOf64TokenRows) {
  kt::Sm90GemmParams params{};
  ASSERT_EQ(encode_sm90_gemm_maps(record_encode, forward(Sm90BLayout::kPlain, 2880, 256), params),
            CUDA_SUCCESS);
  const EncodedMap& a = encoded()[0];
  EXPECT_EQ(a.dims, (Dims{2880, 100}));
  EXPECT_EQ(a.strides, (Dims{5760}));
  EXPECT_EQ(a.box, (Box{64, 64}));
}

TEST_F(TensorMaps, NoTokensStillEncodeOneActivationRow) {
  Sm90GemmOperands ops = forward(Sm90BLayout::kPlain, 2880, 256);
  ops.tokens = 0;
  kt::Sm90GemmParams params{};
  ASSERT_EQ(encode_sm90_gemm_maps(record_encode, ops, params), CUDA_SUCCESS);
  EXPECT_EQ(encoded()[0].dims, (Dims{2880, 1}));
}

// A partial last column tile (2880 = 11 x 256 + 64) must read zeros past N, not the next
// expert's rows: the experts are the map's third dimension.
TEST_F(TensorMaps, PlainWeightsKeepEachExpertInItsOwnDimension) {
  kt::Sm90GemmParams params{};
  ASSERT_EQ(encode_sm90_gemm_maps(record_encode, forward(Sm90BLayout::kPlain, 2880, 256), params),
            CUDA_SUCCESS);
  const EncodedMap& b = encoded()[1];
  EXPECT_EQ(b.dims, (Dims{2880, 2880, 4}));
  EXPECT_EQ(b.strides, (Dims{5760, 2880ull * 5760}));
  EXPECT_EQ(b.box, (Box{64, 256, 1}));
}

TEST_F(TensorMaps, GluHalvesSplitGateAndLinearRowsPerExpert) {
  kt::Sm90GemmParams params{};
  ASSERT_EQ(
      encode_sm90_gemm_maps(record_encode, forward(Sm90BLayout::kGluHalves, 5760, 192), params),
      CUDA_SUCCESS);
  const EncodedMap& b = encoded()[1];
  EXPECT_EQ(b.dims, (Dims{2880, 2880, 2, 4}));
  EXPECT_EQ(b.strides, (Dims{5760, 2880ull * 5760, 2ull * 2880 * 5760}));
  EXPECT_EQ(b.box, (Box{64, 96, 1, 1}));
}

// Widths that are multiples of 8 but not of 64: the dims stay exact, so the last K box reads
// zeros past K in both maps and a GLU half's rows past F read zeros.
TEST_F(TensorMaps, WidthsNotMultiplesOf64KeepExactDims) {
  Sm90GemmOperands ops = forward(Sm90BLayout::kGluHalves, 2 * 1008, 256);
  ops.k = 1448;
  kt::Sm90GemmParams params{};
  ASSERT_EQ(encode_sm90_gemm_maps(record_encode, ops, params), CUDA_SUCCESS);
  EXPECT_EQ(encoded()[0].dims, (Dims{1448, 100}));
  EXPECT_EQ(encoded()[0].strides, (Dims{2896}));
  EXPECT_EQ(encoded()[1].dims, (Dims{1448, 1008, 2, 4}));
  EXPECT_EQ(encoded()[1].box, (Box{64, 128, 1, 1}));
}

TEST_F(TensorMaps, GluInterleavedTilesTakeWholeGroupsOf32Rows) {
  kt::Sm90GemmParams params{};
  ASSERT_EQ(encode_sm90_gemm_maps(record_encode, forward(Sm90BLayout::kGluInterleaved32, 5760, 256),
                                  params),
            CUDA_SUCCESS);
  const EncodedMap& b = encoded()[1];
  EXPECT_EQ(b.dims, (Dims{2880, 32, 2, 4ull * 2880 / 32}));
  EXPECT_EQ(b.strides, (Dims{5760, 32ull * 5760, 64ull * 5760}));
  EXPECT_EQ(b.box, (Box{64, 32, 1, 4}));
}

TEST_F(TensorMaps, ForwardRefusesShapesItsKernelsCannotRead) {
  struct Case {
    const char* what;
    Sm90GemmOperands ops;
  };
  Sm90GemmOperands base = forward(Sm90BLayout::kPlain, 2880, 256);
  std::vector<Case> cases;
  auto with = [&](const char* what, auto change) {
    Sm90GemmOperands ops = base;
    change(ops);
    cases.push_back({what, ops});
  };
  with("K not a multiple of 8 (rows not 16-byte aligned)",
       [](Sm90GemmOperands& o) { o.k = 2880 + 4; });
  with("negative tokens", [](Sm90GemmOperands& o) { o.tokens = -1; });
  with("no experts", [](Sm90GemmOperands& o) { o.experts = 0; });
  with("block_m 64", [](Sm90GemmOperands& o) { o.block_m = 64; });
  with("block_n 96", [](Sm90GemmOperands& o) { o.block_n = 96; });
  with("block_n 320", [](Sm90GemmOperands& o) { o.block_n = 320; });
  with("GLU with block_n 64", [](Sm90GemmOperands& o) {
    o.layout = Sm90BLayout::kGluHalves;
    o.n_total = 5760;
    o.block_n = 64;
  });
  with("interleaved GLU with F not a multiple of 32", [](Sm90GemmOperands& o) {
    o.layout = Sm90BLayout::kGluInterleaved32;
    o.n_total = 5760 + 16;
  });
  with("GLU halves with F not a multiple of 8", [](Sm90GemmOperands& o) {
    o.layout = Sm90BLayout::kGluHalves;
    o.n_total = 5760 + 8;
  });
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    encoded().clear();
    kt::Sm90GemmParams params{};
    EXPECT_EQ(encode_sm90_gemm_maps(record_encode, c.ops, params), CUDA_ERROR_INVALID_VALUE);
  }
  kt::Sm90GemmParams params{};
  EXPECT_EQ(encode_sm90_gemm_maps(nullptr, base, params), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(TensorMaps, TheDriversErrorIsReturnedAndStopsTheEncoding) {
  fail_call = 0;  // the activation map
  kt::Sm90GemmParams params{};
  EXPECT_EQ(encode_sm90_gemm_maps(record_encode, forward(Sm90BLayout::kPlain, 2880, 256), params),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(encoded().size(), 1u);  // the weight map was not attempted
}

// dgrad B is W [E, K, N] read N-major: 64 columns x 64 K rows per box, each expert in its own
// dimension, so K rows past a K that 64 does not divide read zeros.
TEST_F(TensorMaps, DataGradientsReadWeightsAsColumnBlocksOfEachExpert) {
  const Sm90DgradOperands ops{a_, 100, 2880, b_, 4, 1408, 128};
  kt::Sm90Fc2DgradParams params{};
  ASSERT_EQ(encode_sm90_dgrad_maps(record_encode, ops, params), CUDA_SUCCESS);
  ASSERT_EQ(encoded().size(), 2u);
  EXPECT_EQ(encoded()[0].dims, (Dims{2880, 100}));
  EXPECT_EQ(encoded()[0].box, (Box{64, 64}));
  EXPECT_EQ(encoded()[1].dims, (Dims{1408, 2880, 4}));
  EXPECT_EQ(encoded()[1].strides, (Dims{1408ull * 2, 1408ull * 2880 * 2}));
  EXPECT_EQ(encoded()[1].box, (Box{64, 64, 1}));

  Sm90DgradOperands bad = ops;
  bad.n = 1408 + 4;  // rows not 16-byte aligned
  kt::Sm90GemmParams fc1{};
  EXPECT_EQ(encode_sm90_dgrad_maps(record_encode, bad, fc1), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(TensorMaps, WeightGradientsReadBothOperandsAlongTokens) {
  const Sm90WgradOperands ops{a_, b_, 0, 2880, 1408};
  kt::Sm90WgradParams params{};
  ASSERT_EQ(encode_sm90_wgrad_maps(record_encode, ops, params), CUDA_SUCCESS);
  ASSERT_EQ(encoded().size(), 2u);
  EXPECT_EQ(encoded()[0].dims, (Dims{2880, 1}));  // no tokens: one row, never read
  EXPECT_EQ(encoded()[1].dims, (Dims{1408, 1}));
  EXPECT_EQ(encoded()[0].box, (Box{64, 64}));
  EXPECT_EQ(encoded()[1].box, (Box{64, 64}));
}

// The TMA-store epilogue writes bf16 dW [E, M, N] through a 3-D map, so that a box's rows past
// M (a partial last M tile) are dropped at the expert's end instead of landing in the next one.
TEST_F(TensorMaps, Bf16WeightGradientsAreStoredAsBoxesOfEachExpert) {
  alignas(16) static unsigned char out_storage[16];
  void* const out_ = out_storage;
  kt::Sm90WgradParams params{};
  ASSERT_EQ(encode_sm90_wgrad_out_map(record_encode, out_, 4, 2000, 1000, params), CUDA_SUCCESS);
  ASSERT_EQ(encoded().size(), 1u);
  const EncodedMap& m = encoded()[0];
  EXPECT_EQ(m.type, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
  EXPECT_EQ(m.base, out_);
  EXPECT_EQ(m.dims, (Dims{1000, 2000, 4}));
  EXPECT_EQ(m.strides, (Dims{1000ull * 2, 1000ull * 2000 * 2}));
  EXPECT_EQ(m.box, (Box{64, 64, 1}));
  EXPECT_EQ(m.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
  // Rows that are not 16-byte aligned, and no experts, cannot be mapped.
  EXPECT_EQ(encode_sm90_wgrad_out_map(record_encode, out_, 4, 2000, 1004, params),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(encode_sm90_wgrad_out_map(record_encode, out_, 0, 2000, 1000, params),
            CUDA_ERROR_INVALID_VALUE);
}

// FP8 operands are E4M3 bytes: 128-byte K blocks (one swizzle row), rows along the tokens or
// the weights' rows.
TEST_F(TensorMaps, Fp8RowsAreBytesIn128ByteBlocks) {
  unsigned char map[128];
  ASSERT_EQ(encode_e4m3_rows(record_encode, map, a_, 0, 7168, 64), CUDA_SUCCESS);
  ASSERT_EQ(encoded().size(), 1u);
  const EncodedMap& m = encoded()[0];
  EXPECT_EQ(m.type, CU_TENSOR_MAP_DATA_TYPE_UINT8);
  EXPECT_EQ(m.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
  EXPECT_EQ(m.oob_fill, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  EXPECT_EQ(m.dims, (Dims{7168, 1}));  // no rows: one, never read
  EXPECT_EQ(m.strides, (Dims{7168}));
  EXPECT_EQ(m.box, (Box{128, 64}));
}

}  // namespace
}  // namespace gmjit::engine
