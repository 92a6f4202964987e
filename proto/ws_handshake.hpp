#pragma once
/// \file ws_handshake.hpp
/// The server's side of the opening handshake (RFC 6455 §4.2.2) and the small HTTP responses
/// the public listener answers with (errors, plain HTTP).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace wspush::proto {

inline constexpr std::size_t accept_key_size = 28;

/// base64(SHA-1(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")). The key is used as given (the
/// upgrade parser has checked it); a key longer than 64 bytes is hashed all the same.
void compute_accept_key(std::string_view client_key, std::span<char, accept_key_size> out) noexcept;

/// "HTTP/1.1 101 Switching Protocols" response with Upgrade, Connection, Sec-WebSocket-Accept,
/// and Sec-WebSocket-Extensions when `extensions` is not empty; returns bytes written, 0 if
/// `out` is too small (switching_protocols_size bytes always fit without extensions).
std::size_t encode_switching_protocols(std::string_view client_key, std::span<char> out,
                                       std::string_view extensions = {}) noexcept;

/// Exact size of what encode_switching_protocols writes without extensions.
inline constexpr std::size_t switching_protocols_size = 129;

/// A complete small HTTP/1.1 response: status line, `Content-Type: text/plain`, Content-Length,
/// `Connection: close`, for 426 also `Sec-WebSocket-Version: 13`, then extra_headers verbatim
/// (each ending CRLF), then body. 0 if `out` is too small.
std::size_t encode_http_response(std::uint16_t status, std::span<char> out, std::string_view body = {},
                                 std::string_view extra_headers = {}) noexcept;

/// Same with another Content-Type (e.g. "text/javascript" for /wspush.js). A 304 gets neither
/// Content-Type nor Content-Length, and `body` must be empty.
std::size_t encode_http_response_typed(std::uint16_t status, std::string_view content_type, std::span<char> out,
                                       std::string_view body = {}, std::string_view extra_headers = {}) noexcept;

/// "Bad Request", "Upgrade Required", ...; "Unknown" for a status it does not list.
std::string_view status_reason(std::uint16_t status) noexcept;

}  // namespace wspush::proto
