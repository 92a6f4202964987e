#include "server/bus/redis_route.hpp"

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
