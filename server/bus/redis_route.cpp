#include "server/bus/redis_route.hpp"

#include <array>

namespace wspush::server::bus {

std::uint16_t crc16(std::string_view bytes) noexcept {
  std::uint16_t crc = 0;
  for (const char c : bytes) {
    crc = static_cast<std::uint16_t>(crc ^ (std::uint16_t(static_cast<unsigned char>(c)) << 8));
    for (int bit = 0; bit < 8; ++bit)
      crc = static_cast<std::uint16_t>(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc;
}

std::uint32_t key_slot(std::string_view key) noexcept {
  if (const auto open = key.find('{'); open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return crc16(key) % cluster_slots;
}

namespace {

struct tag_table {
  std::array<std::array<char, 4>, cluster_slots> text{};
  std::array<std::uint8_t, cluster_slots> len{};
  tag_table() noexcept {
    std::uint32_t found = 0;
    constexpr char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    for (std::uint32_t n = 0; found < cluster_slots; ++n) {  // 87,573 words reach every slot
      char word[8];
      std::size_t k = sizeof word;
      std::uint32_t v = n;
      do word[--k] = digits[v % 36], v /= 36; while (v != 0);
      const std::string_view w(word + k, sizeof word - k);
      const std::uint32_t slot = crc16(w) % cluster_slots;
      if (len[slot] != 0) continue;
      for (std::size_t i = 0; i < w.size(); ++i) text[slot][i] = w[i];
      len[slot] = std::uint8_t(w.size());
      ++found;
    }
  }
};

}  // namespace

std::string_view slot_tag(std::uint32_t slot) noexcept {
  static const tag_table table;  // 80 KB, built once (about 1 ms)
  slot %= cluster_slots;
  return {table.text[slot].data(), table.len[slot]};
}

std::uint32_t jump_consistent_hash(std::uint64_t key, std::uint32_t buckets) noexcept {
  std::int64_t b = -1, j = 0;
  while (j < std::int64_t(buckets)) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = std::int64_t(double(b + 1) * (double(1LL << 31) / double((key >> 33) + 1)));
  }
  return std::uint32_t(b);
}

}  // namespace wspush::server::bus
