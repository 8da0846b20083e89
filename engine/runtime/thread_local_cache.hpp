#pragma once
// A small per-thread cache for the warm path: lookups take no lock and allocate nothing.
//
// Entries belong to an owner (a plan cache, a loaded kernel, ...) named by a serial from
// next_serial(). Serials are never reused, so an entry left behind by a destroyed owner can
// never match a new one that happens to sit at the same address; such entries simply age out.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace gmjit::engine {

// A process-wide number that is never handed out twice (0 is never handed out: it marks an
// empty slot).
inline std::uint64_t next_serial() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// kSlots entries per thread and per instantiation, shared by every owner of that type. Each
// (owner, key) may sit in one of two slots picked by its hash, so two hot keys of one owner
// (a recompute flip) rarely evict each other. Key must be equality-comparable; Key and Value
// default-constructible.
template <typename Key, typename Value, std::size_t kSlots>
class ThreadLocalCache {
  static_assert(kSlots >= 2);

 public:
  // This thread's value for (owner, key), or null.
  static Value* find(std::uint64_t owner, const Key& key, std::size_t hash) noexcept {
    auto& table = slots();
    for (std::size_t index : {first(hash), second(hash)}) {
      Slot& slot = table[index];
      if (slot.owner == owner && slot.key == key) return &slot.value;
    }
    return nullptr;
  }

  // Stores (owner, key) -> value for this thread and returns the stored value. Prefers the
  // slot that does not hold another entry of the same owner.
  static Value& store(std::uint64_t owner, const Key& key, std::size_t hash, Value value) {
    auto& table = slots();
    Slot& a = table[first(hash)];
    Slot& b = table[second(hash)];
    Slot& target = a.owner == owner && b.owner != owner ? b : a;
    target.owner = 0;  // stays empty if a copy below throws
    target.key = key;
    target.value = std::move(value);
    target.owner = owner;
    return target.value;
  }

 private:
  struct Slot {
    std::uint64_t owner = 0;  // 0: empty
    Key key{};
    Value value{};
  };
  static constexpr std::size_t first(std::size_t hash) noexcept { return hash % kSlots; }
  static constexpr std::size_t second(std::size_t hash) noexcept {
    return (hash / kSlots) % kSlots;
  }
  static std::array<Slot, kSlots>& slots() noexcept {
    thread_local std::array<Slot, kSlots> table;
    return table;
  }
};

}  // namespace gmjit::engine
