#pragma once
/// \file ws_frame.hpp
/// RFC 6455 §5.2 frame header codec and masking. Structural only: whether a header is allowed
/// (reserved opcodes, RSV bits, control frame rules, limits) is ws_reader's decision.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "proto/result.hpp"

namespace wspush::proto {

enum class opcode : std::uint8_t { continuation = 0, text = 1, binary = 2, close = 8, ping = 9, pong = 10 };

/// True for close, ping and pong (and the reserved control opcodes 11-15).
constexpr bool is_control(std::uint8_t raw_opcode) noexcept { return (raw_opcode & 0x8) != 0; }
/// True for the six opcodes RFC 6455 defines; 3-7 and 11-15 are reserved.
constexpr bool is_known_opcode(std::uint8_t raw_opcode) noexcept {
  return raw_opcode <= 2 || (raw_opcode >= 8 && raw_opcode <= 10);
}

inline constexpr std::size_t max_frame_header_size = 14;   // 2 + 8 + 4 (mask)
inline constexpr std::size_t max_server_header_size = 10;  // server frames are not masked
inline constexpr std::size_t max_control_payload_size = 125;

/// One decoded frame header. `size` is how many bytes it took on the wire.
struct frame_header {
  std::uint64_t payload_len;
  std::array<std::uint8_t, 4> mask;  // zeros when not masked
  std::uint8_t raw_opcode;           // as on the wire (may be reserved)
  std::uint8_t rsv;                  // the three RSV bits, 0..7
  std::uint8_t size;                 // header bytes (2..14)
  bool fin;
  bool masked;
};

/// `header` is meaningful only when `status == done`.
struct header_result {
  parse_status status;
  frame_header header;
};

/// Structural parse of one header at the start of bytes: need_more until all header bytes are
/// there; error only for a 64-bit length with the most significant bit set. Semantic checks are
/// the reader's.
header_result parse_frame_header(std::span<const std::uint8_t> bytes) noexcept;

/// Size of the unmasked header encode_frame_header writes for this payload length (2, 4 or 10).
constexpr std::size_t frame_header_size(std::uint64_t payload_len) noexcept {
  return payload_len < 126 ? 2 : payload_len <= 0xFFFF ? 4 : 10;
}

/// Encodes an unmasked (server) header for a frame; returns bytes written (2, 4 or 10).
std::size_t encode_frame_header(std::span<std::uint8_t, max_server_header_size> out, opcode op, bool fin,
                                std::uint64_t payload_len) noexcept;

/// Frames a payload written max_server_header_size bytes into `block` (room left for any
/// header): writes the final, unfragmented header and moves the payload right behind it, so
/// the frame starts at block[0]. Returns the frame's size. `block` must hold
/// max_server_header_size + payload_len bytes.
std::size_t frame_in_place(std::span<std::uint8_t> block, opcode op, std::size_t payload_len) noexcept;

/// Encodes a masked (client) header; returns bytes written (6, 8 or 14).
std::size_t encode_masked_frame_header(std::span<std::uint8_t, max_frame_header_size> out, opcode op, bool fin,
                                       std::uint64_t payload_len, std::array<std::uint8_t, 4> mask) noexcept;

/// XORs data with the mask, starting at mask position `offset` (0..3); 8 bytes at a time.
/// Returns the new offset ((offset + data.size()) % 4), so a payload can be unmasked in pieces.
std::uint8_t apply_mask(std::span<std::uint8_t> data, std::array<std::uint8_t, 4> mask, std::uint8_t offset) noexcept;

}  // namespace wspush::proto
