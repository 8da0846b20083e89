#include <gtest/gtest.h>

#include <set>

#include "cache/key.hpp"
#include "cache/layout.hpp"

namespace gmjit::cache {
namespace {

TEST(Key128Hex, IsThirtyTwoLowercaseDigitsHighWordFirst) {
  const Key128 key{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(key.hex(), "0123456789abcdeffedcba9876543210");
  Key128 parsed;
  ASSERT_TRUE(Key128::parse_hex(key.hex(), parsed));
  EXPECT_EQ(parsed, key);
  ASSERT_TRUE(Key128::parse_hex("0123456789ABCDEFFEDCBA9876543210", parsed));
  EXPECT_EQ(parsed, key);
}

TEST(Key128Hex, RejectsWrongLengthAndNonHexWithoutTouchingOutput) {
  const Key128 sentinel{1, 2};
  for (std::string_view bad :
       {"", "0123", "0123456789abcdeffedcba987654321", "0123456789abcdeffedcba98765432100",
        "0123456789abcdeffedcba987654321g", "0123456789abcdef fedcba987654321"}) {
    Key128 out = sentinel;
    EXPECT_FALSE(Key128::parse_hex(bad, out)) << bad;
    EXPECT_EQ(out, sentinel);
  }
}

TEST(KeyBuilder, EqualFieldSequencesGiveEqualKeys) {
  const Key128 a = KeyBuilder().add("src").add(std::uint64_t{90}).add("sm_90a").finish();
  const Key128 b = KeyBuilder().add("src").add(std::uint64_t{90}).add("sm_90a").finish();
  EXPECT_EQ(a, b);
}

TEST(KeyBuilder, FieldBoundariesMatter) {
  EXPECT_NE(KeyBuilder().add("ab").add("c").finish(), KeyBuilder().add("a").add("bc").finish());
  EXPECT_NE(KeyBuilder().add("abc").finish(), KeyBuilder().add("abc").add("").finish());
  EXPECT_NE(KeyBuilder().add("").finish(), KeyBuilder().finish());
}

TEST(KeyBuilder, IntegersAndStringsOfTheSameBytesDiffer) {
  const std::string eight_bytes("\x01\0\0\0\0\0\0\0", 8);
  EXPECT_NE(KeyBuilder().add(eight_bytes).finish(), KeyBuilder().add(std::uint64_t{1}).finish());
}

TEST(KeyBuilder, EveryFieldChangesTheKey) {
  // The disk key's inputs (docs/DESIGN.md §4): changing any one of them must change the key.
  const std::vector<std::string> base = {"engine-v1",        "generated source",
                                         "template headers", "-std=c++17 -arch=sm_90a",
                                         "sm_90a",           "12.8"};
  const auto key_of = [](const std::vector<std::string>& fields) {
    KeyBuilder builder;
    for (const std::string& f : fields) builder.add(f);
    return builder.finish();
  };
  std::set<std::string> seen = {key_of(base).hex()};
  for (std::size_t i = 0; i < base.size(); ++i) {
    std::vector<std::string> changed = base;
    changed[i] += "x";
    EXPECT_TRUE(seen.insert(key_of(changed).hex()).second) << "field " << i;
  }
}

TEST(HashBytes, IsStableAndContentSensitive) {
  const std::byte a[] = {std::byte{1}, std::byte{2}, std::byte{3}};
  const std::byte b[] = {std::byte{1}, std::byte{2}, std::byte{4}};
  EXPECT_EQ(hash_bytes(a), hash_bytes(a));
  EXPECT_NE(hash_bytes(a), hash_bytes(b));
  EXPECT_NE(hash_bytes({}), Key128{});
}

TEST(EntryFileName, CarriesKeyArchAndGradModeReadably) {
  const Key128 key{0xab00000000000000ull, 7};
  const EntryLabels labels{"opt", "nograd", "sm_90a", "kernel"};
  const std::string name = layout::entry_file_name(key, labels);
  EXPECT_EQ(name, key.hex() + ".sm_90a.nograd.gmk");
  EXPECT_EQ(layout::fanout_name(key), "ab");
  const auto parsed = layout::parse_entry_file_name(name);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->key, key);
  EXPECT_EQ(parsed->arch, "sm_90a");
  EXPECT_EQ(parsed->grad_mode, "nograd");
}

TEST(EntryFileName, HostileLabelsAreSanitised) {
  const Key128 key{1, 2};
  const EntryLabels labels{"", "../..", "", "k"};
  const std::string name = layout::entry_file_name(key, labels);
  EXPECT_EQ(name, key.hex() + ".none._____.gmk");
  EXPECT_TRUE(layout::parse_entry_file_name(name).has_value());
}

TEST(EntryFileName, ForeignNamesDoNotParse) {
  const std::string hex = Key128{1, 2}.hex();
  for (const std::string& name :
       {std::string("README"), std::string(".gmk"), hex + ".gmk", hex + ".sm_90a.gmk",
        hex + ".sm_90a.grad.gmk.bak", hex + "..grad.gmk", hex.substr(1) + ".a.b.gmk",
        std::string("0123456789ABCDEF0123456789ABCDEF.a.b.gmk"), hex + ".a.b.c.gmk",
        std::string(".tmp-1-2")}) {
    EXPECT_FALSE(layout::parse_entry_file_name(name).has_value()) << name;
  }
  EXPECT_TRUE(layout::is_temp_name(".tmp-12-abcdef"));
  EXPECT_FALSE(layout::is_temp_name(hex + ".a.b.gmk"));
  EXPECT_TRUE(layout::is_fanout_name("0f"));
  EXPECT_FALSE(layout::is_fanout_name("0F"));
  EXPECT_FALSE(layout::is_fanout_name("zz"));
}

}  // namespace
}  // namespace gmjit::cache
