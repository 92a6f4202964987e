#include "proto/ws_frame.hpp"

#include <cstring>

namespace wspush::proto {
namespace {

/// Writes the length field(s) after the first byte; `mask_bit` is 0x80 for client frames.
std::size_t encode_length(std::uint8_t* out, std::uint64_t len, std::uint8_t mask_bit) noexcept {
  if (len < 126) {
    out[1] = static_cast<std::uint8_t>(mask_bit | len);
    return 2;
  }
  if (len <= 0xFFFF) {
    out[1] = static_cast<std::uint8_t>(mask_bit | 126);
    out[2] = static_cast<std::uint8_t>(len >> 8);
    out[3] = static_cast<std::uint8_t>(len);
    return 4;
  }
  out[1] = static_cast<std::uint8_t>(mask_bit | 127);
  for (int i = 0; i < 8; ++i) out[2 + i] = static_cast<std::uint8_t>(len >> (56 - 8 * i));
  return 10;
}

constexpr std::uint8_t first_byte(opcode op, bool fin) noexcept {
  return static_cast<std::uint8_t>((fin ? 0x80 : 0) | static_cast<std::uint8_t>(op));
}

}  // namespace

header_result parse_frame_header(std::span<const std::uint8_t> bytes) noexcept {
  header_result r{parse_status::need_more, frame_header{}};
  if (bytes.size() < 2) return r;
  frame_header& h = r.header;
  h.fin = (bytes[0] & 0x80) != 0;
  h.rsv = static_cast<std::uint8_t>((bytes[0] >> 4) & 0x7);
  h.raw_opcode = bytes[0] & 0x0F;
  h.masked = (bytes[1] & 0x80) != 0;
  const std::uint8_t len7 = bytes[1] & 0x7F;
  const std::size_t len_bytes = len7 < 126 ? 0 : len7 == 126 ? 2 : 8;
  const std::size_t size = 2 + len_bytes + (h.masked ? 4 : 0);
  if (bytes.size() < size) return r;
  std::uint64_t len = len7 < 126 ? len7 : 0;
  for (std::size_t i = 0; i < len_bytes; ++i) len = len << 8 | bytes[2 + i];
  if (len >> 63) return {parse_status::error, frame_header{}};
  h.payload_len = len;
  if (h.masked) std::memcpy(h.mask.data(), bytes.data() + 2 + len_bytes, 4);
  h.size = static_cast<std::uint8_t>(size);
  r.status = parse_status::done;
  return r;
}

std::size_t encode_frame_header(std::span<std::uint8_t, max_server_header_size> out, opcode op, bool fin,
                                std::uint64_t payload_len) noexcept {
  out[0] = first_byte(op, fin);
  return encode_length(out.data(), payload_len, 0);
}

std::size_t frame_in_place(std::span<std::uint8_t> block, opcode op, std::size_t payload_len) noexcept {
  std::uint8_t hdr[max_server_header_size];
  const std::size_t hn = encode_frame_header(std::span<std::uint8_t, max_server_header_size>(hdr), op, true, payload_len);
  std::memmove(block.data() + hn, block.data() + max_server_header_size, payload_len);
  std::memcpy(block.data(), hdr, hn);
  return hn + payload_len;
}

std::size_t encode_masked_frame_header(std::span<std::uint8_t, max_frame_header_size> out, opcode op, bool fin,
                                       std::uint64_t payload_len, std::array<std::uint8_t, 4> mask) noexcept {
  out[0] = first_byte(op, fin);
  const std::size_t n = encode_length(out.data(), payload_len, 0x80);
  std::memcpy(out.data() + n, mask.data(), 4);
  return n + 4;
}

std::uint8_t apply_mask(std::span<std::uint8_t> data, std::array<std::uint8_t, 4> mask, std::uint8_t offset) noexcept {
  offset &= 3;
  // The key rotated so that its byte 0 applies to data[0]; repeated twice to cover 8 bytes.
  std::uint8_t rotated[8];
  for (int i = 0; i < 8; ++i) rotated[i] = mask[(offset + i) & 3];
  std::uint64_t key;
  std::memcpy(&key, rotated, 8);
  std::uint8_t* p = data.data();
  const std::size_t n = data.size();
  std::size_t i = 0;
  // Four independent words per round: GCC and clang turn this into 128/256-bit vector code.
  for (; i + 32 <= n; i += 32) {
    std::uint64_t w[4];
    std::memcpy(w, p + i, 32);
    for (auto& x : w) x ^= key;
    std::memcpy(p + i, w, 32);
  }
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    w ^= key;
    std::memcpy(p + i, &w, 8);
  }
  for (; i < n; ++i) p[i] ^= rotated[i & 7];
  return static_cast<std::uint8_t>((offset + n) & 3);
}

}  // namespace wspush::proto
