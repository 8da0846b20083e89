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
// (owner, key) may sit in one of two slots picked by a hash of both, and a store replaces an
// empty slot or else the less recently used of the two: two hot keys of one owner (a recompute
// flip), or two owners with one key (two engines running one layer), keep both entries instead of
// evicting each other on every call. Key must be equality-comparable; Key and Value
// default-constructible.
template <typename Key, typename Value, std::size_t kSlots>
class ThreadLocalCache {
  static_assert(kSlots >= 2);

 public:
  // This thread's value for (owner, key), or null.
  static Value* find(std::uint64_t owner, const Key& key, std::size_t hash) noexcept {
    Table& table = this_thread();
    const std::size_t mixed = mix(owner, hash);
    for (std::size_t index : {first(mixed), second(mixed)}) {
      Slot& slot = table.slots[index];
      if (slot.owner == owner && slot.key == key) {
        slot.used = ++table.clock;
        return &slot.value;
      }
    }
    return nullptr;
  }

  // Stores (owner, key) -> value for this thread and returns the stored value.
  static Value& store(std::uint64_t owner, const Key& key, std::size_t hash, Value value) {
    Table& table = this_thread();
    const std::size_t mixed = mix(owner, hash);
    Slot& a = table.slots[first(mixed)];
    Slot& b = table.slots[second(mixed)];
    Slot* target = &(a.used <= b.used ? a : b);  // an empty slot has used == 0
    for (Slot* slot : {&a, &b}) {
      if (slot->owner == owner && slot->key == key) target = slot;  // replace in place
    }
    target->owner = 0;  // stays empty if a copy below throws
    target->key = key;
    target->value = std::move(value);
    target->owner = owner;
    target->used = ++table.clock;
    return target->value;
  }

 private:
  struct Slot {
    std::uint64_t owner = 0;  // 0: empty
    std::uint64_t used = 0;   // the table's clock at the last find or store; 0: never
    Key key{};
    Value value{};
  };
  struct Table {
    std::array<Slot, kSlots> slots{};
    std::uint64_t clock = 0;
  };
  // Owners with equal keys land on different slots (Fibonacci hashing of the serial).
  static constexpr std::size_t mix(std::uint64_t owner, std::size_t hash) noexcept {
    return hash ^ static_cast<std::size_t>(owner * 0x9E3779B97F4A7C15ull);
  }
  static constexpr std::size_t first(std::size_t hash) noexcept { return hash % kSlots; }
  static constexpr std::size_t second(std::size_t hash) noexcept {  // never first(hash)
    return (first(hash) + 1 + (hash / kSlots) % (kSlots - 1)) % kSlots;
  }
  static Table& this_thread() noexcept {
    thread_local Table table;
    return table;
  }
};

}  // namespace gmjit::engine
